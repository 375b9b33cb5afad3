"""The matrix-vector kernel (kiln.kernels.gemm.gemv) against onnxruntime.

Dense layers at batch 1 (`Gemm(transB=1)` with one row of A) read their weight
`[N][K]` in place. One ONNX model holds the edge cases as independent branches:
K below, at and past the vector step (1, 7, 16, 33), a remainder of the row tile
(N = 1, 3, 5, 19), Gemm's alpha / beta and bias, ReLU and GELU (a library call)
epilogues, and one product large enough to run in parallel. It runs on llvm and
c, in this process and in fresh processes with 1 and 2 threads; the weights
stay the importer's arrays (no packed copy in the library's blob).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kernel_checks
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.codegen.constants import ConstantPool
from kiln.frontend import from_onnx
from kiln.ir import assert_structural_equal
from kiln.ir import graph as g
from kiln.script import from_source, print_module
from kiln.target import Target
from kiln.transform import get_pass
from support.processes import outputs_in_fresh_process

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(21)
TOL = 1e-5

# k, n: the product's sizes; attrs: Gemm's; bias / tail: the epilogue
CASES: list[dict[str, Any]] = [
    dict(k=1, n=3),
    dict(k=7, n=1, bias=True),
    dict(k=16, n=4, tail="Relu"),
    dict(k=33, n=5, bias=True, attrs=dict(alpha=0.5, beta=2.0)),
    dict(k=40, n=19, bias=True, tail="Gelu"),
    dict(k=513, n=203, bias=True, tail="Relu"),  # 104k multiply-adds: a parallel loop
]


def build_model() -> Any:
    nodes, inputs, outputs, inits = [], [], [], []
    for i, case in enumerate(CASES):
        k, n = case["k"], case["n"]
        inputs.append(helper.make_tensor_value_info(f"a{i}", TensorProto.FLOAT, [1, k]))
        w = RNG.standard_normal((n, k)) / np.sqrt(k)
        inits.append(numpy_helper.from_array(w.astype(np.float32), f"w{i}"))
        args = [f"a{i}", f"w{i}"]
        if case.get("bias"):
            inits.append(numpy_helper.from_array(RNG.standard_normal(n).astype(np.float32),
                                                 f"c{i}"))
            args.append(f"c{i}")
        nodes.append(helper.make_node("Gemm", args, [f"p{i}"], transB=1,
                                      **case.get("attrs", {})))
        last = f"p{i}"
        if case.get("tail") == "Relu":
            nodes.append(helper.make_node("Relu", [last], [f"t{i}"]))
            last = f"t{i}"
        elif case.get("tail") == "Gelu":
            inits += [numpy_helper.from_array(np.array(v, np.float32), f"{c}{i}")
                      for c, v in (("sq", np.sqrt(2)), ("one", 1.0), ("half", 0.5))]
            nodes += [helper.make_node("Div", [last, f"sq{i}"], [f"d{i}"]),
                      helper.make_node("Erf", [f"d{i}"], [f"e{i}"]),
                      helper.make_node("Add", [f"e{i}", f"one{i}"], [f"s{i}"]),
                      helper.make_node("Mul", [last, f"s{i}"], [f"g{i}"]),
                      helper.make_node("Mul", [f"g{i}", f"half{i}"], [f"t{i}"])]
            last = f"t{i}"
        outputs.append(helper.make_tensor_value_info(last, TensorProto.FLOAT, [1, n]))
    return kernel_checks.branches_model("gemvs", nodes, inputs, outputs, inits)


MODEL = build_model()
CHECKS = kernel_checks.KernelCases(MODEL, CASES, TOL, RNG)
FEEDS = CHECKS.feeds
REFERENCE = CHECKS.reference()
native = CHECKS.native_fixture()


def test_every_product_uses_the_gemv_kernel(native: kiln.driver.Executable) -> None:
    used = [f.attrs.get("kiln.gemm_kernel") for f in native.ir.functions.values()
            if f.attrs.get("kiln.gemm_kernel")]
    assert used == ["matmul_gemv"] * len(CASES)


def test_matches_onnxruntime(native: kiln.driver.Executable) -> None:
    CHECKS.assert_close(native(*FEEDS.values()), REFERENCE)


def test_compiled_kernels_round_trip_through_the_dsl(native: kiln.driver.Executable) -> None:
    text = print_module(native.ir, metadata="reference")
    assert_structural_equal(from_source(text, metadata=text.metadata), native.ir)


@pytest.mark.parametrize("threads", [1, 2])
def test_threads_in_a_fresh_process(native: kiln.driver.Executable, tmp_path: Path,
                                    threads: int) -> None:
    CHECKS.assert_close(outputs_in_fresh_process(native, FEEDS, tmp_path, threads), REFERENCE)


def test_the_weights_are_not_packed_but_stored_as_imported() -> None:
    mod = from_onnx(MODEL)
    weights = {c.name: c.data for c in _constants(mod) if c.name.startswith("w")}
    blocked = get_pass("block-matmuls")(mod)
    calls = [b.value for b in blocked["main"].bindings
             if isinstance(b.value, g.Call) and b.value.op.startswith("matmul")]
    assert [c.op for c in calls] == ["matmul_gemv"] * len(CASES)
    assert all(c.args[1].data is weights[c.args[1].name] for c in calls)  # the same arrays
    ex = kiln.compile(mod, Target("c"))
    pool = ConstantPool.from_module(ex.ir)
    # the blob holds the importer's arrays themselves (views of its arena)
    assert all(pool.find(w) is not None for w in weights.values())


def _constants(mod: Any) -> list[g.Constant]:
    out = []
    for b in mod["main"].bindings:
        if isinstance(b.value, g.Call):
            out += [a for a in b.value.args if isinstance(a, g.Constant)]
    return out
