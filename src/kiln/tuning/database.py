"""The tuning database: measured kernel variants per kernel signature and target CPU.

A JSON file, human-readable and diff-friendly (sorted keys, one record per distinct
kernel):

    {"format": "kiln-tuning", "version": 3,
     "records": [{"kernel": "gemm", "signature": "m=64,n=512,k=256,float32",
                  "target": "x86_64:znver4:3f2a...", "default": {"params": {...},
                  "times_us": [...]}, "candidates": [{"params": {...}, "times_us": [...],
                  "default_us": [...], "equal": true}], "chosen": {...} or null}],
     "verdicts": [...]}

Version 3 adds `"verdicts"`: the whole-model checks of `kiln tune`
(kiln.distributed.model_tuning.check_model), one per (model, target, threads):

    {"model": "<sha256 of the imported model>", "target": "x86_64:znver3:...",
     "threads": 2, "accepted": [{"kernel": ..., "signature": ..., "params": {...},
     "reason": ...}], "rejected": [...], "untuned_us": [...], "tuned_us": [...]}

A compile of a model with verdicts applies only the params they accepted (accepted by
every verdict of that model and target, whatever the thread count); of a model without
one, the records' choices as before. Version 2 files read as before (no verdicts).

A candidate's `default_us` are the default's samples taken in the same blocks as its
`times_us` (same length, pair by pair): the selection rule compares them pairwise.
Version 1 files (no pairs) are refused with a FormatError saying to tune again: their
timings cannot be paired after the fact.

`target` is `target_key(isa)`: the architecture, the CPU name and a hash of the
features LLVM enables, so a record measured on one CPU never applies to another.
`chosen` is what kiln.tuning.select decides from the recorded timings; `merge`
combines two databases (timings of the same variant are pooled, the choice made
again). Files are untrusted input: every deviation is a FormatError naming the place,
and a parameter out of its range (`PARAM_RULES`) a UsageError naming the record; a
file is read only up to `MAX_DATABASE_BYTES` (docs/security.md, "Limits"). Whether a
record's kernel and parameters are the kernel's own is checked where the kernels are
known (kiln.kernels.search.check_database, at compile time).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.artifact._json import MAX_DEPTH, text_depth
from kiln.artifact.capped import read_capped
from kiln.errors import FormatError, UsageError, shown
from kiln.target.isa import ISA
from kiln.tuning.select import choose

FORMAT = "kiln-tuning"
VERSION = 3
#: The oldest version read: version 1 has no paired timings.
OLDEST = 2
Params = Mapping[str, Any]

#: The largest database file read: bounds what reading one holds in memory.
MAX_DATABASE_BYTES = 64 << 20
#: Bounds of a parameter's value, far above any kernel's (a register tile holds at
#: most a few hundred lanes): values past them are refused before any kernel sees them.
MAX_TILE = 1024
MAX_TILE_DIMS = 4
MAX_SEGMENT = 1 << 16
MAX_UNROLL = 1024
MAX_MIN_NS = 10**9
#: The longest name a parameter may hold (a family, a split, a layout, a library).
MAX_NAME = 64
#: The most threads a verdict may record (kiln.runtime.threads.MAX_THREADS is far below).
MAX_VERDICT_THREADS = (1 << 16) - 1


def _whole(lo: int, hi: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _name(v: Any) -> bool:
    return isinstance(v, str) and 0 < len(v) <= MAX_NAME


def _tile(v: Any) -> bool:
    return isinstance(v, list) and 1 <= len(v) <= MAX_TILE_DIMS and all(
        _whole(1, MAX_TILE)(t) for t in v)


#: What each parameter a record may hold must be (kiln.kernels.search lists which
#: parameters each kernel takes, and checks them against the call's variants).
PARAM_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "tile": (_tile, f"a list of 1 to {MAX_TILE_DIMS} integers from 1 to {MAX_TILE}"),
    "split": (_name, "the name of a parallel split"),
    "kblock": (lambda v: isinstance(v, bool), "true or false"),
    "ksegment": (_whole(0, MAX_SEGMENT), f"an integer from 0 to {MAX_SEGMENT}"),
    "unroll": (_whole(1, MAX_UNROLL), f"an integer from 1 to {MAX_UNROLL}"),
    "family": (_name, "the name of a kernel family"),
    "layout": (_name, "the name of a layout"),
    "library": (_name, "the name of a library choice"),
    "min_ns": (_whole(1, MAX_MIN_NS), f"an integer from 1 to {MAX_MIN_NS}"),
}


def check_param_values(params: Params, where: str) -> None:
    """UsageError naming `where` when a parameter of `params` is out of its
    `PARAM_RULES` range (a parameter not listed there is the kernel's to judge)."""
    for key, value in params.items():
        ok, what = PARAM_RULES.get(key, (None, ""))
        if ok is not None and not ok(value):
            raise UsageError(f"{where}: parameter {key!r} must be {what}, got "
                             f"{shown(value)}")


def target_key(isa: ISA) -> str:
    """`arch:cpu:feature-hash`, the part of a record's key that names the CPU."""
    feats = ",".join(sorted(isa.features))
    digest = hashlib.sha256(feats.encode()).hexdigest()[:12]
    return f"{isa.arch}:{isa.cpu or 'generic'}:{digest}"


def _canonical(params: Params) -> str:
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Measurement:
    """Timings (microseconds) of one variant, whether its result equalled the default's
    (always True for the default itself) and, for a candidate, the default's timings
    of the same measurement blocks (`default_us`, pair by pair with `times_us`)."""

    params: Params
    times_us: tuple[float, ...]
    equal: bool = True
    default_us: tuple[float, ...] = ()


@dataclass
class Record:
    """One distinct kernel on one target: the default and the candidates measured."""

    kernel: str
    signature: str
    target: str
    default: Measurement
    candidates: list[Measurement] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str, str]:
        """(kernel, signature, target): what a compile looks up."""
        return self.kernel, self.signature, self.target

    @property
    def chosen(self) -> Params | None:
        """The winning candidate's params (kiln.tuning.select), None for the default."""
        i = choose([(c.times_us, c.default_us, c.equal) for c in self.candidates])
        return None if i is None else self.candidates[i].params

    def merged(self, other: Record) -> Record:
        """This record with `other`'s timings pooled in, variant by variant."""
        pooled: dict[str, Measurement] = {}
        for m in [*self.candidates, *other.candidates]:
            k = _canonical(m.params)
            old = pooled.get(k)
            pooled[k] = m if old is None else Measurement(
                m.params, old.times_us + m.times_us, old.equal and m.equal,
                old.default_us + m.default_us)
        default = Measurement(self.default.params,
                              self.default.times_us + other.default.times_us)
        return Record(self.kernel, self.signature, self.target, default,
                      sorted(pooled.values(), key=lambda m: _canonical(m.params)))


