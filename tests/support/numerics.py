"""Comparing outputs with a reference."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def rel_l2(actual: np.ndarray, expected: np.ndarray) -> float:
    """Relative L2 error of `actual` against `expected`."""
    return float(np.linalg.norm(np.asarray(actual, np.float64) - expected)
                 / max(float(np.linalg.norm(np.asarray(expected, np.float64))), 1e-30))


def assert_close(got: Sequence[np.ndarray], want: Sequence[np.ndarray], tol: float,
                 cases: Sequence[Any] | None = None) -> None:
    """Every output has the reference's shape and is within relative L2 error `tol` of
    it; a failure names the output's index and, given `cases`, its case."""
    assert len(got) == len(want), (len(got), len(want))
    for k, (a, b) in enumerate(zip(got, want)):
        label = (k, cases[k]) if cases is not None else (k,)
        assert a.shape == b.shape, (*label, a.shape, b.shape)
        err = rel_l2(a, b)
        assert err < tol, (*label, err)


def assert_close_to_scale(got: np.ndarray, want: np.ndarray, rtol: float,
                          scaled_atol: float) -> None:
    """Every element within `rtol` of itself plus `scaled_atol` times the reference's
    largest magnitude: a float32 sum or dot product errs relative to its terms, not its
    result, so an element that cancels to near zero cannot meet `rtol` alone."""
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = max(float(np.abs(want).max(initial=0.0)), 1.0)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=scaled_atol * scale)
