"""A decoder layer's step, written once (keel.models.llama.DecoderLayer.forward: keel.ops.layer_qkv, the attention,
keel.ops.layer_mlp), against the same step composed of keel's separate ops around callable projections: the same
logits bits at every prefill and decode step, for every architecture (qk norms, biases, sliding windows), bf16 /
fp32, keel's linears and FP8, paged blocks of 16 (the decode kernels' path) and 4 (the gathered path); and a layer
sees a projection swapped after it ran, without being told."""

from __future__ import annotations

import pytest
import torch
from keel_dev.checkpoints import ARCHS
from support.native import needs_ops
from torch import nn

from keel.engine import LLM, SamplingParams

pytestmark = needs_ops
PROMPTS = ["The quick brown fox", "Paged attention stores keys and values in fixed-size blocks. Hello", "def"]
PROJECTIONS = (("self_attn", "qkv_proj"), ("self_attn", "o_proj"), ("mlp", "gate_up_proj"), ("mlp", "down_proj"))


class Called(nn.Module):
    """A projection the fused ops cannot take as weights (a callable): the layer composes its step of separate ops
    around it, and it runs the projection it wraps as that projection's own op."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.calls: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(x.shape[0])
        return self.inner(x)


def step_logits(llm: LLM) -> list[torch.Tensor]:
    """Every forward's logits over greedy generation of PROMPTS (batched)."""
    runner = llm.llm_engine.runner
    real, seen = runner.forward, []

    def record(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append(out.clone())
        return out

    runner.forward = record
    try:
        llm.generate(PROMPTS, SamplingParams(max_tokens=6, ignore_eos=True))
    finally:
        runner.forward = real
    return seen


def wrap_projections(llm: LLM) -> list[Called]:
    wrapped = []
    for layer in llm.llm_engine.runner.model.model.layers:
        for part, name in PROJECTIONS:
            owner = getattr(layer, part)
            wrapped.append(Called(getattr(owner, name)))
            setattr(owner, name, wrapped[-1])
    return wrapped


def fp8_available() -> bool:
    try:
        from keel.vendored import deep_gemm  # noqa: F401
    except Exception:  # noqa: BLE001 - a build without the vendored library
        return False
    return True


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    ("dtype", "quantization", "block_size"),
    [("bfloat16", "none", 16), ("float32", "none", 4), ("bfloat16", "fp8", 16)],
)
def test_fused_step_gives_the_separate_ops_bits(hf_cache, arch, dtype, quantization, block_size):
    if quantization == "fp8" and not fp8_available():
        pytest.skip("keel.vendored.deep_gemm is not built")
    llm = LLM(
        f"keel-test/tiny-{arch}",
        dtype=dtype,
        device="cpu",
        block_size=block_size,
        quantization=quantization,
        enable_prefix_caching=False,
        progress=False,
    )
    fused = step_logits(llm)
    wrapped = wrap_projections(llm)
    composed = step_logits(llm)
    assert all(w.calls for w in wrapped)  # the composed step ran
    assert len(fused) == len(composed) > 2
    for i, (a, b) in enumerate(zip(fused, composed, strict=True)):
        assert torch.equal(a, b), f"{arch} {dtype} {quantization} step {i}: the fused step's logits differ"


def test_a_swapped_projection_is_used_at_once(hf_cache):
    """Layers bind their arguments once, and bind them again when a module is swapped (no call to make)."""
    llm = LLM("keel-test/tiny-llama", dtype="float32", device="cpu", progress=False, enable_prefix_caching=False)
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, ignore_eos=True))
    mlp = llm.llm_engine.runner.model.model.layers[0].mlp
    spy = Called(mlp.down_proj)
    mlp.down_proj = spy
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, ignore_eos=True))
    assert spy.calls == [3, 1]
    mlp.down_proj = spy.inner
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, ignore_eos=True))
    assert spy.calls == [3, 1]  # back to the fused step