@dataclass(frozen=True)
class Checked:
    """A record's choice as a model check judged it: the params and why."""

    kernel: str
    signature: str
    params: Params
    reason: str = ""

    @property
    def key(self) -> tuple[str, str]:
        """(kernel, signature)."""
        return self.kernel, self.signature


@dataclass(frozen=True)
class Verdict:
    """The whole-model check of one model (`model`: the sha256 of the imported module,
    kiln.driver.fingerprint.module_fingerprint, which kiln.compile and `kiln tune` both
    take of the module before any pass) on one target with `threads` threads (None: the
    runtime's default): the choices accepted and rejected in the model, and the model's paired
    samples (untuned, tuned with the accepted choices; microseconds, block by block) of
    the last comparison against the untuned build."""

    model: str
    target: str
    threads: int | None
    accepted: tuple[Checked, ...] = ()
    rejected: tuple[Checked, ...] = ()
    untuned_us: tuple[float, ...] = ()
    tuned_us: tuple[float, ...] = ()

    @property
    def key(self) -> tuple[str, str, int]:
        """(model, target, threads; 0 for the runtime's default)."""
        return self.model, self.target, self.threads or 0


class TuningDatabase:
    """Records by (kernel, signature, target) and model verdicts by (model, target,
    threads); load, save, merge, look up."""

    def __init__(self, records: Iterable[Record] = (), verdicts: Iterable[Verdict] = ()
                 ) -> None:
        self._records: dict[tuple[str, str, str], Record] = {}
        self._verdicts: dict[tuple[str, str, int], Verdict] = {}
        #: What errors call the database ("tuning database PATH" once loaded).
        self.source = "the tuning database"
        for r in records:
            self.add(r)
        for v in verdicts:
            self.add_verdict(v)

    def add(self, record: Record) -> None:
        """Add `record`, pooling with a record of the same key."""
        old = self._records.get(record.key)
        self._records[record.key] = record if old is None else old.merged(record)

    def add_verdict(self, verdict: Verdict) -> None:
        """Add `verdict`, replacing one of the same (model, target, threads); UsageError
        for a thread count a file could not hold (`load` refuses it)."""
        threads = verdict.threads
        if threads is not None and not _whole(1, MAX_VERDICT_THREADS)(threads):
            raise UsageError(f"a model verdict's threads must be 1 to {MAX_VERDICT_THREADS} "
                             f"or None (the runtime's default), got {shown(threads)}")
        self._verdicts[verdict.key] = verdict

    def merge(self, other: TuningDatabase) -> TuningDatabase:
        """A new database with both's records (timings of equal variants pooled) and
        verdicts (`other`'s replaces this one's of the same model, target and threads:
        the later check). A verdict is kept when records change under it: it names the
        params it checked, and a compile applies only those (`checked`), so a record
        merged in later never reaches a checked model unchecked."""
        return TuningDatabase([*self.records(), *other.records()],
                              [*self.verdicts(), *other.verdicts()])

    def verdicts(self) -> list[Verdict]:
        """Every verdict, sorted by key."""
        return [self._verdicts[k] for k in sorted(self._verdicts)]

    def checked(self, model: str, target: str) -> dict[tuple[str, str], Params] | None:
        """The params a model's verdicts on `target` accepted, by (kernel, signature):
        those every verdict (one per thread count) accepted with the same params; None
        when the model has no verdict there."""
        found = [v for v in self.verdicts() if v.model == model and v.target == target]
        if not found:
            return None
        others = [{c.key: _canonical(c.params) for c in v.accepted} for v in found[1:]]
        return {c.key: dict(c.params) for c in found[0].accepted
                if all(s.get(c.key) == _canonical(c.params) for s in others)}

    def records(self) -> list[Record]:
        """Every record, sorted by key."""
        return [self._records[k] for k in sorted(self._records)]

    def lookup(self, kernel: str, signature: str, target: str) -> Params | None:
        """The chosen params for a kernel on a target, None when untuned or the default won."""
        record = self._records.get((kernel, signature, target))
        return None if record is None else record.chosen

    def to_json(self) -> dict[str, Any]:
        """The document `save` writes."""
        def meas(m: Measurement, with_equal: bool) -> dict[str, Any]:
            out: dict[str, Any] = {"params": dict(m.params), "times_us": list(m.times_us)}
            if with_equal:
                out["equal"] = m.equal
                out["default_us"] = list(m.default_us)
            return out

        def checked(c: Checked) -> dict[str, Any]:
            return {"kernel": c.kernel, "signature": c.signature, "params": dict(c.params),
                    "reason": c.reason}

        return {"format": FORMAT, "version": VERSION, "records": [
            {"kernel": r.kernel, "signature": r.signature, "target": r.target,
             "default": meas(r.default, False),
             "candidates": [meas(c, True) for c in r.candidates],
             "chosen": None if r.chosen is None else dict(r.chosen)}
            for r in self.records()], "verdicts": [
            {"model": v.model, "target": v.target, "threads": v.threads,
             "accepted": [checked(c) for c in v.accepted],
             "rejected": [checked(c) for c in v.rejected],
             "untuned_us": list(v.untuned_us), "tuned_us": list(v.tuned_us)}
            for v in self.verdicts()]}

    def fingerprint(self) -> str:
        """sha256 of the canonical document: what a library's metadata records."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def save(self, path: str | Path) -> None:
        """Write atomically (a reader never sees half a file)."""
        path = Path(path)
        text = json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n"
        fd, tmp = tempfile.mkstemp(prefix=".tuning-", dir=path.parent or ".")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | Path) -> TuningDatabase:
        """Read and check a database file (at most MAX_DATABASE_BYTES, its size checked
        before it is read)."""
        name = f"tuning database {path}"
        data = read_capped(path, MAX_DATABASE_BYTES, name, FormatError)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FormatError(f"cannot read {name}: not UTF-8 text ({exc.reason} at byte "
                              f"{exc.start})") from None
        # json.loads recurses once per level: measure the nesting first
        depth = text_depth(text)
        if depth > MAX_DEPTH:
            raise FormatError(f"{name}: not JSON kiln reads: nested {depth} levels deep, "
                              f"deeper than {MAX_DEPTH}")
        try:
            doc = json.loads(text)
        except ValueError as exc:  # JSONDecodeError, or an int past Python's digit limit
            raise FormatError(f"{name}: not JSON: {str(exc)[:200]}") from None
        db = cls.from_json(doc, name)
        db.source = name
        return db

    @classmethod
    def from_json(cls, doc: Any, where: str = "tuning database") -> TuningDatabase:
        """Check a decoded document; FormatError names the first bad place."""
        _expect(isinstance(doc, dict), where, "an object")
        _expect(doc.get("format") == FORMAT, where, f"'format': {FORMAT!r}")
        version = doc.get("version")
        _expect(isinstance(version, int) and not isinstance(version, bool) and version >= 1,
                where, "'version': a positive integer")
        if version > VERSION:
            raise FormatError(f"{where}: version {version} is newer than this kiln reads "
                              f"({VERSION}); upgrade kiln")
        if version < OLDEST:
            raise FormatError(f"{where}: version {version} records unpaired timings, which "
                              f"the selection rule of version {VERSION} cannot compare "
                              "(kiln.tuning.select); run `kiln tune` again into a new file")
        records = doc.get("records")
        _expect(isinstance(records, list), where, "'records': a list")
        verdicts = doc.get("verdicts", [])
        _expect(version >= 3 or "verdicts" not in doc, where,
                "no 'verdicts' in a version 2 file (they came with version 3)")
        _expect(isinstance(verdicts, list), where, "'verdicts': a list")
        return cls((_record(r, f"{where}: records[{i}]") for i, r in enumerate(records)),
                   (_verdict(v, f"{where}: verdicts[{i}]") for i, v in enumerate(verdicts)))


def _expect(ok: bool, where: str, what: str) -> None:
    if not ok:
        raise FormatError(f"{where}: expected {what}")


def _record(doc: Any, where: str) -> Record:
    _expect(isinstance(doc, dict), where, "an object")
    for key in ("kernel", "signature", "target"):
        _expect(isinstance(doc.get(key), str) and bool(doc[key]), where,
                f"'{key}': a non-empty string")
    candidates = doc.get("candidates", [])
    _expect(isinstance(candidates, list), where, "'candidates': a list")
    return Record(doc["kernel"], doc["signature"], doc["target"],
                  _measurement(doc.get("default"), f"{where}.default", False),
                  [_measurement(c, f"{where}.candidates[{i}]", True)
                   for i, c in enumerate(candidates)])


def _verdict(doc: Any, where: str) -> Verdict:
    _expect(isinstance(doc, dict), where, "an object")
    for key in ("model", "target"):
        _expect(isinstance(doc.get(key), str) and bool(doc[key]), where,
                f"'{key}': a non-empty string")
    threads = doc.get("threads")
    _expect(threads is None or _whole(1, MAX_VERDICT_THREADS)(threads), where,
            "'threads': a positive integer or null")
    lists = {}
    for key in ("accepted", "rejected"):
        items = doc.get(key, [])
        _expect(isinstance(items, list), where, f"'{key}': a list")
        lists[key] = tuple(_checked(c, f"{where}.{key}[{i}]") for i, c in enumerate(items))
    samples = {}
    for key in ("untuned_us", "tuned_us"):
        times = doc.get(key, [])
        _expect(_timings(times), where, f"'{key}': a list of positive numbers")
        samples[key] = tuple(float(t) for t in times)
    _expect(len(samples["untuned_us"]) == len(samples["tuned_us"]), where,
            "'tuned_us': as many samples as 'untuned_us' (pairs)")
    return Verdict(doc["model"], doc["target"], threads, lists["accepted"],
                   lists["rejected"], samples["untuned_us"], samples["tuned_us"])


def _checked(doc: Any, where: str) -> Checked:
    _expect(isinstance(doc, dict), where, "an object")
    for key in ("kernel", "signature"):
        _expect(isinstance(doc.get(key), str) and bool(doc[key]), where,
                f"'{key}': a non-empty string")
    params, reason = doc.get("params"), doc.get("reason", "")
    _expect(isinstance(params, dict) and all(isinstance(k, str) for k in params), where,
            "'params': an object")
    check_param_values(params, f"{where}.params")
    _expect(isinstance(reason, str), where, "'reason': a string")
    return Checked(doc["kernel"], doc["signature"], params, reason)


def _measurement(doc: Any, where: str, with_equal: bool) -> Measurement:
    _expect(isinstance(doc, dict), where, "an object")
    params, times = doc.get("params"), doc.get("times_us")
    _expect(isinstance(params, dict) and all(isinstance(k, str) for k in params), where,
            "'params': an object")
    check_param_values(params, f"{where}.params")
    _expect(_timings(times) and len(times) > 0, where,
            "'times_us': a non-empty list of positive numbers")
    equal = doc.get("equal", True)
    _expect(isinstance(equal, bool) and (with_equal or equal), where, "'equal': a boolean")
    paired = doc.get("default_us", [] if not with_equal else None)
    _expect(_timings(paired) and (not with_equal or len(paired) == len(times))
            and (with_equal or not paired), where,
            "'default_us': the default's timings of the same blocks, as many as 'times_us'"
            if with_equal else "no 'default_us'")
    return Measurement(params, tuple(float(t) for t in times), equal,
                       tuple(float(t) for t in paired))


def _timings(times: Any) -> bool:
    return isinstance(times, list) and all(
        isinstance(t, int | float) and not isinstance(t, bool) and 0 < t < 1e12
        for t in times)
