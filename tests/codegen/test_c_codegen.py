"""The C backend's output as text and as artifacts: flags, literals, names, errors."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from c_helpers import WARNINGS, build, compile_c, have_cc

from kiln.codegen.c import codegen_c, emit_kernels
from kiln.codegen.cfamily.literals import bfloat16_round, float_literal, int_literal
from kiln.codegen.constants import ConstantPool
from kiln.errors import CompileError
from kiln.ir import IRBuilder, IRModule, TensorType
from kiln.ir.graph import CallTensor
from kiln.ir.tensor import (
    Allocate,
    BinaryOp,
    Buffer,
    CallExtern,
    Cast,
    Const,
    For,
    Intrin,
    PrimFunc,
    Store,
    Var,
    const,
    seq,
)
from kiln.target import Target
from kiln.target.host import machine_config
from kiln.transform.outline import OutlineParallelLoops
from support.toolchains import require_tool

needs_cc = pytest.mark.skipif(not have_cc(), reason="needs a C compiler")


def add_one_module() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("add_one"):
        x = ib.arg("X", (4,), "float32")
        y = ib.arg("Y", (4,), "float32")
        with ib.for_range(4, name="i") as i:
            ib.store(y, [i], x[i] + 1.0)
    return ib.get()


EXPECTED_ADD_ONE = """\
/* add_one(X: float32[4], Y: float32[4]) */
KILN_HIDDEN int32_t kiln__kernel_add_one(const float* X, float* restrict Y) {
  for (int64_t i = 0; i < 4; ++i) {
    Y[i] = X[i] + 1.0f;
  }
  return 0;
}
"""


def source(mod: IRModule, prefix: str = "kiln_") -> str:
    return emit_kernels(OutlineParallelLoops()(mod), prefix=prefix,
                        pool=ConstantPool.from_module(mod))[0]


def test_readable_kernel() -> None:
    text = source(add_one_module())
    assert EXPECTED_ADD_ONE in text
    assert "KILN_HIDDEN int32_t kiln__kernel_add_one(const float* X, float* restrict Y);" in text


# ------------------------------------------------------------------ artifacts and flags


def test_artifacts_for_the_host() -> None:
    mod = add_one_module()
    arts = codegen_c(mod, None, prefix="kiln_", pool=ConstantPool())
    assert [(a.codegen_id, a.loader, a.file_name) for a in arts] == [
        ("c", "native", "kernels.c"), ("host", "native", "host.c")]
    kernels, host = arts
    assert list(kernels.metadata["cflags"]) == [
        "-std=c99", "-O2", "-fwrapv", "-ffp-contract=off", "-fno-math-errno",
        "-fno-trapping-math", "-fPIC"]
    assert kernels.metadata["native"] is True
    assert list(kernels.metadata["libs"]) == ["-lm"]
    assert dict(kernels.metadata["kernels"]) == {"add_one": "kiln__kernel_add_one"}
    assert list(host.metadata["cflags"]) == ["-std=c11", "-O2", "-fPIC"]


def test_constants_artifact_only_with_weights() -> None:
    ib = IRBuilder()
    data = np.arange(4, dtype=np.float32)
    with ib.prim_func("w"):
        y = ib.arg("Y", (4,), "float32")
        with ib.alloc_const("W", data) as w, ib.for_range(4, name="i") as i:
            ib.store(y, [i], w[i])
    mod = ib.get()
    pool = ConstantPool.from_module(mod)
    arts = codegen_c(mod, Target("c"), prefix="m_", pool=pool)
    consts, table = arts[-2:]
    assert (consts.codegen_id, consts.file_name) == ("c", "constants.bin")
    assert consts.metadata["symbol"] == "m__consts" and consts.metadata["table"] == [[0, 16]]
    assert consts.content[:16] == data.tobytes()
    # The kernel reads the constant's address from its slot; const_table.c fills the slot.
    assert "(const float*)m__const_table[0]" in arts[0].content.decode()
    assert (table.codegen_id, table.file_name) == ("c", "const_table.c")
    assert b"m__consts + 0ULL" in bytes(table.content)


def test_target_flags() -> None:
    mod = add_one_module()
    kernels = codegen_c(mod, Target("c -opt-level=1 -fast-math"), prefix="kiln_",
                        pool=ConstantPool())[0]
    flags = list(kernels.metadata["cflags"])
    assert "-O1" in flags and "-ffast-math" in flags and "-ffp-contract=off" not in flags
    assert "-O3" in list(codegen_c(mod, Target("c"), prefix="kiln_",
                                   pool=ConstantPool())[0].metadata["cflags"])


@needs_cc
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 flags")
def test_native_mcpu_and_mattr_reach_cc(tmp_path: Path) -> None:
    t = Target("c -mcpu=haswell -mattr=+avx2,+fma,+cx16,-avx512f")
    kernels = codegen_c(add_one_module(), t, prefix="kiln_", pool=ConstantPool())[0]
    flags = list(kernels.metadata["cflags"])
    assert set(flags[6:]) == {"-march=haswell", "-mavx2", "-mfma", "-mno-avx512f", "-fPIC"}
    assert "-mcx16" not in flags  # only features GCC is known to share with LLVM
    path = tmp_path / "kernels.c"
    path.write_bytes(kernels.content)
    compile_c(path, flags)


@needs_cc
def test_the_host_cpu_is_native_to_the_system_compiler(tmp_path: Path) -> None:
    """Target.from_host's CPU name is LLVM's (GCC 12 has no `znver4`): a native c build
    for it asks the system compiler for `native`, and the kernels compile."""
    host = Target(machine_config()).export()  # the machine's, not a $KILN_HOST_CPU
    t = Target({**host, "kind": "c"})
    kernels = codegen_c(add_one_module(), t, prefix="kiln_", pool=ConstantPool())[0]
    flags = list(kernels.metadata["cflags"])
    assert ("-march=native" if platform.machine() in ("x86_64", "AMD64")
            else "-mcpu=native") in flags
    path = tmp_path / "kernels.c"
    path.write_bytes(kernels.content)
    compile_c(path, flags)


def test_cortex_m_flags_are_recorded_for_the_cross_compiler(tmp_path: Path) -> None:
    t = Target({"kind": "c", "mtriple": "thumbv7em-none-eabihf", "mcpu": "cortex-m4",
                "mfloat-abi": "hard"})
    kernels, host = codegen_c(add_one_module(), t, prefix="kiln_", pool=ConstantPool())
    flags = list(kernels.metadata["cflags"])
    assert flags == ["-std=c99", "-O3", "-fwrapv", "-ffp-contract=off", "-fno-math-errno",
                     "-fno-trapping-math", "-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=hard"]
    assert kernels.metadata["native"] is False
    assert kernels.metadata["cc"] == "arm-none-eabi-gcc"
    host_flags = list(host.metadata["cflags"])
    assert "-fPIC" not in host_flags and "-DKILN_NO_THREADS" in host_flags
    gcc = require_tool("arm-none-eabi-gcc")
    for art in (kernels, host):
        path = tmp_path / art.file_name
        path.write_bytes(art.content)
        subprocess.run([gcc, *WARNINGS, *art.metadata["cflags"], "-c", str(path), "-o",
                        str(path.with_suffix(".o"))], check=True)


def test_target_none_or_foreign_objects_are_accepted() -> None:
    class Odd:
        def get(self, key: str, default: object = None) -> object:
            raise KeyError(key)

    for target in (None, Odd(), object()):
        arts = codegen_c(add_one_module(), target, prefix="kiln_", pool=ConstantPool())
        assert "-O2" in list(arts[0].metadata["cflags"])


# ------------------------------------------------------------------ literals


def test_float_literals() -> None:
    assert float_literal(3.0, "float32") == "3.0f"
    assert float_literal(0.1, "float32") == "0.1f"
    assert float_literal(0.1, "float64") == "0.1"
    assert float_literal(1e20, "float32") == "1e+20f"
    assert float_literal(float("inf"), "float32") == "INFINITY"
    assert float_literal(float("-inf"), "float64") == "-HUGE_VAL"
    assert float_literal(float("nan"), "float16") == "NAN"
    assert float_literal(1e-45, "float32") == "0x1p-149f"  # subnormal: hex
    assert float_literal(1e300, "float32") == "INFINITY"  # rounds to the dtype first
    assert float_literal(0.1, "float16") == "0.099975586f"
    assert bfloat16_round(1.00390625) == 1.0  # tie to even
    assert bfloat16_round(0.1) == float(np.float32(ml_dtypes.bfloat16(0.1)))
    assert int_literal(5, "int64") == ("5", False)
    assert int_literal(-(2**63), "int64") == ("INT64_MIN", True)
    assert int_literal(2**40, "int64") == ("INT64_C(1099511627776)", True)
    assert int_literal(-1, "uint32") == ("UINT32_C(4294967295)", True)
    assert int_literal(300, "int8") == ("44", True)  # wrapped into range


FLOATS = [0.0, -0.0, 0.1, -2.5, 1e-45, 1.17e-38, 3.4028235e38, 1e38, 65504.0, 6e-8,
          float("inf"), float("-inf"), float("nan"), 1 / 3, 2.0**-1074, 1.7976931348623157e308]


@needs_cc
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_float_constants_are_exact(tmp_path: Path, dtype: str) -> None:
    ib = IRBuilder()
    with ib.prim_func("consts"):
        y = ib.arg("Y", (len(FLOATS),), dtype)
        for k, value in enumerate(FLOATS):
            ib.store(y, [k], Const(value, dtype))
    lib = build(ib.get(), tmp_path)
    np_type = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    y = np.zeros(len(FLOATS), np_type)
    lib.run("consts", y)
    with np.errstate(over="ignore"):
        if dtype == "bfloat16":
            want = np.array([bfloat16_round(v) for v in FLOATS]).astype(np.float32)
            want = want.astype(np_type)
        else:
            want = np.array(FLOATS).astype(np_type)
    assert y.view(f"u{y.itemsize}").tolist()[:12] == want.view(f"u{y.itemsize}").tolist()[:12]
    assert np.array_equal(y.astype(np.float64), want.astype(np.float64), equal_nan=True)
    assert np.array_equal(np.signbit(y.astype(np.float64)), np.signbit(want.astype(np.float64)))


@needs_cc
def test_integer_literal_typing(tmp_path: Path) -> None:
    """Literal-only arithmetic must not be done in C's 32-bit `int`."""
    ib = IRBuilder()
    with ib.prim_func("ints"):
        y = ib.arg("Y", (6,), "int64")
        u = ib.arg("U", (3,), "uint32")
        q = ib.arg("Q", (2,), "uint64")
        ib.store(y, [0], const(2000000, "int64") * const(2000000, "int64"))
        ib.store(y, [1], const(1, "int64") << const(40, "int64"))
        ib.store(y, [2], const(-(2**63), "int64"))
        ib.store(y, [3], const(2**63 - 1, "int64"))
        ib.store(y, [4], -const(2147483647, "int64") - const(10, "int64"))
        ib.store(y, [5], Cast("int64", const(-(2**31), "int32")) * 4)
        ib.store(u, [0], const(3, "uint32") - const(5, "uint32"))
        ib.store(u, [1], const(2**32 - 1, "uint32"))
        ib.store(u, [2], const(70000, "uint32") * const(70000, "uint32"))
        ib.store(q, [0], const(2**64 - 1, "uint64"))
        ib.store(q, [1], const(3, "uint64") * const(2**40, "uint64"))
    lib = build(ib.get(), tmp_path)
    y, u, q = np.zeros(6, np.int64), np.zeros(3, np.uint32), np.zeros(2, np.uint64)
    lib.run("ints", y, u, q)
    assert y.tolist() == [4 * 10**12, 2**40, -(2**63), 2**63 - 1, -2147483657, -(2**33)]
    assert u.tolist() == [2**32 - 2, 2**32 - 1, (70000 * 70000) % 2**32]
    assert q.tolist() == [2**64 - 1, 3 * 2**40]


