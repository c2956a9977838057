"""`Scheduler`: which sequences the next forward pass computes (continuous batching with preemption), and
the owner of the KV-cache bookkeeping: allocation, pool growth, prefix-cache lookup once per admission,
commit of computed blocks, release and preemption all go through it.

Fair admission. Every sequence has a client (an API key, else the connection's peer; None, one anonymous
client, for offline use). Admitting in arrival order lets one client's `n: 16` streams hold every slot
for thousands of steps and its long prompts take every prefill token, so the scheduler shares both:

- Slots: the waiting sequence of the client with the fewest running ones is admitted first. When every
  slot is taken, it preempts (recompute, as nano-vllm does: blocks freed, back to waiting; its full
  blocks stay in the prefix cache, so the recompute is mostly hits) the most recently admitted sequence
  of the client with the most running ones, provided that client holds more than the newcomer's would
  after admission; the same rule by blocks held when the pool is full. Each such move narrows the gap
  between two clients, so nothing bounces back and forth, and the engine stays work-conserving: one
  client alone still gets every slot (a fixed per-client cap would idle slots, and a client that
  already holds them all would still hold them until its streams end).
- Prefill tokens: the step's budget counts token-equivalents (`StepCost`): a token costs its projections
  (1) plus its attention over the positions before it, relative to the model's break-even context K (the
  positions at which attention costs as much as the projections; from the model's shape), so a chunk of n
  tokens from position p costs about n (1 + (p + n/2) / K): a chunk late in a long prompt is smaller than
  an early one, and a step's FLOPs stay within the budget wherever its chunks start. Each running decode
  computes its token and is charged 1 + context / K, at most S = max_num_seqs in all (what S decodes cost
  without the attention term), so that long-context decodes never shrink the prompts' share below the
  bound's. What is left is split max-min fair across the clients with prompt work (one that needs less
  than an equal part takes what it needs, the rest go to the others); a client's part goes to its prompts
  shortest first, as many tokens as it pays for (the least mean time to first token; only its own shorter
  prompts can delay a client's long one), and its shortest prompt gets a token even when its part cannot
  pay for one (progress). A short prompt is computed whole in the step it is admitted, however many long
  ones are being chunked: none waits for another's last chunk. A step costs at most B equivalents, unless
  its decodes cost more than S or a client's progress token costs more than its part.
- Twins: a waiting sequence whose client already has a running sequence with the same prompt in prefill
  (the `n` choices of one request) waits for that prefill, then is admitted with the prompt's full blocks
  as prefix-cache hits, and with its prompt logprobs when both ask for the same number.

The bound, with S = max_num_seqs, B = max_num_batched_tokens and C clients with prompt work: a request
from a client that holds no sequence is admitted at the first step after it arrives whenever another
client holds two sequences or more (in particular when one holds every slot; when the pool is full too,
as long as that client holds more blocks than the request needs), and from then on gets at least
G = floor((B - S) / C) token-equivalents a step, shared by that client's prompts in prefill. Its L-token
prompt's tokens cost at most 1 + L / K each, so it gets at least T = max(1, floor(G / (1 + L / K))) tokens
a step and has its first token after at most ceil(L / T) steps: with the defaults (S 64, B 256), two
clients and SmolLM2-135M's K on a CPU (1,024), one step for L <= 88 (tests/engine/test_fairness.py,
test_step_cost.py)."""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from keel.engine.block_manager import BlockManager, PrefixHit
from keel.engine.sequence import Sequence


