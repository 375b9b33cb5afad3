"""Per-test random generators.

A module-level `np.random.default_rng(seed)` shared by a file's tests hands each test
whatever state the tests before it in the same worker left, so the data of a failing
test depend on the order xdist happened to run them in. `rng_for(request)` seeds a
generator from the test's node id alone: rerunning that one test redraws its data.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest


def seed_for(nodeid: str) -> int:
    """A stable seed for a test node id (CRC-32 of its text: no hash randomization)."""
    return zlib.crc32(nodeid.encode())


def rng_for(request: pytest.FixtureRequest) -> np.random.Generator:
    """A generator seeded by the requesting test's node id (seed_for)."""
    return np.random.default_rng(seed_for(request.node.nodeid))
