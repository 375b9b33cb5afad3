"""The runtime Module tree: what loading an ArtifactSet or a library gives you.

The root of a tree is a `LibraryModule` (one dlopen'ed shared library holding all
native code) or, when there is no native code, an empty `HostModule`. Every
other loader group (docs/runtime.md) becomes a Module imported into the root.
`get_function(name)` searches a module, then its imports depth-first.
"""

from __future__ import annotations

import ctypes
import os
import threading
import weakref
from _ctypes import dlclose as _dlclose
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln._registry import suggest
from kiln.artifact import inspect_artifact
from kiln.artifact.library_schema import check_library_metadata
from kiln.artifact.schema import Anything, Obj, parse
from kiln.errors import ArgumentTypeError, FormatError, KilnError, UsageError, shown
from kiln.runtime import abi, ctypes_abi, swap, threads
from kiln.runtime.dim_binding import is_dim_text
from kiln.runtime.function import NativeFunction, PackedFunction
from kiln.runtime.lazy_graphs import LazyGraphs, split_entry
from kiln.runtime.lifetime import CallGuard
from kiln.runtime.memory_library import is_memory_path
from kiln.runtime.private_dirs import make_private_dir, remove_private_dir
from kiln.runtime.profile import ProfileCounters, ProfileRow, not_profiled

if TYPE_CHECKING:
    from kiln.artifact import AnyArtifact

LIBRARY_FORMAT = "kiln.library"
SOURCE_FORMATS = ("c", "ll", "asm")
MAX_LIBRARY_VERSION = 10  # newest library metadata version this runtime reads