# ------------------------------------------------------------------ names


@needs_cc
def test_names_are_unique_and_never_shadow_c(tmp_path: Path) -> None:
    ib = IRBuilder()
    with ib.prim_func("weird"):
        a = ib.arg("exp", (3,), "float32")  # a libm function
        b = ib.arg("int", (3,), "float32")  # a C keyword
        c = ib.arg("kiln_f16_round", (3,), "float32")  # a helper's name
        d = ib.arg("x y", (3,), "float32")  # not an identifier
        n = ib.scalar_arg("status", "int64")  # the kernel's own status variable
        with ib.allocate("done", (3,), "float32", "global") as ws:
            with ib.for_range(3, name="i") as i:
                inner = Var("i", "int64")
                with ib.for_range(1, name="i", var=inner) as j:
                    ib.store(ws, [i], Intrin("exp", (a[i],)) + b[i + j] + Cast("float32", n))
            with ib.for_range(3, name="i") as i:
                ib.store(c, [i], ws[i])
                ib.store(d, [i], ws[i] * 2.0)
        ib.call_func("helper", [d])
    with ib.prim_func("helper"):
        z = ib.arg("Z", (3,), "float32")
        with ib.for_range(3, name="i") as i:
            ib.store(z, [i], z[i] + 1.0)
    lib = build(ib.get(), tmp_path)
    x = np.array([0.0, 1.0, 2.0], np.float32)
    bb = np.ones(3, np.float32)
    out_c, out_d = np.zeros(3, np.float32), np.zeros(3, np.float32)
    lib.run("weird", x, bb, out_c, out_d, 5)
    np.testing.assert_allclose(out_c, np.exp(x) + 1 + 5, rtol=1e-6)
    np.testing.assert_allclose(out_d, (np.exp(x) + 6) * 2 + 1, rtol=1e-6)
    text = lib.source()
    for name in ("v_exp", "v_int", "v_kiln_f16_round", "x_y", "status_1", "i_1", "done"):
        assert name in text, name


