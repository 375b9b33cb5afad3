"""NativeFunction / RawKernelFunction: results, argument binding, checks, zero-copy."""

from __future__ import annotations

import ctypes
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kiln.errors import CallError, FormatError, KilnError
from kiln.runtime import Module, RawKernelFunction
from kiln.runtime.function import PackedFunction
from support import handmade_lib as hm
from support.processes import run_python

F32 = np.float32


class DLPackOnly:
    """A tensor that is not a numpy array and speaks only DLPack (like torch/jax)."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._array.__dlpack_device__()


class FakeCudaTensor:
    """A DLPack tensor that claims to live on a CUDA device."""

    def __dlpack__(self, **kwargs: Any) -> Any:
        raise AssertionError("must be rejected before the data is touched")

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)


# ------------------------------------------------------------------ results
def test_every_function_matches_its_numpy_reference(hand_lib: Module) -> None:
    x = np.array([1.5, -2.0, 3.25, 0.0], F32)
    y = np.zeros(4, F32)
    assert hand_lib["add_one"](x, y) is None
    np.testing.assert_array_equal(y, hm.reference("add_one", x))

    X = np.arange(6, dtype=F32).reshape(2, 3)
    Y = np.zeros((2, 3), F32)
    hand_lib["scale_add"](X, Y, 2.5, 3)
    np.testing.assert_array_equal(Y, hm.reference("scale_add", X, 2.5, 3))

    out = hand_lib["main"](x)
    assert isinstance(out, np.ndarray) and out.dtype == F32 and out.shape == (4,)
    np.testing.assert_array_equal(out, hm.reference("main", x))

    xi = np.array([4, -7, 100], np.int64)
    a, b = hand_lib["split"](xi)
    ra, rb = hm.reference("split", xi)
    np.testing.assert_array_equal(a, ra)
    np.testing.assert_array_equal(b, rb)
    assert a.dtype == np.int64 and b.dtype == np.float64


def test_keyword_and_mixed_arguments(hand_lib: Module) -> None:
    X = np.ones((2, 3), F32)
    Y = np.zeros((2, 3), F32)
    hand_lib["scale_add"](X, k=1, Y=Y, alpha=2)  # an int is fine for a float scalar
    np.testing.assert_array_equal(Y, np.full((2, 3), 3, F32))
    np.testing.assert_array_equal(hand_lib["main"](x=np.zeros(4, F32)), hm.WEIGHTS)


def test_scalar_arguments_accept_numpy_scalars_and_bools(hand_lib: Module) -> None:
    X = np.ones((2, 3), F32)
    Y = np.zeros((2, 3), F32)
    hand_lib["scale_add"](X, Y, np.float32(0.5), np.int16(2))
    np.testing.assert_array_equal(Y, np.full((2, 3), 2.5, F32))
    hand_lib["scale_add"](X, Y, 1.0, np.True_)
    np.testing.assert_array_equal(Y, np.full((2, 3), 2.0, F32))


# ------------------------------------------------------------------ zero-copy
def test_outputs_are_written_in_place_through_views(hand_lib: Module) -> None:
    storage = np.zeros(10, F32)
    view = storage[3:7]  # contiguous, but not at the start of its buffer
    x = np.arange(4, dtype=F32)
    hand_lib["add_one"](x, view)
    np.testing.assert_array_equal(storage, [0, 0, 0, 1, 2, 3, 4, 0, 0, 0])


def test_out_arrays_are_filled_and_returned(hand_lib: Module) -> None:
    x = np.arange(4, dtype=F32)
    out = np.zeros(4, F32)
    assert hand_lib["main"](x, out=out) is out
    np.testing.assert_array_equal(out, hm.reference("main", x))
    a, b = np.zeros(3, np.int64), np.zeros(3, np.float64)
    got = hand_lib["split"](np.arange(3), out=(a, b))
    assert got[0] is a and got[1] is b
    np.testing.assert_array_equal(b, [0, 0.5, 1])


def test_dlpack_tensors_are_read_and_written_without_copies(hand_lib: Module) -> None:
    x = np.arange(4, dtype=F32)
    target = np.zeros(4, F32)
    hand_lib["add_one"](DLPackOnly(x), DLPackOnly(target))
    np.testing.assert_array_equal(target, x + 1)
    out = hand_lib["main"](DLPackOnly(x))
    np.testing.assert_array_equal(out, hm.reference("main", x))


# ------------------------------------------------------------------ bad calls
X23 = np.ones((2, 3), F32)
Y23 = np.zeros((2, 3), F32)
X4 = np.ones(4, F32)
Y4 = np.zeros(4, F32)
RO4 = np.frombuffer(bytes(16), F32)  # a read-only view of immutable bytes
SHARED = np.zeros(6, F32)
READ_ONLY = ("the array is read-only but the function writes into it; pass a writable array "
             "(e.g. a copy)")
BYTE_ORDER = ("numpy dtype '>f4' has non-native byte order; convert it first with "
              "array.astype(array.dtype.newbyteorder('='))")
OVERLAP = "in memory; the function writes it while reading the other, so pass distinct arrays"

# (function, args, kwargs, expected message). The C entries produce most of these.
BAD_CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any], str]] = [
    ("add_one", (X4, np.zeros(4, np.int64)), {},
     "add_one: argument 1 'Y': expected dtype float32, got int64"),
    ("add_one", (X4,), {}, "add_one: missing argument 1 'Y'"),
    ("add_one", (X4, Y4, Y4), {}, "add_one: expected 2 arguments, got 3"),
    ("add_one", (X4, np.zeros(8, F32)[::2]), {},
     "add_one: argument 1 'Y': expected a contiguous tensor"),
    ("add_one", (X4, np.zeros((2, 2), F32)), {},
     "add_one: argument 1 'Y': expected 1 dimension, got 2"),
    ("add_one", (X4, np.zeros(5, F32)), {},
     "add_one: argument 1 'Y': expected shape [4], got [5]"),
    ("add_one", (1.0, Y4), {},
     "add_one: argument 0 'X': expected a tensor (type code 7), got type code 2"),
    ("add_one", (None, Y4), {}, "add_one: argument 0 'X': expected a tensor, got NULL"),
    ("add_one", (X4, np.zeros(4, np.complex64)), {},
     "add_one: argument 1 'Y': expected dtype float32, got complex64"),
    ("add_one", (X4, np.zeros(4, object)), {},
     "add_one: argument 1 'Y': numpy dtype object has no DLPack equivalent"),
    ("add_one", (X4, "Y"), {},
     "add_one: argument 1 'Y': cannot pass str; expected a numpy array, a DLPack tensor "
     "or a number"),
    ("add_one", (FakeCudaTensor(), Y4), {},
     "add_one: argument 0 'X': expected a CPU tensor (device_type 1), got device_type 2"),
    ("add_one", (X4,), {"Z": Y4},
     "add_one: unknown argument 'Z'. Parameters: X, Y"),
    ("add_one", (X4,), {"X": Y4}, "add_one: argument 0 'X' given twice"),
    ("scale_add", (X23, Y23, 1.0, 2.0), {},
     "scale_add: argument 3 'k': expected an integer scalar (type code 0), got type code 2"),
    ("scale_add", (X23, Y23, X23, 2), {},
     "scale_add: argument 2 'alpha': expected a float scalar (type code 2), got type code 7"),
    ("scale_add", (X23, Y23, 1.0, 2**31), {},
     "scale_add: argument 3 'k': value 2147483648 out of range for int32"),
    ("scale_add", (X23, Y23, 1.0, -(2**70)), {},
     "scale_add: argument 3 'k': value -1180591620717411303424 out of range for int32"),
    ("scale_add", (X23, Y23, 1.0), {"kk": 1},
     "scale_add: unknown argument 'kk'. did you mean 'k'? Parameters: X, Y, alpha, k"),
    ("main", (X4,), {"out": np.zeros(4, np.float64)},
     "main: argument 1 'y': expected dtype float32, got float64"),
    ("main", (X4,), {"out": np.zeros(8, F32)[::2]},
     "main: argument 1 'y': expected a contiguous tensor"),
    ("main", (X4,), {"out": (Y4, Y4)}, "main: out= has 2 arrays; the function has 1 result"),
    ("main", (X4, X4), {}, "main: expected 1 argument, got 2"),
    ("split", (np.arange(3),), {"out": (np.zeros(3, np.int64), np.zeros(2))},
     "split: argument 2 'b': expected shape [3], got [2]"),
    ("add_one", (X4, RO4), {}, f"add_one: argument 1 'Y': {READ_ONLY}"),
    ("add_one", (X4, DLPackOnly(RO4)), {}, f"add_one: argument 1 'Y': {READ_ONLY}"),
    ("add_one", (X4.astype(">f4"), Y4), {}, f"add_one: argument 0 'X': {BYTE_ORDER}"),
    ("add_one", (X4, Y4.astype(">f4")), {}, f"add_one: argument 1 'Y': {BYTE_ORDER}"),
    ("main", (X4,), {"out": Y4.astype(">f4")}, f"main: argument 1 'y': {BYTE_ORDER}"),
    ("add_one", (SHARED[:4], SHARED[2:]), {},
     f"add_one: argument 1 'Y': overlaps argument 0 'X' {OVERLAP}"),
    ("main", (SHARED[2:],), {"out": SHARED[:4]},
     f"main: argument 1 'y': overlaps argument 0 'x' {OVERLAP}"),
    ("add_one", (X4,), {"out": Y4},
     "add_one: out= applies to graph-level functions; a tensor-level function writes into "
     "the buffers you pass as arguments"),
]


@pytest.mark.parametrize(("name", "args", "kwargs", "message"), BAD_CALLS,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CALLS)])
def test_bad_calls_raise_kiln_error_naming_the_parameter(
        hand_lib: Module, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
        message: str) -> None:
    with pytest.raises(CallError) as info:
        hand_lib[name](*args, **kwargs)
    assert str(info.value) == message


def test_read_only_out_array_is_refused(hand_lib: Module) -> None:
    out = np.zeros(4, F32)
    out.flags.writeable = False
    with pytest.raises(KilnError, match="main: argument 1 'y': the out= array is read-only"):
        hand_lib["main"](X4, out=out)
    assert not out.any()


def test_failed_checks_leave_outputs_untouched(hand_lib: Module) -> None:
    y = np.full(4, 7, F32)
    with pytest.raises(KilnError):
        hand_lib["add_one"](np.zeros(4, np.float64), y)
    np.testing.assert_array_equal(y, np.full(4, 7, F32))


def test_bad_calls_never_crash_the_process(hand_lib: Module, tmp_path: Path) -> None:
    """Every bad call again, in a fresh interpreter: it must exit normally."""
    script = tmp_path / "bad_calls.py"
    script.write_text(textwrap.dedent(f"""
        import test_runtime_functions as t
        from kiln.errors import CallError, KilnError
        from kiln.runtime import load_module
        lib = load_module({str(hand_lib.path)!r})
        for name, args, kwargs, message in t.BAD_CALLS:
            try:
                lib[name](*args, **kwargs)
            except KilnError as exc:
                assert str(exc) == message, (str(exc), message)
            else:
                raise SystemExit("no error for " + message)
        print("survived", len(t.BAD_CALLS))
    """))
    proc = run_python(script, paths=(Path(__file__).parent,), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"survived {len(BAD_CALLS)}"


# ------------------------------------------------------------------ raw kernels
@pytest.fixture(scope="module")
def raw_kernels(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """The hand-made kernels in a plain .so with visible symbols (as a JIT would give)."""
    folder = tmp_path_factory.mktemp("raw")
    src = folder / "kernels.c"
    weights = ", ".join(f"{v}f" for v in hm.WEIGHTS)
    src.write_text(hm.KERNELS.replace("{p}", "raw_")
                   .replace('__attribute__((visibility("hidden")))', "")
                   .replace("extern const float raw__consts[];",
                            f"const float raw__consts[4] = {{{weights}}};"))
    lib = folder / "libraw.so"
    subprocess.run(["cc", "-std=gnu99", "-shared", "-fPIC", "-O2", "-o", str(lib), str(src)],
                   check=True)
    return ctypes.CDLL(str(lib))


def _raw(lib: ctypes.CDLL, name: str) -> RawKernelFunction:
    sig = hm.signatures("kiln_")[name]
    address = ctypes.cast(lib[f"raw__kernel_{name}"], ctypes.c_void_p).value
    assert address is not None
    return RawKernelFunction(sig, address, keepalive=lib)


def test_raw_kernels_compute_the_same_results(hand_lib: Module, raw_kernels: ctypes.CDLL) -> None:
    x = np.linspace(-1, 1, 4, dtype=F32)
    np.testing.assert_array_equal(_raw(raw_kernels, "main")(x), hand_lib["main"](x))
    xi = np.array([3, 5, -8])
    for got, want in zip(_raw(raw_kernels, "split")(xi), hand_lib["split"](xi)):
        np.testing.assert_array_equal(got, want)
    Y1, Y2 = np.zeros((2, 3), F32), np.zeros((2, 3), F32)
    _raw(raw_kernels, "scale_add")(X23, Y1, -1.5, 4)
    hand_lib["scale_add"](X23, Y2, -1.5, 4)
    np.testing.assert_array_equal(Y1, Y2)


@pytest.mark.parametrize(("name", "args", "kwargs", "message"), BAD_CALLS,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CALLS)])
def test_raw_kernel_checks_match_the_c_entries_word_for_word(
        raw_kernels: ctypes.CDLL, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
        message: str) -> None:
    with pytest.raises(KilnError) as info:
        _raw(raw_kernels, name)(*args, **kwargs)
    assert str(info.value) == message


def test_raw_kernel_failure_reports_last_error(tmp_path: Path) -> None:
    src = tmp_path / "k.c"
    src.write_text('#include <stdint.h>\nint32_t k(float *x) { (void)x; return 3; }\n')
    lib_path = tmp_path / "libk.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib_path), str(src)], check=True)
    lib = ctypes.CDLL(str(lib_path))
    address = ctypes.cast(lib.k, ctypes.c_void_p).value
    assert address is not None
    sig = {"name": "k", "kind": "tensor", "params": [hm._t("x", [2], "float32")], "results": []}
    fn = RawKernelFunction(sig, address, lambda code: f"k: workspace allocation failed ({code})",
                           keepalive=lib)
    with pytest.raises(KilnError, match=r"^k: workspace allocation failed \(3\)$"):
        fn(np.zeros(2, F32))
    silent = RawKernelFunction(sig, address, keepalive=lib)
    with pytest.raises(KilnError, match=r"^k: failed with code 3 \(no error message\)$"):
        silent(np.zeros(2, F32))


@pytest.mark.parametrize(("dtype", "value", "bits"), [
    ("float16", 1.5, 0x3E00), ("bfloat16", 1.0, 0x3F80), ("bfloat16", -2.0, 0xC000),
    ("bfloat16", float("nan"), 0x7FC0),
])
def test_raw_kernel_16_bit_float_scalars_travel_as_bit_patterns(
        tmp_path: Path, dtype: str, value: float, bits: int) -> None:
    src = tmp_path / "k.c"
    src.write_text("#include <stdint.h>\n"
                   "int32_t k(uint16_t *out, uint16_t s) { out[0] = s; return 0; }\n")
    lib_path = tmp_path / "libk.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib_path), str(src)], check=True)
    lib = ctypes.CDLL(str(lib_path))
    address = ctypes.cast(lib.k, ctypes.c_void_p).value
    assert address is not None
    sig = {"name": "k", "kind": "tensor",
           "params": [hm._t("out", [1], "uint16"), hm._s("s", dtype)], "results": []}
    out = np.zeros(1, np.uint16)
    RawKernelFunction(sig, address, keepalive=lib)(out, value)
    assert int(out[0]) == bits


def test_function_repr_shows_the_signature(hand_lib: Module) -> None:
    assert repr(hand_lib["split"]) == (
        "<NativeFunction split(x: int64[3]) -> a: int64[3], b: float64[3]>")



def test_a_result_in_place_of_no_matching_parameter_is_refused() -> None:
    """`"in_place_of"` (docs/abi.md) must name a tensor parameter of the result's dtype and
    rank: a library that says otherwise is refused as it is read, not trusted at a call."""
    params = [{"name": "x", "kind": "tensor", "shape": [2, 3], "dtype": "float32"},
              {"name": "n", "kind": "scalar", "dtype": "int64"}]

    def signature(mark: Any, dtype: str = "float32") -> dict[str, Any]:
        return {"name": "f", "kind": "graph", "params": params, "results": [
            {"name": "y", "kind": "tensor", "shape": [2, 3], "dtype": dtype,
             "in_place_of": mark}]}

    for mark, dtype in ((2, "float32"), (-1, "float32"), (1, "float32"), ("0", "float32"),
                        (0, "float64")):
        with pytest.raises(FormatError, match="'y' is marked in place of parameter"):
            PackedFunction(signature(mark, dtype))
    assert PackedFunction(signature(0)).results[0]["in_place_of"] == 0
