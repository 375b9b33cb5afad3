"""Operators at the edges of float32 against onnxruntime, on llvm, llvm-avx2 and c.

Each group is one model, compiled once per target:

- unary math and activations, and Pow's pairs, fed +-0, +-inf, NaN, subnormals,
  +-FLT_MAX, large magnitudes and erf's tails (Gelu in both forms and spelled out with
  Erf among them);
- normalisations (LayerNormalization, the layer norm spelled out as exporters write it,
  GroupNormalization, InstanceNormalization over 1 and 2 axes, MeanVarianceNormalization,
  RMSNormalization) on rows whose sum or squares overflow, constant and subnormal rows,
  rows holding inf or NaN, rows far from zero;
- Cast and CastLike from float32, float64, float16 and bfloat16 to every integer type
  and bool, NaN, +-inf and out-of-range values included, and a Cast of a constant
  (folded at import by the op's numpy reference); Pow of int32 and int64 bases by
  float32 and float64 exponents (a float result cast back);
- LayerNormalization's Mean and InvStdDev outputs on rows of 4, 5 and 12 holding an
  infinity at each position, NaN, overflowing sums; training-mode BatchNormalization
  with a scale near the float32 limit.

A match is NaN for NaN, an infinity for the same infinity, else within the group's
tolerance; casts match exactly. Where onnxruntime's own kernel is the odd one out
(docs/onnx.md, "Numerics at the edges"), the reference is another onnxruntime op that
computes the same thing: its LayerNormalization for GroupNormalization,
InstanceNormalization and MeanVarianceNormalization, whose onnxruntime kernels take
E[x^2] - E[x]^2 in float32.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from onnx import TensorProto

import kiln
from kiln.frontend import from_onnx
from kiln.ops import get_op
from kiln.script.source import from_source
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs
from support.targets import NATIVE_TARGETS, native_target

RNG = np.random.default_rng(20)
FLT_MAX = float(np.finfo(np.float32).max)
FLT_MIN = float(np.finfo(np.float32).tiny)

EDGES = np.array([
    0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-40, -1e-40, FLT_MIN, -FLT_MIN,
    FLT_MAX, -FLT_MAX, 1e30, -1e30, 1e20, -1e20, 1e4, -1e4, 110.0, -110.0, 88.72, 88.73,
    -87.5, -103.9, -104.0, 50.0, -50.0, 30.0, -30.0, 20.0, -20.0, 15.0, -15.0, 11.1, -11.1,
    10.0, -10.0, 9.1, -9.1, 7.0, -7.0, 6.0, -6.0, 5.0, -5.0, 4.0, -4.0, 3.925, -3.925,
    3.9, -3.9, 3.5, -3.5, 3.0, -3.0, 2.0, -2.0, 1.0, -1.0, 0.921875, -0.921875, 0.625,
    -0.625, 0.5, -0.5, 0.1, -0.1, 1e-10, -1e-10,
], np.float32)
# erf over the whole float32 range: every magnitude, and densely where it bends
ERF_SWEEP = np.concatenate([
    np.linspace(-12.0, 12.0, 4801), np.logspace(-45, 38.5, 600), -np.logspace(-45, 38.5, 600),
    EDGES]).astype(np.float32)

# Subnormal results agree to this: onnxruntime's tanh (a rational function, MLAS) rounds
# a subnormal x to a few hundred of their units off x; 0 for x would still fail by far
SUB = 1e-42
# (op, attributes, rtol, atol); atol covers what float32 cannot resolve near zero
UNARY = [
    ("Exp", {}, 1e-5, SUB), ("Log", {}, 1e-5, 0.0), ("Sqrt", {}, 1e-6, 0.0),
    ("Reciprocal", {}, 0.0, 0.0), ("Tanh", {}, 1e-5, SUB), ("Erf", {}, 1e-5, SUB),
    # onnxruntime's logistic (MLAS) flushes to 0 below about -17, kiln's goes on
    ("Sigmoid", {}, 1e-5, 1e-6), ("Softplus", {}, 1e-5, SUB), ("Softsign", {}, 1e-6, 0.0),
    ("Selu", {}, 1e-5, SUB), ("Elu", {}, 1e-5, SUB), ("Celu", {"alpha": 2.0}, 1e-5, SUB),
    ("Mish", {}, 1e-5, SUB), ("HardSwish", {}, 1e-6, 0.0), ("HardSigmoid", {}, 1e-6, 0.0),
    ("Relu", {}, 0.0, 0.0), ("LeakyRelu", {}, 0.0, 0.0), ("ThresholdedRelu", {}, 0.0, 0.0),
    # 0.5 x (1 + erf) cancels below -3: an error of |x| 2^-24, which atol allows there
    ("Gelu", {}, 1e-5, 1e-6),
    # onnxruntime computes 0.5 x (1 + tanh u), kiln x sigmoid(2u): rounded to 0 or not
    ("Gelu", {"approximate": "tanh"}, 1e-5, 1e-6),
]
POW_BASES = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0, -3.0, 1.5, 100.0, 1e-3, 1e-45,
             1e30, -1e30, np.inf, -np.inf, np.nan]
POW_PAIRS = np.array(list(itertools.product(POW_BASES, POW_BASES)), np.float32).T


@pytest.fixture(scope="module", params=[*NATIVE_TARGETS, "reference"])
def target(request: pytest.FixtureRequest) -> kiln.target.Target | None:
    """A native target, or None: the graph run by the ops' numpy references (what
    constant folding computes)."""
    return None if request.param == "reference" else native_target(request.param)


# Graphs the references run as written, where the compiled code runs a rewrite or float32
# sums: the spelled-out GELU and layer norm (recognize-composites fuses them) and
# RMSNormalization's mean of squares (reduce_mean's reference sums in float64: no overflow)
AS_WRITTEN = {"Gelu spelled out", "layer norm spelled out", "RMSNormalization"}


def skip_as_written(target: kiln.target.Target | None, name: str) -> None:
    if target is None and name in AS_WRITTEN:
        pytest.skip(f"{name}: the references run the graph as written (AS_WRITTEN)")


def mismatches(x: np.ndarray, got: np.ndarray, want: np.ndarray, rtol: float,
               atol: float) -> list[tuple[float, float, float]]:
    """(input, onnxruntime, kiln) where `got` does not match `want` (module docstring)."""
    g, w = got.astype(np.float64).ravel(), want.astype(np.float64).ravel()
    nan_g, nan_w = np.isnan(g), np.isnan(w)
    with np.errstate(invalid="ignore"):
        inf = np.isinf(g) | np.isinf(w)
        close = np.abs(g - w) <= atol + rtol * np.abs(w)
    ok = (nan_g & nan_w) | (~nan_g & ~nan_w & np.where(inf, g == w, close))
    xs = np.broadcast_to(x, got.shape).ravel()
    return [(float(xs[i]), float(w[i]), float(g[i])) for i in np.flatnonzero(~ok)]


# --------------------------------------------------------------------------- groups

@dataclass(frozen=True)
class Group:
    """One compile's worth of cases: a model, its feeds and a name per output."""

    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    names: list[str]


