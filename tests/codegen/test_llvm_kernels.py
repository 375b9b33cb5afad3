"""Whole kernels through llvmjit: loops, allocations, constants, views, calls."""

from __future__ import annotations

import ctypes
import re

import ml_dtypes
import numpy as np
import pytest
from llvm_helpers import compiled, jit

from kiln.codegen.llvm.target_machine import llvm_binding
from kiln.errors import CompileError, KilnError
from kiln.ir import IRBuilder
from kiln.ir.tensor import Buffer, CallExtern, Cast, ExternDependency, Intrin, Var, const, max_

RNG = np.random.default_rng(7)


def test_row_sum_with_local_accumulator() -> None:
    ib = IRBuilder()
    with ib.prim_func("row_sum"):
        x = ib.arg("X", (5, 7), "float32")
        y = ib.arg("Y", (5,), "float32")
        with ib.for_range(5, name="i") as i, ib.allocate("acc", (1,), "float32", "local") as acc:
            ib.store(acc, [0], 0.0)
            with ib.for_range(7, name="k") as k:
                ib.store(acc, [0], acc[0] + x[i, k])
            ib.store(y, [i], acc[0])
    m = jit(ib.get())
    x = RNG.standard_normal((5, 7)).astype(np.float32)
    y = np.zeros(5, np.float32)
    m["row_sum"](x, y)
    # Summed in another order than numpy's: the error is relative to the terms.
    np.testing.assert_array_less(np.abs(y - x.sum(axis=1)), 1e-6 * np.abs(x).sum(axis=1))


def test_matmul_through_heap_workspace() -> None:
    n, k, mm = 8, 16, 12
    ib = IRBuilder()
    with ib.prim_func("matmul"):
        a = ib.arg("A", (n, k), "float32")
        b = ib.arg("B", (k, mm), "float32")
        c = ib.arg("C", (n, mm), "float32")
        with ib.allocate("tmp", (n, mm), "float32", "global") as tmp:
            with ib.for_range(n, name="i", kind="parallel") as i, \
                    ib.for_range(mm, name="j", kind="vectorized") as j:
                ib.store(tmp, [i, j], 0.0)
                with ib.for_range(k, name="r", kind="unrolled") as r:
                    ib.store(tmp, [i, j], tmp[i, j] + a[i, r] * b[r, j])
            with ib.for_range(n, name="i2") as i2, ib.for_range(mm, name="j2") as j2:
                ib.store(c, [i2, j2], tmp[i2, j2])
    m = jit(ib.get())
    a = RNG.standard_normal((n, k)).astype(np.float32)
    b = RNG.standard_normal((k, mm)).astype(np.float32)
    c = np.zeros((n, mm), np.float32)
    m["matmul"](a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)
    ir_text = m.inspect_source("ll")
    assert "@malloc" in ir_text and "@free" in ir_text


def test_conv2d_four_deep_loops_with_bias_relu_and_if() -> None:
    cin, cout, h, w, kh = 3, 4, 6, 6, 3
    oh = h - kh + 1
    ib = IRBuilder()
    with ib.prim_func("conv"):
        x = ib.arg("X", (cin, h, w), "float32")
        wt = ib.arg("W", (cout, cin, kh, kh), "float32")
        bias = ib.arg("B", (cout,), "float32")
        y = ib.arg("Y", (cout, oh, oh), "float32")
        with ib.for_range(cout, name="o") as o, ib.for_range(oh, name="p") as p, \
                ib.for_range(oh, name="q") as q:
            ib.store(y, [o, p, q], bias[o])
            with ib.for_range(cin, name="c") as c, ib.for_range(kh, name="u") as u, \
                    ib.for_range(kh, name="v") as v:
                ib.store(y, [o, p, q], y[o, p, q] + x[c, p + u, q + v] * wt[o, c, u, v])
            # relu as if/else for even channels, as max() for odd ones
            with ib.if_((o % 2).eq(0)), ib.if_(y[o, p, q] < 0.0):
                ib.store(y, [o, p, q], 0.0)
            with ib.else_():
                ib.store(y, [o, p, q], max_(y[o, p, q], 0.0))
    m = jit(ib.get())
    x = RNG.standard_normal((cin, h, w)).astype(np.float32)
    wt = RNG.standard_normal((cout, cin, kh, kh)).astype(np.float32)
    b = RNG.standard_normal(cout).astype(np.float32)
    y = np.zeros((cout, oh, oh), np.float32)
    m["conv"](x, wt, b, y)
    ref = np.zeros_like(y)
    for o in range(cout):
        for p in range(oh):
            for q in range(oh):
                ref[o, p, q] = b[o] + np.sum(x[:, p:p + kh, q:q + kh] * wt[o])
    np.testing.assert_allclose(y, np.maximum(ref, 0), rtol=1e-5, atol=1e-5)


