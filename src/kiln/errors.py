"""kiln's exception types, importable without the compiler (the runtime uses them).

Every kiln error derives from `KilnError`, so `except kiln.KilnError` catches
them all. Each also keeps the builtin base it had before the hierarchy existed
(`ValueError` for bad input, `RuntimeError` for failures), so code catching
those keeps working. No error leaves kiln as a bare builtin exception, except
where a Python protocol requires one (tests/test_errors_contract.py lists them).
"""

from __future__ import annotations

import reprlib
from typing import Any


class KilnError(Exception):
    """The base of every error kiln raises on purpose."""


class PerformanceWarning(UserWarning):
    """A model compiles and runs correctly, but part of it takes a path much slower
    than kiln's tuned kernels; the message says which part and how to avoid it."""


class GenericKernelWarning(PerformanceWarning):
    """A kernel runs its generic loops only because a size is symbolic: with the size
    pinned (the message gives the `shape_dict`), a hand-built kernel takes it."""


class CallError(KilnError, RuntimeError):
    """A compiled function rejected its arguments or failed while running."""


class TargetError(KilnError, ValueError):
    """A target spec is malformed: unknown kind, tag or attribute, or a wrong type."""


class FormatError(KilnError, ValueError):
    """A file kiln reads (library blob, artifact archive, MLF) is damaged or unsupported."""


class IRError(KilnError, ValueError):
    """Ill-formed IR: the verifier's or the DSL parser's complaint."""


class UnprovenEqualError(IRError):
    """Two sizes an operator needs equal are not provably equal for every value of the
    symbolic dimensions (`sizes`: the two, as the operator saw them)."""

    def __init__(self, message: str, sizes: tuple[object, object]) -> None:
        super().__init__(message)
        self.sizes = sizes


class CompileError(KilnError, RuntimeError):
    """Code generation, a pass, or the system toolchain failed."""


class ExportError(CompileError):
    """An executable cannot be exported as asked (e.g. it holds an in-memory artifact)."""


class FrontendError(KilnError, ValueError):
    """A model file cannot be imported: malformed, unsupported ops, unbound shapes."""


class MissingDependencyError(KilnError, ImportError):
    """A kiln feature needs a package that is not installed (the message names it)."""


class ArtifactError(KilnError, ValueError):
    """An artifact, artifact set or inspector is malformed: a bad name, file name,
    target key, content or metadata, or a duplicate."""


class UsageError(KilnError, ValueError):
    """An option or argument has a value kiln cannot use: an unknown choice, malformed
    text, a size out of range. The message names the option and what it accepts."""


class ArgumentTypeError(KilnError, TypeError):
    """A kiln API was given a value of the wrong type (the message names the argument)."""


class MissingFileError(KilnError, FileNotFoundError):
    """A file kiln was asked to read does not exist (the message names it)."""


class UnsafePathError(KilnError, PermissionError):
    """kiln refuses to act on a path it does not trust (a cache directory another user
    owns or can write): the message names the path and the problem."""


# pip package of each optional dependency, by the top-level module kiln imports, and
# the extra of the kiln-tensor distribution that brings it (pyproject.toml).
_PACKAGES = {"llvmlite": "llvmlite", "onnx": "onnx", "onnxruntime": "onnxruntime",
             "elftools": "pyelftools", "ml_dtypes": "ml_dtypes", "google": "protobuf"}
_EXTRAS = {"ml_dtypes": "ml-dtypes", "onnxruntime": "test"}


def missing_dependency(exc: ImportError, feature: str) -> MissingDependencyError | None:
    """The error to raise when `feature` failed because `exc` could not import a dependency.

    None when `exc` is not about one of kiln's optional packages (then it is a bug
    to report as it is).
    """
    top = (exc.name or "").split(".")[0]
    package = _PACKAGES.get(top)
    if package is None:
        return None
    return MissingDependencyError(
        f"{feature} needs the '{package}' package, which is not installed here "
        f"({install_hint(top)}); a deploy host with kiln.runtime alone can load and run "
        "exported libraries but not compile")


def install_hint(module: str) -> str:
    """How to install the optional package that provides `module` (a top-level name
    kiln imports: 'llvmlite', 'onnx', ...): the kiln-tensor extra first, as a deploy
    host that installed the runtime alone (`pip install kiln-tensor`) needs it."""
    package = _PACKAGES.get(module, module)
    return (f"pip install \"kiln-tensor[{_EXTRAS.get(module, 'compiler')}]\", "
            f"or pip install {package}")


def shown(value: Any, limit: int = 120) -> str:
    """`repr(value)` for an error message, at most `limit` characters. Only the first
    levels and items of a container are looked at, so a huge or deeply shared value (a
    YAML alias bomb, a megabyte string) costs no more to show than a short one."""
    brief = _Brief()
    brief.maxlevel, brief.maxstring, brief.maxother, brief.maxlong = 3, limit, limit, 40
    brief.maxlist = brief.maxtuple = brief.maxdict = brief.maxset = brief.maxfrozenset = 6
    try:
        text = brief.repr(value)
    except (ValueError, RecursionError):  # an int past Python's digit limit, a cycle
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


class _Brief(reprlib.Repr):
    """reprlib's bounded repr, also for subclasses of the containers (which plain
    reprlib shows with their full repr)."""

    def repr1(self, x: Any, level: int) -> str:
        for base in (dict, list, tuple, set, frozenset, str):
            if isinstance(x, base) and type(x) is not base:
                return str(getattr(self, f"repr_{base.__name__}")(x, level))
        return str(super().repr1(x, level))
