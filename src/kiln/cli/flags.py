"""Numeric options of the `kiln` command, checked when the command line is parsed.

Each numeric flag takes an integer in a range (`count`): a value outside it, or not an
integer, is argparse's usage error (exit code 2, docs/cli.md) naming the flag and the
range, before anything is read, built or measured. The ranges are listed in
docs/security.md, "Limits".
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from kiln.errors import shown

#: `kiln run --repeat` and `--warmup`: every timed call is kept (its latency and, with
#: --profile, each kernel's counters), so the count bounds that memory.
MAX_REPEAT = 100_000
#: `kiln run --top`: rows per profile table.
MAX_TOP = 10_000
#: `kiln compile --max-loop-iterations`: a Loop's iteration counter is an int64.
MAX_LOOP_ITERATIONS = 2**63 - 1
#: `kiln tune --workers`: CPUs of the local Ray instance.
MAX_WORKERS = 1024


def count(lo: int, hi: int | Callable[[], int]) -> Callable[[str], int]:
    """An argparse `type`: the text as an integer from `lo` to `hi` (a number, or a
    function giving it when the flag is parsed), else argparse.ArgumentTypeError."""
    def parse(text: str) -> int:
        top = hi() if callable(hi) else hi
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not lo <= value <= top:
            raise argparse.ArgumentTypeError(
                f"expected an integer from {lo} to {top}, got {shown(text, 40)}")
        return value

    parse.__name__ = "count"
    return parse


def max_threads() -> int:
    """The most threads a kiln library runs (kiln.runtime.threads.MAX_THREADS)."""
    from kiln.runtime.threads import MAX_THREADS  # heavy: kept off the cli's startup (kiln --help)

    return MAX_THREADS


__all__ = ["MAX_LOOP_ITERATIONS", "MAX_REPEAT", "MAX_TOP", "MAX_WORKERS", "count", "max_threads"]
