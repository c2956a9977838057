"""Tokenizer.max_chars_per_token: a bound only where the tokenizer makes it one, and then a sound one (a text
longer than it times N never tokenizes to N tokens or fewer)."""

from __future__ import annotations

import random

import pytest

from keel.hf.tokenizer import Tokenizer, _keeps_length, _model_info


def test_the_bound_holds_for_the_tiny_checkpoints_tokenizer(tiny_hf):
    tok = Tokenizer(tiny_hf)
    per_token = tok.max_chars_per_token()
    assert per_token is not None and per_token >= 1
    rng = random.Random(0)
    pieces = sorted((tok.decode([t], skip_special_tokens=False) for t in range(tok.vocab_size)), key=len)[-20:]
    texts = [pieces[-1] * 7]  # the longest piece alone: one token per copy, exactly at the bound
    texts += ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 60))) for _ in range(50)]
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False)
        assert len(text) <= per_token * len(ids), (text, ids)


@pytest.mark.parametrize(
    ("step", "keeps"),
    [
        (None, True),
        ({"type": "ByteLevel", "add_prefix_space": False}, True),
        ({"type": "Sequence", "pretokenizers": [{"type": "Digits"}, {"type": "ByteLevel"}]}, True),
        ({"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Isolated"}, True),
        ({"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Removed"}, False),
        ({"type": "Whitespace"}, False),  # drops whitespace
        ({"type": "BertPreTokenizer"}, False),
        ({"type": "NFC"}, False),  # composes characters
        ({"type": "Strip", "left": True, "right": True}, False),
        ({"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}, True),
        ({"type": "Replace", "pattern": {"String": "  "}, "content": " "}, False),
        ({"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "Strip"}]}, False),
    ],
)
def test_only_steps_that_drop_no_characters_keep_the_bound(step, keeps):
    assert _keeps_length(step) is keeps


@pytest.mark.parametrize(
    ("model", "bounded"),
    [
        ({"type": "BPE", "unk_token": None, "fuse_unk": False}, True),
        ({"type": "BPE", "unk_token": "<unk>", "fuse_unk": True}, False),  # one <unk> for any run of unknowns
        ({"type": "WordPiece", "unk_token": "[UNK]"}, False),  # one [UNK] for a whole word
        ({"type": "Unigram"}, False),
    ],
)
def test_only_models_whose_tokens_stand_for_their_own_text_keep_the_bound(model, bounded):
    assert _model_info({"model": model}) is bounded