@needs_cc
def test_heap_allocation_inside_a_loop_is_freed_each_iteration(tmp_path: Path) -> None:
    ib = IRBuilder()
    with ib.prim_func("loop_alloc"):
        y = ib.arg("Y", (3,), "float32")
        with ib.for_range(3, name="i") as i, ib.allocate("t", (2,), "float32", "global") as t:
            ib.store(t, [0], Cast("float32", i))
            ib.store(y, [i], t[0] * 2.0)
    lib = build(ib.get(), tmp_path)
    y = np.zeros(3, np.float32)
    lib.run("loop_alloc", y)
    assert y.tolist() == [0.0, 2.0, 4.0]
    body = lib.source().split("kernel_loop_alloc(float* restrict Y) {")[1]
    assert body.count("KILN_FREE(t);") == 2 and "t = NULL;" in body


@needs_cc
def test_empty_module_zero_sized_local_and_unused_workspace(tmp_path: Path) -> None:
    empty = IRModule({})
    for art in codegen_c(empty, None, prefix="kiln_", pool=ConstantPool()):
        path = tmp_path / art.file_name
        path.write_bytes(art.content)
        compile_c(path, art.metadata["cflags"])
    y = Buffer("Y", (1,), "float32")
    tmp = Buffer("tmp", (0,), "float32", "local")
    i = Var("i")
    spare = Buffer("spare", (8,), "float32", "global")  # no malloc, no `done:` label
    body = seq(Allocate(spare), Allocate(tmp),
               For(i, const(0), const(0), "serial", Store(tmp, const(1.0, "float32"), (i,))))
    mod = IRModule({"zero": PrimFunc((y,), body)})
    lib = build(mod, tmp_path / "zero")
    assert lib.call("zero", np.zeros(1, np.float32)) == 0
    assert "float tmp[1];" in lib.source() and "spare" not in lib.source()


