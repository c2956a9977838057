"""The same answer whatever the batch and the cache. A request's logits are the same bits at
every generated position whether its prompt is computed in one call or with a cached prefix (few rows in the
call: the kernels' decode path; many: their prompt path), alone or batched with prompts of other lengths.

The report (an AMX Xeon, greedy, "List three primary colors."): the answer changed on the repeat, once the
prompt was in the prefix cache. Here the real SmolLM2-135M-Instruct (skipped where its GGUF is absent) in
fp32 and in bf16 (the engine's default), and a random-weight model of SmolLM2's shapes that runs everywhere.

The logits are taken at the model runner's forward (row i of its output is sequence i's last token); a
sequence is known by its prompt's token ids.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from keel_dev.checkpoints import write_random_llama
from support.smollm2 import needs_smollm2

from keel.engine import LLM, SamplingParams

NEW_TOKENS = 24
QUESTION = [{"role": "user", "content": "List three primary colors."}]
SYSTEM = (
    "You are a helpful assistant who answers questions about art, colour and paint in plain and simple words for a "
    "child of seven. Keep your answers short and kind."
)
# the batch: the question among prompts of other lengths (the shortest and longest 3 and 60 words)
OTHERS = [
    "Hi.",
    "What is the capital of France?",
    "Write a haiku about the sea and the wind over the harbour at night.",
    "Explain in two sentences why the sky is blue, for a child of seven.",
    "Name a prime number.",
    "Summarise the plot of a story where a fox, a crow and a piece of cheese meet in a forest. " * 3,
    "Translate 'good morning' into French, German and Spanish, then say which is the shortest.",
]


class Recorder:
    """Records each sequence's logits row at every forward of the engine's model runner."""

    def __init__(self) -> None:
        self.rows: dict[tuple[int, ...], list[torch.Tensor]] = {}
        self.computed: dict[tuple[int, ...], list[int]] = {}  # tokens computed per forward (prefill: uncached)

    def take(self, prompt: list[int]) -> tuple[list[torch.Tensor], list[int]]:
        key = tuple(prompt)
        return self.rows.pop(key), self.computed.pop(key)


@contextmanager
def recording(llm: LLM) -> Iterator[Recorder]:
    runner = llm.llm_engine.runner
    forward = runner.forward
    rec = Recorder()

    def wrapped(batch, *args, **kwargs):
        todo = [(tuple(s.prompt_token_ids), len(s.token_ids) - s.num_computed_tokens) for s in batch.seqs]
        logits = forward(batch, *args, **kwargs)
        for i, (key, n) in enumerate(todo):
            rec.rows.setdefault(key, []).append(logits[i].clone())
            rec.computed.setdefault(key, []).append(n)
        return logits

    runner.forward = wrapped
    try:
        yield rec
    finally:
        del runner.forward  # the class's method again


def assert_same_logits(got: list[torch.Tensor], want: list[torch.Tensor], what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} forwards against {len(want)}"
    for step, (a, b) in enumerate(zip(got, want, strict=True)):
        ia = a.view(torch.int32 if a.dtype == torch.float32 else torch.int16)
        ib = b.view(torch.int32 if b.dtype == torch.float32 else torch.int16)
        if not torch.equal(ia, ib):
            diff = int((ia != ib).sum())
            worst = float((a.double() - b.double()).abs().max())
            raise AssertionError(
                f"{what}: logits of generated position {step} differ in {diff} of {a.numel()} entries "
                f"(max |diff| {worst:.3g}); argmax {int(a.argmax())} vs {int(b.argmax())}"
            )


def greedy(max_tokens: int = NEW_TOKENS) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def check_prefix_cache_repeat(llm: LLM, prompt: list[int], other: list[int]) -> None:
    """The prompt, then again from the prefix cache alone, then again from the cache behind `other` (a new
    prompt of 2-3 tokens in the same prefill call, so the recomputed rows fall into other row groups of the
    kernels' passes)."""
    with recording(llm) as rec:
        first = llm.generate([prompt], greedy())[0]
        want, computed_first = rec.take(prompt)
        second = llm.generate([prompt], greedy())[0]
        got, computed_second = rec.take(prompt)
        llm.generate([other, prompt], greedy())
        behind, computed_behind = rec.take(prompt)
    # the repeats must really have come from the cache (else the test proves nothing)
    assert computed_first[0] == len(prompt), computed_first
    assert computed_second[0] < len(prompt) and computed_behind[0] == computed_second[0], computed_second
    cached = len(prompt) - computed_second[0]
    assert_same_logits(got, want, f"prefix-cache repeat ({cached} tokens cached)")
    assert_same_logits(behind, want, f"prefix-cache repeat behind a {len(other)}-token prompt ({cached} cached)")
    assert second.token_ids == first.token_ids


def check_alone_vs_batch(folder: Path, dtype: str, prompt: list[int], others: list[list[int]]) -> None:
    # prefix caching off: each generate computes its prompts from scratch, so only the batch differs
    llm = LLM(str(folder), dtype=dtype, device="cpu", progress=False, enable_prefix_caching=False)
    with recording(llm) as rec:
        llm.generate([prompt], greedy())
        want, _ = rec.take(prompt)
        # the question third of 8, the others finishing at other steps (decode batches shrink as they end)
        batch = [*others[:2], prompt, *others[2:]]
        params = [greedy(NEW_TOKENS - 2 * i if i % 2 else NEW_TOKENS) for i in range(len(batch))]
        llm.generate(batch, params)
        got, computed = rec.take(prompt)
    assert computed[0] == len(prompt)
    assert_same_logits(got, want, "alone vs in a batch of 8 prompts of other lengths")


# ---- the real SmolLM2-135M-Instruct -------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def smol(request, smollm2_fp32):
    return request.param, LLM(str(smollm2_fp32), dtype=request.param, device="cpu", progress=False)


@pytest.mark.slow  # the real 135M model (docs/testing.md)
@needs_smollm2
def test_smollm2_prefix_cache_repeat_gives_the_same_logits(smol):
    _, llm = smol
    tok = llm.tokenizer
    prompt = tok.encode_chat(QUESTION)  # the report's prompt
    check_prefix_cache_repeat(llm, prompt, tok.encode("Say hello."))  # 3 tokens
    # 35 tokens: 32 cached and 3 computed again, which the first call also computed in a 3-row pass (its second
    # 32-row block); with this system turn, 51 tokens: 48 cached, and the 3 computed again shared a 19-row pass
    # the first time
    longer = llm.tokenizer.encode_chat([{"role": "system", "content": SYSTEM}, *QUESTION])
    assert len(longer) % 32 in (17, 18, 19), len(longer)
    check_prefix_cache_repeat(llm, longer, tok.encode("Hello there"))  # 2 tokens


@pytest.mark.slow  # the real 135M model (docs/testing.md)
@needs_smollm2
def test_smollm2_alone_and_batched_give_the_same_logits(smol, smollm2_fp32):
    dtype, llm = smol
    tok = llm.tokenizer
    others = [tok.encode_chat([{"role": "user", "content": text}]) for text in OTHERS]
    check_alone_vs_batch(smollm2_fp32, dtype, tok.encode_chat(QUESTION), others)


# ---- a random-weight model of SmolLM2's shapes (4 layers): runs without the GGUF ------------------------------


@pytest.fixture(scope="module")
def random_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from safetensors.torch import load_file, save_file

    folder = write_random_llama(tmp_path_factory.mktemp("det_random"), seed=1, num_hidden_layers=4, vocab_size=4096)
    # layers 3x the usual init (std 0.06): each block moves the residual stream about as much as the embedding
    # does, so a layer's last bits reach the logits (at std 0.02 the embedding drowns them)
    weights = load_file(str(folder / "model.safetensors"))
    for name, w in weights.items():
        if name.startswith("model.layers.") and name.endswith("proj.weight"):
            weights[name] = (w.float() * 3).to(w.dtype)
    save_file(weights, str(folder / "model.safetensors"))
    return folder


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(1, 4096, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# bf16 outputs hide most last-bit differences of a sum (one in thousands of outputs shows), so bf16 runs only the
# length whose old row-count dependence showed in the logits here; fp32 shows every one
@pytest.mark.parametrize("dtype, length", [("float32", 19), ("float32", 34), ("float32", 50), ("bfloat16", 50)])
def test_random_model_prefix_cache_repeat_gives_the_same_logits(random_model, dtype, length):
    # 16, 32, 48 tokens cached; 3, 2, 2 computed again, which the first call computed in passes (32-row
    # blocks) of 19, 2 and 18 rows, and the third call behind a 3-token prompt
    llm = LLM(str(random_model), dtype=dtype, device="cpu", progress=False)
    check_prefix_cache_repeat(llm, _ids(length, length), _ids(3, 100 + length))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_random_model_alone_and_batched_give_the_same_logits(random_model, dtype):
    others = [_ids(n, 10 + n) for n in (3, 9, 70, 18, 1, 44, 25)]
    check_alone_vs_batch(random_model, dtype, _ids(37, 0), others)
