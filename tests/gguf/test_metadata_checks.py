"""GGUF inputs that are broken in one field: each error names the file and the key or tensor, before any
file is written; and a failed install loses nothing that was there before."""

from __future__ import annotations

import os

import pytest
from support.gguf_synth import ARR, BOOL, F32V, STR, U32, U64, tiny_llama, write_gguf

from keel.gguf.convert import write_checkpoint
from keel.gguf.install import fetch_demo, find_installed, install_gguf
from keel.gguf.reader import GGUFError, read_gguf


def _with(key: str, vtype: int, value) -> list:
    model = tiny_llama()
    model.spec.metadata = [(k, vtype, value) if k == key else (k, t, v) for k, t, v in model.spec.metadata]
    if key not in {k for k, _, _ in model.spec.metadata}:
        model.spec.metadata.append((key, vtype, value))
    return model


@pytest.mark.parametrize(
    "key, vtype, value, message",
    [
        ("llama.embedding_length", STR, "64", r"metadata 'llama.embedding_length' must be an integer in \[1, 131072\]"),
        ("llama.block_count", BOOL, True, "metadata 'llama.block_count' must be an integer .*, got True"),
        ("llama.context_length", U64, 10**12, r"'llama.context_length' must be an integer in \[1, 2097152\]"),
        ("llama.attention.head_count", ARR, (U32, [4, 4]), "'llama.attention.head_count' must be an integer .* array"),
        ("llama.attention.layer_norm_rms_epsilon", F32V, float("nan"), "layer_norm_rms_epsilon' must be a finite"),
        ("llama.attention.head_count_kv", U32, 3, r"head_count_kv must divide head_count \(4\), got 3"),
        ("tokenizer.ggml.merges", ARR, (U32, [1, 2]), "'tokenizer.ggml.merges' must be an array of strings"),
        ("tokenizer.ggml.bos_token_id", STR, "1", "'tokenizer.ggml.bos_token_id' must be an integer"),
        ("tokenizer.ggml.add_bos_token", U32, 1, "'tokenizer.ggml.add_bos_token' must be a bool"),
        ("tokenizer.chat_template", STR, "{% if %}", "tokenizer.chat_template: the chat template does not compile"),
        ("tokenizer.ggml.merges", ARR, (STR, ["a b c"]), r"tokenizer.ggml.merges\[0\] 'a b c' must be two tokens"),
        ("general.alignment", U32, 48, "general.alignment must be a positive power of two"),
    ],
)
def test_metadata_errors_name_the_key_and_write_nothing(tmp_path, key, vtype, value, message):
    path = write_gguf(tmp_path / "m.gguf", _with(key, vtype, value).spec)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(GGUFError, match=f"m.gguf: .*{message}"):
        write_checkpoint(path, out, "float32")
    assert list(out.iterdir()) == []


def test_tensor_infos_must_pack_in_order(tmp_path):
    model = tiny_llama()
    name, ttype, dims, data = model.spec.tensors[1]  # an F32 norm: declare it F16, half its real size
    model.spec.tensors[1] = (name, 1, dims, data)
    with pytest.raises(GGUFError, match=f"m.gguf: tensor '{model.spec.tensors[2][0]}' has its data at byte .*packs"):
        read_gguf(write_gguf(tmp_path / "m.gguf", model.spec))
    model = tiny_llama()
    name, ttype, dims, data = model.spec.tensors[-1]  # the last tensor: nothing after it to collide with
    model.spec.tensors[-1] = (name, 1, dims, data)
    with pytest.raises(GGUFError, match=f"m.gguf: 128 bytes follow the last tensor '{name}' .*type or dims are"):
        read_gguf(write_gguf(tmp_path / "m.gguf", model.spec))


def test_a_lying_count_is_reported_after_the_entry_that_lied(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", tiny_llama().spec)
    data = bytearray(path.read_bytes())
    key = b"tokenizer.ggml.merges"
    at = data.index(key) + len(key) + 4 + 4  # past the array's type tag and element type: the count
    data[at : at + 8] = (int.from_bytes(data[at : at + 8], "little") + 1).to_bytes(8, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match="after metadata 'tokenizer.ggml.merges'"):
        read_gguf(path)


def test_failed_replacement_keeps_the_installed_snapshot(tmp_path, monkeypatch):
    gguf = write_gguf(tmp_path / "tiny.gguf", tiny_llama().spec)
    cache = tmp_path / "cache"
    first = install_gguf(gguf, cache_dir=cache)
    before = {p.name: p.read_bytes() for p in first.snapshot.iterdir()}
    real_replace = os.replace

    def failing(src, dst):  # the new snapshot cannot be moved into place (disk full, permissions, ...)
        if os.path.basename(src) == "snapshot" and "snapshots" in str(dst):
            raise OSError("simulated failure")
        real_replace(src, dst)

    monkeypatch.setattr("keel.gguf.install.os.replace", failing)
    with pytest.raises(OSError, match="simulated failure"):
        fetch_demo(gguf=gguf, cache_dir=cache, force=True, log=lambda _: None)
    monkeypatch.undo()
    assert find_installed(cache_dir=cache) == first.snapshot
    assert {p.name: p.read_bytes() for p in first.snapshot.iterdir()} == before
    assert not [p for p in cache.iterdir() if p.name.startswith(".keel")]  # no half-written temp folder left


def test_failed_conversion_mid_write_leaves_the_cache_as_it_was(tmp_path, monkeypatch):
    gguf = write_gguf(tmp_path / "tiny.gguf", tiny_llama().spec)
    cache = tmp_path / "cache"

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("safetensors.torch.save_file", boom)
    with pytest.raises(OSError, match="disk full"):
        install_gguf(gguf, cache_dir=cache)
    assert [p for p in cache.rglob("*")] == []
