"""Fixtures of the runtime tests: one hand-made library, linked once per session."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kiln.runtime import Module, ctypes_abi, load_artifacts
from support import handmade_lib


@pytest.fixture(scope="session")
def hand_lib() -> Iterator[Module]:
    """The hand-made library, loaded through the code-loading process (jit path)."""
    mod = load_artifacts(handmade_lib.artifacts(), metadata=handmade_lib.library_metadata("kiln_"),
                         prefix="kiln_")
    yield mod
    mod.close()


@pytest.fixture
def forbid_packing(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Call it to make the general packing of arguments fail the test from then on (the
    fast and prepared paths pack nothing per call)."""
    def refuse(*args: Any) -> Any:
        raise AssertionError("the general packing path was taken")

    return lambda: monkeypatch.setattr(ctypes_abi, "pack_arguments", refuse)
