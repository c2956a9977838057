"""keel::reshape_and_cache (paged KV-cache writes) against index_copy_ into the flat cache."""

from __future__ import annotations

import pytest
import torch
from support.devices import DEVICES, DTYPES

from keel import ops


def reference_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping):
    keep = slot_mapping >= 0
    kv, d = key.shape[1:]
    key_cache.view(-1, kv, d).index_copy_(0, slot_mapping[keep], key[keep])
    value_cache.view(-1, kv, d).index_copy_(0, slot_mapping[keep], value[keep])


CASES = [
    # tokens, kv heads, head size, blocks, block size
    (5, 2, 8, 4, 4),
    (1, 3, 64, 8, 16),  # one decode token, SmolLM2-135M kv shape
    (37, 3, 64, 4, 16),
    (0, 2, 8, 2, 4),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("strided_src", [False, True])
def test_matches_reference(device, dtype, case, strided_src):
    t, kv, d, nb, bs = case
    g = torch.Generator().manual_seed(21)
    if strided_src:  # k and v as column slices of one qkv projection output
        qkv = torch.randn(t, 3 * kv * d, generator=g).to(dtype).to(device)
        key = qkv[:, kv * d : 2 * kv * d].view(t, kv, d)
        value = qkv[:, 2 * kv * d :].view(t, kv, d)
    else:
        key = torch.randn(t, kv, d, generator=g).to(dtype).to(device)
        value = torch.randn(t, kv, d, generator=g).to(dtype).to(device)
    slots = torch.randperm(nb * bs, generator=g)[:t]
    if t > 2:
        slots[1] = -1  # a padding token is skipped
    slots = slots.to(device)
    kc = torch.randn(nb, bs, kv, d, generator=g).to(dtype).to(device)
    vc = torch.randn(nb, bs, kv, d, generator=g).to(dtype).to(device)
    want_k, want_v = kc.clone(), vc.clone()
    reference_reshape_and_cache(key, value, want_k, want_v, slots)
    ops.reshape_and_cache(key, value, kc, vc, slots)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)


def test_opcheck():
    args = (
        torch.randn(3, 2, 4),
        torch.randn(3, 2, 4),
        torch.zeros(2, 4, 2, 4),
        torch.zeros(2, 4, 2, 4),
        torch.tensor([5, 0, 7]),
    )
    torch.library.opcheck(torch.ops.keel.reshape_and_cache.default, args)


def _call(key=None, value=None, kc=None, vc=None, slots=None):
    key = torch.randn(3, 2, 4) if key is None else key
    value = torch.randn(3, 2, 4) if value is None else value
    kc = torch.zeros(2, 4, 2, 4) if kc is None else kc
    vc = torch.zeros(2, 4, 2, 4) if vc is None else vc
    slots = torch.tensor([0, 1, 2]) if slots is None else slots
    ops.reshape_and_cache(key, value, kc, vc, slots)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            {"slots": torch.tensor([0, 1, 8])},
            r"keel::reshape_and_cache: slot_mapping\[2\]=8 is outside the cache's 8 slots",
        ),
        ({"slots": torch.tensor([0, -2, 1])}, r"keel::reshape_and_cache: slot_mapping\[1\]=-2 is outside"),
        (
            {"slots": torch.tensor([0, 1])},
            r"keel::reshape_and_cache: slot_mapping must be 1-D with one slot per token \(3\)",
        ),
        (
            {"slots": torch.tensor([0, 1, 2], dtype=torch.int32)},
            r"keel::reshape_and_cache: slot_mapping must be int64, got int32",
        ),
        (
            {"kc": torch.zeros(2, 4, 3, 4), "vc": torch.zeros(2, 4, 3, 4)},
            r"keel::reshape_and_cache: key_cache must be \[num_blocks, block_size, 2, 4\]",
        ),
        ({"vc": torch.zeros(2, 4, 2, 5)}, r"keel::reshape_and_cache: value_cache must have the shape of key_cache"),
        (
            {"value": torch.randn(3, 2, 4).half()},
            r"keel::reshape_and_cache: value must have the dtype of key \(float32\), got float16",
        ),
        ({"key": torch.randn(3, 8), "value": torch.randn(3, 8)}, r"keel::reshape_and_cache: key must be 3-D"),
        (
            {"kc": torch.zeros(1, 4, 2, 4).expand(2, 4, 2, 4)},
            r"keel::reshape_and_cache: key_cache is written in place but has overlapping",
        ),
    ],
)
def test_bad_inputs(kwargs, match):
    with pytest.raises(RuntimeError, match=match):
        _call(**kwargs)
