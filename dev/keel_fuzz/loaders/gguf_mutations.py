"""Mutations of a real GGUF file for the loader fuzzer: metadata, tensor infos, header, truncation, data."""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

from keel_fuzz.loaders import gguf_layout as gl
from keel_fuzz.loaders.mutations import ANY, LEGIT, Mutation, unique

# metadata keys keel reads, each deleted, re-typed and given odd values
KEYS = (
    "general.architecture",
    "llama.block_count",
    "llama.context_length",
    "llama.embedding_length",
    "llama.feed_forward_length",
    "llama.attention.head_count",
    "llama.attention.head_count_kv",
    "llama.rope.freq_base",
    "llama.attention.layer_norm_rms_epsilon",
    "llama.vocab_size",
    "llama.rope.dimension_count",
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.chat_template",
)
RETYPE: dict[str, tuple[int, Any]] = {
    "string": (gl.STR, "x"),
    "f32": (gl.F32, 1.5),
    "f32-nan": (gl.F32, math.nan),
    "u32-zero": (gl.U32, 0),
    "i32-negative": (gl.I32, -1),
    "u64-huge": (gl.U64, 2**62),
    "bool": (gl.BOOL, True),
    "u32-array": (gl.ARR, (gl.U32, [1, 2])),
}
# keys whose odd value is legitimately accepted (keel ignores them or any value is valid there)
_FREE = {"tokenizer.chat_template"}


def _g(mid: str, file: str, fields: tuple[str, ...], op: str, body: bool = False, **params: Any) -> Mutation:
    return Mutation(f"gguf:{mid}", "gguf", file, fields, op, params, body)


