"""`matmul_packed_bf16`: a float32 product on bfloat16 weights (the target attribute
`precision=bf16`, kiln.target.precision).

The `block-matmuls` pass rewrites a float32 `matmul` by a constant B into
`matmul_packed_bf16(a, bp)` where the target asks for it: B rounded to bfloat16 (to
nearest, ties to even) and packed at compile time into int32 words of two bfloat16
values, the pairs `vdpbf16ps` multiplies, in panels `[ceil(N / nr)][KW][nr]` (`pack_b_bf16`;
attributes `n` and `k`, the real sizes). K is paired within blocks of `2 * PAIR_STRIDE`:
word `j` of block `q` holds `k = 2 * PAIR_STRIDE * q + j` in its low half and
`k + PAIR_STRIDE` in its high half, so the kernel pairs A's values from two contiguous
runs of a row (kiln.kernels.gemm.bf16); K is zero-padded to whole blocks.

The reference rounds A to bfloat16 as the kernel does and sums in float32; the te
compute (the fallback where the kernel is not built) reads the rounded weights and the
float32 A. Half the bytes of the float32 weights.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir.tensor import Const, PrimExpr, reinterpret, select
from kiln.ir.types import TensorType, Type
from kiln.ops import pack_memory, te
from kiln.ops.nn import matmul_compute, matmul_infer, matmul_ref
from kiln.ops.packed_attrs import checking_tile, recorded_tile
from kiln.ops.registry import OPS, OpDef

PACKED_BF16 = "matmul_packed_bf16"
#: The distance in K between the two values of one word (see the module docstring).
PAIR_STRIDE = 16
#: The K values of one block of words.
PAIR_BLOCK = 2 * PAIR_STRIDE
Attrs = Mapping[str, Any]


#: Elements `bf16_round` rounds at a time, and about those of one step of `pack_b_bf16`:
#: blocks whose temporaries stay in the cache (VGG-19's 123M weights at once took
#: several GB of uint64 temporaries).
ROUND_BLOCK = 1 << 18


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 `x` rounded to bfloat16 (nearest, ties to even; NaN stays a quiet NaN), as
    float32 values."""
    src = np.ascontiguousarray(x, dtype=np.float32)
    flat = src.reshape(-1)
    bits = flat.view(np.uint32)
    out = np.empty(flat.shape, dtype=np.uint32)
    for start in range(0, len(bits), ROUND_BLOCK):
        b, o = bits[start:start + ROUND_BLOCK], out[start:start + ROUND_BLOCK]
        # bits + 0x7FFF + lsb wraps around only for NaNs, which are replaced below
        np.right_shift(b, 16, out=o)
        o &= 1
        o += 0x7FFF
        o += b
        o &= 0xFFFF0000
        o[np.isnan(flat[start:start + ROUND_BLOCK])] = 0x7FC00000
    return out.view(np.float32).reshape(src.shape)


