"""The `dot4_u8s8` intrinsic (kiln.ir.tensor) as the target's integer dot products.

`dot4_u8s8(acc, a, b)` adds to each int32 lane of `acc` the four products of `a`'s
bytes (unsigned) and `b`'s (signed). The instruction family comes from the target's
ISA (`kiln.target.isa.ISA.int8_dot`, recorded in `MathContext.int8_dot`), never from
the host:

- "avx512vnni" / "avxvnni": `vpdpbusd` on zmm / ymm (`llvm.x86.avx512.vpdpbusd.512`,
  `.256`), exactly the intrinsic;
- "avx512bw" / "avx2": `vpmaddwd` on int16 halves. `vpmaddubsw` would add two u8 x s8
  products into a *saturating* int16 (255 * -128 * 2 does not fit), so each word's
  even bytes and odd bytes are widened to int16 in place (A's zero-extended by a mask
  and a shift, the weights' sign-extended by two shifts and one) and `vpmaddwd` adds
  each lane's two int16 products into int32, exactly (|255 * -128 * 2| < 2^31). Two
  `vpmaddwd` and two adds per accumulator and word; the widening is done once per
  register (the tile's rows share its B row, its columns the broadcast A word), so
  it costs half the multiplies of splitting A's bytes for `vpmaddubsw`;
- "i8mm": AArch64 `usdot` (u8 x s8), exactly the intrinsic;
- "sdot": AArch64 `sdot` (s8 x s8): `a`'s bytes shifted to signed (`a ^ 0x80` is
  `a - 128`), then `128 * sum(b)` added back (a second `sdot` with bytes of 1);
- anything else (and big-endian targets): bytes by shifts, multiplied and added.

A scalar `dot4_u8s8` (outside a vector loop) is computed the portable way.

`dot4_u8s8_sat16` (onnxruntime's AVX2 arithmetic: each pair of products summed into a
saturating int16) is `vpmaddubsw` then `vpmaddwd` by ones and an add on every x86
family above (ymm, or zmm where the family has 512-bit registers), and elsewhere the
portable bytes with each pair sum clamped to [-32768, 32767]: the same result on every
target.

`dot2_i16(acc, a, b)` (two signed int16 halves a word) is one `vpmaddwd` and an add on
every x86 family above (`llvm.x86.avx2.pmadd.wd`, `llvm.x86.avx512.pmaddw.d.512` where
the family has 512-bit registers): `vpmaddwd`'s one wrapping sum (-32768 * -32768
twice) wraps as the IR's int32 does. Elsewhere: halves by shifts, multiplied and added.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llvmlite import ir

from kiln.codegen.llvm.decls import intrinsic
from kiln.codegen.llvm.vector_constants import lanes_mask, splat, undef

I8, I16, I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)

Lowering = Callable[[ir.IRBuilder, ir.Module, ir.Value, ir.Value, ir.Value], ir.Value]


def _vec(ty: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(ty, n)


def _bytes(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """`<n x i32>` as `<4n x i8>` (byte 0 of each lane first: little-endian targets)."""
    return b.bitcast(v, _vec(I8, 4 * v.type.count))


def _call(b: ir.IRBuilder, mod: ir.Module, name: str, ret: ir.Type,
          args: Sequence[ir.Value]) -> ir.Value:
    fn = intrinsic(mod, name, ret, [a.type for a in args])
    return b.call(fn, list(args))


def _vnni(b: ir.IRBuilder, mod: ir.Module, acc: ir.Value, a: ir.Value,
          w: ir.Value) -> ir.Value:
    n = acc.type.count
    return _call(b, mod, f"llvm.x86.avx512.vpdpbusd.{32 * n}", acc.type, (acc, a, w))


def _madd_pairs(b: ir.IRBuilder, mod: ir.Module, acc: ir.Value, a: ir.Value,
                w: ir.Value) -> ir.Value:
    n = acc.type.count
    madd = "llvm.x86.avx512.pmaddw.d.512" if n == 16 else "llvm.x86.avx2.pmadd.wd"
    # each 16-bit half of a word holds bytes (2i, 2i + 1): widen its even byte and its
    # odd byte to int16 in place (A's zero-extended, the weights' sign-extended), then
    # `vpmaddwd` adds each lane's two int16 products exactly into int32. A and B are
    # widened once per register, not per product: the tile's rows share the B row and
    # its columns the broadcast A word (the compiler finds the common subexpressions)
    halves = _vec(I16, 2 * n)
    eight = splat(I16, 2 * n, 8)
    a16, w16 = b.bitcast(a, halves), b.bitcast(w, halves)
    a_even, a_odd = b.and_(a16, splat(I16, 2 * n, 0xFF)), b.lshr(a16, eight)
    w_even, w_odd = b.ashr(b.shl(w16, eight), eight), b.ashr(w16, eight)
    even = _call(b, mod, madd, acc.type, (a_even, w_even))
    odd = _call(b, mod, madd, acc.type, (a_odd, w_odd))
    return b.add(acc, b.add(even, odd))


def _maddubs(b: ir.IRBuilder, mod: ir.Module, acc: ir.Value, a: ir.Value,
             w: ir.Value) -> ir.Value:
    # vpmaddubsw: u8 x s8 products added in pairs into saturating int16; vpmaddwd by
    # ones: the two pair sums of each int32 lane added exactly
    n = acc.type.count
    ubs, madd = (("llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512")
                 if n == 16 else ("llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd"))
    pairs = _call(b, mod, ubs, _vec(I16, 2 * n), (_bytes(b, a), _bytes(b, w)))
    return b.add(acc, _call(b, mod, madd, acc.type, (pairs, splat(I16, 2 * n, 1))))


def _madd_halves(b: ir.IRBuilder, mod: ir.Module, acc: ir.Value, a: ir.Value,
                 w: ir.Value) -> ir.Value:
    n = acc.type.count
    madd = "llvm.x86.avx512.pmaddw.d.512" if n == 16 else "llvm.x86.avx2.pmadd.wd"
    halves = _vec(I16, 2 * n)
    return b.add(acc, _call(b, mod, madd, acc.type,
                            (b.bitcast(a, halves), b.bitcast(w, halves))))


def _usdot(b: ir.IRBuilder, mod: ir.Module, acc: ir.Value, a: ir.Value,
           w: ir.Value) -> ir.Value:
    return _call(b, mod, "llvm.aarch64.neon.usdot.v4i32.v16i8", acc.type,
                 (acc, _bytes(b, a), _bytes(b, w)))


def _sdot(b: ir.IRBuilder, mod: ir.Module, acc: ir.Value, a: ir.Value,
          w: ir.Value) -> ir.Value:
    name = "llvm.aarch64.neon.sdot.v4i32.v16i8"
    signed = b.xor(a, splat(I32, 4, -0x7F7F7F80))  # 0x80808080: a - 128 per byte
    wb = _bytes(b, w)
    dot = _call(b, mod, name, acc.type, (acc, _bytes(b, signed), wb))
    sums = _call(b, mod, name, acc.type, (splat(I32, 4, 0), splat(I8, 16, 1), wb))
    return b.add(dot, b.shl(sums, splat(I32, 4, 7)))


def _portable(b: ir.IRBuilder, mod: ir.Module, acc: ir.Value, a: ir.Value,
              w: ir.Value) -> ir.Value:
    # bytes by shifts, not a bitcast: right on big-endian targets too
    n = acc.type.count
    total = acc
    for byte in range(4):
        x = b.and_(b.lshr(a, splat(I32, n, 8 * byte)), splat(I32, n, 0xFF))
        y = b.ashr(b.shl(w, splat(I32, n, 24 - 8 * byte)), splat(I32, n, 24))
        total = b.add(total, b.mul(x, y))
    return total


def _portable_sat16(b: ir.IRBuilder, mod: ir.Module, acc: ir.Value, a: ir.Value,
                    w: ir.Value) -> ir.Value:
    n = acc.type.count
    total = acc
    for pair in (0, 2):
        s: ir.Value = splat(I32, n, 0)
        for byte in (pair, pair + 1):
            x = b.and_(b.lshr(a, splat(I32, n, 8 * byte)), splat(I32, n, 0xFF))
            y = b.ashr(b.shl(w, splat(I32, n, 24 - 8 * byte)), splat(I32, n, 24))
            s = b.add(s, b.mul(x, y))
        lo, hi = splat(I32, n, -32768), splat(I32, n, 32767)
        s = b.select(b.icmp_signed("<", s, lo), lo, s)
        s = b.select(b.icmp_signed(">", s, hi), hi, s)
        total = b.add(total, s)
    return total


def _portable_i16(b: ir.IRBuilder, mod: ir.Module, acc: ir.Value, a: ir.Value,
                  w: ir.Value) -> ir.Value:
    n = acc.type.count
    total = acc
    for half in (0, 1):
        x, y = (b.ashr(b.shl(v, splat(I32, n, 16 - 16 * half)), splat(I32, n, 16))
                for v in (a, w))
        total = b.add(total, b.mul(x, y))
    return total


# family -> (lanes of one instruction, lowering)
_FAMILIES: dict[str, tuple[int, Lowering]] = {
    "avx512vnni": (16, _vnni), "avxvnni": (8, _vnni),
    "avx512bw": (16, _madd_pairs), "avx2": (8, _madd_pairs),
    "i8mm": (4, _usdot), "sdot": (4, _sdot),
}
# family -> (lanes, lowering) of `dot4_u8s8_sat16`
_SAT16_FAMILIES: dict[str, tuple[int, Lowering]] = {
    "avx512vnni": (16, _maddubs), "avxvnni": (8, _maddubs),
    "avx512bw": (16, _maddubs), "avx2": (8, _maddubs),
}


# family -> (lanes, lowering) of `dot2_i16`
_I16_FAMILIES: dict[str, tuple[int, Lowering]] = {
    "avx512vnni": (16, _madd_halves), "avxvnni": (8, _madd_halves),
    "avx512bw": (16, _madd_halves), "avx2": (8, _madd_halves),
}


def emit_dot4_u8s8(b: ir.IRBuilder, mod: ir.Module, family: str | None,
                   args: Sequence[ir.Value], saturate: bool = False) -> ir.Value:
    """`dot4_u8s8(acc, a, b)` on i32 scalars or `<n x i32>` vectors (any n); with
    `saturate`, `dot4_u8s8_sat16` (pair sums clamped to int16)."""
    if saturate:
        return _emit(b, mod, family, args, _SAT16_FAMILIES, _portable_sat16)
    return _emit(b, mod, family, args, _FAMILIES, _portable)


def emit_dot2_i16(b: ir.IRBuilder, mod: ir.Module, family: str | None,
                  args: Sequence[ir.Value]) -> ir.Value:
    """`dot2_i16(acc, a, b)` on i32 scalars or `<n x i32>` vectors (any n)."""
    return _emit(b, mod, family, args, _I16_FAMILIES, _portable_i16)


def _emit(b: ir.IRBuilder, mod: ir.Module, family: str | None, args: Sequence[ir.Value],
          families: dict[str, tuple[int, Lowering]], portable: Lowering) -> ir.Value:
    """An integer dot intrinsic: `families[family]`'s instruction over chunks of its
    lanes, or `portable` (scalars, big-endian targets, other families)."""
    acc, a, w = args
    if not isinstance(acc.type, ir.VectorType):
        one = [b.insert_element(ir.Constant(_vec(I32, 1), ir.Undefined), v,
                                ir.Constant(I32, 0)) for v in (acc, a, w)]
        return b.extract_element(portable(b, mod, *one), ir.Constant(I32, 0))
    n = acc.type.count
    if str(mod.data_layout).startswith("E"):
        family = None  # the families' byte views assume little-endian lanes
    width, lower = families.get(family or "", (n, portable))
    if width >= n and lower is portable:
        return portable(b, mod, acc, a, w)
    chunks = -(-n // width)
    padded = [_resize(b, v, chunks * width) for v in (acc, a, w)]
    parts = [lower(b, mod, *(_slice(b, v, c * width, width) for v in padded))
             for c in range(chunks)]
    return _resize(b, _concat(b, parts), n)


def _slice(b: ir.IRBuilder, v: ir.Value, start: int, count: int) -> ir.Value:
    return b.shuffle_vector(v, undef(v.type), lanes_mask(start, count, start + count))


def _resize(b: ir.IRBuilder, v: ir.Value, count: int) -> ir.Value:
    """`v`'s first `count` lanes (lanes past its end undefined)."""
    n = v.type.count
    if n == count:
        return v
    return b.shuffle_vector(v, undef(v.type), lanes_mask(0, count, n))


def _concat(b: ir.IRBuilder, parts: list[ir.Value]) -> ir.Value:
    """The vectors of `parts` (all one type) end to end (padded with undefined lanes
    to a power-of-two count of parts)."""
    while len(parts) > 1:
        if len(parts) % 2:
            parts.append(undef(parts[0].type))
        width = parts[0].type.count
        mask = lanes_mask(0, 2 * width, 2 * width)
        parts = [b.shuffle_vector(parts[i], parts[i + 1], mask)
                 for i in range(0, len(parts), 2)]
    return parts[0]
