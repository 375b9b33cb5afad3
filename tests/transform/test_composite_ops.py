"""recognize-composites: spelled-out tanh GELU and layer norm become `gelu` and
`layer_norm`, small constant powers become products, scaled matmul operands one scaled
product; results against onnxruntime."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

import kiln
from kiln.frontend import from_onnx
from kiln.ir import IRModule
from kiln.ir import graph as g
from kiln.transform.composite_ops import RecognizeComposites
from kiln.transform.fold_constants import FoldConstants
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs

ROWS, DIM = 4, 32


def _scalar(b: GraphBuilder, v: float) -> str:
    return b.const(np.array(v, np.float32), "s")


def _gelu_gpt2(b: GraphBuilder, x: str) -> str:
    """GPT-2's export order: 0.5 x, Pow(x, 3), the products after their constants."""
    cube = b.op("Mul", b.op("Pow", x, _scalar(b, 3.0)), _scalar(b, 0.044715))
    inner = b.op("Mul", b.op("Add", x, cube), _scalar(b, math.sqrt(2 / math.pi)))
    return b.op("Mul", b.op("Mul", x, _scalar(b, 0.5)),
                b.op("Add", b.op("Tanh", inner), _scalar(b, 1.0)))


def _gelu_products(b: GraphBuilder, x: str) -> str:
    """Constants first, x^3 as products, (1 + tanh) multiplied before x."""
    cube = b.op("Mul", b.op("Mul", x, x), x)
    inner = b.op("Mul", _scalar(b, 0.7978846), b.op("Add", b.op("Mul", _scalar(b, 0.044715),
                                                                 cube), x))
    half = b.op("Mul", _scalar(b, 0.5), b.op("Add", _scalar(b, 1.0), b.op("Tanh", inner)))
    return b.op("Mul", half, x)


def _layer_norm(b: GraphBuilder, x: str, square: str, affine: bool) -> str:
    centred = b.op("Sub", x, b.op("ReduceMean", x, axes=[-1]))
    sq = b.op("Pow", centred, _scalar(b, 2.0)) if square == "pow" else \
        b.op("Mul", centred, centred)
    std = b.op("Sqrt", b.op("Add", b.op("ReduceMean", sq, axes=[-1]), _scalar(b, 1e-5)))
    y = b.op("Div", centred, std)
    if affine:
        gamma = b.const(b.rng.uniform(0.8, 1.2, DIM).astype(np.float32), "gamma")
        beta = b.const(b.rng.normal(0, 0.1, DIM).astype(np.float32), "beta")
        y = b.op("Add", b.op("Mul", y, gamma), beta)
    return y


def _model(body: str) -> onnx.ModelProto:
    b = GraphBuilder(seed=1)
    x = b.input("x", [ROWS, DIM])
    h = b.op("Add", b.op("MatMul", x, b.weight(DIM, DIM)), b.weight(DIM))
    if body == "gpt2":  # GPT-2's feed-forward input: GELU, then the next layer norm
        y = _layer_norm(b, _gelu_gpt2(b, h), "pow", affine=True)
    elif body == "products":
        y = _layer_norm(b, _gelu_products(b, h), "mul", affine=False)
    elif body == "tanh_read_twice":  # the tanh is also an output: no pattern
        t = b.op("Tanh", h)
        b.node("Identity", [t], ["t"])
        b.output("t", [ROWS, DIM])
        y = b.op("Mul", b.op("Mul", h, _scalar(b, 0.5)), b.op("Add", t, _scalar(b, 1.0)))
    elif body == "erf_matmul":  # Whisper's erf GELU, its `* 0.5` last, then a product
        half_x = b.op("Mul", h, b.op("Add", b.op("Erf", b.op("Div", h, _scalar(b, math.sqrt(2)))),
                                     _scalar(b, 1.0)))
        y = b.op("MatMul", b.op("Mul", half_x, _scalar(b, 0.5)), b.weight(DIM, DIM))
    elif body == "attention":  # scaled queries and keys (Whisper's export)
        q = b.op("Mul", h, _scalar(b, 0.35))
        kt = b.op("Mul", _scalar(b, 0.35), b.op("Transpose", h, perm=[1, 0]))
        y = b.op("MatMul", b.op("Softmax", b.op("MatMul", q, kt), axis=-1), h)
    else:  # powers
        y = b.op("Add", b.op("Pow", h, _scalar(b, 3.0)), b.op("Pow", h, _scalar(b, 2.5)))
    b.node("Identity", [y], ["y"])
    b.output("y", [ROWS, DIM])
    return b.model(opset=13)


def _recognized(model: onnx.ModelProto) -> IRModule:
    return RecognizeComposites()(FoldConstants()(from_onnx(model)))


def _ops(mod: IRModule) -> list[str]:
    return [b.value.op for b in mod["main"].bindings  # type: ignore[union-attr]
            if isinstance(b.value, g.Call)]


@pytest.mark.parametrize("body, ops", [
    ("gpt2", ["matmul", "add", "gelu", "layer_norm"]),
    ("products", ["matmul", "add", "gelu", "layer_norm"]),
    ("powers", ["matmul", "add", "multiply", "multiply", "power", "add"]),
    ("attention", ["matmul", "add", "transpose", "matmul", "multiply", "softmax", "matmul"]),
    # the GELU's scale stays in it: the product reads the gelu, not its spelled-out values
    ("erf_matmul", ["matmul", "add", "gelu", "matmul"]),
])
def test_patterns_become_one_op(body: str, ops: list[str]) -> None:
    mod = _recognized(_model(body))
    assert _ops(mod) == ops
    gelu = [b.value for b in mod["main"].bindings  # type: ignore[union-attr]
            if isinstance(b.value, g.Call) and b.value.op == "gelu"]
    assert all(c.attrs.get("approximate", "none") == ("none" if body == "erf_matmul" else "tanh")
               for c in gelu)


def test_an_intermediate_read_elsewhere_keeps_the_pattern() -> None:
    before = FoldConstants()(from_onnx(_model("tanh_read_twice")))
    assert _ops(RecognizeComposites()(before)) == _ops(before)


@pytest.mark.parametrize("body, target", [("gpt2", "llvm"), ("gpt2", "c"), ("powers", "llvm"),
                                          ("attention", "llvm")])
def test_results_match_onnxruntime(body: str, target: str) -> None:
    model = _model(body)
    x = np.random.default_rng(2).standard_normal((ROWS, DIM)).astype(np.float32) * 2
    want = onnxruntime_outputs(model, {"x": x})[0]
    ex = kiln.compile(from_onnx(model), target)
    epilogue = {"gpt2": "fused_matmul_packed_add_gelu", "attention": "fused_matmul_tiled_multiply"}
    if body in epilogue:  # the activation, the scale: in the matrix product's epilogue
        assert epilogue[body] in ex.function_names()
    got = np.asarray(ex["main"](x))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
