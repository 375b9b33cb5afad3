"""Helpers for the llvm / llvmjit codegen tests: build small IR, JIT it, run it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kiln.codegen.constants import ConstantPool
from kiln.codegen.llvm import codegen_llvmjit
from kiln.codegen.llvm.codegen import CompiledModule, compile_module
from kiln.codegen.llvm.jit_loader import LLVMJITModule, load_llvmjit
from kiln.ir import IRBuilder, IRModule
from kiln.ir import dtype as dt
from kiln.ir.tensor import PrimExpr
from kiln.runtime import LoadContext
from kiln.target import Target
from kiln.transform.outline import OutlineParallelLoops

PREFIX = "kiln_"


def jit(mod: IRModule, *, prefix: str = PREFIX, target: Any = None) -> LLVMJITModule:
    """Compile `mod` with the llvmjit codegen and load it through the llvmjit loader."""
    # The backend takes parallel loops outlined, as kiln.compile hands them over.
    arts = codegen_llvmjit(OutlineParallelLoops()(mod), target or Target("llvmjit"),
                           prefix=prefix, pool=ConstantPool.from_module(mod))
    return load_llvmjit(arts, LoadContext(prefix=prefix))


def compiled(mod: IRModule, target: Any = "llvm", **kw: Any) -> CompiledModule:
    """Lower, verify (llvm.parse_assembly + verify) and optimise `mod` for `target`."""
    t = Target(target) if isinstance(target, (str, dict)) else target
    return compile_module(OutlineParallelLoops()(mod), t, prefix=kw.pop("prefix", PREFIX),
                          pool=ConstantPool.from_module(mod), **kw)


def elementwise(
    name: str, in_dtypes: Sequence[str], out_dtype: str, fn: Callable[..., PrimExpr],
    n: int, ib: IRBuilder | None = None,
) -> IRBuilder:
    """A PrimFunc `name(X0, ..., Y)` with `Y[i] = fn(X0[i], ...)` over n elements."""
    ib = ib or IRBuilder()
    with ib.prim_func(name):
        xs = [ib.arg(f"X{k}", (n,), d) for k, d in enumerate(in_dtypes)]
        y = ib.arg("Y", (n,), out_dtype)
        with ib.for_range(n, name="i") as i:
            ib.store(y, [i], fn(*[x[i] for x in xs]))
    return ib


def np_dtype(dtype: str) -> np.dtype[Any]:
    return dt.to_numpy(dtype)
