"""The model's flat forward (keel.models.llama.flat_forward, what the model runner runs) against the model's own
nn.Module forwards: the same ops on the same tensors, so the same logits bits, at every prefill and decode step,
for every architecture (qk norms, biases, sliding windows), bf16 / fp32, keel's linears and FP8, paged blocks
of 16 (the decode kernels' path) and 4 (the gathered path)."""

from __future__ import annotations

import pytest
import torch
from keel_dev.checkpoints import ARCHS
from support.native import needs_ops

from keel.engine import LLM, SamplingParams

pytestmark = needs_ops
PROMPTS = ["The quick brown fox", "Paged attention stores keys and values in fixed-size blocks. Hello", "def"]


def step_logits(llm: LLM, flat: bool) -> list[torch.Tensor]:
    """Every forward's logits over greedy generation of PROMPTS (batched), flat or module path."""
    runner = llm.llm_engine.runner
    runner.model.flatten(flat)
    assert (runner.model.model.flat is not None) == flat
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
        runner.model.flatten()
    return seen


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
def test_flat_forward_gives_the_module_forwards_bits(hf_cache, arch, dtype, quantization, block_size):
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
    assert llm.llm_engine.runner.model.model.flat is not None  # the runner's default
    flat, modules = step_logits(llm, True), step_logits(llm, False)
    assert len(flat) == len(modules) > 2
    for i, (a, b) in enumerate(zip(flat, modules, strict=True)):
        assert torch.equal(a, b), f"{arch} {dtype} {quantization} step {i}: the flat forward's logits differ"


def test_flatten_sees_a_swapped_layer_only_when_asked(hf_cache):
    """The flat forward captures the layers as they were: a swapped projection is used after `flatten()` again."""
    llm = LLM("keel-test/tiny-llama", dtype="float32", device="cpu", progress=False, enable_prefix_caching=False)
    model = llm.llm_engine.runner.model
    calls = []
    down = model.model.layers[0].mlp.down_proj

    class Spy(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            calls.append(x.shape[0])
            return down(x)

    model.model.layers[0].mlp.down_proj = Spy()
    ids = torch.tensor([1, 2, 3])
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, ignore_eos=True))
    assert calls == []
    model.flatten()
    llm.generate([ids.tolist()], SamplingParams(max_tokens=2, ignore_eos=True))
    assert calls == [3, 1]


def test_flat_forward_without_the_private_op_entries(hf_cache, monkeypatch):
    """keel._compat.op_entry's fallback (the OpOverload objects) in the flat forward: the same logits bits."""
    from keel import _compat

    llm = LLM("keel-test/tiny-qwen3", dtype="bfloat16", device="cpu", progress=False, enable_prefix_caching=False)
    want = step_logits(llm, True)
    real = _compat.private
    monkeypatch.setattr(_compat, "private", lambda owner, name: None if name == "_op" else real(owner, name))
    got = step_logits(llm, True)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
