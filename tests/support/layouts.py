"""Input layouts for op tests: the same values as contiguous, transposed-back and strided tensors."""

from __future__ import annotations

import torch


def make(shape: tuple[int, ...], dtype: torch.dtype, device: str, layout: str, seed: int = 0) -> torch.Tensor:
    """A tensor of `shape` with values from `seed`, laid out as `layout`.

    contiguous: plain; strided: every other element of a wider buffer (last-dim stride 2);
    transposed: stored with the first two dims swapped (if it has two), then viewed back.
    """
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(shape, generator=g, dtype=torch.float32).to(dtype)
    if layout == "contiguous":
        out = base
    elif layout == "strided":
        wide = torch.zeros((*shape[:-1], shape[-1] * 2) if shape else (2,), dtype=dtype)
        view = wide[..., ::2] if shape else wide[::2].reshape(())
        view.copy_(base)
        out = view
    elif layout == "transposed":
        if len(shape) < 2:
            return make(shape, dtype, device, "strided", seed)
        out = base.transpose(0, 1).contiguous().transpose(0, 1)
    else:
        raise ValueError(layout)
    if device != "cpu":
        # keep the layout on the device: copy the storage view, not a contiguous clone
        out = _to_device_keep_strides(out, device)
    return out


def _to_device_keep_strides(t: torch.Tensor, device: str) -> torch.Tensor:
    dev = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device)
    dev.copy_(t)
    return dev


LAYOUTS = ["contiguous", "strided", "transposed"]
