"""The one error family of checkpoint loading: every message names the file and the field at fault."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint file keel cannot use (config, weights, tokenizer, GGUF); the message says which and why."""
