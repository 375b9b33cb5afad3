"""Private temporary directories that never outlive their process by more than one load.

A loaded library's file must stay on disk while it is mapped, so a module keeps its
private directory (a `kiln-load-*`, `kiln-session-*`, ...) until it is closed or
collected. A process that is killed (SIGKILL, the OOM killer, a timeout) or leaves by
`os._exit` runs no finalizer, and its directory would stay in the temporary directory
for good. So each private directory holds an owner file locked with `flock` for as long
as the directory is in use: the kernel drops the lock when the last descriptor of it
closes, however the process ended. The first private directory a process makes sweeps
the temporary directory for kiln directories whose owner file it can lock, i.e. whose
owner is gone, and removes them. `flock` holds across PID namespaces on one
filesystem, so a live directory of another container sharing /tmp is never taken for a
stale one; a directory without an owner file (another program's, an older kiln's) is
left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import threading
from pathlib import Path

OWNER_FILE = ".kiln-owner"
_FAMILY = "kiln-"  # the prefix of every directory this module makes and sweeps

_owners: dict[str, int] = {}  # directory -> its locked owner file's descriptor
_lock = threading.Lock()
_swept = False


def make_private_dir(prefix: str) -> str:
    """A fresh directory `{tempdir}/{prefix}XXXXXXXX` owned by this process until
    `remove_private_dir`; the first call also removes the stale ones of dead processes."""
    assert prefix.startswith(_FAMILY), prefix  # the sweep finds only this family
    _sweep_once()
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        fd = _locked_owner_file(path)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    with _lock:
        _owners[path] = fd
    return path


def remove_private_dir(path: str) -> None:
    """Remove `path` (made by make_private_dir) and release its owner lock."""
    shutil.rmtree(path, ignore_errors=True)
    with _lock:
        fd = _owners.pop(path, None)
    if fd is not None:
        os.close(fd)


def _locked_owner_file(path: str) -> int:
    """Create the owner file locked: locked under a temporary name first, then renamed,
    so that a sweeper never finds the owner file unlocked (the lock is the inode's)."""
    fd, staged = tempfile.mkstemp(prefix=".kiln-owner-", dir=path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(staged, os.path.join(path, OWNER_FILE))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _sweep_once() -> None:
    global _swept
    with _lock:
        if _swept:
            return
        _swept = True
    with contextlib.suppress(OSError):
        sweep_stale_dirs(Path(tempfile.gettempdir()))


def sweep_stale_dirs(parent: Path) -> list[Path]:
    """Remove the kiln private directories in `parent` whose owner is gone; returns them."""
    removed = []
    with os.scandir(parent) as entries:
        candidates = [Path(e.path) for e in entries
                      if e.name.startswith(_FAMILY) and e.is_dir(follow_symlinks=False)]
    for directory in candidates:
        if _owner_gone(directory / OWNER_FILE):
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
    return removed


def _owner_gone(owner: Path) -> bool:
    """True when `owner` exists and nobody holds its lock (taking it only to test)."""
    try:
        fd = os.open(owner, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False  # no owner file: not ours to judge
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # held: its process is alive
    finally:
        os.close(fd)  # also drops the lock just taken
    return True
