"""Checks shared by the hand-written kernel tests (convolution, GEMM): one ONNX model of
independent cases compared with onnxruntime (fresh processes: fresh_process.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from kiln.target import Target

# The `native` fixtures' targets: this host, this host with its 512-bit vector units
# switched off (the AVX2 tiles, run on an AVX-512 machine), and the C backend.
NATIVE_TARGETS = ["llvm", "llvm-avx2", "c"]
# LLVM features that need AVX-512 state; "-" on all of them leaves AVX2 (docs/targets.md).
_WIDE = ("avx512", "amx", "avx10", "evex512")


def assert_close(got: Sequence[np.ndarray], want: Sequence[np.ndarray],
                 cases: Sequence[Any], tol: float) -> None:
    """Every output within relative L2 error `tol` of the reference (naming the case)."""
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape, (k, cases[k])
        err = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)
        assert err < tol, (k, cases[k], err)


def native_target(kind: str) -> Target:
    """The target of a `native` fixture param (NATIVE_TARGETS); skips "llvm-avx2" where
    it would add nothing (no AVX-512 here: "llvm" is the AVX2 path) or cannot run."""
    if kind == "c":
        return Target("c")
    host = Target.from_host()
    if kind == "llvm":
        return host
    config = host.export()
    mattr = [str(f) for f in config.get("mattr", ())]
    if "+avx512f" not in mattr:
        pytest.skip("this host has no AVX-512: the 'llvm' target already runs the AVX2 path")
    if "+avx2" not in mattr or "+fma" not in mattr:
        pytest.skip("this host has no AVX2+FMA")
    config["mattr"] = ["-" + f[1:] if f[1:].startswith(_WIDE) else f for f in mattr]
    return Target(config)


def random_feeds(model: onnx.ModelProto, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A float32 standard-normal array for every (static-shape) graph input."""
    return {v.name: rng.standard_normal([d.dim_value for d in v.type.tensor_type.shape.dim])
            .astype(np.float32) for v in model.graph.input}


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]
                        ) -> list[np.ndarray]:
    """The model's outputs on `feeds` from onnxruntime's CPU provider (the reference)."""
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(sess.run(None, feeds))


def branches_model(name: str, nodes: list[Any], inputs: list[Any], outputs: list[Any],
                   inits: list[Any]) -> onnx.ModelProto:
    """An opset-17 model of independent branches (one per kernel case)."""
    from onnx import helper

    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model