class Module:
    """A node of the runtime module tree.

    `kind` says what it is ("library", "host", or a loader's name); `imports` are
    the modules it imported; `metadata` the library metadata (docs/abi.md);
    `artifacts` the artifacts it was loaded from, kept for `inspect_source`.
    Subclasses provide `_own_function` and `_own_names`.
    """

    kind = "module"

    def __init__(self, *, metadata: dict[str, Any] | None = None,
                 artifacts: Iterable[AnyArtifact] = ()) -> None:
        self.imports: list[Module] = []
        self.metadata: dict[str, Any] = dict(metadata or {})
        self.artifacts: list[AnyArtifact] = list(artifacts)
        self.closed = False

    # -------------------------------------------------------------- functions
    def _own_function(self, name: str) -> PackedFunction | None:
        return None

    def _own_names(self) -> list[str]:
        return []

    def import_module(self, module: Module) -> None:
        """Make `module`'s functions reachable from this one."""
        if module is self or self in module._walk():
            raise KilnError(f"importing {module!r} into {self!r} would create a cycle")
        self.imports.append(module)

    def _walk(self) -> Iterator[Module]:
        """This module, then its imports depth-first (each module once)."""
        seen: set[int] = set()
        stack: list[Module] = [self]
        while stack:
            m = stack.pop()
            if id(m) in seen:
                continue
            seen.add(id(m))
            yield m
            stack.extend(reversed(m.imports))

    def get_function(self, name: str, query_imports: bool = True) -> PackedFunction | None:
        """The function `name` of this module (or of an import), or None."""
        modules = self._walk() if query_imports else iter([self])
        for m in modules:
            fn = m._own_function(name)
            if fn is not None:
                return fn
        return None

    def implements_function(self, name: str, query_imports: bool = False) -> bool:
        """True if this module (or, with `query_imports`, one of its imports) has `name`."""
        return self.get_function(name, query_imports) is not None

    def function_names(self) -> list[str]:
        """Names of every function reachable from this module (own ones first)."""
        names: list[str] = []
        for m in self._walk():
            names.extend(n for n in m._own_names() if n not in names)
        return names

    # -------------------------------------------------------------- profiling
    def _profile_counters(self) -> ProfileCounters:
        for m in self._walk():
            counters = getattr(m, "_profile", None)
            if counters is not None and not m.closed:
                return counters
        raise not_profiled(repr(self))

    def profile(self) -> list[ProfileRow]:
        """Per-kernel timings of a library built with profile=True, one row per timer
        site (kiln.runtime.profile); KilnError for a library built without."""
        return self._profile_counters().read()

    def profile_reset(self) -> None:
        """Zero the profiling counters (KilnError for a library built without them)."""
        self._profile_counters().reset()

    def __getitem__(self, name: str) -> PackedFunction:
        if not isinstance(name, str):
            raise ArgumentTypeError(f"a module's functions are looked up by name (str), got "
                                    f"{type(name).__name__} {shown(name, 60)}")
        fn = self.get_function(name)
        if fn is None:
            names = self.function_names()
            raise KilnError(
                f"no function '{name}' in {self!r}.{suggest(name, names)} "
                f"Known: {', '.join(names) if names else '(none)'}")
        return fn

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get_function(name) is not None

    # -------------------------------------------------------------- inspection
    def inspect_source(self, fmt: str = "c") -> str:
        """The source of this module's code: "c" (C sources), "ll" or "asm".

        "ll" and "asm" are rendered from LLVM bitcode / IR artifacts (or, for
        "asm", object files) by `kiln.artifact.inspect_artifact`, which imports
        llvmlite only then; with only C sources, "asm" is what `cc -S` makes of
        them. A module with nothing to show in `fmt` shows its imports' source.
        """
        if fmt not in SOURCE_FORMATS:
            raise UsageError(f"unknown source format {fmt!r}; choose 'c', 'll' or 'asm'")
        found = self._find_source(fmt)
        if found is not None:
            return found
        needs = {"c": ".c", "ll": ".bc or .ll", "asm": ".bc, .ll, .o, .s or .c"}[fmt]
        raise KilnError(
            f"{self!r} has no artifact to show as {fmt!r} (needs {needs} with its content), "
            f"nor do its imports; its artifacts: {_artifact_names(self.artifacts)}")

    def _find_source(self, fmt: str) -> str | None:
        """This module's source in `fmt`, else its imports' (None if nothing fits).

        A damaged artifact raises (FormatError): only "nothing to show" moves on.
        """
        own = self._own_source(fmt)
        if own is not None:
            return own
        found = [text for module in self.imports
                 if (text := module._find_source(fmt)) is not None]
        return "\n".join(found) if found else None

    def _own_source(self, fmt: str) -> str | None:
        """`inspect_source` from this module's own artifacts; None if none fits `fmt`."""
        stored = [a for a in self.artifacts
                  if a.serializable and not (a.metadata.get("linked") is True and not a.content)]
        sources = [a for a in stored if a.extension in (".c", ".h")]
        if fmt == "c":
            if not sources:
                return None
            return "\n".join(f"// ---- {a.codegen_id}/{a.file_name}\n"
                             f"{bytes(a.content).decode('utf-8', errors='replace')}"
                             for a in sources)
        preferred = [a for a in stored if a.extension in (".bc", ".ll")]
        if not preferred and fmt == "asm":
            preferred = [a for a in stored if a.extension in (".o", ".s")]
            if not preferred and sources:
                from kiln.runtime.native import (
                    c_to_assembly,  # cycle: kiln.runtime imports this module
                )

                return "\n".join(c_to_assembly(a) for a in sources if a.extension == ".c")
        if not preferred:
            return None

        return "\n".join(inspect_artifact(a, fmt) for a in preferred)

    # -------------------------------------------------------------- weights
    def swap_weights(self, source: Any) -> None:
        """Install new weights into this library, without a compiler (docs/runtime.md,
        "Swapping weights"): `source` is a dict name -> array of the model's named
        weights (its ONNX initializers), an `.npz` file of them, or an ONNX model of
        the same graph (path, bytes or ModelProto). The library rebuilds its constants
        from them as the compile did and installs them between calls: a call sees the
        old or the new weights, never a mix. UsageError (nothing changed) when the
        names, dtypes or shapes differ from the model's, or the library cannot rebuild
        some constant (the message names it); see kiln.runtime.swap."""
        swap.swap_weights(self, source)

    # -------------------------------------------------------------- lifetime
    def close(self) -> None:
        """Release this module and its imports; their functions stop working."""
        for m in self.imports:
            m.close()
        self.closed = True

    def __enter__(self) -> Module:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} kind={self.kind!r} functions={len(self._own_names())}>"


def _artifact_names(artifacts: list[AnyArtifact]) -> str:
    return ", ".join(f"{a.codegen_id}/{a.file_name}" for a in artifacts) or "(none)"


class HostModule(Module):
    """The empty root of a tree without native code; loader results are imported into it."""

    kind = "host"


class FunctionTableModule(Module):
    """A module over a ready dict of PackedFunctions (handy for loaders)."""

    def __init__(self, kind: str, functions: dict[str, PackedFunction], *,
                 metadata: dict[str, Any] | None = None,
                 artifacts: Iterable[AnyArtifact] = (), keepalive: Any = None) -> None:
        super().__init__(metadata=metadata, artifacts=artifacts)
        self.kind = kind
        self.functions = dict(functions)
        self.keepalive = keepalive

    def _own_function(self, name: str) -> PackedFunction | None:
        return None if self.closed else self.functions.get(name)

    def _own_names(self) -> list[str]:
        return list(self.functions)


