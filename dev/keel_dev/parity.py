"""Greedy-token and logit parity between two sides that may round differently (README "Parity rule").

Two implementations (keel and transformers, bf16 and fp32) or two torch releases can pick different
greedy tokens wherever the reference's best two logits are closer than their rounding differences:
after such a near-tie the two write different texts, and which side wins depends on the CPU's kernels.
So tokens are compared only up to the reference's first position whose top-2 margin is below a stated
threshold (`compare_greedy`), and that position is reported; logits are compared separately, with max
and mean |difference| bounds. The comparison is pure Python (scripts/release/pipeline.py uses it without
torch); the tensor helpers import torch when called.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GreedyParity:
    """Where two greedy token sequences were compared, where the reference had its first near-tie."""

    threshold: float  # a reference margin below this is a near-tie (logit units: nats before softmax)
    length: int  # positions both sequences have
    near_tie: int | None  # first position whose reference top-2 margin < threshold (None: none)
    near_tie_margin: float | None
    first_diff: int | None  # first position where the tokens differ or one sequence has ended

    @property
    def compared(self) -> int:
        """How many leading tokens must be equal: up to (not including) the first near-tie."""
        return self.length if self.near_tie is None else min(self.near_tie, self.length)

    @property
    def ok(self) -> bool:
        return self.first_diff is None or self.first_diff >= self.compared

    def summary(self) -> str:
        if self.near_tie is None:
            tie = f"no reference margin below {self.threshold:g}"
        else:
            margin = f"margin {self.near_tie_margin:.4g} < {self.threshold:g}"
            tie = f"reference's first near-tie at token {self.near_tie} ({margin})"
        if not self.ok:
            return f"DIFFER at token {self.first_diff}, before the first near-tie: {tie}"
        rest = f"equal over all {self.length}" if self.first_diff is None else f"they part from token {self.first_diff}"
        if self.compared == 0:
            return f"compared 0 tokens: {tie}; only the logits are checked ({rest})"
        return f"{self.compared} of {self.length} tokens compared, equal; {tie}; {rest}"


def compare_greedy(
    got: Sequence[int], ref: Sequence[int], ref_margins: Sequence[float], threshold: float
) -> GreedyParity:
    """`got` against `ref`, given the reference's top-2 margin at each of its positions."""
    if len(ref_margins) < len(ref):
        raise ValueError(f"compare_greedy: ref_margins has {len(ref_margins)} entries, expected >= {len(ref)}")
    n = min(len(got), len(ref))
    tie = next((i for i in range(len(ref)) if ref_margins[i] < threshold), None)
    diff = next((i for i in range(n) if got[i] != ref[i]), None)
    if diff is None and len(got) != len(ref):
        diff = n  # one side stopped (eos) where the other went on
    return GreedyParity(threshold, n, tie, None if tie is None else float(ref_margins[tie]), diff)


def assert_greedy_parity(
    got: Sequence[int], ref: Sequence[int], ref_margins: Sequence[float], threshold: float, label: str
) -> GreedyParity:
    """`compare_greedy`, printed (run pytest with -s to see it) and asserted."""
    result = compare_greedy(got, ref, ref_margins, threshold)
    print(f"\n{label}: {result.summary()}")
    assert result.ok, f"{label}: {result.summary()}\n  got {list(got)}\n  ref {list(ref)}"
    return result


def reference_greedy(model: Any, ids: Sequence[int], steps: int) -> tuple[list[int], list[float]]:
    """A transformers-style model's greedy tokens by full recomputation (no cache, no eos) and its top-2
    margin at each step."""
    import torch

    x = torch.tensor([list(ids)])
    tokens, margins = [], []
    with torch.no_grad():
        for _ in range(steps):
            last = model(x).logits[0, -1:]
            tokens.append(int(last.argmax()))
            margins += top2_margins(last)
            x = torch.cat([x, torch.tensor([[tokens[-1]]])], dim=1)
    return tokens, margins


def top2_margins(logits: Any) -> list[float]:
    """Best minus second-best logit of each row of `logits` [N, V] (computed in float32)."""
    top = logits.float().topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).tolist()


def greedy_gaps(ref_logits: Any, tokens: Sequence[int]) -> list[float]:
    """Per position: the reference's best logit minus its logit of the token chosen (0: its argmax).
    `ref_logits` [N, V] are the reference's logits on the same prefixes as `tokens`."""
    import torch

    rows = ref_logits.float()[: len(tokens)]
    chosen = rows.gather(1, torch.tensor(list(tokens), device=rows.device)[:, None])[:, 0]
    return (rows.max(-1).values - chosen).tolist()


def logit_diff(got: Any, ref: Any) -> tuple[float, float]:
    """(max, mean) |got - ref| in float32; the shapes must agree."""
    if tuple(got.shape) != tuple(ref.shape):
        raise ValueError(f"logit_diff: shapes differ: {tuple(got.shape)} vs {tuple(ref.shape)}")
    d = (got.float() - ref.float()).abs()
    return d.max().item(), d.mean().item()