def test_let_and_loop_with_offset_start_and_int32_loop_var() -> None:
    ib = IRBuilder()
    with ib.prim_func("strided"):
        x = ib.arg("X", (10,), "int32")
        y = ib.arg("Y", (10,), "int32")
        n = ib.scalar_arg("n", "int32")
        j = Var("j", "int32")
        with ib.for_range(const(2, "int32"), n, var=j), \
                ib.let("t", x[Cast("int64", j)] * 3) as t:
            ib.store(y, [Cast("int64", j)], t - j)
    m = jit(ib.get())
    x = np.arange(10, dtype=np.int32)
    y = np.full(10, -1, np.int32)
    m["strided"](x, y, 7)
    np.testing.assert_array_equal(y, [-1, -1, 4, 6, 8, 10, 12, -1, -1, -1])


def test_alloc_const_weights_of_two_dtypes() -> None:
    w = RNG.standard_normal((4, 3)).astype(np.float32)
    idx = np.array([2, 0, 1, 3], np.int64)
    ib = IRBuilder()
    with ib.prim_func("gather_add"):
        x = ib.arg("X", (4, 3), "float32")
        y = ib.arg("Y", (4, 3), "float32")
        with ib.alloc_const("W", w) as wb, ib.alloc_const("I", idx) as ib_idx, \
                ib.for_range(4, name="i") as i, ib.for_range(3, name="j") as j:
            ib.store(y, [i, j], x[ib_idx[i], j] + wb[i, j])
    mod = ib.get()
    m = jit(mod)
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    y = np.zeros((4, 3), np.float32)
    m["gather_add"](x, y)
    np.testing.assert_allclose(y, x[idx] + w, rtol=1e-6)


def test_decl_buffer_views_of_a_global_arena() -> None:
    ib = IRBuilder()
    with ib.prim_func("arena"):
        x = ib.arg("X", (8,), "float32")
        y = ib.arg("Y", (8,), "int32")
        with ib.allocate("arena", (128,), "uint8", "global") as arena, \
                ib.decl_buffer("f", (8,), "float32", arena, 0) as f, \
                ib.decl_buffer("g", (8,), "int32", arena, 64) as g:
            with ib.for_range(8, name="i") as i:
                ib.store(f, [i], x[i] * 2.0)
                ib.store(g, [i], Cast("int32", f[i]) + 1)
            with ib.for_range(8, name="i2") as i2:
                ib.store(y, [i2], g[i2])
    m = jit(ib.get())
    x = np.arange(8, dtype=np.float32) + 0.25
    y = np.zeros(8, np.int32)
    m["arena"](x, y)
    np.testing.assert_array_equal(y, (x * 2).astype(np.int32) + 1)


def test_call_func_between_kernels_with_scalar_and_views() -> None:
    ib = IRBuilder()
    with ib.prim_func("axpy"):
        a = ib.scalar_arg("a", "float32")
        x = ib.arg("X", (4,), "float32")
        y = ib.arg("Y", (4,), "float32")
        with ib.for_range(4, name="i") as i:
            ib.store(y, [i], a * x[i] + y[i])
    with ib.prim_func("twice"):
        x = ib.arg("X", (8,), "float32")
        y = ib.arg("Y", (8,), "float32")
        with ib.decl_buffer("lo_x", (4,), "float32", x, 0) as lo_x, \
                ib.decl_buffer("hi_x", (4,), "float32", x, 16) as hi_x, \
                ib.decl_buffer("lo_y", (4,), "float32", y, 0) as lo_y, \
                ib.decl_buffer("hi_y", (4,), "float32", y, 16) as hi_y:
            ib.call_func("axpy", [const(2.0, "float32"), lo_x, lo_y])
            ib.call_func("axpy", [const(-1.0, "float32"), hi_x, hi_y])
    m = jit(ib.get())
    x = np.arange(8, dtype=np.float32)
    y = np.ones(8, np.float32)
    m["twice"](x, y)
    np.testing.assert_array_equal(y, np.concatenate([2 * x[:4] + 1, -x[4:] + 1]))
    y4 = np.zeros(4, np.float32)
    m["axpy"](3.0, x[:4].copy(), y4)  # the callee is a public function too
    np.testing.assert_array_equal(y4, 3 * x[:4])


