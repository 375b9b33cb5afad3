"""Suite-wide settings.

Library thread pools do not spin while idle (KILN_SPIN_US=0; see below). Each
pytest-xdist worker gets its own compile cache (kiln.driver.cache), so two
workers never evict or write one cache directory at once and a test never depends
on what another process compiled. A run without xdist keeps the caller's cache
setting.

Tests marked `slow` (the longest of the suite: a Ray cluster, model exports and
compiles, the heaviest documentation pages) run first. pytest-xdist hands tests out
in collection order, so a long test collected last would keep one worker busy while
the other has nothing left to do; started first, they overlap with the short ones.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

# Idle pool workers spin 20 ms after a library's last parallel loop by default (docs/
# runtime.md, "Threads"); two xdist workers share two cores, so in the suite that spin
# would only take CPU from the other worker. tests/runtime/test_threads.py clears it.
os.environ.setdefault("KILN_SPIN_US", "0")

_worker = os.environ.get("PYTEST_XDIST_WORKER")
if _worker and "KILN_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix=f"kiln-cache-{_worker}-")
    os.environ["KILN_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow tests first, each group in collection order (the sort is stable). Every
    xdist worker collects and sorts alike, as xdist requires."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
