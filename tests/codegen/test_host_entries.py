"""host.c: every argument check of docs/abi.md, its status and its exact message.

The library is built from kernels.c + host.c (the C backend) and called through
hand-built DLTensors, so each failure path is reached on purpose.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from c_helpers import (
    ARG_DLTENSOR,
    ARG_FLOAT,
    ARG_INT,
    CC,
    WARNINGS,
    CLibrary,
    Raw,
    build,
    compile_c,
    have_cc,
    tensor,
)

from kiln.codegen.constants import ConstantPool
from kiln.codegen.host import codegen_host, host_prelude_source, host_source
from kiln.codegen.naming import library_metadata
from kiln.ir import IRBuilder, IRModule
from kiln.ir.tensor import Cast, const
from kiln.runtime.abi import ARGUMENT_ERROR

pytestmark = pytest.mark.skipif(not have_cc(), reason="needs a C compiler")


def make_module() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("add_one"):
        x = ib.arg("X", (2, 3), "float32")
        y = ib.arg("Y", (2, 3), "float32")
        with ib.for_range(2, name="i") as i, ib.for_range(3, name="j") as j:
            ib.store(y, [i, j], x[i, j] + 1.0)
    with ib.prim_func("scalars"):
        y = ib.arg("Y", (1,), "float64")
        a = ib.scalar_arg("a", "int8")
        b = ib.scalar_arg("b", "uint64")
        c = ib.scalar_arg("c", "bool")
        d = ib.scalar_arg("d", "float32")
        ib.store(y, [0], Cast("float64", a) + Cast("float64", b) + Cast("float64", c)
                 + Cast("float64", d))
    with ib.prim_func("empty_ok"):
        e = ib.arg("E", (0, 4), "int32")
        s = ib.arg("S", (), "float32")
        with ib.for_range(0, name="i") as i:
            ib.store(e, [i, 0], 1)
        ib.store(s, [], 2.5)
    with ib.prim_func("nothing"):
        ib.evaluate(Cast("int32", const(1.5, "float32")))
    return ib.get()


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> CLibrary:
    return build(make_module(), Path(tmp_path_factory.mktemp("host")))


def fails(lib: CLibrary, name: str, *args: object, code: int = ARGUMENT_ERROR,
          **kw: object) -> str:
    rc = lib.call(name, *args, **kw)  # type: ignore[arg-type]
    assert rc == code, (rc, lib.last_error())
    return lib.last_error()


def good() -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32)


def test_success_and_empty_last_error(lib: CLibrary) -> None:
    x, y = good()
    x[:] = np.arange(6).reshape(2, 3)
    assert fails(lib, "add_one", x, code=ARGUMENT_ERROR)  # leaves an error behind
    assert lib.call("add_one", x, y) == 0
    assert lib.last_error() == ""
    np.testing.assert_array_equal(y, x + 1)


def test_argument_count(lib: CLibrary) -> None:
    x, y = good()
    assert fails(lib, "add_one", x, y, x) == "add_one: expected 2 arguments, got 3"
    assert fails(lib, "add_one") == "add_one: expected 2 arguments, got 0"
    assert fails(lib, "nothing", x) == "nothing: expected 0 arguments, got 1"
    assert lib.call("nothing") == 0


def test_null_argument_arrays(lib: CLibrary) -> None:
    assert fails(lib, "add_one", num_args=2, null_args=True) == (
        "add_one: args or type_codes is NULL")


def test_type_codes(lib: CLibrary) -> None:
    x, _ = good()
    assert fails(lib, "add_one", x, Raw(3, ARG_INT)) == (
        "add_one: argument 1 'Y': expected a tensor (type code 7), got type code 0")
    assert fails(lib, "scalars", np.zeros(1), x, 0, False, 1.0) == (
        "scalars: argument 1 'a': expected an integer scalar (type code 0), got type code 7")
    assert fails(lib, "scalars", np.zeros(1), 1, 2.0, False, 1.0) == (
        "scalars: argument 2 'b': expected an integer scalar (type code 0), got type code 2")
    assert fails(lib, "scalars", np.zeros(1), 1, 2, True, Raw(0, ARG_DLTENSOR)) == (
        "scalars: argument 4 'd': expected a float scalar (type code 2), got type code 7")


def test_null_tensor(lib: CLibrary) -> None:
    x, _ = good()
    assert fails(lib, "add_one", x, None) == "add_one: argument 1 'Y': expected a tensor, got NULL"


def test_device(lib: CLibrary) -> None:
    x, y = good()
    assert fails(lib, "add_one", tensor(x, device_type=2), y) == (
        "add_one: argument 0 'X': expected a CPU tensor (device_type 1), got device_type 2")


def test_ndim(lib: CLibrary) -> None:
    x, _ = good()
    assert fails(lib, "add_one", x, np.zeros(6, np.float32)) == (
        "add_one: argument 1 'Y': expected 2 dimensions, got 1")
    assert fails(lib, "scalars", np.zeros((1, 1)), 1, 2, True, 1.0) == (
        "scalars: argument 0 'Y': expected 1 dimension, got 2")


def test_dtype(lib: CLibrary) -> None:
    x, _ = good()
    assert fails(lib, "add_one", x, np.zeros((2, 3), np.int64)) == (
        "add_one: argument 1 'Y': expected dtype float32, got int64")
    assert fails(lib, "add_one", np.zeros((2, 3), np.bool_), x) == (
        "add_one: argument 0 'X': expected dtype float32, got bool")
    assert fails(lib, "add_one", tensor(x, dtype=(2, 32, 4)), x) == (
        "add_one: argument 0 'X': expected dtype float32, got float32x4")
    assert fails(lib, "add_one", tensor(x, dtype=(9, 32, 1)), x) == (
        "add_one: argument 0 'X': expected dtype float32, got dtype(code=9, bits=32)")


def test_shape(lib: CLibrary) -> None:
    x, _ = good()
    assert fails(lib, "add_one", x, np.zeros((2, 4), np.float32)) == (
        "add_one: argument 1 'Y': expected shape [2, 3], got [2, 4]")


def test_strides(lib: CLibrary) -> None:
    x, y = good()
    assert fails(lib, "add_one", x, tensor(y, strides=(1, 2))) == (
        "add_one: argument 1 'Y': expected a contiguous tensor")
    # compact strides, and any stride on an extent-1 dimension, are fine
    assert lib.call("add_one", tensor(x, strides=(3, 1)), y) == 0
    one = np.zeros((1,), np.float64)
    assert lib.call("scalars", tensor(one, strides=(99,)), 1, 2, True, 1.0) == 0


def test_data_null_and_alignment(lib: CLibrary) -> None:
    x, y = good()
    assert fails(lib, "add_one", x, tensor(y, data=0)) == "add_one: argument 1 'Y': data is NULL"
    raw = np.zeros(32, np.uint8)
    misaligned = tensor(raw[1:25].view(np.uint8), dtype=(2, 32, 1), shape=(2, 3))
    assert fails(lib, "add_one", x, misaligned) == (
        "add_one: argument 1 'Y': data is not aligned to its 4-byte elements")


def test_byte_offset_is_honoured(lib: CLibrary) -> None:
    big = np.arange(12, dtype=np.float32)
    y = np.zeros((2, 3), np.float32)
    view = tensor(big, shape=(2, 3), byte_offset=6 * 4)
    assert lib.call("add_one", view, y) == 0
    np.testing.assert_array_equal(y.ravel(), big[6:] + 1)


def test_scalar_ranges_and_conversions(lib: CLibrary) -> None:
    y = np.zeros(1)
    assert fails(lib, "scalars", y, 128, 0, True, 1.0) == (
        "scalars: argument 1 'a': value 128 out of range for int8")
    assert fails(lib, "scalars", y, -1, -1, True, 1.0) == (
        "scalars: argument 2 'b': value -1 out of range for uint64")
    assert fails(lib, "scalars", y, -1, 0, 2, 1.0) == (
        "scalars: argument 3 'c': value 2 out of range for bool")
    assert lib.call("scalars", y, -128, 2**63 - 1, 1, 0.1) == 0
    assert y[0] == -128 + float(2**63 - 1) + 1 + float(np.float32(0.1))
    assert lib.call("scalars", y, 5, 6, 0, Raw(7, ARG_INT)) == 0  # int for a float param
    assert y[0] == 18
    assert lib.call("scalars", y, 5, 6, 0, Raw(0.25, ARG_FLOAT)) == 0
    assert y[0] == 11.25


def test_zero_size_and_zero_dim_tensors(lib: CLibrary) -> None:
    s = np.zeros((), np.float32)
    empty = tensor(None, shape=(0, 4), dtype=(0, 32, 1))  # data NULL is fine: no elements
    assert lib.call("empty_ok", empty, s) == 0, lib.last_error()
    assert s == 2.5


def test_metadata_matches_naming(lib: CLibrary) -> None:
    assert lib.metadata() == json.loads(json.dumps(library_metadata(make_module(), "kiln_")))


def test_last_error_is_thread_local(lib: CLibrary) -> None:
    import threading

    x, _ = good()
    fails(lib, "add_one", x)
    seen: list[str] = []
    thread = threading.Thread(target=lambda: seen.append(lib.last_error()))
    thread.start()
    thread.join()
    assert seen == [""]
    assert lib.last_error() == "add_one: expected 2 arguments, got 1"


def test_artifact_and_default_flags() -> None:
    mod = make_module()
    art = codegen_host(mod, prefix="kiln_", metadata=library_metadata(mod, "kiln_"))
    assert (art.codegen_id, art.loader, art.file_name) == ("host", "native", "host.c")
    assert list(art.metadata["cflags"]) == ["-std=c11", "-O2", "-fPIC"]
    text = art.content.decode()
    # Without parallel loops the POSIX headers of the thread pool stay out: the
    # preprocessor keeps only the C standard library's #includes.
    assert "#define KILN_HOST_PARALLEL" not in text
    kept = subprocess.run([CC, "-std=c11", "-E", "-dI", "-x", "c", "-"], input=text,
                          capture_output=True, text=True, check=True).stdout
    includes, current = set(), ""
    for line in kept.splitlines():
        if line.startswith("# ") and '"' in line:  # a line marker names the current file
            current = line.split('"')[1]
        elif line.startswith("#include") and current == "<stdin>":
            includes.add(line.split()[1])
    assert includes == {"<stdarg.h>", "<stddef.h>", "<stdint.h>", "<stdio.h>", "<string.h>"}
    # Its #defines and kiln_host.c come first: the same bytes for another model of the
    # prefix, which kiln.runtime.native compiles once (docs/codegen-c.md).
    other_mod = many_functions_module(3)
    other = codegen_host(other_mod, prefix="kiln_", metadata=library_metadata(other_mod, "kiln_"))
    size = art.metadata["prelude"]
    assert other.metadata["prelude"] == size and other.content[:size] == art.content[:size]
    assert host_prelude_source() in art.content[:size].decode()
    assert other.content != art.content


def many_functions_module(n: int) -> IRModule:
    dtypes = ["float32", "int8", "uint16", "bool", "float16", "bfloat16", "float64", "int64"]
    ib = IRBuilder()
    for k in range(n):
        d = dtypes[k % len(dtypes)]
        with ib.prim_func(f"f{k}"):
            x = ib.arg("X", (k % 5 + 1, 2), d)
            y = ib.arg("Y", (k % 5 + 1, 2), d)
            s = ib.scalar_arg("s", dtypes[(k + 3) % len(dtypes)])
            ib.store(y, [0, 0], x[0, 0])
            if k % 2:
                ib.store(y, [0, 1], Cast(d, s))
    return ib.get()


@pytest.mark.parametrize("prefix", ["kiln_", "my_model"])
def test_many_functions_compile_pedantic(tmp_path: Path, prefix: str) -> None:
    mod = many_functions_module(120)
    meta = library_metadata(mod, prefix)
    assert len(json.dumps(meta)) > 4096  # the metadata becomes a byte array, not a literal
    path = tmp_path / "host.c"
    path.write_text(host_source(mod, prefix=prefix, metadata=meta))
    compile_c(path, ["-std=c11", "-fPIC"])
    compile_c(path, ["-std=c99", "-fPIC"])  # __thread before C11
    assert f"{prefix}_host_metadata_json[" in path.read_text()


def test_long_metadata_round_trips_and_prefix(tmp_path: Path) -> None:
    mod = many_functions_module(60)
    lib = build(mod, tmp_path, prefix="my_model", pool=ConstantPool())
    assert lib.metadata() == json.loads(json.dumps(library_metadata(mod, "my_model")))
    x = np.ones((1, 2), ml_dtypes.bfloat16)
    y = np.zeros((1, 2), ml_dtypes.bfloat16)
    assert lib.call("f5", x, y, 1.5) == 0, lib.last_error()  # bfloat16 tensors, float32 s
    assert y[0, 0] == 1 and y[0, 1] == 1.5


def test_non_ascii_metadata_is_escaped(tmp_path: Path) -> None:
    mod = make_module()
    meta = library_metadata(mod, "kiln_", note="Gewichte ✓ ??= \"quoted\" \\ end")
    path = tmp_path / "host.c"
    path.write_text(host_source(mod, prefix="kiln_", metadata=meta))
    obj = compile_c(path, ["-std=c11", "-fPIC"])
    so = tmp_path / "meta.so"
    kernels = tmp_path / "k.c"
    kernels.write_text(
        "#include <stdint.h>\n"
        "int32_t kiln__kernel_add_one(float* x, float* y) { (void)x; (void)y; return 0; }\n"
        "int32_t kiln__kernel_scalars(double* y, int8_t a, uint64_t b, uint8_t c, float d)"
        " { (void)y; (void)a; (void)b; (void)c; (void)d; return 0; }\n"
        "int32_t kiln__kernel_empty_ok(int32_t* e, float* s) { (void)e; (void)s; return 0; }\n"
        "int32_t kiln__kernel_nothing(void) { return 0; }\n")
    kobj = compile_c(kernels, ["-std=c99", "-fPIC"])
    subprocess.run([CC, *WARNINGS, "-shared", "-o", str(so), str(obj), str(kobj)], check=True)
    dll = ctypes.CDLL(str(so))
    fn = dll.kiln__metadata
    fn.restype = ctypes.c_char_p
    assert json.loads(fn().decode("utf-8"))["note"] == meta["note"]


def test_host_helpers_are_named_apart_from_entries(tmp_path: Path) -> None:
    """host.c's copies of kiln_kernels.h helpers take its `{prefix}_host_` names, so an
    entry may be called like a helper: with prefix "kiln_", function `f16_from_double`
    exports `kiln_f16_from_double` and its float16 scalar goes through the helper."""
    ib = IRBuilder()
    with ib.prim_func("f16_from_double"):
        y = ib.arg("Y", (1,), "float16")
        s = ib.scalar_arg("s", "float16")
        ib.store(y, [0], s)
    mod = ib.get()
    text = host_source(mod, prefix="kiln_", metadata=library_metadata(mod, "kiln_"))
    assert "kiln__host_f16_from_double(" in text
    lib = build(mod, tmp_path, prefix="kiln_")
    y_out = np.zeros(1, np.float16)
    assert lib.call("f16_from_double", y_out, 1.0009765625) == 0, lib.last_error()
    assert y_out[0] == np.float16(1.0009765625)
