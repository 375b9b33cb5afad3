"""`cblas_matmul`'s kernel (kiln.kernels.gemm.cblas): one cblas_sgemm call, alone or with
FuseOps' elementwise tail applied in place, run by the interpreter (the call's numpy
reference, kiln.ops.cblas) against the op's reference."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import evaluate, ops
from kiln.ir import IRBuilder, IRModule
from kiln.ir import graph as g
from kiln.ir.tensor import CallExtern, Evaluate, PrimFunc
from kiln.ir.types import TensorType
from kiln.ir.visitor import iter_stmts
from kiln.kernels import legalize_call, lowering_for
from kiln.ops.cblas import NAME
from kiln.target import Target
from kiln.target.isa import isa_for
from kiln.transform.fuse_ops import FuseOps

RNG = np.random.default_rng(11)


def _sgemm_calls(func: object) -> int:
    assert isinstance(func, PrimFunc)
    return sum(isinstance(s, Evaluate) and isinstance(s.value, CallExtern)
               and s.value.name == "cblas_sgemm" for s in iter_stmts(func.body))


@pytest.mark.parametrize(("a_shape", "b_shape", "attrs"), [
    ((3, 4), (4, 5), {}),
    ((2, 3, 4), (5, 4), {"transpose_b": True}),
])
def test_the_kernel_is_one_sgemm_call(a_shape: tuple[int, ...], b_shape: tuple[int, ...],
                                      attrs: dict[str, bool]) -> None:
    a = RNG.standard_normal(a_shape).astype(np.float32)
    b = RNG.standard_normal(b_shape).astype(np.float32)
    call = ops.call(NAME, g.Var("a", TensorType(a_shape, "float32")),
                    g.Var("b", TensorType(b_shape, "float32")), **attrs)
    lowering = lowering_for(NAME)
    assert lowering is not None and lowering.builds(call)
    func, hint = legalize_call(call, lowering, isa_for(Target("llvm")))
    assert hint == NAME and _sgemm_calls(func) == 1
    want = ops.get_op(NAME).reference(a, b, **attrs)
    out = np.zeros(want.shape, np.float32)
    evaluate(IRModule({"kernel": func}), "kernel", a, b, out)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_a_fused_tail_runs_over_the_sgemm_output() -> None:
    w = g.Constant(RNG.standard_normal((5, 4)).astype("float32"), "w")
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", (3, 5), "float32")
        y = ib.emit(ops.call(NAME, x, w), "y")
        s = ib.emit(ops.call("sigmoid", y), "s")
        ib.ret(ib.emit(ops.call("multiply", y, s), "m"))
    mod = ib.get()
    with Target("llvm"):
        fused = FuseOps().run(mod)
    kernels = [b.value.func for b in fused["main"].bindings  # type: ignore[union-attr]
               if isinstance(b.value, g.CallTensor)]
    assert kernels == [f"fused_{NAME}_sigmoid_multiply"]
    assert _sgemm_calls(fused[kernels[0]]) == 1
    xv = RNG.standard_normal((3, 5)).astype("float32")
    np.testing.assert_allclose(evaluate(fused, "main", xv), evaluate(mod, "main", xv),
                               rtol=1e-5, atol=1e-6)
