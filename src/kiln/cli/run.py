"""`kiln run`: load a library, call one function on inputs from files (or filled), report."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from kiln.cli import profiling
from kiln.errors import CallError, UsageError
from kiln.runtime import load_module
from kiln.runtime.abi import INT64_MAX, numpy_dtype
from kiln.runtime.dim_binding import eval_dim_text
from kiln.runtime.profile import not_profiled


def _signature(lib: Any, function: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(inputs, outputs) of `function` from the library metadata: name, shape, dtype each."""
    fn_meta = (lib.metadata or {}).get("functions", {}).get(function)
    if fn_meta is None:
        names = ", ".join(lib.function_names())
        raise UsageError(f"no function {function!r} in the library; it has: {names}")
    params = fn_meta.get("params", [])
    inputs = [p for p in params if not p.get("written")]
    outputs = list(fn_meta.get("results", [])) + [p for p in params if p.get("written")]
    return inputs, outputs


def parse_sizes(items: Sequence[str]) -> dict[str, int]:
    """`--size seq=7` values: the size of each named dimension variable."""
    sizes: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            size = int(value)
        except ValueError:
            size = -1
        if not sep or not name or not 0 <= size <= INT64_MAX:
            raise UsageError(f"--size expects NAME=N with 0 <= N <= {INT64_MAX} (a dimension "
                             f"variable of the function's inputs), got {item!r}")
        sizes[name] = size
    return sizes


def gather_inputs(items: Sequence[str], npz: str | None, fill: str | None,
                  inputs: list[dict[str, Any]], seed: int = 0,
                  sizes: dict[str, int] | None = None) -> dict[str, Any]:
    """The named arrays for the call, from --input NAME=FILE, --inputs FILE.npz and --fill
    (symbolic dimensions of filled inputs take their `sizes`, from --size)."""
    names = [p["name"] for p in inputs]
    expected = ", ".join(names) or "(none)"
    files: dict[str, str] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            if len(names) != 1:
                raise UsageError(f"--input {item!r} needs a name: NAME=FILE.npy, where NAME is "
                                 f"one of the function's inputs: {expected}")
            name, path = names[0], item
        files[name] = path
    given: dict[str, Any] = {}
    if npz is not None:
        with _reading("--inputs ", npz), np.load(npz, allow_pickle=False) as archive:
            given.update({k: archive[k] for k in archive.files})
    unknown = sorted((set(given) | set(files)) - set(names))
    if unknown:
        raise UsageError(f"unknown input {', '.join(map(repr, unknown))}; "
                         f"the function's inputs are: {expected}")
    for name, path in files.items():
        with _reading(f"--input {name}=", path):
            given[name] = np.load(path, allow_pickle=False)
    rng = np.random.default_rng(seed)
    for p in inputs:
        if p["name"] in given:
            continue
        if fill is None:
            raise UsageError(f"input {p['name']!r} not given: pass --input "
                             f"{p['name']}=FILE.npy, --inputs FILE.npz or --fill random|zeros")
        shape = p.get("shape") or []
        if not all(isinstance(d, int) for d in shape):
            try:
                shape = [d if isinstance(d, int) else eval_dim_text(d, sizes or {})
                         for d in shape]
            except CallError:
                text = "[" + ", ".join(str(d) for d in p["shape"]) + "]"
                raise UsageError(f"input {p['name']!r} has the symbolic shape {text}: give "
                                 "each dimension's size to --fill it (--size NAME=N) or the "
                                 "input in a file") from None
        given[p["name"]] = _filled(p["name"], tuple(shape), numpy_dtype(p["dtype"]), fill, rng)
    return given


