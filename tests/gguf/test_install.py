"""keel.gguf.install and `keel models fetch-demo`: HF cache layout, reuse, --force, atomic failure."""

from __future__ import annotations

import pytest
from gguf_synth import tiny_llama, write_gguf

from keel.cli import main
from keel.gguf.install import fetch_demo, find_installed, install_gguf

REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"
FOLDER = "models--HuggingFaceTB--SmolLM2-135M-Instruct"


@pytest.fixture
def tiny(tmp_path):
    return write_gguf(tmp_path / "tiny.gguf", tiny_llama().spec)


def test_install_is_found_by_huggingface_hub(tmp_path, tiny):
    from huggingface_hub import snapshot_download, try_to_load_from_cache

    cache = tmp_path / "hub"
    got = install_gguf(tiny, REPO, cache)
    assert got.created and len(got.revision) == 40
    assert (cache / FOLDER / "refs" / "main").read_text() == got.revision
    assert snapshot_download(REPO, cache_dir=cache, local_files_only=True) == str(got.snapshot)
    assert try_to_load_from_cache(REPO, "tokenizer_config.json", cache_dir=cache) == str(
        got.snapshot / "tokenizer_config.json"
    )
    assert (got.snapshot / "model.safetensors").is_symlink()
    assert find_installed(REPO, cache) == got.snapshot
    assert not [p for p in cache.iterdir() if p.name.startswith(".keel")]
    assert install_gguf(tiny, REPO, cache).revision == got.revision  # deterministic


def test_fetch_demo_reuses_and_forces(tmp_path, tiny):
    cache, lines = tmp_path / "hub", []
    first = fetch_demo(gguf=tiny, cache_dir=cache, log=lines.append)
    again = fetch_demo(gguf=tiny, cache_dir=cache, log=lines.append)
    assert first.created and not again.created and again.snapshot == first.snapshot
    forced = fetch_demo(gguf=tiny, cache_dir=cache, force=True, dtype="float32", log=lines.append)
    assert forced.created and forced.revision != first.revision
    assert find_installed(REPO, cache) == forced.snapshot


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


def test_cli_prints_location_and_usage(tmp_path, tiny, capsys):
    cache = tmp_path / "hub"
    assert main(["models", "fetch-demo", "--gguf", str(tiny), "--cache-dir", str(cache)]) == 0
    out = capsys.readouterr().out
    assert (
        f"installed {REPO}" in out and str(cache / FOLDER / "snapshots") in out and f"--model {REPO}" in out
    )
    assert main(["models", "fetch-demo", "--gguf", str(tiny), "--cache-dir", str(cache)]) == 0
    assert "already installed" in capsys.readouterr().out
    assert (
        main(["models", "fetch-demo", "--gguf", str(tmp_path / "nope.gguf"), "--cache-dir", str(cache)]) == 1
    )
    assert "no such GGUF file" in capsys.readouterr().err
