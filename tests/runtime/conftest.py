"""Fixtures of the runtime tests: one hand-made library, linked once per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kiln.runtime import Module, load_artifacts
from support import handmade_lib


@pytest.fixture(scope="session")
def hand_lib() -> Iterator[Module]:
    """The hand-made library, loaded through the code-loading process (jit path)."""
    mod = load_artifacts(handmade_lib.artifacts(), metadata=handmade_lib.library_metadata("kiln_"),
                         prefix="kiln_")
    yield mod
    mod.close()
