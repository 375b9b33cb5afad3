"""The codegen registry and the build dispatcher: lowered IRModule -> ArtifactSet.

A codegen is a function

    codegen(mod: IRModule, target: Target, *, prefix: str, pool: ConstantPool)
        -> list[Artifact | InMemoryArtifact]

returning every artifact for its target. Which codegen a target uses hangs off
its kind (docs/targets.md): the kind attribute `"codegen"` names a registered codegen
or holds the function itself; without it, the codegen registered under the
kind's name is used. Built-ins load lazily: "llvm", "llvmjit", "c", "python", "cuda"
(device kernels only: a cuda target compiles through kiln.driver.split).

External backends register with `register_codegen(name, fn)` (plus
`kiln.target.register_kind` and `kiln.runtime.register_loader`), or ship a
Python package with an entry point in the group `kiln.backends`:

    [project.entry-points."kiln.backends"]
    mydev = "mydev.kiln_plugin:register"     # a function taking no arguments

Entry points are loaded lazily, the first time a codegen or target kind is
not found (see `load_backends`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from kiln._registry import Registry, RegistryError
from kiln.artifact import Artifact as PlainArtifact
from kiln.artifact import ArtifactSet, InMemoryArtifact
from kiln.codegen.constants import ConstantPool
from kiln.codegen.naming import DEFAULT_PREFIX, check_prefix, entry_symbol
from kiln.errors import CompileError, ExportError, IRError, TargetError, missing_dependency
from kiln.ir.attrs import ATTR_GIVEN_OUTPUT_NAMES, ATTR_OUTPUT_NAMES
from kiln.ir.module import IRModule
from kiln.ir.steps import timed_step
from kiln.ir.types import TensorType, TupleType
from kiln.runtime.library import set_step_timer
from kiln.runtime.loaders import LOADERS, register_loader
from kiln.target import Target, TargetKind, get_kind, list_kinds, register_kind

if TYPE_CHECKING:
    from kiln.artifact import AnyArtifact
    from kiln.ir.graph import Function

CodegenFn = Callable[..., "Iterable[AnyArtifact]"]

from kiln.runtime.plugins import BACKENDS_GROUP  # noqa: E402,F401

CODEGENS: Registry[CodegenFn] = Registry("codegen")
for _name, _path in {
    "llvm": "kiln.codegen.llvm:codegen_llvm",
    "llvmjit": "kiln.codegen.llvm:codegen_llvmjit",
    "c": "kiln.codegen.c:codegen_c",
    "python": "kiln.codegen.python_backend:codegen_python",
    "cuda": "kiln.codegen.cuda.codegen:codegen_cuda",
}.items():
    CODEGENS.register(_name, lazy=_path)

# What a codegen may start before the passes run (`prepare`): work that depends only on
# the input module and the target, done meanwhile on a core the passes leave idle.
PREPARERS: Registry[Callable[..., None]] = Registry("codegen preparer")
PREPARERS.register("llvm", lazy="kiln.codegen.llvm.codegen:prepare_llvm")


def register_codegen(name: str, fn: CodegenFn, *, override: bool = False) -> CodegenFn:
    """Register `fn` as the codegen called `name`; returns `fn`."""
    if not callable(fn):
        raise CompileError(f"codegen '{name}' must be callable, got {type(fn).__name__}")
    try:
        CODEGENS.register(name, fn, override=override)
    except RegistryError as err:
        raise CompileError(str(err)) from None
    return fn


def list_codegens() -> list[str]:
    """Names of the registered codegens."""
    return CODEGENS.names()


def get_codegen(name: str) -> CodegenFn:
    """The codegen registered as `name` (loading `kiln.backends` plug-ins on a miss)."""
    if name not in CODEGENS:
        load_backends()
    try:
        return CODEGENS.get(name)
    except RegistryError as err:
        failed = _failed_backends()
        raise CompileError(f"{err}{failed}") from None
    except ImportError as exc:
        missing = missing_dependency(exc, f"codegen '{name}'")
        if missing is not None:
            raise missing from exc
        raise CompileError(f"codegen '{name}' cannot be imported: {exc}") from exc


def prepare(name: str, mod: IRModule, target: Target, *, prefix: str) -> None:
    """Let codegen `name` start, before the passes, what its build of `mod` (the input
    module) for `target` will need (`PREPARERS`; nothing for a codegen without one)."""
    if name in PREPARERS:
        PREPARERS.get(name)(mod, target, prefix=prefix)


def codegen_for(target: Target) -> tuple[str, CodegenFn]:
    """(name, function) of the codegen for `target`, from its kind (see module docstring)."""
    attr = target.kind.get_attr("codegen")
    if attr is None:
        name = target.kind.name
        if name not in CODEGENS:
            load_backends()
        if name not in CODEGENS:
            # Name the kinds a user can compile for, not just the codegen names.
            raise CompileError(
                f"target kind '{name}' has no code generator in this installation; "
                f"kinds with one: {', '.join(kinds_with_codegen())}. A backend registers "
                "one with kiln.codegen.register_codegen or a 'kiln.backends' plug-in"
                f"{_failed_backends()}")
        return name, get_codegen(name)
    if isinstance(attr, str):
        return attr, get_codegen(attr)
    if callable(attr):
        return _qualname(attr), attr
    raise CompileError(
        f"target kind '{target.kind.name}': attribute 'codegen' must name a registered "
        f"codegen or be a function, got {type(attr).__name__} {attr!r}")


def kinds_with_codegen() -> list[str]:
    """Names of the registered target kinds a codegen is available for."""

    out = []
    for kind in list_kinds():
        attr = get_kind(kind).get_attr("codegen")
        if callable(attr) or (attr or kind) in CODEGENS:
            out.append(kind)
    return out


def build(mod: IRModule, target: Target, *, prefix: str = DEFAULT_PREFIX,
          pool: ConstantPool | None = None) -> ArtifactSet:
    """Run the target's codegen over a lowered module; the artifacts as an ArtifactSet.

    The module's weights are gathered into a `ConstantPool` handed to the codegen
    (`pool`, if given, must be `ConstantPool.from_module(mod)`: the driver builds it
    once and reuses its hashes).
    """
    check_prefix(prefix)
    name, fn = codegen_for(target)
    pool = pool if pool is not None else ConstantPool.from_module(mod)
    try:
        result = fn(mod, target, prefix=prefix, pool=pool)
    except (CompileError, IRError, TargetError, ExportError):
        raise
    except Exception as exc:
        raise CompileError(f"codegen '{name}' failed: {type(exc).__name__}: {exc}") from exc
    if isinstance(result, ArtifactSet):
        return result
    if isinstance(result, (PlainArtifact, InMemoryArtifact)) or not isinstance(result, Iterable):
        raise CompileError(
            f"codegen '{name}' returned {type(result).__name__}; a codegen returns a list "
            "of Artifact / InMemoryArtifact")
    items = list(result)
    for item in items:
        if not isinstance(item, (PlainArtifact, InMemoryArtifact)):
            raise CompileError(
                f"codegen '{name}' returned a {type(item).__name__} among its artifacts; "
                "expected Artifact or InMemoryArtifact")
    try:
        return ArtifactSet(items)
    except ValueError as exc:
        raise CompileError(f"codegen '{name}': {exc}") from None


def _qualname(fn: object) -> str:
    module = getattr(fn, "__module__", None) or type(fn).__module__
    qual = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}.{qual}"


# --------------------------------------------------------------------------- plug-ins
# The `kiln.backends` entry-point scan lives in the runtime, so a deploy host can
# load a plug-in's loader without the compiler; the codegen side reuses it.
from kiln.runtime.plugins import failed_backends as _failed_backends  # noqa: E402
from kiln.runtime.plugins import load_backends, scanned_backends  # noqa: E402


def resolve_target(spec: Any) -> Target:
    """`kiln.target.Target(spec)`, loading `kiln.backends` plug-ins if the kind is unknown."""
    if isinstance(spec, Target):
        return spec
    try:
        return Target(spec)
    except TargetError as first:
        before = scanned_backends()
        if load_backends() == before:
            raise
        try:
            return Target(spec)
        except TargetError:
            raise first from None


# --------------------------------------------------------------------------- signatures


def graph_signature(name: str, fn: Function, prefix: str = DEFAULT_PREFIX) -> dict[str, Any]:
    """The metadata signature (docs/abi.md) of a graph function a codegen handles itself.

    Same shape as `naming.function_signature` of its lowered form: params, then
    results named by the "output_names" attribute (else out0, out1, ...).
    """

    def flat(ty: Any) -> list[TensorType]:
        if isinstance(ty, TupleType):
            return [x for f in ty.fields for x in flat(f)]
        return [ty]

    params = []
    for p in fn.params:
        if not isinstance(p.type, TensorType):
            raise CompileError(f"graph function '{name}': parameter '{p.name}' is not a tensor")
        params.append({"name": p.name, "kind": "tensor", "shape": list(p.type.shape),
                       "dtype": p.type.dtype})
    outs = flat(fn.ret_type)
    names = fn.attrs.get(ATTR_GIVEN_OUTPUT_NAMES, fn.attrs.get(ATTR_OUTPUT_NAMES))
    if names is None:
        names = [f"out{i}" for i in range(len(outs))]
    elif isinstance(names, str):
        names = [names]
    results = [{"name": n, "kind": "tensor", "shape": list(t.shape), "dtype": t.dtype}
               for n, t in zip(names, outs)]
    return {"name": name, "symbol": entry_symbol(prefix, name), "kind": "graph",
            "params": params, "results": results,
            "tuple_result": isinstance(fn.ret_type, TupleType)}


# --------------------------------------------------------------------------- the python kind


def register_python_kind() -> None:
    """Register target kind "python" (the reference interpreter) if nobody has yet."""
    if "python" in list_kinds():
        return
    kind = TargetKind("python", {}, ("cpu",),
                      doc="kiln's reference interpreter, in this process (in-memory only)")
    kind.set_attr("codegen", "python")
    register_kind(kind)


# The runtime loaders of artifacts only the compiler can run: LLVM bitcode JIT-compiled
# in the loading process, and an IRModule for the interpreter. Registered by name, so
# importing kiln.codegen imports neither llvmlite nor the interpreter.
COMPILER_LOADERS = {
    "llvmjit": "kiln.codegen.llvm.jit_loader:load_llvmjit",
    "python": "kiln.codegen.python_backend:load_python",
}


def connect_runtime() -> None:
    """Give the runtime what it needs from the compiler but must not import (a deploy
    host has the runtime alone): the loaders of `COMPILER_LOADERS` (kept when registered
    already) and the timer of export_library's steps (kiln.ir.steps: the PassContext
    instruments' timer once the passes are imported). kiln.codegen does this on import."""

    for name, path in COMPILER_LOADERS.items():
        if name not in LOADERS:
            register_loader(name, lazy=path)
    set_step_timer(timed_step)
