"""`SamplingParams`: how one request samples and when it stops."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SamplingParams:
    """Sampling and stopping controls; temperature 0 means greedy (keel's default, deterministic)."""

    max_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    repetition_penalty: float = 1.0  # 1.0: off; >1 discourages tokens already in prompt or output
    seed: int | None = None  # per-request generator; None: torch's global RNG
    stop: list[str] = field(default_factory=list)  # stop strings, excluded from the returned text
    ignore_eos: bool = False  # for benchmarks: always produce max_tokens

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams: max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams: temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams: top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams: top_p must be in (0, 1], got {self.top_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"SamplingParams: repetition_penalty must be > 0, got {self.repetition_penalty}")
        if any(not s for s in self.stop):
            raise ValueError("SamplingParams: stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
