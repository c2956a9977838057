"""Mutations of a real checkpoint for the loader fuzzer: what to change, and what a clear error must name.

A `Mutation` is plain data (it crosses to the worker process as JSON): `op` and `params` say how to
derive the broken copy from the source, `file` is the file it breaks and `fields` the words of which a
clear error must contain at least one (the field, key or tensor at fault). `body` marks mutations of
tensor bytes only, after which a load is legitimate.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DELETE = "<delete>"  # json_set value that removes the key
LEGIT: tuple[str, ...] = ()  # fields of a mutation that leaves a valid checkpoint: it must load
ANY = ("*",)  # a load, or an error that names the file (tensor bytes: what breaks is not known beforehand)


@dataclass
class Mutation:
    id: str
    target: str  # "hf": a checkpoint folder loaded with keel.LLM; "gguf": a file installed by keel.gguf
    file: str
    fields: tuple[str, ...]
    op: str
    params: dict[str, Any] = field(default_factory=dict)
    body: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> Mutation:
        raw = json.loads(text)
        raw["fields"] = tuple(raw["fields"])
        return Mutation(**raw)


# ---------------------------------------------------------------- HF checkpoint folders

# type swaps and odd values tried on every config field (JSON: NaN and Infinity are accepted by Python)
ODD_VALUES: dict[str, Any] = {
    "delete": DELETE,
    "null": None,
    "list": "<list>",  # [original]
    "dict": "<dict>",  # {"value": original}
    "string": "x",
    "true": True,
    "zero": 0,
    "negative": -1,
    "huge": 10**12,
    "nan": math.nan,
    "inf": math.inf,
    "fraction": 0.5,
}
EXTRA_CONFIG_KEYS = ("rope_parameters", "sliding_window", "use_sliding_window", "dtype")
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 2048,
}


def _m(mid: str, file: str, fields: tuple[str, ...], op: str, body: bool = False, **params: Any) -> Mutation:
    return Mutation(mid, "hf", file, fields, op, params, body)


def _json_set(file: str, path: list[Any], value: Any, fields: tuple[str, ...], name: str) -> Mutation:
    label = ".".join(str(p) for p in path)
    return _m(f"{file}:{label}={name}", file, fields, "json_set", path=path, value=value)


def config_mutations(config: dict[str, Any]) -> list[Mutation]:
    f = "config.json"
    out = []
    for key in [*config, *EXTRA_CONFIG_KEYS]:
        for name, value in ODD_VALUES.items():
            if name == "delete" and key not in config:
                continue
            out.append(_json_set(f, [key], value, (key,), name))
    semantic: list[tuple[str, Any, tuple[str, ...]]] = [
        ("num_attention_heads", 7, ("num_attention_heads",)),
        ("num_key_value_heads", 2, ("num_key_value_heads",)),
        ("head_dim", 63, ("head_dim",)),
        ("head_dim", 32, ("head_dim",)),
        ("vocab_size", config["vocab_size"] + 1, ("vocab_size",)),
        ("vocab_size", 100, ("vocab_size",)),
        ("hidden_size", 512, ("hidden_size",)),
        ("intermediate_size", config["intermediate_size"] - 1, ("intermediate_size",)),
        ("num_hidden_layers", config["num_hidden_layers"] - 1, ("num_hidden_layers",)),
        ("num_hidden_layers", config["num_hidden_layers"] + 1, ("num_hidden_layers",)),
        ("max_position_embeddings", 1 << 30, ("max_position_embeddings",)),
        ("max_position_embeddings", 64, ("max_position_embeddings",)),
        ("rms_norm_eps", 1e-30, ("rms_norm_eps",)),
        ("rms_norm_eps", 2.0, ("rms_norm_eps",)),
        ("rope_theta", 1e-3, ("rope_theta",)),
        ("rope_theta", 5e5, ("rope_theta",)),
        ("tie_word_embeddings", not config.get("tie_word_embeddings"), ("tie_word_embeddings", "lm_head")),
        ("attention_bias", True, ("attention_bias",)),
        ("mlp_bias", True, ("mlp_bias",)),
        ("architectures", ["Foo"], ("architectures",)),
        ("architectures", [], ("architectures",)),
        ("architectures", [["LlamaForCausalLM"]], ("architectures",)),
        ("architectures", ["Qwen3ForCausalLM"], ("architectures", "q_norm")),
        ("architectures", ["Qwen2ForCausalLM"], ("architectures", "bias")),
        ("architectures", ["MistralForCausalLM"], ("architectures",)),
        ("hidden_act", "gelu", ("hidden_act",)),
        ("eos_token_id", config["vocab_size"], ("eos_token_id",)),
        ("eos_token_id", [2, "x"], ("eos_token_id",)),
        ("bos_token_id", config["vocab_size"] + 5, ("bos_token_id",)),
        ("torch_dtype", "float99", ("torch_dtype",)),
        ("sliding_window", 4, ("sliding_window",)),
        ("use_sliding_window", True, ("use_sliding_window", "sliding_window")),
        ("rope_scaling", "llama3", ("rope_scaling",)),
        ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, ("rope_scaling", "yarn")),
        ("rope_scaling", {"type": "linear", "factor": 2.0}, ("rope_scaling", "linear")),
        ("rope_scaling", LLAMA3_ROPE, ("rope_scaling",)),
        ("rope_parameters", {"rope_type": "default", "rope_theta": -1.0}, ("rope_theta",)),
        ("rope_parameters", [1, 2], ("rope_parameters",)),
    ]
    for key, value, fields in semantic:
        out.append(_json_set(f, [key], value, fields, json.dumps(value)[:40]))
    for sub in LLAMA3_ROPE:  # llama3 scaling: each field missing or odd
        if sub == "rope_type":
            continue
        for name, value in (("delete", DELETE), ("string", "x"), ("zero", 0), ("negative", -2.0), ("nan", math.nan)):
            rope = dict(LLAMA3_ROPE) | {sub: value}
            if value == DELETE:
                del rope[sub]
            out.append(_json_set(f, ["rope_scaling"], rope, (sub,), f"llama3.{sub}={name}"))
    rope = dict(LLAMA3_ROPE) | {"low_freq_factor": 4.0, "high_freq_factor": 4.0}
    out.append(_json_set(f, ["rope_scaling"], rope, ("high_freq_factor",), "llama3.high=low"))
    out += _text_mutations(f, ("JSON", "object"), delete_fields=("config.json",))
    return out


def _text_mutations(file: str, fields: tuple[str, ...], delete_fields: tuple[str, ...] | None) -> list[Mutation]:
    out = [
        _m(f"{file}:truncated", file, fields, "truncate_text", fraction=0.5),
        _m(f"{file}:empty", file, fields, "write_text", text=""),
        _m(f"{file}:list", file, fields, "write_text", text="[1, 2]"),
        _m(f"{file}:latin1", file, fields + ("UTF-8",), "write_bytes_hex", hex=b'{"a": "\xe9"}'.hex()),
    ]
    if delete_fields is not None:
        out.append(_m(f"{file}:deleted", file, delete_fields, "delete_file"))
    return out


def tokenizer_mutations(tok: dict[str, Any], vocab_size: int) -> list[Mutation]:
    f = "tokenizer.json"
    vocab = tok["model"]["vocab"]
    some = sorted(vocab)[min(1000, len(vocab) // 2)]
    out = [
        _json_set(f, ["model"], DELETE, ("model",), "delete"),
        _json_set(f, ["model", "type"], "Foo", ("model",), "Foo"),
        _json_set(f, ["model", "vocab"], [1, 2], ("model", "vocab"), "list"),
        _json_set(f, ["model", "vocab", some], "x", ("model", "vocab"), "string"),
        _json_set(f, ["model", "vocab", some], vocab_size + 10, ("vocab", "vocab_size"), "beyond"),
        _json_set(f, ["model", "vocab", some], 5, ("model", "vocab"), "duplicate-id"),
        _json_set(f, ["model", "merges"], {"a": 1}, ("model", "merges"), "dict"),
        _json_set(f, ["model", "merges", 0], 5, ("model", "merges"), "int"),
        _json_set(f, ["model", "merges", 0], ["zz_unknown", "yy_unknown"], ("model", "merges"), "unknown"),
        _json_set(f, ["added_tokens"], {"a": 1}, ("added_tokens",), "dict"),
        _json_set(f, ["added_tokens", 0, "id"], "x", ("added_tokens",), "id-string"),
        _json_set(f, ["added_tokens", 0, "id"], vocab_size + 100, ("added_tokens", "vocab_size"), "id-beyond"),
        _json_set(f, ["added_tokens", 0, "content"], 5, ("added_tokens",), "content-int"),
        _json_set(f, ["pre_tokenizer"], {"type": "Foo"}, ("pre_tokenizer",), "Foo"),
        _json_set(f, ["post_processor"], 5, ("post_processor",), "int"),
        _json_set(f, ["decoder"], "x", ("decoder",), "string"),
        _json_set(f, ["normalizer"], {"type": "Foo"}, ("normalizer",), "Foo"),
        _json_set(f, ["truncation"], "x", ("truncation",), "string"),
        _json_set(f, ["version"], 5, ("version",), "int"),
    ]
    out += _text_mutations(f, ("JSON", "object"), delete_fields=("not found",))
    return out


def tokenizer_config_mutations(cfg: dict[str, Any]) -> list[Mutation]:
    f = "tokenizer_config.json"
    out = []
    for key in ("bos_token", "eos_token", "chat_template"):
        for name, value in (("null", None), ("int", 5), ("list", [1]), ("dict", {"content": 5})):
            out.append(_json_set(f, [key], value, (key,), name))
    out += [
        _json_set(f, ["eos_token"], "<|not-a-token|>", ("eos_token",), "unknown"),
        _json_set(f, ["bos_token"], {"content": cfg["bos_token"]}, ("bos_token",), "added-token-dict"),
        _json_set(f, ["chat_template"], "{% if %}", ("chat_template",), "bad-jinja"),
        _json_set(f, ["chat_template"], [{"name": "default", "template": cfg["chat_template"]}], LEGIT, "named"),
        _json_set(f, ["chat_template"], [{"name": 5}], ("chat_template",), "named-bad"),
        _json_set(f, ["model_max_length"], "x", ("model_max_length",), "string"),
        _json_set(f, ["add_bos_token"], [1], ("add_bos_token",), "list"),
        _json_set(f, ["unk_token"], 5, ("unk_token",), "int"),
    ]
    out += _text_mutations(f, ("JSON", "object"), delete_fields=LEGIT)  # optional file: deleting it is fine
    out.append(
        _m("chat_template.jinja:bad-jinja", "chat_template.jinja", ("chat_template",), "write_text", text="{% for %}")
    )
    out.append(
        _m("chat_template.jinja:ok", "chat_template.jinja", LEGIT, "write_text", text="{{ messages[0]['content'] }}")
    )
    return out


def generation_config_mutations(vocab_size: int) -> list[Mutation]:
    f = "generation_config.json"
    out = []
    for key in ("eos_token_id", "bos_token_id"):
        for name, value in (
            ("null", None),
            ("string", "x"),
            ("list-mixed", [2, "x"]),
            ("huge", 10**12),
            ("negative", -1),
            ("beyond", vocab_size),
            ("dict", {"a": 1}),
            ("true", True),
            ("float", 2.5),
        ):
            out.append(_json_set(f, [key], value, (key,), name))
    out += _text_mutations(f, ("JSON", "object"), delete_fields=LEGIT)
    out.append(_m("special_tokens_map.json:truncated", "special_tokens_map.json", ANY, "truncate_text", fraction=0.5))
    return out


def index_mutations(header_names: list[str]) -> list[Mutation]:
    f = "model.safetensors.index.json"
    first = header_names[0]
    cases: list[tuple[str, Any, tuple[str, ...]]] = [
        ("weight_map-int", {"weight_map": 5}, ("weight_map",)),
        ("no-weight_map", {"metadata": {}}, ("weight_map",)),
        ("escape", {"weight_map": {first: "../outside.safetensors"}}, ("weight_map", "outside")),
        ("missing-shard", {"weight_map": {first: "model-00002-of-00002.safetensors"}}, ("model-00002",)),
        ("value-int", {"weight_map": {first: 5}}, ("weight_map",)),
        ("ok", {"weight_map": {n: "model.safetensors" for n in header_names}}, LEGIT),
        ("incomplete", {"weight_map": {first: "model.safetensors"}}, ("weight_map", header_names[-1])),
    ]
    return [_m(f"{f}:{name}", f, fields, "write_text", text=json.dumps(v)) for name, v, fields in cases]


def read_st_header(path: Path) -> tuple[int, dict[str, Any]]:
    """(header length, parsed header) of a valid safetensors file."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return n, json.loads(fh.read(n))


