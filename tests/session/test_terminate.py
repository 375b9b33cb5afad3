"""Stopping a running call: `RunOptions.terminate` set from another thread (as in
onnxruntime), the terminate flag of the C ABI set by a second pthread, and libraries
older than the flag, which load and run to their end (docs/session.md, docs/abi.md
"Stopping a call").

Every endless call runs in a child process with a timeout, so a regression fails the
test instead of hanging the suite."""

from __future__ import annotations

import platform
import re
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto

import kiln
from golden.make_library_golden import loop_model
from kiln.ir import tensor as t
from kiln.ir.visitor import iter_nodes
from support.c_programs import build_c_program
from support.graphs import GraphBuilder, value_info
from support.numerics import assert_close
from support.processes import run_python
from support.reference import onnxruntime_outputs
from support.small_models import resnet18

HERE = Path(__file__).resolve().parent
GOLDEN = HERE.parent / "golden" / "library_v4_2026-11-27.so"
N = 64  # the state is N x N: its MatMul runs on the thread pool
ENDLESS = 1 << 62
TERMINATED = "main: terminated: the caller set the call's terminate flag"

# The child: an endless run stopped by RunOptions.terminate from a timer thread, then the
# same session, the flag reset, on finite inputs (saved for the parent to compare).
CHILD = """
import sys
import threading
import numpy as np
import kiln

sess = kiln.InferenceSession(sys.argv[1])
endless, finite = np.load(sys.argv[2]), np.load(sys.argv[3])
ro = kiln.RunOptions()
threading.Timer(0.3, setattr, (ro, "terminate", True)).start()
try:
    sess.run(None, dict(endless), ro)
    print("ran to the end")
except kiln.CallError as exc:
    print("stopped:", exc)
ro.terminate = False
out, = sess.run(None, dict(finite), ro)
np.save(sys.argv[4], out)
"""


def endless_model(kind: str) -> onnx.ModelProto:
    """A Loop "endless" whose body computes x <- tanh(x @ W + 1) on an N x N state: kind
    "trip" counts to the input M (the condition stays true); kind "cond" has no trip
    count and runs while its iteration differs from the input `stop`."""
    body = GraphBuilder(1)
    product = body.op("MatMul", "x_in", body.weight(N, N, fan_in=N))
    body.node("Tanh", [body.op("Add", product, body.const(np.ones(N, np.float32)))], ["x_out"])
    if kind == "cond":
        body.node("Not", [body.op("Equal", "i", "stop")], ["cond_out"])
    else:
        body.node("Identity", ["cond_in"], ["cond_out"])
    graph = body.graph("body", [value_info("i", [], TensorProto.INT64),
                                value_info("cond_in", [], TensorProto.BOOL),
                                value_info("x_in", [N, N])],
                       [value_info("cond_out", [], TensorProto.BOOL), value_info("x_out", [N, N])])
    b = GraphBuilder()
    b.input("x", [N, N])
    count = b.input("stop" if kind == "cond" else "M", [], TensorProto.INT64)
    b.const(np.array(True), name="go")
    b.node("Loop", ["" if kind == "cond" else count, "go", "x"], ["y"], body=graph,
           name="endless")
    b.output("y", [N, N])
    return b.model()


def _feeds(kind: str, count: int) -> dict[str, np.ndarray]:
    x = np.random.default_rng(5).standard_normal((N, N)).astype(np.float32)
    return {"x": x, ("stop" if kind == "cond" else "M"): np.array(count, np.int64)}