def unary_group() -> Group:
    b = GraphBuilder()
    b.input("x", EDGES.shape)
    names = []
    for op, attrs, _, _ in UNARY:
        b.output(b.op(op, "x", **attrs), EDGES.shape)
        names.append(f"{op}{attrs or ''}")
    b.output(b.gelu_erf("x"), EDGES.shape)  # recognize-composites makes it a gelu
    names.append("Gelu spelled out")
    b.input("sweep", ERF_SWEEP.shape)
    b.output(b.op("Erf", "sweep"), ERF_SWEEP.shape)
    names.append("Erf sweep")
    b.inputs_for({"base": POW_PAIRS[0], "exponent": POW_PAIRS[1]})
    b.output(b.op("Pow", "base", "exponent"), POW_PAIRS[0].shape)
    names.append("Pow")
    feeds = {"x": EDGES, "sweep": ERF_SWEEP, "base": POW_PAIRS[0], "exponent": POW_PAIRS[1]}
    return Group(b.model(opset=20), feeds, names)


WIDTH = 24  # a vector body and a tail on every target


def norm_rows() -> np.ndarray:
    w, half = WIDTH, WIDTH // 2
    alternate = np.tile([1.0, -1.0], half)
    rows = [
        1e20 * alternate,                         # squares overflow: onnxruntime's 0
        3e38 * alternate,                         # the sum overflows too
        np.r_[3e38, -3e38, np.zeros(w - 2)],
        FLT_MAX * alternate,                      # x - x[0] overflows
        np.full(w, 3e38), np.full(w, FLT_MAX),   # constant: 0
        1e19 * RNG.standard_normal(w),            # only the sum of squares overflows
        1e4 + RNG.standard_normal(w),             # far from zero against the spread
        -1e6 + 100 * RNG.standard_normal(w),
        np.r_[0.0, 1e4 + RNG.standard_normal(w - 1)],  # the first element an outlier
        np.r_[np.zeros(3), np.inf, np.zeros(w - 4)],
        np.r_[np.zeros(5), np.nan, np.zeros(w - 6)],
        np.r_[-np.inf, np.ones(w - 1)],
        np.full(w, 1e-40), 1e-40 * RNG.uniform(-1, 1, w),  # subnormal
        np.zeros(w), np.full(w, 7.0),
        1e-20 * RNG.standard_normal(w),           # variance far below epsilon
        RNG.standard_normal(w),
    ]
    return np.array(rows, np.float32)


