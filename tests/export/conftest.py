"""Fixtures of the export tests; the hand-made library lives in tests/runtime."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.export import export_library
from support import handmade_lib


@pytest.fixture(scope="session")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The hand-made library exported once as .so, .tar and .a (prefix kiln_)."""
    out = tmp_path_factory.mktemp("exported")
    arts, meta = handmade_lib.artifacts(), handmade_lib.library_metadata("kiln_")
    return {suffix: export_library(arts, meta, out / f"model{suffix}", prefix="kiln_")
            for suffix in (".so", ".tar", ".a")}
