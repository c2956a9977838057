"""keel.engine.host_memory: the weights and KV pools on huge-page-advised memory, values and aliasing kept."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from keel.engine import host_memory

needs_thp = pytest.mark.skipif(
    not host_memory.available({}), reason="no transparent huge pages here (not Linux, or the kernel's mode is never)"
)


def advised(t: torch.Tensor) -> bool:
    """Whether the mapping holding t's first byte carries the MADV_HUGEPAGE flag ("hg" in /proc/self/smaps)."""
    addr, current = t.data_ptr(), False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            current = lo <= addr < hi
        elif head == "VmFlags:" and current:
            return "hg" in line.split()[1:]
    raise AssertionError(f"no mapping holds address {addr:#x}")


@needs_thp
def test_rehome_keeps_values_views_strides_and_objects(monkeypatch):
    monkeypatch.delenv("KEEL_HUGE_PAGES", raising=False)
    base = torch.randn(300, 576).to(torch.bfloat16)
    view = base[10:20]  # shares base's storage: must keep sharing it
    transposed = torch.randn(64, 48).t()  # non-contiguous strides
    ints = torch.arange(1000, dtype=torch.int64)[3:]  # a storage offset
    fp8 = torch.randn(40, 128).to(torch.float8_e4m3fn)
    param = torch.nn.Parameter(torch.randn(32, 32), requires_grad=False)
    tensors = [base, view, transposed, ints, fp8, param]
    before = [t.clone() for t in tensors]
    shapes = [(t.shape, t.stride(), t.dtype) for t in tensors]  # the offset is now into the arena's storage
    ids = [id(t) for t in tensors]
    own = sum(t.untyped_storage().nbytes() for t in (base, transposed, ints, fp8, param))  # view shares base's
    moved = host_memory.rehome([*tensors, param])  # a tensor given twice moves once
    assert own <= moved < own + 5 * 4096  # each storage rounded up to 4 KiB, base's once
    for t, b, s, i in zip(tensors, before, shapes, ids, strict=True):
        assert id(t) == i and (t.shape, t.stride(), t.dtype) == s
        assert torch.equal(t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t,
                           b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b)  # fmt: skip
        assert advised(t), "the moved tensor is not in a MADV_HUGEPAGE mapping"
    assert isinstance(param, torch.nn.Parameter)
    assert view.data_ptr() - base.data_ptr() == 10 * 576 * 2
    view.fill_(0)  # still the same memory
    assert base[10:20].abs().sum().item() == 0


@needs_thp
def test_rehome_leaves_what_it_cannot_move(monkeypatch):
    monkeypatch.delenv("KEEL_HUGE_PAGES", raising=False)
    empty, meta = torch.empty(0), torch.empty(4, 4, device="meta")
    ptr = empty.data_ptr()
    assert host_memory.rehome([empty, meta]) == 0
    assert empty.data_ptr() == ptr and meta.is_meta


def test_switch_off_moves_nothing(monkeypatch):
    monkeypatch.setenv("KEEL_HUGE_PAGES", "0")
    t = torch.randn(1000)
    ptr = t.data_ptr()
    assert host_memory.rehome([t]) == 0 and t.data_ptr() == ptr
    pools = host_memory.zeros(2, (3, 4), torch.bfloat16)
    assert all(p.shape == (3, 4) and p.dtype == torch.bfloat16 and not p.any() for p in pools)


def test_switch_refuses_an_unknown_value():
    with pytest.raises(host_memory.HugePagesSettingError, match=r"KEEL_HUGE_PAGES='maybe'.*0 / off or 1 / on"):
        host_memory.wanted({"KEEL_HUGE_PAGES": "maybe"})
    assert host_memory.wanted({}) and host_memory.wanted({"KEEL_HUGE_PAGES": "on"})
    assert not host_memory.wanted({"KEEL_HUGE_PAGES": "off"})


def test_thp_mode_reads_the_bracketed_word(tmp_path):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert host_memory.thp_mode(f) == "madvise"
    f.write_text("[never]\n")
    assert host_memory.thp_mode(f) == "never"
    assert host_memory.thp_mode(tmp_path / "missing") == "unavailable"


@needs_thp
def test_zeros_are_zero_separate_and_advised(monkeypatch):
    monkeypatch.delenv("KEEL_HUGE_PAGES", raising=False)
    pools = host_memory.zeros(4, (5, 16, 3, 64), torch.bfloat16)
    assert all(p.shape == (5, 16, 3, 64) and p.is_contiguous() and not p.any() and advised(p) for p in pools)
    for i, p in enumerate(pools):
        p.fill_(i + 1)
    assert [p.unique().tolist() for p in pools] == [[1.0], [2.0], [3.0], [4.0]]  # no overlap
    with pytest.raises(ValueError, match="nbytes must be >= 0"):
        host_memory.arena(-1)


@needs_thp
def test_zeros_share_arenas_up_to_the_group_size(monkeypatch):
    """Tensors fill arenas of up to GROUP_BYTES (so a pool replaced layer by layer frees its old memory arena by
    arena), and a tensor bigger than that gets its own."""
    monkeypatch.delenv("KEEL_HUGE_PAGES", raising=False)
    shape = (16, 1024)  # 32 KiB of bf16
    monkeypatch.setattr(host_memory, "GROUP_BYTES", 2 * 32 * 1024)
    pools = host_memory.zeros(5, shape, torch.bfloat16)
    homes = [p.untyped_storage().data_ptr() for p in pools]  # an arena is one storage (adjacent mappings may merge)
    assert homes[0] == homes[1] and homes[2] == homes[3]
    assert len({homes[0], homes[2], homes[4]}) == 3
    monkeypatch.setattr(host_memory, "GROUP_BYTES", 1024)  # smaller than one tensor: one arena each
    homes = [p.untyped_storage().data_ptr() for p in host_memory.zeros(3, shape, torch.bfloat16)]
    assert len(set(homes)) == 3


@needs_thp
def test_engine_weights_and_kv_pools_on_huge_pages_same_tokens(hf_cache, monkeypatch):
    """The model runner's weights and pools land in advised memory, and a greedy generation gives the same
    tokens and logprobs as with KEEL_HUGE_PAGES=0 (placement only), across a pool growth."""
    from keel.engine import LLM, SamplingParams

    params = SamplingParams(max_tokens=24, temperature=0.0, logprobs=1, ignore_eos=True)
    prompts = [[5, 6, 7, 8, 9, 10, 11], list(range(20, 50))]
    outs, placed = {}, {}
    for switch in ("0", "1"):
        monkeypatch.setenv("KEEL_HUGE_PAGES", switch)
        llm = LLM("keel-test/tiny-llama", dtype="bfloat16", device="cpu", block_size=4)
        runner = llm.llm_engine.runner
        res = llm.generate(prompts, params)
        outs[switch] = [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in res]
        attn = runner.attention[0]
        model = runner.model
        placed[switch] = [advised(t) for t in (model.model.embed_tokens.weight, attn.k_cache, attn.v_cache)]
    assert placed["1"] == [True, True, True]
    assert outs["0"] == outs["1"]


def test_engine_refuses_an_unknown_switch_before_loading(monkeypatch):
    """A bad KEEL_HUGE_PAGES stops the engine before it resolves the model (a missing folder would say so)."""
    from keel.engine import LLMEngine

    monkeypatch.setenv("KEEL_HUGE_PAGES", "sometimes")
    with pytest.raises(host_memory.HugePagesSettingError, match="KEEL_HUGE_PAGES='sometimes'"):
        LLMEngine("/nonexistent/model-folder", device="cpu")
