"""`keel generate`: complete one or more prompts, streaming the text of a single prompt to the terminal."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from keel.cli.flags import add_flags, from_flags
from keel.engine.config import EngineConfig

_EXPECTED_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, RuntimeError)


def add_model_args(p: argparse.ArgumentParser) -> None:
    """Options shared by `generate` and `chat`: the engine's (from `EngineConfig`) and how to sample."""
    add_flags(p, EngineConfig, "engine")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=None, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None, help="default: SamplingParams' (off)")
    p.add_argument("--top-p", type=float, default=None, help="default: SamplingParams' (off)")
    p.add_argument("--repetition-penalty", type=float, default=None, help="default: SamplingParams' (off)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def sampling_from_args(args: argparse.Namespace, default_temperature: float) -> Any:
    from keel.engine import SamplingParams

    temperature = default_temperature if args.temperature is None else args.temperature
    given = {k: getattr(args, k) for k in ("top_k", "top_p", "repetition_penalty") if getattr(args, k) is not None}
    return SamplingParams(
        max_tokens=args.max_tokens, temperature=temperature, seed=args.seed, stop=list(args.stop), **given
    )


def load_llm(args: argparse.Namespace) -> Any:
    """Resolve, load and report the model the engine flags name."""
    from keel.engine import LLM

    config = from_flags(EngineConfig, args)
    llm = LLM.from_config(config)
    print(f"keel: {config.model} ({llm.config.architecture}, {llm.dtype}, {llm.device})", file=sys.stderr)
    return llm


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate text from a prompt",
        description="Generate text with a Hugging Face checkpoint (greedy by default).",
    )
    add_model_args(p)
    p.add_argument(
        "--prompt",
        action="append",
        required=True,
        help="prompt text (repeatable: several prompts run as one batch); '-' reads stdin",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--chat",
        dest="chat",
        action="store_true",
        default=None,
        help="wrap each prompt as a user message with the chat template (default when the model has one)",
    )
    mode.add_argument("--raw", dest="chat", action="store_false", help="feed the prompt text as is, no chat template")
    p.add_argument("--no-stream", action="store_true", help="print only when done")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    prompts = [sys.stdin.read() if p == "-" else p for p in args.prompt]
    try:
        params = sampling_from_args(args, default_temperature=0.0)
        llm = load_llm(args)
        stream = len(prompts) == 1 and not args.no_stream
        callback = (lambda _i, delta: (sys.stdout.write(delta), sys.stdout.flush())) if stream else None
        use_chat = args.chat if args.chat is not None else llm.tokenizer.chat_template is not None
        if use_chat:
            outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, stream=callback)
        else:
            outputs = llm.generate(prompts, params, stream=callback)
    except _EXPECTED_ERRORS as exc:
        print(f"keel generate: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nkeel generate: interrupted", file=sys.stderr)
        return 130
    for i, out in enumerate(outputs):
        if stream:
            sys.stdout.write("\n")
        else:
            header = f"--- prompt {i} ---\n" if len(outputs) > 1 else ""
            sys.stdout.write(f"{header}{out.text}\n")
    s = llm.stats
    decode = s.decode_tokens / s.decode_s if s.decode_s else 0.0
    print(
        f"keel: {sum(len(o.token_ids) for o in outputs)} tokens, prefill {s.prefill_tokens} tokens in "
        f"{s.prefill_s:.2f} s, decode {decode:.1f} tokens/s, finish: {outputs[0].finish_reason}",
        file=sys.stderr,
    )
    return 0
