"""keel.gguf.quants: dequantization against ggml's reference math (and gguf-py when installed)."""

from __future__ import annotations

import numpy as np
import pytest
from support.gguf_synth import T_Q4_1, T_Q8_0, dequant_reference, quantize_q4_1, quantize_q8_0

from keel.gguf.quants import GGMLType, dequantize, tensor_nbytes


@pytest.mark.parametrize(("ggml_type", "quantize"), [(GGMLType.Q8_0, quantize_q8_0), (GGMLType.Q4_1, quantize_q4_1)])
def test_block_quants_match_reference(ggml_type, quantize):
    x = np.random.default_rng(1).normal(0, 1, (4, 64)).astype(np.float32)
    data = quantize(x)
    got = dequantize(np.frombuffer(data, np.uint8), ggml_type, (4, 64))
    ref = dequant_reference(data, T_Q8_0 if ggml_type == GGMLType.Q8_0 else T_Q4_1, x.size).reshape(4, 64)
    np.testing.assert_array_equal(got, ref)
    assert np.abs(got - x).max() < (0.05 if ggml_type == GGMLType.Q8_0 else 0.5)


def test_float_types():
    x = np.random.default_rng(2).normal(0, 1, (3, 8)).astype(np.float32)
    np.testing.assert_array_equal(dequantize(np.frombuffer(x.tobytes(), np.uint8), GGMLType.F32, (3, 8)), x)
    h = x.astype(np.float16)
    np.testing.assert_array_equal(dequantize(np.frombuffer(h.tobytes(), np.uint8), GGMLType.F16, (3, 8)), h)
    bf = (x.view(np.uint32) >> 16).astype(np.uint16)  # truncation to bf16
    got = dequantize(np.frombuffer(bf.tobytes(), np.uint8), GGMLType.BF16, (3, 8))
    np.testing.assert_array_equal(got, (bf.astype(np.uint32) << 16).view(np.float32))


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_matches_gguf_py(name):
    quants = pytest.importorskip("gguf.quants")
    import gguf

    qtype = getattr(gguf.GGMLQuantizationType, name)
    x = np.random.default_rng(3).normal(0, 1, (2, 64)).astype(np.float32)
    packed = quants.quantize(x, qtype)
    got = dequantize(packed.reshape(-1), GGMLType[name], (2, 64))
    np.testing.assert_array_equal(got, quants.dequantize(packed, qtype))


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="needs 40 bytes, got 20"):
        dequantize(np.zeros(20, np.uint8), GGMLType.Q4_1, (1, 64))
    with pytest.raises(ValueError, match="cannot dequantize ggml type Q6_K"):
        dequantize(np.zeros(210, np.uint8), GGMLType.Q6_K, (1, 256))
    with pytest.raises(ValueError, match="IQ2_XXS is not supported"):
        tensor_nbytes(GGMLType.IQ2_XXS, (256,))
