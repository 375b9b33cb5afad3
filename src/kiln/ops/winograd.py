"""Winograd convolution F(m x m, 3 x 3): the transform matrices and the op
`conv2d_winograd` (kiln.kernels.conv.winograd transforms its weight at compile time
and builds its kernel).

For an output tile of `m x m` and a 3x3 filter the input tile is `a x a`, `a = m + 2`:
`Y = A^T [(G g G^T) * (B^T d B)] A` (Lavin & Gray, "Fast Algorithms for Convolutional
Neural Networks", 2016), with the interpolation points 0, +-1 (F(2,3)) and 0, +-1,
+-2 folded into integers (F(4,3)) and 0, +-1, +-2, +-1/2 (F(6,3)). Summed over input
channels, the elementwise
product is `a * a` matrix products `U[p] @ V[p]` (`p` a position of the tile),
`m * m * 9 / (a * a)` of the direct convolution's multiplies: 4x fewer for F(4,3),
5.1x for F(6,3), whose sums are rounded about twice as far off.

`conv2d_winograd(x, u[, bias])` takes `u = G g G^T` of each (output, input) channel
pair, laid out `[a * a][out channels][in channels]` (kiln.kernels.conv.winograd.
weight_transform): row-major
A operands of the GEMM micro-kernel. Its type rule, reference and tensor-expression
fallback recover the OIHW weight (`weight_untransform`: G's left inverse), so the op
keeps `conv2d`'s meaning (NCHW, ONNX pads, stride and dilation 1, one group).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir.tensor import PrimExpr, as_expr, select
from kiln.ir.types import TensorType, Type
from kiln.ops import layout, te
from kiln.ops.conv_geometry import ConvShape
from kiln.ops.gemm import unpack_b
from kiln.ops.nn import conv_compute, conv_infer, conv_ref
from kiln.ops.packed_attrs import recorded_tile
from kiln.ops.registry import register_op

WINOGRAD = "conv2d_winograd"
#: The output tile sizes m that have transforms here.
TILE_SIZES = (2, 4, 6)

Attrs = Mapping[str, Any]

# Lavin & Gray's matrices: B^T (input), G (filter), A^T (output) for each m.
_MATRICES: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {
    2: (np.array([[1, 0, -1, 0],
                  [0, 1, 1, 0],
                  [0, -1, 1, 0],
                  [0, 1, 0, -1]], np.float64),
        np.array([[1, 0, 0],
                  [1 / 2, 1 / 2, 1 / 2],
                  [1 / 2, -1 / 2, 1 / 2],
                  [0, 0, 1]], np.float64),
        np.array([[1, 1, 1, 0],
                  [0, 1, -1, -1]], np.float64)),
    4: (np.array([[4, 0, -5, 0, 1, 0],
                  [0, -4, -4, 1, 1, 0],
                  [0, 4, -4, -1, 1, 0],
                  [0, -2, -1, 2, 1, 0],
                  [0, 2, -1, -2, 1, 0],
                  [0, 4, 0, -5, 0, 1]], np.float64),
        np.array([[1 / 4, 0, 0],
                  [-1 / 6, -1 / 6, -1 / 6],
                  [-1 / 6, 1 / 6, -1 / 6],
                  [1 / 24, 1 / 12, 1 / 6],
                  [1 / 24, -1 / 12, 1 / 6],
                  [0, 0, 1]], np.float64),
        np.array([[1, 1, 1, 1, 1, 0],
                  [0, 1, -1, 2, -2, 0],
                  [0, 1, 1, 4, 4, 0],
                  [0, 1, -1, 8, -8, 1]], np.float64)),
    6: (np.array([[1, 0, -21 / 4, 0, 21 / 4, 0, -1, 0],
                  [0, 1, 1, -17 / 4, -17 / 4, 1, 1, 0],
                  [0, -1, 1, 17 / 4, -17 / 4, -1, 1, 0],
                  [0, 1 / 2, 1 / 4, -5 / 2, -5 / 4, 2, 1, 0],
                  [0, -1 / 2, 1 / 4, 5 / 2, -5 / 4, -2, 1, 0],
                  [0, 2, 4, -5 / 2, -5, 1 / 2, 1, 0],
                  [0, -2, 4, 5 / 2, -5, -1 / 2, 1, 0],
                  [0, -1, 0, 21 / 4, 0, -21 / 4, 0, 1]], np.float64),
        np.array([[1, 0, 0],
                  [-2 / 9, -2 / 9, -2 / 9],
                  [-2 / 9, 2 / 9, -2 / 9],
                  [1 / 90, 1 / 45, 2 / 45],
                  [1 / 90, -1 / 45, 2 / 45],
                  [32 / 45, 16 / 45, 8 / 45],
                  [32 / 45, -16 / 45, 8 / 45],
                  [0, 0, 1]], np.float64),
        np.array([[1, 1, 1, 1, 1, 1, 1, 0],
                  [0, 1, -1, 2, -2, 1 / 2, -1 / 2, 0],
                  [0, 1, 1, 4, 4, 1 / 4, 1 / 4, 0],
                  [0, 1, -1, 8, -8, 1 / 8, -1 / 8, 0],
                  [0, 1, 1, 16, 16, 1 / 16, 1 / 16, 0],
                  [0, 1, -1, 32, -32, 1 / 32, -1 / 32, 1]], np.float64)),
}


def matrices(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(B^T, G, A^T) of F(m x m, 3 x 3)."""
    if m not in _MATRICES:
        raise IRError(f"{WINOGRAD}: no transforms for output tiles of {m} "
                      f"(known: {', '.join(map(str, TILE_SIZES))})")
    return _MATRICES[m]


