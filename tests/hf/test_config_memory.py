"""The memory a config.json implies is estimated before anything is allocated (src/keel/hf/memory.py); a config
past the limit is refused with the fields named, the estimate and the limit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.bounded_child import LOAD_ENGINE, RSS_LIMIT, run_child, sparse_checkpoint

from keel.hf.config import ConfigError, ModelConfig
from keel.hf.memory import ENV, check_model_memory, estimate_parts, mem_available, memory_limit, parse_size


def _refused(folder: Path, limit: str, *needles: str) -> None:
    child = run_child(LOAD_ENGINE, str(folder), env={ENV: limit})
    assert not child.killed and child.peak_rss < RSS_LIMIT, child.describe()
    assert child.rc == 3, child.describe()
    assert "Traceback" not in child.stderr, child.describe()
    for needle in ("ConfigError", "config.json", ENV, *needles):
        assert needle in child.stderr, f"{needle!r} not in: {child.describe()}"


def test_rotary_table_refused_before_allocating(tiny_hf: Path, tmp_path: Path) -> None:
    """max_position_embeddings 2^21 with head_dim 2048: a rotary table build of about 40 GiB."""
    folder = sparse_checkpoint(tiny_hf, tmp_path / "rope", max_position_embeddings=1 << 21, head_dim=2048)
    _refused(folder, "16G", "max_position_embeddings=2097152, head_dim=2048", "rotary table")


def test_vocabulary_refused_before_allocating(tiny_hf: Path, tmp_path: Path) -> None:
    """vocab_size 2^24 with a sparse 8 GiB weights file that holds every tensor the config implies."""
    folder = sparse_checkpoint(tiny_hf, tmp_path / "vocab", vocab_size=1 << 24)
    assert (folder / "model.safetensors").stat().st_size > 8 << 30
    _refused(folder, "2G", "vocab_size=16777216, hidden_size=64", "embeddings", "lm_head")


def test_estimate_matches_the_model_keel_builds(tiny_hf: Path) -> None:
    """Embeddings, lm_head and layers' weights are the model's parameters (less the final norm); the rotary
    part covers the table it builds."""
    from keel.models import get_model_class
    from keel.models.llama import LlamaForCausalLM

    cfg = ModelConfig.from_file(tiny_hf / "config.json")
    with torch.device("meta"):
        model: LlamaForCausalLM = get_model_class(cfg.architecture)(cfg)
    parts = {p.what: p.bytes for p in estimate_parts(cfg, torch.float32)}
    weights = sum(p.numel() * 4 for p in model.parameters())
    estimated = parts["embeddings"] + parts["lm_head"] + parts["layers' weights"]
    assert weights - cfg.hidden_size * 4 == estimated
    model.model.rotary_emb.build(torch.float32, torch.device("cpu"))
    table = model.model.rotary_emb.cos_sin_cache
    assert table.numel() * table.element_size() <= parts["rotary table (with its build temporaries)"]


def test_limit_from_the_override_and_from_meminfo(
    tiny_hf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = ModelConfig.from_file(tiny_hf / "config.json")
    cpu = torch.device("cpu")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       1000 kB\nMemAvailable:       64 kB\n")
    assert mem_available(meminfo) == 64 * 1024
    monkeypatch.delenv(ENV, raising=False)
    assert memory_limit(cpu, meminfo) == (64 * 1024, "MemAvailable in /proc/meminfo")
    with pytest.raises(ConfigError, match=r"more than the 0\.1 MiB MemAvailable in /proc/meminfo allows.*vocab_size="):
        check_model_memory(cfg, torch.float32, cpu, meminfo=meminfo)
    monkeypatch.setenv(ENV, "1G")
    assert check_model_memory(cfg, torch.float32, cpu, meminfo=meminfo)
    monkeypatch.setenv(ENV, "off")
    assert memory_limit(cpu, meminfo) == (None, ENV)
    monkeypatch.setenv(ENV, "lots")
    with pytest.raises(ConfigError, match=f"{ENV}='lots': expected a byte count"):
        check_model_memory(cfg, torch.float32, cpu, meminfo=meminfo)


@pytest.mark.parametrize(
    "text, expected",
    [("123", 123), ("512M", 512 << 20), ("24g", 24 << 30), ("1TiB", 1 << 40), ("2 GB", 2 << 30), ("off", None)],
)
def test_parse_size(text: str, expected: int | None) -> None:
    assert parse_size(text) == expected
