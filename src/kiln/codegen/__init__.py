"""kiln.codegen: one backend per target kind, lowered IRModule -> ArtifactSet.

    arts = kiln.codegen.build(lowered_mod, Target("llvm"), prefix="kiln_")

`build` picks the codegen from the target's kind (see `registry`); backends
live in subpackages (`llvm`, `c`, `python_backend`) and load on first use.
`naming` (symbols, library metadata) and `constants` (the weight pool) are
shared by every backend. Importing kiln.codegen registers with the runtime the
loaders of artifacts only the compiler can run ("llvmjit", "python"): the
runtime never imports the compiler itself.
"""

from kiln.codegen.registry import (
    BACKENDS_GROUP,
    CODEGENS,
    PREPARERS,
    build,
    codegen_for,
    connect_runtime,
    get_codegen,
    graph_signature,
    list_codegens,
    load_backends,
    prepare,
    register_codegen,
    register_python_kind,
    resolve_target,
)

__all__ = [
    "BACKENDS_GROUP",
    "CODEGENS",
    "PREPARERS",
    "build",
    "codegen_for",
    "connect_runtime",
    "get_codegen",
    "graph_signature",
    "list_codegens",
    "load_backends",
    "prepare",
    "register_codegen",
    "register_python_kind",
    "resolve_target",
]

register_python_kind()
connect_runtime()  # loaders of llvmjit and python artifacts, timed export steps
