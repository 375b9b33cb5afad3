"""Fixtures of the export tests; the hand-made library lives in tests/runtime."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))

import handmade_lib

from kiln.export import export_library


@pytest.fixture(scope="session")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The hand-made library exported once as .so, .tar and .a (prefix kiln_)."""
    out = tmp_path_factory.mktemp("exported")
    arts, meta = handmade_lib.artifacts(), handmade_lib.library_metadata("kiln_")
    return {suffix: export_library(arts, meta, out / f"model{suffix}", prefix="kiln_")
            for suffix in (".so", ".tar", ".a")}
