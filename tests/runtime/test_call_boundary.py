"""What leaves a compiled function, and `kiln run`, when the call is wrong: a CallError
(or the CLI's one-line error) naming the argument, never numpy's ValueError or
MemoryError, an AttributeError, or a signal.

The library is `cube`: `y[n, n, n] = x[i] + x[j] + x[k]` for a symbolic `n`, so a
small input asks for a huge result. Sizes are chosen past what any 64-bit host
can map (2**48 bytes and up), so the allocation fails whatever the overcommit
policy. Every case runs in a fresh process: a crash there is a failed test, not
a dead test run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import kiln
from kiln.frontend.onnx import from_onnx
from support.graphs import GraphBuilder


def _cube() -> onnx.ModelProto:
    b = GraphBuilder()
    b.node("Unsqueeze", ["x", "a12"], ["a"])
    b.node("Unsqueeze", ["x", "a02"], ["b"])
    b.node("Unsqueeze", ["x", "a01"], ["c"])
    b.node("Add", ["a", "b"], ["ab"])
    b.node("Add", ["ab", "c"], ["y"])
    b.input("x", ["n"])
    b.output("y", ["n", "n", "n"])
    b.consts({"a12": np.array([1, 2], np.int64), "a02": np.array([0, 2], np.int64),
              "a01": np.array([0, 1], np.int64)})
    return b.model(name="cube", ir_version=None)


def _relu() -> onnx.ModelProto:
    b = GraphBuilder()
    b.node("Relu", ["x"], ["y"])
    b.input("x", [2, 3])
    b.output("y", [2, 3])
    return b.model(name="relu", ir_version=None)


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cube.so (symbolic) and relu.so (static shapes), exported once."""
    tmp = tmp_path_factory.mktemp("boundary")
    for name, model in (("cube", _cube()), ("relu", _relu())):
        kiln.compile(from_onnx(model), "llvm").export_library(tmp / f"{name}.so")
    return tmp


# Runs one case in a fresh interpreter and prints `ErrorClass: message` (or `ok`).
RUNNER = """
import sys
import numpy as np
from kiln.runtime import load_module
cube = load_module(sys.argv[1] + "/cube.so")["main"]
relu = load_module(sys.argv[1] + "/relu.so")["main"]
f32 = np.float32
x3 = np.zeros(3, f32)
cases = {
    "huge result": lambda: cube(np.zeros(2**16, f32)),
    "huge result, keyword": lambda: cube(x=np.zeros(2**16, f32)),
    "result past any array": lambda: cube(np.zeros(2**22, f32)),
    "huge strided copy": lambda: cube(np.broadcast_to(np.zeros(1, f32), (2**46,))),
    "list, symbolic": lambda: cube([1.0, 2.0]),
    "str, symbolic": lambda: cube("abc"),
    "None, symbolic": lambda: cube(None),
    "output_shapes of a list": lambda: cube.output_shapes([1.0]),
    "output_shapes of a str, static": lambda: relu.output_shapes("x"),
    "out= a list": lambda: cube(x3, out=[[0.0]]),
    "out= None": lambda: cube(x3, out=(None,)),
    "list, static": lambda: relu([[1.0] * 3] * 2),
    "None, static": lambda: relu(None),
    "str out=, static": lambda: relu(np.zeros((2, 3), f32), out="y"),
}
try:
    cases[sys.argv[2]]()
    print("ok")
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}")
"""

TOO_BIG = r"\((not enough memory|too large for an array)\)"
CASES = {
    "huge result": "CallError: main: argument 1 'y': cannot allocate the result: shape "
                   rf"\[65536, 65536, 65536\] of float32 is 1125899906842624 bytes {TOO_BIG}",
    "huge result, keyword": "CallError: main: argument 1 'y': cannot allocate the result: "
                            rf"shape \[65536, 65536, 65536\] of float32 .* {TOO_BIG}",
    "result past any array": "CallError: main: argument 1 'y': cannot allocate the result: "
                             r"shape \[4194304, 4194304, 4194304\] of float32 is "
                             rf"295147905179352825856 bytes {TOO_BIG}",
    "huge strided copy": "CallError: main: argument 0 'x': cannot copy the strided array into "
                         rf"a contiguous one of 281474976710656 bytes {TOO_BIG}",
    "list, symbolic": "CallError: main: argument 0 'x': cannot pass list; expected a numpy "
                      "array, a DLPack tensor or a number",
    "str, symbolic": "CallError: main: argument 0 'x': cannot pass str;",
    "None, symbolic": "CallError: main: argument 0 'x': expected a tensor, got NULL",
    "output_shapes of a list": "CallError: main: argument 0 'x': cannot pass list;",
    "output_shapes of a str, static": "CallError: main: argument 0 'x': cannot pass str;",
    "out= a list": r"CallError: main: argument 1 'y': out= needs arrays, got list",
    "out= None": r"CallError: main: argument 1 'y': out= needs arrays, got NoneType",
    "list, static": "CallError: main: argument 0 'x': cannot pass list;",
    "None, static": "CallError: main: argument 0 'x': expected a tensor, got NULL",
    "str out=, static": "CallError: main: argument 1 'y': out= needs arrays, got str",
}


def _no_signal(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}: {proc.stderr}"


@pytest.mark.parametrize("case", list(CASES))
def test_a_wrong_call_is_a_call_error_naming_the_argument(libs: Path, case: str) -> None:
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(libs), case],
                          capture_output=True, text=True, timeout=300)
    _no_signal(proc)
    assert proc.returncode == 0, proc.stderr
    assert re.match(CASES[case], proc.stdout.strip()), proc.stdout


def _kiln_run(libs: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kiln", "run", str(libs / "cube.so"), *args],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("args", "expected"), [
    (["--fill", "random", "--size", f"n={2**46}"],
     rf"--fill: input 'x' of shape \[{2**46}\] \(float32\) is {2**48} bytes, "
     r"(not enough memory|too large for an array); choose smaller --size values"),
    (["--fill", "zeros", "--size", f"n={2**63 - 1}"],
     r"--fill: input 'x' of shape \[9223372036854775807\] \(float32\) is "
     r"36893488147419103228 bytes, too large for an array"),
    (["--fill", "random", "--size", f"n={2**63}"],
     r"--size expects NAME=N with 0 <= N <= 9223372036854775807 .*, got 'n=9223372036854775808'"),
    (["--fill", "random", "--size", "n=-3"], r"--size expects NAME=N .*, got 'n=-3'"),
    (["--fill", "random", "--size", "n=65536"],
     r"main: argument 1 'y': cannot allocate the result: shape \[65536, 65536, 65536\]"),
])
def test_kiln_run_with_sizes_it_cannot_hold_is_one_line(libs: Path, args: list[str],
                                                        expected: str) -> None:
    proc = _kiln_run(libs, *args)
    _no_signal(proc)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert re.match(r"kiln run: error: " + expected, lines[0]), lines[0]


def test_kiln_run_with_an_npy_header_it_cannot_hold_is_one_line(libs: Path,
                                                                 tmp_path: Path) -> None:
    """A 16-byte .npy whose header declares 2**46 floats: numpy's MemoryError is named."""
    path = tmp_path / "big.npy"
    with path.open("wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f4", "fortran_order": False, "shape": (2**46,)})
        f.write(bytes(16))
    proc = _kiln_run(libs, "--input", f"x={path}")
    _no_signal(proc)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        f"kiln run: error: --input x={path}: cannot read it as a numpy file: not enough "
        "memory for the array its header declares"), proc.stderr
