"""`matmul_nbits`: a float32 product by block-quantized 4- or 8-bit weights, kept packed
(com.microsoft `MatMulNBits`' layout, kiln.frontend.onnx.converters.contrib_llm).

`matmul_nbits(a, b, scales[, zero_points])`, attributes `k`, `n`, `bits` (4 or 8) and
`block` (a power of two, 16 to 256):

- `a`: float32 `[..., K]`;
- `b`: uint8 `[N, blocks, block * bits / 8]` with `blocks = ceil(K / block)`: column `n`'s
  codes along K, `8 / bits` a byte, low bits first (byte `j` of a 4-bit block holds
  `k = 2j` in its low nibble and `k = 2j + 1` in its high one), the last block padded;
- `scales`: float32 `[N, blocks]`; `zero_points`: float32 `[N, blocks]`, or absent for
  the symmetric default `2^(bits - 1)`.

The weight is `W[k, n] = (code - zero_point) * scale` of `k`'s block, and the result
`a @ W`: the weights stay in their packed bytes (a quarter of float32's at 4 bits, plus
the scales) and the kernel (kiln.kernels.gemm.nbits) unpacks them as it goes. The te
compute (the portable lowering) and the reference dequantize elementwise.

An optional attribute `accuracy_level` is MatMulNBits' (how far A may be quantized):
at 4 (`A_INT8_LEVEL`) a kernel may quantize A to int8 per block, as onnxruntime does
(kiln.kernels.gemm.nbits_int8); the te compute and the reference stay float32.

`matmul_nbits_packed(a, bp, scales[, zero_points])` is the same product on the operands
the `nbits` kernel family repacks at compile time (`pack_nbits`): panels of `nr` columns,
each byte of the panel's columns contiguous, so the kernel loads `nr` columns' codes with
one vector load and broadcasts A. With the attribute `words` (`pack_nbits_words`, 4-bit
codes at accuracy level 4) `bp` is int32 `[panels, blocks, block / 8, nr]` instead: each
word holds 8 codes of one column, in the order the int8 dot products of A's words take
them (`word_code_k`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir.tensor import Cast, Const, PrimExpr
from kiln.ir.types import TensorType, Type
from kiln.ops import te
from kiln.ops.nn import matmul_compute, matmul_infer, matmul_ref
from kiln.ops.packed_attrs import recorded_tile
from kiln.ops.registry import OPS, OpDef

MATMUL_NBITS = "matmul_nbits"
#: MatMulNBits' accuracy_level at which A may be quantized to int8 per block.
A_INT8_LEVEL = 4
#: The packed op's attribute: B in words of 8 codes (`pack_nbits_words`).
WORDS = "words"
#: The widths of the codes the op takes.
NBITS_WIDTHS = (4, 8)
Attrs = Mapping[str, Any]


def nbits_layout(attrs: Attrs) -> tuple[int, int, int, int, int, int]:
    """(K, N, bits, block, blocks, bytes a block) of a call's attributes (checked)."""
    k, n = int(attrs["k"]), int(attrs["n"])
    bits, block = int(attrs["bits"]), int(attrs["block"])
    if bits not in NBITS_WIDTHS:
        raise IRError(f"{MATMUL_NBITS}: bits {bits}; it takes {NBITS_WIDTHS}")
    if not 16 <= block <= 256 or block & (block - 1):
        raise IRError(f"{MATMUL_NBITS}: block {block} must be a power of two in [16, 256]")
    if k < 1 or n < 1:
        raise IRError(f"{MATMUL_NBITS}: K {k} and N {n} must be positive")
    blocks = -(-k // block)
    return k, n, bits, block, blocks, block * bits // 8


def _check(types: Sequence[Any], attrs: Attrs) -> tuple[int, int]:
    """(K, N) of a call, its operands' types checked against the attributes."""
    k, n, _, _, blocks, blob = nbits_layout(attrs)
    return _check_operands(MATMUL_NBITS, types, k, n, (n, blocks, blob), (n, blocks))


def _check_operands(op: str, types: Sequence[Any], k: int, n: int, b_shape: tuple[int, ...],
                    block_shape: tuple[int, ...], b_type: str = "uint8") -> tuple[int, int]:
    """(K, N), after checking `op`'s operands: B `b_type` of `b_shape`, scales and zero
    points float32 of `block_shape`, A float32 `[..., K]`."""
    if len(types) not in (3, 4):
        raise IRError(f"{op}: takes a, b, scales and optional zero_points, got "
                      f"{len(types)} operands")
    want = [("b", b_type, b_shape), ("scales", "float32", block_shape),
            ("zero_points", "float32", block_shape)]
    for t, (what, dtype, shape) in zip(types[1:], want):
        if t.dtype != dtype or tuple(t.shape) != shape:
            raise IRError(f"{op}: {what} must be {dtype} {list(shape)}, got "
                          f"{t.dtype} {list(t.shape)}")
    a = types[0]
    if a.dtype != "float32" or not a.shape or a.shape[-1] != k:
        raise IRError(f"{op}: A must be float32 [..., {k}], got {a.dtype} {list(a.shape)}")
    return k, n


def _infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    k, n = _check(types, attrs)
    return matmul_infer([types[0], TensorType((k, n), "float32")], {})


def code_at(b: Any, n: PrimExpr, kk: PrimExpr, bits: int, block: int) -> PrimExpr:
    """The int32 code of column `n` at row `kk` of packed `b` (a te tensor or a buffer)."""
    per_byte = 8 // bits
    j = kk % block
    byte = Cast("int32", b[n, kk // block, j // per_byte])
    if per_byte == 1:
        return byte
    shift = (j % per_byte) * bits
    return (byte >> Cast("int32", shift)) & Const((1 << bits) - 1, "int32")


def _compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    k, n = _check(inputs, attrs)
    _, _, bits, block, _, _ = nbits_layout(attrs)
    b, scales = inputs[1], inputs[2]
    zps = inputs[3] if len(inputs) > 3 else None

    def element(kk: PrimExpr, j: PrimExpr) -> PrimExpr:
        blk = kk // block
        zp: PrimExpr = zps[j, blk] if zps is not None else Const(float(1 << (bits - 1)),
                                                                 "float32")
        return (Cast("float32", code_at(b, j, kk, bits, block)) - zp) * scales[j, blk]

    weight = te.compute((k, n), element, "float32", "w")
    return matmul_compute([inputs[0], weight], {})


def unpack_codes(b: np.ndarray, bits: int, k: int) -> np.ndarray:
    """The codes of packed `b` (`[N, blocks, blob]`) as int32 `[N, k]`."""
    per_byte = 8 // bits
    shifts = np.arange(per_byte, dtype=np.uint8) * bits
    codes = (b.reshape(b.shape[0], -1)[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return codes.reshape(b.shape[0], -1)[:, :k].astype(np.int32)


def dequantized(b: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None,
                attrs: Attrs) -> np.ndarray:
    """The float32 weight `[K, N]` the packed operands hold."""
    k, _, bits, block, _, _ = nbits_layout(attrs)
    at = np.arange(k) // block
    codes = unpack_codes(b, bits, k).astype(np.float32)
    zp = (zero_points[:, at] if zero_points is not None
          else np.float32(1 << (bits - 1)))
    return np.ascontiguousarray(((codes - zp) * scales[:, at]).T.astype(np.float32))


def _ref(a: np.ndarray, b: np.ndarray, scales: np.ndarray,
         zero_points: np.ndarray | None = None, **attrs: Any) -> np.ndarray:
    return matmul_ref(a, dequantized(b, scales, zero_points, attrs))


OPS.register(MATMUL_NBITS, OpDef(MATMUL_NBITS, "anchor", _infer, _compute, _ref))


# ------------------------------------------------------------- the kernel's packed form

#: The packed op the `nbits` kernel family rewrites `matmul_nbits` into at compile time.
PACKED_NBITS = "matmul_nbits_packed"


def _panels(x: np.ndarray, nr: int) -> np.ndarray:
    """`x` (`[N, ...]`) in panels of `nr` columns: `[ceil(N / nr), ..., nr]`, the columns
    past N zero."""
    n = x.shape[0]
    panels = -(-n // nr)
    padded = np.zeros((panels * nr, *x.shape[1:]), x.dtype)
    padded[:n] = x
    moved = padded.reshape(panels, nr, *x.shape[1:])
    return np.ascontiguousarray(np.moveaxis(moved, 1, -1))


def pack_nbits(b: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None,
               nr: int) -> list[np.ndarray]:
    """`matmul_nbits`' constant operands in `matmul_nbits_packed`'s panels of `nr`
    columns: `b` `[N, blocks, blob]` -> `[panels, blocks, blob, nr]` (one byte of `nr`
    columns contiguous: a vector load), scales and zero points `[N, blocks]` ->
    `[panels, blocks, nr]`; columns past N have zero codes, scales and zero points."""
    out = [_panels(b, nr), _panels(scales, nr)]
    return out + ([_panels(zero_points, nr)] if zero_points is not None else [])


def word_code_k(block: int) -> np.ndarray:
    """`[block / 8, 4, 2]`: the k within a block of the code in word `j`, byte `i`,
    nibble `h` (0 low, 1 high) of `pack_nbits_words`' layout. A's int8 words hold
    `k = g + i * block / 4` in byte `i` of word `g` (so they are packed from contiguous
    vectors of A); a B word's low nibbles pair with A's word `j`, its high ones with word
    `j + block / 8`, so one mask (low) or shift and mask (high) makes 4 bytes of codes."""
    quarter, eighth = block // 4, block // 8
    j, i, h = np.meshgrid(np.arange(eighth), np.arange(4), np.arange(2), indexing="ij")
    return np.asarray(j + h * eighth + i * quarter)


def pack_nbits_words(b: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None,
                     nr: int) -> list[np.ndarray]:
    """4-bit `matmul_nbits` operands in panels of `nr` columns with B as int32 words of 8
    codes (`[panels, blocks, block / 8, nr]`, `word_code_k`'s order); scales and zero
    points as `pack_nbits`'."""
    n, blocks, blob = b.shape
    block = 2 * blob
    codes = ((b[..., None] >> np.array([0, 4], np.uint8)) & np.uint8(15)).reshape(
        n, blocks, block).astype(np.uint32)
    at = codes[..., word_code_k(block)]  # [n, blocks, block / 8, 4, 2]
    byte = at[..., 0] | (at[..., 1] << 4)
    words = np.zeros((n, blocks, block // 8), np.uint32)
    for i in range(4):
        words |= byte[..., i] << np.uint32(8 * i)
    out = [_panels(words.view(np.int32), nr), _panels(scales, nr)]
    return out + ([_panels(zero_points, nr)] if zero_points is not None else [])


def _words_codes(words: np.ndarray, block: int) -> np.ndarray:
    """`pack_nbits_words`' words (`[N, blocks, block / 8]`) back to MatMulNBits' bytes."""
    n, blocks, _ = words.shape
    u = words.view(np.uint32)
    codes = np.zeros((n, blocks, block), np.uint8)
    where = word_code_k(block)
    for i in range(4):
        for h in range(2):
            codes[..., where[:, i, h]] = (u >> np.uint32(8 * i + 4 * h)) & np.uint32(15)
    pairs = codes.reshape(n, blocks, block // 2, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)


def _unpanel(x: np.ndarray, n: int) -> np.ndarray:
    """`_panels` undone."""
    moved = np.moveaxis(x, -1, 1)
    return moved.reshape(-1, *moved.shape[2:])[:n]


def _check_packed(types: Sequence[Any], attrs: Attrs) -> tuple[int, int]:
    """(K, N) of a packed call, its operands checked."""
    k, n, bits, block, blocks, blob = nbits_layout(attrs)
    bp = tuple(types[1].shape) if len(types) > 1 else ()
    nr = int(bp[-1]) if len(bp) == 4 and isinstance(bp[-1], int) and bp[-1] > 0 else 1
    panels = -(-n // nr)  # (a malformed bp: the shape of nr 1 that it fails against)
    b_type = "uint8"
    if attrs.get(WORDS):
        if bits != 4:
            raise IRError(f"{PACKED_NBITS}: words of codes hold 4-bit codes, not {bits}")
        b_type, blob = "int32", block // 8
    return _check_operands(PACKED_NBITS, types, k, n, (panels, blocks, blob, nr),
                           (panels, blocks, nr), b_type)


def _infer_packed(types: Sequence[TensorType], attrs: Attrs) -> Type:
    k, n = _check_packed(types, attrs)
    tile = recorded_tile(attrs, 2, PACKED_NBITS)
    if tile is not None and tile[1] != types[1].shape[-1]:
        raise IRError(f"{PACKED_NBITS}: tile {tile} does not match the panels' width "
                      f"{types[1].shape[-1]}")
    return matmul_infer([types[0], TensorType((k, n), "float32")], {})


def word_code(bp: Any, p: PrimExpr, blk: PrimExpr, within: PrimExpr, v: PrimExpr,
              block: int) -> PrimExpr:
    """The int32 code of row `within` of block `blk`, column `v` of panel `p` in
    `pack_nbits_words`' words `bp` (`word_code_k` inverted)."""
    quarter, eighth = block // 4, block // 8
    g = within % quarter
    shift = (within // quarter) * 8 + (g // eighth) * 4
    return (bp[p, blk, g % eighth, v] >> Cast("int32", shift)) & Const(15, "int32")


def _compute_packed(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    k, n = _check_packed(inputs, attrs)
    _, _, bits, block, _, _ = nbits_layout(attrs)
    per_byte = 8 // bits
    bp, sp = inputs[1], inputs[2]
    zps = inputs[3] if len(inputs) > 3 else None
    nr = int(bp.shape[-1])

    words = bool(attrs.get(WORDS))

    def element(kk: PrimExpr, j: PrimExpr) -> PrimExpr:
        p, v, blk = j // nr, j % nr, kk // block
        if words:
            code = word_code(bp, p, blk, kk % block, v, block)
        else:
            byte = Cast("int32", bp[p, blk, (kk % block) // per_byte, v])
            code = byte if per_byte == 1 else (
                (byte >> Cast("int32", (kk % per_byte) * bits))
                & Const((1 << bits) - 1, "int32"))
        zp: PrimExpr = zps[p, blk, v] if zps is not None else Const(
            float(1 << (bits - 1)), "float32")
        return (Cast("float32", code) - zp) * sp[p, blk, v]

    weight = te.compute((k, n), element, "float32", "w")
    return matmul_compute([inputs[0], weight], {})


def _ref_packed(a: np.ndarray, bp: np.ndarray, sp: np.ndarray, zp: np.ndarray | None = None,
                **attrs: Any) -> np.ndarray:
    n = int(attrs["n"])
    zero_points = _unpanel(zp, n) if zp is not None else None
    b = _unpanel(bp, n)
    if attrs.get(WORDS):
        b = _words_codes(b, int(attrs["block"]))
    return matmul_ref(a, dequantized(b, _unpanel(sp, n), zero_points, attrs))


OPS.register(PACKED_NBITS, OpDef(PACKED_NBITS, "anchor", _infer_packed, _compute_packed,
                                 _ref_packed))
