"""numpy's bfloat16 dtype, from the optional ml_dtypes package.

One lookup shared by kiln.ir.dtype and kiln.runtime.abi, which may not import
each other (the runtime installs without the compiler).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.errors import missing_dependency


def numpy_bfloat16() -> np.dtype[Any]:
    """ml_dtypes' bfloat16; MissingDependencyError (naming the package) without it."""
    try:
        import ml_dtypes  # optional: ml_dtypes (the ml-dtypes extra)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise (missing_dependency(exc, "bfloat16 support") or exc) from exc
    return np.dtype(ml_dtypes.bfloat16)
