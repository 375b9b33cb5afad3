"""Integer index arithmetic the llvm lowering folds itself (kiln.codegen.llvm.arith.folded_int).

Constant operands are folded (wrapped to the type's width, as LLVM's instruction would)
and `+ 0`, `* 1` dropped, so the lowered IR does not carry them to LLVM: checked on the
helper against numpy's wrapping arithmetic, on the text of a lowered kernel indexed at
constant places, and by running that kernel.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from llvm_helpers import PREFIX, jit
from llvmlite import ir

from kiln.codegen.constants import ConstantPool
from kiln.codegen.llvm.arith import folded_int
from kiln.codegen.llvm.lower_to_llvm import LoweringOptions, lower_module
from kiln.ir import IRBuilder, IRModule
from kiln.transform.outline import OutlineParallelLoops


@pytest.mark.parametrize("bits", [8, 32, 64])
@pytest.mark.parametrize("op", ["add", "sub", "mul"])
def test_constants_fold_and_wrap_as_the_instruction_would(bits: int, op: str) -> None:
    ty = ir.IntType(bits)
    np_type = {8: np.int8, 32: np.int32, 64: np.int64}[bits]
    info = np.iinfo(np_type)
    for a, c in [(info.max, 1), (info.min, 1), (info.max, info.max), (-3, 7), (0, info.min)]:
        folded = folded_int(op, ir.Constant(ty, int(a)), ir.Constant(ty, int(c)))
        assert isinstance(folded, ir.Constant) and folded.type == ty
        with np.errstate(over="ignore"):
            want = {"add": np.add, "sub": np.subtract, "mul": np.multiply}[op](
                np.array(a, np_type), np.array(c, np_type))
        assert folded.constant == int(want), (op, a, c)


def test_identities_return_the_operand_and_the_rest_is_left_to_llvm() -> None:
    fn = ir.Function(ir.Module(), ir.FunctionType(ir.IntType(64), [ir.IntType(64)]), "f")
    x = fn.args[0]
    zero, one, two = (ir.Constant(ir.IntType(64), v) for v in (0, 1, 2))
    assert folded_int("add", x, zero) is x and folded_int("add", zero, x) is x
    assert folded_int("sub", x, zero) is x
    assert folded_int("mul", x, one) is x and folded_int("mul", one, x) is x
    assert folded_int("sub", zero, x) is None  # a negation
    assert folded_int("mul", x, zero) is None  # kept: LLVM decides on poison
    assert folded_int("mul", x, two) is None and folded_int("add", x, one) is None


def _kernel() -> IRModule:
    """`Y[i][j] = X[i][j] + X[1][j] * X[2][3]`: rows and a column at constant places."""
    ib = IRBuilder()
    with ib.prim_func("k"):
        x = ib.arg("X", (4, 8), "float32")
        y = ib.arg("Y", (4, 8), "float32")
        with ib.for_range(4, name="i") as i, ib.for_range(8, name="j") as j:
            ib.store(y, [i, j], x[i, j] + x[1, j] * x[2, 3])
    return ib.get()


def test_the_lowered_kernel_carries_no_constant_arithmetic() -> None:
    mod = _kernel()
    lowered = lower_module(OutlineParallelLoops()(mod), ConstantPool.from_module(mod),
                           LoweringOptions(prefix=PREFIX))
    text = str(lowered.module)
    constant_op = re.compile(r"= (add|sub|mul)( nsw)? i64 -?\d+, -?\d+\b")
    assert not constant_op.search(text), constant_op.search(text)
    assert not re.search(r"= (add|sub)( nsw)? i64 %[\w.]+, 0\b", text)
    assert not re.search(r"= mul( nsw)? i64 %[\w.]+, 1\b", text)
    x = np.random.default_rng(5).standard_normal((4, 8)).astype(np.float32)
    y = np.empty_like(x)
    jit(mod)["k"](x, y)
    np.testing.assert_array_equal(y, x + x[1] * x[2, 3])
