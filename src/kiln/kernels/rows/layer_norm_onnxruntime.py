"""layer_norm rows computed as onnxruntime computes them, step for step, so that a
quantized model's next DynamicQuantizeLinear sees onnxruntime's values (kiln.kernels.rows):

- marked `residual` (recognize-composites: its input is a residual sum), as
  onnxruntime's SkipLayerNormalization computes it (`layer_norm_welford_rows`);
- marked `like_onnxruntime` (the other layer norms of a quantized model), as
  onnxruntime's LayerNormalization computes it with MLAS's AVX2 kernel on an x86
  target with AVX2 and FMA (`layer_norm_mlas_row`: a float64 mean, then centred FMA
  squares).
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    Cast,
    For,
    PrimExpr,
    Stmt,
    Store,
    Var,
    as_expr,
    intrin,
    seq,
)
from kiln.kernels.rows.loops import F32, Reader, RowLoops, bind_zero, halving_sum, let
from kiln.kernels.tiles import const as _c
from kiln.target.isa import ISA

#: Vectors of rows whose Welford chains (a division each step) run side by side.
WELFORD_VECTORS = 4


def layer_norm_welford_rows(count: int, read: Callable[[PrimExpr, PrimExpr], PrimExpr],
                            n: int, eps: float,
                            normalize: Callable[[PrimExpr, PrimExpr, PrimExpr], Stmt],
                            rows: int | PrimExpr | None = None) -> Stmt:
    """`count` rows of layer_norm, lane `l` of the statistics loop on row `l`: Welford's
    running mean and sum of squared deviations, element by element in row order, then
    `normalize(l, mean, std)` for each row (`std = sqrt(var + eps)`). This is
    onnxruntime's SkipLayerNormalization on float32, step for step (its kernel's
    `mean += d / k`, `m2 += d * (x - mean)`, then `(x - mean) / std * gamma + beta`), so
    the two agree bit for bit; a row's elements are read `count` rows apart, but the
    serial chain through the mean, not the loads, bounds the loop, and `count` rows run
    it side by side. `rows` (default `count`; at most `count`, may be symbolic): the rows
    normalized, the first ones of the lanes (a symbolic row count's last group: the
    caller's `read` gives the surplus lanes a row that exists)."""
    lane = Var("l", INDEX_DTYPE)
    kind = "vectorized" if count > 1 else "serial"
    mean = Buffer("w_mean", (count,), F32, "local")
    m2 = Buffer("w_m2", (count,), F32, "local")
    k = Var("k", INDEX_DTYPE)
    zero = as_expr(0.0, F32)
    init = For(lane, _c(0), _c(count), kind, seq(Store(mean, zero, (lane,)),
                                                 Store(m2, zero, (lane,))))
    x, let_x = let("x", read(lane, k))
    d, let_d = let("d", x - mean[lane])
    m, let_m = let("m", mean[lane] + d / Cast(F32, k + _c(1)))
    step = For(k, _c(0), _c(n), "serial", For(lane, _c(0), _c(count), kind, seq(
        let_x, let_d, let_m, Store(mean, m, (lane,)),
        Store(m2, m2[lane] + d * (x - m), (lane,)))))
    # the statistics leave the stack (a loop over rows reading stack arrays could not be
    # split over threads: parallelize may outline it)
    stats = Buffer("w_stats", (2, count), F32)
    keep = For(lane, _c(0), _c(count), kind, seq(
        Store(stats, mean[lane], (_c(0), lane)),
        Store(stats, intrin("sqrt", m2[lane] / as_expr(float(n), F32) + as_expr(eps, F32)),
              (_c(1), lane))))
    r = Var("r", INDEX_DTYPE)
    extent = as_expr(count if rows is None else rows, INDEX_DTYPE)
    each = For(r, _c(0), extent, "serial", normalize(r, stats[_c(0), r], stats[_c(1), r]))
    return seq(Allocate(mean), Allocate(m2), Allocate(stats), init, step, keep, each)


def mlas_layer_norm(isa: ISA) -> bool:
    """Whether onnxruntime runs LayerNormalization with MLAS's AVX2 kernel on a CPU of `isa`
    (x86 with AVX2 and FMA: MLAS picks it from the CPU, on AVX-512 ones too)."""
    return isa.arch in ("x86_64", "i386", "i686") and isa.fma and "avx2" in isa.features


def _chunks(n: int, lanes: int, body: Callable[[PrimExpr, PrimExpr], Stmt]) -> Stmt:
    """`body(j, lane)` over the first `n // lanes` chunks of `lanes` elements (vectorized)."""
    chunks = n // lanes
    if not chunks:
        return seq()
    c, lane = Var("c", INDEX_DTYPE), Var("l", INDEX_DTYPE)
    inner = For(lane, _c(0), _c(lanes), "vectorized", body(c * lanes + lane, lane))
    return For(c, _c(0), _c(chunks), "serial", inner) if chunks > 1 else bind_zero(c, inner)


def _serial(start: int, stop: int, body: Callable[[PrimExpr], Stmt]) -> Stmt:
    if stop <= start:
        return seq()
    j = Var("j", INDEX_DTYPE)
    return For(j, _c(0), _c(stop - start), "serial", body(j + start))


def layer_norm_mlas_row(n: int, read: Reader, store: Callable[[PrimExpr, PrimExpr], Stmt],
                        affine: Callable[[PrimExpr, PrimExpr], PrimExpr], eps: float) -> Stmt:
    """One row of layer_norm as onnxruntime's LayerNormalization computes it on x86 with
    AVX2 and FMA (MLAS's AVX2 LayerNorm kernel, rows of `MLAS_LAYER_NORM_MIN` or more),
    step for step, so the two agree bit for bit (probed on onnxruntime 1.32's outputs and
    its Mean / InvStdDev outputs, docs/quantization.md):

    - the mean in float64: 4 lanes over chunks of 4, reduced upper half onto lower, the
      last `n % 4` elements added in order, divided by `n` and rounded to float32;
    - the centred squares `d = x - mean` in float32: 8 lanes over chunks of 8 with FMA,
      reduced upper half onto lower; of the last `n % 8`, whole groups of 4 add their
      rounded squares in order (its compiler's vectorized tail), the rest with FMA;
    - `inv = 1 / sqrt(var / n + eps)` in float32, then `affine(j, (x - mean) * inv)`
      (`fma(y, gamma, beta)`: the caller's)."""
    f64 = "float64"
    dacc, init_d = RowLoops(n, 4).accumulators("sum_f64", as_expr(0.0, f64))
    dsum = Buffer("mean_f64", (1,), f64, "local")
    zero = (_c(0),)
    pass1 = seq(*init_d, _chunks(n, 4, lambda j, lane: Store(
        dacc, dacc[lane] + Cast(f64, read(j)), (lane,))),
        Allocate(dsum), Store(dsum, halving_sum(dacc, 4), zero),
        _serial(n - n % 4, n, lambda j: Store(dsum, dsum[zero] + Cast(f64, read(j)), zero)))
    mean, let_mean = let("mean", Cast(F32, dsum[zero] / as_expr(float(n), f64)))

    vacc, init_v = RowLoops(n, 8).accumulators("centred", as_expr(0.0, F32))
    var = Buffer("var", (1,), F32, "local")
    tail = n - n % 8
    rounded = tail + (n % 8) // 4 * 4  # the tail's groups of 4: rounded squares

    def square(j: PrimExpr) -> tuple[Var, Stmt]:
        return let("d", read(j) - mean)

    def lanes_step(j: PrimExpr, lane: PrimExpr) -> Stmt:
        d, let_d = square(j)
        return seq(let_d, Store(vacc, intrin("fma", d, d, vacc[lane]), (lane,)))

    def rounded_step(j: PrimExpr) -> Stmt:
        d, let_d = square(j)
        return seq(let_d, Store(var, var[zero] + d * d, zero))

    def fused_step(j: PrimExpr) -> Stmt:
        d, let_d = square(j)
        return seq(let_d, Store(var, intrin("fma", d, d, var[zero]), zero))

    pass2 = seq(*init_v, _chunks(n, 8, lanes_step), Allocate(var),
                Store(var, halving_sum(vacc, 8), zero), _serial(tail, rounded, rounded_step),
                _serial(rounded, n, fused_step))
    inv, let_inv = let("inv", as_expr(1.0, F32) / intrin(
        "sqrt", var[zero] / as_expr(float(n), F32) + as_expr(eps, F32)))
    loops = RowLoops(n, 8)
    pass3 = loops.each(lambda j, lane: store(j, affine(j, (read(j) - mean) * inv)))
    return seq(pass1, let_mean, pass2, let_inv, pass3)
