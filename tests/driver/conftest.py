"""The driver tests compile to a private cache directory."""

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory,
                   monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("kiln-cache")
    monkeypatch.setenv("KILN_CACHE_DIR", str(path))
    yield path
