"""The `kiln` command: compile the shipped model, inspect the result, run it, fail cleanly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from support.reference import ort_session

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "mlp.onnx"


def kiln(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kiln.cli.main", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_compile_inspect_run(tmp_path: Path) -> None:

    done = kiln("compile", str(MODEL), "-t", "c", "-o", "mlp.so", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    listing = kiln("inspect", "mlp.so", cwd=tmp_path)
    assert listing.returncode == 0 and "host.c" in listing.stdout and "kernels.c" in listing.stdout
    source = kiln("inspect", "mlp.so", "--artifact", "c/kernels.c", cwd=tmp_path)
    assert "kiln__kernel_" in source.stdout

    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    ran = kiln("run", "mlp.so", "--input", "x=x.npy", "--output", "y.npy", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    want = ort_session(MODEL).run(
        None, {"x": x})[0]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-5, atol=1e-6)
    # the output is reported by its name in the model, with its shape and dtype
    assert ran.stdout.startswith("probs: shape (1, 10) dtype float32  min ")


def test_errors_are_reported_not_raised(tmp_path: Path) -> None:
    bad_target = kiln("compile", str(MODEL), "-t", "llvmm", "-o", "x.so", cwd=tmp_path)
    assert bad_target.returncode == 2
    assert "did you mean 'llvm'" in bad_target.stderr and "Traceback" not in bad_target.stderr
    missing = kiln("inspect", "nothing.so", cwd=tmp_path)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


def test_compile_on_a_runtime_only_host_is_one_line(tmp_path: Path) -> None:
    """llvmlite and onnx unimportable: `kiln compile` names the package, no traceback."""
    script = (
        "import sys\n"
        "class _Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('llvmlite', 'onnx', 'onnxruntime'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _Block())\n"
        "from kiln.cli.main import main\n"
        "sys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.run([sys.executable, "-c", script, "compile", str(MODEL), "-t", "c",
                           "-o", "x.so"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert lines[0].startswith("kiln compile: error: importing an ONNX model needs the 'onnx' "
                               "package, which is not installed here (pip install "
                               "\"kiln-tensor[compiler]\", or pip install onnx)")


def test_compile_onto_a_directory_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "out.so").mkdir()
    proc = kiln("compile", str(MODEL), "-t", "c", "-o", "out.so", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("kiln compile: error: cannot export to 'out.so': it is a "
                                   "directory; give the library's file name, e.g. "
                                   "'out.so/model.so'")
