"""Packed weights on mappings of small pages (kiln.ops.pack_memory): the packers write
the same bytes there as into numpy's arrays, and the mapping's zeros stand for the
padding the packers leave unwritten."""

from __future__ import annotations

import mmap
from collections.abc import Callable

import numpy as np
import pytest

from kiln.kernels.conv.blocked import pack_blocked_weight
from kiln.kernels.conv.rows import pack_rows_weight
from kiln.kernels.conv.winograd import weight_transform
from kiln.kernels.conv.winograd_nchwc import pack_panels
from kiln.ops import pack_memory
from kiln.ops.conv_bf16 import pack_conv_bf16, pack_row_taps
from kiln.ops.gemm import pack_b
from kiln.ops.gemm_bf16 import pack_b_bf16

RNG = np.random.default_rng(7)
OIHW = RNG.standard_normal((21, 13, 3, 3)).astype(np.float32)  # partial blocks everywhere
KN = RNG.standard_normal((37, 29)).astype(np.float32)

PACKERS: dict[str, Callable[[], np.ndarray]] = {
    "pack_b": lambda: pack_b(KN, 16),
    "pack_b_bf16": lambda: pack_b_bf16(KN, 16),
    "pack_b_bf16 of a transposed B": lambda: pack_b_bf16(np.ascontiguousarray(KN.T).T, 16),
    "pack_blocked_weight": lambda: pack_blocked_weight(OIHW, 1, 16),
    "pack_rows_weight": lambda: pack_rows_weight(OIHW),
    "pack_conv_bf16": lambda: pack_conv_bf16(OIHW, 16, 16),
    "pack_row_taps": lambda: pack_row_taps(OIHW, 16),
    "weight_transform": lambda: weight_transform(OIHW, 4),
    "pack_panels in float16": lambda: pack_panels(weight_transform(OIHW, 2), 16, "float16"),
}


def _on_mapping(arr: np.ndarray) -> bool:
    base = arr
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)


@pytest.mark.parametrize("name", list(PACKERS))
def test_packers_write_the_same_bytes_on_a_mapping(name: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    in_numpy = PACKERS[name]()
    assert not _on_mapping(in_numpy)  # below MIN_MAPPED_BYTES: numpy's array
    monkeypatch.setattr(pack_memory, "MIN_MAPPED_BYTES", 1)
    mapped = PACKERS[name]()
    assert _on_mapping(mapped)
    assert mapped.dtype == in_numpy.dtype and mapped.shape == in_numpy.shape
    assert mapped.tobytes() == in_numpy.tobytes()


def test_arrays_from_min_mapped_bytes_on_are_mapped_zeros() -> None:
    shape = (pack_memory.MIN_MAPPED_BYTES // 4 // 8, 8)
    zeros = pack_memory.zeros(shape, np.float32)
    assert _on_mapping(zeros) and zeros.shape == shape and zeros.flags.c_contiguous
    assert not zeros.any()
    zeros[-1, -1] = 2.0  # writable, then read-only as a graph constant takes it
    zeros.flags.writeable = False
    assert zeros[-1, -1] == 2.0
    small = pack_memory.empty((shape[0] - 1, 8), np.float32)
    assert not _on_mapping(small) and small.shape == (shape[0] - 1, 8)


@pytest.mark.parametrize("name", list(PACKERS))
def test_packed_weights_start_64_byte_aligned(name: str) -> None:
    """Below MIN_MAPPED_BYTES too (numpy places data 16 bytes past 64 often): a library
    loaded by the compiling process reads its constants in place only at the constant
    pool's alignment (kiln.runtime.jit_constants)."""
    for _ in range(8):  # several allocations: numpy's places vary
        arr = PACKERS[name]()
        assert arr.ctypes.data % pack_memory.ALIGN == 0
        assert arr.flags.c_contiguous


@pytest.mark.parametrize("make", [pack_memory.empty, pack_memory.zeros])
@pytest.mark.parametrize("shape", [(3,), (5, 7), (2, 3, 4)])
def test_small_arrays_are_aligned_and_shaped(make: Callable[..., np.ndarray],
                                             shape: tuple[int, ...]) -> None:
    arr = make(shape, np.float16)
    assert arr.shape == shape and arr.dtype == np.float16 and arr.flags.writeable
    assert arr.ctypes.data % pack_memory.ALIGN == 0
    if make is pack_memory.zeros:
        assert not arr.any()
    arr[...] = 1  # writable in place
    assert arr.sum() == arr.size
