"""kiln.codegen.llvm.dim_size: LLVM's checked sizes agree with kiln.dim_expr.

Random expressions at random int64 values (the extremes included), each compiled to
`i64 f(i64 a, i64 b, i64 seq, i64 batch, i64 h, i8* failed)` with `checked_dim` and
run by MCJIT: value and "failed" must be Python's `compute` (value, any failure).
"""

from __future__ import annotations

import ctypes

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llvmlite import ir

from kiln import dim_expr
from kiln.codegen.llvm.dim_size import I64, checked_dim
from kiln.codegen.llvm.target_machine import llvm_binding
from kiln.dim_expr import INT64_MAX, INT64_MIN, Binary, Const, Expr, Neg, Op, Var

NAMES = ("a", "b", "seq", "batch", "h")
EDGES = [0, 1, -1, 2, 7, 1 << 31, 3037000499, 3037000500, 1 << 62, INT64_MAX, INT64_MIN,
         INT64_MIN + 1, -(1 << 62)]
ints = st.one_of(st.sampled_from(EDGES), st.integers(-100, 100),
                 st.integers(INT64_MIN, INT64_MAX))
exprs = st.recursive(
    st.one_of(ints.map(Const), st.sampled_from(NAMES).map(Var)),
    lambda kids: st.one_of(kids.map(Neg),
                           st.builds(Binary, st.sampled_from(list(Op)), kids, kids)),
    max_leaves=10)
values = st.fixed_dictionaries({name: ints for name in NAMES})


def _compile(cases: list[Expr]) -> list[ctypes._CFuncPtr]:
    """One JIT-compiled function per expression (the engine is kept alive by the result)."""
    module = ir.Module(name="dims")
    i8 = ir.IntType(8)
    fnty = ir.FunctionType(I64, [I64] * len(NAMES) + [i8.as_pointer()])
    for k, e in enumerate(cases):
        fn = ir.Function(module, fnty, name=f"f{k}")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        value, failed = checked_dim(b, e, dict(zip(NAMES, fn.args[:len(NAMES)], strict=True)))
        b.store(b.zext(failed, i8), fn.args[-1])
        b.ret(value)
    llvm = llvm_binding()
    llvm.initialize_native_target()
    parsed = llvm.parse_assembly(str(module))
    parsed.verify()
    tm = llvm.Target.from_default_triple().create_target_machine(jit=True)
    engine = llvm.create_mcjit_compiler(parsed, tm)
    engine.finalize_object()
    proto = ctypes.CFUNCTYPE(ctypes.c_int64, *[ctypes.c_int64] * len(NAMES),
                             ctypes.POINTER(ctypes.c_int8))
    funcs = [proto(engine.get_function_address(f"f{k}")) for k in range(len(cases))]
    _ENGINES.append(engine)
    return funcs


_ENGINES: list[object] = []  # compiled code must outlive the ctypes functions


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases=st.lists(st.tuples(exprs, values), min_size=20, max_size=20))
def test_llvm_and_python_agree_or_both_refuse(cases: list[tuple[Expr, dict[str, int]]]) -> None:
    funcs = _compile([e for e, _ in cases])
    for (e, vals), f in zip(cases, funcs, strict=True):
        failed = ctypes.c_int8(0)
        got = f(*(vals[n] for n in NAMES), ctypes.byref(failed))
        value, failures = dim_expr.compute(e, vals)
        assert (got, bool(failed.value)) == (value, bool(failures)), dim_expr.to_text(e)
