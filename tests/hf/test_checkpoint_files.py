"""Each checkpoint file's checks, on keel's conversion of a tiny GGUF: safetensors headers, tokenizer files."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from keel.hf.errors import CheckpointError
from keel.hf.safetensors_header import WeightsError, read_header
from keel.hf.tokenizer import Tokenizer, TokenizerError


def _header(path: Path) -> tuple[int, dict]:
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return n, json.loads(fh.read(n))


def _rewrite(src: Path, dst: Path, header: dict | bytes, tail: bytes = b"") -> Path:
    n, _ = _header(src)
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    dst.write_bytes(struct.pack("<Q", len(text)) + text + src.read_bytes()[8 + n :] + tail)
    return dst


def test_valid_header_reads_without_tensor_data(tiny_hf):
    h = read_header(tiny_hf / "model.safetensors")
    assert h.metadata["converted_by"] == "keel.gguf"
    e = h.tensors["model.embed_tokens.weight"]
    assert e.dtype == "F32" and e.end - e.begin == 4 * e.shape[0] * e.shape[1]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda h, t: h[t].update(dtype="F99"), "dtype 'F99' is not a safetensors dtype"),
        (lambda h, t: h[t].update(shape=[3]), r"shape \[3\] of F32 takes 12 bytes, but data_offsets .* hold"),
        (lambda h, t: h[t].update(shape=[-1, 4]), "shape must be a list of non-negative integers"),
        (lambda h, t: h[t].update(data_offsets=[5, 1]), r"data_offsets must be \[begin, end\]"),
        (lambda h, t: h.pop(t), "belong to no tensor .* a header entry is missing"),
        (lambda h, t: h.update(__metadata__={"format": 5}), "__metadata__ must map strings to strings"),
        (lambda h, t: h.update({t: [1]}), "the header entry must be an object"),
    ],
)
def test_header_errors_name_the_file_and_tensor(tiny_hf, tmp_path, change, message):
    src = tiny_hf / "model.safetensors"
    _, header = _header(src)
    first = min((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    change(header, first)
    bad = _rewrite(src, tmp_path / "model.safetensors", header)
    with pytest.raises(WeightsError, match=f"model.safetensors: .*{message}"):
        read_header(bad)


def test_overlap_truncation_trailing_bytes_and_header_length(tiny_hf, tmp_path):
    src = tiny_hf / "model.safetensors"
    n, header = _header(src)
    names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    a, b = names[0], names[1]
    swapped = json.loads(json.dumps(header))
    swapped[b]["data_offsets"] = header[a]["data_offsets"]  # b claims a's bytes
    with pytest.raises(WeightsError, match="data_offsets must|overlaps tensor|takes"):
        read_header(_rewrite(src, tmp_path / "o.safetensors", swapped))
    with pytest.raises(WeightsError, match="16 bytes follow the last tensor .* header length field"):
        read_header(_rewrite(src, tmp_path / "t.safetensors", header, tail=b"\0" * 16))
    data = src.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:-10])
    with pytest.raises(WeightsError, match=f"tensor '{names[-1]}' needs bytes .* the file is truncated"):
        read_header(tmp_path / "cut.safetensors")
    (tmp_path / "len.safetensors").write_bytes(struct.pack("<Q", 2**62) + data[8:])
    with pytest.raises(WeightsError, match="header length field says 4611686018427387904 bytes"):
        read_header(tmp_path / "len.safetensors")
    (tmp_path / "short.safetensors").write_bytes(b"abc")
    with pytest.raises(WeightsError, match="3 bytes is too short for a safetensors file"):
        read_header(tmp_path / "short.safetensors")
    dup = ("{" + json.dumps(a) + ": " + json.dumps(header[a]) + ", " + json.dumps(header)[1:]).encode()
    with pytest.raises(WeightsError, match="appears twice in the header"):
        read_header(_rewrite(src, tmp_path / "d.safetensors", dup))


def test_every_checkpoint_error_is_one_family():
    from keel.gguf.reader import GGUFError
    from keel.hf.config import ConfigError

    for cls in (ConfigError, WeightsError, TokenizerError, GGUFError):
        assert issubclass(cls, CheckpointError) and issubclass(cls, ValueError)


def _tok_copy(tiny_hf: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "m"
    shutil.copytree(tiny_hf, folder)
    return folder


def _edit(path: Path, change) -> None:
    raw = json.loads(path.read_text())
    change(raw)
    path.write_text(json.dumps(raw))


@pytest.mark.parametrize(
    "file, change, message",
    [
        (
            "tokenizer_config.json",
            lambda c: c.update(chat_template="{% if %}"),
            "chat_template: the chat template does not compile",
        ),
        (
            "tokenizer_config.json",
            lambda c: c.update(eos_token="<|nope|>"),
            "eos_token '<|nope|>' is not a token of tokenizer.json",
        ),
        ("tokenizer_config.json", lambda c: c.update(bos_token=5), "bos_token must be a string, an object"),
        (
            "tokenizer_config.json",
            lambda c: c.update(chat_template=[{"name": 5}]),
            "chat_template entries must be objects",
        ),
        ("generation_config.json", lambda c: c.update(eos_token_id="2"), "eos_token_id must be a token id"),
        ("generation_config.json", lambda c: c.update(eos_token_id=10**6), "eos_token_id must be a token id"),
        (
            "tokenizer.json",
            lambda c: c.update(post_processor=5),
            "'post_processor' is not a valid tokenizers post_processor",
        ),
        ("tokenizer.json", lambda c: c["model"].update(type="Foo"), "'model' is not a valid tokenizers model"),
        (
            "tokenizer.json",
            lambda c: c["added_tokens"][0].update(id=10**6),
            "has id 1000000, outside config.json vocab_size",
        ),
        ("tokenizer.json", lambda c: c["model"]["vocab"].update(Ġt=1), "model.vocab gives id 1 to both"),
    ],
)
def test_tokenizer_file_errors_name_the_file_and_field(tiny_hf, tmp_path, file, change, message):
    folder = _tok_copy(tiny_hf, tmp_path)
    _edit(folder / file, change)
    with pytest.raises(TokenizerError, match=f"{file}: .*{message}"):
        Tokenizer(folder)


def test_tokenizer_json_that_is_not_json_or_not_utf8(tiny_hf, tmp_path):
    folder = _tok_copy(tiny_hf, tmp_path)
    (folder / "tokenizer.json").write_bytes(b'{"model": "\xe9"}')
    with pytest.raises(TokenizerError, match="tokenizer.json is not UTF-8 text"):
        Tokenizer(folder)
    (folder / "tokenizer_config.json").write_text("[1]")
    (folder / "tokenizer.json").write_bytes((tiny_hf / "tokenizer.json").read_bytes())
    with pytest.raises(TokenizerError, match="tokenizer_config.json must hold a JSON object, got list"):
        Tokenizer(folder)


def test_optional_tokenizer_files_may_be_absent(tiny_hf, tmp_path):
    folder = _tok_copy(tiny_hf, tmp_path)
    for name in ("tokenizer_config.json", "generation_config.json", "special_tokens_map.json"):
        (folder / name).unlink()
    tok = Tokenizer(folder)
    assert tok.chat_template is None and tok.eos_token_ids  # eos from config.json
