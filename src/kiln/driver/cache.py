"""The on-disk compile cache: codegen output keyed by what determines it.

Key: SHA-256 over the lowered module's structural fingerprint, the target's
fingerprint, the kiln version and a hash of kiln's own sources, the llvmlite
version, the symbol prefix and the codegen's identity.
Value: the ArtifactSet as a `.tar` archive (`kiln.artifact.archive`), written
atomically (temporary file + rename) so concurrent builds never see half a
file. In-memory artifacts are never cached. A damaged entry is deleted and
counts as a miss.

Location: `$KILN_CACHE_DIR`, else `~/.cache/kiln`. Disable with
`KILN_CACHE=0` or `PassContext(config={"kiln.cache": False})`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.errors import FormatError

if TYPE_CHECKING:
    from kiln.artifact import ArtifactSet

CACHE_FORMAT = 1
_OFF = ("0", "off", "false", "no")


@dataclass
class CacheStats:
    """Counters of this process's cache lookups (tests assert hits with these)."""

    hits: int = 0
    misses: int = 0
    stores: int = 0
    errors: int = 0

    def reset(self) -> None:
        self.hits = self.misses = self.stores = self.errors = 0


STATS = CacheStats()


def cache_dir() -> Path:
    """The cache directory: $KILN_CACHE_DIR or ~/.cache/kiln."""
    env = os.environ.get("KILN_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.path.expanduser("~")) / ".cache" / "kiln"


def cache_enabled(config: dict[str, Any] | None = None) -> bool:
    """False when KILN_CACHE is off-like or the PassContext config says `kiln.cache: False`."""
    if os.environ.get("KILN_CACHE", "").strip().lower() in _OFF:
        return False
    return bool((config or {}).get("kiln.cache", True))


def cache_key(*, ir_fingerprint: str, target_fingerprint: str, prefix: str,
              codegen: str) -> str:
    """The hex key of one build."""
    from kiln import __version__

    fields = {"format": CACHE_FORMAT, "ir": ir_fingerprint, "target": target_fingerprint,
              "kiln": __version__, "kiln_source": kiln_source_fingerprint(),
              "llvmlite": _version("llvmlite"), "prefix": prefix, "codegen": codegen}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


@functools.cache
def kiln_source_fingerprint() -> str:
    """SHA-256 over kiln's own Python sources (once per process).

    The version number alone would serve stale objects to anyone running kiln
    from a source checkout while the codegens change under the same version.
    """
    import kiln

    root = Path(kiln.__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def entry_path(key: str) -> Path:
    """Where the archive of cache entry `key` lives."""
    return cache_dir() / "artifacts" / key[:2] / f"{key}.tar"


def lookup(key: str) -> ArtifactSet | None:
    """The cached ArtifactSet for `key`, or None (a damaged entry is removed)."""
    from kiln.artifact.archive import read_tar

    path = entry_path(key)
    if not path.is_file():
        STATS.misses += 1
        return None
    try:
        artifacts, _meta = read_tar(path)
    except (FormatError, OSError):
        STATS.errors += 1
        STATS.misses += 1
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    STATS.hits += 1
    return artifacts


def store(key: str, artifacts: ArtifactSet, metadata: dict[str, Any]) -> bool:
    """Save `artifacts` under `key`; False (and nothing written) if any is in-memory.

    A cache that cannot be written (read-only home, full disk) never fails a build.
    """
    from kiln.artifact.archive import write_tar

    if not artifacts.serializable:
        return False
    path = entry_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_tar(path, artifacts, metadata)  # temp file + os.replace
    except OSError:
        STATS.errors += 1
        return False
    STATS.stores += 1
    return True
