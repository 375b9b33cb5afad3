"""Neural-network anchor operators: matmul, einsum, convolution (1-3 spatial dims),
transposed convolution, and local response normalisation.

Attributes follow ONNX's spelling where one exists (strides, dilations, pads as
(begins..., ends...), group), so the frontend maps 1:1; see kiln.ops.spatial.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ir.shape_expr import dim_text, dims_equal, is_static, shape_text, simplify_dim
from kiln.ir.tensor import Cast, PrimExpr, as_expr, select
from kiln.ir.types import Dim, TensorType, Type
from kiln.ops import spatial, te
from kiln.ops._numpy import is_float
from kiln.ops._numpy import widen as widen_np
from kiln.ops.broadcast import broadcast_index, broadcast_shapes
from kiln.ops.onnx_map import GraphContext, check_per_channel, onnx_op
from kiln.ops.registry import register_op
from kiln.ops.reshape_dims import reshape_attr

Attrs = Mapping[str, Any]


def acc_dtype(dtype: str) -> str:
    """Accumulate 16-bit floats in float32 and small ints in int32 (then cast back)."""
    if dtype in ("float16", "bfloat16"):
        return "float32"
    if dt.is_int(dtype) and dt.bits(dtype) < 32:
        return "int32" if dt.is_signed(dtype) else "uint32"
    return dtype


def widen(x: PrimExpr, dtype: str) -> PrimExpr:
    """`x` cast to `dtype` (an accumulator type) unless it already has it."""
    return x if x.dtype == dtype else Cast(dtype, x)


def _static_dim(t: TensorType, axis: int, what: str) -> int:
    """Dimension `axis` of `t`, which must be static (IRError naming `what` if not)."""
    d = t.shape[axis]
    if not isinstance(d, int):
        raise IRError(f"{what}: dimension {axis} of {shape_text(t.shape)} must be static, "
                      f"got {dim_text(d)}")
    return d


def _tt(t: te.Tensor) -> TensorType:
    return TensorType(t.shape, t.dtype)


# --------------------------------------------------------------------------- matmul

def matmul_shapes(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    """numpy.matmul's result shape (1-D operands promoted and squeezed)."""
    if len(a) == 0 or len(b) == 0:
        raise IRError("matmul operands must have at least one dimension")
    a2 = (1, *a) if len(a) == 1 else tuple(a)
    b2 = (*b, 1) if len(b) == 1 else tuple(b)
    if dims_equal(a2[-1], b2[-2]) is not True:
        shown = [str(tuple(x)) if is_static(x) else shape_text(x) for x in (a, b)]
        raise IRError(f"matmul: inner dimensions differ: {shown[0]} @ {shown[1]}")
    batch = broadcast_shapes(a2[:-2], b2[:-2])
    out = (*batch, a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def b_shape(b: Sequence[int], attrs: Attrs) -> tuple[int, ...]:
    """B's shape as matmul reads it: with `transpose_b`, B is stored [..., N, K]
    (ONNX Gemm's transB) and read transposed, so its data is never copied."""
    b = tuple(b)
    if attrs.get("transpose_b"):
        if len(b) < 2:
            raise IRError("matmul(transpose_b=True): B must have at least two dimensions")
        return (*b[:-2], b[-1], b[-2])
    return b


def matmul_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    """Type rule of nn.matmul (also the packed and cblas variants' logical type)."""
    a, b = types
    if a.dtype != b.dtype:
        raise IRError(f"matmul: operand dtypes differ ({a.dtype} vs {b.dtype})")
    shape = matmul_shapes(a.shape, b_shape(b.shape, attrs))  # type: ignore[arg-type]
    return TensorType(shape, a.dtype)


Index = tuple[Any, ...]
MatmulIndex = Callable[..., tuple[PrimExpr, PrimExpr, Callable[[PrimExpr], Index],
                                  Callable[[PrimExpr], Index]]]


def matmul_indexing(a: te.Tensor, b: te.Tensor,
                    attrs: Attrs) -> tuple[tuple[Dim, ...], Dim, MatmulIndex]:
    """matmul's output shape, its depth K, and `index(*i) -> (row, col, a_at, b_at)`:
    `a_at(k)`/`b_at(k)` are the A and B indices of output element `i` at depth `k`
    (1-D operands, batch broadcasting and `transpose_b` included). Float and integer
    matmuls (kiln.ops.quant) share it."""
    trans_b = bool(attrs.get("transpose_b"))
    logical_b = b_shape(b.shape, attrs)
    a_dims = (1, *a.shape) if a.ndim == 1 else a.shape
    b_dims = (*logical_b, 1) if b.ndim == 1 else logical_b
    out_shape = matmul_shapes(a.shape, logical_b)
    batch_rank = len(broadcast_shapes(a_dims[:-2], b_dims[:-2]))

    def index(*i: PrimExpr) -> tuple[PrimExpr, PrimExpr, Callable[[PrimExpr], Index],
                                      Callable[[PrimExpr], Index]]:
        full = list(i)
        if b.ndim == 1:
            full.append(as_expr(0))
        if a.ndim == 1:
            full.insert(len(full) - 1, as_expr(0))
        batch, row, col = full[:batch_rank], full[batch_rank], full[batch_rank + 1]

        def a_at(k: PrimExpr) -> Index:
            idx = (*broadcast_index(batch, a_dims[:-2]), row, k)
            return idx[-1:] if a.ndim == 1 else idx

        def b_at(k: PrimExpr) -> Index:
            idx = (*broadcast_index(batch, b_dims[:-2]), *((col, k) if trans_b else (k, col)))
            return idx[:-1] if b.ndim == 1 else idx

        return row, col, a_at, b_at

    return out_shape, a_dims[-1], index


def matmul_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    """nn.matmul as a tensor expression (accumulating in the widened dtype)."""
    a, b = inputs
    out_shape, k_extent, index = matmul_indexing(a, b, attrs)
    acc = acc_dtype(a.dtype)

    def element(*i: PrimExpr) -> PrimExpr:
        _, _, a_at, b_at = index(*i)
        total = te.reduce("sum", lambda k: widen(a[a_at(k)], acc) * widen(b[b_at(k)], acc),
                          (k_extent,), acc)
        return widen(total, a.dtype)

    return te.compute(out_shape, element, a.dtype, "matmul")


def matmul_ref(a: np.ndarray, b: np.ndarray, **attrs: Any) -> np.ndarray:
    """numpy reference of nn.matmul."""
    if attrs.get("transpose_b"):
        b = np.swapaxes(b, -1, -2)
    return np.matmul(widen_np(a), widen_np(b)).astype(a.dtype)


register_op("matmul", pattern="anchor", infer=matmul_infer, compute=matmul_compute,
            reference=matmul_ref)


# --------------------------------------------------------------------------- einsum

def parse_einsum(equation: str, ranks: Sequence[int]) -> tuple[list[str], str]:
    """Operand subscripts and the output subscript, with `...` expanded into
    private letters (numpy rules: ellipsis dims are right-aligned and broadcast;
    an implicit output lists the ellipsis, then the letters used once, sorted)."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise IRError(f"einsum {equation!r} has {len(terms)} operand(s), got {len(ranks)}")
    ell_rank = 0
    for term, rank in zip(terms, ranks):
        letters = term.replace("...", "")
        if not letters.isalpha() and letters:
            raise IRError(f"einsum {equation!r}: subscripts must be letters")
        if "..." in term:
            ell_rank = max(ell_rank, rank - len(letters))
        elif len(letters) != rank:
            raise IRError(f"einsum {equation!r}: operand subscript {term!r} has "
                          f"{len(letters)} letters for a {rank}-d operand")
    ell = [chr(0x3B1 + k) for k in range(ell_rank)]   # greek letters: never user subscripts
    out_terms = []
    for term, rank in zip(terms, ranks):
        if "..." in term:
            pre, post = term.split("...")
            n = rank - len(pre) - len(post)
            if n < 0:
                raise IRError(f"einsum {equation!r}: operand {term!r} has rank {rank}")
            out_terms.append(pre + "".join(ell[ell_rank - n:]) + post)
        else:
            out_terms.append(term)
    if arrow:
        if "..." in rhs:
            pre, post = rhs.split("...")
            out = pre + "".join(ell) + post
        else:
            out = rhs
    else:
        counts: dict[str, int] = {}
        for term in out_terms:
            for c in term:
                counts[c] = counts.get(c, 0) + 1
        out = "".join(ell) + "".join(sorted(c for c, n in counts.items()
                                            if n == 1 and c not in ell))
    if len(set(out)) != len(out):
        raise IRError(f"einsum {equation!r}: repeated output subscript")
    return out_terms, out


def _einsum_sizes(terms: Sequence[str], shapes: Sequence[Sequence[int]],
                  equation: str) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, shapes):
        for c, d in zip(term, shape):
            d = int(d)
            if sizes.get(c, 1) == 1:
                sizes[c] = d
            elif d not in (1, sizes[c]):
                raise IRError(f"einsum {equation!r}: subscript {c!r} has sizes "
                              f"{sizes[c]} and {d}")
    return sizes


def _einsum_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    eq = str(attrs["equation"])
    if len({t.dtype for t in types}) != 1:
        raise IRError(f"einsum operands differ in dtype: {[t.dtype for t in types]}")
    terms, out = parse_einsum(eq, [t.ndim for t in types])
    sizes = _einsum_sizes(terms, [t.shape for t in types], eq)  # type: ignore[misc]
    missing = [c for c in out if c not in sizes]
    if missing:
        raise IRError(f"einsum {eq!r}: output subscript {missing[0]!r} is not in any input")
    return TensorType(tuple(sizes[c] for c in out), types[0].dtype)


def _einsum_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    eq = str(attrs["equation"])
    terms, out = parse_einsum(eq, [t.ndim for t in inputs])
    sizes = _einsum_sizes(terms, [t.shape for t in inputs], eq)
    summed = [c for c in dict.fromkeys("".join(terms)) if c not in out]
    acc = acc_dtype(inputs[0].dtype)

    def product(env: dict[str, PrimExpr]) -> PrimExpr:
        value: PrimExpr | None = None
        for t, term in zip(inputs, terms):
            idx = tuple(as_expr(0) if d == 1 else env[c] for c, d in zip(term, t.shape))
            v = widen(t[idx], acc)
            value = v if value is None else value * v
        assert value is not None
        return value

    def element(*i: PrimExpr) -> PrimExpr:
        env = dict(zip(out, i))
        if not summed:
            return widen(product(env), inputs[0].dtype)
        total = te.reduce("sum", lambda *k: product({**env, **dict(zip(summed, k))}),
                          tuple(sizes[c] for c in summed), acc)
        return widen(total, inputs[0].dtype)

    return te.compute(tuple(sizes[c] for c in out), element, inputs[0].dtype, "einsum")


def _einsum_ref(*operands: np.ndarray, equation: str, **attrs: Any) -> np.ndarray:
    return np.asarray(np.einsum(equation, *(widen_np(o) for o in operands))).astype(
        operands[0].dtype)


register_op("einsum", pattern="anchor", infer=_einsum_infer, compute=_einsum_compute,
            reference=_einsum_ref)


# --------------------------------------------------------------------------- convolution

def conv_geometry(x: Sequence[Any], w: Sequence[int], attrs: Attrs, what: str,
                  least_pad: int = 0
                  ) -> tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...],
                             tuple[int, ...]]:
    """(rank, strides, dilations, pad begins, pad ends), checked against the shapes.

    Pads below `least_pad` are refused (0 for convolutions).
    """
    rank = spatial.spatial_rank(x, what)
    if len(w) != len(x):
        raise IRError(f"{what}: weight {tuple(w)} and input {tuple(x)} differ in rank")
    strides = spatial.ints(attrs, "strides", rank, 1)
    dilations = spatial.ints(attrs, "dilations", rank, 1)
    begins, ends = spatial.pads(attrs, rank, least_pad)
    return rank, strides, dilations, begins, ends


def conv_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    """Type rule of nn.conv (N-D, groups, strides, dilations, pads)."""
    x, w = types[0], types[1]
    xs, ws = x.shape, w.static_shape
    rank, strides, dilations, begins, ends = conv_geometry(xs, ws, attrs, "conv")
    _static_dim(x, 1, "conv")
    group = int(attrs.get("group", 1))
    if group < 1 or xs[1] != ws[1] * group or ws[0] % group:
        raise IRError(f"conv: input has {xs[1]} channels, weight {ws} with group {group} "
                      f"expects {ws[1] * group} (and out channels divisible by group)")
    if len(types) == 3 and tuple(types[2].shape) != (ws[0],):
        raise IRError(f"conv: bias shape {types[2].shape} must be ({ws[0]},)")
    if x.dtype != w.dtype:
        raise IRError(f"conv: input and weight dtypes differ ({x.dtype} vs {w.dtype})")
    out = tuple(simplify_dim(spatial.conv_out(xs[2 + k], ws[2 + k], strides[k], dilations[k],
                                              begins[k], ends[k])) for k in range(rank))
    if min((d for d in out if isinstance(d, int)), default=1) <= 0:
        raise IRError(f"conv output would be empty ({out})")
    return TensorType((xs[0], ws[0], *out), x.dtype)


def conv_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    """nn.conv as a tensor expression (the generic lowering kernels fall back to)."""
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) == 3 else None
    out = conv_infer([_tt(t) for t in inputs], attrs)
    assert isinstance(out, TensorType)
    rank, strides, dilations, begins, _ = conv_geometry(x.shape, w.shape, attrs, "conv")
    ci, kernel = w.shape[1], w.shape[2:]
    group = int(attrs.get("group", 1))
    per_group = w.shape[0] // group
    acc = acc_dtype(x.dtype)

    def element(n: PrimExpr, oc: PrimExpr, *o: PrimExpr) -> PrimExpr:
        first = (oc // per_group) * ci if group > 1 else as_expr(0)

        def term(c: PrimExpr, *k: PrimExpr) -> PrimExpr:
            pos = tuple(o[j] * strides[j] + k[j] * dilations[j] - begins[j]
                        for j in range(rank))
            xv = te.padded(x, (n, first + c, *pos), 0)
            return widen(xv, acc) * widen(w[(oc, c, *k)], acc)

        total = te.reduce("sum", term, (ci, *kernel), acc)
        if bias is not None:
            total = total + widen(bias[oc], acc)
        return widen(total, x.dtype)

    return te.compute(te.dims(out.shape), element, x.dtype, "conv")


def conv_ref(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None,
             **attrs: Any) -> np.ndarray:
    """numpy reference of nn.conv."""
    rank, strides, dilations, begins, ends = conv_geometry(x.shape, w.shape, attrs, "conv")
    group = int(attrs.get("group", 1))
    work = np.float64 if is_float(x) else np.int64
    xp = np.pad(x.astype(work), ((0, 0), (0, 0), *zip(begins, ends)))
    n, _c = x.shape[:2]
    o, ci = w.shape[:2]
    kernel = w.shape[2:]
    out_sp = tuple((xp.shape[2 + j] - dilations[j] * (kernel[j] - 1) - 1) // strides[j] + 1
                   for j in range(rank))
    xg: Any = xp.reshape(n, group, ci, *xp.shape[2:])
    wg: Any = w.astype(work).reshape(group, o // group, ci, *kernel)
    out = np.zeros((n, group, o // group, *out_sp), dtype=work)
    for k in itertools.product(*(range(d) for d in kernel)):
        sl = tuple(slice(k[j] * dilations[j], k[j] * dilations[j]
                         + strides[j] * (out_sp[j] - 1) + 1, strides[j]) for j in range(rank))
        patch = xg[(slice(None), slice(None), slice(None), *sl)]
        out += np.einsum("ngc...,goc->ngo...", patch, wg[(Ellipsis, *k)])
    out = out.reshape(n, o, *out_sp)
    if b is not None:
        out += b.astype(work).reshape(1, -1, *([1] * rank))
    return out.astype(x.dtype)


for _rank in spatial.SPATIAL_RANKS:
    register_op(f"conv{spatial.SUFFIX[_rank]}", pattern="anchor", infer=conv_infer,
                compute=conv_compute, reference=conv_ref)


# --------------------------------------------------------------------------- conv transpose

def _convt_geometry(x: Sequence[int], w: Sequence[int], attrs: Attrs
                    ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(output spatial shape, strides, dilations, pad begins) of a transposed conv."""
    # a transposed convolution's pads may be negative: they then extend its output
    rank, strides, dilations, begins, ends = conv_geometry(x, w, attrs, "conv_transpose",
                                                           -spatial.MAX_WINDOW)
    out_pad = spatial.ints(attrs, "output_padding", rank, 0, least=0)
    for j in range(rank):  # ONNX: each value less than its stride or dilation
        if out_pad[j] >= max(strides[j], dilations[j]):
            raise IRError(f"output_padding {list(out_pad)}: value {j} must be less than "
                          f"its stride {strides[j]} or dilation {dilations[j]}")
    out = tuple(strides[j] * (x[2 + j] - 1) + out_pad[j] + (w[2 + j] - 1) * dilations[j] + 1
                - begins[j] - ends[j] for j in range(rank))
    if min(out) <= 0:
        raise IRError(f"conv_transpose output would be empty ({out})")
    return out, strides, dilations, begins


def _convt_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    # the batch may be symbolic; channels and spatial dims are static
    batch = types[0].shape[0] if types[0].ndim else 0
    x = (0, *TensorType(types[0].shape[1:], types[0].dtype).static_shape)
    w = types[1].static_shape
    group = int(attrs.get("group", 1))
    if group < 1 or x[1] != w[0] or w[0] % group:
        raise IRError(f"conv_transpose: input has {x[1]} channels, weight {w} expects "
                      f"{w[0]} (divisible by group {group})")
    if len(types) == 3 and tuple(types[2].shape) != (w[1] * group,):
        raise IRError(f"conv_transpose: bias shape {types[2].shape} must be ({w[1] * group},)")
    out, *_ = _convt_geometry(x, w, attrs)
    return TensorType((batch, w[1] * group, *out), types[0].dtype)


def _convt_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) == 3 else None
    out_t = _convt_infer([_tt(t) for t in inputs], attrs)
    assert isinstance(out_t, TensorType)
    _, strides, dilations, begins = _convt_geometry(x.shape, w.shape, attrs)
    rank = len(begins)
    group = int(attrs.get("group", 1))
    cg, og = w.shape[0] // group, w.shape[1]
    kernel = w.shape[2:]
    acc = acc_dtype(x.dtype)

    def element(n: PrimExpr, oc: PrimExpr, *o: PrimExpr) -> PrimExpr:
        first = (oc // og) * cg if group > 1 else as_expr(0)
        local = oc % og if group > 1 else oc

        def term(c: PrimExpr, *k: PrimExpr) -> PrimExpr:
            # output o receives input i where o = i * stride + k * dilation - pad
            pos: list[PrimExpr] = []
            ok: PrimExpr | None = None
            for j in range(rank):
                t = o[j] + begins[j] - k[j] * dilations[j]
                if strides[j] > 1:
                    divisible = (t % strides[j]).eq(0)
                    ok = divisible if ok is None else ok & divisible
                    t = t // strides[j]
                pos.append(t)
            xv = te.padded(x, (n, first + c, *pos), 0)
            v = widen(xv, acc) * widen(w[(first + c, local, *k)], acc)
            return v if ok is None else select(ok, v, as_expr(0, acc))

        total = te.reduce("sum", term, (cg, *kernel), acc)
        if bias is not None:
            total = total + widen(bias[oc], acc)
        return widen(total, x.dtype)

    return te.compute(te.dims(out_t.shape), element, x.dtype, "conv_transpose")


def _convt_ref(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None,
               **attrs: Any) -> np.ndarray:
    out_sp, strides, dilations, begins = _convt_geometry(x.shape, w.shape, attrs)
    rank = len(begins)
    group = int(attrs.get("group", 1))
    n, c = x.shape[:2]
    cg, og = c // group, w.shape[1]
    kernel = w.shape[2:]
    work = np.float64 if is_float(x) else np.int64
    # `full` holds every contribution; it starts at position `lo` <= 0 (negative pads)
    lo = tuple(min(0, begins[j]) for j in range(rank))
    full_sp = tuple(max(strides[j] * (x.shape[2 + j] - 1) + (kernel[j] - 1) * dilations[j] + 1,
                        begins[j] + out_sp[j]) - lo[j] for j in range(rank))
    full = np.zeros((n, group, og, *full_sp), dtype=work)
    xg: Any = x.astype(work).reshape(n, group, cg, *x.shape[2:])
    wg: Any = w.astype(work).reshape(group, cg, og, *kernel)
    for k in itertools.product(*(range(d) for d in kernel)):
        contrib = np.einsum("ngc...,gco->ngo...", xg, wg[(Ellipsis, *k)])
        sl = tuple(slice(k[j] * dilations[j] - lo[j], k[j] * dilations[j] - lo[j]
                         + strides[j] * (x.shape[2 + j] - 1) + 1, strides[j])
                   for j in range(rank))
        full[(slice(None), slice(None), slice(None), *sl)] += contrib
    crop = tuple(slice(begins[j] - lo[j], begins[j] - lo[j] + out_sp[j]) for j in range(rank))
    out = full[(slice(None), slice(None), slice(None), *crop)].reshape(n, group * og, *out_sp)
    if b is not None:
        out = out + b.astype(work).reshape(1, -1, *([1] * rank))
    return out.astype(x.dtype)


for _rank in spatial.SPATIAL_RANKS:
    register_op(f"conv_transpose{spatial.SUFFIX[_rank]}", pattern="anchor",
                infer=_convt_infer, compute=_convt_compute, reference=_convt_ref)


# --------------------------------------------------------------------------- ONNX mapping

def _kernel(attrs: dict[str, Any], w: TensorType) -> tuple[int, ...]:
    kernel = tuple(int(k) for k in attrs.get("kernel_shape", w.static_shape[2:]))
    if kernel != w.static_shape[2:]:
        raise IRError(f"kernel_shape {kernel} does not match the weight {w.static_shape}")
    return kernel


@onnx_op("Conv")
def _conv_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
               attrs: dict[str, Any]) -> list[g.Expr]:
    x, w, b = inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None
    assert x is not None and w is not None
    xt, wt = ctx.tensor_type(x), ctx.tensor_type(w)
    rank = spatial.spatial_rank(xt.shape, "Conv")
    kernel = _kernel(attrs, wt)
    strides = spatial.ints(attrs, "strides", rank, 1)
    dilations = spatial.ints(attrs, "dilations", rank, 1)
    pads = spatial.onnx_pads(attrs, xt.shape[2:], kernel, strides, dilations)
    group = int(attrs.get("group", 1))
    if rank == 1 and xt.dtype == "float32":
        return [_conv1d_as_2d(ctx, x, w, b, group, strides, dilations, pads)]
    args = [x, w] if b is None else [x, w, b]
    return [ctx.call(f"conv{spatial.SUFFIX[rank]}", *args, group=group,
                     strides=strides, dilations=dilations, pads=pads)]


