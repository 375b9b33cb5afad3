"""Row kernels (kiln.kernels.rows) against onnxruntime, on llvm and c, 1 and 2 threads.

One ONNX model holds every case as an output: softmax, log_softmax,
layer_norm and reductions (global pooling too) over rows of 1, 7 and 1000
elements, with elementwise producers that FuseOps computes inside the row
kernel (a scale, a mask through Where or Add, a residual Add) and consumers
applied as the kernel stores, large and negative
values (softmax stability, a layer_norm mean far from zero), and a small
post-norm encoder block end to end.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto

import kiln
from kiln.frontend import from_onnx
from kiln.ir import graph as g
from kiln.ir.tensor import For
from kiln.ir.visitor import iter_stmts
from kiln.script import print_module
from kiln.transform import get_pass
from support import numerics
from support.graphs import GraphBuilder
from support.processes import outputs_in_fresh_process
from support.reference import onnxruntime_outputs

RNG = np.random.default_rng(11)
# The default tensor pipeline with every provably independent loop parallel.
ALL_PARALLEL = "simplify,interchange-reductions,parallelize{min_work=0},vectorize-loops"
F = TensorProto.FLOAT


class Model:
    """A GraphBuilder whose float32 inputs come with their feeds (values `c1`, `v2`, ...)."""

    def __init__(self) -> None:
        self.builder = GraphBuilder()
        self.outputs: list[str] = []
        self.feeds: dict[str, np.ndarray] = {}
        self.count = 0

    def input(self, name: str, value: np.ndarray) -> str:
        self.builder.input(name, list(value.shape))
        self.feeds[name] = value.astype(np.float32)
        return name

    def const(self, value: np.ndarray) -> str:
        self.count += 1
        return self.builder.const(value, name=f"c{self.count}")

    def op(self, op_type: str, *inputs: str, **attrs: object) -> str:
        self.count += 1
        return self.builder.node(op_type, inputs, [f"v{self.count}"], **attrs).output[0]

    def output(self, name: str) -> None:
        self.outputs.append(self.builder.output(name))

    def build(self, opset: int = 17) -> onnx.ModelProto:
        model = self.builder.model(opset=opset, name="rows", check=False)
        return onnx.shape_inference.infer_shapes(model)


def randn(*shape: int, scale: float = 1.0, offset: float = 0.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale + offset).astype(np.float32)


def layer_norm(m: Model, x: str, n: int) -> str:
    return m.op("LayerNormalization", x, m.const(randn(n, scale=0.2, offset=1.0)),
                m.const(randn(n, scale=0.1)), axis=-1, epsilon=1e-5)


def encoder_block(m: Model, x: str, seq: int, dim: int, heads: int) -> str:
    """A post-norm transformer layer: masked multi-head attention, GELU MLP."""
    dh = dim // heads

    def proj(v: str, din: int, dout: int) -> str:
        return m.op("Add", m.op("MatMul", v, m.const(randn(din, dout, scale=din ** -0.5))),
                    m.const(randn(dout, scale=0.1)))

    def heads_of(v: str, perm: list[int]) -> str:
        shaped = m.op("Reshape", v, m.const(np.array([1, seq, heads, dh], np.int64)))
        return m.op("Transpose", shaped, perm=perm)

    q, k = heads_of(proj(x, dim, dim), [0, 2, 1, 3]), heads_of(proj(x, dim, dim), [0, 2, 3, 1])
    v = heads_of(proj(x, dim, dim), [0, 2, 1, 3])
    scores = m.op("Mul", m.op("MatMul", q, k), m.const(np.array(dh ** -0.5, np.float32)))
    keep = m.const(np.tril(np.ones((seq, seq), bool)).reshape(1, 1, seq, seq))  # causal
    masked = m.op("Where", keep, scores, m.const(np.array(-1e9, np.float32)))
    ctx = m.op("MatMul", m.op("Softmax", masked, axis=-1), v)
    ctx = m.op("Reshape", m.op("Transpose", ctx, perm=[0, 2, 1, 3]),
               m.const(np.array([1, seq, dim], np.int64)))
    h = layer_norm(m, m.op("Add", x, proj(ctx, dim, dim)), dim)
    hidden = proj(h, dim, 2 * dim)
    erf = m.op("Erf", m.op("Div", hidden, m.const(np.array(np.sqrt(2), np.float32))))
    gelu = m.op("Mul", m.op("Mul", hidden, m.op("Add", erf, m.const(np.array(1, np.float32)))),
                m.const(np.array(0.5, np.float32)))
    return layer_norm(m, m.op("Add", h, proj(gelu, 2 * dim, dim)), dim)


def cases() -> Model:
    m = Model()
    for n in (1, 7, 1000):
        x = m.input(f"x{n}", randn(4, 5, n, scale=4))
        r = m.input(f"r{n}", randn(4, 5, n))
        m.output(m.op("Softmax", x, axis=-1))
        m.output(m.op("LogSoftmax", x, axis=-1))
        m.output(layer_norm(m, x, n))
        # producers fused into the row kernel: scale and additive mask; residual add
        mask = m.const(np.where(RNG.random((1, 5, n)) < 0.3, -1e4, 0).astype(np.float32))
        scaled = m.op("Add", m.op("Mul", x, m.const(np.array(0.125, np.float32))), mask)
        m.output(m.op("Softmax", scaled, axis=-1))
        m.output(layer_norm(m, m.op("Add", x, r), n))
        # a Where mask, and consumers after the row op
        keep = m.const(RNG.random((5, n)) < 0.7)
        where = m.op("Where", keep, x, m.const(np.array(-1e9, np.float32)))
        m.output(m.op("Mul", m.op("Softmax", where, axis=-1), r))
        m.output(m.op("Relu", layer_norm(m, m.op("Sub", x, r), n)))
        # reductions over trailing axes, with a producer (x * x) and a consumer
        m.output(m.op("ReduceMean", x, axes=[-1]))
        m.output(m.op("Sqrt", m.op("ReduceMean", m.op("Mul", x, x), axes=[-1], keepdims=0)))
        m.output(m.op("ReduceMax", x, axes=[-1]))
        m.output(m.op("ReduceMin", r, axes=[-1], keepdims=0))
        m.output(m.op("ReduceL2", x, axes=[-1]))
        m.output(m.op("ReduceSum", x, m.const(np.array([1, 2], np.int64))))
    m.output(m.op("ReduceProd", m.input("p", randn(6, 9, scale=0.2, offset=1)), axes=[1]))
    m.output(m.op("ReduceSum", m.input("mid", randn(3, 4, 5)),
                  m.const(np.array([1], np.int64))))                # not trailing
    image = m.input("image", randn(2, 19, 7, 7, scale=3))
    m.output(m.op("GlobalAveragePool", image))
    m.output(m.op("Relu", m.op("GlobalMaxPool", m.op("Neg", image))))
    big = m.input("big", randn(4, 33, scale=3e3))          # softmax stability
    m.output(m.op("Softmax", big, axis=-1))
    m.output(m.op("LogSoftmax", m.op("Neg", big), axis=-1))
    far = m.input("far", randn(4, 300, scale=0.1, offset=1e3))  # mean far from zero
    m.output(layer_norm(m, far, 300))
    m.output(m.op("Softmax", m.input("cols", randn(2, 6, 5)), axis=1))  # not the last axis
    m.output(encoder_block(m, m.input("tokens", randn(1, 9, 32)), seq=9, dim=32, heads=4))
    return m


CASES = cases()
MODEL = CASES.build()


def assert_close(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    numerics.assert_close(got, want, 1e-4, CASES.outputs)


@pytest.fixture(scope="module")
def expected() -> list[np.ndarray]:
    return onnxruntime_outputs(MODEL, CASES.feeds)


@pytest.fixture(scope="module", params=["llvm", "c"])
def compiled(request: pytest.FixtureRequest) -> kiln.driver.Executable:
    return kiln.compile(from_onnx(MODEL), request.param)


def test_matches_onnxruntime(compiled: kiln.driver.Executable,
                             expected: list[np.ndarray]) -> None:
    assert_close(list(compiled(*CASES.feeds.values())), expected)


def _row_kernels(ex: kiln.driver.Executable) -> dict[str, object]:
    return {name: f.attrs.get("kiln.row_kernel") for name, f in ex.ir.functions.items()
            if f.attrs.get("kiln.row_kernel")}


def test_trailing_axis_rows_use_the_hand_built_kernels(compiled: kiln.driver.Executable) -> None:
    kinds = list(_row_kernels(compiled).values())
    assert set(kinds) == {"softmax", "log_softmax", "layer_norm", "reduce_mean", "reduce_max",
                          "reduce_min", "reduce_l2", "reduce_sum", "reduce_prod",
                          "global_avg_pool", "global_max_pool"}
    # fused groups with producers and consumers are built by the row kernels too
    for name in ("fused_multiply_add_softmax", "fused_where_softmax_multiply",
                 "fused_subtract_layer_norm_relu", "fused_multiply_reduce_mean_sqrt",
                 "fused_neg_global_max_pool_relu"):
        assert compiled.ir.functions[name].attrs.get("kiln.row_kernel"), name


def _parallel_row_loops(ex: kiln.driver.Executable) -> dict[str, bool]:
    """Each row kernel with more than one row: whether one of its row loops is parallel."""
    found = {}
    for name in _row_kernels(ex):
        fn = ex.ir.functions[name]
        loops = [s for s in iter_stmts(fn.body) if isinstance(s, For)
                 and s.var.name.startswith("i")]  # the row loops (Rows.vars)
        if loops:
            found[name] = any(s.kind == "parallel" for s in loops)
    return found


@pytest.fixture(scope="module")
def all_parallel() -> kiln.driver.Executable:
    """The model with every row loop split over threads (ALL_PARALLEL), built once."""
    return kiln.compile(from_onnx(MODEL), "llvm", tensor_pipeline=ALL_PARALLEL)


def test_parallelize_proves_rows_independent(all_parallel: kiln.driver.Executable) -> None:
    found = _parallel_row_loops(all_parallel)
    assert found and all(found.values()), found


def test_tiny_row_kernels_stay_serial(compiled: kiln.driver.Executable) -> None:
    found = _parallel_row_loops(compiled)
    assert found["softmax"] is False  # 20 rows of 1
    assert found["fused_multiply_add_softmax_1"] is False  # 20 rows of 7


@pytest.mark.parametrize("threads", [1, 2])
def test_threads_in_a_fresh_process(all_parallel: kiln.driver.Executable, tmp_path: Path,
                                    threads: int, expected: list[np.ndarray]) -> None:
    # Every row loop split over threads, with fused producers and consumers.
    assert_close(outputs_in_fresh_process(all_parallel, CASES.feeds, tmp_path, threads),
                 expected)


def test_producers_fuse_into_the_row_kernel_in_the_dsl() -> None:
    mod = get_pass("fuse-ops")(get_pass("fold-constants")(from_onnx(MODEL)))
    called = [b.value.func for b in mod["main"].bindings if isinstance(b.value, g.CallTensor)]
    # scale + mask before softmax; residual add before layer_norm; a consumer after each
    assert "fused_multiply_add_softmax" in called
    assert any(c.startswith("fused_add_layer_norm") for c in called)
    assert "fused_where_softmax_multiply" in called
    assert "fused_subtract_layer_norm_relu" in called
    text = print_module(mod)
    assert 'G.call_tensor("fused_multiply_add_softmax"' in text


@pytest.mark.parametrize(("opset", "axis", "shape"), [
    (11, 1, (2, 3, 5)),    # coerced to 2-D: rows of 15
    (11, 2, (2, 3, 5)),
    (13, -1, (2, 3, 5)),
    (13, 0, (4, 3)),       # not the last axis: the tensor-expression lowering
])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_axis_per_opset(op: str, opset: int, axis: int,
                                shape: tuple[int, ...]) -> None:
    m = Model()
    m.output(m.op(op, m.input("x", randn(*shape, scale=5)), axis=axis))
    model = m.build(opset)
    got = kiln.compile(from_onnx(model), "llvm")(*m.feeds.values())
    assert_close([np.asarray(got)], onnxruntime_outputs(model, m.feeds))


def test_an_expanding_chain_is_not_fused_into_a_row_op() -> None:
    m = Model()
    big = m.op("Relu", m.op("Expand", m.input("x", randn(4)),
                            m.const(np.array([64, 4], np.int64))))
    m.output(m.op("ReduceSum", big, m.const(np.array([-1], np.int64))))
    mod = get_pass("fuse-ops")(get_pass("fold-constants")(from_onnx(m.build())))
    called = [b.value.func for b in mod["main"].bindings if isinstance(b.value, g.CallTensor)]
    assert called == ["fused_broadcast_to_relu"]  # reduce_sum reads it materialized


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_large_inputs_and_fully_masked_rows(target: str) -> None:
    m = Model()
    large = m.input("large", randn(3, 8, offset=1e4))  # log_softmax keeps x - max exact
    m.output(m.op("LogSoftmax", large, axis=-1))
    x = m.input("x", randn(3, 8))
    keep = m.const(np.array([[True] * 8, [False] * 8, [True, False] * 4]))  # row 1: none
    m.output(m.op("Softmax", m.op("Where", keep, x, m.const(np.array(-np.inf, np.float32))),
                  axis=-1))
    with_nan = randn(3, 40)
    with_nan[0, 33] = np.nan  # the row max skips it; exp(NaN - max) makes the row NaN
    m.output(m.op("Softmax", m.input("with_nan", with_nan), axis=-1))
    model = m.build()
    want = onnxruntime_outputs(model, m.feeds)
    got = kiln.compile(from_onnx(model), target)(*m.feeds.values())
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)  # NaN where ort has NaN
    assert np.isnan(want[1][1]).all()
    assert np.isnan(got[2][0]).all() and not np.isnan(got[2][1:]).any()
