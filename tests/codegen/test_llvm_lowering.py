"""The IR -> LLVM translation itself: signatures, attributes, metadata, errors."""

from __future__ import annotations

import re

import numpy as np
import pytest
from llvm_helpers import PREFIX, compiled, elementwise

from kiln.codegen.constants import ConstantPool
from kiln.codegen.llvm.lower_to_llvm import (
    MAX_INLINED_CALL_SITES,
    LoweringOptions,
    lower_module,
)
from kiln.codegen.llvm.target_machine import llvm_binding, parse_and_verify
from kiln.errors import CompileError
from kiln.ir import IRBuilder, IRModule
from kiln.ir.tensor import (
    BinaryOp,
    Buffer,
    CallExtern,
    Cast,
    Const,
    Evaluate,
    Intrin,
    PrimFunc,
    Store,
    Var,
    const,
)
from kiln.transform.outline import OutlineParallelLoops


def _lower(mod: IRModule, **options: object) -> str:
    lowered = lower_module(OutlineParallelLoops()(mod), ConstantPool.from_module(mod),
                           LoweringOptions(prefix=PREFIX, **options))  # type: ignore[arg-type]
    text = str(lowered.module)
    parse_and_verify(text)
    return text


def _every_node_module() -> IRModule:
    """One module touching every expression and statement node type."""
    ib = IRBuilder()
    with ib.prim_func("leaf"):
        a = ib.arg("A", (4,), "float32")
        s = ib.scalar_arg("s", "float32")
        with ib.for_range(4, name="i") as i:
            ib.store(a, [i], a[i] * s)
    with ib.prim_func("everything"):
        x = ib.arg("X", (2, 4), "float32")
        y = ib.arg("Y", (2, 4), "float32")
        k = ib.scalar_arg("k", "int32")
        with ib.alloc_const("W", np.ones((2, 4), np.float32)) as w, \
                ib.allocate("heap", (64,), "uint8", "global") as heap, \
                ib.allocate("acc", (4,), "float32", "local") as acc, \
                ib.decl_buffer("view", (4,), "float32", heap, 16) as view:
            with ib.for_range(2, name="i", kind="parallel") as i, \
                    ib.for_range(4, name="j", kind="vectorized") as j, \
                    ib.let("t", Intrin("exp", (x[i, j],)) + w[i, j]) as t:
                ib.store(y, [i, j], BinaryOp("max", t, -x[i, j]))
            with ib.for_range(2, name="s", kind="scalar") as s:
                ib.store(y, [s, 0], y[s, 0] + 1.0)
            with ib.for_range(4, name="u", kind="unrolled") as u:
                cond = (Cast("int64", k) + u).eq(3)
                with ib.if_(cond):
                    ib.store(acc, [u], y[0, u])
                with ib.else_():
                    ib.store(acc, [u], Cast("float32", k))
                ib.store(view, [u], acc[u])
            ib.call_func("leaf", [view, const(2.0, "float32")])
            ib.evaluate(CallExtern("fabsf", (view[0],), "float32"))
    return ib.get()


def test_every_node_type_lowers_to_verified_ir() -> None:
    text = _lower(_every_node_module())
    assert re.search(r'define hidden i32 @"kiln__kernel_everything"\(ptr noalias %"X"', text) \
        is None  # X is only read: no noalias
    assert re.search(r'define hidden i32 @"kiln__kernel_everything"\(ptr %"X", '
                     r'ptr noalias %"Y", i32 %"k"\)', text)
    assert '@"kiln__consts" = external hidden constant [0 x i8], align 64' in text
    assert "llvm.loop.vectorize.enable" in text and "llvm.loop.unroll.full" in text
    assert re.search(r'!"llvm.loop.vectorize.width", i32 1', text)  # the scalar loop
    assert 'call i32 @"kiln__kernel_leaf"' in text
    assert "alloca [4 x float], align 64" in text
    assert re.search(r"call ptr @\"malloc\"\(i64 ", text)
    assert "declare float @\"fabsf\"(float" in text


