"""Neural-network anchor operators: matmul, einsum, convolution (1-3 spatial dims),
transposed convolution, col2im (the sum of a GEMM's columns into an image, which
float32 ConvTranspose and ONNX Col2Im lower to), and local response normalisation.

Attributes follow ONNX's spelling where one exists (strides, dilations, pads as
(begins..., ends...), group), so the frontend maps 1:1; see kiln.ops.spatial.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir.shape_expr import dim_text, dims_equal, is_static, shape_text, simplify_dim
from kiln.ir.tensor import Cast, PrimExpr, as_expr, min_, select
from kiln.ir.types import Dim, TensorType, Type
from kiln.ops import spatial, te
from kiln.ops._numpy import is_float
from kiln.ops._numpy import widen as widen_np
from kiln.ops.assumptions import unproven
from kiln.ops.broadcast import broadcast_index, broadcast_shapes
from kiln.ops.registry import register_op

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


def static_dim(t: TensorType, axis: int, what: str) -> int:
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
        text = f"matmul: inner dimensions differ: {shown[0]} @ {shown[1]}"
        if dims_equal(a2[-1], b2[-2]) is not None:
            raise IRError(text)
        unproven(text, a2[-1], b2[-2])
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
    static_dim(x, 1, "conv")
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


def conv_transpose_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    """The result type of a conv_transpose call (its checks and their messages)."""
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
    out_t = conv_transpose_infer([_tt(t) for t in inputs], attrs)
    assert isinstance(out_t, TensorType)
    _, strides, dilations, begins = _convt_geometry(x.shape, w.shape, attrs)
    rank = len(begins)
    group = int(attrs.get("group", 1))
    cg, og = w.shape[0] // group, w.shape[1]
    kernel = w.shape[2:]
    acc = acc_dtype(x.dtype)
    if 0 in (cg, *x.shape[2:]):  # no input element: every output is its bias (or 0)
        return te.compute(te.dims(out_t.shape), lambda n, oc, *o: as_expr(0, x.dtype)
                          if bias is None else bias[oc], x.dtype, "conv_transpose")

    def element(n: PrimExpr, oc: PrimExpr, *o: PrimExpr) -> PrimExpr:
        first = (oc // og) * cg if group > 1 else as_expr(0)
        local = oc % og if group > 1 else oc

        def term(c: PrimExpr, *k: PrimExpr) -> PrimExpr:
            # output o receives input i where o = i * stride + k * dilation - pad
            # a tap without an input element adds nothing: 0, not 0 x w (NaN for an
            # infinite weight), as onnxruntime's GEMM + col2im never forms that product
            pos: list[PrimExpr] = []
            ok: PrimExpr | None = None
            for j in range(rank):
                t = o[j] + begins[j] - k[j] * dilations[j]
                if strides[j] > 1:
                    divisible = (t % strides[j]).eq(0)
                    ok = divisible if ok is None else ok & divisible
                    t = t // strides[j]
                inside = (t >= 0) & (t < x.shape[2 + j])
                ok = inside if ok is None else ok & inside
                pos.append(te.clamp_index(t, x.shape[2 + j]))
            v = widen(x[(n, first + c, *pos)], acc) * widen(w[(first + c, local, *k)], acc)
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
                infer=conv_transpose_infer, compute=_convt_compute, reference=_convt_ref)


# --------------------------------------------------------------------------- col2im

def _col2im_geometry(attrs: Attrs) -> tuple[tuple[int, ...], ...]:
    """(image, block, strides, dilations, pad begins, pad ends, block positions per
    dim) of `col2im`; the pads may be negative (a transposed convolution's)."""
    image = tuple(int(v) for v in attrs["image_shape"])
    block = tuple(int(v) for v in attrs["block_shape"])
    rank = len(image)
    if rank < 1 or len(block) != rank:
        raise IRError(f"col2im: image_shape {list(image)} and block_shape {list(block)} "
                      f"differ in length")
    if min(image) < 0 or min(block) < 1 or max(*image, *block) > spatial.MAX_WINDOW:
        raise IRError(f"col2im: image_shape {list(image)} and block_shape {list(block)} "
                      f"must be in [0, {spatial.MAX_WINDOW}] and [1, {spatial.MAX_WINDOW}]")
    strides = spatial.ints(attrs, "strides", rank, 1)
    dilations = spatial.ints(attrs, "dilations", rank, 1)
    begins, ends = spatial.pads(attrs, rank, -spatial.MAX_WINDOW)
    counts = tuple(max(0, (image[j] + begins[j] + ends[j] - dilations[j] * (block[j] - 1) - 1)
                       // strides[j] + 1) for j in range(rank))
    return image, block, strides, dilations, begins, ends, counts


def _col2im_layout(x: TensorType | te.Tensor, attrs: Attrs) -> tuple[int, int, int]:
    """(groups, channels per group x prod(block), block positions) of col2im's input:
    [N, C * prod(block), L] (ONNX's layout) or [N, G, C/G * prod(block), L] (a grouped
    GEMM's columns); with `columns_last`, the last two axes swapped ([N, L, C *
    prod(block)], [N, G, L, C/G * prod(block)]: the rows of a GEMM of the input's pixels)."""
    shape = x.shape
    if len(shape) not in (3, 4):
        raise IRError(f"col2im: input must be [N, C * prod(block), L] or [N, G, C/G * "
                      f"prod(block), L], got {shape_text(shape)}")
    last = bool(attrs.get("columns_last", 0))
    dims = []
    for axis in range(1, len(shape)):
        d = shape[axis]
        if not isinstance(d, int):
            raise IRError(f"col2im: dimension {axis} of {shape_text(shape)} must be static")
        dims.append(d)
    groups = dims[0] if len(shape) == 4 else 1
    cb, length = (dims[-1], dims[-2]) if last else (dims[-2], dims[-1])
    return groups, cb, length


def _col2im_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    """col2im's input (`_col2im_layout`) -> [N, C, *image_shape]."""
    x = types[0]
    groups, cb, length = _col2im_layout(x, attrs)
    image, block, *_, counts = _col2im_geometry(attrs)
    blocks = int(np.prod(block))
    if cb % blocks:
        raise IRError(f"col2im: input has {cb} channels x blocks, not a multiple of the "
                      f"block size {blocks}")
    if int(np.prod(counts)) != length:
        raise IRError(f"col2im: input has {length} block positions, the attributes give "
                      f"{int(np.prod(counts))}")
    return TensorType((x.shape[0], groups * (cb // blocks), *image), x.dtype)


def _col2im_taps(stride: int, dilation: int, kernel: int, begin: int, count: int,
                 y: PrimExpr
                 ) -> tuple[int, Callable[[PrimExpr], tuple[PrimExpr, PrimExpr, PrimExpr]]]:
    """The block offsets that land on image position `y` along one dim: offset `k` of
    block position `i` lands on `i * stride + k * dilation - begin`. Their number `taps`
    (at most ceil(kernel / (stride / gcd))), and tap t -> (k, i) with a condition, in
    increasing k (onnxruntime's order of accumulation), as (clamped k and i, ok)."""
    g_ = math.gcd(stride, dilation)
    period = stride // g_  # the offsets landing on y are k0, k0 + period, ...
    taps = -(-kernel // period)
    # u >= 0 and u = y + begin (mod stride): floor division and modulo stay exact
    lift = -(-max(0, -begin) // stride)
    u = y + (begin + stride * lift)
    if period == 1:  # stride divides dilation: every offset, where stride divides u
        k0, base = as_expr(0), u // stride
    elif dilation == 1:
        k0, base = u % stride, u // stride
    else:  # k0 * dilation = u (mod stride)
        k0 = ((u // g_) * pow(dilation // g_, -1, period)) % period
        base = (u - k0 * dilation) // stride
    divisible = (u % g_).eq(0) if g_ > 1 else None
    step = dilation // g_  # i falls by this from one landing offset to the next

    def tap(t: PrimExpr) -> tuple[PrimExpr, PrimExpr, PrimExpr]:
        k = k0 + t * period if period > 1 else t
        i = base - (t * step if step > 1 else t) - lift
        ok = (i >= 0) & (i < count)
        if taps * period > kernel:
            ok = ok & (k < kernel)
            k = min_(k, kernel - 1)
        if divisible is not None:
            ok = ok & divisible
        return k, te.clamp_index(i, count), ok

    return taps, tap


def _col2im_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    """Each image element sums the column entries that land on it, and only those (an
    offset landing elsewhere or in the padding is never read: a NaN or an infinity
    stays where it lands, as in onnxruntime's scatter)."""
    x = inputs[0]
    out_t = _col2im_infer([_tt(x)], attrs)
    assert isinstance(out_t, TensorType)
    image, block, strides, dilations, begins, _, counts = _col2im_geometry(attrs)
    rank, blocks = len(image), int(np.prod(block))
    _, cb, length = _col2im_layout(x, attrs)
    per_group = cb // blocks  # channels per group (all of them without groups)
    last = bool(attrs.get("columns_last", 0))
    acc = acc_dtype(x.dtype)

    def read(n: PrimExpr, c: PrimExpr, b: PrimExpr, i: PrimExpr) -> PrimExpr:
        group: tuple[PrimExpr, ...] = () if x.ndim == 3 else (c // per_group,)
        row = (c % per_group if group else c) * blocks + b
        return x[(n, *group, *((i, row) if last else (row, i)))]

    if length == 0:  # no block position: nothing lands anywhere
        return te.compute(te.dims(out_t.shape), lambda *i: as_expr(0, x.dtype), x.dtype,
                          "col2im")

    def element(n: PrimExpr, c: PrimExpr, *y: PrimExpr) -> PrimExpr:
        dims = [_col2im_taps(strides[j], dilations[j], block[j], begins[j], counts[j], y[j])
                for j in range(rank)]

        def term(*t: PrimExpr) -> PrimExpr:
            taps = [tap(t[j]) for j, (_, tap) in enumerate(dims)]
            ok = taps[0][2]
            for _, _, cond in taps[1:]:
                ok = ok & cond
            v = read(n, c, te.flat_index([k for k, _, _ in taps], block),
                     te.flat_index([i for _, i, _ in taps], counts))
            return select(ok, widen(v, acc), as_expr(0, acc))

        return widen(te.reduce("sum", term, [taps for taps, _ in dims], acc), x.dtype)

    return te.compute(te.dims(out_t.shape), element, x.dtype, "col2im")


def _col2im_ref(x: np.ndarray, **attrs: Any) -> np.ndarray:
    """numpy reference of col2im: onnxruntime's scatter, one block offset after the
    other (a NaN or an infinity lands where its column entry lands, and nowhere else)."""
    image, block, strides, dilations, begins, _, counts = _col2im_geometry(attrs)
    if attrs.get("columns_last", 0):
        x = np.swapaxes(x, -1, -2)
    n, cb = x.shape[0], int(np.prod(x.shape[1:-1]))
    rank, blocks = len(image), int(np.prod(block))
    work = np.float64 if is_float(x) else np.int64
    cols: Any = x.astype(work).reshape(n, cb // blocks, *block, *counts)
    out: Any = np.zeros((n, cb // blocks, *image), work)
    every = (slice(None), slice(None))
    for k in itertools.product(*map(range, block)):
        at = [np.arange(counts[j]) * strides[j] + k[j] * dilations[j] - begins[j]
              for j in range(rank)]
        keep = [(a >= 0) & (a < image[j]) for j, a in enumerate(at)]
        where = np.ix_(*(a[m] for a, m in zip(at, keep)))
        taken = np.ix_(*(np.flatnonzero(m) for m in keep))
        # one offset's entries land on distinct positions: a plain += adds each once
        out[(*every, *where)] += cols[(*every, *k)][(*every, *taken)]
    return np.asarray(out.astype(x.dtype))


register_op("col2im", pattern="anchor", infer=_col2im_infer, compute=_col2im_compute,
            reference=_col2im_ref)