@dataclass(slots=True, frozen=True)
class StepCost:
    """What computing a token costs the step's budget, in token-equivalents: its projections (1) plus its
    attention over the positions it attends to (its own and the earlier ones, at most `window`), divided by
    `break_even`, the number of positions at which a token's attention costs as much as its projections.
    None: tokens only (a model whose numbers are unknown). A chunk late in a long prompt costs more than an
    early one of the same length, as its forward pass takes longer."""

    break_even: float | None = None
    window: int | None = None  # sliding-window attention: positions a token attends to at most

    def __post_init__(self) -> None:
        if self.break_even is not None and not (math.isfinite(self.break_even) and self.break_even > 0):
            raise ValueError(f"StepCost: break_even must be a finite number > 0 or None, got {self.break_even}")
        if self.window is not None and self.window < 1:
            raise ValueError(f"StepCost: window must be >= 1 or None, got {self.window}")

    def _attended(self, end: int) -> int:
        """Positions attended by the tokens at positions [0, end) together."""
        w = self.window
        if w is None or end <= w:
            return end * (end + 1) // 2
        return w * (w + 1) // 2 + (end - w) * w

    def chunk(self, start: int, n: int) -> float:
        """The cost of computing the tokens at positions [start, start + n)."""
        if n <= 0:
            return 0.0
        if self.break_even is None:
            return float(n)
        return n + (self._attended(start + n) - self._attended(start)) / self.break_even

    def fit(self, start: int, most: int, budget: float) -> int:
        """The most tokens, up to `most`, from position `start` whose chunk costs at most `budget`."""
        lo, hi = 0, max(0, min(most, math.floor(budget)))  # (a token costs at least 1)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.chunk(start, mid) <= budget:
                lo = mid
            else:
                hi = mid - 1
        return lo


@dataclass(slots=True)
class SchedulerOutput:
    """One step's work: sequence r computes its tokens [num_computed_tokens, num_computed_tokens +
    num_tokens[r]) into the blocks of its table, which index a pool of `num_kv_blocks` blocks. A prompt
    longer than the step's token budget is computed in chunks over several steps (chunked prefill); only a
    sequence whose chunk reaches its last token gets a next token."""

    seqs: list[Sequence]
    num_prompt_tokens: int  # tokens of prompt work (0: a pure decode step)
    num_kv_blocks: int
    num_tokens: list[int] = field(default_factory=list)  # per sequence; empty: all its uncomputed tokens
    # what the engine adds for the sampler before the runner runs the step (None / empty: nothing to do)
    banned: list[list[int]] | None = None  # per sequence: tokens masked this step (min_tokens, bad words)
    bitmask: Any = None  # int32 [len(bitmask_rows), ceil(V/32)]: structured outputs' allowed tokens
    bitmask_rows: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.num_tokens:
            self.num_tokens = [s.num_new_tokens for s in self.seqs]
        if len(self.num_tokens) != len(self.seqs):
            raise ValueError(
                f"SchedulerOutput: num_tokens needs one entry per sequence ({len(self.seqs)}), "
                f"got {len(self.num_tokens)}"
            )

    def completes(self, r: int) -> bool:
        """Sequence r's chunk reaches its last token: the step gives it logits for its next token."""
        seq = self.seqs[r]
        return seq.num_computed_tokens + self.num_tokens[r] == len(seq.token_ids)

    @property
    def sample_rows(self) -> list[int]:
        """The rows that get a next token this step (a scoring request, max_tokens 0, samples none)."""
        return [r for r, s in enumerate(self.seqs) if self.completes(r) and s.params.max_tokens]

    def subset(self, rows: list[int]) -> SchedulerOutput:
        """The same step for `rows` only (the runner retries a failed batch row by row)."""
        where = {r: i for i, r in enumerate(self.bitmask_rows)}
        kept = [(j, where[r]) for j, r in enumerate(rows) if r in where]
        return SchedulerOutput(
            [self.seqs[r] for r in rows],
            sum(self.num_tokens[r] for r in rows if self.num_tokens[r] > 1 or not self.seqs[r].output_ids),
            self.num_kv_blocks,
            [self.num_tokens[r] for r in rows],
            None if self.banned is None else [self.banned[r] for r in rows],
            self.bitmask[[i for _, i in kept]] if self.bitmask is not None and kept else None,
            [j for j, _ in kept] if self.bitmask is not None and kept else [],
        )


