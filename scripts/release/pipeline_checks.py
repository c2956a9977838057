"""What scripts/release/pipeline.py holds each row to, and its table: per-library op-test counts, the probe's op
checks, and the probe's logits and greedy tokens against torch A's (standard library, and keel_dev's pure
Python parity rule, imported when a row is compared, so that `pipeline.py --help` needs nothing)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

# The op tests run in every environment (the checkout's, against the installed wheel), and the library each
# test module belongs to: the first matching junit classname prefix wins.
OP_TESTS = ["tests/ops", "tests/test_native.py", "tests/test_wheel_libraries.py", "tests/vendored"]
LIBRARIES = {
    "tests.vendored.deep_gemm.": "deep_gemm",
    "tests.vendored.flash_attn.": "flash_attn",
    "tests.vendored.": "vendored loader",  # loading and schema conformance of both vendored libraries
    "": "keel",
}
COLUMNS = ["keel", "deep_gemm", "flash_attn", "vendored loader"]  # the table's order
# torch B's probe against torch A's, on A's greedy path (B's logits teacher-forced on A's tokens). The same
# keel bytes are expected to give the same logits bit for bit (measured: 0 on every release run); a row fails
# beyond LOGIT_ATOL (two bf16 spacings for logits in [16, 32)). Tokens must be equal up to A's first top-2
# margin below TIE = 2 * LOGIT_ATOL: before it no difference within the bound can change the argmax.
LOGIT_ATOL = 0.25
TIE = 2 * LOGIT_ATOL


@dataclass
class Row:
    """One (torch B, Python) environment and what it showed."""

    torch_a: str
    torch_b: str
    python: str
    env: str
    status: str = "ok"  # ok | failed | not installable | refused import
    detail: str = ""
    libraries_same: bool | None = None
    libraries: str = "-"
    op_tests: str = "-"
    op_tests_ok: bool | None = None
    test_counts: dict[str, list[int]] = field(default_factory=dict)  # library -> [passed, failed, skipped]
    probe_ops: str = "-"
    probe_ops_ok: bool | None = None
    tok_s: float | None = None
    ttft_ms: float | None = None
    token_ids: list[int] = field(default_factory=list)
    logits: str = "-"
    logits_ok: bool | None = None
    tokens: str = "-"
    tokens_same: bool | None = None
    # `keel-audit preflight` of the wheel against torch B's .whl before it was installed: library -> loads
    predicted: dict[str, bool] = field(default_factory=dict)
    preflight: str = "-"
    preflight_ok: bool | None = None  # None: the preflight could not run (the row says why)

    @property
    def ok(self) -> bool:
        checks = (self.libraries_same, self.op_tests_ok, self.probe_ops_ok, self.logits_ok, self.tokens_same)
        return self.status == "ok" and all(checks) and self.preflight_ok is not False


def check_preflight(row: Row, built: list[str], mapped: list[str]) -> None:
    """The preflight's prediction against what the probe process mapped: a library predicted to load
    must be mapped, one predicted not to load must not be. On a CPU-only torch keel never tries its
    CUDA twins, so a twin predicted not to load and not mapped agrees; one predicted to load there is
    a disagreement too (the preflight would have promised a load keel cannot do)."""
    if not row.predicted:
        return
    wrong = []
    for rel in built:
        loads = row.predicted.get(rel)
        if loads is None:
            wrong.append(f"{rel}: not predicted")
        elif loads != (rel in mapped):
            wrong.append(
                f"{rel}: predicted {'loads' if loads else 'does not load'}, {'' if rel in mapped else 'not '}mapped"
            )
    n = sum(row.predicted.get(rel, False) for rel in built)
    row.preflight_ok = not wrong
    row.preflight = f"{'yes' if not wrong else 'no'} ({n}/{len(built)} predicted to load" + (
        f"; {'; '.join(wrong)})" if wrong else ")"
    )


def count_tests(junit: Path) -> dict[str, list[int]]:
    """[passed, failed, skipped] per library of LIBRARIES from a pytest junit XML file (errors count as failed)."""
    counts = {lib: [0, 0, 0] for lib in COLUMNS}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("classname", "")
        lib = next(lib for prefix, lib in LIBRARIES.items() if name.startswith(prefix))
        tags = {child.tag for child in case}
        counts[lib][1 if tags & {"failure", "error"} else 2 if "skipped" in tags else 0] += 1
    return counts


def counts_text(c: list[int]) -> str:
    return f"{c[0]} / {c[1]} / {c[2]}"


def check_probe_ops(row: Row, op_checks: list[dict]) -> None:
    """The probe's op-by-op results (scripts/release/demo_ops.py: relative error against plain torch, per bound)."""
    bad = [f"{c['op']} {c['device']} {c['dtype']}: {c['rel']:.1e} > {c['bound']:.0e}" for c in op_checks if not c["ok"]]
    row.probe_ops_ok = bool(op_checks) and not bad
    row.probe_ops = f"{len(op_checks) - len(bad)}/{len(op_checks)} within bounds" + (
        f"; EXCEEDED: {'; '.join(bad)}" if bad else ""
    )


