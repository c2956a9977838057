"""Fixtures: an offline HF cache of tiny checkpoints, and keel/transformers models over it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from keel_dev.checkpoints import ARCHS, COMMIT, build_checkpoint, model_dir, train_tokenizer
from support.native import keel_native_ops  # noqa: E402,F401


@pytest.fixture(scope="session")
def hf_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An HF hub cache holding `keel-test/tiny-<arch>` for every arch; the env points at it, offline."""
    root = tmp_path_factory.mktemp("hf_home")
    tok_dir = root / "tokenizer"
    tok_dir.mkdir()
    train_tokenizer(tok_dir)
    cache = root / "hub"
    for arch in ARCHS:
        repo = cache / f"models--keel-test--tiny-{arch}"
        build_checkpoint(repo / "snapshots" / COMMIT, arch, tok_dir)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(COMMIT)
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_CACHE", str(cache))
    mp.setenv("HF_HUB_OFFLINE", "1")
    yield cache
    mp.undo()


@pytest.fixture(scope="session")
def llms(hf_cache: Path):
    """One fp32 `keel.LLM` per arch, loaded lazily and shared across tests."""
    from keel.engine import LLM

    loaded: dict[str, LLM] = {}

    def get(arch: str) -> LLM:
        if arch not in loaded:
            loaded[arch] = LLM(f"keel-test/tiny-{arch}", dtype="float32", device="cpu", block_size=4)
        return loaded[arch]

    return get


@pytest.fixture(scope="session")
def hf_models(hf_cache: Path):
    """The transformers twin of each checkpoint (fp32, eager attention) for reference outputs."""
    import transformers as tf

    loaded: dict[str, torch.nn.Module] = {}

    def get(arch: str) -> torch.nn.Module:
        if arch not in loaded:
            loaded[arch] = tf.AutoModelForCausalLM.from_pretrained(
                model_dir(hf_cache, arch), dtype=torch.float32, attn_implementation="eager"
            ).eval()
        return loaded[arch]

    return get
