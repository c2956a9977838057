"""The upgrade, served: `keel serve` on torch A, ask; swap torch to B under the same keel files; restart, ask.

    .venv/bin/python scripts/release/serve_upgrade.py                       # .venv (torch 2.13.0) -> a copy with 2.14.1
    .venv/bin/python scripts/release/serve_upgrade.py --model HuggingFaceTB/SmolLM2-135M-Instruct

Environment B is a copy of environment A (`cp -a`, kept in --venv-b and reused) in which only torch is
replaced (`pip install torch==B`): keel's installed files are hashed in both and must be byte-identical.
Each phase starts `python -m keel.cli serve` as a subprocess on a free loopback port, asks one completion
and one chat question with the openai client (greedy), reads the torch release from `/metrics`, and stops
the server with SIGINT (exit code 0 expected). Exit 0 when both answers are the same on A and B.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from keel_dev import child_env
from keel_dev.server import start_server

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "What is the capital of France?"


def keel_files_digest(python: str) -> dict[str, str]:
    """sha256 of every file of the installed keel distribution in the environment of `python`."""
    code = (
        "import hashlib, json, importlib.metadata as m\n"
        "d = m.distribution('keel')\n"
        "print(json.dumps({str(f): hashlib.sha256(f.locate().read_bytes()).hexdigest() for f in d.files\n"
        "                  if f.parts[0] == 'keel' and f.locate().is_file()}))\n"
    )
    out = subprocess.run([python, "-c", code], check=True, capture_output=True, text=True, cwd=tempfile.gettempdir())
    return json.loads(out.stdout)


def torch_version(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__)"],
        check=True,
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
    )
    return out.stdout.strip()


def serve_and_ask(
    python: str, model: str, *, dtype: str = "float32", max_tokens: int = 24, timeout_s: float = 300.0
) -> dict:
    """Start `keel serve` with `python`, ask a completion and a chat question, stop it; what it answered."""
    import openai

    server = start_server(
        ["--model", model, "--dtype", dtype, "--served-model-name", "m", "--log-level", "warning"],
        python=python,
        timeout_s=timeout_s,
    )
    base = server.base_url
    try:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        completion = client.completions.create(model="m", prompt=QUESTION, max_tokens=max_tokens, temperature=0)
        chat = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": QUESTION}], max_tokens=max_tokens, temperature=0
        )
        metrics = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
        served_torch = next(
            line.split('torch_version="')[1].split('"')[0]
            for line in metrics.splitlines()
            if line.startswith("keel_build_info{")
        )
    finally:
        server.stop()
    return {
        "torch": served_torch,
        "completion": completion.choices[0].text,
        "chat": chat.choices[0].message.content,
        "completion_tokens": completion.usage.completion_tokens + chat.usage.completion_tokens,
        "exit_code": server.proc.returncode,
    }


def make_env_b(a: Path, b: Path, torch_b: str) -> None:
    """B = a copy of A with torch replaced (reused when it already has torch_b)."""
    if not (b / "bin" / "python").exists():
        print(f"== copying {a} -> {b}", flush=True)
        shutil.copytree(a, b, symlinks=True)
    if torch_version(str(b / "bin" / "python")).split("+")[0] != torch_b:
        print(f"== installing torch=={torch_b} into {b} (keel untouched)", flush=True)
        subprocess.run([str(b / "bin" / "python"), "-m", "pip", "install", "-q", f"torch=={torch_b}"], check=True)


def tiny_model(folder: Path, python: str) -> str:
    """The tests' tiny random checkpoint (keel_dev.checkpoints), built once into `folder`."""
    if not (folder / "tiny" / "config.json").is_file():
        code = (
            "from pathlib import Path\n"
            "from keel_dev.checkpoints import build_checkpoint, train_tokenizer\n"
            f"root = Path({str(folder)!r}); (root / 'tok').mkdir(parents=True, exist_ok=True)\n"
            "train_tokenizer(root / 'tok'); build_checkpoint(root / 'tiny', 'smollm2', root / 'tok')\n"
        )
        subprocess.run([python, "-c", code], check=True, cwd=tempfile.gettempdir(), env=child_env())
    return str(folder / "tiny")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--venv", type=Path, default=ROOT / ".venv", help="environment A (keel installed)")
    p.add_argument("--venv-b", type=Path, default=ROOT / ".venv-serve-b", help="environment B (made from A)")
    p.add_argument("--torch-b", default="2.14.1")
    p.add_argument("--model", default=None, help="model to serve (default: the tests' tiny checkpoint)")
    p.add_argument("--dtype", default="float32")
    args = p.parse_args()
    a_py, b_py = str(args.venv / "bin" / "python"), str(args.venv_b / "bin" / "python")
    model = args.model or tiny_model(ROOT / ".cache" / "serve_upgrade", a_py)
    print(f"model: {model}", flush=True)
    first = serve_and_ask(a_py, model, dtype=args.dtype)
    print(f"A: torch {first['torch']}: {json.dumps(first)}", flush=True)
    make_env_b(args.venv, args.venv_b, args.torch_b)
    files_a, files_b = keel_files_digest(a_py), keel_files_digest(b_py)
    second = serve_and_ask(b_py, model, dtype=args.dtype)
    print(f"B: torch {second['torch']}: {json.dumps(second)}", flush=True)
    checks = {
        "torch differs": first["torch"] != second["torch"],
        f"keel files identical ({len(files_a)} files)": files_a == files_b and bool(files_a),
        "same completion": first["completion"] == second["completion"],
        "same chat answer": first["chat"] == second["chat"],
        "clean exits": first["exit_code"] == 0 and second["exit_code"] == 0,
    }
    for name, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    ok = all(checks.values())
    print("SERVE UPGRADE PASSED" if ok else "SERVE UPGRADE FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
