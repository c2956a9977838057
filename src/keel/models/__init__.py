"""Model registry: Hugging Face `architectures` names -> keel model classes."""

from __future__ import annotations

from keel.models.llama import LlamaForCausalLM

# Qwen2 (qkv bias), Qwen3 (q/k norm) and Mistral (sliding window) differ from Llama only by
# flags that `ModelConfig` derives from the architecture name, so one class serves all four.
MODEL_REGISTRY: dict[str, type[LlamaForCausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
}


class UnsupportedArchitectureError(ValueError):
    """The checkpoint's architecture has no keel implementation."""


def get_model_class(architecture: str) -> type[LlamaForCausalLM]:
    """The class for `architecture`, or an error naming the supported ones."""
    try:
        return MODEL_REGISTRY[architecture]
    except KeyError:
        raise UnsupportedArchitectureError(
            f"architecture {architecture!r} is not supported; supported: {', '.join(sorted(MODEL_REGISTRY))}"
        ) from None


__all__ = ["MODEL_REGISTRY", "LlamaForCausalLM", "UnsupportedArchitectureError", "get_model_class"]
