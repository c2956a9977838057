"""keel's developer helpers, shared by tests/ and benchmarks/ (distribution `keel-dev`: `pip install -e dev`).

Not part of the keel wheel; nothing in keel imports it. The release pipeline's probe uses `parity` and
`engine` too: the pipeline and the suite compare greedy tokens and logits by one rule.

  timing       one alternating min-of-means timer (perf_counter, or CUDA events)
  net          a free loopback port
  server       `keel serve` as a subprocess: start, wait for /health, stop
  checkpoints  tiny random checkpoints and a trained toy tokenizer; a random-weight Llama without transformers
  smollm2      where the real SmolLM2 GGUF is
  parity       the parity rule (greedy tokens, logits) between keel and a reference
  engine       all-position logits through keel's prefill path; a fresh KV pool
  greedy       keel's greedy tokens and logits, in this process or in a child with another CPU build

The fuzzers, which the tests run a sample of, are the other package of this distribution: `keel_fuzz`.
"""

from __future__ import annotations

import os
from pathlib import Path

SEARCH_PATH = str(Path(__file__).resolve().parent.parent)  # the folder that holds keel_dev (dev/)


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with keel_dev's folder first on PYTHONPATH, for a child process that
    imports keel_dev with another interpreter or before keel_dev is installed there."""
    env = dict(os.environ if env is None else env)
    rest = env.get("PYTHONPATH")
    env["PYTHONPATH"] = SEARCH_PATH + (os.pathsep + rest if rest else "")
    return env


def keel_source(tree: str | Path) -> str:
    """The folder that makes `import keel` take the checkout `tree` when first on PYTHONPATH: its `src/` (the
    src layout; native libraries built there in place) or, for a checkout from before that layout, `tree`."""
    tree = Path(tree).resolve()
    return str(tree / "src" if (tree / "src" / "keel").is_dir() else tree)
