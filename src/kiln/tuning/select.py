"""The selection rule: keep the default unless a candidate is faster by more than the
noise.

Given repeated timings of the default and of each candidate (same kernel, same
machine), the noise of a sample is its relative spread, (p75 - p25) / median, and at
least `MIN_NOISE`. A candidate wins only if it computed the same result as the default
and its median is below the default's by more than the larger of the two noises; the
fastest such candidate is chosen. So tuning never picks a kernel that was not clearly
faster, and the choice depends only on the recorded timings (no clock is read here):
the same measurements always give the same choice.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln.errors import UsageError

MIN_NOISE = 0.02


def noise(times: Sequence[float]) -> float:
    """Relative interquartile spread of `times`, at least MIN_NOISE."""
    t = np.asarray(times, dtype=np.float64)
    if t.size == 0:
        raise UsageError("no timings to take the noise of")
    p25, p50, p75 = np.percentile(t, [25, 50, 75])
    return max(MIN_NOISE, float((p75 - p25) / p50) if p50 > 0 else MIN_NOISE)


def choose(default: Sequence[float], candidates: Sequence[tuple[Sequence[float], bool]]
           ) -> int | None:
    """Index of the winning candidate, or None to keep the default. `candidates` are
    (timings, equal to the default's result) pairs."""
    base = float(np.median(default))
    best: tuple[float, int] | None = None
    for i, (times, equal) in enumerate(candidates):
        if not equal or len(times) == 0:
            continue
        median = float(np.median(times))
        margin = max(noise(default), noise(times))
        if median < base * (1 - margin) and (best is None or median < best[0]):
            best = (median, i)
    return None if best is None else best[1]