class LibraryModule(Module):
    """A dlopen'ed kiln shared library: its packed entries as NativeFunctions.

    Signatures come from the library's own `{prefix}_metadata()`. A library
    without native code (only the blob, for other loaders) has no
    `{prefix}_metadata` and no functions of its own: `has_native` is False.
    `close()` waits for calls in flight on other threads, then dlcloses it
    (later calls raise CallError); so does garbage collection. `cleanup_dir`,
    if set, is a private directory removed with it. `num_threads` is the thread
    count of its parallel loops (kiln.runtime.threads; None: the process default).
    """

    kind = "library"

    def __init__(self, path: str | os.PathLike[str], prefix: str, *,
                 artifacts: Iterable[AnyArtifact] = (), cleanup_dir: str | None = None,
                 num_threads: int | None = None) -> None:
        super().__init__(artifacts=artifacts)
        # A memory file's /proc/self/fd/N stays as it is (it resolves to no real path).
        self.path = Path(path) if is_memory_path(Path(path)) else Path(path).resolve()
        self.prefix = prefix
        self.cleanup_dir = cleanup_dir
        self._cleanup: Any = None
        self._handle: int | None = None
        self._guard = CallGuard(f"the library {str(self.path)!r}")
        self._swap_lock = threading.Lock()  # one swap_weights at a time; close() waits
        lib = _dlopen(self.path)
        # The private directory goes when the module does, or at interpreter exit
        # at the latest (a finalizer runs even when the module sits in a cycle).
        self._cleanup = (weakref.finalize(self, remove_private_dir, cleanup_dir)
                         if cleanup_dir is not None else None)
        self.cdll = lib
        self._handle = lib._handle
        stat = self.path.stat()
        self._file_id = (stat.st_dev, stat.st_ino)
        _OPEN.setdefault(str(self.path), weakref.WeakSet()).add(self)
        self._functions: dict[str, NativeFunction] = {}
        self._last_error_fn: Any = None
        self._profile: ProfileCounters | None = None
        self.pool: threads.PoolControls | None = None
        # The shared mapping of an external weights file (kiln.runtime.external_weights).
        self.weights: Any = None
        self._on_close: list[Callable[[], object]] = []
        try:
            metadata_fn = ctypes_abi.bind(lib, f"{prefix}_metadata", "metadata")
        except AttributeError:
            self.has_native = False  # a blob-only library
            return
        self.has_native = True
        try:
            self._last_error_fn = ctypes_abi.bind(lib, f"{prefix}_last_error", "last_error")
        except AttributeError:
            self.close()
            raise FormatError(f"{self.path}: exports {prefix}_metadata but not "
                              f"{prefix}_last_error; not a kiln library") from None
        try:
            self.metadata = _parse_library_metadata(ctypes_abi.read_string(metadata_fn), self.path)
        except FormatError:
            self.close()
            raise
        sites = self.metadata.get("profile", {}).get("sites", [])
        if sites:
            try:
                self._profile = ProfileCounters(lib, prefix, len(sites))
            except AttributeError:
                self.close()
                raise FormatError(f"{self.path}: metadata lists profiling sites but the "
                                  f"library has no {prefix}_profile_read") from None
        for name, sig in self.metadata.get("functions", {}).items():
            try:
                _check_signature(name, sig)
            except FormatError as exc:
                self.close()
                raise FormatError(f"{self.path}: library metadata: {exc}") from None
            try:
                c_func = ctypes_abi.bind(lib, sig["symbol"], "packed")
            except AttributeError:
                self.close()
                raise FormatError(f"{self.path}: metadata lists function '{name}' but the "
                                  f"library has no symbol {sig['symbol']}") from None
            self._functions[name] = NativeFunction(sig, c_func, self.last_error, owner=self,
                                                   guard=self._guard)
        try:
            self.pool = threads.attach(self, num_threads)
        except BaseException:
            self.close()
            raise

    # -------------------------------------------------------------- threads
    @property
    def num_threads(self) -> int:
        """Threads of this library's parallel loops, the calling thread included (1
        when it has none)."""
        return threads.controls_of(self).num_threads()

    def set_num_threads(self, n: int | None) -> None:
        """This library's thread count from its next parallel loop on; None: follow
        kiln.runtime.set_num_threads again."""
        controls = threads.controls_of(self)
        controls.set_num_threads(n if n is not None else threads.default_threads())
        controls.explicit = n is not None

    def set_spin_us(self, us: int | None) -> None:
        """How long this library's idle workers spin before they sleep (microseconds;
        None: the process default)."""
        threads.controls_of(self).set_spin_us(us if us is not None
                                              else threads.default_spin_us())

    def pool_stats(self) -> threads.PoolStats:
        """The counters of this library's thread pool (kiln.runtime.threads.PoolStats)."""
        return threads.controls_of(self).stats()

    def last_error(self) -> str:
        """`{prefix}_last_error()`: the message of the last failed call on this thread."""
        if self.closed or self._last_error_fn is None:
            return ""
        return ctypes_abi.read_string(self._last_error_fn)

    def _own_function(self, name: str) -> PackedFunction | None:
        return None if self.closed else self._functions.get(name)

    def _own_names(self) -> list[str]:
        return list(self._functions)

    def run_weight_checks(self) -> None:
        """Run the pending lazy checks of the weights now (FormatError if damaged)."""
        for fn in self._functions.values():
            check = getattr(fn.c_func, "check", None)  # kiln.runtime.weights arm_check
            if check is not None:
                check.run()
        if self.weights is not None:
            self.weights.run()

    @contextmanager
    def calls_paused(self) -> Iterator[None]:
        """No call of this library runs meanwhile: new calls wait, running ones are
        waited for (kiln.runtime.lifetime.CallGuard.pause); one holder at a time."""
        with self._swap_lock:
            self._guard.pause()
            try:
                yield
            finally:
                self._guard.resume()

    @contextmanager
    def kept_open(self) -> Iterator[None]:
        """The library stays loaded meanwhile (close() waits), one holder at a time as
        calls_paused: for its own `{prefix}_swap_weights`, which holds the calls itself
        (kiln_swap.c). UsageError once closed."""
        with self._swap_lock:
            if self.closed:
                raise UsageError(f"{self.path}: the library is closed")
            yield

    def close(self) -> None:
        """dlclose the library (idempotent) once the calls in flight have returned.

        Functions of a closed library raise CallError.
        """
        with self._swap_lock:  # not while swap_weights writes into its constants
            self._guard.close()
        super().close()
        for stop in self._on_close:  # e.g. the weight check's thread, which reads the library
            stop()
        self._on_close.clear()
        self._release(_dlclose)
        self.weights = None  # the shared weights mapping may go with the last library
        if self._cleanup is not None:
            self._cleanup()  # idempotent

    def on_close(self, fn: Callable[[], object]) -> None:
        """Have `close()` call `fn` once the calls in flight returned, before it unmaps
        the library (to stop work that reads the library's memory)."""
        self._on_close.append(fn)

    def _release(self, dlclose: Any) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            try:  # noqa: SIM105  (no contextlib: may run during shutdown)
                dlclose(handle)
            except OSError:
                pass  # already unloaded: nothing left to release

    def __del__(self, _dlclose: Any = _dlclose) -> None:
        # Shutdown-safe: dlclose is bound as a default because module globals may
        # already be gone when this runs during interpreter teardown.
        if getattr(self, "_handle", None) is None:
            return
        self.closed = True
        try:  # noqa: SIM105  (no contextlib: may run during shutdown)
            self._release(_dlclose)
        except Exception:
            pass

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return f"<LibraryModule {str(self.path)!r} prefix={self.prefix!r}{state}>"