def test_failed_workspace_allocation_propagates_and_frees() -> None:
    ib = IRBuilder()
    with ib.prim_func("inner"):
        n = ib.scalar_arg("n", "int64")
        y = ib.arg("Y", (2,), "float32")
        big = Buffer("big", (n,), "float32", "global")
        with ib.allocate("big", (), "float32", buffer=big):
            # A loop-filled buffer read at a runtime index: LLVM cannot elide the malloc.
            with ib.for_range(n, name="i") as i:
                ib.store(big, [i], Cast("float32", i))
            ib.store(y, [0], big[n - 2])
    with ib.prim_func("outer"):
        n = ib.scalar_arg("n", "int64")
        y = ib.arg("Y", (2,), "float32")
        with ib.allocate("scratch", (16,), "float32", "global") as scratch:
            with ib.for_range(16, name="j") as j:
                ib.store(scratch, [j], Cast("float32", j * 2))
            ib.call_func("inner", [n, y])
            ib.store(y, [1], scratch[n - 1])
    m = jit(ib.get())
    y = np.zeros(2, np.float32)
    m["outer"](10, y)
    np.testing.assert_array_equal(y, [8.0, 18.0])
    with pytest.raises(KilnError, match="outer: out of memory allocating a workspace"):
        m["outer"](2**60, y)  # 2**62 bytes: malloc returns NULL
    for n in (2**62, -5):  # the byte size overflows int64 or is negative: refused before malloc
        with pytest.raises(KilnError, match="outer: size overflows int64"):
            m["outer"](n, y)
    m["outer"](3, y)  # still usable afterwards
    np.testing.assert_array_equal(y, [1.0, 4.0])
    ir_text = m.inspect_source("ll")
    assert ir_text.count("@free(") >= 3  # normal exit plus each error path frees


def test_call_extern_libm_and_buffer_argument() -> None:
    ib = IRBuilder()
    with ib.prim_func("ext"):
        x = ib.arg("X", (6,), "float64")
        y = ib.arg("Y", (6,), "float64")
        z = ib.arg("Z", (6,), "uint8")
        libm = ExternDependency("libm", libs=("-lm",))
        with ib.for_range(6, name="i") as i:
            ib.store(y, [i], CallExtern("cbrt", (x[i],), "float64", libm)
                     + CallExtern("hypot", (x[i], const(4.0, "float64")), "float64", libm))
        # memset(Z, 7, 6): a buffer argument passes the data pointer.
        ib.evaluate(CallExtern("memset", (z, const(7, "int32"), const(6, "uint64")), "uint64"))
    m = jit(ib.get())
    x = np.array([-8.0, 0.0, 1.0, 27.0, 3.0, 1e6])
    y, z = np.zeros(6), np.zeros(6, np.uint8)
    m["ext"](x, y, z)
    np.testing.assert_allclose(y, np.cbrt(x) + np.hypot(x, 4.0), rtol=1e-14)
    np.testing.assert_array_equal(z, 7)


def test_float16_buffers_with_intrinsics_and_reduction() -> None:
    ib = IRBuilder()
    with ib.prim_func("softmax_row"):
        x = ib.arg("X", (16,), "float16")
        y = ib.arg("Y", (16,), "float16")
        with ib.allocate("s", (1,), "float32", "local") as s:
            ib.store(s, [0], 0.0)
            with ib.for_range(16, name="i") as i:
                ib.store(s, [0], s[0] + Cast("float32", Intrin("exp", (x[i],))))
            with ib.for_range(16, name="j") as j:
                ib.store(y, [j], Cast("float16", Cast("float32", Intrin("exp", (x[j],))) / s[0]))
    m = jit(ib.get())
    x = RNG.standard_normal(16).astype(np.float16)
    y = np.zeros(16, np.float16)
    m["softmax_row"](x, y)
    e = np.exp(x.astype(np.float32))
    np.testing.assert_allclose(y.astype(np.float32), e / e.sum(), rtol=2e-3)


