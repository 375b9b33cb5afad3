"""Time budgets as users write them: `10m`, `120s`, `1h30m`, `90` (seconds)."""

from __future__ import annotations

import re

from kiln.errors import UsageError, shown

#: The longest budget taken: a week (a longer one is a typo, or infinite).
MAX_BUDGET_S = 7 * 86400.0
_PART = re.compile(r"(\d+(?:\.\d+)?)([hms]?)")
_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "": 1.0}


def parse_budget(text: str) -> float:
    """Seconds in `text`: one or more NUMBER[h|m|s] parts (a bare number is seconds)."""
    spec = text.strip().lower()
    pos, total = 0, 0.0
    while pos < len(spec):
        m = _PART.match(spec, pos)
        if m is None or (m.group(2) == "" and (pos, m.end()) != (0, len(spec))):
            raise UsageError(f"budget {shown(text)}: expected e.g. 10m, 120s, 1h30m or 90")
        total += float(m.group(1)) * _SECONDS[m.group(2)]
        pos = m.end()
    if not spec or total <= 0:
        raise UsageError(f"budget {shown(text)} must be a positive time, e.g. 10m or 120s")
    if total > MAX_BUDGET_S:  # also a number too long to be finite
        raise UsageError(f"budget {shown(text)} is longer than a week ({MAX_BUDGET_S:.0f} s), "
                         "the most kiln tune takes")
    return total
