"""Attention's cost against the projections' in a prefill step: the measured break-even context K of the
scheduler's step budget (keel.engine.scheduler.StepCost; keel.engine.model_runner.CPU_ATTENTION_SPEED).

    python benchmarks/step_cost.py --model PATH [--prompt-tokens 8000] [--threads N]

One engine (the model's default dtype, prefix caching off), its scheduler's cost model off (tokens only), computes
two long prompts in chunks of 256 and then 96 tokens; each prefill step's time t, chunk length n and start
position p are fitted to t = a n + b n (p + n / 2) (least squares over every full chunk): a is a token's
projections (and the step's fixed cost, spread), b its attention per earlier position, a / b the measured K.
Printed: a, b, the measured K, the K the engine computes from the config (FLOPs alone and with the CPU factor),
and the fitted step time of a 256-token chunk at positions 0 and 7,744. One process, one run: the machine is
shared, read the ratio.

Record: docs/measurements/2026-12-07-hostile-probe.md.
"""

from __future__ import annotations

import argparse
import time

import torch

from keel.engine import LLMEngine, SamplingParams
from keel.engine.model_runner import step_cost
from keel.engine.scheduler import StepCost


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="checkpoint folder, GGUF or keel/ id")
    ap.add_argument("--prompt-tokens", type=int, default=8000)
    ap.add_argument("--threads", type=int, default=None, help="torch's thread count (default: torch's)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    eng = LLMEngine(args.model, progress=False, enable_prefix_caching=False)
    eng.scheduler.cost = StepCost()  # tokens only: every chunk is the whole budget
    rows: list[tuple[int, int, float]] = []
    for j, budget in enumerate((256, 96)):
        eng.scheduler.max_num_batched_tokens = budget
        ids = eng.tokenizer.encode("78"[j] * args.prompt_tokens)[: args.prompt_tokens]
        eng.add_request(f"r{j}", ids, SamplingParams(max_tokens=1))
        while eng.has_unfinished_requests():
            running = eng.scheduler.running
            start = running[0].num_computed_tokens if running else 0
            t = time.perf_counter()
            eng.step()
            took = time.perf_counter() - t
            if eng.scheduler.running and running[0].num_computed_tokens - start == budget:
                rows.append((budget, start, took))
    x = torch.tensor([[n, n * (p + n / 2)] for n, p, _ in rows], dtype=torch.float64)
    y = torch.tensor([t for *_, t in rows], dtype=torch.float64)
    a, b = torch.linalg.lstsq(x, y.unsqueeze(1)).solution.squeeze(1).tolist()
    flops = step_cost(eng.config, "cuda").break_even
    print(f"steps fitted: {len(rows)} (chunks of 256 and 96 tokens, prompts of {args.prompt_tokens})")
    print(f"a = {a * 1e3:.3f} ms per token, b = {b * 1e6:.3f} us per token per earlier position")
    print(
        f"measured K = a / b = {a / b:.0f} positions; the engine's K: {step_cost(eng.config).break_even:.0f} "
        f"on a CPU, {flops:.0f} from FLOPs alone (attention's measured relative speed {a / b / flops:.2f})"
    )
    late = args.prompt_tokens - 256
    print(
        f"a 256-token chunk, fitted: {256 * a:.2f} s at position 0, {256 * a + b * 256 * (late + 128):.2f} s at {late}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
