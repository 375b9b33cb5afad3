"""What the report finds in a graph summary: unique tensor names, repeated blocks.

A lowered model repeats itself: a transformer's layers are the same run of kernel
calls again and again, and its tensors carry the op's name (`add`, `relu`) many
times over. The report names each tensor once (the second `add` becomes `add#2`)
and collapses the longest run of back-to-back copies of one block of kernel
calls to one node per copy after the first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Longest block looked for: a transformer layer is tens of kernel calls, a
# 5,000-call graph stays well under a second with this bound.
MAX_PERIOD = 1024


def unique_names(names: Sequence[str]) -> list[str]:
    """`names` with each repeat suffixed `#2`, `#3`, ... (never a name already taken)."""
    taken = set(names)
    last: dict[str, int] = {}
    out = []
    for name in names:
        n = last.get(name)
        label = name
        if n is not None:
            while label in taken:
                n += 1
                label = f"{name}#{n}"
            taken.add(label)
        last[name] = n or 1
        out.append(label)
    return out


@dataclass(frozen=True)
class Repeat:
    """`count` back-to-back copies of a block of `period` kernel calls from `start`."""

    start: int
    period: int
    count: int

    def copy_of(self, call: int) -> int | None:
        """Which copy (0-based) kernel call `call` belongs to, None outside the run."""
        if not self.start <= call < self.start + self.period * self.count:
            return None
        return (call - self.start) // self.period

    def calls(self, copy: int) -> range:
        """The kernel calls of one copy."""
        first = self.start + copy * self.period
        return range(first, first + self.period)


def repeated_run(kernels: Sequence[str], min_period: int = 2) -> Repeat | None:
    """The run of repeated blocks covering the most kernel calls (by kernel name; the
    shortest block on a tie), or None when no block of `min_period`+ calls repeats."""
    n = len(kernels)
    if n < 2 * min_period:
        return None
    ids = np.unique(np.asarray(kernels, dtype=object).astype(str), return_inverse=True)[1]
    best: Repeat | None = None
    for period in range(min_period, min(n // 2, MAX_PERIOD) + 1):
        same = np.concatenate(([0], (ids[:-period] == ids[period:]).astype(np.int8), [0]))
        edges = np.diff(same)
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        if not len(starts):
            continue
        k = int(np.argmax(ends - starts))
        count = int(ends[k] - starts[k]) // period + 1
        if count >= 2 and (best is None or count * period > best.count * best.period):
            best = Repeat(int(starts[k]), period, count)
    return best
