"""The result arrays of kiln.generate's Python loop, allocated once per generation.

Each step of a decoder returns its presents (the past with this step's rows) and its
logits; allocated fresh each step, they cost the process new pages to fault in every
step (a numpy array of a few hundred KiB is its own mmap, returned to the system when
freed). `StepBuffers` hands each call its `out=` arrays instead: per present, two flat
buffers of the cache's largest size (every position of the generation cached), the
call writing its presents into the buffer its pasts are not in, the next call the
other way round; the logits and any other result in a buffer kept while its size stays
the same (one for the prompt's call, one for every step after). Their pages are touched
as the cache grows, so the memory is what the fresh arrays took at their largest.

A decoder whose presents are each marked in place of their past (GroupQueryAttention's
shared buffer, kiln.runtime.in_place) gets one buffer per past instead (`shared`): the
past is the buffer at a fixed cache length, the mask says how much of it is cached, and
each call writes only its new rows into it, the present the past's own array. The
buffer holds the past plus one call's new rows (a present's bound) and starts zeroed,
as a defence only: kiln's attention reads no row past the cached ones (its key loops
end at `seqlens_k + 1`, softcap or not), but a library built by an older kiln read the
softcap form's whole buffer, where a NaN would reach the output (0 * NaN), and a
zeroed buffer costs nothing more than an empty one (its pages fault in as the cache
grows either way).
Numpy only, as the rest of the runtime.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


class StepBuffers:
    """`out=` arrays for the calls of one generation (see the module docstring).

    `presents` are the result indices of the presents; `caches` the shape and dtype of
    each present at its largest, in the same order; `dtypes` every result's dtype.
    """

    def __init__(self, presents: Sequence[int],
                 caches: Sequence[tuple[tuple[int, ...], np.dtype[Any]]],
                 dtypes: Sequence[np.dtype[Any]], *, shared: bool = False) -> None:
        self._present_of = {r: k for k, r in enumerate(presents)}
        self.shared = shared
        if shared:  # one zeroed buffer per past, both turns (see the module docstring)
            self._caches = [(flat, flat) for flat in
                            (np.zeros(math.prod(shape), dtype) for shape, dtype in caches)]
        else:
            try:
                self._caches = [(np.empty(math.prod(shape), dtype),
                                 np.empty(math.prod(shape), dtype)) for shape, dtype in caches]
            except (MemoryError, ValueError):
                # more than the memory can reserve (a max_new_tokens far past where a stop
                # token ends it): each call allocates its presents, as they grow
                self._caches = [(np.empty(0, dtype), np.empty(0, dtype)) for _, dtype in caches]
        self._dtypes = list(dtypes)
        self._others: dict[int, np.ndarray] = {}
        self._turn = 0

    def outputs(self, shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray] | None:
        """C-contiguous arrays of these result shapes for the next call, its presents in
        the buffers the last call's are not in; None when a present does not fit (a
        shape the generation's length did not foresee: the call allocates its own)."""
        turn, arrays = self._turn, []
        for j, shape in enumerate(shapes):
            size = math.prod(shape)
            k = self._present_of.get(j)
            if k is not None:
                flat = self._caches[k][turn]
                if size > flat.size:
                    return None
            else:
                flat = self._others.get(j, np.empty(0, self._dtypes[j]))
                if flat.size != size:
                    flat = self._others[j] = np.empty(size, self._dtypes[j])
            arrays.append(flat[:size].reshape(shape))
        self._turn = 1 - turn
        return arrays

    def pasts(self, shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
        """The shared buffers as the pasts of these shapes (`shared` only)."""
        return [flat[:math.prod(shape)].reshape(shape)
                for (flat, _), shape in zip(self._caches, shapes, strict=True)]

    def grow(self, pasts: Sequence[np.ndarray], caches: Sequence[tuple[int, ...]],
             shapes: Sequence[tuple[int, ...]], axes: Sequence[int],
             cached: int) -> list[np.ndarray]:
        """New shared buffers of `caches` sizes, with the `cached` rows of `pasts` copied
        into them along each one's cache axis; the pasts at `shapes` (`shared` only)."""
        self._caches = [(flat, flat) for flat in (np.zeros(math.prod(size), past.dtype)
                                                  for past, size in zip(pasts, caches))]
        grown = self.pasts(shapes)
        for old, new, axis in zip(pasts, grown, axes, strict=True):
            rows = (slice(None),) * axis + (slice(0, cached),)
            new[rows] = old[rows]
        return grown


__all__ = ["StepBuffers"]
