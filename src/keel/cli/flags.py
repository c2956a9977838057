"""Command-line flags generated from a config dataclass's fields (`EngineConfig`, `ServerConfig`): each
field written with `keel.engine.config.setting` becomes one option with the field's name as its `dest`,
the field's default (or its `env` variable's value), the field's help, choices and type; `from_flags`
builds the dataclass back from the parsed namespace, so the dataclass validates what the user typed."""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from typing import Any, TypeVar

from keel.engine.config import flag_name

T = TypeVar("T")


def add_flags(parser: argparse.ArgumentParser, cls: type, title: str) -> None:
    """One option per field of `cls`, in an argument group named `title`."""
    group = parser.add_argument_group(title)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if "help" not in f.metadata:
            raise TypeError(f"{cls.__name__}.{f.name} has no help text; write it with setting(...)")
        meta, flag, default = f.metadata, flag_name(f), f.default
        if "env" in meta:
            default = os.environ.get(meta["env"], default)
        if isinstance(default, bool):
            action, help_text = (
                ("store_false", f"turn off: {meta['help']}") if default else ("store_true", meta["help"])
            )
            group.add_argument(flag, dest=f.name, action=action, default=default, help=help_text)
            continue
        kind, shown, metavar = _scalar(hints[f.name]), default, flag.removeprefix("--").replace("-", "_").upper()
        if "unit" in meta:
            unit, size = meta["unit"]
            kind, shown, metavar = _in_units(unit, size), f"{default / size:g} {unit}", unit
        help_text = meta["help"] if default is None or "env" in meta else f"{meta['help']} (default: {shown})"
        choices = meta.get("choices")
        group.add_argument(
            flag,
            dest=f.name,
            type=kind,
            default=default,
            choices=choices,
            metavar=None if choices else metavar,
            help=help_text,
        )


def from_flags(cls: type[T], args: argparse.Namespace) -> T:
    """An instance of `cls` from the options `add_flags` made (its validation runs here)."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})  # type: ignore[arg-type]


def _scalar(hint: Any) -> type:
    """The type a flag parses for a field typed `hint`: its int, float or str (`int | None` -> int)."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for kind in (int, float, str):
        if kind in options:
            return kind
    raise TypeError(f"no command-line type for a field typed {hint}")


def _in_units(unit: str, size: int) -> Any:
    """A parser of a float in `unit` to an int count of bytes (or whatever `size` counts)."""

    def parse(text: str) -> int:
        return int(float(text) * size)

    parse.__name__ = unit  # argparse's "invalid GiB value: 'x'"
    return parse
