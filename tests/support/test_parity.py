"""The parity rule of support/parity.py: tokens count only before the reference's first near-tie."""

from __future__ import annotations

import pytest
import torch
from keel_dev.parity import assert_greedy_parity, compare_greedy, greedy_gaps, logit_diff, top2_margins


def test_equal_tokens_without_a_tie_are_compared_in_full():
    r = compare_greedy([1, 2, 3], [1, 2, 3], [5.0, 5.0, 5.0], 0.5)
    assert r.ok and r.compared == 3 and r.near_tie is None and "3 of 3 tokens compared, equal" in r.summary()


def test_a_difference_before_the_first_tie_fails():
    r = compare_greedy([1, 9, 3], [1, 2, 3], [5.0, 5.0, 0.1], 0.5)
    assert not r.ok and r.first_diff == 1 and r.near_tie == 2 and "DIFFER at token 1" in r.summary()


def test_a_difference_at_or_after_the_tie_is_allowed_and_reported():
    r = compare_greedy([1, 2, 7, 8], [1, 2, 3, 4], [5.0, 5.0, 0.125, 5.0], 0.5)
    assert r.ok and r.compared == 2 and r.first_diff == 2
    assert (
        "reference's first near-tie at token 2 (margin 0.125 < 0.5)" in r.summary()
        and "part from token 2" in r.summary()
    )


def test_a_tie_at_the_first_token_compares_nothing_and_says_so():
    r = compare_greedy([7, 8], [3, 4], [0.125, 9.0], 0.5)
    assert r.ok and r.compared == 0 and r.summary().endswith("only the logits are checked (they part from token 0)")


def test_one_side_stopping_early_is_a_difference():
    # eos (token 0) one step early on `got`: a difference at position 2 unless the reference tied there
    assert not compare_greedy([1, 2, 0], [1, 2, 3, 0], [5.0] * 4, 0.5).ok
    assert compare_greedy([1, 2, 0], [1, 2, 3, 0], [5.0, 5.0, 0.2, 5.0], 0.5).ok


def test_missing_margins_are_refused():
    with pytest.raises(ValueError, match="compare_greedy: ref_margins has 1 entries, expected >= 2"):
        compare_greedy([1, 2], [1, 2], [1.0], 0.5)


def test_assert_greedy_parity_raises_with_the_summary(capsys):
    with pytest.raises(AssertionError, match="x: DIFFER at token 0"):
        assert_greedy_parity([2], [1], [3.0], 0.5, "x")
    assert "x: DIFFER at token 0" in capsys.readouterr().out


def test_tensor_helpers():
    logits = torch.tensor([[1.0, 3.0, 2.5], [0.0, -1.0, 4.0]])
    assert top2_margins(logits) == pytest.approx([0.5, 4.0])
    assert greedy_gaps(logits, [2, 2]) == pytest.approx([0.5, 0.0])
    assert logit_diff(logits, logits + torch.tensor([[0.0, 0.0, 0.3], [0.0, 0.0, 0.0]])) == pytest.approx((0.3, 0.05))
    with pytest.raises(ValueError, match=r"logit_diff: shapes differ: \(2, 3\) vs \(1, 3\)"):
        logit_diff(logits, logits[:1])