def test_kernel_signature_follows_the_abi() -> None:
    ib = IRBuilder()
    with ib.prim_func("sig"):
        ib.arg("B8", (2,), "bool")
        ib.arg("H", (2,), "float16")
        ib.scalar_arg("flag", "bool")
        ib.scalar_arg("h", "bfloat16")
        ib.scalar_arg("u", "uint16")
        ib.scalar_arg("d", "float64")
        ib.scalar_arg("n", "int64")
        ib.evaluate(const(0, "int32"))
    text = _lower(ib.get(), hidden=False)
    assert re.search(r'define i32 @"kiln__kernel_sig"\(ptr %"B8", ptr %"H", i8 %"flag", '
                     r'i16 %"h", i16 %"u", double %"d", i64 %"n"\)', text), text


def test_riscv64_kernels_return_sign_extended_status() -> None:
    mod = elementwise("f", ["int32"], "int32", lambda a: a + 1, 4).get()
    assert "define hidden signext i32" in _lower(mod, sext_int32=True)
    assert "signext" not in _lower(mod)


def test_noalias_only_on_written_buffers_and_not_when_a_call_aliases() -> None:
    ib = IRBuilder()
    with ib.prim_func("scale"):
        a = ib.arg("A", (4,), "float32")
        b = ib.arg("B", (4,), "float32")
        with ib.for_range(4, name="i") as i:
            ib.store(b, [i], a[i] * 2.0)
    with ib.prim_func("copy"):
        a = ib.arg("A", (8,), "float32")
        b = ib.arg("B", (4,), "float32")
        with ib.for_range(4, name="i") as i:
            ib.store(b, [i], a[i])
    with ib.prim_func("caller"):
        x = ib.arg("X", (8,), "float32")
        ib.call_func("scale", [x, x])  # in place: scale's buffers alias
        with ib.decl_buffer("hi", (4,), "float32", x, 16) as hi:
            ib.call_func("copy", [x, hi])  # hi overlaps X[4:8]: copy's buffers alias
    text = _lower(ib.get())
    assert re.search(r'@"kiln__kernel_caller"\(ptr noalias %"X"\)', text)
    assert re.search(r'@"kiln__kernel_scale"\(ptr %"A", ptr %"B"\)', text)
    assert re.search(r'@"kiln__kernel_copy"\(ptr %"A", ptr %"B"\)', text)

    ib2 = IRBuilder()
    with ib2.prim_func("copy"):
        a = ib2.arg("A", (4,), "float32")
        b = ib2.arg("B", (4,), "float32")
        with ib2.for_range(4, name="i") as i:
            ib2.store(b, [i], a[i])
    with ib2.prim_func("caller"):
        x = ib2.arg("X", (8,), "float32")
        with ib2.decl_buffer("lo", (4,), "float32", x, 0) as lo, \
                ib2.decl_buffer("hi", (4,), "float32", x, 16) as hi:
            ib2.call_func("copy", [lo, hi])  # disjoint halves: noalias stays
    assert re.search(r'@"kiln__kernel_copy"\(ptr %"A", ptr noalias %"B"\)', _lower(ib2.get()))


