"""kiln's exception types, importable without the compiler (the runtime uses them)."""

from __future__ import annotations


class KilnError(RuntimeError):
    """A compiled function rejected its arguments or failed while running."""


class TargetError(ValueError):
    """A target spec is malformed: unknown kind, tag or attribute, or a wrong type."""


class FormatError(ValueError):
    """A file kiln reads (library blob, artifact archive, MLF) is damaged or unsupported."""


class IRError(ValueError):
    """Ill-formed IR: the verifier's or the DSL parser's complaint."""


class CompileError(RuntimeError):
    """Code generation, a pass, or the system toolchain failed."""


class ExportError(CompileError):
    """An executable cannot be exported as asked (e.g. it holds an in-memory artifact)."""


class FrontendError(ValueError):
    """A model file cannot be imported: malformed, unsupported ops, unbound shapes."""
