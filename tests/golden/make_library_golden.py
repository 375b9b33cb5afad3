"""Write a kiln library of metadata version 4 (before the terminate flag) for the golden
tests: an ONNX Loop that adds 1 to a float32[4] state M times, compiled for a baseline
x86-64 (`llvm -mcpu=x86-64`), exported as a .so.

Run once, with the kiln of that version, and check the output in; never regenerate it:

    .venv/bin/python tests/golden/make_library_golden.py 2026-11-27
"""

from __future__ import annotations

import os
import sys

import numpy as np
from onnx import TensorProto

import kiln
from support.graphs import GraphBuilder, value_info

HERE = os.path.dirname(os.path.abspath(__file__))


def loop_model() -> object:
    """x -> x + M (one Add per iteration), M a 0-d int64 input."""
    body = GraphBuilder()
    body.const(np.ones(4, np.float32), name="one")
    body.node("Add", ["x_in", "one"], ["x_out"], name="step")
    body.node("Identity", ["cond_in"], ["cond_out"], name="keep")
    body_graph = body.graph("body", [value_info("i", [], TensorProto.INT64),
                                     value_info("cond_in", [], TensorProto.BOOL),
                                     value_info("x_in", [4])],
                            [value_info("cond_out", [], TensorProto.BOOL),
                             value_info("x_out", [4])])
    b = GraphBuilder()
    b.input("M", [], TensorProto.INT64)
    b.input("x", [4])
    b.const(np.array(True), name="cond")
    b.node("Loop", ["M", "cond", "x"], ["y"], body=body_graph, name="counter")
    b.output("y", [4])
    return b.model()


def main(date: str) -> None:
    version = 4
    path = os.path.join(HERE, f"library_v{version}_{date}.so")
    if os.path.exists(path):
        sys.exit(f"{path} exists; golden files are never regenerated")
    ex = kiln.compile(loop_model(), {"kind": "llvm", "mcpu": "x86-64"})
    assert ex.metadata["version"] == version, ex.metadata["version"]
    ex.export_library(path)
    print(path)


if __name__ == "__main__":
    main(sys.argv[1])
