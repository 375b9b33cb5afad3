"""Dynamic quantization's matrix product as one op (kiln.ops.quant_dynamic).

`quantize_dynamic` writes DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul (->
Add bias); quantize-ops fuses the chain into `dynamic_quant_matmul`, which prints,
parses back and verifies, and whose kernel (quantize A, integer tiles, float epilogue)
matches onnxruntime on llvm, c and, where the host has them, the VNNI and AVX2 dot
forms. Chains the op does not compute exactly as written (a bias that is not a
constant, a product read twice) keep the model's ops.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from onnx import TensorProto

import kiln
from kiln.errors import IRError
from kiln.frontend import from_onnx
from kiln.ir import assert_structural_equal, verify
from kiln.ir import graph as g
from kiln.ops import call as op_call
from kiln.script import from_source, print_module
from kiln.target import Target
from kiln.target.isa import isa_for
from kiln.transform.quantize_ops import QuantizeOps
from support.graphs import GraphBuilder
from support.reference import like_onnxruntime, onnxruntime_outputs

# partial row and column tiles, a partial word of k and of A's range scan
M, K, N = 7, 38, 70
#: B packed in words: the vpdpbusd tiles and AVX2's widened ones, where the host runs them
DOT_TARGETS = ("llvm -mcpu=znver4", "llvm -mcpu=haswell")


def _targets() -> list[str]:
    host = isa_for(Target.from_host()).features
    return ["llvm", "c", *(t for t in DOT_TARGETS if isa_for(Target(t)).features <= host)]


def _model(b_dtype: str, per_column: bool, bias: str | None = "const",
           extra_use: bool = False) -> tuple[object, dict[str, np.ndarray]]:
    """y = [Add(](Cast(MatMulInteger(DQL(x), w)) * (x_scale * w_scale)[, bias)] as
    quantize_dynamic writes it; `bias` "const", "input" (a graph input) or None;
    `extra_use`: the int32 product is also an output."""
    rng = np.random.default_rng(5)
    unsigned = b_dtype == "uint8"
    w = rng.integers(0 if unsigned else -128, 256 if unsigned else 128, (K, N))
    consts: dict[str, np.ndarray] = {
        "w": w.astype(b_dtype), "wz": np.asarray(131 if unsigned else 0, b_dtype),
        "ws": (rng.uniform(0.002, 0.02, N) if per_column else np.asarray(0.0071)
               ).astype(np.float32)}
    b = GraphBuilder()
    b.node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"])
    b.node("MatMulInteger", ["xq", "w", "xz", "wz"], ["acc"])
    b.node("Mul", ["xs", "ws"], ["scale"])
    b.node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT)
    b.node("Mul", ["accf", "scale"], ["prod" if bias else "y"])
    feeds = {"x": rng.normal(0.3, 1.5, (1, M, K)).astype(np.float32)}
    b.input("x", [1, M, K], TensorProto.FLOAT)
    if bias == "const":
        consts["bias"] = rng.standard_normal(N).astype(np.float32)
    elif bias == "input":
        feeds["bias"] = rng.standard_normal(N).astype(np.float32)
        b.input("bias", [N], TensorProto.FLOAT)
    if bias:
        b.node("Add", ["bias", "prod"], ["y"])
    b.output("y", [1, M, N], TensorProto.FLOAT)
    if extra_use:
        b.output("acc", [1, M, N], TensorProto.INT32)
    b.consts(consts)
    return b.model(opset=13), feeds


def _ops(mod: kiln.IRModule) -> Counter[str]:
    return Counter(b.value.op for b in mod["main"].bindings if isinstance(b.value, g.Call))


def test_the_chain_becomes_one_op_that_round_trips() -> None:
    model, _ = _model("int8", per_column=True)
    mod = QuantizeOps()(from_onnx(model))
    assert _ops(mod) == {"dynamic_quant_matmul_packed": 1}
    text = print_module(mod)
    verify(mod)
    assert_structural_equal(from_source(text), mod)  # the DSL round-trips


def test_a_bias_that_is_not_a_constant_stays_an_add() -> None:
    model, _ = _model("int8", per_column=False, bias="input")
    assert _ops(QuantizeOps()(from_onnx(model))) == {"dynamic_quant_matmul_packed": 1,
                                                      "add": 1}


def test_a_product_read_twice_keeps_the_models_ops() -> None:
    model, _ = _model("int8", per_column=False, extra_use=True)
    ops = _ops(QuantizeOps()(from_onnx(model)))
    assert "dynamic_quant_matmul_packed" not in ops and ops["matmul_integer_packed"] == 1


@pytest.mark.parametrize("target", _targets())
def test_the_fused_kernel_matches_onnxruntime(target: str) -> None:
    # int8 weights scaled per column and a bias, as quantize_dynamic writes for BERT
    model, feeds = _model("int8", per_column=True)
    want = onnxruntime_outputs(model, feeds)[0]
    ex = kiln.compile(from_onnx(model), like_onnxruntime(target))
    got = np.asarray(ex["main"](*feeds.values()))
    # the same integers and the same float32 operations in the same order
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_bad_operands_raise_clear_errors() -> None:
    a = g.Var("a", kiln.ir.types.TensorType((2, 5), "float32"))
    b = g.Constant(np.zeros((5, 3), np.int8))
    zp, scale = g.Constant(np.int8(0)), g.Constant(np.float32(0.1))
    with pytest.raises(IRError, match="bias must be float32 of shape \\(3,\\)"):
        op_call("dynamic_quant_matmul", a, b, zp, scale, g.Constant(np.zeros(4, np.float32)))
    with pytest.raises(IRError, match="scale must be float32"):
        op_call("dynamic_quant_matmul", a, b, zp, g.Constant(np.ones(2, np.float32)),
                g.Constant(np.zeros(3, np.float32)))
    with pytest.raises(IRError, match="A must be float32"):
        op_call("dynamic_quant_matmul", g.Var("a", kiln.ir.types.TensorType((2, 5), "int8")),
                b, zp, scale, g.Constant(np.zeros(3, np.float32)))