@pytest.mark.parametrize("kind", ["cond", "trip"])
def test_run_options_terminate_stops_an_endless_loop(kind: str, tmp_path: Path) -> None:
    """A Loop whose condition never turns false (or of 2^62 iterations) stops when another
    thread sets RunOptions.terminate; the session, the flag reset, then computes what
    onnxruntime does, on two threads (the pool the stopped call used)."""
    model = endless_model(kind)
    path = tmp_path / "endless.onnx"
    onnx.save(model, path)
    finite = _feeds(kind, 6)
    np.savez(tmp_path / "endless.npz", **_feeds(kind, -1 if kind == "cond" else ENDLESS))
    np.savez(tmp_path / "finite.npz", **finite)
    try:
        done = run_python(CHILD, str(path), str(tmp_path / "endless.npz"),
                          str(tmp_path / "finite.npz"), str(tmp_path / "out.npy"),
                          env={"KILN_NUM_THREADS": "2"}, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail("the endless run was not stopped by RunOptions.terminate")
    assert done.returncode == 0, done.stderr
    assert f"stopped: {TERMINATED}" in done.stdout, done.stdout
    assert_close([np.load(tmp_path / "out.npy")], onnxruntime_outputs(model, finite), 1e-5)


def test_terminate_through_the_c_abi(tmp_path: Path) -> None:
    """A C program calls the packed entry with the flag as one more argument and sets it
    from a second pthread: the call returns the terminated status with its message; the
    flag cleared (or left out) the next calls compute the Loop; a flag of the wrong type
    code is refused naming the argument."""
    lib = kiln.compile(loop_model(), "llvm").export_library(tmp_path / "loop.so")
    program = build_c_program(HERE / "terminate_call.c", tmp_path / "terminate_call",
                              libs=("-pthread",))
    try:
        done = subprocess.run([str(program), str(lib)], capture_output=True, text=True,
                              timeout=240, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("the C call was not stopped by its terminate flag")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"stopped rc=21 error={TERMINATED}", lines
    assert lines[1] == "after rc=0 y=3 4 5 6", lines
    assert lines[2] == "plain rc=0 y=3 4 5 6", lines
    assert lines[3] == ("wrong rc=-1 error=main: argument 3 'terminate': expected a terminate "
                        "flag (type code 3), got type code 0"), lines


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the golden library is x86-64 code")
def test_library_before_the_flag_refuses_a_terminated_run() -> None:
    """A library of metadata version 4 (no terminate flag) loads and runs; it cannot be
    stopped while running, so a session refuses a run started with RunOptions.terminate
    set (as onnxruntime does, with kiln's message) and computes the Loop once reset."""
    sess = kiln.InferenceSession(str(GOLDEN))
    ro = kiln.RunOptions()
    ro.terminate = True
    feeds = {"M": np.array(5, np.int64), "x": np.arange(4, dtype=np.float32)}
    with pytest.raises(kiln.CallError, match=re.escape(TERMINATED) + r" \(before the run"):
        sess.run(None, feeds, ro)
    ro.terminate = False
    got = sess.run(None, feeds, ro)
    assert_close(got, onnxruntime_outputs(loop_model(), feeds), 1e-6)
    lib = kiln.runtime.load_module(GOLDEN)
    assert lib.metadata["version"] == 4 and not lib["main"].terminable


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_flag_set_before_the_run(target: str) -> None:
    """A run given a set flag stops before its first kernel (llvm and c); with the flag
    cleared the same call computes the Loop; any other run_options is refused."""
    ex = kiln.compile(loop_model(), target)
    assert ex.metadata["functions"]["main"]["terminate"] is True
    sess = kiln.InferenceSession(ex)
    feeds = {"M": np.array(3, np.int64), "x": np.arange(4, dtype=np.float32)}
    ro = kiln.RunOptions()
    ro.terminate = True
    with pytest.raises(kiln.CallError, match=re.escape(TERMINATED)):
        sess.run(None, feeds, ro)
    ro.terminate = False
    assert_close(sess.run(None, feeds, ro), onnxruntime_outputs(loop_model(), feeds), 1e-6)
    with pytest.raises(kiln.ArgumentTypeError, match=r"run_options must be a kiln\.RunOptions"):
        sess.run(None, feeds, {"terminate": True})


def _flag_loads(ex: kiln.Executable) -> dict[str, int]:
    """The loads of the terminate flag in the generated code, per function: C's volatile
    reads in kernels.c (c), LLVM's atomic loads in kernels.bc (llvm)."""
    if ex.target.kind.name == "c":
        kernels = next(a for a in ex.artifacts if a.file_name.endswith("kernels.c"))
        return {"kernels.c": bytes(kernels.content).decode().count("volatile")}
    from kiln.codegen.llvm.target_machine import llvm_binding

    bitcode = next(a for a in ex.artifacts if a.file_name == "kernels.bc")
    module = llvm_binding().parse_bitcode(bytes(bitcode.content))
    loads = {f.name: str(f).count("load atomic") for f in module.functions}
    return {name: n for name, n in loads.items() if n}


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_one_check_per_kernel_call(target: str) -> None:
    """In a ResNet-like model the generated code loads the flag once per kernel call of
    the lowered main (a load and a branch before the call), and no kernel reads it: the
    hot loops are those of a build without it."""
    ex = kiln.compile(resnet18(), target)
    kernel_calls = [n for n in iter_nodes(ex.ir["main"].body) if isinstance(n, t.CallFunc)]
    assert len(kernel_calls) > 10
    loads = _flag_loads(ex)
    assert list(loads.values()) == [len(kernel_calls)], loads
    assert target == "c" or list(loads) == ["kiln__kernel_main"], loads
