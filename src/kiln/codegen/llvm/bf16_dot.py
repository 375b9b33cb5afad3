"""The `dot2_bf16` intrinsic (kiln.ir.tensor) as AVX512-BF16 `vdpbf16ps`, or float32
arithmetic; `bf16_pair`, the words it reads, as `vcvtne2ps2bf16`, or integer arithmetic.

`dot2_bf16(acc, a, b)` adds to each float32 lane of `acc` the two products of the
bfloat16 halves of the int32 words `a` and `b`. Where the target has AVX512-BF16
(`bf16_dot_lanes`), a vector of it is one `llvm.x86.avx512bf16.dpbf16ps.512` per 16
lanes (the words passed as `<16 x i32>`: LLVM's bitcode upgrade reads them as its
`<32 x bfloat>`); elsewhere, and on scalars, each half is widened exactly (its bits
the upper half of a float32) and the products added high half first, as the
instruction does. The instruction flushes subnormal inputs and results to zero, the
float32 form does not: the two differ on values below 2^-126 only.

`bf16_pair(lo, hi)` on AVX512-BF16 is one `llvm.x86.avx512bf16.cvtne2ps2bf16.512` per
16 lanes (its 32 bfloat16 results, `lo`'s then `hi`'s, interleaved by one word
permute); a vector of fewer lanes that divide 16 (the 8-lane word rows of half blocks,
kiln.ops.conv_bf16 `word_block`) is widened to 16 lanes for one such instruction, its
words the first of the permute's. Elsewhere, and on scalars or vectors of other widths,
the rounding in int32 arithmetic (the bits plus 0x7FFF plus the lowest kept bit, a NaN
0x7FC0), two instructions per 16 words against about fourteen.
"""

from __future__ import annotations

from collections.abc import Sequence

from llvmlite import ir

from kiln.codegen.llvm.decls import intrinsic
from kiln.codegen.llvm.vector_constants import lanes_mask, splat, undef
from kiln.target.isa import ISA

I32, F32 = ir.IntType(32), ir.FloatType()
#: The lanes of one `vdpbf16ps` on zmm registers.
ZMM_LANES = 16


def bf16_dot_lanes(isa: ISA) -> int:
    """The lanes of the target's bfloat16 dot-product instruction (0: none)."""
    return ZMM_LANES if isa.has("avx512bf16") and isa.vector_bits >= 512 else 0


def _halves(b: ir.IRBuilder, word: ir.Value) -> tuple[ir.Value, ir.Value]:
    """The high and low bfloat16 of `<n x i32>` words, as `<n x float>`."""
    n = word.type.count
    ft = ir.VectorType(F32, n)
    hi = b.bitcast(b.and_(word, splat(I32, n, -0x10000)), ft)
    lo = b.bitcast(b.shl(word, splat(I32, n, 16)), ft)
    return hi, lo


def _portable(b: ir.IRBuilder, acc: ir.Value, a: ir.Value, w: ir.Value) -> ir.Value:
    (ah, al), (wh, wl) = _halves(b, a), _halves(b, w)
    return b.fadd(b.fadd(acc, b.fmul(ah, wh)), b.fmul(al, wl))


def _slice(b: ir.IRBuilder, v: ir.Value, start: int, count: int) -> ir.Value:
    return b.shuffle_vector(v, undef(v.type), lanes_mask(start, count, v.type.count))


def _concat(b: ir.IRBuilder, parts: list[ir.Value], n: int) -> ir.Value:
    """The first `n` lanes of `parts` end to end."""
    while len(parts) > 1:
        if len(parts) % 2:
            parts.append(undef(parts[0].type))
        width = parts[0].type.count
        mask = lanes_mask(0, 2 * width, 2 * width)
        parts = [b.shuffle_vector(parts[i], parts[i + 1], mask)
                 for i in range(0, len(parts), 2)]
    whole = parts[0]
    return whole if whole.type.count == n else _slice(b, whole, 0, n)