def gguf_mutations(path: Path) -> list[Mutation]:
    """Every mutation of the GGUF file `path` (deterministic)."""
    f = path.name
    layout = gl.parse(path.read_bytes())
    present = {kv.key for kv in layout.kvs}
    out: list[Mutation] = []
    for key in KEYS:
        if key in present:
            out.append(_g(f"{key}=delete", f, (key,), "kv", key=key, delete=True))
            out.append(_g(f"{key}=type-tag-99", f, (key,), "kv_tag", key=key, tag=99))
        for name, (vtype, value) in RETYPE.items():
            out.append(_g(f"{key}={name}", f, (key,), "kv", key=key, vtype=vtype, value=value))
    kv_tok = layout.kv("tokenizer.ggml.tokens")
    n_blocks = 1 + max(int(t.name.split(".")[1]) for t in layout.tensors if str(t.name).startswith("blk."))
    n_tok = kv_tok.count or 0
    out += [
        _g("tokens=short", f, ("tokenizer.ggml.tokens", "token_type"), "kv_array", key=kv_tok.key, keep=100),
        _g("tokens=count+1", f, ("tokenizer.ggml.tokens", "tokenizer.ggml"), "kv_count", key=kv_tok.key, delta=1),
        _g("tokens=count+2^40", f, ("tokenizer.ggml.tokens",), "kv_count", key=kv_tok.key, delta=2**40),
        _g(
            "tokens=u32", f, ("tokenizer.ggml.tokens",), "kv", key=kv_tok.key, vtype=gl.ARR, value=(gl.U32, [0] * n_tok)
        ),
        _g("tokens=duplicate", f, ("tokenizer.ggml.tokens",), "kv_token", index=min(500, n_tok - 2), token="a"),
        _g(
            "tokens=latin1",
            f,
            ("tokenizer.ggml.tokens", "UTF-8"),
            "kv_token",
            index=min(500, n_tok - 2),
            token_hex="e9",
        ),
        _g("merges=one-part", f, ("tokenizer.ggml.merges",), "kv_merge", index=3, merge="abc"),
        _g(
            "merges=count+1",
            f,
            ("tokenizer.ggml.merges", "tokenizer.ggml"),
            "kv_count",
            key="tokenizer.ggml.merges",
            delta=1,
        ),
        _g("token_type=short", f, ("tokenizer.ggml.token_type",), "kv_array", key="tokenizer.ggml.token_type", keep=10),
        _g(
            "token_type=strings",
            f,
            ("tokenizer.ggml.token_type",),
            "kv",
            key="tokenizer.ggml.token_type",
            vtype=gl.ARR,
            value=(gl.STR, ["1"] * n_tok),
        ),
        _g(
            "bos=beyond",
            f,
            ("tokenizer.ggml.bos_token_id",),
            "kv",
            key="tokenizer.ggml.bos_token_id",
            vtype=gl.U32,
            value=n_tok,
        ),
        _g(
            "pre=llama-bpe", f, ("tokenizer.ggml.pre",), "kv", key="tokenizer.ggml.pre", vtype=gl.STR, value="llama-bpe"
        ),
        _g("model=llama", f, ("tokenizer.ggml.model",), "kv", key="tokenizer.ggml.model", vtype=gl.STR, value="llama"),
        _g(
            "architecture=qwen2",
            f,
            ("general.architecture",),
            "kv",
            key="general.architecture",
            vtype=gl.STR,
            value="qwen2",
        ),
        _g(
            "rope.scaling.type=linear",
            f,
            ("llama.rope.scaling.type",),
            "kv",
            key="llama.rope.scaling.type",
            vtype=gl.STR,
            value="linear",
        ),
        _g(
            "head_count=7",
            f,
            ("llama.attention.head_count",),
            "kv",
            key="llama.attention.head_count",
            vtype=gl.U32,
            value=7,
        ),
        _g(
            "head_count_kv=2",
            f,
            ("llama.attention.head_count_kv",),
            "kv",
            key="llama.attention.head_count_kv",
            vtype=gl.U32,
            value=2,
        ),
        _g("block_count-1", f, ("llama.block_count",), "kv", key="llama.block_count", vtype=gl.U32, value=n_blocks - 1),
        _g("block_count+1", f, ("llama.block_count",), "kv", key="llama.block_count", vtype=gl.U32, value=n_blocks + 1),
        _g(
            "embedding_length=512",
            f,
            ("llama.embedding_length",),
            "kv",
            key="llama.embedding_length",
            vtype=gl.U32,
            value=512,
        ),
        _g("alignment=64", f, ("general.alignment",), "kv", key="general.alignment", vtype=gl.U32, value=64),
        _g("alignment=3", f, ("general.alignment",), "kv", key="general.alignment", vtype=gl.U32, value=3),
        _g("alignment=string", f, ("general.alignment",), "kv", key="general.alignment", vtype=gl.STR, value="32"),
        _g("general.name=delete", f, LEGIT, "kv", key="general.name", delete=True),
        _g("general.name=u32", f, LEGIT, "kv", key="general.name", vtype=gl.U32, value=5),
        _g("key=latin1", f, ("metadata key", "UTF-8"), "kv_rename", key="general.name", new_hex="e9"),
        _g("key=huge-length", f, ("metadata key", "length"), "kv_rename", key="general.name", length=2**40),
        _g(
            "chat_template=bad-jinja",
            f,
            ("chat_template",),
            "kv",
            key="tokenizer.chat_template",
            vtype=gl.STR,
            value="{% if %}",
        ),
    ]
    # header
    out += [
        _g("magic", f, ("magic",), "header", field="magic", value="GGUX"),
        _g("version=1", f, ("version",), "header", field="version", value=1),
        _g("version=4", f, ("version",), "header", field="version", value=4),
        _g("version=big-endian", f, ("version",), "header", field="version", value=3 << 24),
        _g("n_tensors+1", f, ("tensor",), "header", field="n_tensors", delta=1),
        _g("n_tensors-1", f, ("tensor",), "header", field="n_tensors", delta=-1),
        _g("n_tensors=2^63", f, ("tensor",), "header", field="n_tensors", value=2**63),
        _g("n_kv+1", f, ("metadata",), "header", field="n_kv", delta=1),
        _g("n_kv-1", f, ("metadata", "tensor"), "header", field="n_kv", delta=-1),
        _g("n_kv=2^63", f, ("metadata",), "header", field="n_kv", value=2**63),
    ]
    # tensor infos
    names = [t.name for t in layout.tensors]
    picks = list(dict.fromkeys(["token_embd.weight", "blk.0.attn_q.weight", "output_norm.weight", names[-1]]))
    for t in picks:
        info = layout.tensor(t)
        for name, value in (("0", 0), ("5", 5), ("2^31", 2**31)):
            out.append(_g(f"{t}.n_dims={name}", f, (t,), "tensor", tensor=t, field="n_dims", value=value))
        for name, dims in (
            ("zero", [0, *info.dims[1:]]),
            ("plus-32", [info.dims[0] + 32, *info.dims[1:]]),
            ("2^40", [2**40, *info.dims[1:]]),
            ("swapped", list(reversed(info.dims))),
        ):
            out.append(_g(f"{t}.dims={name}", f, (t,), "tensor", tensor=t, field="dims", value=dims))
        for name, ttype in (
            ("99", 99),
            ("F32", 0 if info.ttype else 1),
            ("Q8_0", 8 if info.ttype != 8 else 3),
            ("IQ2_XXS", 16),
        ):
            out.append(_g(f"{t}.type={name}", f, (t,), "tensor", tensor=t, field="ttype", value=ttype))
        for name, delta in (("+1", 1), ("+32", 32), ("2^62", 2**62)):
            out.append(_g(f"{t}.offset{name}", f, (t,), "tensor", tensor=t, field="offset", delta=delta))
        out.append(_g(f"{t}.offset=0", f, (t,), "tensor", tensor=t, field="offset", value=0))
        # a removed tensor info leaves its bytes unclaimed: the next tensor's offset no longer fits
        out.append(_g(f"{t}.removed", f, (t, "missing", "packs tensors"), "tensor", tensor=t, remove=True))
        out.append(_g(f"{t}.renamed", f, ("foo.weight",), "tensor", tensor=t, field="name", value="foo.weight"))
        out.append(_g(f"{t}.name=latin1", f, ("tensor", "UTF-8"), "tensor", tensor=t, field="name_hex", value="e9"))
    out.append(_g("duplicate-name", f, (names[2],), "tensor", tensor=names[1], field="name", value=names[2]))
    out.append(_g("blk.99", f, ("blk.99",), "tensor", tensor=names[1], field="name", value="blk.99.attn_norm.weight"))
    # truncation and data
    sec = layout.sections
    size = path.stat().st_size
    for name, at in (
        ("4", 4),
        ("23", 23),
        ("mid-metadata", (sec["metadata"] + sec["tensor_infos"]) // 2),
        ("mid-tensor-infos", (sec["tensor_infos"] + sec["data"]) // 2),
        ("data-start", sec["data"]),
        ("mid-data", (sec["data"] + size) // 2),
        ("last-byte", size - 1),
    ):
        out.append(_g(f"truncate-at-{name}", f, ("truncated", "too short"), "truncate", at=at))
    for count in (1, 64, 4096):
        out.append(_g(f"flip-{count}", f, ANY, "flip", body=True, count=count, seed=count, start=sec["data"]))
    out.append(_g("nan-in-output_norm", f, ("output_norm.weight",), "gguf_nan", body=True, tensor="output_norm.weight"))
    out.append(
        _g(
            "nan-scale-in-blk.0.attn_q",
            f,
            ("blk.0.attn_q.weight",),
            "gguf_nan",
            body=True,
            tensor="blk.0.attn_q.weight",
        )
    )
    return unique(*out)


def apply_gguf(m: Mutation, src: Path, layout: gl.Layout, dst: Path) -> Path:
    """Write the mutated copy of `src` (parsed as `layout`, which is not changed) to `dst/<src name>`."""
    import copy

    from keel_fuzz.loaders.mutations import _copy_body, _patch, flip_patches

    out, p = dst / src.name, m.params
    if m.op == "truncate":
        _copy_body(src, out, b"", 0, p["at"])
        return out
    if m.op == "flip":
        _patch(src, out, flip_patches(src, p["start"], p["count"], p["seed"]))
        return out
    if m.op == "gguf_nan":
        t = layout.tensor(p["tensor"])
        nan = b"\x00\x00\xc0\x7f" if t.ttype == 0 else b"\x00\x7e"  # F32 value, or the f16 scale of block 0
        _patch(src, out, [(layout.sections["data"] + t.offset, nan)])
        return out
    lay = copy.copy(layout)
    lay.kvs, lay.tensors = list(layout.kvs), [copy.copy(t) for t in layout.tensors]
    idx = {kv.key: i for i, kv in enumerate(lay.kvs)}
    if m.op == "kv":
        if p.get("delete"):
            del lay.kvs[idx[p["key"]]]
        else:
            value = tuple(p["value"]) if p["vtype"] == gl.ARR else p["value"]
            kv = gl.KV.make(p["key"], p["vtype"], value)
            if p["key"] in idx:
                lay.kvs[idx[p["key"]]] = kv
            else:
                lay.kvs.append(kv)
    elif m.op == "kv_tag":
        kv = lay.kvs[idx[p["key"]]]
        lay.kvs[idx[p["key"]]] = gl.KV(kv.key, kv.vtype, struct.pack("<I", p["tag"]) + kv.tail[4:])
    elif m.op == "kv_count":
        kv = lay.kvs[idx[p["key"]]]
        assert kv.count is not None
        head = struct.pack("<IIQ", gl.ARR, kv.etype or 0, (kv.count + p["delta"]) % 2**64)
        lay.kvs[idx[p["key"]]] = gl.KV(kv.key, kv.vtype, head + kv.tail[16:], kv.etype, kv.count)
    elif m.op in ("kv_array", "kv_token", "kv_merge"):
        key = {"kv_token": "tokenizer.ggml.tokens", "kv_merge": "tokenizer.ggml.merges"}.get(m.op, p.get("key"))
        items = _read_array(lay.kvs[idx[key]])
        etype = lay.kvs[idx[key]].etype or 0
        if m.op == "kv_array":
            items = items[: p["keep"]]
        else:
            new = bytes.fromhex(p["token_hex"]) if "token_hex" in p else (p.get("token") or p["merge"]).encode()
            items[p["index"]] = new if m.op == "kv_token" and "token_hex" in p else new.decode()
            if m.op == "kv_token" and "token" in p:
                items[p["index"]] = items[p["index"] + 1]  # a duplicate of its neighbour
        lay.kvs[idx[key]] = gl.KV(key, gl.ARR, struct.pack("<I", gl.ARR) + gl.encode_value(gl.ARR, (etype, items)))
    elif m.op == "kv_rename":
        kv = copy.copy(lay.kvs[idx[p["key"]]])
        if "new_hex" in p:
            kv.key = bytes.fromhex(p["new_hex"])
        else:
            kv.key_length = p["length"]
        lay.kvs[idx[p["key"]]] = kv
    elif m.op == "header":
        value = p.get("value")
        if p["field"] == "magic":
            lay.magic = value.encode()
        elif p["field"] == "version":
            lay.version = value
        elif p["field"] == "n_tensors":
            lay.n_tensors = value if value is not None else len(lay.tensors) + p["delta"]
        else:
            lay.n_kv = value if value is not None else len(lay.kvs) + p["delta"]
    elif m.op == "tensor":
        i = next(i for i, t in enumerate(lay.tensors) if t.name == p["tensor"])
        t = lay.tensors[i]
        if p.get("remove"):
            del lay.tensors[i]
        elif p["field"] == "n_dims":
            t.n_dims = p["value"]
        elif p["field"] == "dims":
            t.dims = list(p["value"])
        elif p["field"] == "ttype":
            t.ttype = p["value"]
        elif p["field"] == "offset":
            t.offset = p["value"] if "value" in p else t.offset + p["delta"]
        elif p["field"] == "name":
            t.name = p["value"]
        else:  # name_hex: bytes that are not UTF-8
            t.name = bytes.fromhex(p["value"])
    else:
        raise ValueError(f"unknown gguf op {m.op!r}")
    out.write_bytes(lay.to_bytes())
    return out


def _read_array(kv: gl.KV) -> list[Any]:
    """The string items of an array entry (tokens, merges) or its numbers (token_type)."""
    r = gl._Reader(kv.tail)
    r.pos = 16
    if kv.etype == gl.STR:
        return [r.string() for _ in range(kv.count or 0)]
    fmt = gl._FMT[kv.etype or 0]
    return [r.take(fmt) for _ in range(kv.count or 0)]
