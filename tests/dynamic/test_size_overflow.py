"""Symbolic sizes that overflow int64 are refused, never wrapped (issue 22).

The workspace of `two_chains` is `a*b*4 + c*d*4` bytes: at a = b = c = d = 2**30 each
product fits int64 and the sum does not. The `c` backend used to wrap it to a
negative count, malloc one byte and crash in the first kernel (SIGSEGV); now both
backends return kernel error 10 ("size overflows int64") before allocating. The
calls go through the packed C entry with DLTensors built by ctypes (numpy cannot make
arrays that large, not even as stride-0 views), a test's calls in one subprocess so a
crash is seen as a signal, not as the death of the test run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto

import kiln
from kiln.errors import CallError
from kiln.frontend import from_onnx
from kiln.ir.attrs import ATTR_WORKSPACE_BYTES
from kiln.ir.kernel_errors import ERROR_SIZE_OVERFLOW, KERNEL_ERRORS
from kiln.runtime.dim_binding import compile_dim_text
from support.graphs import GraphBuilder

F = TensorProto.FLOAT
HUGE = 1 << 30

# Makes each call of a JSON list [symbol, shapes, n_out] on a library: `symbol` (or the
# output-shapes entry) with float32 DLTensors of the given shapes over one small buffer;
# prints a line per call (the status, the last error and, for output shapes, the
# dimensions written) as it returns, so a crash shows which call died.
CALLER = """
import ctypes, json, sys
from kiln.runtime.abi import ARG_DLTENSOR, KDL_CPU, KDL_FLOAT
from kiln.runtime.ctypes_abi import DLTensor, KilnValue

path, last_error, calls = sys.argv[1:4]
lib = ctypes.CDLL(path)
error = getattr(lib, last_error)
error.restype = ctypes.c_char_p
backing = (ctypes.c_float * 1024)()
for symbol, shapes, n_out in json.loads(calls):
    keep = []
    values = []
    for shape in shapes:
        t = DLTensor()
        t.data = ctypes.cast(backing, ctypes.c_void_p)
        t.device.device_type = KDL_CPU
        t.ndim = len(shape)
        t.dtype.code, t.dtype.bits, t.dtype.lanes = KDL_FLOAT, 32, 1
        dims = (ctypes.c_int64 * len(shape))(*shape)
        t.shape = dims
        keep += [t, dims]
        values.append(KilnValue(v_handle=ctypes.addressof(t)))
    args = (KilnValue * len(values))(*values)
    codes = (ctypes.c_int32 * len(values))(*[ARG_DLTENSOR] * len(values))
    entry = getattr(lib, symbol)
    entry.restype = ctypes.c_int32
    out = (ctypes.c_int64 * max(n_out, 1))()
    rc = entry(args, codes, len(values), out) if n_out else entry(args, codes, len(values))
    print(json.dumps({"rc": rc, "error": error().decode(), "shapes": list(out)[:n_out]}),
          flush=True)
"""


def two_chains() -> onnx.ModelProto:
    """y = relu(-relu(x)), w = relu(-relu(z)), the last ReLUs after both chains: one
    intermediate per chain, workspace `a*b*4 + c*d*4` (two size classes end to end)."""
    b = GraphBuilder()
    b.node("Relu", ["x"], ["x1"])
    b.node("Neg", ["x1"], ["x2"])
    b.node("Relu", ["z"], ["z1"])
    b.node("Neg", ["z1"], ["z2"])
    b.node("Relu", ["x2"], ["y"])
    b.node("Relu", ["z2"], ["w"])
    b.input("x", ["a", "b"])
    b.input("z", ["c", "d"])
    b.output("y", ["a", "b"])
    b.output("w", ["c", "d"])
    return b.model(ir_version=None)


def flatten() -> onnx.ModelProto:
    """y = reshape(x, [-1]): the result's dimension is the expression `a*2`."""
    b = GraphBuilder()
    b.const(np.array([-1], np.int64), name="shape")
    b.node("Reshape", ["x", "shape"], ["y"])
    b.input("x", ["a", 2])
    b.output("y", ["n"])
    return b.model(ir_version=None)


Call = tuple[str, list[tuple[int, ...]], int]  # (symbol, argument shapes, n_out)


def _calls(lib: Path, calls: list[Call]) -> list[dict[str, object]]:
    """The result of each call, made in order by one new process (CALLER)."""
    proc = subprocess.run([sys.executable, "-c", CALLER, str(lib), "kiln__last_error",
                           json.dumps(calls)], capture_output=True, text=True, timeout=120)
    done = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0, (f"call {len(done)} {calls[len(done):][:1]} died (status "
                                  f"{proc.returncode}): {proc.stderr}")
    assert len(done) == len(calls) and all(isinstance(r, dict) for r in done), proc.stdout
    return done


@pytest.fixture(scope="module", params=["llvm", "c"])
def libraries(request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp(f"overflow_{request.param}")
    out = {}
    for name, model in (("chains", two_chains()), ("flatten", flatten())):
        exe = kiln.compile(from_onnx(model), request.param)
        if name == "chains":  # the case of the test: a sum of products of dimensions
            assert exe.ir["main"].attrs[ATTR_WORKSPACE_BYTES] == "a*b*4 + c*d*4"
        exe.export_library(tmp / f"{name}.so")
        out[name] = tmp / f"{name}.so"
    return out


def test_a_workspace_whose_size_overflows_int64_is_refused(libraries) -> None:
    big = [(HUGE, HUGE), (HUGE, HUGE)] * 2  # x, z, y, w: 2**62 + 2**62 bytes of workspace
    # one product alone past int64, and 2**62 rows of 2 (2**65 bytes)
    alone = [[(a, b), (1, 1), (a, b), (1, 1)] for a, b in ((3037000500, 3037000500),
                                                           (1 << 62, 2))]
    result, *others = _calls(libraries["chains"], [("kiln_main", shapes, 0)
                                                   for shapes in (big, *alone)])
    assert result["rc"] == ERROR_SIZE_OVERFLOW
    assert result["error"] == f"main: {KERNEL_ERRORS[ERROR_SIZE_OVERFLOW]}"
    assert "size overflows int64" in str(result["error"])
    for result in others:
        assert result["rc"] == ERROR_SIZE_OVERFLOW, result


def test_small_sizes_still_run(libraries) -> None:
    (result,) = _calls(libraries["chains"], [("kiln_main", [(2, 3), (4, 5), (2, 3), (4, 5)],
                                              0)])
    assert result == {"rc": 0, "error": "", "shapes": []}


def test_an_output_dimension_that_overflows_is_named_as_python_names_it(libraries) -> None:
    shapes, entry = "kiln__output_shapes_main", "kiln_main"
    small, big, entry_big, entry_wrong = _calls(libraries["flatten"], [
        (shapes, [(5, 2)], 1), (shapes, [(1 << 62, 2)], 1),
        (entry, [(1 << 62, 2), (4,)], 0), (entry, [(3, 2), (7,)], 0)])
    assert small["rc"] == 0 and small["shapes"] == [10]
    with pytest.raises(CallError) as err:
        compile_dim_text("a*2")({"a": 1 << 62})
    assert big["rc"] == -1
    assert big["error"] == f"main: {err.value}" == "main: dimension 'a*2' overflows int64"
    # the entry checks a result's expression dimension the same way (check 7)
    assert (entry_big["rc"], entry_big["error"]) == (-1, "main: dimension 'a*2' overflows int64")
    assert entry_wrong["error"] == "main: argument 1 'y': expected shape [a*2], got [7]"
