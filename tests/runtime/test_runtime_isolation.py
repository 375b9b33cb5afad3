"""A deploy host: kiln.runtime loads every artifact kind with the compiler blocked.

The libraries are built here (compiler side); a fresh process then blocks
llvmlite, onnx, onnxruntime and every compiler package of kiln with a meta path
finder, loads each library with `kiln.runtime.load_module` and runs it. Its
outputs must match onnxruntime's, and afterwards no compiler module may have
been imported: the runtime reaches the compiler neither eagerly nor lazily
(tests/test_layering.py checks the same from the source).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import kiln
from support.reference import onnxruntime_outputs

ort = pytest.importorskip("onnxruntime")

MODEL = Path(__file__).resolve().parents[2] / "models" / "mlp.onnx"
COMPILER_PACKAGES = ("ir", "target", "script", "ops", "transform", "codegen", "export",
                     "driver", "frontend", "cli")

# (file name, target): a shared library, and an archive whose native code is C
# source that the loading process compiles and links.
KINDS = [("model.so", "llvm"), ("model.tar", "c")]

FRESH_PROCESS = textwrap.dedent("""
    import json, sys
    BLOCKED = {"llvmlite", "onnx", "onnxruntime"}
    COMPILER = set(json.loads(sys.argv[1]))

    def blocked(name):
        parts = name.split(".")
        return parts[0] in BLOCKED or (parts[0] == "kiln" and len(parts) > 1
                                       and parts[1] in COMPILER)

    class Block:
        def find_spec(self, name, path=None, target=None):
            if blocked(name):
                raise ImportError("blocked on this deploy host: " + name)
            return None

    sys.meta_path.insert(0, Block())
    import numpy as np
    import kiln.runtime

    x = np.load(sys.argv[2])
    for library in sys.argv[4:]:
        with kiln.runtime.load_module(library) as lib:
            np.save(sys.argv[3] + "." + library.rsplit(".", 1)[1] + ".npy", lib["main"](x))
    print(json.dumps(sorted(m for m in sys.modules if blocked(m))))
""")


def test_runtime_loads_every_artifact_kind_with_the_compiler_blocked(tmp_path: Path) -> None:
    libraries = []
    for name, target in KINDS:
        path = tmp_path / name
        kiln.compile(str(MODEL), target).export_library(path)
        libraries.append(str(path))
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    (expected,) = onnxruntime_outputs(MODEL, {"x": x})

    proc = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, json.dumps(COMPILER_PACKAGES),
         str(tmp_path / "x.npy"), str(tmp_path / "out"), *libraries],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []  # nothing of the compiler was imported
    for library in libraries:
        got = np.load(tmp_path / f"out.{library.rsplit('.', 1)[1]}.npy")
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=library)


def test_the_blocker_does_block() -> None:
    """The check above can fail: the same finder stops a compiler import."""
    script = FRESH_PROCESS.split("import numpy as np")[0] + "import kiln.codegen\n"
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(COMPILER_PACKAGES)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "blocked on this deploy host: kiln.codegen" in proc.stderr