@contextmanager
def _reading(option: str, path: str) -> Iterator[None]:
    """Name the option and file in the error of a file numpy cannot read."""
    def fail(reason: str) -> UsageError:
        return UsageError(f"{option}{path}: cannot read it as a numpy file: {reason}")

    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except OSError as exc:
        raise fail(exc.strerror or str(exc)) from None
    if not head.startswith((b"\x93NUMPY", b"PK")):  # .npy magic, .npz is a zip
        raise fail(f"not a .npy or .npz file (it starts with {head!r})")
    try:
        yield
    except MemoryError:  # the header declares more than this host can hold
        raise fail("not enough memory for the array its header declares") from None
    except (OSError, ValueError, EOFError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise fail(reason) from None


def _filled(name: str, shape: tuple[int, ...], dtype: np.dtype[Any], fill: str,
            rng: np.random.Generator) -> Any:
    """Input `name` made up by --fill; UsageError naming it if it cannot be allocated."""
    try:
        if fill == "zeros":
            return np.zeros(shape, dtype)
        if dtype == np.bool_:
            return rng.integers(0, 2, shape).astype(dtype)
        if np.issubdtype(dtype, np.integer):
            return rng.integers(0, 10, shape).astype(dtype)
        return rng.standard_normal(shape).astype(dtype)
    except (MemoryError, ValueError, OverflowError) as exc:
        why = "not enough memory" if isinstance(exc, MemoryError) else "too large for an array"
        nbytes = math.prod(shape) * dtype.itemsize
        raise UsageError(f"--fill: input {name!r} of shape {list(shape)} ({dtype.name}) is "
                         f"{nbytes} bytes, {why}; choose smaller --size values") from None


def summary(name: str, value: Any) -> str:
    """One line: name, shape, dtype, and min/max/mean of a non-empty numeric array."""
    arr = np.asarray(value)
    line = f"{name}: shape {tuple(arr.shape)} dtype {arr.dtype}"
    if arr.size and (np.issubdtype(arr.dtype, np.number) or arr.dtype.kind in "fb"
                     or arr.dtype.name.startswith(("bfloat", "float8"))):
        wide = arr.astype(np.float64)
        line += f"  min {wide.min():.6g} max {wide.max():.6g} mean {wide.mean():.6g}"
    return line


def latency_table(times_ms: list[float], warmup: int) -> str:
    """Median, p90 and min of the timed calls (warm-up calls excluded)."""
    t = np.asarray(times_ms)
    return (f"latency over {len(t)} calls ({warmup} warm-up excluded), ms:\n"
            f"  median {np.median(t):10.4f}\n  p90    {np.percentile(t, 90):10.4f}\n"
            f"  min    {t.min():10.4f}")


def cmd_run(path: str, function: str, items: Sequence[str], npz: str | None, fill: str | None,
            output: str | None, outputs_npz: str | None, repeat: int, warmup: int,
            profile: bool = False, size_items: Sequence[str] = (),
            profile_json: str | None = None, trace: str | None = None,
            profile_by: str = "op,group", top: int | None = None) -> str:
    """Load `path`, call `function` once (then `warmup` + `repeat` more times), the report.

    With `profile`, `profile_json` or `trace` (a library built with profiling timers)
    the kernel timers are read around each of the `repeat` timed calls (or the first
    call when `repeat` is 0): `profile` prints them aggregated by `profile_by`
    (kiln.cli.profiling: the `top` longest rows, by default as many as hold 95% of the
    time, and an "other" row), `profile_json`
    and `trace` write them to files."""

    if repeat < 0 or warmup < 0:
        raise UsageError("--repeat and --warmup take counts >= 0")
    if top is not None and top < 1:
        raise UsageError(f"--top takes a count >= 1, got {top}")
    by = profiling.parse_by(profile_by)
    profiling_on = profile or profile_json is not None or trace is not None
    lib = load_module(path)
    if profiling_on and not (lib.metadata or {}).get("profile"):
        raise not_profiled(path)
    ins, outs = _signature(lib, function)
    if output is not None and len(outs) != 1:
        raise UsageError(f"--output takes one array but {function} has {len(outs)} "
                         "outputs; use --outputs FILE.npz")
    fn = lib[function]
    args = gather_inputs(items, npz, fill, ins, sizes=parse_sizes(size_items))
    if profiling_on:
        profiling.recording_for(lib, function)  # a function without timers fails first
    result = fn(**args)
    values = list(result) if isinstance(result, tuple) else [result]
    names = [o.get("name") or f"output{k}" for k, o in enumerate(outs)]
    if len(names) != len(values):
        names = [f"output{k}" for k in range(len(values))]
    named = dict(zip(names, values))
    lines = [summary(n, v) for n, v in named.items()]
    if output is not None:
        np.save(output, np.asarray(values[0]))
    if outputs_npz is not None:
        arrays: dict[str, Any] = {n: np.asarray(v) for n, v in named.items()}
        np.savez(outputs_npz, **arrays)
    if repeat:
        for _ in range(warmup):
            fn(**args)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn(**args)
            times.append((time.perf_counter() - t0) * 1e3)
        lines.append(latency_table(times, warmup))
    if profiling_on:
        # A second pass over the timed calls: reading the counters after each call
        # must not count in the latencies above.
        rec = profiling.record(lib, function, lambda: fn(**args), repeat)
        if profile:
            lines.append(profiling.table(rec, by, top))
        if profile_json is not None:
            profiling.write_json(profile_json, profiling.to_json(rec), "--profile-json")
            lines.append(f"wrote {profile_json}: the profile as JSON")
        if trace is not None:
            profiling.write_json(trace, profiling.trace(rec), "--trace", indent=None)
            lines.append(f"wrote {trace}: a Chrome trace (open it in ui.perfetto.dev or "
                         "chrome://tracing)")
    return "\n".join(lines)