def _conv1d_as_2d(ctx: GraphContext, x: g.Expr, w: g.Expr, b: g.Expr | None, group: int,
                  strides: Sequence[int], dilations: Sequence[int],
                  pads: Sequence[int]) -> g.Expr:
    """A 1-D convolution as a 2-D one of height 1 (`[n, c, l]` viewed as `[n, c, 1, l]`),
    so it takes the hand-built 2-D kernels (conv_blocking), symbolic batch included:
    Whisper's and wav2vec's front ends. The views cost no copy of the weight (folded)."""
    def view(v: g.Expr, target: Sequence[Any]) -> g.Expr:
        return ctx.call("reshape", v, shape=reshape_attr(ctx.tensor_type(v).shape, target))

    (n, c, length), (o, i, k) = ctx.tensor_type(x).shape, ctx.tensor_type(w).shape
    args = [view(x, (n, c, 1, length)), view(w, (o, i, 1, k))]
    y = ctx.call("conv2d", *args, *([] if b is None else [b]), group=group,
                 strides=(1, strides[0]), dilations=(1, dilations[0]),
                 pads=(0, pads[0], 0, pads[1]))
    ys = ctx.tensor_type(y).shape
    return view(y, (ys[0], ys[1], ys[3]))


@onnx_op("ConvTranspose")
def _conv_transpose_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                         attrs: dict[str, Any]) -> list[g.Expr]:
    x, w, b = inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None
    assert x is not None and w is not None
    xt, wt = ctx.tensor_type(x), ctx.tensor_type(w)
    rank = spatial.spatial_rank(xt.shape, "ConvTranspose")
    kernel = _kernel(attrs, wt)
    strides = spatial.ints(attrs, "strides", rank, 1)
    dilations = spatial.ints(attrs, "dilations", rank, 1)
    out_pad = spatial.ints(attrs, "output_padding", rank, 0, least=0)
    auto = attrs.get("auto_pad", "NOTSET")
    if "output_shape" in attrs or auto in ("SAME_UPPER", "SAME_LOWER"):
        in_sp = TensorType(xt.shape[2:], xt.dtype).static_shape
        target = tuple(int(d) for d in attrs.get("output_shape", ()))[-rank:] or tuple(
            in_sp[j] * strides[j] for j in range(rank))
        total = [strides[j] * (in_sp[j] - 1) + out_pad[j] + (kernel[j] - 1) * dilations[j] + 1
                 - target[j] for j in range(rank)]
        # a negative total pads the end with zeros (as output_padding would)
        if auto == "SAME_UPPER":
            pads = (*(t // 2 for t in total), *(t - t // 2 for t in total))
        else:
            pads = (*(t - t // 2 for t in total), *(t // 2 for t in total))
    elif auto == "VALID" or "pads" not in attrs:
        pads = (0,) * (2 * rank)
    else:
        b_, e_ = spatial.pads(attrs, rank)
        pads = (*b_, *e_)
    args = [x, w] if b is None else [x, w, b]
    return [ctx.call(f"conv_transpose{spatial.SUFFIX[rank]}", *args,
                     group=int(attrs.get("group", 1)), strides=strides, dilations=dilations,
                     pads=pads, output_padding=out_pad)]


@onnx_op("MatMul")
def _matmul_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                 attrs: dict[str, Any]) -> list[g.Expr]:
    a, b = inputs[0], inputs[1]
    assert a is not None and b is not None
    return [ctx.call("matmul", a, b)]


@onnx_op("Gemm")
def _gemm_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
               attrs: dict[str, Any]) -> list[g.Expr]:
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    assert a is not None and b is not None
    if attrs.get("transA", 0):
        a = ctx.call("transpose", a, perm=(1, 0))
    # transB: matmul reads B transposed in place (a weight is never copied for it).
    y = ctx.call("matmul", a, b, **({"transpose_b": True} if attrs.get("transB", 0) else {}))
    dtype = ctx.tensor_type(y).dtype
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    if alpha != 1.0:
        y = ctx.call("multiply", y, ctx.const(alpha, dtype))
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = ctx.call("multiply", c, ctx.const(beta, dtype))
        y = ctx.call("add", y, c)
    return [y]


@onnx_op("Einsum")
def _einsum_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                 attrs: dict[str, Any]) -> list[g.Expr]:
    args = [x for x in inputs if x is not None]
    eq = str(attrs["equation"]).replace(" ", "")
    types = [ctx.tensor_type(x) for x in args]
    terms, out = parse_einsum(eq, [t.ndim for t in types])
    # The common patterns map onto existing ops: a transpose, a (batched) matmul.
    if len(terms) == 1 and sorted(terms[0]) == sorted(out) and len(set(out)) == len(out):
        perm = tuple(terms[0].index(c) for c in out)
        return [ctx.call("transpose", args[0], perm=perm)]
    if len(terms) == 2 and _is_matmul(terms[0], terms[1], out, types):
        return [ctx.call("matmul", args[0], args[1])]
    return [ctx.call("einsum", *args, equation=eq)]


def _is_matmul(a: str, b: str, out: str, types: Sequence[TensorType]) -> bool:
    """True for `...ij,...jk->...ik` with identical batch letters and shapes."""
    if len(a) < 2 or len(a) != len(b) or len(out) != len(a):
        return False
    batch = a[:-2]
    i, j, k = a[-2], a[-1], b[-1]
    if len({i, j, k, *batch}) != len(batch) + 3:
        return False
    return (b[:-2] == batch and b[-2] == j and out == batch + i + k
            and types[0].shape[:-2] == types[1].shape[:-2])


@onnx_op("BatchNormalization")
def _batchnorm_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                    attrs: dict[str, Any]) -> list[g.Expr]:
    x, scale, bias, mean, var = inputs[:5]
    assert x is not None and scale is not None and bias is not None
    assert mean is not None and var is not None
    xt = ctx.tensor_type(x)
    eps = float(attrs.get("epsilon", 1e-5))
    if ctx.tensor_type(scale).ndim > 1 or not attrs.get("spatial", 1):
        # opset 7-8 `spatial=0`: statistics per (C, spatial...) element
        shape = xt.static_shape[1:]
    else:
        shape = (_static_dim(xt, 1, "BatchNormalization"),) + (1,) * (xt.ndim - 2)
        for v, name in ((scale, "scale"), (bias, "B"), (mean, "input_mean"),
                        (var, "input_var")):
            check_per_channel(ctx, v, x, f"input {name}")
    training = bool(attrs.get("training_mode", 0)) and ctx.opset >= 14
    if training:
        return _batchnorm_training(ctx, x, scale, bias, mean, var, eps,
                                   float(attrs.get("momentum", 0.9)))
    # y = x * a + b with a = scale / sqrt(var + eps), b = bias - mean * a (per channel);
    # constant statistics fold here, and fold-batchnorm merges a, b into a conv.
    dtype = ctx.tensor_type(var).dtype
    a = ctx.call("divide", scale, ctx.call("sqrt", ctx.call("add", var, ctx.const(eps, dtype))))
    b = ctx.call("subtract", bias, ctx.call("multiply", mean, a))
    a = ctx.call("reshape", a, shape=shape)
    b = ctx.call("reshape", b, shape=shape)
    return [ctx.call("add", ctx.call("multiply", x, a), b)]


