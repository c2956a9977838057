"""The inventory's knowledge, all of it data: the curated table of unstable constructs and their
replacements (data/inventory_rules.json), the stable API with the release that added each name
(data/stable_api.json, generated from torch's headers), and the binary audit's shim table (the
release whose libtorch first exported each C shim function)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from ..errors import TableError

Version = tuple[int, ...]
BASELINE: Version = (2, 9)  # the oldest release with the stable ABI headers


def parse_version(text: str | None) -> Version | None:
    return None if text is None else tuple(int(p) for p in text.split("."))


def fmt(version: Version | None) -> str | None:
    return None if version is None else ".".join(str(p) for p in version)


@dataclass(frozen=True)
class Rule:
    """One unstable construct: what replaces it, from which torch release, and the
    TORCH_TARGET_VERSION the replacement needs (its highest feature guard or shim release)."""

    key: str
    status: str  # "stable", "dispatcher" or "none"
    replacement: str | None
    since: Version | None
    target: Version | None
    fix: str | tuple[str, ...] | None
    hint: str | None
    dispatch_v2: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Api:
    """One stable name: the first release whose headers have it, and the TORCH_TARGET_VERSION a
    use of it needs (None: header-only code, any target)."""

    since: Version
    target: Version | None


def _load(name: str) -> Any:
    try:
        return json.loads(resources.files("keel_audit.data").joinpath(name).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TableError(f"keel_audit/data/{name}: {exc}") from exc


class Knowledge:
    """Lookups over the three tables."""

    def __init__(self, rules: dict[str, Any], stable: dict[str, Any], shim: dict[str, Any]) -> None:
        self.raw = rules
        self.stable_doc = stable
        self.api: dict[str, Api] = {}
        for kind in ("headers", "macros", "names", "shim"):
            for name, entry in stable[kind].items():
                if "removed" in entry:
                    continue
                guard = parse_version(entry.get("guard"))
                self.api[name] = Api(parse_version(entry["since"]) or BASELINE, guard)
        for name, entry in shim["symbols"].items():  # the release that exported it is what loading needs
            since = parse_version(entry["since"]) or BASELINE
            self.api[name] = Api(min(self.api[name].since, since) if name in self.api else since, since)
        self.header_only = frozenset(shim.get("header_only", ())) | {
            n for n in stable["names"] if not n.startswith(("torch::stable::", "torch::headeronly::"))
        }
        self.tensor_members = frozenset(
            n.rsplit("::", 1)[1] for n in stable["names"] if n.startswith("torch::stable::Tensor::")
        )
        inc = rules["includes"]
        self.allowed_includes: tuple[str, ...] = tuple(inc["allowed"])
        self.unstable_includes: tuple[str, ...] = tuple(inc["unstable"])
        self.include_rules = {k: self._rule(f"#include <{k}>", v) for k, v in inc["exact"].items()}
        self.include_fallback = self._rule("#include", inc["fallback"])
        self.names = {k: self._rule(k, v) for k, v in rules["names"].items()}
        self.macros = {k: self._rule(k, v) for k, v in rules["macros"].items() if not k.endswith("*")}
        self.macro_prefixes = {k[:-1]: self._rule(k, v) for k, v in rules["macros"].items() if k.endswith("*")}
        self.methods = {k: self._rule(f".{k}", v) for k, v in rules["methods"].items()}
        self.third_party = frozenset(rules["third_party"]["folders"])
        self.third_party_libraries = frozenset(rules["third_party"]["libraries"])
        self.suffixes = frozenset(rules["suffixes"])
        self.factories = frozenset(rules["tensor_factories"])

    def _rule(self, key: str, entry: dict[str, Any]) -> Rule:
        needs = entry.get("needs", [])
        targets = [t for n in needs if n in self.api and (t := self.api[n].target) is not None]
        fix = entry.get("fix")
        return Rule(
            key=key,
            status=entry["status"],
            replacement=", ".join(entry["replacement"])
            if isinstance(entry["replacement"], list)
            else entry["replacement"],
            since=parse_version(entry.get("since")),
            target=max(targets) if targets else None,
            fix=tuple(fix) if isinstance(fix, list) else fix,
            hint=entry.get("hint"),
            dispatch_v2=tuple(entry["dispatch_v2"]) if "dispatch_v2" in entry else None,
        )

    def name_rule(self, name: str) -> tuple[Rule, str] | None:
        """The rule for a qualified unstable name and the prefix of the name it replaces: the
        longest exact entry at a `::` boundary, else the innermost namespace entry (`at::cuda::`)."""
        parts = name.split("::")
        for n in range(len(parts), 0, -1):
            prefix = "::".join(parts[:n])
            if prefix in self.names:
                return self.names[prefix], prefix
        for n in range(len(parts) - 1, 0, -1):
            ns = "::".join(parts[:n]) + "::"
            typed = ns + "(type)"  # a type or enum of that namespace: no op to call through the dispatcher
            if parts[n][:1].isupper() and typed in self.names:
                return self.names[typed], name
            if ns in self.names:
                return self.names[ns], name
        return None

    def stable_api(self, name: str) -> Api | None:
        """The stable entry for a qualified name, a macro or a shim function (the longest known
        prefix of a qualified name: `torch::headeronly::ScalarType::Float` is ScalarType's)."""
        if name in self.api:
            return self.api[name]
        parts = name.split("::")
        for n in range(len(parts) - 1, 1, -1):
            prefix = "::".join(parts[:n])
            if prefix in self.api:
                return self.api[prefix]
        return None

    def is_header_only(self, name: str) -> bool:
        parts = name.split("::")
        return any("::".join(parts[:n]) in self.header_only for n in range(len(parts), 1, -1))

    def include_rule(self, header: str) -> Rule | None:
        """The rule for an `#include` of a torch header, None for a stable or a non-torch one."""
        if header.startswith(self.allowed_includes):
            return None
        if header in self.include_rules:
            return self.include_rules[header]
        return self.include_fallback if header.startswith(self.unstable_includes) else None


@cache
def knowledge() -> Knowledge:
    """The shipped tables, read once."""
    return Knowledge(_load("inventory_rules.json"), _load("stable_api.json"), _load("torch_shim_symbols.json"))
