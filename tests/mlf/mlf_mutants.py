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


def with_metadata(archive: Path, out: Path, metadata: bytes | Callable[[dict[str, Any]], Any]
                  ) -> Path:
    """A copy of `archive` whose metadata.json is `metadata` (bytes) or edited in place by it."""
    files = archive_files(archive)
    if callable(metadata):
        meta = json.loads(files["metadata.json"])
        metadata(meta)
        files["metadata.json"] = json.dumps(meta).encode()
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