def safetensors_mutations(path: Path) -> list[Mutation]:
    f = "model.safetensors"
    n, header = read_st_header(path)
    names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    size = path.stat().st_size
    body = size - 8 - n
    picks = [names[0], names[len(names) // 2], names[-1]]
    out: list[Mutation] = []

    def hdr(mid: str, fields: tuple[str, ...], **params: Any) -> None:
        out.append(_m(f"{f}:{mid}", f, fields, "st_header", **params))

    for t in picks:
        e = header[t]
        b, end = e["data_offsets"]
        shape = e["shape"]
        for name, value in (
            ("F99", "F99"),
            ("F32", "F32" if e["dtype"] != "F32" else "F16"),
            ("U16", "U16" if e["dtype"] != "F32" else "I32"),
            ("I64", "I64"),
            ("int", 5),
            ("null", None),
        ):
            hdr(f"{t}.dtype={name}", (t,), tensor=t, key="dtype", value=value)
        for name, value in (
            ("empty", []),
            ("negative", [-1, *shape[1:]]),
            ("fewer", [shape[0] - 1, *shape[1:]]),
            ("reversed", list(reversed(shape))),
            ("extra-dim", [*shape, 1]),
            ("string", [str(d) for d in shape]),
            ("huge", [2**62, *shape[1:]]),
            ("not-list", 5),
        ):
            hdr(f"{t}.shape={name}", (t,), tensor=t, key="shape", value=value)
        for name, value in (
            ("grow", [b, end + 2]),
            ("shift", [b + 2, end + 2]),
            ("reversed", [end, b]),
            ("negative", [-2, end]),
            ("huge", [b, 2**63]),
            ("one", [b]),
            ("string", "x"),
        ):
            hdr(f"{t}.data_offsets={name}", (t,), tensor=t, key="data_offsets", value=value)
        hdr(f"{t}.removed", (t, "belong to no tensor", "follow the last tensor"), remove=t)  # an unclaimed range
        hdr(f"{t}.renamed", (t, t + ".x"), rename=[t, t + ".x"])
        hdr(f"{t}.entry=list", (t,), tensor=t, entry=[1, 2])
    a, b2 = names[1], names[2]
    hdr("swap-offsets", (a, b2, "data_offsets"), swap=[a, b2])
    hdr(
        "extra-tensor",
        ("extra.weight",),
        add={"extra.weight": {"dtype": "F32", "shape": [0], "data_offsets": [body, body]}},
    )
    hdr("metadata=list", ("__metadata__",), metadata=[1])
    hdr("metadata-value-int", ("__metadata__",), metadata={"format": 5})
    hdr("not-object", ("header", "object"), raw="[1, 2]")
    hdr("invalid-json", ("header", "JSON"), raw='{"a": ')
    hdr("latin1", ("header", "UTF-8"), raw_hex=b'{"\xe9": 1}'.hex())
    hdr("space-padded", LEGIT, pad=" " * 7)
    hdr("nul-padded", ("header", "JSON"), pad="\0" * 7)
    hdr("duplicate-key", (names[0],), duplicate=names[0])
    for name, value in (("+1", n + 1), ("-1", n - 1), ("0", 0), ("7", 7), ("2^63", 2**63), ("size", size)):
        out.append(_m(f"{f}:header-length={name}", f, ("header",), "st_length", value=value))
    for name, at in (("4", 4), ("8", 8), ("mid-header", 8 + n // 2), ("header-only", 8 + n)):
        out.append(_m(f"{f}:truncate-at-{name}", f, ("header", "truncated"), "truncate", at=at))
    for frac in (0.01, 0.5, 0.999):
        at = 8 + n + int(body * frac)
        hit = next(k for k in names if 8 + n + header[k]["data_offsets"][1] > at)
        out.append(_m(f"{f}:truncate-body-{frac}", f, (hit, "truncated"), "truncate", at=at))
    out.append(_m(f"{f}:truncate-last-byte", f, (names[-1], "truncated"), "truncate", at=size - 1))
    out.append(_m(f"{f}:appended", f, ("bytes", "trailing"), "append", count=16))
    for count in (1, 64, 4096):
        out.append(_m(f"{f}:flip-{count}", f, ANY, "flip", body=True, count=count, seed=count, start=8 + n))
    norm = next(k for k in names if k.endswith("norm.weight"))
    out.append(_m(f"{f}:nan-in-{norm}", f, (norm,), "st_nan", body=True, tensor=norm))
    out.append(_m(f"{f}:zero-{picks[1]}", f, LEGIT, "st_zero", body=True, tensor=picks[1]))
    out.append(_m(f"{f}:deleted", f, ("safetensors",), "delete_file"))
    return out


def hf_mutations(src: Path) -> list[Mutation]:
    """Every mutation of the checkpoint folder `src` (a few hundred, deterministic)."""
    config = json.loads((src / "config.json").read_text())
    tok = json.loads((src / "tokenizer.json").read_text())
    tok_cfg = json.loads((src / "tokenizer_config.json").read_text())
    _, header = read_st_header(src / "model.safetensors")
    names = sorted(k for k in header if k != "__metadata__")
    return unique(
        *config_mutations(config),
        *safetensors_mutations(src / "model.safetensors"),
        *index_mutations(names),
        *tokenizer_mutations(tok, config["vocab_size"]),
        *tokenizer_config_mutations(tok_cfg),
        *generation_config_mutations(config["vocab_size"]),
    )


def unique(*mutations: Mutation) -> list[Mutation]:
    """Drop repeats (same id: the same change reached twice), keeping the order."""
    return list({m.id: m for m in reversed(mutations)}.values())[::-1]


# ---------------------------------------------------------------- applying HF mutations (in the worker)


def _set_path(obj: Any, path: list[Any], value: Any) -> None:
    for p in path[:-1]:
        obj = obj[p]
    if value == DELETE:
        del obj[path[-1]]
    elif value == "<list>":
        obj[path[-1]] = [obj.get(path[-1]) if isinstance(obj, dict) else obj[path[-1]]]
    elif value == "<dict>":
        obj[path[-1]] = {"value": obj.get(path[-1]) if isinstance(obj, dict) else obj[path[-1]]}
    else:
        obj[path[-1]] = value


def _copy_body(src: Path, dst: Path, header: bytes, skip: int, limit: int | None = None) -> None:
    """Write `header` then src's bytes from `skip` on (at most `limit` bytes in all)."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        fout.write(header if limit is None else header[:limit])
        fin.seek(skip)
        left = None if limit is None else max(0, limit - len(header))
        while left is None or left > 0:
            chunk = fin.read(1 << 24 if left is None else min(1 << 24, left))
            if not chunk:
                break
            fout.write(chunk)
            if left is not None:
                left -= len(chunk)


def _st_header(src: Path, dst: Path, p: dict[str, Any]) -> None:
    n, header = read_st_header(src)
    if "raw" in p or "raw_hex" in p:
        text = p["raw"].encode() if "raw" in p else bytes.fromhex(p["raw_hex"])
    else:
        if "tensor" in p and "key" in p:
            header[p["tensor"]][p["key"]] = p["value"]
        if "entry" in p:
            header[p["tensor"]] = p["entry"]
        if "remove" in p:
            del header[p["remove"]]
        if "rename" in p:
            old, new = p["rename"]
            header[new] = header.pop(old)
        if "swap" in p:
            a, b = p["swap"]
            header[a]["data_offsets"], header[b]["data_offsets"] = header[b]["data_offsets"], header[a]["data_offsets"]
        if "add" in p:
            header |= p["add"]
        if "metadata" in p:
            header["__metadata__"] = p["metadata"]
        text = json.dumps(header).encode()
        if "duplicate" in p:
            entry = json.dumps({p["duplicate"]: header[p["duplicate"]]})[1:-1]
            text = b"{" + entry.encode() + b", " + text[1:]
        text += p.get("pad", "").encode()
    _copy_body(src, dst, struct.pack("<Q", len(text)) + text, 8 + n)


def _patch(src: Path, dst: Path, patches: list[tuple[int, bytes]]) -> None:
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as fh:
        for pos, data in patches:
            fh.seek(pos)
            fh.write(data)


def flip_patches(src: Path, start: int, count: int, seed: int) -> list[tuple[int, bytes]]:
    """`count` single-byte xors at seeded positions after `start`."""
    import random

    rng = random.Random(seed)
    size = src.stat().st_size
    out = []
    with open(src, "rb") as fh:
        for _ in range(count):
            pos = rng.randrange(start, size)
            fh.seek(pos)
            out.append((pos, bytes([fh.read(1)[0] ^ (1 << rng.randrange(8))])))
    return out


def apply_hf(m: Mutation, src: Path, dst: Path) -> Path:
    """Build the mutated copy of folder `src` in `dst`: unchanged files are symlinks to the source."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name != m.file:
            os.symlink(f, dst / f.name)
    out, orig, p = dst / m.file, src / m.file, m.params
    if m.op == "json_set":
        obj = json.loads(orig.read_text(encoding="utf-8"))
        _set_path(obj, p["path"], p["value"])
        out.write_text(json.dumps(obj), encoding="utf-8")
    elif m.op == "write_text":
        out.write_text(p["text"], encoding="utf-8")
    elif m.op == "write_bytes_hex":
        out.write_bytes(bytes.fromhex(p["hex"]))
    elif m.op == "truncate_text":
        text = orig.read_bytes()
        out.write_bytes(text[: int(len(text) * p["fraction"])])
    elif m.op == "delete_file":
        pass
    elif m.op == "st_header":
        _st_header(orig, out, p)
    elif m.op == "st_length":
        _patch(orig, out, [(0, struct.pack("<Q", p["value"] % 2**64))])
    elif m.op == "truncate":
        _copy_body(orig, out, b"", 0, p["at"])
    elif m.op == "append":
        shutil.copyfile(orig, out)
        with open(out, "ab") as fh:
            fh.write(b"\x01" * p["count"])
    elif m.op == "flip":
        _patch(orig, out, flip_patches(orig, p["start"], p["count"], p["seed"]))
    elif m.op in ("st_nan", "st_zero"):
        n, header = read_st_header(orig)
        e = header[p["tensor"]]
        b, end = e["data_offsets"]
        if m.op == "st_nan":
            nan = {"F32": b"\x00\x00\xc0\x7f", "BF16": b"\xc0\x7f", "F16": b"\x00\x7e"}[e["dtype"]]
            _patch(orig, out, [(8 + n + b, nan)])
        else:
            _patch(orig, out, [(8 + n + b, b"\0" * (end - b))])
    else:
        raise ValueError(f"unknown hf op {m.op!r}")
    return dst
