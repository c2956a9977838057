"""The CUDA kernel's online-softmax update (src/cuda/online_softmax.h, __host__ __device__) compiled for the host
and run as the kernel runs it: tiles of 32 keys, the tile's max over the lanes, one weight per lane. Non-finite
scores give what the CPU twin and torch's softmax give: a NaN or +inf score makes the row NaN, a -inf (masked)
score has weight 0, a row without a visible key is 0. Finite scores match torch's softmax @ V.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
HEADER_DIR = ROOT / "vendored_deps" / "flash_attn" / "src" / "cuda"
CXX = shutil.which("g++") or shutil.which("c++")

# reads: n d, then n scores, then n rows of d values; prints the d outputs. The loop is flash_fwd_cuda.cu's:
# per tile of 32 keys, m_new / alpha / p from softmax_step, l and acc rescaled, p * v accumulated.
DRIVER = r"""
#include <cstdio>
#include <vector>
#include "online_softmax.h"
int main() {
  int n, d;
  if (std::scanf("%d %d", &n, &d) != 2) return 2;
  std::vector<float> s(n), v(size_t(n) * d), acc(d, 0.f);
  for (auto& x : s) std::scanf("%f", &x);
  for (auto& x : v) std::scanf("%f", &x);
  float m = -INFINITY, l = 0.f;
  for (int t0 = 0; t0 < n; t0 += 32) {
    float lane_s[32], tile_max = -INFINITY;
    for (int lane = 0; lane < 32; ++lane) {
      lane_s[lane] = t0 + lane < n ? s[t0 + lane] : -INFINITY;
      tile_max = flash::nan_max(tile_max, lane_s[lane]);
    }
    float p[32], psum = 0.f, alpha = 0.f, m_new = m;
    for (int lane = 0; lane < 32; ++lane) {
      const flash::SoftmaxStep st = flash::softmax_step(m, tile_max, lane_s[lane]);
      p[lane] = st.p;
      psum += st.p;
      alpha = st.alpha;
      m_new = st.m_new;
    }
    l = l * alpha + psum;
    for (int c = 0; c < d; ++c) acc[c] *= alpha;
    for (int j = 0; j < 32 && t0 + j < n; ++j)
      for (int c = 0; c < d; ++c) acc[c] += p[j] * v[size_t(t0 + j) * d + c];
    m = m_new;
  }
  const float inv = flash::softmax_final_scale(l);
  for (int c = 0; c < d; ++c) std::printf("%.9g\n", acc[c] * inv);
}
"""

pytestmark = pytest.mark.skipif(not CXX, reason="needs a C++ compiler")


@pytest.fixture(scope="module")
def rule(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("softmax_rule")
    (folder / "driver.cpp").write_text(DRIVER)
    exe = folder / "driver"
    subprocess.run(
        [CXX, "-std=c++17", "-O1", f"-I{HEADER_DIR}", str(folder / "driver.cpp"), "-o", str(exe)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return exe


def _run(exe: Path, scores: list[float], values: torch.Tensor) -> torch.Tensor:
    text = f"{len(scores)} {values.shape[1]}\n" + " ".join(repr(float(s)) for s in scores) + "\n"
    text += " ".join(repr(float(x)) for x in values.flatten().tolist()) + "\n"
    out = subprocess.run([str(exe)], input=text, capture_output=True, text=True, check=True, timeout=60).stdout
    return torch.tensor([float(x) for x in out.split()], dtype=torch.float32)


def _torch(scores: list[float], values: torch.Tensor) -> torch.Tensor:
    return torch.softmax(torch.tensor(scores, dtype=torch.float32), 0) @ values


@pytest.mark.parametrize("n", [1, 31, 32, 70])
def test_finite_scores_match_torch_softmax(rule, n):
    gen = torch.Generator().manual_seed(n)
    scores = (torch.randn(n, generator=gen) * 3).tolist()
    values = torch.randn(n, 4, generator=gen)
    torch.testing.assert_close(_run(rule, scores, values), _torch(scores, values), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("where", [0, 5, 40, 69])  # first key, inside the first tile, a later tile, the last key
def test_a_nan_or_inf_score_makes_the_row_nan(rule, bad, where):
    gen = torch.Generator().manual_seed(where)
    scores = torch.randn(70, generator=gen).tolist()
    scores[where] = bad
    values = torch.randn(70, 4, generator=gen)
    assert torch.isnan(_torch(scores, values)).all()  # what torch (and the CPU twin) give
    out = _run(rule, scores, values)
    assert torch.isnan(out).all(), out


def test_masked_keys_have_weight_zero(rule):
    gen = torch.Generator().manual_seed(1)
    scores = torch.randn(40, generator=gen).tolist()
    values = torch.randn(40, 4, generator=gen)
    for j in (0, 3, 33, 39):
        scores[j] = -math.inf
    torch.testing.assert_close(_run(rule, scores, values), _torch(scores, values), rtol=1e-5, atol=1e-6)
    # a whole masked tile first (the running max is -inf across a tile), then visible keys
    scores = [-math.inf] * 32 + [0.5, -1.0]
    values = torch.randn(34, 4, generator=gen)
    torch.testing.assert_close(_run(rule, scores, values), _torch(scores, values), rtol=1e-5, atol=1e-6)


def test_no_visible_key_gives_zero(rule):
    out = _run(rule, [-math.inf] * 5, torch.ones(5, 3))
    assert torch.equal(out, torch.zeros(3)), out  # upstream's all-masked row (torch's softmax would give NaN)
