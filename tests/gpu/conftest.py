"""GPU-only tests: skipped unless cuda-python is installed and a CUDA device answers."""

from __future__ import annotations

from types import ModuleType

import pytest

import kiln
from kiln.errors import CallError
from kiln.runtime.cuda_device import require_device


@pytest.fixture(scope="session")
def driver() -> ModuleType:
    try:
        return require_device(kiln.cuda(0))
    except CallError as exc:
        pytest.skip(f"needs a CUDA GPU: {exc}")
