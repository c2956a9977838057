"""keel's loader fuzzer: mutate a real checkpoint (HF folder, GGUF file) and load each copy through keel's
public path, in a worker process (harness.py). The mutations: mutations.py (HF folder), gguf_mutations.py
over gguf_layout.py (GGUF file). `python -m keel_fuzz.loaders` runs all of them; the suite a small sample."""

from __future__ import annotations

from keel_fuzz.loaders.gguf_mutations import gguf_mutations
from keel_fuzz.loaders.harness import DEFECTS, OUTCOMES, Report, classify, fuzz
from keel_fuzz.loaders.mutations import Mutation, hf_mutations

__all__ = ["DEFECTS", "OUTCOMES", "Mutation", "Report", "classify", "fuzz", "gguf_mutations", "hf_mutations"]