def test_optimised_module_vectorizes_a_vectorized_loop() -> None:
    mod = elementwise("axpy", ["float32", "float32"], "float32", lambda a, b: a * 3.0 + b,
                      1024).get()
    c = compiled(mod, {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mattr": ["+avx2"]})
    text = str(c.module)
    assert "<8 x float>" in text or "<16 x float>" in text
    assert '"target-features"="+avx2"' in text


def test_fast_math_flags_and_opt_level_zero() -> None:
    mod = elementwise("f", ["float32"], "float32", lambda a: a * 2.0 + 1.0, 4).get()
    fast = str(compiled(mod, {"kind": "llvm", "fast-math": True, "opt-level": 0}).module)
    assert "fmul reassoc nsz arcp contract afn float" in fast
    strict = str(compiled(mod, {"kind": "llvm", "opt-level": 0}).module)
    assert "fmul float" in strict and "reassoc" not in strict


# ------------------------------------------------------------------------ errors


def _func(body_fn, params=()) -> IRModule:  # type: ignore[no-untyped-def]
    return IRModule({"bad": PrimFunc(tuple(params), body_fn())})


@pytest.mark.parametrize(("build", "message"), [
    (lambda: (lambda y: _func(lambda: Store(y, Const(1, "int32"), (Const(0, "int64"),)), [y]))(
        Buffer("Y", (2,), "float32")),
     r"function 'bad': store of a int32 value into float32 buffer 'Y'; insert a Cast"),
    (lambda: (lambda y: _func(lambda: Store(y, Const(1.0, "float32"), ()), [y]))(
        Buffer("Y", (2,), "float32")),
     r"buffer 'Y' has 1 dimension\(s\) but is indexed with 0 index\(es\)"),
    (lambda: (lambda y: _func(lambda: Store(y, Var("v", "float32"), (Const(0, "int64"),)), [y]))(
        Buffer("Y", (2,), "float32")),
     r"variable 'v' is used outside the scope that defines it"),
    (lambda: (lambda y: _func(lambda: Store(y, BinaryOp(
        "add", Const(1.0, "float32"), Const(1, "int32")), (Const(0, "int64"),)), [y]))(
        Buffer("Y", (2,), "float32")),
     r"binary op 'add': operand dtypes differ \(float32, int32\); insert a Cast"),
    (lambda: (lambda y: _func(lambda: Store(y, BinaryOp(
        "add", Const(True, "bool"), Const(True, "bool")), (Const(0, "int64"),)), [y]))(
        Buffer("Y", (2,), "bool")),
     r"binary op 'add' is not defined on bool operands"),
    (lambda: (lambda y: _func(lambda: Store(y, BinaryOp(
        "shl", Const(1.0, "float32"), Const(1.0, "float32")), (Const(0, "int64"),)), [y]))(
        Buffer("Y", (2,), "float32")),
     r"shift 'shl' needs integer operands, got float32"),
    (lambda: (lambda y: _func(lambda: Store(y, Intrin("exp", (Const(1, "int32"),)),
                                            (Const(0, "int64"),)), [y]))(
        Buffer("Y", (2,), "int32")),
     r"intrinsic exp needs a float argument, got int32"),
    (lambda: _func(lambda: Evaluate(CallExtern("no-such", (), "int32"))),
     r"external function name 'no-such' is not a C identifier"),
])
def test_bad_ir_gets_a_clear_compile_error(build, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CompileError, match=message):
        _lower(build())


def test_call_func_errors_name_the_callee_and_argument() -> None:
    ib = IRBuilder()
    with ib.prim_func("callee"):
        a = ib.arg("A", (4,), "float32")
        ib.store(a, [0], 1.0)
    with ib.prim_func("caller"):
        x = ib.arg("X", (2,), "float32")
        ib.call_func("calee", [x])
    with pytest.raises(CompileError, match=r"unknown function 'calee'.*did you mean 'callee'"):
        _lower(ib.get())
    ib = IRBuilder()
    with ib.prim_func("callee"):
        a = ib.arg("A", (4,), "float32")
        ib.store(a, [0], 1.0)
    with ib.prim_func("caller"):
        x = ib.arg("X", (2,), "float32")
        ib.call_func("callee", [x])
    with pytest.raises(CompileError, match=r"argument 0 \('A'\) needs 16 bytes .* has 8"):
        _lower(ib.get())


def test_view_outside_its_source_and_misaligned_view_are_rejected() -> None:
    for offset, message in [(8, r"view 'v' covers bytes \[8, 24\) but its source 'X' has only 16"),
                            (2, r"starts at byte 2, which is not a non-negative multiple of")]:
        ib = IRBuilder()
        with ib.prim_func("f"):
            x = ib.arg("X", (4,), "float32")
            with ib.decl_buffer("v", (4,), "float32", x, offset) as v:
                ib.store(v, [0], 1.0)
        with pytest.raises(CompileError, match=message):
            _lower(ib.get())


def test_conflicting_extern_prototypes_are_rejected() -> None:
    ib = IRBuilder()
    with ib.prim_func("f"):
        x = ib.arg("X", (2,), "float32")
        ib.store(x, [0], CallExtern("myfn", (x[0],), "float32"))
        ib.store(x, [1], CallExtern("myfn", (Cast("float64", x[1]),), "float32"))
    with pytest.raises(CompileError, match="'myfn' is used with two different C signatures"):
        _lower(ib.get())


def test_constants_are_read_only_and_extern_names_cannot_shadow_kiln_symbols() -> None:
    ib = IRBuilder()
    with ib.prim_func("f"), ib.alloc_const("C", np.zeros(4, np.float32)) as c, \
                ib.decl_buffer("v", (2,), "float32", c, 8) as v:
        ib.store(v, [0], 1.0)
    with pytest.raises(CompileError, match="store into constant buffer 'v'"):
        _lower(ib.get())
    ib = IRBuilder()
    with ib.prim_func("fill"):
        a = ib.arg("A", (4,), "float32")
        ib.store(a, [0], 1.0)
    with ib.prim_func("f"), ib.alloc_const("C", np.zeros(4, np.float32)) as c:
        ib.call_func("fill", [c])
    with pytest.raises(CompileError, match="fill writes this parameter, but constant buffer 'C'"):
        _lower(ib.get())
    ib = IRBuilder()
    with ib.prim_func("f"):
        ib.evaluate(CallExtern("kiln_f", (), "int32"))
    with pytest.raises(CompileError, match="'kiln_f' collides with kiln's symbols"):
        _lower(ib.get())


def test_graph_functions_must_be_lowered_first() -> None:
    from kiln.ir.types import TensorType

    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", TensorType((2,), "float32"))
        ib.ret(x)
    with pytest.raises(CompileError, match="graph-level functions \\['main'\\] were not lowered"):
        _lower(ib.get())


def test_verifier_failure_is_reported_with_the_ir() -> None:
    llvm_binding()
    with pytest.raises(CompileError, match="LLVM rejected the IR generated for kiln kernels"):
        parse_and_verify("define i32 @f() {\n  ret i64 0\n}\n")


def test_heap_declaration_is_freed_where_its_block_ends() -> None:
    """A declaration's lifetime is the rest of its block: malloc and free both sit in the
    loop body, before the back edge."""
    ib = IRBuilder()
    with ib.prim_func("loop_alloc"):
        y = ib.arg("Y", (3,), "float32")
        with ib.for_range(3, name="i") as i:
            t = ib.declare_allocate("t", (2,), "float32", "global")
            ib.store(t, [0], Cast("float32", i))
            ib.store(y, [i], t[0])
    lines = [line.strip() for line in _lower(ib.get()).splitlines()]
    malloc = next(k for k, line in enumerate(lines) if '@"malloc"' in line)
    labels = [line for line in lines[:malloc] if line.endswith(":")]
    assert labels[-1] == "for.i.body:"  # allocated in the loop body
    free = lines.index('call void @"free"(ptr %"t")')
    assert lines[free + 1] == 'br label %"for.i.next"'  # freed before the next iteration


def test_a_function_with_many_calls_does_not_inline_them() -> None:
    def module(calls: int) -> IRModule:
        ib = IRBuilder()
        with ib.prim_func("bump"):
            x = ib.arg("X", (1,), "float32")
            ib.store(x, [0], x[0] + 1.0)
        with ib.prim_func("main"):
            x = ib.arg("X", (1,), "float32")
            for _ in range(calls):
                ib.call_func("bump", [x])
        return ib.get()

    few = _lower(module(MAX_INLINED_CALL_SITES))
    many = _lower(module(MAX_INLINED_CALL_SITES + 1))
    assert "noinline" not in few
    calls = [line for line in many.splitlines() if "call" in line and "kernel_bump" in line]
    assert len(calls) == MAX_INLINED_CALL_SITES + 1
    assert all("noinline" in line or "#" in line for line in calls)
