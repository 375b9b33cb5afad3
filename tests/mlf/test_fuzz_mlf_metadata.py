"""Fuzzing MLF metadata.json: hundreds of mutants inside a real exported archive.

Each mutant replaces metadata.json of a CNN exported for `c` (resealed: its
`checksums.metadata_sha256` recomputed, unless the mutant changes `checksums`
itself) and is loaded and called in a child process (mlf_mutants.run_in_workers).
Every one must either load and give exactly the original output, or be refused
with a KilnError subclass: never another exception, never a signal, never a
silent wrong answer.
`-s` prints the counts (docs/security.md quotes a run).

`make test` runs a sample: every category, at most `PER_CATEGORY` mutants of each
(chosen with the same seed); `KILN_FULL_FUZZ=1` runs all of them.
"""

from __future__ import annotations

import copy
import json
import os
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlf_mutants import archive_files, run_in_workers, write_archive
from test_mlf_trust import cnn_mlf  # noqa: F401 - the fixture

import kiln

SEED = 20261123
PER_CATEGORY = 12
# Replacements of one value: wrong types, extreme ints, odd strings.
ODD_VALUES: list[Any] = [None, True, False, "x", "", 1.5, -1, 0, 2**31, 2**63, 2**64,
                         -(2**63) - 1, 1e308, [], {}, [1], {"a": 1}, "\u00e9\u202e\U0001f600",
                         "a" * 5000, "../../etc/passwd"]
DTYPES = ["float64", "float16", "int8", "int32", "uint8", "bool", "bfloat16", "complex64",
          "float", "f4", "", "Float32"]

Path_ = tuple[Any, ...]


