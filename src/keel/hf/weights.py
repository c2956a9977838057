"""Read safetensors checkpoints (single file or sharded with an index), with progress for large ones.

`validate_checkpoint` is what `load_model` calls first: from the headers alone (no tensor data), every
tensor the config implies must be present with the implied shape and a floating dtype, and every
tensor present must be one the model loads (keel refuses unknown tensors rather than ignoring them).
Errors name the file, the tensor and the config fields that imply its shape.
"""

from __future__ import annotations

import stat
import sys
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import torch

from .checkpoint import FLOAT_DTYPES, expected_tensors, skipped, why_unexpected
from .config import ModelConfig
from .errors import read_json_object_text
from .safetensors_header import SafetensorsHeader, TensorEntry, WeightsError, read_header

__all__ = ["INDEX", "WeightsError", "iter_weights", "read_headers", "validate_checkpoint", "weight_files"]

INDEX = "model.safetensors.index.json"
_PROGRESS_MIN_BYTES = 64 << 20  # show a bar only when there is something to wait for


def _index_shards(index: Path) -> list[str]:
    """The shard file names an index lists, in order; each must be a plain `*.safetensors` name in the folder."""
    raw, _ = read_json_object_text(index, WeightsError)
    weight_map = raw.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise WeightsError(
            f"{index}: weight_map must be a non-empty object (tensor name -> shard file), got {weight_map!r:.60}"
        )
    shards = []
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard.endswith(".safetensors") or PurePosixPath(shard).name != shard:
            raise WeightsError(
                f"{index}: weight_map[{name!r}] must be a .safetensors file name in the same folder, got {shard!r:.60}"
            )
        shards.append(shard)
    return list(dict.fromkeys(shards))


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint, in index order when sharded."""
    index = folder / INDEX
    indexed = _present(index)
    if indexed:
        files = [folder / name for name in _index_shards(index)]
    elif _present(folder / "model.safetensors"):
        files = [folder / "model.safetensors"]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"no safetensors weights in {folder}; expected model.safetensors or an index")
    missing = [str(f) for f in files if not _present(f)]
    if missing and indexed:
        raise WeightsError(f"{index}: the safetensors shards it lists are missing: {', '.join(missing)}")
    for f in files:  # present, but a dangling link, a link loop, a folder, a device: name the file
        try:
            info = f.stat()
        except OSError as exc:
            raise WeightsError(f"cannot open {f} ({exc.strerror or exc}); expected a safetensors file") from None
        if not stat.S_ISREG(info.st_mode):
            raise WeightsError(f"{f} is not a regular file; expected a safetensors file")
    if indexed:
        _check_index_covers(index, files)
    return files


def _present(path: Path) -> bool:
    """A directory entry exists at `path` (a link counts, even a dangling or looping one)."""
    return path.exists() or path.is_symlink()


def _check_index_covers(index: Path, files: list[Path]) -> None:
    """Each tensor the index places in a shard must be in that shard's header."""
    weight_map = read_json_object_text(index, WeightsError)[0]["weight_map"]
    present = {f.name: set(read_header(f).tensors) for f in files}
    for name, shard in weight_map.items():
        if name not in present[shard]:
            raise WeightsError(f"{index}: weight_map puts tensor {name!r} in {shard}, whose header does not hold it")


def read_headers(folder: Path) -> dict[str, tuple[Path, TensorEntry]]:
    """Every tensor of the checkpoint in `folder` -> (its file, its header entry), headers only."""
    files = weight_files(folder)
    headers: dict[Path, SafetensorsHeader] = {f: read_header(f) for f in files}
    seen: dict[str, tuple[Path, TensorEntry]] = {}
    for file, header in headers.items():
        for name, entry in header.tensors.items():
            if name in seen:
                raise WeightsError(f"{file}: tensor {name!r} is also in {seen[name][0]}; which one to load is unclear")
            seen[name] = (file, entry)
    return seen


def validate_checkpoint(folder: Path, cfg: ModelConfig) -> dict[str, tuple[Path, TensorEntry]]:
    """Check every tensor's presence, dtype and shape against `cfg`, reading headers only; returns them."""
    seen = read_headers(folder)
    expected = expected_tensors(cfg)
    unknown = sorted(n for n in seen if n not in expected and not skipped(n, cfg))
    if unknown:
        file = seen[unknown[0]][0]
        more = f" (and {len(unknown) - 1} more: {', '.join(unknown[1:4])}...)" if len(unknown) > 1 else ""
        raise WeightsError(
            f"{file}: tensor {unknown[0]!r} is not part of {cfg.architecture} as config.json describes it "
            f"({why_unexpected(unknown[0], cfg)}){more}; keel refuses tensors it would not load"
        )
    for name, (file, e) in seen.items():
        if skipped(name, cfg):
            continue
        shape, why = expected[name]
        if e.dtype not in FLOAT_DTYPES:
            raise WeightsError(
                f"{file}: tensor {name!r} has dtype {e.dtype}; keel loads {', '.join(FLOAT_DTYPES)} weights"
            )
        if e.shape != shape:
            raise WeightsError(f"{file}: tensor {name!r} has shape {e.shape}, but config.json ({why}) implies {shape}")
    missing = [n for n in expected if n not in seen]
    if missing:
        index = folder / INDEX
        where = index if index.is_file() else next(iter(seen.values()), (folder / "model.safetensors",))[0]
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        why = expected[missing[0]][1]
        if missing[0].startswith("model.layers."):
            why += f", num_hidden_layers={cfg.num_hidden_layers}"
        raise WeightsError(f"{where}: {len(missing)} tensors that config.json implies are missing ({why}): {shown}")
    return seen


def _finite(t: torch.Tensor) -> bool:
    """No NaN and no infinity in a floating tensor (aminmax propagates both; one pass, no bool tensor as isfinite)."""
    if not t.is_floating_point() or t.numel() == 0:
        return True
    lo, hi = torch.aminmax(t)
    return bool(torch.isfinite(lo) & torch.isfinite(hi))


def iter_weights(folder: Path, progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield `(name, tensor)` for every tensor of the checkpoint in `folder` (CPU, stored dtype).

    Each file's header is validated first (src/keel/hf/safetensors_header.py); a floating tensor holding a
    NaN or an infinity is refused (no trained checkpoint has one: it is a corrupt file).
    """
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
            read_header(file)
            try:
                with safe_open(str(file), framework="pt", device="cpu") as f:
                    for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                        tensor = f.get_tensor(name)
                        if not _finite(tensor):
                            raise WeightsError(
                                f"{file}: tensor {name!r} holds NaN or infinite values; the file is corrupt"
                            )
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
