"""Load Model Library Format archives in child processes and classify what happens.

Each archive is loaded with `kiln.mlf.load` and called on one input in a worker
process (many archives per worker). Outcomes:
- `same`: it loaded and gave exactly the reference output;
- `changed`: it ran and gave another output (a silent wrong answer);
- `kiln:<Type>`: a KilnError subclass was raised (a clean refusal);
- `other:<Type>`: any other exception (a bug: every refusal must be a KilnError);
- `crash:<signal>` / `hang`: the worker died or did not finish; only the archive it
  was on is charged, the rest of its batch runs in a new worker.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import kiln
from kiln.artifact.integrity import CHUNK_SIZE, chunk_digests
from support.graphs import GraphBuilder
from support.processes import run_isolated

BATCH = 40
#: One archive's load and call takes well under a second; a damaged one that loops is
#: stopped by the worker's watchdog after this (support.processes.run_isolated).
ARCHIVE_S = 30

WORKER = r"""
import json, sys
import numpy as np
import kiln
x = np.load(sys.argv[1])
ref = np.load(sys.argv[2])
for path in sys.argv[4:]:
    watch(float(sys.argv[3]))
    try:
        model = kiln.mlf.load(path)
        try:
            (out,) = model(x)
        finally:
            model.close()
        kind = "same" if out.shape == ref.shape and out.dtype == ref.dtype and \
            np.array_equal(out, ref, equal_nan=True) else "changed"
        detail = ""
    except kiln.KilnError as exc:
        kind, detail = "kiln:" + type(exc).__name__, str(exc)
    except Exception as exc:  # noqa: BLE001 - what the parent reports as a bug
        kind, detail = "other:" + type(exc).__name__, repr(exc)
    unwatch()
    print(json.dumps([path, kind, detail[-300:]]), flush=True)
"""


# The model of every golden MLF archive (tests/golden/make_mlf_golden.py) and of the flip
# fuzz: y = relu(x + ADDRELU_BIAS), x of 4 float32s.
ADDRELU_BIAS = np.array([0.5, -1, 2, -0.25], np.float32)


def addrelu() -> kiln.driver.executable.Executable:
    """y = relu(x + ADDRELU_BIAS), compiled for `c`: an archive of about 100 KB."""
    g = GraphBuilder()
    g.node("Add", ["x", "b"], ["s"])
    g.node("Relu", ["s"], ["y"])
    g.consts({"b": ADDRELU_BIAS})
    g.input("x", [4])
    g.output("y", [4])
    return kiln.compile(kiln.frontend.from_onnx(g.model(name="addrelu")), "c")


def archive_files(archive: Path) -> dict[str, bytes]:
    """The regular files of a (trusted, test-made) tar by name."""
    with tarfile.open(archive) as tar:
        out = {}
        for m in tar.getmembers():
            f = tar.extractfile(m) if m.isfile() else None
            if f is not None:
                out[m.name] = f.read()
    return out


def write_archive(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def resealed(files: dict[str, bytes]) -> dict[str, bytes]:
    """`files` with metadata.json's `checksums` recomputed as the writer does (every
    member's chunk SHA-256s, then metadata.json's own): an archive edited on purpose that
    the checksums do not refuse, so that the checks behind them are what a test meets."""
    meta = json.loads(files["metadata.json"])
    return {**files, "metadata.json": json.dumps(sealed(meta, files)).encode()}


def sealed(meta: dict[str, Any], files: dict[str, bytes], chunk: int = CHUNK_SIZE
           ) -> dict[str, Any]:
    """`meta` with `checksums` recomputed for `files` (metadata.json among them ignored),
    in chunks of `chunk` bytes."""
    meta = {**meta, "checksums": {
        "chunk_size": chunk,
        "chunk_sha256": {name: chunk_digests(data, chunk).hex()
                         for name, data in sorted(files.items()) if name != "metadata.json"}}}
    meta["checksums"]["metadata_sha256"] = kiln.mlf.metadata_digest(meta)
    return meta


def with_metadata(archive: Path, out: Path, metadata: bytes | Callable[[dict[str, Any]], Any]
                  ) -> Path:
    """A copy of `archive` whose metadata.json is `metadata` (bytes, as it is) or edited in
    place by it (then resealed: `sealed`)."""
    files = archive_files(archive)
    if callable(metadata):
        meta = json.loads(files["metadata.json"])
        metadata(meta)
        files["metadata.json"] = json.dumps(sealed(meta, files)).encode()
    else:
        files["metadata.json"] = metadata
    return write_archive(out, files)


def run_in_workers(archives: list[Path], x: np.ndarray, ref: np.ndarray, folder: Path,
                   timeout: float = 600) -> dict[Path, tuple[str, str]]:
    """(outcome, detail) per archive (see the module docstring); `timeout` bounds a
    worker's batch, ARCHIVE_S one archive."""
    x_file, ref_file = folder / "mlf_x.npy", folder / "mlf_ref.npy"
    np.save(x_file, x)
    np.save(ref_file, ref)
    results = run_isolated(WORKER, [str(x_file), str(ref_file)], archives, batch=BATCH,
                           item_s=ARCHIVE_S, batch_s=timeout)
    return {p: (outcome[0], outcome[1] if len(outcome) > 1 else "")
            for p, outcome in results.items()}
