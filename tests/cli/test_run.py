"""`kiln run`: inputs from files or filled, outputs by name, saved, and a latency table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from kiln_cli import MODEL, one_line_error, run_kiln

from support.reference import ort_session


@pytest.fixture(scope="module")
def reference():

    session = ort_session(MODEL)
    return lambda x: session.run(None, {"x": x})[0]


def test_unnamed_input_is_taken_when_there_is_one(built: Path, reference) -> None:
    x = np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)
    np.save(built / "x.npy", x)
    ran = run_kiln("run", "mlp.so", "--input", "x.npy", "--outputs", "out.npz", cwd=built)
    assert ran.returncode == 0, ran.stderr
    with np.load(built / "out.npz") as out:
        assert out.files == ["probs"]
        np.testing.assert_allclose(out["probs"], reference(x), rtol=1e-5, atol=1e-6)
    want = reference(x)
    assert f"max {want.max():.6g}" in ran.stdout and f"min {want.min():.6g}" in ran.stdout


def test_inputs_from_npz(built: Path, reference) -> None:
    x = np.random.default_rng(2).standard_normal((1, 64)).astype(np.float32)
    np.savez(built / "in.npz", x=x)
    ran = run_kiln("run", "mlp.so", "--inputs", "in.npz", "--output", "y.npy", cwd=built)
    assert ran.returncode == 0, ran.stderr
    np.testing.assert_allclose(np.load(built / "y.npy"), reference(x), rtol=1e-5, atol=1e-6)


def test_fill_zeros_and_random(built: Path, reference) -> None:
    ran = run_kiln("run", "mlp.so", "--fill", "zeros", "--output", "z.npy", cwd=built)
    assert ran.returncode == 0, ran.stderr
    zeros = np.zeros((1, 64), np.float32)
    np.testing.assert_allclose(np.load(built / "z.npy"), reference(zeros), rtol=1e-5, atol=1e-6)
    ran = run_kiln("run", "mlp.so", "--fill", "random", "--output", "r.npy", cwd=built)
    assert ran.returncode == 0, ran.stderr
    assert not np.allclose(np.load(built / "r.npy"), reference(zeros))


def test_repeat_prints_a_latency_table(built: Path) -> None:
    ran = run_kiln("run", "mlp.so", "--fill", "random", "--repeat", "7", "--warmup", "2",
                   cwd=built)
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[1] == "latency over 7 calls (2 warm-up excluded), ms:"
    stats = {line.split()[0]: float(line.split()[1]) for line in lines[2:5]}
    assert set(stats) == {"median", "p90", "min"}
    assert 0 < stats["min"] <= stats["median"] <= stats["p90"]


def test_input_mistakes_name_what_is_expected(built: Path) -> None:
    np.save(built / "x.npy", np.zeros((1, 64), np.float32))
    line = one_line_error(run_kiln("run", "mlp.so", "--input", "input=x.npy", cwd=built))
    assert "unknown input 'input'" in line and "inputs are: x" in line
    line = one_line_error(run_kiln("run", "mlp.so", cwd=built))
    assert "input 'x' not given" in line and "--fill" in line
    line = one_line_error(run_kiln("run", "mlp.so", "--fill", "zeros", "--function", "nope",
                                   cwd=built))
    assert "no function 'nope'" in line and "main" in line


def _two_in_two_out(path: Path) -> None:
    """s = a + b, d = a - b over float32 (2, 3)."""
    from onnx import save

    from support.graphs import GraphBuilder

    b = GraphBuilder()
    b.node("Add", ["a", "b"], ["s"])
    b.node("Sub", ["a", "b"], ["d"])
    for n in "ab":
        b.input(n, [2, 3])
    for n in "sd":
        b.output(n, [2, 3])
    save(b.model(name="two", ir_version=None), str(path))


def test_several_inputs_and_outputs_by_name(tmp_path: Path) -> None:
    _two_in_two_out(tmp_path / "two.onnx")
    done = run_kiln("compile", "two.onnx", "-t", "llvm", "-o", "two.so", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2))
    np.save(tmp_path / "b.npy", b)
    np.savez(tmp_path / "a.npz", a=a)
    ran = run_kiln("run", "two.so", "--inputs", "a.npz", "--input", "b=b.npy",
                   "--outputs", "out.npz", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert [line.split(":")[0] for line in ran.stdout.splitlines()] == ["s", "d"]
    with np.load(tmp_path / "out.npz") as out:
        np.testing.assert_allclose(out["s"], a + b, rtol=1e-6)
        np.testing.assert_allclose(out["d"], a - b, rtol=1e-6)
    line = one_line_error(run_kiln("run", "two.so", "--input", "b.npy", cwd=tmp_path))
    assert "needs a name" in line and "a, b" in line
    line = one_line_error(run_kiln("run", "two.so", "--fill", "zeros", "--output", "o.npy",
                                   cwd=tmp_path))
    assert "--outputs" in line
