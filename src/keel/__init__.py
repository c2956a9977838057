"""keel: a small LLM inference engine whose compiled code uses only torch's stable ABI.

Importing keel loads its native ops (`torch.ops.keel.*`); `keel.LLM`, `keel.LLMEngine`,
`keel.SamplingParams`, `keel.StructuredOutputsParams` and `keel.RequestOutput` come from the engine,
imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from keel import _native

__version__ = "0.1.0"

_native.load()

from keel import ops  # noqa: E402  (registers fake impls and autograd after the libraries load)

if TYPE_CHECKING:
    from keel.engine import LLM, LLMEngine, RequestOutput, SamplingParams, StructuredOutputsParams

__all__ = ["LLM", "LLMEngine", "RequestOutput", "SamplingParams", "StructuredOutputsParams", "ops", "__version__"]
_ENGINE_NAMES = frozenset(__all__[:5])


def __getattr__(name: str) -> Any:
    # The engine pulls in tokenizers, safetensors and friends; only pay for it when used.
    if name in _ENGINE_NAMES:
        from keel import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'keel' has no attribute {name!r}")
