"""One bit flipped anywhere in a Model Library Format archive is refused with a
KilnError, or leaves what `load` builds from exactly as exported.

FLIPS flips (seed SEED) over the archive of a tiny model (`mlf_mutants.addrelu`),
spread over every region of the tar: each member's header, data (twice the share)
and padding, and the end-of-archive blocks. Each flipped archive goes through
`kiln.mlf.extract_checked`, which is all `kiln.mlf.load` does before it runs the
compiler: the tar, metadata.json's schema, the SHA-256s of metadata.json and of
every member, the files metadata.json names. So a flip in a C source or a header
is refused by its checksum before anything is compiled. A flip that passes must
leave every extracted file and metadata.json's content as exported: `load` then
builds the same library from the same inputs (the object cache even reuses the
objects), and the test loads a few of those archives and compares their answers
bit for bit. The checks run no native code (tarfile, json, hashlib), so a flip
cannot crash the process: no child process is needed. `-s` prints the counts
(docs/security.md quotes a run); bench/mlf_flips.py runs more flips.
"""

from __future__ import annotations

import io
import shutil
import tarfile
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mlf_mutants import addrelu, archive_files

import kiln

FLIPS = 300
SEED = 20261127
# Archives that passed the checks, loaded and called (cheap: only the link runs).
LOADED = 3

Region = tuple[str, str, int, int]  # (member or "", kind, start, end) in the tar


