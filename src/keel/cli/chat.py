"""`keel chat`: an interactive conversation rendered with the model's chat template."""

from __future__ import annotations

import argparse
import sys

from keel.cli.generate import _EXPECTED_ERRORS, add_model_args, load_llm, sampling_from_args

_HELP = "commands: /reset (forget the conversation), /exit (or Ctrl-D)"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "chat",
        help="chat interactively with a model",
        description="Interactive chat; replies stream as they are generated. " + _HELP,
    )
    add_model_args(p)
    p.add_argument("--system", default=None, help="system prompt")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        params = sampling_from_args(args, default_temperature=0.7)
        llm = load_llm(args)
        if llm.tokenizer.chat_template is None:
            raise ValueError(f"{llm.folder} has no chat template; use `keel generate` instead")
    except _EXPECTED_ERRORS as exc:
        print(f"keel chat: error: {exc}", file=sys.stderr)
        return 1
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(system)
    print(_HELP, file=sys.stderr)
    while True:
        try:
            line = input("> ").strip()
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        if line in ("/exit", "/quit"):
            return 0
        if line == "/reset":
            messages = list(system)
            continue
        if not line:
            continue
        messages.append({"role": "user", "content": line})
        try:
            out = llm.chat(messages, params, stream=lambda _i, d: (sys.stdout.write(d), sys.stdout.flush()))[0]
        except KeyboardInterrupt:
            messages.pop()
            print("\n(interrupted)", file=sys.stderr)
            continue
        except ValueError as exc:  # e.g. the conversation outgrew the context
            messages.pop()
            print(f"keel chat: error: {exc}", file=sys.stderr)
            continue
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": out.text})
