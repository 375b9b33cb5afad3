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


def node_id_of(node: pytest.Item | pytest.Collector) -> str:
    """`node`'s id without the `@group` that `--dist loadgroup` appends for its
    `xdist_group` mark (tests/conftest.py groups tests that share a fixture): a test
    draws the same data in `make test` as when it is run alone."""
    mark = node.get_closest_marker("xdist_group")
    suffix = f"@{mark.args[0]}" if mark is not None and mark.args else ""
    nodeid = node.nodeid
    return nodeid[:-len(suffix)] if suffix and nodeid.endswith(suffix) else nodeid


def rng_for(request: pytest.FixtureRequest) -> np.random.Generator:
    """A generator seeded by the requesting test's node id (seed_for, node_id_of)."""
    return np.random.default_rng(seed_for(node_id_of(request.node)))


def reseed(request: pytest.FixtureRequest, name: str = "RNG") -> None:
    """Rebind the requesting test module's generator `name` to rng_for(request): the
    body of an autouse fixture for a module whose helpers draw from a module-level
    generator (the draws at import keep the module's fixed seed)."""
    setattr(request.module, name, rng_for(request))
