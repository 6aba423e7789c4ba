"""Throughput cost model: profiled tokens/s per layout and context length, fitted so unprofiled contexts are predicted."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from earl_core.parallel.layout import Layout


@dataclass(frozen=True)
class ProfilePoint:
    """One measurement: ``layout`` processed sequences of ``context`` tokens at ``tokens_per_s`` (whole layout)."""

    layout: Layout
    context: int
    tokens_per_s: float


@dataclass(frozen=True)
class LinearFit:
    """Seconds per token = ``fixed + per_context x context`` (attention makes each token cost grow with context)."""

    fixed: float
    per_context: float
    points: int

    def seconds_per_token(self, context: int) -> float:
        # A fitted line may dip below the measured floor when extrapolated to short contexts; never predict
        # a token for free.
        return max(self.fixed + self.per_context * context, 1e-12)


def fit_line(points: Iterable[tuple[int, float]]) -> LinearFit:
    """Least-squares line through (context, seconds per token); one context only gives a constant."""
    pts = list(points)
    if not pts:
        raise ValueError("no profile points to fit")
    n = len(pts)
    mx = sum(c for c, _ in pts) / n
    my = sum(s for _, s in pts) / n
    var = sum((c - mx) ** 2 for c, _ in pts)
    if var == 0:
        return LinearFit(fixed=my, per_context=0.0, points=n)
    slope = sum((c - mx) * (s - my) for c, s in pts) / var
    # Longer context never makes a token cheaper; a negative slope is measurement noise.
    slope = max(slope, 0.0)
    return LinearFit(fixed=my - slope * mx, per_context=slope, points=n)


OBSERVATIONS_KEPT = 4
"""Measured/predicted ratios kept per layout (recent ones: the work drifts as context grows)."""


class CostModel:
    """Per-layout fits of profiled throughput, corrected by how long the real stage then took.

    A profile times one micro-batch of random tokens; the real stage also packs the batch, runs the reference
    model, steps the optimizer, and sees other lengths. Each iteration's measured/predicted ratio is kept per
    layout; a layout never run yet borrows the median ratio of those that were (the part every layout shares).
    """

    def __init__(self, points: Iterable[ProfilePoint] = ()) -> None:
        self._points: dict[Layout, list[tuple[int, float]]] = defaultdict(list)
        self._fits: dict[Layout, LinearFit] = {}
        self._ratios: dict[Layout, list[float]] = defaultdict(list)
        for p in points:
            self.add(p)

    def observe(self, layout: Layout, ratio: float) -> None:
        """Record that a stage on ``layout`` took ``ratio`` times its (uncorrected) prediction."""
        if not math.isfinite(ratio) or ratio <= 0:
            return
        kept = self._ratios[layout]
        kept.append(ratio)
        del kept[:-OBSERVATIONS_KEPT]

    def correction(self, layout: Layout) -> float:
        """Factor on the profiled prediction: the geometric mean of this layout's recent ratios, else the median
        of every layout's, else 1."""
        own = self._ratios.get(layout)
        if own:
            return math.exp(sum(math.log(r) for r in own) / len(own))
        every = [r for rs in self._ratios.values() for r in rs]
        return statistics.median(every) if every else 1.0

    def add(self, point: ProfilePoint) -> None:
        """Add a measurement (from start-up profiling or from a real iteration) and refit that layout."""
        if point.tokens_per_s <= 0:
            raise ValueError(f"throughput must be positive, got {point.tokens_per_s}")
        self._points[point.layout].append((point.context, 1.0 / point.tokens_per_s))
        self._fits[point.layout] = fit_line(self._points[point.layout])

    def knows(self, layout: Layout) -> bool:
        return layout in self._fits

    def tokens_per_s(self, layout: Layout, context: int) -> float:
        """Predicted throughput of the whole layout at ``context``; KeyError for a layout never profiled."""
        return 1.0 / self._fits[layout].seconds_per_token(context)

    def fit(self, layout: Layout) -> LinearFit:
        return self._fits[layout]

    @property
    def layouts(self) -> list[Layout]:
        return list(self._fits)