ROWS = norm_rows()


def norm_group() -> Group:
    b = GraphBuilder()
    r, w = ROWS.shape
    b.input("x", (1, r, w))
    ones_w, zeros_w = np.ones(w, np.float32), np.zeros(w, np.float32)
    ones_c, zeros_c = np.ones(r, np.float32), np.zeros(r, np.float32)
    outputs = {
        "LayerNormalization": b.op("LayerNormalization", "x", b.const(ones_w),
                                   b.const(zeros_w), axis=-1, epsilon=1e-5),
        "layer norm spelled out": spelled_layer_norm(b, "x"),
        "GroupNormalization": b.op("GroupNormalization", "x", b.const(ones_c),
                                   b.const(zeros_c), num_groups=r, epsilon=1e-5),
        "InstanceNormalization": b.op("InstanceNormalization", "x", b.const(ones_c),
                                      b.const(zeros_c), epsilon=1e-5),
        "InstanceNormalization 2-D": b.op("Reshape", b.op(
            "InstanceNormalization", b.op("Reshape", "x", b.const(
                np.array([1, r, 4, w // 4], np.int64))), b.const(ones_c), b.const(zeros_c),
            epsilon=1e-5), b.const(np.array([1, r, w], np.int64))),
        "MeanVarianceNormalization": b.op("MeanVarianceNormalization", "x", axes=[2]),
        "RMSNormalization": b.op("RMSNormalization", "x", b.const(ones_w), axis=-1,
                                 epsilon=1e-5),
    }
    for y in outputs.values():
        b.output(y, (1, r, w))
    return Group(b.model(opset=23), {"x": ROWS[None]}, list(outputs))


def spelled_layer_norm(b: GraphBuilder, x: str) -> str:
    """(x - mean) / sqrt(mean((x - mean)^2) + eps) * gamma + beta, as torch exports it."""
    last = b.const(np.array([-1], np.int64))  # ReduceMean's axes are an input from opset 18
    centred = b.op("Sub", x, b.op("ReduceMean", x, last))
    var = b.op("ReduceMean", b.op("Pow", centred, b.const(np.array(2.0, np.float32))), last)
    std = b.op("Sqrt", b.op("Add", var, b.const(np.array(1e-5, np.float32))))
    gamma, beta = b.const(np.ones(WIDTH, np.float32)), b.const(np.zeros(WIDTH, np.float32))
    return b.op("Add", b.op("Mul", b.op("Div", centred, std), gamma), beta)


def layer_norm_reference(epsilon: float) -> np.ndarray:
    """onnxruntime's LayerNormalization of ROWS (scale 1, bias 0)."""
    b = GraphBuilder()
    b.input("x", (1, *ROWS.shape))
    b.output(b.op("LayerNormalization", "x", b.const(np.ones(WIDTH, np.float32)),
                  b.const(np.zeros(WIDTH, np.float32)), axis=-1, epsilon=epsilon),
             (1, *ROWS.shape))
    return onnxruntime_outputs(b.model(opset=17), {"x": ROWS[None]})[0]


# onnxruntime's InstanceNormalization, GroupNormalization and MeanVarianceNormalization
# lose the rows far from zero (E[x^2] - E[x]^2): its LayerNormalization is their reference
LAYER_NORM_OF = {"GroupNormalization": 1e-5, "InstanceNormalization": 1e-5,
                 "InstanceNormalization 2-D": 1e-5, "MeanVarianceNormalization": 1e-9}


def row_tolerance(epsilon: float) -> np.ndarray:
    """Per row: four units in the last place of the float32 mean, scaled as the outputs
    are (a mean rounded one unit apart moves every output of a far-from-zero row)."""
    x = ROWS.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        mean = x.mean(axis=1)
        spread = np.sqrt(((x - mean[:, None]) ** 2).mean(axis=1) + epsilon)
        tol = 4 * np.spacing(np.abs(mean.astype(np.float32))).astype(np.float64) / spread
    return np.nan_to_num(tol, nan=0.0, posinf=0.0)


CAST_VALUES = [
    np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, -1.5, 127.9, -128.9, 255.9, 256.0, -129.0,
    300.5, -300.5, 65504.0, -65504.0, 70000.0, -70000.0, 2.0 ** 31 - 128, 2.0 ** 31,
    -2.0 ** 31, -2147483648.5, 2147483647.5, 3e9, -3e9, 5e9, 1e10, -1e10, 2.0 ** 32,
    9.2e18, 2.0 ** 63, -2.0 ** 63, 1e19, -1e19, 1.8e19, 2.0 ** 64, 1e30, -1e30, 1e-40,
]
# whole vectors: onnxruntime's float -> uint32 differs between its vector loop and its
# scalar tail (docs/onnx.md); 16 values of each array take the vector loop
CAST_VALUES += [0.0] * (-len(CAST_VALUES) % 16)
INT_TYPES = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8, "int16": TensorProto.INT16,
             "uint16": TensorProto.UINT16, "int32": TensorProto.INT32,
             "uint32": TensorProto.UINT32, "int64": TensorProto.INT64,
             "uint64": TensorProto.UINT64, "bool": TensorProto.BOOL}


def cast_group() -> Group:
    with np.errstate(over="ignore"):
        feeds = {"f32": np.array(CAST_VALUES, np.float32),
                 "f64": np.array(CAST_VALUES, np.float64),
                 "f16": np.array(CAST_VALUES, np.float64).astype(np.float16)}
    b = GraphBuilder()
    b.inputs_for(feeds)
    sources = {"float32": "f32", "float64": "f64", "float16": "f16",
               "bfloat16": b.op("Cast", "f32", to=TensorProto.BFLOAT16)}
    names = []
    n = len(CAST_VALUES)
    for (src, value), (dst, elem) in itertools.product(sources.items(), INT_TYPES.items()):
        b.output(b.op("Cast", value, to=elem), (n,), elem)
        names.append(f"{src}->{dst}")
    like = b.const(np.zeros(1, np.int8))
    b.output(b.op("CastLike", "f32", like), (n,), TensorProto.INT8)
    names.append("CastLike float32->int8")
    for dst in ("uint8", "int32", "uint64"):  # folded at import: the op's reference
        b.output(b.op("Cast", b.const(feeds["f32"]), to=INT_TYPES[dst]), (n,), INT_TYPES[dst])
        names.append(f"constant float32->{dst}")
    names += int_pow(b, feeds)
    return Group(b.model(opset=19), feeds, names)


POW_INT_BASES = [3, -3, 0, 1, -1, 2, 7]
POW_FLOAT_EXPONENTS = [np.nan, np.inf, -np.inf, -1e20, 1e20, 2.5, 0.5, -1.0, -0.0, 1e-40,
                       3.0, 30.0, 40.0, 62.0, 63.0, 100.0]


def int_pow(b: GraphBuilder, feeds: dict[str, np.ndarray]) -> list[str]:
    """Pow of int32 and int64 bases by float32 and float64 exponents: a float result cast
    back to the base's type (onnxruntime's std::pow in double, then x86's conversion)."""
    base, exponent = np.array(list(itertools.product(POW_INT_BASES, POW_FLOAT_EXPONENTS))).T
    n = base.size
    names = []
    for ib, ie in itertools.product((np.int32, np.int64), (np.float32, np.float64)):
        bn, en = f"pow_base_{np.dtype(ib).name}", f"pow_exponent_{np.dtype(ie).name}"
        if bn not in feeds:
            feeds[bn] = base.astype(ib)
            b.input(bn, (n,), INT_TYPES[np.dtype(ib).name])
        if en not in feeds:
            feeds[en] = exponent.astype(ie)
            b.input(en, (n,), TensorProto.FLOAT if ie is np.float32 else TensorProto.DOUBLE)
        b.output(b.op("Pow", bn, en), (n,), INT_TYPES[np.dtype(ib).name])
        names.append(f"Pow {np.dtype(ib).name} ** {np.dtype(ie).name}")
    return names


GROUPS = {"unary": unary_group(), "norm": norm_group(), "cast": cast_group()}
UNARY_NAMES, NORM_NAMES, CAST_NAMES = (GROUPS[k].names for k in ("unary", "norm", "cast"))


@pytest.fixture(scope="module")
def want() -> dict[str, list[np.ndarray]]:
    """onnxruntime's outputs of every group; for the normalisations LAYER_NORM_OF names,
    its LayerNormalization of the same rows."""
    outs = {name: onnxruntime_outputs(g.model, g.feeds) for name, g in GROUPS.items()}
    for name, epsilon in LAYER_NORM_OF.items():
        outs["norm"][NORM_NAMES.index(name)] = layer_norm_reference(epsilon)
    return outs


@pytest.fixture(scope="module")
def got(target: kiln.target.Target | None) -> dict[str, list[np.ndarray]]:
    """Every group's outputs compiled for `target` (None: run by the ops' references)."""
    outs = {}
    for name, g in GROUPS.items():
        if target is None:
            with np.errstate(all="ignore"):  # the references meet NaN and overflow as numpy
                out = kiln.evaluate(from_onnx(g.model), "main", *g.feeds.values())
        else:
            out = kiln.compile(from_onnx(g.model), target)(*g.feeds.values())
        outs[name] = [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]
    return outs


# --------------------------------------------------------------------------- unary

@pytest.mark.parametrize("k", range(len(UNARY)), ids=UNARY_NAMES[:len(UNARY)])
def test_unary_at_the_edges_matches_onnxruntime(k: int, got: dict[str, list[np.ndarray]],
                                                want: dict[str, list[np.ndarray]]) -> None:
    _, _, rtol, atol = UNARY[k]
    bad = mismatches(EDGES, got["unary"][k], want["unary"][k], rtol, atol)
    assert not bad, f"{UNARY_NAMES[k]} (x, onnxruntime, kiln): {bad}"


def test_gelu_spelled_with_erf_matches_onnxruntime(
        target: kiln.target.Target | None, got: dict[str, list[np.ndarray]],
        want: dict[str, list[np.ndarray]]) -> None:
    skip_as_written(target, "Gelu spelled out")
    k = UNARY_NAMES.index("Gelu spelled out")
    bad = mismatches(EDGES, got["unary"][k], want["unary"][k], 1e-5, 1e-6)
    assert not bad, f"(x, onnxruntime, kiln): {bad}"


def test_erf_reaches_one_and_matches_onnxruntime_over_float32(
        got: dict[str, list[np.ndarray]], want: dict[str, list[np.ndarray]]) -> None:
    k = UNARY_NAMES.index("Erf sweep")
    ours = got["unary"][k]
    bad = mismatches(ERF_SWEEP, ours, want["unary"][k], 1e-6, SUB)
    assert not bad, f"(x, onnxruntime, kiln): {bad[:20]}"
    # +-1 exactly in the tails, as libm's and onnxruntime's: 1 + erf(x) is 0 there (Gelu)
    tails = np.abs(ERF_SWEEP) >= 3.925
    np.testing.assert_array_equal(ours[tails], np.sign(ERF_SWEEP[tails]))
    zeros = ERF_SWEEP == 0
    np.testing.assert_array_equal(np.signbit(ours[zeros]), np.signbit(ERF_SWEEP[zeros]))


def test_pow_edge_pairs_match_onnxruntime(got: dict[str, list[np.ndarray]],
                                          want: dict[str, list[np.ndarray]]) -> None:
    k = UNARY_NAMES.index("Pow")
    bad = mismatches(POW_PAIRS[0], got["unary"][k], want["unary"][k], 1e-6, 0.0)
    assert not bad, f"(base, onnxruntime, kiln): {bad}"


# --------------------------------------------------------------------------- norms

@pytest.mark.parametrize("name", NORM_NAMES)
def test_normalisations_of_edge_rows_match_onnxruntime(
        name: str, target: kiln.target.Target | None, got: dict[str, list[np.ndarray]],
        want: dict[str, list[np.ndarray]]) -> None:
    skip_as_written(target, name)
    # RMSNormalization has no mean to round
    atol = 1e-6 + (np.zeros(len(ROWS)) if name == "RMSNormalization" else
                   row_tolerance(LAYER_NORM_OF.get(name, 1e-5)))
    k = NORM_NAMES.index(name)
    ours, theirs = got["norm"][k][0], want["norm"][k][0]
    bad = [(row, *m) for row in range(ROWS.shape[0])
           for m in mismatches(ROWS[row], ours[row], theirs[row], 1e-4, float(atol[row]))]
    assert not bad, f"{name} (row, x, reference, kiln): {bad[:12]}"


# --------------------------------------------------------------------------- casts

POW_NAMES = [name for name in CAST_NAMES if name.startswith("Pow")]


@pytest.mark.parametrize("name", [n for n in CAST_NAMES if n not in POW_NAMES])
def test_cast_of_nan_inf_and_out_of_range_matches_onnxruntime(
        name: str, got: dict[str, list[np.ndarray]], want: dict[str, list[np.ndarray]]) -> None:
    assert_same_ints(name, CAST_VALUES, got, want)


@pytest.mark.parametrize("name", POW_NAMES)
def test_int_pow_by_float_exponents_matches_onnxruntime(
        name: str, got: dict[str, list[np.ndarray]], want: dict[str, list[np.ndarray]]) -> None:
    """`3 ** 2.5` is 15; a NaN exponent, `3 ** inf` and overflows the most negative
    value; `3 ** -1e20` 0; llvm and c alike."""
    assert_same_ints(name, list(itertools.product(POW_INT_BASES, POW_FLOAT_EXPONENTS)), got,
                     want)


def assert_same_ints(name: str, values: list, got: dict[str, list[np.ndarray]],
                     want: dict[str, list[np.ndarray]]) -> None:
    k = CAST_NAMES.index(name)
    ours, theirs = got["cast"][k], want["cast"][k]
    assert ours.dtype == theirs.dtype, (ours.dtype, theirs.dtype)
    bad = [(v, int(w), int(g)) for v, w, g in zip(values, theirs, ours) if w != g]
    assert not bad, f"{name} (x, onnxruntime, kiln): {bad}"


INTERNAL_CAST = """
@G.function
def main(x: G.Tensor((8,), "float32")) -> G.Tensor((8,), "int32"):
    y: G.Tensor((8,), "int32") = G.op("cast", x, dtype="int32")
    return y
"""


def test_kilns_own_casts_keep_the_ir_rule() -> None:
    """Only ONNX's Cast takes onnxruntime's rule: a `cast` call without it (the index
    arithmetic of other converters) keeps the IR's (kiln.codegen.llvm.arith: NaN 0,
    wrapped within int64, saturated beyond), compiled and in its numpy reference."""
    x = np.array([np.nan, 3e9, -1.5, 300.5, np.inf, -np.inf, 1e19, -5e9], np.float32)
    want = np.array([0, 3_000_000_000 - 2 ** 32, -1, 300, -1, 0, -1, 2 ** 32 - 5_000_000_000],
                    np.int32)
    got = kiln.compile(from_source(INTERNAL_CAST), kiln.target.Target.from_host())(x)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(get_op("cast").reference(x, dtype="int32"), want)


# --------------------------------------------------------------------------- statistics

def stat_rows(n: int) -> np.ndarray:
    """Rows of `n` for LayerNormalization's Mean and InvStdDev: an infinity at each
    position, NaN, +inf with -inf, sums and squares that overflow, ordinary rows."""
    rows = []
    for pos in range(n):
        r = np.arange(1.0, n + 1.0)
        r[pos] = np.inf if pos % 2 == 0 else -np.inf
        rows.append(r)
    rows += [np.r_[np.nan, np.ones(n - 1)], np.r_[np.ones(n - 2), np.inf, -np.inf],
             np.r_[3e38, 3e38, np.ones(n - 2)], np.r_[1e20, 1e20, np.ones(n - 2)],
             RNG.standard_normal(n), 1e4 + RNG.standard_normal(n)]
    if n < 8:
        # (onnxruntime's float64 lanes lose the ones beside +-3e38 in longer rows: 0)
        rows += [np.r_[3e38, -3e38, np.ones(n - 2)], np.r_[1e20, -1e20, np.ones(n - 2)]]
    return np.array(rows, np.float32)


# a row shorter than 8 takes onnxruntime's scalar code (Welford's update), a longer one
# its MLAS kernel (a float64 mean)
STAT_WIDTHS = (4, 5, 12)


STAT_ROWS = {n: stat_rows(n) for n in STAT_WIDTHS}


def stats_group() -> Group:
    """LayerNormalization with its Mean and InvStdDev outputs on the rows of each width
    (outputs `y{n}`, `mean{n}`, `inv{n}`): one model, one compile per target."""
    b = GraphBuilder()
    feeds = {f"x{n}": STAT_ROWS[n] for n in STAT_WIDTHS}
    b.inputs_for(feeds)
    names = []
    for n in STAT_WIDTHS:
        rows = len(STAT_ROWS[n])
        ones, zeros = b.const(np.ones(n, np.float32)), b.const(np.zeros(n, np.float32))
        b.node("LayerNormalization", [f"x{n}", ones, zeros], [f"y{n}", f"mean{n}", f"inv{n}"],
               axis=-1, epsilon=1e-5)
        for out, shape in ((f"y{n}", (rows, n)), (f"mean{n}", (rows, 1)),
                           (f"inv{n}", (rows, 1))):
            names.append(b.output(out, shape))
    return Group(b.model(opset=17), feeds, names)


# compiled and run with the other groups by the `got` and `want` fixtures
GROUPS["stats"] = stats_group()
STATS_NAMES = GROUPS["stats"].names


@pytest.mark.parametrize("n", STAT_WIDTHS)
def test_layer_norm_mean_and_inv_std_dev_match_onnxruntime(
        n: int, got: dict[str, list[np.ndarray]], want: dict[str, list[np.ndarray]]) -> None:
    """The optional outputs: a row of 4 holding inf anywhere but last has a NaN mean (as
    `[3e38, -3e38, 1, 1]`, whose running mean overflows), a row of 12 an infinite one;
    `[3e38, 3e38, 1, ...]` a finite mean."""
    x = STAT_ROWS[n]
    for name, out in (("Mean", f"mean{n}"), ("InvStdDev", f"inv{n}")):
        k = STATS_NAMES.index(out)
        bad = mismatches(x[:, :1], got["stats"][k], want["stats"][k], 1e-5, 1e-30)
        assert not bad, f"{name} (first element, onnxruntime, kiln): {bad}"


def test_batchnorm_training_mode_folds_like_onnxruntime(
        target: kiln.target.Target | None) -> None:
    """Training-mode BatchNormalization is `x * a + (B - mean * a)` with `a = scale /
    sqrt(var + eps)` from the batch's statistics, as in inference: a scale of 3.4e38 over
    a spread below 1 overflows `a`, and y is +-inf or NaN as in onnxruntime."""
    # its own generator: the data do not depend on which tests ran before it
    x = 0.5 * np.random.default_rng(20).standard_normal((2, 3, 4, 5)).astype(np.float32)
    scale = np.array([3.4e38, 1.0, 1e20], np.float32)
    b = GraphBuilder()
    b.inputs_for({"x": x, "scale": scale})
    stats = [b.const(np.full(3, v, np.float32)) for v in (0.5, 0.0, 1.0)]
    b.node("BatchNormalization", ["x", "scale", *stats], ["y", "mean", "var"], epsilon=1e-2,
           training_mode=1)
    b.output("y", x.shape)
    b.output("mean", (3,))
    b.output("var", (3,))
    model = b.model(opset=15)
    want = onnxruntime_outputs(model, {"x": x, "scale": scale})[0]
    assert np.isnan(want).any() and np.isinf(want).any()  # the case this test is about
    if target is None:
        with np.errstate(all="ignore"):
            got = kiln.evaluate(from_onnx(model), "main", x, scale)[0]
    else:
        got = kiln.compile(from_onnx(model), target)(x, scale)[0]
    bad = mismatches(x, np.asarray(got), want, 1e-5, 1e-6)
    assert not bad, f"(x, onnxruntime, kiln): {bad[:12]}"
