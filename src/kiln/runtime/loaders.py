"""The loader registry: loader name -> function that turns artifacts into a Module.

A loader is `fn(artifacts: list[Artifact], ctx: LoadContext) -> Module`. The
code-loading process (kiln.runtime.loading) hands each loader group of an
ArtifactSet, except "native" (linked into the host library) and "none"
(inspection only), to the loader registered under its name and imports the
result into the root module.

The runtime registers only its own loaders ("cuda", lazily). The compiler
registers the loaders of artifacts that cannot run without it (`COMPILER_LOADERS`:
"llvmjit" bitcode, which LLVM compiles here, and "python", an IRModule the
interpreter runs) when its codegen package is imported, as any backend does
with `register_loader`; out-of-tree backends may also come from `kiln.backends`
entry points (kiln.runtime.plugins). The runtime itself never imports the
compiler: a process that has not loaded it gets a KilnError for those
artifacts, and native code (`.so`, `.tar`) loads with the runtime alone
(tests/runtime/test_runtime_isolation.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln._registry import Registry, RegistryError
from kiln.errors import ArgumentTypeError, KilnError, missing_dependency
from kiln.runtime.plugins import failed_backends, load_backends

if TYPE_CHECKING:
    from kiln.artifact import AnyArtifact
    from kiln.runtime.module import Module

# Loader names with a fixed meaning; they cannot be registered.
NATIVE = "native"
NONE = "none"


@dataclass
class LoadContext:
    """What a loader may use besides its artifacts.

    `prefix` and `metadata` are the library's `system_lib_prefix` and metadata
    (docs/abi.md); `host` is the root module the result will be imported into
    (a LibraryModule, whose native functions a loader may call, or a HostModule);
    `workspace_dir` is a private directory for files the loader needs to write.
    """

    prefix: str
    metadata: dict[str, Any] = field(default_factory=dict)
    host: Module | None = None
    workspace_dir: Path | None = None


Loader = Callable[[list["AnyArtifact"], LoadContext], "Module"]

# Loaders the compiler registers: their artifacts need it in the loading process.
COMPILER_LOADERS = ("llvmjit", "python")

LOADERS: Registry[Loader] = Registry("loader")
LOADERS.register("cuda", lazy="kiln.runtime.cuda_loader:load_cuda")


def register_loader(name: str, fn: Loader | None = None, *, lazy: str | None = None,
                    override: bool = False) -> Loader | None:
    """Register `fn` as the loader for artifacts whose `loader` is `name`; or, with
    `lazy="module:function"`, the function to import the first time such an artifact
    is loaded (so registering imports nothing). Returns `fn`."""
    if name in (NATIVE, NONE):
        raise KilnError(f"loader name '{name}' is reserved: 'native' artifacts are linked into "
                        "the host library and 'none' artifacts are never loaded")
    if (fn is None) == (lazy is None):
        raise ArgumentTypeError(f"register_loader('{name}') takes a function or lazy="
                                "'module:function', exactly one of them")
    if fn is not None and not callable(fn):
        raise ArgumentTypeError(f"a loader must be callable, got {type(fn).__name__}")
    if lazy is not None:
        LOADERS.register(name, lazy=lazy, override=override)
    else:
        LOADERS.register(name, fn, override=override)
    return fn


def get_loader(name: str) -> Loader:
    """The loader registered as `name`; KilnError listing the known loaders otherwise."""

    if name not in LOADERS:
        load_backends()  # an installed plug-in may provide it
    if name not in LOADERS and name in COMPILER_LOADERS:
        raise KilnError(
            f"artifacts of loader '{name}' need the kiln compiler in this process: its "
            "codegen package registers their loader when imported (kiln.compile imports "
            "it), so import the compiler before loading them; deploy hosts, with the "
            "runtime alone, load native libraries (.so, .tar)")
    try:
        return LOADERS.get(name)
    except RegistryError as exc:
        raise KilnError(f"{exc}. Register one with kiln.runtime.register_loader('{name}', fn)"
                        f"{failed_backends()}") from None
    except ImportError as exc:
        missing = missing_dependency(exc, f"loading '{name}' artifacts")
        if missing is not None:
            raise missing from exc
        raise KilnError(f"the '{name}' loader cannot be imported ({exc}); is the compiler side "
                        "of kiln installed? A deploy-only host can load 'native' code only"
                        ) from exc


def run_loader(name: str, artifacts: list[AnyArtifact], ctx: LoadContext) -> Module:
    """Run loader `name` and check that it returned a Module."""
    from kiln.runtime.module import Module  # cycle: kiln.runtime imports this module

    module = get_loader(name)(artifacts, ctx)
    if not isinstance(module, Module):
        raise KilnError(f"loader '{name}' returned {type(module).__name__}, not a "
                        "kiln.runtime.Module")
    return module
