"""The sampling extras on the real SmolLM2-135M-Instruct (nobody here wrote it), fp32: a JSON schema
answer that validates, and prompt logprobs against transformers' on the same converted checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from support.smollm2 import needs_smollm2

from keel.engine import LLM, SamplingParams
from keel.engine.sampling_params import StructuredOutputsParams

pytestmark = [needs_smollm2, pytest.mark.slow]  # the real 135M model, and transformers on it

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "country": {"type": "string", "maxLength": 20},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 100},
    },
    "required": ["city", "country", "population_millions"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def smol(smollm2_fp32):
    return LLM(str(smollm2_fp32), dtype="float32", device="cpu", progress=False)


def test_json_schema_answer_validates(smol):
    import jsonschema

    msg = [{"role": "user", "content": "Give the capital of France as JSON with city, country, population_millions."}]
    so = StructuredOutputsParams(json=SCHEMA)
    params = [SamplingParams(max_tokens=40, structured_outputs=so)]
    params += [SamplingParams(max_tokens=40, temperature=0.8, seed=s, structured_outputs=so) for s in range(1)]
    for out in smol.chat([msg] * 2, params):
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), SCHEMA)


def test_prompt_logprobs_match_transformers(smol, smollm2_fp32):
    import transformers

    ids = smol.tokenizer.encode("The capital of France is Paris, and the capital of Italy is Rome.")
    hf = transformers.AutoModelForCausalLM.from_pretrained(smollm2_fp32, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
    out = smol.generate([ids], SamplingParams(max_tokens=0, prompt_logprobs=1))[0]
    worst = max(abs(out.prompt_logprobs[i][ids[i]].logprob - ref[i - 1, ids[i]].item()) for i in range(1, len(ids)))
    assert worst < 1e-3, worst