class Scheduler:
    """Waiting requests queue by client (see the module doc); running ones decode one token per step. Each
    step first gives every running sequence room for its next token, preempting when the pool is out of
    blocks, then spends the step's token budget (`max_num_batched_tokens`) on the decodes (one token each),
    then on prompts: new admissions and the next chunks of prompts admitted earlier, split fairly, each
    token counted with its attention (`StepCost`). A prompt longer than its part is computed in chunks over
    the next steps (chunked prefill). An admitted sequence holds blocks for all its tokens from its
    admission on.

    The pool starts empty and grows on demand (at least doubling) up to `max_num_blocks`."""

    def __init__(
        self,
        *,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_num_blocks: int,
        enable_prefix_caching: bool = True,
        cost: StepCost | None = None,
    ) -> None:
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError(
                f"Scheduler: max_num_seqs and max_num_batched_tokens must be >= 1, "
                f"got {max_num_seqs}, {max_num_batched_tokens}"
            )
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.max_num_blocks = max_num_blocks
        self.cost = cost or StepCost()  # what a token costs the step's budget (default: one each)
        self.block_manager = BlockManager(0, block_size, enable_prefix_caching=enable_prefix_caching)
        self.waiting: deque[Sequence] = deque()
        self._waiting_by: Counter[str | None] = Counter()  # waiting sequences per client (none: no key)
        self.running: list[Sequence] = []  # admission order: the last one of a client is preempted first
        self.num_preemptions = 0
        self.num_prompt_tokens = 0  # prompts admitted (each counted once, at its first admission)
        self.prefix_cache_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_cache_hits = 0  # of those, tokens served from it

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)
        self._waiting_by[seq.client] += 1

    def _unqueue(self, seq: Sequence) -> None:
        self.waiting.remove(seq)
        self._waiting_by[seq.client] -= 1
        if not self._waiting_by[seq.client]:
            del self._waiting_by[seq.client]

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence) -> None:
        """Take a finished or aborted sequence out of whichever queue holds it and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self._unqueue(seq)
        self.block_manager.release(seq)

    def commit(self, seq: Sequence, num_tokens: int | None = None) -> None:
        """After the forward pass: the step's `num_tokens` of `seq` (default: all) have their K/V in the
        cache; its newly full blocks join the prefix cache."""
        if num_tokens is None:
            seq.num_computed_tokens = len(seq.token_ids)
        else:
            seq.num_computed_tokens = min(seq.num_computed_tokens + num_tokens, len(seq.token_ids))
        self.block_manager.commit(seq)

    def reserve(self, seqs: list[Sequence]) -> None:
        """Size the pool once for the first wave of `seqs` (capped by max_num_blocks) instead of growing it
        step by step (LLM.generate knows all its requests up front)."""
        bm = self.block_manager
        need = sum(bm.blocks_for(s.max_len) for s in seqs[: self.max_num_seqs])
        want = min(max(need, max(bm.blocks_for(s.max_len) for s in seqs)), self.max_num_blocks)
        if want > bm.num_blocks:
            bm.grow(want)

    def schedule(self) -> SchedulerOutput:
        """The sequences of the next step and how many tokens each computes (`num_tokens`)."""
        bm = self.block_manager
        ready, short = self._make_room()
        decodes = [s for s in ready if s.num_new_tokens == 1][: self.max_num_batched_tokens]
        prompts = [s for s in ready if s.num_new_tokens > 1]
        self._admit_waiting(decodes, prompts, short)
        # decodes are charged their cost, at most max_num_seqs (one each without the attention term): what is
        # left for prompts never falls below the B - S of the fairness bound
        decoding = math.ceil(sum(self.cost.chunk(s.num_computed_tokens, 1) for s in decodes))
        budget = max(0, self.max_num_batched_tokens - min(decoding, self.max_num_seqs))
        counts = [1] * len(decodes) + self._split(prompts, budget)
        picked = [(s, n) for s, n in zip(decodes + prompts, counts, strict=True) if n]
        if not picked and self.waiting:
            raise RuntimeError(
                f"the KV cache ({bm.num_blocks} blocks) cannot fit the next request "
                f"({bm.blocks_for(len(self.waiting[0].token_ids))} blocks)"
            )
        batch, counts = [s for s, _ in picked], [n for _, n in picked]
        prompt = sum(n for s, n in picked if n > 1 or not s.output_ids)
        return SchedulerOutput(batch, prompt, bm.num_blocks, counts)

    def _make_room(self) -> tuple[list[Sequence], bool]:
        """Room for every running sequence's next tokens; when the pool is full, the most recently admitted
        sequence of the client holding the most blocks is preempted. The ones with room, and whether any
        sequence was preempted."""
        bm = self.block_manager
        ready: list[Sequence] = []
        short = False
        for seq in list(self.running):
            if not seq.block_table:  # preempted above
                continue
            while not bm.append_slot(seq):
                if self._grow(1):
                    continue
                victim = self._victim(self._blocks_by_client().__getitem__)
                assert victim is not None  # (seq itself is running)
                self._preempt(victim)
                short = True
                if victim is seq:
                    break
                if victim in ready:
                    ready.remove(victim)
            else:
                ready.append(seq)
        return ready, short

    def _admit_waiting(self, decodes: list[Sequence], prompts: list[Sequence], short: bool) -> None:
        """Admit waiting sequences, the client with the fewest running first, while slots, blocks and the
        budget (a token for each prompt) allow; preempt over-served clients for under-served ones. After a
        preemption for blocks (`short`), only an under-served client's: any other admission would take the
        blocks the running ones need."""
        twins = {(s.client, s.prompt_key): s for s in self.running if self._computes_shared_blocks(s)}
        queue = _ByClient(self.waiting, self._waiting_by)
        held = Counter(s.client for s in self.running)
        while queue.left and len(prompts) < self.max_num_batched_tokens - len(decodes):
            client = min(queue.left, key=held.__getitem__)  # (ties: the client that has waited longest)
            if short and held[client] + 1 >= max(held.values(), default=0):
                break
            seq = queue.pop(client)
            twin = twins.get((client, seq.prompt_key))
            if twin is not None and not seq.output_ids and twin.prompt_token_ids == seq.prompt_token_ids:
                seq.leader = twin  # computed once: this one waits for the twin's prefill
                continue
            if len(self.running) >= self.max_num_seqs:
                victim = self._victim(held.__getitem__, held[client] + 1)
                if victim is None:
                    break
                self._evict(victim, held, decodes, prompts)
            hit = self._lookup(seq)
            while not self._admit(seq, hit, len(seq.token_ids) - hit.num_tokens):
                blocks = self._blocks_by_client()
                need = self.block_manager.blocks_to_admit(seq, hit)
                victim = self._victim(blocks.__getitem__, blocks[client] + need)
                if victim is None:
                    return
                self._evict(victim, held, decodes, prompts)
            self._unqueue(seq)
            self.running.append(seq)
            held[client] += 1
            prompts.append(seq)
            if self._computes_shared_blocks(seq):
                twins[(client, seq.prompt_key)] = seq

    def _computes_shared_blocks(self, seq: Sequence) -> bool:
        """`seq` is still computing full blocks of its prompt, which a twin would take from the prefix cache."""
        bm = self.block_manager
        return (
            bm.enable_prefix_caching and seq.num_computed_tokens < (seq.num_prompt - 1) // bm.block_size * bm.block_size
        )

    def _lookup(self, seq: Sequence) -> PrefixHit:
        """The prefix-cache hit `seq` is admitted with (looked up once per admission). A sequence that needs
        its prompt's logprobs takes no hit unless its twin computed the same logprobs."""
        hit = self.block_manager.cached_prefix(seq.token_ids)
        twin, seq.leader = seq.leader, None
        if seq.wants_prompt_logprobs and hit.num_tokens:
            done = twin.prompt_logprobs if twin is not None else None
            if done is not None and twin is not None and twin.params.prompt_logprobs == seq.params.prompt_logprobs:
                seq.prompt_logprobs = list(done)
            else:
                hit = PrefixHit([], [], 0)
        return hit

    def _split(self, prompts: list[Sequence], budget: int) -> list[int]:
        """Prompt tokens of each of `prompts` this step: `budget` token-equivalents max-min fair across
        clients, then each client's part to its prompts shortest first, as many tokens as the part pays for.
        A client's shortest prompt gets one token even when its part cannot pay for it (progress)."""
        cost = self.cost
        groups: dict[str | None, list[int]] = {}
        for k, seq in enumerate(prompts):
            groups.setdefault(seq.client, []).append(k)
        counts = [0] * len(prompts)
        needs = [
            math.ceil(sum(cost.chunk(prompts[k].num_computed_tokens, prompts[k].num_new_tokens) for k in ks))
            for ks in groups.values()
        ]
        for ks, grant in zip(groups.values(), water_fill(needs, budget), strict=True):
            left = float(grant)
            for i, k in enumerate(sorted(ks, key=lambda k: prompts[k].num_new_tokens)):
                seq = prompts[k]
                counts[k] = max(cost.fit(seq.num_computed_tokens, seq.num_new_tokens, left), int(i == 0))
                left -= cost.chunk(seq.num_computed_tokens, counts[k])
        return counts

    def _victim(self, usage: Callable[[str | None], int], above: int = -1) -> Sequence | None:
        """The most recently admitted sequence of the client with the highest `usage` (ties: the client
        admitted last), when that usage is above `above`."""
        best: Sequence | None = None
        most = above
        for seq in reversed(self.running):
            if usage(seq.client) > most:
                best, most = seq, usage(seq.client)
        return best

    def _blocks_by_client(self) -> Counter[str | None]:
        blocks: Counter[str | None] = Counter()
        for seq in self.running:
            blocks[seq.client] += len(seq.block_table)
        return blocks

    def _evict(self, victim: Sequence, held: Counter[str | None], *batches: list[Sequence]) -> None:
        """Preempt `victim` for a fairer admission, and take it out of this step's work."""
        self._preempt(victim)
        held[victim.client] -= 1
        for batch in batches:
            if victim in batch:
                batch.remove(victim)

    def _grow(self, want: int) -> bool:
        """Grow the pool by at least `want` blocks (at least doubling it, capped by max_num_blocks); False
        when it is already full size."""
        have = self.block_manager.num_blocks
        if have >= self.max_num_blocks:
            return False
        self.block_manager.grow(min(self.max_num_blocks, max(2 * have, have + want)))
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.release(seq)
        self.waiting.appendleft(seq)
        self._waiting_by[seq.client] += 1
        self.num_preemptions += 1

    def _admit(self, seq: Sequence, hit: PrefixHit, new_tokens: int) -> bool:
        """Allocate `seq`'s blocks with its prefix hit (looked up once, growing the pool if it is short)."""
        bm = self.block_manager
        if not bm.allocate_sequence(seq, hit) and not (
            self._grow(bm.blocks_for(new_tokens)) and bm.allocate_sequence(seq, hit)
        ):
            return False
        if seq.num_cached_tokens < 0:  # first admission (not a preempted one's return): count the prompt
            seq.num_cached_tokens = seq.num_computed_tokens
            self.num_prompt_tokens += seq.num_prompt
            self.prefix_cache_queries += seq.num_prompt
            self.prefix_cache_hits += seq.num_cached_tokens
        return True


