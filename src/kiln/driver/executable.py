"""Executable: what `kiln.compile` returns.

It holds the artifacts (plain data), the lowered IR that went to codegen, the
library metadata and the target. Nothing runs until you ask:

    ex = kiln.compile(mod, "llvm")
    y = ex["main"](x)                 # jit() on first use, then the function
    ex.export_library("model.so")     # the same artifacts, written for deployment

`jit()` goes through `kiln.runtime.loading.load_artifacts`, the same
code-loading process as `load_module`: the native code is linked into a real
shared library on disk and dlopen'ed.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

from kiln.export import export_library
from kiln.ir.gc_pace import fewer_collections
from kiln.ir.module import IRModule
from kiln.runtime import loading

if TYPE_CHECKING:
    from kiln.artifact import ArtifactSet
    from kiln.runtime.module import Module
    from kiln.target import Target


class Executable:
    """The result of `kiln.compile`: artifacts + lowered IR + metadata + target."""

    def __init__(self, artifacts: ArtifactSet, ir: IRModule, metadata: dict[str, Any],
                 target: Target, prefix: str, *, cache_hit: bool = False,
                 cache_key: str | None = None) -> None:
        self.artifacts = artifacts
        self.ir = ir
        self.metadata = metadata
        self.target = target
        self.prefix = prefix
        self.cache_hit = cache_hit
        self.cache_key = cache_key
        self._module: Module | None = None
        # The first call may come from several threads at once: link and load once.
        self._jit_lock = threading.Lock()

    # ------------------------------------------------------------------ running

    def jit(self, *, fcompile: Any = None, force_recompile: bool = False,
            workspace_dir: str | os.PathLike[str] | None = None, cc: Any = None) -> Module:
        """Load the artifacts in this process (cached); returns the runtime Module.

        This is `load_module` without the file: the native code is linked into
        a real shared library (in `workspace_dir`, kept, or a private temporary
        directory) and dlopen'ed. `cc` is the C compiler command (default $CC
        or cc). `fcompile` is the link step `fcompile(out_path, objects, options)`
        as for `export_library`; a string or list there is taken as `cc`.
        Thread-safe: concurrent first calls link and load the library once.
        """
        module = self._module
        if module is not None and not force_recompile:
            return module
        with self._jit_lock:
            if self._module is None or force_recompile:
                self._module = self._load(fcompile, workspace_dir, cc)
            return self._module

    @fewer_collections
    def _load(self, fcompile: Any, workspace_dir: str | os.PathLike[str] | None,
              cc: Any) -> Module:

        if isinstance(fcompile, (str, list, tuple)):  # a compiler command, as in export
            cc = fcompile if cc is None else cc
            fcompile = None
        return loading.load_artifacts(self.artifacts, metadata=self.metadata, prefix=self.prefix,
                              workspace_dir=workspace_dir, cc=cc, fcompile=fcompile)

    def __getitem__(self, name: str) -> Any:
        """The function `name` of the loaded module (jit() on first use)."""
        return self.jit()[name]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function `main`."""
        return self["main"](*args, **kwargs)

    def function_names(self) -> list[str]:
        """Names of the functions the compiled module exports."""
        return list(self.metadata.get("functions", {}))

    # ------------------------------------------------------------------ exporting

    def export_library(self, file_name: str | os.PathLike[str], *, fcompile: Any = None,
                       workspace_dir: str | os.PathLike[str] | None = None, cc: Any = None,
                       options: Any = None, weights: str = "embedded",
                       weights_path: str | os.PathLike[str] | None = None) -> Any:
        """Write a deployable library: `.so`, `.tar` or `.a` (+ header), by suffix.

        In-memory artifacts (the python and llvmjit backends' JIT forms) cannot
        be exported and raise ExportError, as does a `file_name` that is a directory.
        `weights="external"` (a `.so`) writes the weights to their own file,
        `weights_path` or `<file_name>.weights`, which `load_module` maps
        (docs/runtime.md "External weights").
        """

        return export_library(self.artifacts, self.metadata, file_name, prefix=self.prefix,
                              fcompile=fcompile, workspace_dir=workspace_dir, cc=cc,
                              options=options, weights=weights, weights_path=weights_path)

    # ------------------------------------------------------------------ inspection

    def inspect(self) -> str:
        """A text summary: target, prefix, functions and signatures, workspace, artifacts."""
        lines = [f"Executable for target {self.target}",
                 f"  prefix: {self.prefix}" + ("  (from the compile cache)" if self.cache_hit
                                                else "")]
        workspace = self.metadata.get("workspace_bytes", {})
        lines.append("  functions:")
        for name, sig in self.metadata.get("functions", {}).items():
            params = ", ".join(_describe(p) for p in sig.get("params", []))
            results = ", ".join(_describe(r) for r in sig.get("results", []))
            text = f"    {name}({params})"
            if results:
                text += f" -> {results}"
            if workspace.get(name):
                text += f"   [workspace {workspace[name]} bytes]"
            lines.append(text)
            for d in sig.get("dims", []):  # symbolic dimensions and their bounds
                high = "" if d.get("max") is None else f" <= {d['max']}"
                lines.append(f"      dim {d['name']}: {d['min']} <= {d['name']}{high}")
            for d in sig.get("runtime_dims", []):  # data-dependent sizes (results at bound)
                sizes = ", ".join(f"result {p['result']} axis {p['axis']}"
                                  for p in d.get("places", []))
                lines.append(f"      data-dependent {d['name']} <= {d['bound']}"
                             + (f" (sizes {sizes})" if sizes else ""))
        lines.append("  artifacts:")
        lines.extend("    " + row for row in self.artifacts.inspect().splitlines())
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"<Executable target={self.target.kind.name} functions="
                f"{self.function_names()} artifacts={len(self.artifacts)}>")


def _describe(p: dict[str, Any]) -> str:
    if p.get("kind") == "tensor":
        return f"{p['name']}: {p['dtype']}[{', '.join(str(d) for d in p['shape'])}]"
    return f"{p['name']}: {p['dtype']}"