def compare_to_reference(row: Row, result: dict, reference: dict | None) -> None:
    """B's logits (on A's tokens) and greedy tokens against A's probe; A itself is its own reference."""
    if reference is None:
        row.logits_ok, row.tokens_same = True, bool(result["token_ids"])
        row.logits, row.tokens = "(reference)", f"(reference: {len(result['token_ids'])} tokens)"
        return
    diff = result.get("reference") or {}
    if "max_abs" not in diff:
        row.logits_ok, row.logits = False, "NOT compared: the probe did not read A's logits"
    else:
        row.logits_ok = diff["max_abs"] <= LOGIT_ATOL
        row.logits = f"max {diff['max_abs']:.3g}, mean {diff['mean_abs']:.3g} over {diff['positions']} positions" + (
            "" if row.logits_ok else f" > {LOGIT_ATOL}"
        )
    from keel_dev.parity import compare_greedy  # the rule the test suite uses (pure Python)

    parity = compare_greedy(row.token_ids, reference["token_ids"], reference["margins"], TIE)
    row.tokens_same = parity.ok
    equal = parity.length if parity.first_diff is None else parity.first_diff
    if parity.near_tie is None:
        must = f"all (A has no margin below {TIE})"
    else:
        must = f"those before A's first margin < {TIE}: token {parity.near_tie} ({parity.near_tie_margin:.3g})"
    row.tokens = f"{'yes' if parity.ok else 'NO'}: {equal}/{len(reference['token_ids'])} equal; must be equal: {must}"


def table(rows: list[Row], verdict: str, floor: str) -> str:
    libs = COLUMNS
    head = (
        "| torch A | torch B | Python | keel libraries mapped = built | preflight predicted = observed | audit | "
        + " | ".join(f"{lib} tests p / f / s" for lib in libs)
        + " | probe op checks | probe logits vs A | greedy tokens vs A | decode tok/s | TTFT ms |\n"
        + "|---|---|---|---|---|---|"
        + "---:|" * len(libs)
        + "---|---|---|---:|---:|"
    )
    lines = [head]
    for r in rows:
        counts = " | ".join(counts_text(r.test_counts[lib]) if lib in r.test_counts else "-" for lib in libs)
        if r.status in ("ok", "failed") and r.libraries_same is not None:
            lines.append(
                f"| {r.torch_a} | {r.torch_b} | {r.python} | {r.libraries} | {r.preflight} | {verdict}, torch>={floor} "
                f"| {counts} "
                f"| {r.probe_ops} | {r.logits} | {r.tokens} | {r.tok_s:.1f} | {r.ttft_ms:.0f} |"
            )
        else:
            what = r.detail.splitlines()[0][:160] if r.detail else r.status
            lines.append(
                f"| {r.torch_a} | {r.torch_b} | {r.python} | {r.status}: {what} | {r.preflight} "
                f"| {verdict}, torch>={floor} "
                f"| {counts} | - | - | - | - | - |"
            )
    return "\n".join(lines)