class _ByClient:
    """One step's view of the waiting queue by client, read from the left only as far as admission gets (a
    step that admits a few sequences of one client does not walk thousands of waiting ones)."""

    def __init__(self, waiting: deque[Sequence], counts: Counter[str | None]) -> None:
        self.pending, self.at = list(waiting), 0
        self.left = Counter(counts)  # sequences of each client not popped yet (clients with none: no key)
        self.queues: dict[str | None, deque[Sequence]] = {}

    def pop(self, client: str | None) -> Sequence:
        """The next waiting sequence of `client` (which has one left)."""
        queue = self.queues.setdefault(client, deque())
        while not queue:
            seq = self.pending[self.at]
            self.at += 1
            self.queues.setdefault(seq.client, deque()).append(seq)
        self.left[client] -= 1
        if not self.left[client]:
            del self.left[client]
        return queue.popleft()


def water_fill(demands: list[int], total: int) -> list[int]:
    """Max-min fair parts of `total`: in ascending order of demand, each takes what it needs up to an equal
    part of what is left, so what one does not need goes to the others."""
    grants = [0] * len(demands)
    order = sorted(range(len(demands)), key=demands.__getitem__)
    for i, k in enumerate(order):
        grants[k] = min(demands[k], total // (len(order) - i))
        total -= grants[k]
    return grants