def _left_inverse(m: int) -> np.ndarray:
    _, g, _ = matrices(m)
    return np.linalg.pinv(g)


def weight_untransform(u: np.ndarray) -> np.ndarray:
    """The OIHW weight of a transformed one, `u[a*a][O][I]` with `u[:, o, i] = G w[o, i]
    G^T` (kiln.kernels.conv.winograd.weight_transform), up to rounding."""
    m = tile_of(u.shape)
    gi = _left_inverse(m)
    a = m + 2
    full = u.astype(np.float64).reshape(a, a, *u.shape[1:])
    return np.einsum("pa,aboi,qb->oipq", gi, full, gi).astype(u.dtype)


def tile_of(u_shape: Sequence[Any]) -> int:
    """The output tile size m of a transformed weight's shape `[a * a][O][I]`."""
    if len(u_shape) != 3:
        raise IRError(f"{WINOGRAD}: transformed weight must be 3-D [a*a][O][I], "
                      f"got {tuple(u_shape)}")
    for m in TILE_SIZES:
        if int(u_shape[0]) == (m + 2) ** 2:
            return m
    raise IRError(f"{WINOGRAD}: transformed weight's first dim {u_shape[0]} is not (m+2)^2 "
                  f"for m in {TILE_SIZES}")


def eligible(shape: ConvShape) -> bool:
    """Whether `conv2d_winograd` computes a convolution of `shape`: 3x3, stride 1,
    dilation 1, one group (its kernel also needs float32 and static sizes:
    kiln.ops.conv_geometry.conv_call_shape)."""
    return ((shape.kh, shape.kw) == (3, 3) and shape.stride == (1, 1)
            and shape.dilation == (1, 1) and shape.groups == 1)


def _oihw(types: Sequence[Any], attrs: Attrs) -> tuple[int, ...]:
    u = tuple(types[1].shape)
    m = tile_of(u)
    tile = recorded_tile(attrs, 3, WINOGRAD)
    if tile is not None and tile[0] != m:
        raise IRError(f"{WINOGRAD}: tile {tile} does not match the weight's tile size {m}")
    if int(attrs.get("group", 1)) != 1 or any(
            int(v) != 1 for k in ("strides", "dilations") for v in attrs.get(k, ())):
        raise IRError(f"{WINOGRAD}: only ungrouped convolutions of stride and dilation 1")
    return (int(u[1]), int(u[2]), 3, 3)


def _infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    w = TensorType(_oihw(types, attrs), types[1].dtype)
    return conv_infer([types[0], w, *types[2:]], attrs)


def _compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    """The convolution on the weight recovered from `u` (a select over the 9 taps of
    sums of `u`'s entries with G's left inverse as constant factors)."""
    oihw = _oihw(inputs, attrs)
    u = inputs[1]
    m = tile_of(u.shape)
    gi = _left_inverse(m)
    a = m + 2

    def tap(o: PrimExpr, i: PrimExpr, r: int, s: int) -> PrimExpr:
        total: PrimExpr | None = None
        for p in range(a):
            for q in range(a):
                coef = float(gi[r, p] * gi[s, q])
                if abs(coef) < 1e-12:
                    continue
                term = u[p * a + q, o, i] * as_expr(coef, u.dtype)
                total = term if total is None else total + term
        assert total is not None
        return total

    def element(o: PrimExpr, i: PrimExpr, kh: PrimExpr, kw: PrimExpr) -> PrimExpr:
        def row(r: int) -> PrimExpr:
            return select(kw.eq(0), tap(o, i, r, 0),
                          select(kw.eq(1), tap(o, i, r, 1), tap(o, i, r, 2)))

        return select(kh.eq(0), row(0), select(kh.eq(1), row(1), row(2)))

    w = te.compute(oihw, element, u.dtype, "weight")
    return conv_compute([inputs[0], w, *inputs[2:]], attrs)


