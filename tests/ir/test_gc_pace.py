"""kiln.ir.gc_pace: the collector's young threshold raised during builds, then restored."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from kiln.ir.gc_pace import YOUNG_THRESHOLD, fewer_collections


@pytest.fixture
def default_pace() -> Iterator[None]:
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*saved)


@fewer_collections
def _threshold(inner: bool = False) -> tuple[int, ...]:
    """The threshold seen inside (and inside a nested build when `inner`)."""
    return _threshold() if inner else gc.get_threshold()


def test_threshold_raised_inside_and_restored_after(default_pace: None) -> None:
    assert _threshold() == (YOUNG_THRESHOLD, 10, 10)
    assert _threshold(inner=True) == (YOUNG_THRESHOLD, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)
    with pytest.raises(ZeroDivisionError):
        fewer_collections(lambda: 1 // 0)()
    assert gc.get_threshold() == (700, 10, 10)


def test_concurrent_builds_restore_once_the_last_ends(default_pace: None) -> None:
    started, release = threading.Event(), threading.Event()

    @fewer_collections
    def build() -> None:
        started.set()
        release.wait(10)

    worker = threading.Thread(target=build)
    worker.start()
    started.wait(10)
    assert _threshold() == (YOUNG_THRESHOLD, 10, 10)
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD  # the worker's build is still on
    release.set()
    worker.join(10)
    assert gc.get_threshold() == (700, 10, 10)


def test_a_program_own_settings_are_kept(default_pace: None) -> None:
    gc.set_threshold(50_000, 5, 5)  # higher than kiln's: left as it is
    assert _threshold() == (50_000, 5, 5)
    assert gc.get_threshold() == (50_000, 5, 5)
    gc.set_threshold(0)  # collection off: left off
    assert _threshold()[0] == 0
    assert gc.get_threshold()[0] == 0
