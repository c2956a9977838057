"""keel's greedy tokens and its logits along them, in this process or in a child process that runs
another CPU build of the kernels (KEEL_CPU_ISA is read once, at import, so each build needs its own
process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from keel_dev import child_env, cpu

ISAS = ("default", "avx2", "base")  # "default": KEEL_CPU_ISA unset, the best build this CPU runs


def keel_greedy(llm: Any, ids: list[int], max_tokens: int) -> tuple[list[int], Any]:
    """keel's greedy tokens after `ids` (stopping at eos) and its logits [len(ids) + n - 1, V] at every
    position of prompt + tokens that predicts a next one (one prefill pass over the whole sequence)."""
    from keel import SamplingParams
    from keel_dev.engine import keel_prompt_logits

    tokens = llm.generate([ids], SamplingParams(max_tokens=max_tokens))[0].token_ids
    return tokens, keel_prompt_logits(llm, ids + tokens)[:-1]


def run_keel(model: str, prompts: dict[str, list[int]], dtypes: list[str], max_tokens: int, isa: str) -> dict:
    """`keel_greedy` for every (dtype, prompt) in a child process with KEEL_CPU_ISA=`isa`:
    {"isa": the build that ran, "runs": {(dtype, prompt name): (tokens, logits)}}."""
    import torch

    env = {k: v for k, v in os.environ.items() if k != "KEEL_CPU_ISA"}
    if isa != "default":
        env["KEEL_CPU_ISA"] = isa
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "keel.pt"
        job = {"model": model, "prompts": prompts, "dtypes": dtypes, "max_tokens": max_tokens, "out": str(out)}
        code = "import sys; from keel_dev.greedy import _child; _child(sys.argv[1])"
        proc = subprocess.run(
            [sys.executable, "-c", code, json.dumps(job)], cwd=tmp, env=child_env(env), capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise RuntimeError(f"keel child (KEEL_CPU_ISA={isa}) exited {proc.returncode}:\n{proc.stderr[-4000:]}")
        return torch.load(out)


def _child(job_json: str) -> None:
    """The child's side of `run_keel` (the installed keel, this process's KEEL_CPU_ISA)."""
    import torch

    from keel import LLM
    from keel.vendored.flash_attn import cpu_isa

    job = json.loads(job_json)
    runs = {}
    for dtype in job["dtypes"]:
        llm = LLM(job["model"], dtype=dtype, device="cpu", progress=False)
        for name, ids in job["prompts"].items():
            runs[(dtype, name)] = keel_greedy(llm, ids, job["max_tokens"])
    torch.save({"isa": cpu_isa(), "runs": runs}, job["out"])


def cpu_flags() -> str:
    """The instruction-set extensions of this CPU that keel's builds care about (from /proc/cpuinfo)."""
    flags = cpu.flags()
    if not flags:
        return "unknown"
    wanted = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")
    return " ".join(f for f in wanted if f in flags) or "none of avx2/avx512/amx"