# ------------------------------------------------------------------ errors


def compile_error(mod: IRModule) -> str:
    with pytest.raises(CompileError) as info:
        source(mod)
    return str(info.value)


def one_func(body_fn: object, params: tuple = ()) -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("f"):
        y = ib.arg("Y", (4,), "float32")
        body_fn(ib, y)  # type: ignore[operator]
    return ib.get()


def test_error_extern_against_math_h() -> None:
    mod = one_func(lambda ib, y: ib.store(y, [0], CallExtern("sqrt", (y[0],), "float32")))
    assert "call_extern 'sqrt': <math.h> declares double f(double), but the call is " \
        "float f(float); cast the arguments or use 'sqrtf'" in compile_error(mod)


def test_error_extern_two_signatures() -> None:
    def body(ib: IRBuilder, y: Buffer) -> None:
        ib.store(y, [0], CallExtern("my_fn", (y[0],), "float32"))
        ib.store(y, [1], CallExtern("my_fn", (y, y[0]), "float32"))

    assert "call_extern 'my_fn' is called as float f(float*, float) here but as float " \
        "f(float) elsewhere" in compile_error(one_func(body))


def test_error_extern_macro_and_reserved_names() -> None:
    mod = one_func(lambda ib, y: ib.store(y, [0], Cast("float32", CallExtern(
        "isnan", (y[0],), "bool"))))
    assert "'isnan' is a <math.h> macro" in compile_error(mod)
    mod = one_func(lambda ib, y: ib.evaluate(CallExtern("kiln__kernel_f", (y,), "int32")))
    assert "cannot be used in C" in compile_error(mod)


def test_error_store_into_constant() -> None:
    def body(ib: IRBuilder, y: Buffer) -> None:
        with ib.alloc_const("W", np.zeros(4, np.float32)) as w:
            ib.store(w, [0], y[0])

    assert "store into constant buffer 'W'" in compile_error(one_func(body))


