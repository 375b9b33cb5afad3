"""A plain C program (examples/c_deploy/dynamic.c) calls one dynamic-shape library at
several sizes: it learns the result's shape from `{prefix}_output_shapes_main`, or
passes a shape the entry checks itself; mismatched shapes fail with the texts of
docs/abi.md (check 7), the same as Python's."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from support.c_programs import program_and_library
from support.dynamic_models import encoder, feeds
from support.reference import ort_session

MODEL = encoder(layers=1, width=32, heads=2, ffn=64, gelu_op=True)


@pytest.fixture(scope="module", params=["llvm", "c"])
def built(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the program, the library) for one backend."""
    return program_and_library(request, tmp_path_factory, MODEL, "dynamic")


def _run(built: tuple[Path, Path], tmp: Path, features: np.ndarray, mask: np.ndarray,
         out: str) -> subprocess.CompletedProcess[str]:
    program, lib = built
    (tmp / "f.bin").write_bytes(np.ascontiguousarray(features, np.float32).tobytes())
    (tmp / "m.bin").write_bytes(np.ascontiguousarray(mask, np.int64).tobytes())
    fshape = ",".join(map(str, features.shape))
    mshape = ",".join(map(str, mask.shape))
    return subprocess.run([str(program), str(lib), "kiln_", "main", f"{tmp / 'out.bin'}:{out}",
                           f"{tmp / 'f.bin'}:float32:{fshape}", f"{tmp / 'm.bin'}:int64:{mshape}"],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("explicit", [False, True])
def test_c_calls_one_library_at_two_sizes(built, tmp_path, explicit: bool) -> None:
    session = ort_session(MODEL)
    for batch, seq in ((1, 5), (3, 40)):
        feed = feeds(MODEL, {"batch": batch, "seq": seq})
        out = f"{batch},{seq},32" if explicit else "3"
        proc = _run(built, tmp_path, feed["features"], feed["mask"], out)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == f"shape {batch},{seq},32"
        got = np.frombuffer((tmp_path / "out.bin").read_bytes(), np.float32)
        want = session.run(None, feed)[0]
        assert np.linalg.norm(got - want.ravel()) / np.linalg.norm(want) < 1e-4


@pytest.mark.parametrize("explicit", [False, True])
def test_c_reports_mismatched_and_out_of_range_dimensions(built, tmp_path,
                                                          explicit: bool) -> None:
    features = np.zeros((2, 7, 32), np.float32)
    proc = _run(built, tmp_path, features, np.ones((2, 9), np.int64),
                "2,7,32" if explicit else "3")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("main: dimension 'seq' is 7 in argument 0 'features' but 9 "
                                   "in argument 1 'mask'")
    proc = _run(built, tmp_path, np.zeros((2, 0, 32), np.float32), np.ones((2, 0), np.int64),
                "2,0,32" if explicit else "3")
    # seq may be 0, but the head merge's Reshape to [batch, seq, -1] divides by it, which
    # onnxruntime refuses too
    assert proc.returncode == 2
    assert re.fullmatch(r"main: node 'reshape_\d+' \(Reshape\): the -1 of shape \[batch, seq, "
                        r"-1\] divides the element count by batch\*seq, which is 0 here "
                        r"\(onnxruntime refuses it too\)", proc.stderr.strip()), proc.stderr
    if explicit:  # the result's shape is checked against the bound dimensions
        proc = _run(built, tmp_path, features, np.ones((2, 7), np.int64), "2,7,31")
        assert proc.returncode == 2
        assert proc.stderr.strip() == ("main: argument 2 'encoded': expected shape "
                                       "[batch, seq, 32], got [2, 7, 31]")
