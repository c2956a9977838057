"""keel_dev's timer, port and server helpers (the shared developer package, dev/keel_dev)."""

from __future__ import annotations

import socket

import pytest
from keel_dev import net, timing
from keel_dev.server import start_server


def test_best_times_alternates_the_peers_and_keeps_each_ones_best_mean(monkeypatch):
    # each call advances a fake clock by its cost: the warm-up call (0), then three repeats of two calls
    costs = {"a": iter([0, 1, 1, 3, 3, 2, 2]), "b": iter([0, 5, 5, 1, 2, 4, 4])}  # b disturbed in repeats 1, 3
    now, order = [0.0], []
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])

    def peer(name: str):
        def call() -> None:
            order.append(name)
            now[0] += next(costs[name])

        return call

    best = timing.best_times({"a": peer("a"), "b": peer("b")}, repeats=3, inner=2)
    assert order == ["a", "b"] + ["a", "a", "b", "b"] * 3  # one warm-up call each, then alternating repeats
    assert best == {"a": 1.0, "b": 1.5}  # the best repeat's mean per call (the median would be 2 and 4)


def test_best_times_refuses_empty_repeats():
    with pytest.raises(ValueError, match="repeats and inner must be >= 1"):
        timing.best_times({"a": lambda: None}, repeats=0)


STAT = "cpu  {user} 5 30 {idle} 2 0 3 {steal} 0 0\ncpu0  1 1 1 1 1 1 1 1 0 0\nintr 12345\n"


def test_cpu_times_reads_steal_and_the_total_of_the_cpu_line():
    # user nice system idle iowait irq softirq steal; guest / guest_nice are inside user / nice, not added
    assert timing.cpu_times(STAT.format(user=100, idle=800, steal=60)) == (60, 100 + 5 + 30 + 800 + 2 + 0 + 3 + 60)
    assert timing.cpu_times("cpu0 1 2 3\nintr 1\n") is None  # no machine-wide line


def test_steal_percent_is_the_stolen_share_of_the_time_between_two_readings():
    before = timing.cpu_times(STAT.format(user=100, idle=800, steal=60))
    after = timing.cpu_times(STAT.format(user=160, idle=820, steal=80))  # +60 user, +20 idle, +20 steal
    assert timing.steal_percent(before, after) == pytest.approx(20.0)
    assert timing.steal_percent(before, before) is None  # no time passed
    assert timing.steal_percent(None, after) is None


def test_cpu_times_of_this_machine_only_grow():
    first = timing.cpu_times()
    if first is None:
        pytest.skip("no /proc/stat here")
    sum(range(200_000))
    later = timing.cpu_times()
    assert later is not None and later[0] >= first[0] and later[1] >= first[1]
    assert 0.0 <= (timing.steal_percent(first, later) or 0.0) <= 100.0


def test_free_port_is_free():
    port = net.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # raises if something holds it


def test_a_server_that_exits_is_an_error_with_its_output(tmp_path):
    with pytest.raises(RuntimeError, match=r"keel serve exited with [1-9]") as err:
        start_server(["--model", str(tmp_path / "no-such-model")], timeout_s=120)
    assert "no-such-model" in str(err.value)  # the server's own message is in the error


def test_forked_child_answers_as_python_c_would(tmp_path):
    import os
    import subprocess
    import sys

    from keel_dev.forked import run_python

    code = "import os, sys; print(sys.argv[1:], os.getcwd(), os.environ['KEEL_T']); print('e', file=sys.stderr)"
    env = {**os.environ, "KEEL_CPU_ISA": "base"}
    for value in ("1", "2"):  # as a fresh interpreter: argv, cwd, the environment, both streams
        got = run_python(code, "a", "b", env={**env, "KEEL_T": value}, cwd=tmp_path, timeout=120)
        want = subprocess.run(
            [sys.executable, "-c", code, "a", "b"],
            env={**env, "KEEL_T": value},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr)
    # keel is not imported yet (as in a fresh interpreter): each child reads its own KEEL_* settings, and
    # environments that differ only in them share one parent
    probe = "import os, sys; print('keel' in sys.modules, os.getppid())\n"
    probe += "from keel._native import cpu_isa_status; print(cpu_isa_status().level)"
    answers = [run_python(probe, env={**env, "KEEL_CPU_ISA": level}).stdout.split() for level in ("base", "avx2")]
    assert [a[0] for a in answers] == ["False", "False"] and [a[2] for a in answers] == ["base", "avx2"], answers
    assert answers[0][1] == answers[1][1], "two levels, two parents: every child pays torch's import again"
    assert run_python("import sys; sys.exit(3)", env=env).returncode == 3
    failed = run_python("raise ValueError('boom')", env=env)
    assert failed.returncode == 1 and "ValueError: boom" in failed.stderr
    assert run_python("import os; os.kill(os.getpid(), 9)", env=env).returncode == -9
    with pytest.raises(subprocess.TimeoutExpired):
        run_python("import time; time.sleep(30)", env=env, timeout=0.5)
    assert run_python("print('after')", env=env).stdout == "after\n"  # a killed child leaves the parent working


def test_forked_script_answers_as_python_path_would(tmp_path):
    import subprocess
    import sys

    from keel_dev.forked import run_script

    folder = tmp_path / "scripts"
    folder.mkdir()
    (folder / "helper.py").write_text("NAME = 'helper'\n")
    script = folder / "s.py"
    script.write_text(
        "import os, sys, helper\n"  # the script's folder is first on sys.path
        "print(__name__, os.path.basename(__file__), sys.argv, helper.NAME, sys.path[0] == os.path.dirname(__file__))\n"
        "sys.exit(int(sys.argv[1]))\n"
    )
    for code in ("0", "4"):
        got = run_script(script, code, "x", cwd=tmp_path, timeout=120)
        want = subprocess.run(
            [sys.executable, str(script), code, "x"], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr)
        assert got.args == want.args