def padded_k(k: int) -> int:
    """K rounded up to whole blocks of `PAIR_BLOCK`."""
    return -(-k // PAIR_BLOCK) * PAIR_BLOCK


def pack_b_bf16(b: np.ndarray, nr: int) -> np.ndarray:
    """B `[K, N]` float32 -> int32 words `[ceil(N / nr)][padded_k(K) / 2][nr]` of bfloat16
    pairs (columns past N and rows past K zero); a fresh read-only array (a graph constant
    takes it without a copy)."""
    k, n = b.shape
    panels, kp = -(-n // nr), padded_k(k)
    out = pack_memory.empty((panels, kp // 2, nr), np.uint32)
    if b.T.flags.c_contiguous and not b.flags.c_contiguous:
        _pack_columns(b.T, out)
        out.flags.writeable = False
        return out.view(np.int32)
    # K in steps of whole pair blocks, each rounded and paired while in the cache
    step = max(1, ROUND_BLOCK // (panels * nr)) * PAIR_BLOCK
    for r0 in range(0, kp, step):
        r1 = min(r0 + step, kp)
        upper = np.zeros((r1 - r0, panels * nr), dtype=np.float32)
        if r0 < k:
            upper[:min(r1, k) - r0, :n] = bf16_round(b[r0:r1])
        bits = upper.view(np.uint32).reshape(-1, 2, PAIR_STRIDE, panels * nr)
        words = (bits[:, 0] >> 16) | bits[:, 1]  # [blocks][stride][N]: low half k, high k+16
        out[:, r0 // 2:r1 // 2] = words.reshape(-1, panels, nr).transpose(1, 0, 2)
    out.flags.writeable = False
    return out.view(np.int32)


def _pack_columns(bt: np.ndarray, out: np.ndarray) -> None:
    """`pack_b_bf16` of `bt.T` into `out`, for a B given as its transpose `bt` `[N][K]`
    (a Gemm's `transB` weight, row-major): each panel's `nr` rows of `bt` are contiguous,
    where `B`'s rows would be gathered column by column across the whole weight."""
    n, k = bt.shape
    panels, words, nr = out.shape
    kp = 2 * words
    step = max(1, ROUND_BLOCK // (nr * PAIR_BLOCK)) * PAIR_BLOCK
    for p in range(panels):
        n0, n1 = p * nr, min(p * nr + nr, n)
        for r0 in range(0, kp, step):
            r1 = min(r0 + step, kp)
            upper = np.zeros((nr, r1 - r0), dtype=np.float32)
            if r0 < k:
                upper[:n1 - n0, :min(r1, k) - r0] = bf16_round(bt[n0:n1, r0:r1])
            bits = upper.view(np.uint32).reshape(nr, -1, 2, PAIR_STRIDE)
            pairs = (bits[:, :, 0] >> 16) | bits[:, :, 1]  # [nr][blocks][stride]
            out[p, r0 // 2:r1 // 2] = pairs.reshape(nr, -1).T


def unpack_b_bf16(bp: np.ndarray, k: int, n: int) -> np.ndarray:
    """`pack_b_bf16` undone: the bfloat16 weights `[k, n]` as float32."""
    panels, kw, nr = bp.shape
    words = np.ascontiguousarray(bp.transpose(1, 0, 2)).view(np.uint32).reshape(
        kw // PAIR_STRIDE, PAIR_STRIDE, panels * nr)
    halves = np.stack([words << 16, words & 0xFFFF0000], axis=1)
    return halves.reshape(kw * 2, panels * nr).view(np.float32)[:k, :n].copy()


def packed_bf16_kn(types: Sequence[Any], attrs: Attrs) -> tuple[int, int]:
    """(K, N) of a `matmul_packed_bf16` call (checked)."""
    a = tuple(types[0].shape)
    bp = tuple(int(d) for d in types[1].shape)
    n, k = int(attrs["n"]), int(attrs["k"])
    if (len(bp) != 3 or not (bp[0] - 1) * bp[2] < n <= bp[0] * bp[2]
            or bp[1] != padded_k(k) // 2 or types[1].dtype != "int32"):
        raise IRError(f"{PACKED_BF16}: packed B must be int32 [panels][{padded_k(k) // 2}]"
                      f"[nr] holding {n} columns, got {types[1].dtype} {bp}")
    if not a or a[-1] != k:
        raise IRError(f"{PACKED_BF16}: inner dimensions differ: {a} @ [{k}, {n}]")
    tile = recorded_tile(attrs, 2, PACKED_BF16)
    if tile is not None and tile[1] != bp[2]:
        raise IRError(f"{PACKED_BF16}: tile {tile} does not match the panels' width {bp[2]}")
    return k, n


def _infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    k, n = packed_bf16_kn(types, attrs)
    return matmul_infer([types[0], TensorType((k, n), "float32")], {})


def _compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    k, n = packed_bf16_kn(inputs, attrs)
    bp = inputs[1]
    nr = bp.shape[2]

    def element(kk: PrimExpr, j: PrimExpr) -> PrimExpr:
        q, r = kk // PAIR_BLOCK, kk % PAIR_BLOCK
        word = bp[j // nr, q * PAIR_STRIDE + r % PAIR_STRIDE, j % nr]
        high = r >= PAIR_STRIDE
        bits = select(high, word & Const(-0x10000, "int32"), word << Const(16, "int32"))
        return reinterpret(bits, "float32")

    return matmul_compute([inputs[0], te.compute((k, n), element, "float32", "b")], {})


def _ref(a: np.ndarray, bp: np.ndarray, **attrs: Any) -> np.ndarray:
    k, n = int(attrs["k"]), int(attrs["n"])
    return matmul_ref(bf16_round(a), unpack_b_bf16(bp, k, n))


OPS.register(PACKED_BF16, OpDef(PACKED_BF16, "anchor", _infer, _compute, _ref))


def _tiled_ref(a: np.ndarray, b: np.ndarray, **attrs: Any) -> np.ndarray:
    return matmul_ref(bf16_round(a), bf16_round(b), **attrs)


#: `matmul_tiled_bf16(a, b)`: `matmul` of two float32 activations (attention's Q @ K^T
#: and P @ V) summed in float32 over bfloat16 values (both operands rounded to nearest,
#: ties to even, as kiln.kernels.gemm.bf16 converts them per call); attributes
#: `transpose_b` and `tile` = (mr, nr) as `matmul_tiled`'s. The te compute (the fallback)
#: is the float32 product.
TILED_BF16 = "matmul_tiled_bf16"
OPS.register(TILED_BF16, OpDef(TILED_BF16, "anchor", checking_tile(matmul_infer, TILED_BF16, 2),
                               matmul_compute, _tiled_ref))
