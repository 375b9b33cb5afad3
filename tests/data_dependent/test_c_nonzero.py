"""The C ABI of data-dependent sizes from plain C (examples/c_deploy/nonzero.c, built
with cc -Werror): the program passes a result buffer of the bound's shape and reads the
actual shape the entry writes back; a buffer smaller than the bound is refused with the
error status and the entry's message, never written past."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from dd_check import model
from onnx import TensorProto, helper

import kiln
from support.c_programs import program_and_library
from support.reference import ort_session

MODEL = model([helper.make_node("NonZero", ["x"], ["nz"])],
              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
              [("nz", TensorProto.INT64)])


@pytest.fixture(scope="module", params=["llvm", "c"])
def built(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the program, the library) for one backend."""
    return program_and_library(request, tmp_path_factory, MODEL, "nonzero")


def _run(built: tuple[Path, Path], tmp: Path, x: np.ndarray,
         out_shape: str) -> subprocess.CompletedProcess[str]:
    program, lib = built
    (tmp / "x.bin").write_bytes(np.ascontiguousarray(x, np.float32).tobytes())
    return subprocess.run([str(program), str(lib), "kiln_", "main",
                           f"{tmp / 'out.bin'}:{out_shape}", f"{tmp / 'x.bin'}:float32:3,4"],
                          capture_output=True, text=True, timeout=300)


def test_c_program_reads_the_actual_shape(built: tuple[Path, Path], tmp_path: Path) -> None:
    session = ort_session(MODEL)
    rng = np.random.default_rng(8)
    bound = kiln.runtime.load_module(built[1])["main"].signature["results"][0]["shape"]
    assert bound == [2, 12]
    for x in (rng.standard_normal((3, 4)) * (rng.random((3, 4)) < 0.5), np.zeros((3, 4)),
              np.ones((3, 4))):
        (want,) = session.run(None, {"x": x.astype(np.float32)})
        proc = _run(built, tmp_path, x, "2,12")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == ["shape", *map(str, want.shape)]
        got = np.frombuffer((tmp_path / "out.bin").read_bytes(), np.int64).reshape(want.shape)
        np.testing.assert_array_equal(got, want)


def test_c_buffer_below_the_bound_is_an_error(built: tuple[Path, Path], tmp_path: Path) -> None:
    proc = _run(built, tmp_path, np.ones((3, 4)), "2,3")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "main: argument 1 'nz': expected shape [2, 12], got [2, 3]"