def test_error_unknown_callee_and_bad_arguments() -> None:
    assert "call to 'nope', which is not a tensor-level function" in compile_error(
        one_func(lambda ib, y: ib.call_func("nope", [y])))
    ib = IRBuilder()
    with ib.prim_func("g"):
        ib.arg("A", (4,), "int32")
        ib.evaluate(const(0, "int32"))
    with ib.prim_func("f"):
        y = ib.arg("Y", (4,), "float32")
        ib.call_func("g", [y])
    assert "call to 'g', argument 0 'A': expected a buffer int32, got a buffer float32" in \
        compile_error(ib.get())


def test_error_symbolic_shape_and_float_only_intrinsic() -> None:
    # Kernels take symbolic shapes (tests/ops/test_dynamic_kernels.py); a register-sized
    # `local` temporary of symbolic size has no C array type.
    n = Var("n", "int64")
    x = Buffer("X", (n,), "float32")
    tmp = Buffer("t", (n,), "float32", "local")
    mod = IRModule({"f": PrimFunc((x, n), seq(
        Allocate(tmp), Store(tmp, const(1.0, "float32"), (const(0),)),
        Store(x, tmp[0], (const(0),))))})
    assert "symbolic shape" in compile_error(mod)
    mod = one_func(lambda ib, y: ib.store(y, [0], Cast("float32", Intrin(
        "exp", (const(1, "int32"),)))))
    assert "intrinsic exp needs a float argument, got int32" in compile_error(mod)


def test_error_graph_function_not_lowered_and_bad_prefix() -> None:
    ib = IRBuilder(add_one_module())
    with ib.function("main"):
        x = ib.param("x", (4,), "float32")
        ib.ret(ib.emit(CallTensor("add_one", (x,), TensorType((4,), "float32"))))
    assert "needs a lowered module" in compile_error(ib.get())
    with pytest.raises(CompileError, match="must be a non-empty C identifier"):
        source(add_one_module(), prefix="1bad")


def test_error_malformed_node() -> None:
    mod = one_func(lambda ib, y: ib.emit_stmt(Store(y, BinaryOp("add", y[0], 1.0), (  # type: ignore[arg-type]
        const(0),))))
    assert "cannot print expression float 1.0" in compile_error(mod)


# ------------------------------------------------------------------ qualifiers


@needs_cc
def test_const_restrict_and_in_place_calls(tmp_path: Path) -> None:
    """Read-only buffers are const; a callee called in place loses `restrict`."""
    ib = IRBuilder()
    with ib.prim_func("inc"):
        x = ib.arg("X", (4,), "float32")
        y = ib.arg("Y", (4,), "float32")
        with ib.for_range(4, name="i") as i:
            ib.store(y, [i], x[i] + 1.0)
    with ib.prim_func("twice_in_place"):
        z = ib.arg("Z", (4,), "float32")
        ib.call_func("inc", [z, z])
        ib.call_func("inc", [z, z])
    lib = build(ib.get(), tmp_path)
    text = lib.source()
    assert "kiln__kernel_inc(const float* X, float* Y) {" in text
    assert "kiln__kernel_twice_in_place(float* restrict Z) {" in text  # both args derive from Z
    z = np.arange(4, dtype=np.float32)
    lib.run("twice_in_place", z)
    np.testing.assert_array_equal(z, np.arange(4) + 2)
    host = lib.source("host.c")
    assert "kiln__kernel_inc(const float* p0, float* p1);" in host


@needs_cc
def test_string_h_functions(tmp_path: Path) -> None:
    """memcpy & co. use <string.h>'s prototypes; their pointer result reads as 0."""
    ib = IRBuilder()
    with ib.prim_func("strings"):
        a = ib.arg("A", (4,), "float32")
        b = ib.arg("B", (4,), "float32")
        r = ib.arg("R", (1,), "uint64")
        ib.evaluate(CallExtern("memcpy", (b, a, const(16, "uint64")), "uint64"))
        ib.store(r, [0], CallExtern("memset", (a, const(0, "int32"), const(8, "uint64")),
                                    "uint64") + 7)
    mod = ib.get()
    lib = build(mod, tmp_path)
    a = np.arange(1, 5, dtype=np.float32)
    b = np.zeros(4, np.float32)
    r = np.zeros(1, np.uint64)
    lib.run("strings", a, b, r)
    assert b.tolist() == [1, 2, 3, 4] and a.tolist() == [0, 0, 3, 4] and r[0] == 7
    text = lib.source()
    assert "#include <string.h>" in text and "extern" not in text.split("KILN_HIDDEN int32_t")[0]
    bad = one_func(lambda ib, y: ib.evaluate(CallExtern(
        "memset", (y, y[0], const(4, "uint64")), "uint64")))
    assert "<string.h> declares void* f(void*, int, size_t)" in compile_error(bad)