def _ref(x: np.ndarray, u: np.ndarray, b: np.ndarray | None = None,
         **attrs: Any) -> np.ndarray:
    return conv_ref(x, weight_untransform(u), b, **attrs)


register_op(WINOGRAD, pattern="anchor", infer=_infer, compute=_compute, reference=_ref)


# --------------------------------------------------------------------------- NCHWc op

#: `conv2d_winograd(x, up[, bias])` on NCHW{b}c activations (kiln.ops.layout): `x` is
#: `[N][C/b][H][W][b]` and the result `[N][O/b][OH][OW][b]`, both channel counts whole
#: blocks; `up` is `u` packed in panels of `nr` output channels, `[a * a][ceil(O / nr)][C]
#: [nr]` (`pack_panels`; attribute `channels` = O): the B operand of the products
#: `M^T[p] = V^T[p] @ U^T[p]`, whose rows are tiles and whose lanes are channels
#: (kiln.kernels.conv.winograd_nchwc, with `pack_panels`). The `nchwc-layout` pass
#: introduces it.
WINOGRAD_NCHWC = "conv2d_winograd_nchwc"


def unpack_panels(up: np.ndarray, channels: int) -> np.ndarray:
    """`u[a*a][channels][C]` of a weight packed in panels `[a*a][ceil(O / nr)][C][nr]`
    (kiln.kernels.conv.winograd_nchwc.pack_panels)."""
    return np.stack([unpack_b(panels, channels).T for panels in up])


def _nchwc_parts(types: Sequence[Any], attrs: Attrs) -> tuple[int, tuple[int, ...]]:
    """(the block b, the NCHW input shape) of a `conv2d_winograd_nchwc` call, checked."""
    x, up = tuple(types[0].shape), tuple(types[1].shape)
    channels = attrs.get("channels")
    if len(x) != 5 or len(up) != 4 or not isinstance(channels, int):
        raise IRError(f"{WINOGRAD_NCHWC}: needs an NCHW<b>c input, a weight packed "
                      f"[a*a][panels][C][nr] and the attribute 'channels', got {x}, {up}")
    b, c = int(x[4]), int(up[2])
    tile_of((up[0], channels, c))
    if c % b or channels % b or int(x[1]) * b != c or \
            not (int(up[1]) - 1) * int(up[3]) < channels <= int(up[1]) * int(up[3]):
        raise IRError(f"{WINOGRAD_NCHWC}: input {x} and packed weight {up} must hold whole "
                      f"blocks of {c} input and {channels} output channels")
    return b, (x[0], c, x[2], x[3])


def _nchwc_u(types: Sequence[Any], attrs: Attrs) -> TensorType:
    """The type of `u` unpacked, in the input's dtype (a packed weight may be narrower:
    float16 panels widened as they are read)."""
    up = types[1].shape
    return TensorType((up[0], int(attrs["channels"]), up[2]), types[0].dtype)


def _conv_attrs(attrs: Attrs) -> dict[str, Any]:
    """A `conv2d_winograd_nchwc` call's attributes as its NCHW op's (no `channels`)."""
    return {k: v for k, v in attrs.items() if k != "channels"}


def _nchwc_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    b, plain = _nchwc_parts(types, attrs)
    out = _infer([TensorType(plain, types[0].dtype), _nchwc_u(types, attrs), *types[2:]],
                 _conv_attrs(attrs))
    assert isinstance(out, TensorType)
    return TensorType(layout.block_shape(out.shape, b), out.dtype)


def _nchwc_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    b, plain = _nchwc_parts(inputs, attrs)
    x, up = inputs[0], inputs[1]
    nr = up.shape[3]
    xn = te.compute(plain, lambda n, c, h, w: x[n, c // b, h, w, c % b], x.dtype, "x_nchw")
    u = te.compute(_nchwc_u(inputs, attrs).shape,
                   lambda p, o, i: up[p, o // nr, i, o % nr].astype(x.dtype), x.dtype, "u")
    out = _compute([xn, u, *inputs[2:]], _conv_attrs(attrs))
    return te.compute(layout.block_shape(out.shape, b),
                      lambda n, cb, h, w, v: out[n, cb * b + v, h, w], out.dtype, "conv_nchwc")


def _nchwc_ref(x: np.ndarray, up: np.ndarray, b: np.ndarray | None = None,
               **attrs: Any) -> np.ndarray:
    u = unpack_panels(up, int(attrs["channels"])).astype(x.dtype)
    out = _ref(layout.from_blocked(x, int(up.shape[2])), u, b, **_conv_attrs(attrs))
    return layout.to_blocked(out, int(x.shape[4]))


register_op(WINOGRAD_NCHWC, pattern="anchor", infer=_nchwc_infer, compute=_nchwc_compute,
            reference=_nchwc_ref)
