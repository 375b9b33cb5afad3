"""The residual add fused into the dot-form convolution's tiles (kiln.kernels.int8.conv_dot;
the fused op: kiln.ops.quant_conv_words, `residual_operand`; the pass:
kiln.transform.quant_residual).

Each output value the tiles requantize is added to the residual's element at the same
place before it is stored: `Residual.value` is the `qlinear_add` of the two
(kiln.ops.quant_elementwise's coefficients and fused multiply-adds, saturated as the
flat add kernel saturates, kiln.kernels.int8.elementwise.saturate_magic), so the output
is exactly the two ops'. The residual is read through a view shaped as the buffer the
tiles store into (`Residual.at`): words of 4 channels (NCHW4c, one int32 per position
and 4 channels: `element` takes its byte apart) or NCHW bytes. The add's three
coefficients are computed into registers (`load`) before a tile's store loops, which
then read only the tile's own buffers and stay vector code (kiln.kernels.int8.conv_tiles,
`RowEpilogue`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kiln.ir.dtype import itemsize
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    Cast,
    DeclBuffer,
    Evaluate,
    Intrin,
    PrimExpr,
    Stmt,
    Store,
    as_expr,
    seq,
)
from kiln.kernels.int8.conv_tiles import unsigned_byte
from kiln.kernels.int8.dot import pack_word
from kiln.kernels.int8.elementwise import saturate_magic
from kiln.kernels.tiles import const, lanes_loop
from kiln.ops.quant_conv_words import add_attrs
from kiln.ops.quant_elementwise import add_coefficients, add_combine, shifted, uint8_shift

#: Bits of a byte of a word
BYTE_BITS = 8
#: Bytes of a cache line (x86, Arm): the prefetches' step
CACHE_LINE = 64


def word_byte(word: PrimExpr, byte: int, dtype: str) -> PrimExpr:
    """Byte `byte` of a word of 4 channels (channel 4 c4 + byte) as the int32 value of
    `dtype` (uint8 or int8) it holds."""
    bits = (word >> (BYTE_BITS * byte)) & 0xFF
    return (bits ^ 0x80) - 0x80 if dtype == "int8" else bits


@dataclass(frozen=True)
class Residual:
    """The fused add of one kernel: the residual operand `source`, its view `view` as the
    tiles' output buffer (`at`), the add's scalars `params` (a_scale, a_zp, b_scale,
    b_zp, y_scale, y_zp), whether the convolution's value is the add's `a`
    (`conv_first`), the `as_uint8` shift and the output's byte type."""

    source: Buffer
    view: Buffer
    params: tuple[Buffer, ...]
    conv_first: bool
    shift: int
    dtype: str

    @staticmethod
    def of(buffers: Sequence[Buffer], attrs: Mapping[str, Any]) -> Residual:
        """The fused add of a kernel whose operands after the convolution's are
        `buffers` (residual, a_scale, a_zp, b_scale, b_zp, y_scale, y_zp)."""
        source, *params = buffers
        return Residual(source, source, tuple(params), int(attrs["residual_operand"]) == 0,
                        uint8_shift(add_attrs(attrs)), str(params[-1].dtype))

    def at(self, like: Buffer, name: str = "") -> Residual:
        """The residual viewed as `like` (the tiles' output view: same shape and type)."""
        view = Buffer(f"residual_{name or like.name}", tuple(like.shape), like.dtype)
        return replace(self, view=view)

    def chunk(self, source: Buffer) -> Residual:
        """The add on `source`, the residual's view of a batch chunk."""
        return replace(self, source=source, view=source)

    def decl(self) -> Stmt:
        """The declaration of `view`."""
        return DeclBuffer(self.view, self.source, 0)

    @property
    def words(self) -> bool:
        """Whether the view holds int32 words of 4 channels."""
        return str(self.view.dtype) == "int32"

    def registers(self, suffix: str = "") -> Buffer:
        """The local buffer of the add's coefficients (rs, ro, fixed)."""
        return Buffer(f"residual_add{suffix}", (3,), "float32", "local")

    def load(self, regs: Buffer) -> Stmt:
        """Compute the add's coefficients into `regs`."""
        coefficients = add_coefficients([p[()] for p in self.params], False, self.shift)
        return seq(*(Store(regs, c, (as_expr(i, "int64"),))
                     for i, c in enumerate(coefficients)))

    def value(self, regs: Buffer, conv: PrimExpr, residual: PrimExpr) -> PrimExpr:
        """The add's output (of the byte type) of the convolution's requantized value
        `conv` (float32, plus the `as_uint8` shift: `shifted`, or
        kiln.ops.quant.requantize_float) and the residual element `residual` (an int32
        value)."""
        res = shifted(residual, self.shift)
        span, other = (conv, res) if self.conv_first else (res, conv)
        v = add_combine(span, other, (regs[0], regs[1], regs[2]))
        return saturate_magic(v, self.dtype, self.shift)

    def shifted(self, value: PrimExpr) -> PrimExpr:
        """A byte or int32 value as `value` takes the convolution's: float32, shifted."""
        return shifted(value, self.shift)

    def element(self, stored: PrimExpr, byte: int = 0) -> PrimExpr:
        """The residual value (int32) of a stored element: a byte, or byte `byte` of a
        word of 4 channels (its channel 4 c4 + byte)."""
        return word_byte(stored, byte, self.dtype) if self.words else Cast("int32", stored)

    def rows(self, width: int, ahead: int) -> ResidualRows:
        """The add of a positions tile of `width` lanes whose next column tile starts
        `ahead` positions on (`ResidualRows`)."""
        return ResidualRows(self, self.registers(), Buffer("residual_row", (width,),
                                                           self.view.dtype, "local"), ahead)

    def word(self, regs: Buffer, conv: PrimExpr, residual: PrimExpr) -> PrimExpr:
        """The output word of a convolution's word `conv` and the residual's `residual`
        (4 channels each)."""
        return pack_word(lambda b: unsigned_byte(self.value(
            regs, self.shifted(word_byte(conv, b, self.dtype)),
            word_byte(residual, b, self.dtype)), self.dtype))


