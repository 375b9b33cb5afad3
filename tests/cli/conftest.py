from __future__ import annotations

from pathlib import Path

import pytest
from kiln_cli import MODEL, run_kiln


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the shipped MLP compiled for llvm as mlp.so and mlp.a."""
    where = tmp_path_factory.mktemp("built")
    for out in ("mlp.so", "mlp.a"):
        done = run_kiln("compile", str(MODEL), "-t", "llvm", "-o", out, cwd=where)
        assert done.returncode == 0, done.stderr
    return where
