"""The engine on CUDA: greedy tokens equal the CPU engine's up to the first near-tie of the CPU reference, in bf16
and fp8 (`quantization="fp8"`: the weights cast on the GPU by deep_gemm's CUDA casts). A random-weight model with
SmolLM2-135M's shapes runs everywhere a GPU is (it needs no download); the real SmolLM2 GGUF too where it is
installed. A batch of prompts of different lengths (varlen prefill, paged decode), then a second turn that
reuses the cached prefix. Skipped without a GPU: no GPU has run this yet (compiled, not run).

Near-tie: the CPU reference's top-2 logit gap at a step below NEAR_TIE of its logits' spread (std) there; from
that step on CPU and CUDA may rightly differ (different summation orders), so only the steps before count.
"""

from __future__ import annotations

import pytest
import torch
from keel_dev.checkpoints import write_random_llama
from keel_dev.engine import keel_prompt_logits
from support.smollm2 import needs_smollm2

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

NEAR_TIE = 0.02  # of the logits' std: bf16 through the layers moves logits by well under 1% of their spread
NEW_TOKENS = 24
MIN_COMPARED = 12  # over all prompts: a comparison that stops at once proves nothing


@pytest.fixture(scope="module")
def random_smollm2(tmp_path_factory: pytest.TempPathFactory):
    return write_random_llama(tmp_path_factory.mktemp("smollm2_random"), seed=0, num_hidden_layers=8)


def first_near_tie(llm, prompt: list[int], tokens: list[int]) -> int:
    """Index of the first generated token whose CPU logits had a near-tie (len(tokens) when none)."""
    logits = keel_prompt_logits(llm, prompt + tokens[:-1]).float()[len(prompt) - 1 :]  # row i -> token i
    top2 = logits.topk(2, dim=-1).values
    gap, spread = top2[:, 0] - top2[:, 1], logits.std(dim=-1)
    near = (gap < NEAR_TIE * spread).nonzero()
    n = int(near[0]) if len(near) else len(tokens)
    # the reference's prefill (these logits) and its decode (its tokens) agree where no near-tie is
    assert logits.argmax(-1)[:n].tolist() == tokens[:n], "the reference logits do not give its own tokens"
    return n


def compare(model, prompts: list[list[int]], quantization: str) -> None:
    from keel import LLM, SamplingParams

    q = None if quantization == "bf16" else quantization
    cpu = LLM(str(model), dtype="bfloat16", device="cpu", quantization=q, progress=False)
    gpu = LLM(str(model), dtype="bfloat16", device="cuda", quantization=q, progress=False)
    assert gpu.device.type == "cuda"
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    want = [o.token_ids for o in cpu.generate(prompts, params)]
    got = [o.token_ids for o in gpu.generate(prompts, params)]
    compared = 0
    for prompt, w, g in zip(prompts, want, got, strict=True):
        n = first_near_tie(cpu, prompt, w)
        assert g[:n] == w[:n], f"CUDA and CPU differ before the first near-tie (step {n}): {g[:n]} vs {w[:n]}"
        compared += n
    assert compared >= MIN_COMPARED, f"only {compared} tokens before near-ties: the comparison is too weak"
    # second turn: the first turn's blocks come from the prefix cache on the GPU as well
    turn2 = [prompts[0] + want[0] + [5, 6, 7]]
    again_cpu = cpu.generate(turn2, params)[0]
    again_gpu = gpu.generate(turn2, params)[0]
    assert again_gpu.num_cached_tokens > 0, "the second turn did not reuse the cached prefix"
    n = first_near_tie(cpu, turn2[0], again_cpu.token_ids)
    assert again_gpu.token_ids[:n] == again_cpu.token_ids[:n]


@pytest.mark.parametrize("quantization", ["bf16", "fp8"])
def test_random_smollm2_shapes_cuda_equals_cpu(random_smollm2, quantization):
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 49152, (n,), generator=g).tolist() for n in (5, 37, 100)]
    compare(random_smollm2, prompts, quantization)


@needs_smollm2
@pytest.mark.parametrize("quantization", ["bf16", "fp8"])
def test_real_smollm2_cuda_equals_cpu(smollm2_fp32, quantization):
    from keel.hf.tokenizer import Tokenizer

    tok = Tokenizer(smollm2_fp32)
    questions = ["What is the capital of France?", "Name three primary colors.", "Write a haiku about rain."]
    prompts = [tok.encode_chat([{"role": "user", "content": q}]) for q in questions]
    compare(smollm2_fp32, prompts, quantization)