def _paths(value: Any, prefix: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    """Every (path, value) in a JSON value, containers included, root excluded."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield (*prefix, k), v
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield (*prefix, i), v
            yield from _paths(v, (*prefix, i))


def _with(meta: dict[str, Any], path: Path_, value: Any = ..., delete: bool = False
          ) -> dict[str, Any]:
    out = copy.deepcopy(meta)
    node: Any = out
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


def _deep(meta: dict[str, Any], path: Path_, depth: int, kind: str) -> bytes:
    """metadata.json with a value nested `depth` levels deep at `path` (written as text:
    json.dumps itself recurses per level)."""
    text = json.dumps(_with(meta, path, "__DEEP__"))
    open_, close = ("[", "]") if kind == "list" else ('{"a": ', "}")
    return text.replace('"__DEEP__"', open_ * depth + "1" + close * depth).encode()


def mutants(meta: dict[str, Any], rng: random.Random) -> list[tuple[str, bytes]]:
    """(category, metadata.json bytes) for each mutant."""
    out: list[tuple[str, bytes]] = []

    def add(category: str, value: Any) -> None:
        # A mutant outside `checksums` is resealed (its metadata_sha256 recomputed), so
        # that the checks behind the checksums meet it; one inside is refused by them.
        if isinstance(value, dict) and value.get("checksums") == meta["checksums"]:
            value = {**value, "checksums": {**meta["checksums"],
                                            "metadata_sha256": kiln.mlf.metadata_digest(value)}}
        out.append((category, value if isinstance(value, bytes) else
                    json.dumps(value, ensure_ascii=False).encode()))

    paths = list(_paths(meta))
    # Wrong types and extreme values: every path gets a few, chosen at random.
    for path, _ in paths:
        for value in rng.sample(ODD_VALUES, 3):
            add("wrong type or value", _with(meta, path, value))
    for path, value in paths:
        if isinstance(value, int) and not isinstance(value, bool):
            for new in (value + 1, value - 1, -value - 1, value * 2, 2**62):
                add("int changed", _with(meta, path, new))
        if isinstance(path[-1], str):
            add("missing key", _with(meta, path, delete=True))
        if isinstance(value, dict):
            add("extra key", _with(meta, (*path, "zz_extra"), {"x": [1, "y"]}))
    add("extra key", {**meta, "zz_extra": 1})
    for role in ("inputs", "outputs"):
        for i, tensor in enumerate(meta[role]):
            for dtype in DTYPES:
                add("dtype", _with(meta, (role, i, "dtype"), dtype))
            shape = tensor["shape"]
            for new_shape in ([*shape, 1], shape[:-1], [0] * len(shape), shape[::-1],
                              [d * 2 for d in shape], [], [1] * 65, [*shape[:-1], 2**40]):
                add("shape", _with(meta, (role, i, "shape"), new_shape))
            for name in ("", "y" if role == "inputs" else "x", "\u00e9", "x" * 2000):
                add("names", _with(meta, (role, i, "name"), name))
    swapped = copy.deepcopy(meta)
    swapped["inputs"], swapped["outputs"] = swapped["outputs"], swapped["inputs"]
    add("names", swapped)
    for model_name in ("cnn2", "CNN", "kiln_cnn", "1cnn", "cnn;rm", "c\u00e9", "cnn\x00"):
        add("names", {**meta, "model_name": model_name})
    for prefix in ("kiln", "x_", "", "kiln_\u00e9", "a b"):
        add("names", {**meta, "prefix": prefix})
    for depth in (70, 500, 5000):
        for kind in ("list", "dict"):
            add("deep nesting", _deep(meta, ("target",), depth, kind))
            add("deep nesting", _deep(meta, ("outputs", 0, "shape"), depth, kind))
    text = json.dumps(meta).encode()
    for cut in sorted({0, 1, len(text) // 2, len(text) - 1} |
                      {rng.randrange(len(text)) for _ in range(16)}):
        add("truncated JSON", text[:cut])
    version = f'"version": {meta["version"]}'.encode()
    for raw in (b"[]", b"null", b"\xff\xfe{}", b"\xef\xbb\xbf" + text,
                text.replace(version, b'"version": NaN'),
                text.replace(version, version + b", " + version),
                text.replace(b'"cnn"', b'"c\\ud800"', 1), text + b"garbage", b" " * 100):
        add("not JSON", raw)
    return out


def sample(cases: list[tuple[str, bytes]], rng: random.Random, per_category: int
           ) -> list[tuple[str, bytes]]:
    """At most `per_category` of each category's mutants, in their original order."""
    chosen: set[int] = set()
    for category in dict.fromkeys(c for c, _ in cases):
        index = [i for i, (c, _) in enumerate(cases) if c == category]
        chosen |= set(rng.sample(index, min(per_category, len(index))))
    return [case for i, case in enumerate(cases) if i in chosen]


@pytest.mark.slow
def test_fuzz_mlf_metadata(cnn_mlf: tuple[Path, Any, Any], tmp_path: Path) -> None:  # noqa: F811
    archive, x, y = cnn_mlf
    files = archive_files(archive)
    meta = json.loads(files["metadata.json"])
    rng = random.Random(SEED)
    cases = mutants(meta, rng)
    assert len(cases) >= 300
    if not os.environ.get("KILN_FULL_FUZZ"):
        cases = sample(cases, rng, PER_CATEGORY)
        assert len(cases) >= 8 * PER_CATEGORY
    paths = []
    for i, (_, data) in enumerate(cases):
        paths.append(write_archive(tmp_path / f"m{i:04d}.tar", {**files, "metadata.json": data}))
    results = run_in_workers(paths, x, y, tmp_path)

    table: dict[str, Counter[str]] = {}
    for (category, _), path in zip(cases, paths):
        kind = results[path][0]
        outcome = {"same": "identical", "kiln": "refused"}.get(kind.split(":")[0], kind)
        table.setdefault(category, Counter())[outcome] += 1
    total = sum(table.values(), Counter())
    report = "\n".join(f"{category:22s} " + "  ".join(f"{k}={n}" for k, n in sorted(c.items()))
                       for category, c in table.items())
    errors = Counter(kind.split(":")[1] for kind, _ in results.values() if kind.startswith("kiln:"))
    print(f"\n{len(cases)} metadata.json mutants: {total['identical']} identical, "
          f"{total['refused']} refused ({', '.join(f'{n} {e}' for e, n in errors.items())})"
          f"\n{report}")
    bad = {p.name: results[p] for p in paths
           if results[p][0] not in ("same",) and not results[p][0].startswith("kiln:")}
    assert not bad, f"mutants that crashed, changed the answer or raised non-kiln errors: {bad}"
