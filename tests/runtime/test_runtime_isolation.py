"""A deploy host: kiln.runtime loads every artifact kind with the compiler blocked.

The libraries are built here (compiler side); a fresh process then blocks
llvmlite, onnx, onnxruntime and every compiler package of kiln with a meta path
finder, loads each library with `kiln.runtime.load_module` and runs it. Its
outputs must match onnxruntime's, artifacts only the compiler can run (llvmjit
bitcode, the interpreter's IRModule) must raise the runtime's clear KilnError,
and afterwards no compiler module may have been imported: the runtime reaches
the compiler neither eagerly nor lazily (tests/test_layering.py checks the same
from the imports, and the last test here from the text: the runtime does not
even name a compiler module).
"""

from __future__ import annotations

import json
import re
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
    refused = {}
    for library in sys.argv[5:]:
        with kiln.runtime.load_module(library) as lib:
            np.save(sys.argv[3] + "." + library.rsplit(".", 1)[1] + ".npy", lib["main"](x))
    # Only the compiler can run these: the runtime says so.
    from kiln.artifact import ArtifactSet, InMemoryArtifact
    from kiln.errors import KilnError
    try:
        kiln.runtime.load_module(sys.argv[4])
    except KilnError as e:
        refused["llvmjit"] = str(e)
    try:
        kiln.runtime.load_artifacts(ArtifactSet([InMemoryArtifact("python", "python",
                                                                  "module", value=None)]),
                                    metadata={}, prefix="kiln_")
    except KilnError as e:
        refused["python"] = str(e)
    print(json.dumps([sorted(m for m in sys.modules if blocked(m)), refused]))
""")


def test_runtime_loads_every_artifact_kind_with_the_compiler_blocked(tmp_path: Path) -> None:
    libraries = []
    for name, target in KINDS:
        path = tmp_path / name
        kiln.compile(str(MODEL), target).export_library(path)
        libraries.append(str(path))
    jit_tar = tmp_path / "jit.tar"
    kiln.compile(str(MODEL), "llvmjit").export_library(jit_tar)
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    (expected,) = onnxruntime_outputs(MODEL, {"x": x})

    proc = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, json.dumps(COMPILER_PACKAGES),
         str(tmp_path / "x.npy"), str(tmp_path / "out"), str(jit_tar), *libraries],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    imported, refused = json.loads(proc.stdout)
    assert imported == []  # nothing of the compiler was imported
    assert sorted(refused) == ["llvmjit", "python"], refused
    for loader, message in refused.items():
        assert f"artifacts of loader '{loader}' need the kiln compiler" in message, message
        assert "deploy hosts, with the runtime alone, load native libraries (.so, .tar)" \
            in message
    for library in libraries:
        got = np.load(tmp_path / f"out.{library.rsplit('.', 1)[1]}.npy")
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=library)


def test_the_blocker_does_block() -> None:
    """The check above can fail: the same finder stops a compiler import."""
    script = FRESH_PROCESS.split("import numpy as np")[0] + "import kiln.codegen\n"
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(COMPILER_PACKAGES)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "blocked on this deploy host: kiln.codegen" in proc.stderr


# Compiler packages (tests/test_layering.py's COMPILER) and the layers above the runtime.
NAMED = re.compile(r"\bkiln\.(" + "|".join(
    (*COMPILER_PACKAGES, "tuning", "session", "distributed")) + r")\b")


def test_the_runtime_names_no_compiler_module() -> None:
    """Not even in a lazy "module:attr" string, an error message or a docstring: the
    compiler registers what the runtime needs from it (kiln.codegen.connect_runtime)."""
    runtime = Path(kiln.__file__).resolve().parent / "runtime"
    hits = [f"{path.relative_to(runtime)}:{number}: {line.strip()}"
            for path in sorted(runtime.rglob("*.py"))
            for number, line in enumerate(path.read_text("utf-8").splitlines(), 1)
            if NAMED.search(line)]
    assert not hits, "\n".join(hits)
    # The pattern finds what the runtime once held.
    assert NAMED.search('LOADERS.register("llvmjit", lazy="kiln.codegen.llvm.jit_loader:x")')
