"""The runtime-only install: the wheel built from this repository, with numpy alone.

A deploy host runs `pip install kiln-tensor` (docs/deploy.md): that must bring numpy
and nothing of the compiler, and still load and run a library exported here. The
test builds the wheel, installs it into a fresh venv (numpy comes from the package
index or pip's cache), and compares that venv's output with onnxruntime's.
"""

from __future__ import annotations

import email
import importlib.util
import json
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

import numpy as np
import pytest

import kiln
from support.reference import ort_session

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "mlp.onnx"


def _run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"{args}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


def _build_wheel(tmp: Path) -> Path:
    """`make wheel` (README, "Building the wheel") on a copy of the sources, so the
    checkout gets no build/, dist/ or egg-info; this interpreter stands for .venv's."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools (the build backend make wheel uses offline) is not installed")
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "Makefile", "requirements.txt"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    stamp = source / ".venv" / ".installed"  # the venv is set up: make needs no pip install
    stamp.parent.mkdir()
    stamp.touch()
    _run("make", "-C", source, "wheel", f"VPY={sys.executable}")
    (wheel,) = (source / "dist").glob("*.whl")
    return wheel


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_bytes(zf.read(name))


RUNTIME_SCRIPT = textwrap.dedent("""
    import importlib.util, json, sys
    import numpy as np
    import kiln, kiln.runtime
    missing = [m for m in ("llvmlite", "onnx", "onnxruntime", "elftools")
               if importlib.util.find_spec(m) is not None]
    lib = kiln.runtime.load_module(sys.argv[1])
    np.save(sys.argv[3], lib["main"](np.load(sys.argv[2])))
    try:
        kiln.frontend.from_onnx(sys.argv[4])
        refusal = None
    except kiln.MissingDependencyError as exc:
        refusal = str(exc)
    try:  # a drop-in onnxruntime script: a KilnError naming the extra, not a bare import
        kiln.InferenceSession(sys.argv[4])
        session = None
    except kiln.MissingDependencyError as exc:
        session = str(exc)
    print(json.dumps({"version": kiln.__version__, "file": kiln.__file__,
                      "unexpected": missing, "refusal": refusal, "session": session}))
""")


def test_runtime_wheel_loads_and_runs_with_numpy_only(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    meta = _metadata(wheel)
    assert meta["Name"] == "kiln-tensor"
    assert meta["Version"] == kiln.__version__
    required = [r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r]
    assert [r.split(">")[0].split("=")[0].strip() for r in required] == ["numpy"]

    library, x = tmp_path / "mlp.so", np.random.default_rng(0).random((1, 64), np.float32)
    kiln.compile(kiln.frontend.from_onnx(MODEL), "llvm").export_library(library)
    np.save(tmp_path / "x.npy", x)
    expected = ort_session(MODEL).run(None, {"x": x})[0]

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", wheel)
    (tmp_path / "deploy.py").write_text(RUNTIME_SCRIPT)
    # From an empty directory, so neither this checkout nor its venv can be imported.
    work = tmp_path / "deploy"
    work.mkdir()
    proc = _run(python, "-I", tmp_path / "deploy.py", library, tmp_path / "x.npy",
                tmp_path / "y.npy", MODEL, cwd=work)
    report = json.loads(proc.stdout.strip().splitlines()[-1])

    assert str(venv) in report["file"], report["file"]
    assert report["version"] == kiln.__version__
    assert report["unexpected"] == [], "the runtime install pulled in compiler packages"
    assert "needs the 'onnx' package" in (report["refusal"] or ""), report
    assert 'pip install "kiln-tensor[compiler]"' in (report["session"] or ""), report
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected, rtol=1e-5, atol=1e-6)

    # The command line's `run` works there too, through the wheel's `kiln` script.
    _run(venv / "bin" / "kiln", "run", library, "--input", f"x={tmp_path / 'x.npy'}",
         "--output", tmp_path / "y_cli.npy", cwd=work)
    np.testing.assert_allclose(np.load(tmp_path / "y_cli.npy"), expected, rtol=1e-5, atol=1e-6)

    # `kiln compile` there is refused in one line that names the extra to install.
    proc = subprocess.run([str(venv / "bin" / "kiln"), "compile", str(MODEL), "-o",
                           str(tmp_path / "again.so")], cwd=work, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert 'pip install "kiln-tensor[compiler]"' in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


def test_the_version_is_written_once() -> None:
    """`kiln.__version__` is the one source: pyproject reads it, nothing in src/ repeats it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    literal = repr(kiln.__version__)[1:-1]
    repeats = [str(p.relative_to(ROOT)) for p in (ROOT / "src").rglob("*.py")
               if literal in p.read_text() and p != ROOT / "src" / "kiln" / "__init__.py"]
    assert repeats == [], f"the version string {literal!r} is repeated in {repeats}"