@dataclass(frozen=True)
class ResidualRows:
    """The fused add in a positions tile: the coefficients in `regs`, and each output
    row's residual elements copied into the local `row` (`copy`) before the row's store
    loop reads them there. The store loop then reads only buffers of its own, which the
    vectorize-loops pass needs to make it vector code (a view of a parameter may share
    the output's memory: the planner may give the output the residual's)."""

    residual: Residual
    regs: Buffer
    row: Buffer
    #: positions from a column tile to the next, whose elements `copy` prefetches
    ahead: int

    @property
    def shift(self) -> int:
        """The `as_uint8` shift."""
        return self.residual.shift

    def setup(self) -> tuple[Stmt, ...]:
        """The tile's allocations and its coefficients' loads."""
        return (Allocate(self.regs), self.residual.load(self.regs), Allocate(self.row))

    def copy(self, extent: int, at: Callable[[PrimExpr], tuple[PrimExpr, ...]]) -> Stmt:
        """Copy the residual's elements at `at(v)` (the row's stores' places), v < extent,
        into `row`, and prefetch the next column tile's (`ahead` on). The tiles of one
        column tile read the residual's rows of every channel a short piece each, too
        many streams for the hardware prefetchers (the add's own kernel read it in one
        stream)."""
        per_line = CACHE_LINE // itemsize(self.row.dtype)
        fetch = [Evaluate(Intrin("prefetch", (self.residual.view[at(const(self.ahead + c))],)))
                 for c in range(0, int(self.row.shape[0]), per_line)]
        return seq(*fetch, lanes_loop("v", extent, lambda v: Store(
            self.row, self.residual.view[at(v)], (v,))))

    def value(self, conv: PrimExpr, v: PrimExpr, byte: int = 0) -> PrimExpr:
        """The add's output of the convolution's value `conv` (`Residual.value`) and the
        copied element of lane `v` (its byte `byte`, in words of 4 channels)."""
        return self.residual.value(self.regs, conv, self.residual.element(self.row[v], byte))
