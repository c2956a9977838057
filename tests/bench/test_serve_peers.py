"""benchmarks/serve_peers.py's own arithmetic: /proc sampling of a process tree, guidellm 0.8.1's JSON,
the table (the servers themselves run only in the benchmark: `python benchmarks/serve_peers.py`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.scripts import load_script

peers = load_script("benchmarks/serve_peers.py")


def stat_line(pid: int, name: str, ppid: int, utime: int, stime: int, cutime: int = 0, cstime: int = 0) -> str:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime ...
    return f"{pid} ({name}) S {ppid} 1 1 0 -1 0 0 0 0 0 {utime} {stime} {cutime} {cstime} 20 0 1 0 5 0 0\n"


def fake_proc(tmp_path: Path, rows: list[tuple[int, str, int, int, int, int, int]]) -> Path:
    for pid, name, ppid, ut, st, cut, cst in rows:
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "stat").write_text(stat_line(pid, name, ppid, ut, st, cut, cst))
    (tmp_path / "self").mkdir()  # not a pid: skipped
    return tmp_path


def test_parse_stat_counts_fields_after_the_last_parenthesis_of_the_name():
    assert peers.parse_stat(stat_line(7, "a) S 99 (b", 3, 10, 20, 30, 40)) == (3, 100)


def test_tree_cpu_adds_every_descendant_and_nothing_else(tmp_path):
    proc = fake_proc(
        tmp_path,
        [
            (10, "api server", 1, 100, 0, 0, 0),
            (11, "EngineCore", 10, 300, 50, 0, 0),  # a child
            (12, "worker", 11, 40, 10, 5, 5),  # a grandchild, with reaped children of its own
            (20, "guidellm", 1, 1000, 1000, 0, 0),  # not the server's
        ],
    )
    stats = peers.read_stats(proc)
    assert sorted(peers.tree(10, stats)) == [10, 11, 12]
    assert peers.tree(99, stats) == []
    assert peers.tree_cpu_s(10, proc) == pytest.approx(510 / os.sysconf("SC_CLK_TCK"))


def test_tree_cpu_of_a_real_process_includes_its_grandchild():
    """A shell (the root) whose grandchild burns CPU: the root's own time stays ~0, the tree's grows."""
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\ntime.sleep(30)"
    root = subprocess.Popen(["bash", "-c", f"{sys.executable} -c '{burn}' & wait"])
    try:
        deadline = time.monotonic() + 30
        while peers.tree_cpu_s(root.pid) < 0.3:
            assert time.monotonic() < deadline, "the grandchild's CPU time never showed in the tree's"
            time.sleep(0.1)
        assert len(peers.tree(root.pid, peers.read_stats())) >= 2
        fields = Path(f"/proc/{root.pid}/stat").read_text().rsplit(")", 1)[1].split()
        assert (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") < 0.2  # not the root's own time
    finally:
        for pid in peers.tree(root.pid, peers.read_stats()):
            if pid != root.pid:
                os.kill(pid, 9)
        root.wait(10)


def test_tree_memory_of_this_process_is_positive():
    mem = peers.tree_memory_mib(os.getpid())
    assert mem["rss"] > 1 and mem["pss"] > 1


def test_interpolate_between_and_beyond_the_samples():
    s = [(0.0, 0.0), (1.0, 2.0), (3.0, 4.0)]
    assert peers.interpolate(s, 0.5) == pytest.approx(1.0)
    assert peers.interpolate(s, 2.0) == pytest.approx(3.0)
    assert peers.interpolate(s, -1.0) == 0.0 and peers.interpolate(s, 9.0) == 4.0
    with pytest.raises(ValueError, match="no samples"):
        peers.interpolate([], 1.0)


def test_cpu_sampler_reads_the_cpu_of_a_window():
    sampler = peers.CpuSampler(os.getpid(), interval=0.02)
    sampler.samples = [(10.0, 1.0), (11.0, 1.5), (12.0, 3.5)]
    assert sampler.cpu_between(10.5, 12.0) == pytest.approx(3.5 - 1.25)


def test_cpu_list_writes_ranges():
    assert peers.cpu_list([0, 1]) == "0-1"
    assert peers.cpu_list([5, 0, 2, 3]) == "0,2-3,5"
    assert peers.cpu_list([4]) == "4"


def request(prompt: int, output: int) -> dict:
    return {"prompt_tokens": prompt, "output_tokens": output}


def report(ok: list[dict], errored: int = 0, start: float = 100.0, end: float = 104.0) -> dict:
    """What benchmarks/serve_peers.py reads of a guidellm 0.8.1 JSON report (same key paths)."""

    def dist(p50: float, p99: float) -> dict:
        return {"successful": {"percentiles": {"p50": p50, "p99": p99, "p95": -1.0}}}

    return {
        "benchmarks": [
            {
                "start_time": start,
                "end_time": end,
                "requests": {"successful": ok, "errored": [{}] * errored, "incomplete": []},
                "metrics": {"time_to_first_token_ms": dist(50.0, 90.0), "inter_token_latency_ms": dist(30.0, 45.0)},
            }
        ]
    }


def test_parse_guidellm_report():
    cell = peers.parse_guidellm(report([request(64, 64)] * 3 + [request(66, 40)], errored=1), "vllm", 8, 1, 64)
    assert (cell.server, cell.concurrency, cell.round) == ("vllm", 8, 1)
    assert (cell.requests, cell.errored, cell.output_tokens, cell.short_outputs) == (4, 1, 232, 1)
    assert cell.tok_s == pytest.approx(232 / 4.0)
    assert cell.prompt_tokens_mean == pytest.approx(64.5)
    assert (cell.ttft_p50_ms, cell.ttft_p99_ms, cell.itl_p50_ms) == (50.0, 90.0, 30.0)
    cell.add_cpu(4.64)
    assert cell.cpu_per_ktok == pytest.approx(20.0)
    assert cell.cores_busy == pytest.approx(1.16)


def test_parse_guidellm_refuses_a_report_without_one_successful_benchmark():
    with pytest.raises(ValueError, match="no successful request"):
        peers.parse_guidellm(report([]), "keel", 1, 0, 64)
    with pytest.raises(ValueError, match="expected 1 benchmark, got 0"):
        peers.parse_guidellm({"benchmarks": []}, "keel", 1, 0, 64)


def test_guidellm_command_uses_the_0_8_kind_options(tmp_path):
    cmd = peers.guidellm_command(Path("/g/bin/guidellm"), "http://127.0.0.1:9", tmp_path, 8, 32, 64, 64, tmp_path / "o")
    opts = dict(zip(cmd[2::2], cmd[3::2], strict=False))
    assert cmd[:2] == ["/g/bin/guidellm", "run"]
    assert opts["--profile"] == "kind=concurrent,streams=8"
    assert opts["--constraint"] == "kind=max_requests,count=32"
    assert opts["--data"] == "kind=synthetic_text,prompt_tokens=64,output_tokens=64"
    assert "request_format=/v1/completions" in opts["--backend"] and "target=http://127.0.0.1:9" in opts["--backend"]
    assert opts["--output"] == f"kind=json,path={tmp_path / 'o'}"


def test_table_keeps_each_cells_best_round():
    def cell(server: str, conc: int, rnd: int, tokens: int) -> object:
        c = peers.parse_guidellm(report([request(64, tokens)]), server, conc, rnd, 64)
        c.add_cpu(1.0)
        c.steal_pct = 10.0 * rnd
        return c

    cells = [cell("keel", 1, 0, 40), cell("keel", 1, 1, 64), cell("vllm", 1, 0, 20)]
    best = peers.best_cells(cells)
    assert best[("keel", 1)].round == 1 and best[("vllm", 1)].round == 0
    starts = {"keel": [{"start_s": 3.5, "rss": 600.0}], "vllm": [{"start_s": 70.0, "rss": 7000.0}]}
    text = peers.table(cells, starts, ["keel", "vllm"], 2)
    assert "| 1 | output tok/s | 16.0 | 5.0 |" in text
    assert "| 1 | server cores busy (of 2) | 0.25 | 0.25 |" in text
    assert "| 1 | host steal % (during the cell) | 10.0 | 0.0 |" in text  # the best round's own
    assert "| all | start s (to /health 200) | 3.5 | 70.0 |" in text
    assert text.splitlines()[0] == "| concurrency | figure | keel | vLLM CPU |"


def test_vllm_preload_names_tcmalloc_and_intel_openmp(tmp_path, monkeypatch):
    (tmp_path / "vllm" / "lib").mkdir(parents=True)
    (tmp_path / "vllm" / "lib" / "libiomp5.so").write_bytes(b"")
    tc = tmp_path / "libtcmalloc_minimal.so.4"
    tc.write_bytes(b"")
    monkeypatch.setattr(peers, "TCMALLOC", str(tc))
    monkeypatch.setenv("LD_PRELOAD", "/elsewhere.so")
    env = peers.vllm_env(tmp_path, preload=True)
    assert env["LD_PRELOAD"] == f"{tc}:{tmp_path / 'vllm' / 'lib' / 'libiomp5.so'}"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "LD_PRELOAD" not in peers.vllm_env(tmp_path, preload=False)
    tc.unlink()
    with pytest.raises(FileNotFoundError, match="libtcmalloc_minimal"):
        peers.vllm_env(tmp_path, preload=True)