def _batchnorm_training(ctx: GraphContext, x: g.Expr, scale: g.Expr, bias: g.Expr,
                        mean: g.Expr, var: g.Expr, eps: float, momentum: float
                        ) -> list[g.Expr]:
    """Training mode: normalise with the batch statistics, update the running ones."""
    xt = ctx.tensor_type(x)
    dtype = xt.dtype
    axes = tuple(k for k in range(xt.ndim) if k != 1)
    shape = (xt.static_shape[1],) + (1,) * (xt.ndim - 2)
    bmean = ctx.call("reduce_mean", x, axes=axes, keepdims=True)
    centered = ctx.call("subtract", x, bmean)
    bvar = ctx.call("reduce_mean", ctx.call("multiply", centered, centered), axes=axes,
                    keepdims=True)
    inv = ctx.call("sqrt", ctx.call("add", bvar, ctx.const(eps, dtype)))
    y = ctx.call("divide", centered, inv)
    y = ctx.call("add", ctx.call("multiply", y, ctx.call("reshape", scale, shape=shape)),
                 ctx.call("reshape", bias, shape=shape))
    outs = [y]
    if len(ctx.node_outputs) > 1:
        c = xt.static_shape[1]
        keep = ctx.const(momentum, dtype)
        take = ctx.const(1.0 - momentum, dtype)
        for running, batch in ((mean, bmean), (var, bvar)):
            current = ctx.call("reshape", batch, shape=(c,))
            outs.append(ctx.call("add", ctx.call("multiply", running, keep),
                                 ctx.call("multiply", current, take)))
    return outs
