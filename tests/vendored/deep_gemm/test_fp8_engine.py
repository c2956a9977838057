"""The engine's FP8 path (src/keel/layers/fp8_linear.py): Fp8Linear against nn.Linear, every linear swapped
(lm_head included, the embedding kept), and end to end on the real SmolLM2-135M: `quantization="fp8"`
answers the capital-of-France prompt and its perplexity on tests/data/perplexity_text.txt is within 3%
of bf16 (both values are printed). The real-model tests skip when the GGUF is not installed."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from keel_dev.engine import keel_prompt_logits
from keel_dev.parity import top2_margins
from support.smollm2 import needs_smollm2 as needs_model
from torch import nn

from keel.layers.fp8_linear import BLOCK_RECIPE, ROW_RECIPE, Fp8Linear, check_quantization, quantize_linears
from keel.vendored import deep_gemm as dg

TEXT = Path(__file__).resolve().parents[2] / "data" / "perplexity_text.txt"
# The bound is 3% over bf16, which the engine's default (1, 1, 128) weight recipe holds (measured
# +1.2% to +2.0% as the kernels' summation order changed). DeepSeek-V3's 128x128 weight blocks give +4.2% to
# +5.4% on this small model, over that bound, so they are only guarded against breakage here (8%).
PPL_TOLERANCE = {"fp8": 0.03, "fp8 128x128": 0.08}


@pytest.mark.parametrize(
    "dtype,recipe", [(torch.float32, (1, 128, 128)), (torch.bfloat16, (1, 128, 128)), (torch.bfloat16, ROW_RECIPE)]
)
def test_fp8_linear_matches_linear(dtype, recipe):
    torch.manual_seed(0)
    lin = nn.Linear(300, 260, bias=True).to(dtype)
    x = torch.randn(2, 3, 300).to(dtype)
    got = Fp8Linear(lin, recipe)(x)
    assert got.shape == (2, 3, 260) and got.dtype == dtype
    assert dg.calc_diff(got, nn.functional.linear(x.double(), lin.weight.double(), lin.bias.double())) < 1e-3


def test_quantize_linears_swaps_every_linear_but_not_embeddings():
    model = nn.Sequential(nn.Embedding(10, 16), nn.Linear(16, 32), nn.ReLU(), nn.Sequential(nn.Linear(32, 10)))
    assert quantize_linears(model) == 2
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert isinstance(model[0], nn.Embedding) and model[0].weight.dtype == torch.float32
    assert model[1].qweight.dtype == torch.float8_e4m3fn and model[1].weight_scale.shape == (32, 1)  # 1x128 default
    rows = nn.Linear(300, 200)
    assert Fp8Linear(rows, ROW_RECIPE).weight_scale.shape == (200, 3)
    assert Fp8Linear(rows, BLOCK_RECIPE).weight_scale.shape == (2, 3)
    with pytest.raises(ValueError, match=r"Fp8Linear: recipe must be \(1, 128, 128\) or \(1, 1, 128\)"):
        Fp8Linear(rows, (1, 128, 64))


def test_unknown_quantization_is_refused():
    assert check_quantization(None) == "none"
    with pytest.raises(ValueError, match=r"quantization 'int4' is not supported; expected one of none, fp8"):
        check_quantization("int4")


def _perplexity(llm, ids: list[int]) -> float:
    """exp(mean next-token NLL) over `ids`, from one prefill with all-position logits."""
    logits = keel_prompt_logits(llm, ids).float()
    nll = nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]))
    return math.exp(float(nll))


@pytest.mark.slow  # the real 135M model in bf16 and fp8, perplexity over a page of text
@needs_model
def test_fp8_engine_answers_paris_and_keeps_perplexity(smollm2_fp32):
    from keel import LLM, SamplingParams

    ids = None
    ppl = {}
    for name in ("bf16", "fp8", "fp8 128x128"):
        # the 128x128 variant: the bf16 model, unpacked, quantized here with the other recipe
        quant = "fp8" if name == "fp8" else "none"
        llm = LLM(
            str(smollm2_fp32),
            dtype="bfloat16",
            device="cpu",
            quantization=quant,
            progress=False,
            cpu_prepack=name == "bf16",
        )
        if name == "fp8 128x128":
            assert quantize_linears(llm.model, BLOCK_RECIPE) > 0
        if name == "fp8":
            assert not any(isinstance(m, nn.Linear) for m in llm.model.modules()), "a linear kept its bf16 weight"
            assert llm.model.model.embed_tokens.weight.dtype == torch.bfloat16
            # a plain continuation: with the chat template the first token is a near-tie for this model
            # ("The" vs "L" 0.125 nats apart in bf16) that FP8 noise flips, so the answer there varies
            out = llm.generate("The capital of France is", SamplingParams(max_tokens=8))
            assert "Paris" in out[0].text, out[0].text
            # " Paris" is the first token, clear of a near-tie (margin 1.5 in fp8, 2.69 in bf16, measured), so no
            # CPU's rounding picks another one; a checkpoint with a tie there fails here, as a tie
            first = llm.tokenizer.encode("The capital of France is")
            assert top2_margins(keel_prompt_logits(llm, first)[-1:])[0] >= 0.75, "a near-tie at the first token"
        ids = ids or llm.tokenizer.encode(TEXT.read_text())
        assert len(ids) > 300
        ppl[name] = _perplexity(llm, ids)
    print(
        f"\nSmolLM2-135M perplexity on {TEXT.name} ({len(ids)} tokens): "
        + ", ".join(f"{k} {v:.3f} ({v / ppl['bf16'] - 1:+.2%})" for k, v in ppl.items())
    )
    assert ppl["bf16"] < 30, f"bf16 perplexity {ppl['bf16']:.2f} is implausible for English text"
    for name, tol in PPL_TOLERANCE.items():
        assert abs(ppl[name] / ppl["bf16"] - 1) < tol, (name, ppl)


@pytest.mark.slow  # the real 135M model
@needs_model
def test_cli_generate_quantization_fp8(smollm2_fp32, capsys):
    from keel.cli import main

    rc = main(
        [
            "generate",
            "--model",
            str(smollm2_fp32),
            "--quantization",
            "fp8",
            "--dtype",
            "bf16",
            "--device",
            "cpu",
            "--max-tokens",
            "16",
            "--raw",
            "--prompt",
            "The capital of France is",
        ]
    )
    out = capsys.readouterr()
    assert rc == 0, out.err[-3000:]
    assert "Paris" in out.out, out.out
