"""Suite-wide settings.

Library thread pools do not spin while idle (KILN_SPIN_US=0; see below). Each
pytest-xdist worker gets its own compile cache (kiln.driver.cache), so two
workers never evict or write one cache directory at once and a test never depends
on what another process compiled. A run without xdist keeps the caller's cache
setting.

Tests marked `slow` (the longest of the suite: a Ray cluster, model exports and
compiles, the heaviest documentation pages) come first. pytest-xdist hands out its work
units (an xdist group, or one ungrouped test) by their number of tests, most first (its
default --loadscope-reorder), ties in collection order, so a long test collected last
would keep one worker busy while the other has nothing left to do; sorted first, the
slow ones overlap with the short ones.

Tests that share a module- or class-scoped fixture run on one xdist worker (`make
test` runs `--dist loadgroup`): spread over both, each worker would build the fixture
(a compiled model, a CLI build) again. They form one xdist group per module (or
class) and per parameter of such a fixture, so a fixture parametrized by target still
spreads its targets over the workers. A test's own `xdist_group` mark is kept.
"""

from __future__ import annotations

import atexit
import os

import pytest

from kiln.runtime.private_dirs import make_private_dir, remove_private_dir

# Idle pool workers spin 20 ms after a library's last parallel loop by default (docs/
# runtime.md, "Threads"); two xdist workers share two cores, so in the suite that spin
# would only take CPU from the other worker. tests/runtime/test_threads.py clears it.
os.environ.setdefault("KILN_SPIN_US", "0")

_worker = os.environ.get("PYTEST_XDIST_WORKER")
if _worker and "KILN_CACHE_DIR" not in os.environ:
    # A private directory: a killed run's is removed by the next run's first one.
    _cache = make_private_dir(f"kiln-cache-{_worker}-")
    os.environ["KILN_CACHE_DIR"] = _cache
    atexit.register(remove_private_dir, _cache)


# tryfirst: the marks must be on the items before pytest-xdist's own hook of this name
# turns them into node ids (`...@group`).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow tests first, each group in collection order (the sort is stable). Every
    xdist worker collects and sorts alike, as xdist requires. Tests sharing a module-
    or class-scoped fixture get an xdist group (module docstring)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    for item in items:
        group = _shared_fixture_group(item)
        if group and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))


# The scopes whose fixtures xdist would build once per worker that runs their tests
# (session-scoped ones are shared by many modules: grouping them would be too coarse).
_GROUPED_SCOPES = ("module", "class")


def _shared_fixture_group(item: pytest.Item) -> str | None:
    """The xdist group of a test that uses a module- or class-scoped fixture: its
    module (or class) and the parameter index of each such fixture it takes; None for
    a test without one."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    scopes = {name: defs[-1].scope for name, defs in info.name2fixturedefs.items()
              if defs and defs[-1].scope in _GROUPED_SCOPES}
    if not scopes:
        return None
    parts = item.nodeid.split("::")
    # a class-scoped fixture is the class's alone; a module-scoped one the module's
    node = parts[0] if "module" in scopes.values() or len(parts) < 3 else "::".join(parts[:2])
    callspec = getattr(item, "callspec", None)
    params = [f"{name}={callspec.indices[name]}" for name in sorted(scopes)
              if callspec is not None and name in callspec.indices]
    # no brackets: xdist takes a group name only where no "]" follows the last "@"
    return f"{node}:{','.join(params)}" if params else node
