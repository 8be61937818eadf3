"""RequestTimes: what one request's stream measured, for the latency histograms."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestTimes:
    """What one request's stream measured, handed to the metrics observer at its end."""

    arrival: float
    first_token: float | None = None
    token_times: list[float] = field(default_factory=list)  # every sample's, merged
    sample_times: dict[int, list[float]] = field(default_factory=dict)  # per sample index
    finish_reasons: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    def inter_token(self) -> list[float]:
        """Gaps between consecutive tokens of the same sample (n samples do not interleave)."""
        return [b - a for times in self.sample_times.values() for a, b in itertools.pairwise(times)]
