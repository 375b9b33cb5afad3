"""`kiln.backends` entry points: out-of-tree backends (seeds 000 and 002).

Each entry point is a zero-argument function that registers the backend's
target kind, codegen and/or loader. Both sides use the scan: the compiler when
a target kind is unknown, the runtime when an artifact's loader is unknown —
so a fresh process can load a plug-in's artifacts from an exported library.
"""

from __future__ import annotations

BACKENDS_GROUP = "kiln.backends"

_BACKENDS: dict[str, str | None] = {}  # entry point name -> error text (None: loaded)
_SCANNED = False


def load_backends(*, force: bool = False) -> dict[str, str | None]:
    """Load every `kiln.backends` entry point once; name -> error message or None.

    A failing plug-in does not stop the others; its error is reported when a
    lookup then fails.
    """
    global _SCANNED
    if _SCANNED and not force:
        return dict(_BACKENDS)
    _SCANNED = True
    # importlib.metadata (with email, socket, ...) costs 8 ms of every start, and the
    # scan runs only for a target kind or loader nobody registered
    import importlib.metadata  # lazy: see above

    for ep in importlib.metadata.entry_points(group=BACKENDS_GROUP):
        if ep.name in _BACKENDS and not force:
            continue
        try:
            register = ep.load()
            if callable(register):
                register()
            _BACKENDS[ep.name] = None
        except Exception as exc:  # a broken plug-in must not break unrelated work
            _BACKENDS[ep.name] = f"{type(exc).__name__}: {exc}"
    return dict(_BACKENDS)


def failed_backends() -> str:
    """' (kiln.backends plug-ins that failed to load: ...)' or ''."""
    failed = {k: v for k, v in _BACKENDS.items() if v is not None}
    if not failed:
        return ""
    listed = "; ".join(f"{k}: {v}" for k, v in sorted(failed.items()))
    return f" (kiln.backends plug-ins that failed to load: {listed})"


def scanned_backends() -> dict[str, str | None]:
    """The plug-ins seen so far, without scanning: name -> error message or None."""
    return dict(_BACKENDS)
