"""Models of any size: thousands of weights and nodes compile, run and round-trip.

The lowered graph `main` is one flat statement list (workspace, constants, views,
calls), so no walk over it gets deeper as the model grows; FuseOps caps the ops fused
into one kernel, so no expression does either. The models are built with
support.graphs.GraphBuilder and checked against onnxruntime.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import ModelProto

import kiln
from kiln.frontend import from_onnx
from kiln.ir import IRBuilder, IRModule, assert_structural_equal
from kiln.ir import tensor as t
from kiln.script import from_source, print_module
from kiln.transform.fuse_ops import MAX_FUSED_OPS
from kiln.transform.pipeline import get_pipeline
from support.graphs import GraphBuilder
from support.reference import ort_session

WIDTH = 2  # tiny weights: the point is their number, not their size


def matmul_chain(n: int) -> ModelProto:
    """`n` MatMul+Relu layers, each with its own (WIDTH, WIDTH) weight tensor."""
    rng = np.random.default_rng(n)
    b = GraphBuilder()
    prev = "x"
    for k in range(n):
        # Positive, column-stochastic: values stay positive and bounded down the chain.
        w = rng.uniform(0.1, 1.0, (WIDTH, WIDTH))
        b.const((w / w.sum(axis=0)).astype(np.float32), name=f"w{k}")
        b.node("MatMul", [prev, f"w{k}"], [f"m{k}"])
        b.node("Relu", [f"m{k}"], [f"r{k}"])
        prev = f"r{k}"
    return _model(b, prev, (1, WIDTH))


def elementwise_chain(n: int) -> ModelProto:
    """`n` elementwise nodes in one chain: x is added back in every other node."""
    b = GraphBuilder()
    prev = "x"
    for k in range(n):
        if k % 2:
            b.node("Tanh", [prev], [f"e{k}"])
        else:
            b.node("Add", [prev, "x"], [f"e{k}"])
        prev = f"e{k}"
    return _model(b, prev, (8,))


def _model(b: GraphBuilder, out: str, shape: tuple[int, ...]) -> ModelProto:
    b.input("x", shape)
    b.output(out, shape)
    return b.model(name="chain")


def _reference(model: ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort_session(model)
    out: np.ndarray = sess.run(None, {"x": x})[0]
    return out


def _lowered(model: ModelProto) -> IRModule:
    mod = get_pipeline("default", "graph")(from_onnx(model))
    lowered: IRModule = get_pipeline("default", "tensor")(mod)
    return lowered


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_five_thousand_let_chain_compiles(target: str) -> None:
    """5,000 flat lets in one loop body (v0 = X[i], v_k = v_{k-1} * 3 + k): a C
    declaration / an LLVM value each, evaluated in order on every iteration."""
    n = 5000
    ib = IRBuilder()
    with ib.prim_func("main"):
        X = ib.arg("X", (4,), "int32")
        Y = ib.arg("Y", (4,), "int32")
        with ib.for_range(4) as i:
            v = ib.declare_let("v0", X[i])
            for k in range(1, n):
                v = ib.declare_let(f"v{k}", v * 3 + k)
            ib.store(Y, [i], v)
    exe = kiln.compile(ib.get(), target)
    x = np.array([0, 1, -7, 2**30], np.int32)
    y = np.zeros(4, np.int32)
    exe(x, y)
    want = x.astype(np.int64)
    for k in range(1, n):
        want = (want * 3 + k + 2**31) % 2**32 - 2**31  # int32 wrap-around
    np.testing.assert_array_equal(y, want.astype(np.int32))


def _depth(s: t.Stmt) -> int:
    """How deeply statements nest under `s` (a flat list of leaves is 1)."""
    deepest, stack = 0, [(s, 1)]
    while stack:
        x, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(x, t.SeqStmt):
            stack.extend((y, d) for y in x.body)
        elif isinstance(x, t.For):
            stack.append((x.body, d + 1))
        elif isinstance(x, t.IfThenElse):
            stack.append((x.then_body, d + 1))
            if x.else_body is not None:
                stack.append((x.else_body, d + 1))
    return deepest


MM_X = np.linspace(0.5, 1.0, WIDTH, dtype=np.float32).reshape(1, WIDTH)
EW_X = np.linspace(-1.0, 1.0, 8, dtype=np.float32)


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_two_thousand_weight_tensors(target: str) -> None:
    model = matmul_chain(2000)
    exe = kiln.compile(from_onnx(model), target)
    np.testing.assert_allclose(exe(MM_X), _reference(model, MM_X), rtol=1e-4)


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_five_thousand_node_elementwise_chain(target: str) -> None:
    model = elementwise_chain(5000)
    exe = kiln.compile(from_onnx(model), target)
    np.testing.assert_allclose(exe(EW_X), _reference(model, EW_X), rtol=1e-5, atol=1e-6)


def test_five_thousand_foldable_nodes() -> None:
    """A long chain on a weight alone is folded to one constant (import and FoldConstants)."""
    b = GraphBuilder()
    for k in range(5000):
        b.node("Sigmoid" if k % 2 else "Neg", [f"c{k}"], [f"c{k + 1}"])
    b.node("Add", ["c5000", "x"], ["y"])
    b.const(np.linspace(-2.0, 2.0, 8, dtype=np.float32), name="c0")
    model = _model(b, "y", (8,))
    mod = from_onnx(model)
    exe = kiln.compile(mod, "llvm")
    np.testing.assert_allclose(exe(EW_X), _reference(model, EW_X), rtol=1e-5, atol=1e-6)


def test_lowered_main_is_flat_and_round_trips() -> None:
    lowered = _lowered(matmul_chain(2000))
    main = lowered["main"]
    assert isinstance(main, t.PrimFunc) and isinstance(main.body, t.SeqStmt)
    kinds = [type(s).__name__ for s in main.body.body]
    # Workspace, the 2,000 weights, the views into the workspace, then the calls.
    assert kinds[0] == "Allocate" and kinds.count("AllocConst") == 2000
    assert kinds.count("CallFunc") == 2000 and _depth(main.body) == 1
    text = print_module(lowered)
    assert "w1999 = T.alloc_const(" in text and "with T.alloc_const" not in text
    assert_structural_equal(from_source(text), lowered)


@pytest.mark.parametrize("name", ["transformer", "resnet18"])
def test_real_models_lowered_ir_round_trips(name: str) -> None:
    """The printed lowered IR of real models parses back (it used to nest one level per
    weight: a 2-layer transformer was past Python's indentation limit)."""
    from support import small_models as builders

    lowered = _lowered(getattr(builders, name)())
    main = lowered["main"]
    assert isinstance(main, t.PrimFunc) and _depth(main.body) == 1
    assert_structural_equal(from_source(print_module(lowered)), lowered)


def test_fused_kernels_are_capped_and_round_trip() -> None:
    lowered = _lowered(elementwise_chain(5000))
    main = lowered["main"]
    assert isinstance(main, t.PrimFunc)
    calls = [s for s in main.body.body if isinstance(s, t.CallFunc)]  # type: ignore[attr-defined]
    assert len(calls) >= 5000 // MAX_FUSED_OPS  # many kernels, not one 5,000-deep expression
    assert_structural_equal(from_source(print_module(lowered)), lowered)
