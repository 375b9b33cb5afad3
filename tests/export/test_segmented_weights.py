"""A compiled model's weights stay pieces (Segments) from the compiler to the library.

Block-matmuls packs a dense layer's weight into a new array, so the weights are
not one arena; the constants artifact is then Segments of the arrays (no joined
copy), and every export writes it piece by piece: a fresh process loads the
.so and the .tar and computes what numpy does, and the archived blob is the
pool's bytes exactly.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.artifact import archive
from kiln.artifact.segments import Segments
from kiln.codegen.constants import CONSTANTS_FILE
from kiln.ir import IRBuilder, IRModule
from kiln.ir import graph as g

RNG = np.random.default_rng(3)
W1 = RNG.standard_normal((40, 24)).astype(np.float32)
BIAS = RNG.standard_normal(24).astype(np.float32)
W2 = RNG.standard_normal((24, 10)).astype(np.float32)
X = RNG.standard_normal((2, 40)).astype(np.float32)


def dense_module() -> IRModule:
    """main(x) = relu(x @ W1 + bias) @ W2."""
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", X.shape, "float32")
        h = ib.emit(kiln.ops.call("matmul", x, g.Constant(W1, "w1")), "h")
        h = ib.emit(kiln.ops.call("add", h, g.Constant(BIAS, "b")), "hb")
        h = ib.emit(kiln.ops.call("relu", h), "hr")
        ib.ret(ib.emit(kiln.ops.call("matmul", h, g.Constant(W2, "w2")), "y"))
    return ib.get()


def reference() -> np.ndarray:
    return np.maximum(X @ W1 + BIAS, 0) @ W2


RUN = """
import sys
import numpy as np
from kiln.runtime import load_module
x = np.frombuffer(bytes.fromhex(sys.argv[2]), np.float32).reshape({shape})
with load_module(sys.argv[1]) as lib:
    print(lib["main"](x).tobytes().hex())
"""


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_segmented_weights_export_and_load_in_a_fresh_process(
        tmp_path: Path, target: str) -> None:
    ex = kiln.compile(dense_module(), target)
    (consts,) = [a for a in ex.artifacts if a.file_name == CONSTANTS_FILE]
    assert isinstance(consts.content, Segments)
    in_process = ex["main"](X)
    np.testing.assert_allclose(in_process, reference(), rtol=1e-5, atol=1e-5)
    for suffix in (".so", ".tar"):
        path = ex.export_library(tmp_path / f"model{suffix}")
        proc = subprocess.run([sys.executable, "-c", RUN.format(shape=X.shape), str(path),
                               X.tobytes().hex()], capture_output=True, text=True,
                              timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        assert bytes.fromhex(proc.stdout.strip()) == in_process.tobytes(), suffix
    back, _ = archive.read_tar(tmp_path / "model.tar")
    stored = back.get(consts.codegen_id, CONSTANTS_FILE)
    assert stored is not None and stored.content == bytes(consts.content)