def regions(tar_bytes: bytes) -> list[Region]:
    """Every non-empty region of a tar: each member's header (PAX records included),
    data and padding to 512 bytes, then the end-of-archive blocks."""
    out: list[Region] = []
    end = 0
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tar:
        for info in tar.getmembers():
            data_end = info.offset_data + info.size
            end = -(-data_end // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
            out += [(info.name, "header", info.offset, info.offset_data),
                    (info.name, "data", info.offset_data, data_end),
                    (info.name, "padding", data_end, end)]
    out.append(("", "end of archive", end, len(tar_bytes)))
    return [r for r in out if r[3] > r[2]]


def schedule(spans: list[Region], count: int, seed: int) -> list[tuple[Region, int, int]]:
    """(region, byte, bit) of `count` flips, the regions taken in turn (data twice)."""
    rng = np.random.default_rng(seed)
    slots = [r for r in spans for _ in range(2 if r[1] == "data" else 1)]
    return [(region, int(rng.integers(region[2], region[3])), int(rng.integers(8)))
            for region in (slots[i % len(slots)] for i in range(count))]


def outcome(path: Path, tree: Path, files: dict[str, bytes], meta: dict[str, Any]
            ) -> tuple[str, str]:
    """("refused" | "identical" | "changed" | "warned" | "other", detail) of one archive:
    "identical" when every file and metadata.json's content are the exported ones."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            got = kiln.mlf.extract_checked(path, tree)
        except kiln.KilnError as exc:
            return "refused", f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # what the test reports as a bug
            return "other", repr(exc)
    if caught:
        return "warned", str(caught[0].message)
    held = {p.relative_to(tree).as_posix(): p.read_bytes() for p in tree.rglob("*")
            if p.is_file() and p.name != "metadata.json"}
    same = got == meta and held == {k: v for k, v in files.items() if k != "metadata.json"}
    return ("identical" if same else "changed"), ""


def fuzz(archive: Path, work: Path, count: int, seed: int
         ) -> tuple[list[tuple[Region, int, int, str, str]], list[Path]]:
    """Flip each bit of `schedule` in a copy of `archive`: (region, byte, bit, outcome,
    detail) per flip, and the copies whose outcome was "identical" (at most LOADED)."""
    original = archive.read_bytes()
    files = archive_files(archive)
    meta = kiln.mlf.extract_checked(archive, work / "original")
    results, kept = [], []
    for i, (region, byte, bit) in enumerate(schedule(regions(original), count, seed)):
        flipped = bytearray(original)
        flipped[byte] ^= 1 << bit
        path = work / f"flip{i}.tar"
        path.write_bytes(flipped)
        kind, detail = outcome(path, work / "tree", files, meta)
        shutil.rmtree(work / "tree", ignore_errors=True)
        results.append((region, byte, bit, kind, detail))
        if kind == "identical" and len(kept) < LOADED:
            kept.append(path)
        else:
            path.unlink()
    return results, kept


# What refused a flip, by a phrase of its message (the first that matches).
# A damaged tar header after the first ends the archive there (tarfile reads it as the
# end), so the members after it are missing.
REASONS = [("parameter tensor '", "weight checksum mismatch"),
           ("is damaged", "checksum mismatch"), ("which is not in the archive", "member lost"),
           ("metadata.json: missing", "member lost"), ("tar archive", "unreadable tar"),
           ("has no checksum", "unlisted member"), ("metadata.json: ", "invalid metadata.json")]


def reason(detail: str) -> str:
    """The check that refused a flip, from its error message."""
    return next((name for phrase, name in REASONS if phrase in detail), detail.split(":")[0])


def summary(results: list[tuple[Region, int, int, str, str]]) -> str:
    """The counts: in all, per kind of region, and the errors of the refusals."""
    total = Counter(kind for *_, kind, _ in results)
    by_kind: dict[str, Counter[str]] = {}
    for (_, where, _, _), _, _, kind, _ in results:
        by_kind.setdefault(where, Counter())[kind] += 1
    reasons = Counter(reason(d) for *_, kind, d in results if kind == "refused")
    lines = [f"{len(results)} flips: " + ", ".join(f"{n} {k}" for k, n in sorted(total.items()))
             + f" (refused: {', '.join(f'{n} {r}' for r, n in reasons.most_common())})"]
    lines += [f"  {where:15s} " + "  ".join(f"{k}={n}" for k, n in sorted(c.items()))
              for where, c in by_kind.items()]
    return "\n".join(lines)


def weight_flips(results: list[tuple[Region, int, int, str, str]]) -> tuple[int, dict[str, int]]:
    """(flips in a `.params` member's data, refusals per weight they named): since MLF
    version 4 each one names the weight it hit (metadata.json's `parameters`)."""
    hits = [d for r, _, _, kind, d in results
            if r[1] == "data" and r[0].startswith("parameters/") and r[0].endswith(".params")]
    named = Counter(d.split("parameter tensor ")[1].split(" (")[0] for d in hits
                    if "parameter tensor " in d)
    return len(hits), dict(named)


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mlf_flips") / "addrelu.tar"
    return kiln.export_model_library_format(addrelu(), path, model_name="addrelu")


def _answer(path: Path, x: np.ndarray) -> np.ndarray:
    model = kiln.mlf.load(path)
    try:
        return model(x)[0]
    finally:
        model.close()


def test_every_flip_is_refused_or_changes_nothing(archive: Path, tmp_path: Path) -> None:
    results, kept = fuzz(archive, tmp_path, FLIPS, SEED)
    report = summary(results)
    print("\n" + report)
    bad = [(r, byte, bit, kind, detail) for r, byte, bit, kind, detail in results
           if kind not in ("refused", "identical")]
    assert not bad, f"{report}\nflips neither refused nor harmless: {bad[:5]}"
    # Every member's data was hit, and damage to it refused.
    refused = {r[0] for r, _, _, kind, _ in results if r[1] == "data" and kind == "refused"}
    assert refused == set(archive_files(archive)), report
    # A flipped bit of the weight is refused naming it.
    count, named = weight_flips(results)
    assert count > 0 and named == {"'b'": count}, (count, named)
    # What passed answers as the archive does (bit for bit).
    x = np.array([1.0, 0.5, -3.0, 0.1], np.float32)
    want = _answer(archive, x)
    assert kept, report
    for path in kept:
        np.testing.assert_array_equal(_answer(path, x), want)
