"""Writers for tiny synthetic GGUF files, kept independent of keel's reader."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# value type tags of the GGUF spec, and their encoding (the loader fuzzer's byte-level model, which is
# independent of keel's reader too)
from keel_fuzz.loaders.gguf_layout import ARR, BOOL, F64, I8, I16, I32, I64, STR, U8, U16, U32, U64  # noqa: F401
from keel_fuzz.loaders.gguf_layout import F32 as F32V
from keel_fuzz.loaders.gguf_layout import encode_str as _str
from keel_fuzz.loaders.gguf_layout import encode_value as _value

# ggml types used here
T_F32, T_F16, T_Q4_1, T_Q8_0, T_BF16 = 0, 1, 3, 8, 30


@dataclass
class GGUFSpec:
    """What to write: metadata ``(key, type, value)`` and tensors ``(name, ggml_type, gguf_dims, bytes)``."""

    metadata: list[tuple[str, int, Any]] = field(default_factory=list)
    tensors: list[tuple[str, int, tuple[int, ...], bytes]] = field(default_factory=list)
    alignment: int = 32
    version: int = 3
    magic: bytes = b"GGUF"


def write_gguf(path: Path, spec: GGUFSpec) -> Path:
    """Serialize ``spec`` following the GGUF v3 layout."""
    out = bytearray(spec.magic + struct.pack("<IQQ", spec.version, len(spec.tensors), len(spec.metadata)))
    for key, vtype, value in spec.metadata:
        out += _str(key) + struct.pack("<I", vtype) + _value(vtype, value)
    offsets, pos = [], 0
    for _, _, _, data in spec.tensors:
        offsets.append(pos)
        pos += -(-len(data) // spec.alignment) * spec.alignment
    for (name, ttype, dims, _), off in zip(spec.tensors, offsets, strict=True):
        out += _str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ttype, off)
    out += b"\0" * (-len(out) % spec.alignment)
    for _, _, _, data in spec.tensors:
        out += data + b"\0" * (-len(data) % spec.alignment)
    path.write_bytes(bytes(out))
    return path


def quantize_q8_0(x: np.ndarray) -> bytes:
    """Reference Q8_0: per 32 values, d = max|x|/127 (f16), q = round(x/d)."""
    b = x.astype(np.float32).reshape(-1, 32)
    d = (np.abs(b).max(axis=1, keepdims=True) / 127).astype(np.float16)
    q = np.round(b / np.where(d == 0, 1, d).astype(np.float32)).clip(-127, 127).astype(np.int8)
    return b"".join(d[i].tobytes() + q[i].tobytes() for i in range(len(b)))


def quantize_q4_1(x: np.ndarray) -> bytes:
    """Reference Q4_1: per 32 values, m = min, d = (max-min)/15; nibble j low = x[j], high = x[j+16]."""
    b = x.astype(np.float32).reshape(-1, 32)
    lo, hi = b.min(axis=1, keepdims=True), b.max(axis=1, keepdims=True)
    d = ((hi - lo) / 15).astype(np.float16)
    m = lo.astype(np.float16)
    q = np.round((b - m.astype(np.float32)) / np.where(d == 0, 1, d).astype(np.float32)).clip(0, 15).astype(np.uint8)
    packed = q[:, :16] | (q[:, 16:] << 4)
    return b"".join(d[i].tobytes() + m[i].tobytes() + packed[i].tobytes() for i in range(len(b)))


def dequant_reference(data: bytes, ttype: int, n: int) -> np.ndarray:
    """Element-by-element dequantization as written in ggml's reference C code."""
    out = np.zeros(n, dtype=np.float32)
    if ttype == T_Q8_0:
        for blk in range(n // 32):
            raw = data[blk * 34 : blk * 34 + 34]
            d = np.frombuffer(raw[:2], "<f2")[0].astype(np.float32)
            for j in range(32):
                out[blk * 32 + j] = d * np.int8(np.frombuffer(raw[2 + j : 3 + j], np.int8)[0])
    elif ttype == T_Q4_1:
        for blk in range(n // 32):
            raw = data[blk * 20 : blk * 20 + 20]
            d, m = np.frombuffer(raw[:4], "<f2").astype(np.float32)
            for j in range(16):
                out[blk * 32 + j] = (raw[4 + j] & 0x0F) * d + m
                out[blk * 32 + j + 16] = (raw[4 + j] >> 4) * d + m
    else:
        raise AssertionError(ttype)
    return out


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py ``LlamaModel.permute``, written out independently of keel."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i s"]
TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass
class TinyLlama:
    """A synthetic llama GGUF plus the HF-layout float32 weights it should convert back to."""

    spec: GGUFSpec
    expected: dict[str, np.ndarray]
    tokens: list[str]
    dims: dict[str, int]


def tiny_llama(tied: bool = True, seed: int = 0) -> TinyLlama:
    """2 layers, hidden 64, 4 heads / 2 kv heads; embeddings Q8_0, projections Q4_1, norms F32."""
    rng = np.random.default_rng(seed)
    hidden, ffn, layers, heads, kv, head_dim = 64, 128, 2, 4, 2, 16
    byte_chars = list(bytes_to_unicode().values())
    tokens = SPECIALS + byte_chars + [m.replace(" ", "") for m in MERGES]
    vocab = len(tokens)
    types = [3] * len(SPECIALS) + [1] * (vocab - len(SPECIALS))
    spec = GGUFSpec(
        metadata=[
            ("general.architecture", STR, "llama"),
            ("general.name", STR, "tiny"),
            ("llama.block_count", U32, layers),
            ("llama.context_length", U32, 256),
            ("llama.embedding_length", U32, hidden),
            ("llama.feed_forward_length", U32, ffn),
            ("llama.attention.head_count", U32, heads),
            ("llama.attention.head_count_kv", U32, kv),
            ("llama.rope.freq_base", F32V, 10000.0),
            ("llama.attention.layer_norm_rms_epsilon", F32V, 1e-5),
            ("llama.vocab_size", U32, vocab),
            ("llama.rope.dimension_count", U32, head_dim),
            ("tokenizer.ggml.model", STR, "gpt2"),
            ("tokenizer.ggml.pre", STR, "smollm"),
            ("tokenizer.ggml.tokens", ARR, (STR, tokens)),
            ("tokenizer.ggml.token_type", ARR, (I32, types)),
            ("tokenizer.ggml.merges", ARR, (STR, MERGES)),
            ("tokenizer.ggml.bos_token_id", U32, 1),
            ("tokenizer.ggml.eos_token_id", U32, 2),
            ("tokenizer.ggml.unknown_token_id", U32, 0),
            ("tokenizer.ggml.padding_token_id", U32, 2),
            ("tokenizer.ggml.add_bos_token", BOOL, False),
            ("tokenizer.chat_template", STR, TEMPLATE),
        ]
    )
    expected: dict[str, np.ndarray] = {}

    def add(gguf_name: str, hf_name: str, w: np.ndarray, ttype: int, permute_heads: int = 0) -> None:
        stored = llamacpp_permute(w, permute_heads) if permute_heads else w
        if ttype == T_F32:
            data, back = stored.astype(np.float32).tobytes(), w.astype(np.float32)
        else:
            data = quantize_q8_0(stored) if ttype == T_Q8_0 else quantize_q4_1(stored)
            # blocks run along rows, so permuting rows commutes with the quantize round trip
            back = dequant_reference(quantize_q8_0(w) if ttype == T_Q8_0 else quantize_q4_1(w), ttype, w.size)
            back = back.reshape(w.shape)
        spec.tensors.append((gguf_name, ttype, tuple(reversed(w.shape)), data))
        expected[hf_name] = back

    add("token_embd.weight", "model.embed_tokens.weight", rng.normal(0, 0.5, (vocab, hidden)), T_Q8_0)
    for i in range(layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        add(b + "attn_norm.weight", p + "input_layernorm.weight", 1 + rng.normal(0, 0.1, hidden), T_F32)
        add(
            b + "attn_q.weight",
            p + "self_attn.q_proj.weight",
            rng.normal(0, 0.2, (heads * head_dim, hidden)),
            T_Q4_1,
            heads,
        )
        add(
            b + "attn_k.weight",
            p + "self_attn.k_proj.weight",
            rng.normal(0, 0.2, (kv * head_dim, hidden)),
            T_Q4_1,
            kv,
        )
        add(
            b + "attn_v.weight",
            p + "self_attn.v_proj.weight",
            rng.normal(0, 0.2, (kv * head_dim, hidden)),
            T_Q4_1,
        )
        add(
            b + "attn_output.weight",
            p + "self_attn.o_proj.weight",
            rng.normal(0, 0.2, (hidden, hidden)),
            T_Q4_1,
        )
        add(
            b + "ffn_norm.weight",
            p + "post_attention_layernorm.weight",
            1 + rng.normal(0, 0.1, hidden),
            T_F32,
        )
        add(b + "ffn_gate.weight", p + "mlp.gate_proj.weight", rng.normal(0, 0.2, (ffn, hidden)), T_Q4_1)
        add(b + "ffn_up.weight", p + "mlp.up_proj.weight", rng.normal(0, 0.2, (ffn, hidden)), T_Q4_1)
        add(b + "ffn_down.weight", p + "mlp.down_proj.weight", rng.normal(0, 0.2, (hidden, ffn)), T_Q4_1)
    add("output_norm.weight", "model.norm.weight", 1 + rng.normal(0, 0.1, hidden), T_F32)
    if not tied:
        add("output.weight", "lm_head.weight", rng.normal(0, 0.5, (vocab, hidden)), T_Q8_0)
    dims = {"hidden": hidden, "ffn": ffn, "layers": layers, "heads": heads, "kv": kv, "vocab": vocab}
    return TinyLlama(spec, expected, tokens, dims)
