"""Fresh arrays for packed weights, on small pages.

A packed weight (a GEMM's B panels, a convolution's blocked weight, a Winograd
transform) is written once in order and read once or twice in order (by the next
packing step, the constant pool's hashes, the copy into the library), then dropped;
large pages save such an array nothing, nor the ONNX importer's arena of weights
(kiln.frontend.onnx.raw_data) or fold-batchnorm's scaled weights, written once in
order too. numpy asks for transparent huge pages for every array of 4 MiB or more
(`madvise(MADV_HUGEPAGE)`), and on a virtual machine whose guest hands its free 2 MiB
blocks back to the host (free page reporting), the first touch of such a page can
cost several times the system time of the same bytes in small pages
(docs/performance.md, "Compile time, round twenty"). The arrays here come from an
anonymous private mapping advised `MADV_NOHUGEPAGE`; a mapping is also zero already,
so `zeros` costs no write.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence

import numpy as np
from numpy.typing import DTypeLike

#: Arrays smaller than this come from numpy (which asks for large pages from 4 MiB on).
MIN_MAPPED_BYTES = 1 << 22


def _mapped(shape: Sequence[int], dtype: DTypeLike) -> np.ndarray | None:
    """A zero array of `shape` on a mapping of small pages, or None where it would be
    small or the platform cannot advise a mapping."""
    dt = np.dtype(dtype)
    count = 1
    for d in shape:
        count *= int(d)
    if count * dt.itemsize < MIN_MAPPED_BYTES or not hasattr(mmap, "MADV_NOHUGEPAGE"):
        return None
    area = mmap.mmap(-1, count * dt.itemsize, flags=mmap.MAP_PRIVATE,
                     prot=mmap.PROT_READ | mmap.PROT_WRITE)
    area.madvise(mmap.MADV_NOHUGEPAGE)
    # the array keeps the mapping alive; the mapping is unmapped with its last view
    return np.frombuffer(area, dt, count).reshape(tuple(int(d) for d in shape))


#: The alignment of every array here (numpy's own places data 16 bytes past it, often):
#: the constant pool's (kiln.codegen.constants.CONST_ALIGN), which a library loaded by the
#: process that compiled it reads its constants in place at (kiln.runtime.jit_constants).
ALIGN = 64


def _aligned(shape: Sequence[int], dtype: DTypeLike, fill: bool) -> np.ndarray:
    """A numpy array of `shape` starting at a multiple of ALIGN (zeros with `fill`)."""
    dt = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = (np.zeros if fill else np.empty)(size + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + size].view(dt).reshape(tuple(int(d) for d in shape))


def empty(shape: Sequence[int], dtype: DTypeLike) -> np.ndarray:
    """A writable C-contiguous array of `shape` and `dtype` for a packed weight (its
    values unspecified, as `np.empty`'s), 64-byte aligned."""
    arr = _mapped(shape, dtype)
    return _aligned(shape, dtype, False) if arr is None else arr


def zeros(shape: Sequence[int], dtype: DTypeLike) -> np.ndarray:
    """`empty`, filled with zeros."""
    arr = _mapped(shape, dtype)
    return _aligned(shape, dtype, True) if arr is None else arr


def copy_of(arr: np.ndarray) -> np.ndarray:
    """A read-only C-contiguous copy of `arr` (a strided view of a packing step) from
    `empty`: a packer's result, which a graph constant takes without a copy (it copies
    a writable array, with numpy's memory)."""
    out = empty(arr.shape, arr.dtype)
    out[...] = arr
    out.flags.writeable = False
    return out
