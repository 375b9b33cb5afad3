"""The selection rule: keep the default unless a candidate is faster by a bound the
measurements support.

A measurement times the default and its candidates in blocks, one sample of each
variant per block, the order alternating from block to block; a candidate's samples
are recorded with the default's of the same blocks (`paired`). Host drift (another
process, the clock, the thermal state) moves both samples of a block alike, so the
per-block ratio candidate / default is stable where the samples themselves are not.

The statistic is the median of those ratios, bounded by order statistics (a
distribution-free confidence bound on a median: the number of ratios below the true
median is binomial(n, 1/2)). A candidate wins only if its result equalled the default's
and the upper bound of its median ratio, at confidence `CONFIDENCE` shared out over the
kernel's candidates (Bonferroni: so that trying many does not make one win by chance),
is below `1 - MIN_GAIN`; of the winners the lowest median ratio is chosen. So tuning
never picks a kernel that the measurements do not say is faster, and the choice
depends only on the recorded timings (no clock, no random numbers): the same
measurements always give the same choice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from kiln.errors import UsageError

#: A candidate must be at least this much faster (ratio bound below 1 - MIN_GAIN).
MIN_GAIN = 0.02
#: Confidence of the bound, over all candidates of one kernel together.
CONFIDENCE = 0.95
#: Fewest paired blocks a candidate needs to be chosen at all.
MIN_PAIRS = 5

#: (candidate samples, the default's samples of the same blocks, equal result)
Paired = tuple[Sequence[float], Sequence[float], bool]


def noise(times: Sequence[float]) -> float:
    """Relative interquartile spread of `times` (for logs and the measurement's
    stopping rule; the choice uses the paired ratios)."""
    t = np.asarray(times, dtype=np.float64)
    if t.size == 0:
        raise UsageError("no timings to take the noise of")
    p25, p50, p75 = np.percentile(t, [25, 50, 75])
    return float((p75 - p25) / p50) if p50 > 0 else 0.0


def ratios(times: Sequence[float], default: Sequence[float]) -> np.ndarray:
    """Per-block ratios candidate / default, sorted (pairs up to the shorter list)."""
    n = min(len(times), len(default))
    r = np.asarray(times[:n], dtype=np.float64) / np.asarray(default[:n], dtype=np.float64)
    return np.sort(r)


def _rank(n: int, alpha: float) -> int:
    """The smallest k (1-based) with P(Binomial(n, 1/2) <= k - 1) >= 1 - alpha: the
    k-th smallest of n samples is an upper bound of their median at confidence
    1 - alpha (and the (n + 1 - k)-th a lower bound); n + 1 when n is too small."""
    # exact integers: 2.0 ** n overflows a float past 1023 pairs (merged databases pool them)
    need, acc = Fraction(1 - alpha) * (1 << n), 0
    for k in range(1, n + 1):
        acc += math.comb(n, k - 1)
        if acc >= need:
            return k
    return n + 1


def ratio_bounds(times: Sequence[float], default: Sequence[float], tests: int = 1
                 ) -> tuple[float, float, float]:
    """(lower bound, median, upper bound) of the median per-block ratio, one-sided
    bounds each at confidence `CONFIDENCE` shared over `tests` candidates; infinite
    where too few pairs bound it."""
    r = ratios(times, default)
    if r.size == 0:
        return 0.0, math.inf, math.inf
    k = _rank(int(r.size), (1 - CONFIDENCE) / max(1, tests))
    if k > r.size:
        return 0.0, float(np.median(r)), math.inf
    return float(r[r.size - k]), float(np.median(r)), float(r[k - 1])


def undecided(times: Sequence[float], default: Sequence[float], tests: int = 1,
              line: float = 1 - MIN_GAIN) -> bool:
    """Whether more blocks could change the verdict on a candidate: its median ratio's
    bounds straddle the winning `line` (a kernel's: `1 - MIN_GAIN`)."""
    low, _, high = ratio_bounds(times, default, tests)
    return low < line <= high


def faster(times: Sequence[float], default: Sequence[float], line: float, tests: int = 1
           ) -> tuple[bool, float, float]:
    """(whether `times` are bounded faster than `default`: at least `MIN_PAIRS` pairs and
    the upper bound of the median ratio below `line`, the median ratio, that bound)."""
    _, median, high = ratio_bounds(times, default, tests)
    return min(len(times), len(default)) >= MIN_PAIRS and high < line, median, high


def choose(candidates: Sequence[Paired]) -> int | None:
    """Index of the winning candidate, or None to keep the default (see the module
    docstring). `candidates` are (timings, the default's timings of the same blocks,
    equal to the default's result) triples."""
    tests = sum(1 for _, _, equal in candidates if equal)
    best: tuple[float, int] | None = None
    for i, (times, default, equal) in enumerate(candidates):
        if not equal:
            continue
        wins, median, _ = faster(times, default, 1 - MIN_GAIN, tests)
        if wins and (best is None or median < best[0]):
            best = (median, i)
    return None if best is None else best[1]
