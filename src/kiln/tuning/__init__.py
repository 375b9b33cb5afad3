"""Per-model tuning: measured kernel choices, kept in a versioned database.

kiln compiles without tuning by default: every kernel's tile comes from a rule over
the target's ISA (kiln.target.isa). Tuning measures legal alternatives per distinct
kernel and keeps one only when it beats the default by more than the measured noise
(kiln.tuning.select). The measurements and choices live in a JSON database
(kiln.tuning.database) keyed by kernel signature and target CPU, merged across runs.
kiln.tuning.apply is how a compile (and `kiln tune`, kiln.distributed.tune) gives the
blocking passes their tiles. docs/tuning.md describes the format and the selection rule.
"""

from kiln.tuning.budget import parse_budget
from kiln.tuning.database import Measurement, Record, TuningDatabase, target_key
from kiln.tuning.select import choose

__all__ = ["Measurement", "Record", "TuningDatabase", "choose", "parse_budget", "target_key"]
