"""Checks shared by the hand-written kernel tests (convolution, GEMM): one ONNX model of
independent cases compared with onnxruntime (fresh processes: fresh_process.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def assert_close(got: Sequence[np.ndarray], want: Sequence[np.ndarray],
                 cases: Sequence[Any], tol: float) -> None:
    """Every output within relative L2 error `tol` of the reference (naming the case)."""
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape, (k, cases[k])
        err = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)
        assert err < tol, (k, cases[k], err)
