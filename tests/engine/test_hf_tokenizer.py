"""Tokenizer, chat template and streaming detokenization against transformers' tokenizer."""

from __future__ import annotations

import pytest
from keel_dev.checkpoints import model_dir

from keel.hf.tokenizer import IncrementalDetokenizer, Tokenizer, TokenizerError

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello world! café"}]


@pytest.fixture(scope="module")
def tok(hf_cache):
    return Tokenizer(model_dir(hf_cache, "llama"))


def test_encode_decode_and_eos(tok, hf_cache):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(model_dir(hf_cache, "llama"))
    text = "The quick brown fox, naïve 東京"
    assert tok.encode(text) == hf(text)["input_ids"]
    assert tok.decode(tok.encode(text)) == text
    assert hf.convert_tokens_to_ids("<|im_end|>") in tok.eos_token_ids
    assert 2 in tok.eos_token_ids  # generation_config.json


@pytest.mark.parametrize("gen_prompt", [True, False])
def test_chat_template_matches_transformers(tok, hf_cache, gen_prompt):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(model_dir(hf_cache, "llama"))
    ref = hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=gen_prompt)
    assert tok.apply_chat_template(MESSAGES, add_generation_prompt=gen_prompt) == ref
    assert tok.encode_chat(MESSAGES)[0] == tok.encode("<|im_start|>", add_special_tokens=False)[0]


def test_chat_template_jinja_file_wins(hf_cache, tmp_path):
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(model_dir(hf_cache, "llama"), folder)
    (folder / "chat_template.jinja").write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    assert Tokenizer(folder).apply_chat_template(MESSAGES) == "[Be brief.][Hello world! café]"


def test_missing_tokenizer_is_clear(tmp_path):
    with pytest.raises(TokenizerError, match="tokenizer.json not found"):
        Tokenizer(tmp_path)


def test_incremental_detokenizer_concatenates_to_full_decode(tok):
    text = "Hello world! Numbers 0123456789 and unicode: café, naïve, 東京."
    ids = tok.encode(text, add_special_tokens=False)
    prompt = tok.encode("The quick")
    detok = IncrementalDetokenizer(tok, prompt)
    pieces = [detok.add(i) for i in ids]
    assert "".join(pieces) == tok.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)
