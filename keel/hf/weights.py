"""Read safetensors checkpoints (single file or sharded with an index), with progress for large ones."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

_PROGRESS_MIN_BYTES = 64 << 20  # show a bar only when there is something to wait for


class WeightsError(ValueError):
    """Checkpoint weights that are missing, corrupt, truncated or do not fit the model."""


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint, in index order when sharded."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise WeightsError(f"{index} is not a valid safetensors index (expected a 'weight_map' object)") from exc
        files = [folder / name for name in dict.fromkeys(weight_map.values())]
    elif (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"no safetensors weights in {folder}; expected model.safetensors or an index")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise WeightsError(f"safetensors shards listed in the index are missing: {', '.join(missing)}")
    return files


def iter_weights(folder: Path, progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield `(name, tensor)` for every tensor of the checkpoint in `folder` (CPU, stored dtype)."""
    from safetensors import safe_open

    files = weight_files(folder)
    total = sum(f.stat().st_size for f in files)
    bar = None
    if progress and total >= _PROGRESS_MIN_BYTES:
        from tqdm import tqdm

        bar = tqdm(
            total=total,
            unit="B",
            unit_scale=True,
            desc=f"loading {folder.name}",
            file=sys.stderr,
            leave=False,
        )
    try:
        for file in files:
            try:
                with safe_open(str(file), framework="pt", device="cpu") as f:
                    for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                        tensor = f.get_tensor(name)
                        if bar is not None:
                            bar.update(tensor.numel() * tensor.element_size())
                        yield name, tensor
            except WeightsError:
                raise
            except Exception as exc:  # safetensors raises SafetensorError / OSError for bad files
                if type(exc).__name__ not in ("SafetensorError", "OSError", "RuntimeError", "ValueError"):
                    raise
                raise WeightsError(
                    f"cannot read {file} ({file.stat().st_size} bytes): {exc}; the file is truncated or "
                    f"corrupt, expected a complete safetensors file"
                ) from exc
    finally:
        if bar is not None:
            bar.close()