def test_bfloat16_and_bool_buffers() -> None:
    ib = IRBuilder()
    with ib.prim_func("mask_scale"):
        x = ib.arg("X", (8,), "bfloat16")
        mask = ib.arg("M", (8,), "bool")
        y = ib.arg("Y", (8,), "bfloat16")
        pos = ib.arg("P", (8,), "bool")
        with ib.for_range(8, name="i") as i:
            with ib.if_(mask[i]):
                ib.store(y, [i], x[i] * 3.0)
            with ib.else_():
                ib.store(y, [i], x[i])
            ib.store(pos, [i], y[i] > 0.0)
    m = jit(ib.get())
    bf = np.dtype(ml_dtypes.bfloat16)
    x = RNG.standard_normal(8).astype(bf)
    mask = np.array([1, 0, 1, 1, 0, 0, 1, 0], bool)
    y, pos = np.zeros(8, bf), np.zeros(8, bool)
    m["mask_scale"](x, mask, y, pos)
    want = np.where(mask, (x.astype(np.float32) * 3).astype(bf), x)
    np.testing.assert_array_equal(y.view(np.uint16), want.view(np.uint16))
    np.testing.assert_array_equal(pos, want.astype(np.float32) > 0)


def test_shapes_from_scalar_parameters() -> None:
    """A shape variable that is a scalar parameter works in the kernel (the packed
    ABI's metadata cannot describe such shapes yet, so call the raw kernel)."""
    ib = IRBuilder()
    with ib.prim_func("scale_rows"):
        n = ib.scalar_arg("n", "int64")
        x = ib.arg("X", (n, 3), "float32")
        y = ib.arg("Y", (n, 3), "float32")
        with ib.allocate("tmp", (n, 3), "float32", "global") as tmp, \
                ib.for_range(n, name="i") as i, ib.for_range(3, name="j") as j:
            ib.store(tmp, [i, j], x[i, j] * Cast("float32", i + 1))
            ib.store(y, [i, j], tmp[i, j])
    c = compiled(ib.get(), "llvmjit", jit=True)
    llvm = llvm_binding()
    engine = llvm.create_mcjit_compiler(llvm.parse_bitcode(c.module.as_bitcode()),
                                        c.target_machine)
    engine.finalize_object()
    kernel = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)(
        engine.get_function_address("kiln__kernel_scale_rows"))
    x = RNG.standard_normal((5, 3)).astype(np.float32)
    y = np.zeros((5, 3), np.float32)
    assert kernel(5, x.ctypes.data, y.ctypes.data) == 0
    np.testing.assert_array_equal(y, x * np.arange(1, 6, dtype=np.float32)[:, None])


def test_shape_variable_that_is_not_a_parameter_is_rejected() -> None:
    m = Var("m", "int64")
    ib = IRBuilder()
    with ib.prim_func("f"):
        x = ib.arg("X", (m, 4), "float32")
        ib.store(x, [0, 0], 1.0)
    with pytest.raises(CompileError, match="variable 'm' is not a scalar parameter"):
        compiled(ib.get())



def test_a_shape_variable_that_is_a_parameter_sizes_the_buffer() -> None:
    """llvmjit entries check a symbolic buffer against the scalar that sizes it."""
    ib = IRBuilder()
    with ib.prim_func("g"):
        n = ib.scalar_arg("n", "int64")
        x = ib.arg("X", (n,), "float32")
        with ib.for_range(n, name="i") as i:
            ib.store(x, [i], 2.0)
    g = jit(ib.get())["g"]
    out = np.zeros(3, np.float32)
    g(3, out)
    np.testing.assert_array_equal(out, [2.0, 2.0, 2.0])
    with pytest.raises(KilnError, match=re.escape(
            "g: dimension 'n' is 3 in argument 0 'n' but 4 in argument 1 'X'")):
        g(3, np.zeros(4, np.float32))


def test_heap_allocation_in_a_loop_body_is_freed_each_iteration() -> None:
    """A declaration's lifetime is the rest of its block: the loop body here."""
    ib = IRBuilder()
    with ib.prim_func("loop_alloc"):
        y = ib.arg("Y", (3,), "float32")
        with ib.for_range(3, name="i") as i:
            t = ib.declare_allocate("t", (2,), "float32", "global")
            ib.store(t, [0], Cast("float32", i))
            ib.store(y, [i], t[0] * 2.0)
    m = jit(ib.get())
    y = np.zeros(3, np.float32)
    m["loop_alloc"](y)
    assert y.tolist() == [0.0, 2.0, 4.0]  # (the lowered IR is checked in test_llvm_lowering)