# Libraries currently open, by resolved path; see _dlopen.
_OPEN: dict[str, weakref.WeakSet[LibraryModule]] = {}


def _dlopen(path: Path) -> ctypes.CDLL:
    """dlopen `path` RTLD_NOW | RTLD_LOCAL, never getting a stale library back.

    The dynamic loader hands back an already-open library when the *name*
    matches, even if the file was replaced since (e.g. exported again). If a
    different file is open under this name, open the new one through a
    uniquely named symlink instead.
    """
    stat = path.stat()
    name = str(path)
    for key in [k for k, mods in _OPEN.items() if not mods]:
        del _OPEN[key]
    stale = any(not m.closed and m._file_id != (stat.st_dev, stat.st_ino)
                for m in list(_OPEN.get(name, ())))
    link_dir = make_private_dir("kiln-dlopen-") if stale else None
    try:
        if link_dir is not None:
            name = os.path.join(link_dir, path.name)
            os.symlink(path, name)
        return ctypes.CDLL(name, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as exc:
        raise FormatError(f"{path}: cannot load as a shared library: {exc}") from None
    except UnicodeDecodeError:  # ctypes decodes dlerror(), which quotes the file's bytes
        raise FormatError(f"{path}: cannot load as a shared library: the dynamic loader "
                          "rejected it (a damaged symbol or section name)") from None
    finally:
        if link_dir is not None:
            remove_private_dir(link_dir)


def _check_signature(name: str, sig: Any) -> None:
    """FormatError unless `sig` is a function signature as docs/abi.md describes it."""
    def fail(what: str) -> FormatError:
        return FormatError(f"function {name!r}: {what}")

    if not isinstance(sig, dict):
        raise fail(f"signature is a {type(sig).__name__}, not an object")
    symbol = sig.get("symbol")
    if not isinstance(symbol, str) or not symbol.isascii() or \
            not symbol.replace("_", "a").isidentifier():
        raise fail(f"symbol {symbol!r} is not a C identifier")
    for key in ("params", "results"):
        entries = sig.get(key, [])
        if not isinstance(entries, list):
            raise fail(f"'{key}' is not a list")
        for p in entries:
            if not isinstance(p, dict) or not isinstance(p.get("name"), str):
                raise fail(f"an entry of '{key}' has no name")
            if p.get("dtype") not in abi.DL_TYPES:
                raise fail(f"{p['name']}: unknown dtype {p.get('dtype')!r}")
            kind = p.get("kind")
            shape = p.get("shape")
            if kind == "tensor":
                if not isinstance(shape, list) or not all(
                        (isinstance(d, int) and not isinstance(d, bool) and d >= 0)
                        or (isinstance(d, str) and is_dim_text(d))
                        for d in shape):
                    raise fail(f"{p['name']}: shape {shape!r} is not a list of sizes")
            elif kind != "scalar":
                raise fail(f"{p['name']}: kind {kind!r} is neither 'tensor' nor 'scalar'")
    dims = sig.get("dims", [])
    if not isinstance(dims, list) or not all(
            isinstance(d, dict) and isinstance(d.get("name"), str) and d["name"].isidentifier()
            and _is_size(d.get("min")) and (d.get("max") is None or _is_size(d.get("max")))
            for d in dims):
        raise fail(f"'dims' {dims!r} is not a list of {{name, min, max}}")
    nonzero = sig.get("nonzero", [])
    if not isinstance(nonzero, list) or not all(
            isinstance(d, dict) and isinstance(d.get("dim"), str) and is_dim_text(d["dim"])
            and isinstance(d.get("why"), str) for d in nonzero):
        raise fail(f"'nonzero' {nonzero!r} is not a list of {{dim, why}}")
    shapes = sig.get("output_shapes_symbol")
    if dims and (not isinstance(shapes, str) or not shapes.isascii()
                 or not shapes.replace("_", "a").isidentifier()):
        raise fail(f"output_shapes_symbol {shapes!r} is not a C identifier")
    generate = sig.get("generate_symbol")
    if generate is not None and (not isinstance(generate, str) or not generate.isascii()
                                 or not generate.replace("_", "a").isidentifier()):
        raise fail(f"generate_symbol {generate!r} is not a C identifier")
    companion = sig.get("last_position")
    if companion is not None and not isinstance(companion, str):
        raise fail(f"last_position {companion!r} is not a function name")


def _is_size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _parse_graphs(raw: str, where: str) -> dict[str, Any]:
    """The "graphs" entry's JSON text `raw`, parsed and checked like the rest."""
    graphs: dict[str, Any] = check_library_metadata(
        {"graphs": parse(raw, Obj(extra=Anything()), where)}, where)["graphs"]
    return graphs


def _parse_library_metadata(text: str, path: Path) -> dict[str, Any]:
    # Strict JSON of bounded depth (a crafted file must not raise RecursionError), typed
    # by the one schema every reader of library metadata uses.
    where = f"{path}: library metadata"
    text, graphs = split_entry(text, "graphs")  # for reports only: parsed when read
    meta = check_library_metadata(parse(text, Obj(extra=Anything()), where), where)
    if graphs is not None:
        if "graphs" in meta:
            raise FormatError(f"{where}: duplicate key 'graphs'")
        meta["graphs"] = LazyGraphs(graphs, lambda raw: _parse_graphs(raw, where))
    if meta.get("format") != LIBRARY_FORMAT:
        found = meta.get("format")
        raise FormatError(f"{path}: expected library metadata of format "
                          f"'{LIBRARY_FORMAT}', found {found!r}")
    version = meta.get("version")
    if not isinstance(version, int) or not 1 <= version <= MAX_LIBRARY_VERSION:
        raise FormatError(f"{path}: library metadata version {version!r} is not supported "
                          f"(this runtime reads 1..{MAX_LIBRARY_VERSION}); upgrade kiln")
    if not isinstance(meta.get("functions"), dict):
        raise FormatError(f"{path}: library metadata has no 'functions' object")
    return meta
