"""The most iterations a Loop may run: `kiln.compile(..., max_loop_iterations=N)` and
`SessionOptions.max_loop_iterations` (docs/compile.md, docs/session.md). A run whose
Loop would go past the limit fails with a CallError naming the Loop node; runs within
it compute what onnxruntime does; without the option there is no limit."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto

import kiln
from kiln.cli.main import main
from kiln.errors import UsageError
from kiln.runtime import load_module
from support.graphs import GraphBuilder, value_info
from support.numerics import assert_close
from support.reference import onnxruntime_outputs

I64, B = TensorProto.INT64, TensorProto.BOOL
LIMIT = 4


def nested_loops() -> onnx.ModelProto:
    """Loop "outer" (M iterations) whose body runs Loop "inner" (K iterations, K read
    from the outer graph), each adding to a float32[3] state."""
    inner = GraphBuilder(1)
    inner.node("Add", ["q", inner.const(np.full(3, 0.5, np.float32))], ["q_out"])
    inner.node("Identity", ["c2"], ["c2_out"])
    inner_g = inner.graph("inner", [value_info("j", [], I64), value_info("c2", [], B),
                                    value_info("q", [3])],
                          [value_info("c2_out", [], B), value_info("q_out", [3])])
    outer = GraphBuilder(2)
    outer.node("Loop", ["K", "", "s"], ["s_inner"], body=inner_g, name="inner")
    outer.node("Add", ["s_inner", outer.const(np.ones(3, np.float32))], ["s_out"])
    outer.node("Identity", ["cond_in"], ["cond_out"])
    outer_g = outer.graph("outer", [value_info("i", [], I64), value_info("cond_in", [], B),
                                    value_info("s", [3])],
                          [value_info("cond_out", [], B), value_info("s_out", [3])])
    b = GraphBuilder()
    b.input("M", [], I64)
    b.input("K", [], I64)
    b.input("x", [3])
    b.node("Loop", ["M", "", "x"], ["y"], body=outer_g, name="outer")
    b.output("y", [3])
    return b.model()


def _feeds(m: int, k: int) -> dict[str, np.ndarray]:
    return {"M": np.array(m, np.int64), "K": np.array(k, np.int64),
            "x": np.array([1, 2, 3], np.float32)}


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_loop_limit(target: str) -> None:
    """At the limit both Loops run as onnxruntime's; one iteration past it, in either
    Loop, is a CallError naming that Loop's node."""
    model = nested_loops()
    f = kiln.compile(model, target, max_loop_iterations=LIMIT).jit()["main"]
    feeds = _feeds(LIMIT, LIMIT)
    assert_close([f(*feeds.values())], onnxruntime_outputs(model, feeds), 1e-6)
    for (m, k), node in (((LIMIT + 1, 1), "outer"), ((1, LIMIT + 1), "inner")):
        message = (f"main: Loop '{node}' (body '{node}_body') ran more than {LIMIT} "
                   f"iterations (the limit max_loop_iterations={LIMIT})")
        with pytest.raises(kiln.CallError, match=re.escape(message)):
            f(*_feeds(m, k).values())


def test_cli_flag(tmp_path: Path) -> None:
    """`kiln compile --max-loop-iterations N` builds the limit into the library."""
    path = tmp_path / "loops.onnx"
    onnx.save(nested_loops(), path)
    lib = tmp_path / "loops.so"
    assert main(["compile", str(path), "-o", str(lib), "--max-loop-iterations",
                 str(LIMIT)]) == 0
    f = load_module(lib)["main"]
    np.testing.assert_array_equal(f(*_feeds(LIMIT, 1).values()),
                                  kiln.compile(nested_loops(), "host").jit()["main"](
                                      *_feeds(LIMIT, 1).values()))
    with pytest.raises(kiln.CallError, match=re.escape(
            f"Loop 'outer' (body 'outer_body') ran more than {LIMIT} iterations")):
        f(*_feeds(LIMIT + 1, 1).values())


def test_no_limit_by_default() -> None:
    """Without the option a Loop runs as long as it is told (as in onnxruntime)."""
    model = nested_loops()
    f = kiln.compile(model, "llvm").jit()["main"]
    feeds = _feeds(20000, 2)
    assert_close([f(*feeds.values())], onnxruntime_outputs(model, feeds), 1e-6)


def test_session_option() -> None:
    """SessionOptions.max_loop_iterations limits the Loops of a model the session
    compiles; for a compiled library, where it cannot apply, and for a value that is no
    positive integer, it is a UsageError."""
    model = nested_loops()
    options = kiln.SessionOptions()
    options.max_loop_iterations = LIMIT
    sess = kiln.InferenceSession(model.SerializeToString(), options)
    feeds = _feeds(LIMIT, 2)
    assert_close(sess.run(None, feeds), onnxruntime_outputs(model, feeds), 1e-6)
    with pytest.raises(kiln.CallError, match=r"Loop 'outer' .* ran more than 4 iterations"):
        sess.run(None, _feeds(LIMIT + 1, 2))
    with pytest.raises(UsageError, match="max_loop_iterations applies when the session "
                                         "compiles the model"):
        kiln.InferenceSession(kiln.compile(model, "llvm"), options)
    with pytest.raises(UsageError, match="max_loop_iterations must be a positive integer"):
        kiln.compile(model, "llvm", max_loop_iterations=0)