def _rounded_upper(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """int32 (vector) whose upper half is float32 `x` rounded to bfloat16 (nearest, ties
    to even; a NaN 0x7FC0)."""
    n = x.type.count if isinstance(x.type, ir.VectorType) else 0

    def const(value: int) -> ir.Constant:
        return splat(I32, n, value) if n else ir.Constant(I32, value)

    bits = b.bitcast(x, ir.VectorType(I32, n) if n else I32)
    lowest_kept = b.and_(b.lshr(bits, const(16)), const(1))
    rounded = b.add(b.add(bits, const(0x7FFF)), lowest_kept)
    return b.select(b.fcmp_unordered("uno", x, x), const(0x7FC00000), rounded)


def emit_bf16_pair(b: ir.IRBuilder, mod: ir.Module, lanes: int,
                   args: Sequence[ir.Value]) -> ir.Value:
    """`bf16_pair(lo, hi)` on float32 scalars or `<n x float>` vectors; `lanes`: the
    target's bfloat16 instruction lanes (`bf16_dot_lanes`; 0: the integer form)."""
    lo, hi = args
    n = lo.type.count if isinstance(lo.type, ir.VectorType) else 0
    if lanes == ZMM_LANES and 1 < n < lanes and lanes % n == 0:
        return _narrow_pair(b, mod, lanes, lo, hi)
    if lanes != ZMM_LANES or not n or n % lanes:
        upper_lo, upper_hi = _rounded_upper(b, lo), _rounded_upper(b, hi)
        low = b.lshr(upper_lo, splat(I32, n, 16) if n else ir.Constant(I32, 16))
        high = b.and_(upper_hi, splat(I32, n, -0x10000) if n else ir.Constant(I32, -0x10000))
        return b.or_(low, high)
    ft, ht = ir.VectorType(F32, lanes), ir.VectorType(ir.IntType(16), 2 * lanes)
    fn = intrinsic(mod, "llvm.x86.avx512bf16.cvtne2ps2bf16.512", ht, [ft, ft])
    interleave = ir.Constant(ir.VectorType(I32, 2 * lanes),
                             [j // 2 + (lanes if j % 2 else 0) for j in range(2 * lanes)])
    parts = []
    for c in range(0, n, lanes):
        halves = b.call(fn, [_slice(b, hi, c, lanes), _slice(b, lo, c, lanes)])
        words = b.shuffle_vector(halves, undef(ht), interleave)
        parts.append(b.bitcast(words, ir.VectorType(I32, lanes)))
    return _concat(b, parts, n)


def _narrow_pair(b: ir.IRBuilder, mod: ir.Module, lanes: int, lo: ir.Value,
                 hi: ir.Value) -> ir.Value:
    """`bf16_pair` of `<n x float>` vectors, `n` a divisor of `lanes`: both widened to
    `lanes` (the lanes past `n` undefined: a half of a 16-lane vector stays in place),
    one `vcvtne2ps2bf16`, the first `n` words kept."""
    n = lo.type.count
    ft, ht = ir.VectorType(F32, lanes), ir.VectorType(ir.IntType(16), 2 * lanes)
    fn = intrinsic(mod, "llvm.x86.avx512bf16.cvtne2ps2bf16.512", ht, [ft, ft])
    widen = lanes_mask(0, lanes, n)
    wide = [b.shuffle_vector(v, undef(v.type), widen) for v in (hi, lo)]
    halves = b.call(fn, wide)
    keep = ir.Constant(ir.VectorType(I32, 2 * n),
                       [j // 2 + (lanes if j % 2 else 0) for j in range(2 * n)])
    words = b.shuffle_vector(halves, undef(ht), keep)
    return b.bitcast(words, ir.VectorType(I32, n))


def emit_dot2_bf16(b: ir.IRBuilder, mod: ir.Module, lanes: int,
                   args: Sequence[ir.Value]) -> ir.Value:
    """`dot2_bf16(acc, a, b)` on scalars or `<n x float>` / `<n x i32>` vectors (any n);
    `lanes`: the instruction's (`bf16_dot_lanes`; 0: the float32 form)."""
    acc, a, w = args
    if not isinstance(acc.type, ir.VectorType):
        one = [b.insert_element(ir.Constant(ir.VectorType(v.type, 1), ir.Undefined), v,
                                ir.Constant(I32, 0)) for v in (acc, a, w)]
        return b.extract_element(_portable(b, *one), ir.Constant(I32, 0))
    n = acc.type.count
    if lanes != ZMM_LANES or n < lanes // 2:
        return _portable(b, acc, a, w)
    name = "llvm.x86.avx512bf16.dpbf16ps.512"
    ft, it = ir.VectorType(F32, lanes), ir.VectorType(I32, lanes)
    fn = intrinsic(mod, name, ft, [ft, it, it])
    parts = [b.call(fn, [_slice(b, v, c, lanes) for v in (acc, a, w)])
             for c in range(0, n, lanes)]
    return _concat(b, parts, n)
