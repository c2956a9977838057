"""GGUF reading, dequantization and conversion to Hugging Face checkpoints (keel's offline default model)."""

from __future__ import annotations

from ..hf.resolve import DEFAULT_MODEL
from .convert import convert_state_dict, permute_qk, unpermute_qk, write_checkpoint
from .reader import GGUFError, GGUFFile, TensorInfo, read_gguf

__all__ = [
    "DEFAULT_MODEL",
    "GGUFError",
    "GGUFFile",
    "TensorInfo",
    "convert_state_dict",
    "permute_qk",
    "read_gguf",
    "unpermute_qk",
    "write_checkpoint",
]
