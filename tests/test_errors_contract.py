"""Every error leaving kiln is a KilnError (docs/runtime.md, "Errors").

The source of src/kiln is scanned with `ast` for `raise` of a builtin exception
class (`raise ValueError(...)`, `raise KeyError`). Each one must be in ALLOWED,
by file and function, with the reason Python or the code's structure needs the
builtin there; anything else is an offence, listed with its line, to be turned
into the fitting subclass of kiln.errors (each keeps its builtin base, so callers
catching ValueError still work).
"""

from __future__ import annotations

import ast
import builtins
import functools
import inspect
from pathlib import Path

import pytest

import kiln
from kiln import errors

SRC = Path(kiln.__file__).resolve().parent
# one worker, so the scan's cache serves both allow-list tests
pytestmark = pytest.mark.xdist_group("errors_contract")

BUILTIN_EXCEPTIONS = frozenset(
    name for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException))

# "file:function" (file relative to src/kiln, function qualified by its class) ->
# why a builtin exception is right there. Protocol errors are what Python itself
# expects (hasattr, iteration, frozen objects); abstract methods and "unreachable"
# markers are bugs in kiln, never about the input.
ALLOWED: dict[str, str] = {
    "__init__.py:__getattr__":
        "module __getattr__ protocol: hasattr(kiln, name) needs AttributeError",
    "driver/__init__.py:__getattr__":
        "module __getattr__ protocol: hasattr(kiln.driver, name) needs AttributeError",
    "script/namespace.py:_Namespace.__getattr__":
        "attribute protocol: hasattr/getattr with a default need AttributeError",
    "target/target.py:Target.__setattr__":
        "frozen object protocol (as dataclasses' FrozenInstanceError): AttributeError",
    "target/target.py:Target.__delattr__":
        "frozen object protocol (as dataclasses' FrozenInstanceError): AttributeError",
    "artifact/_json.py:FrozenDict._readonly":
        "immutable mapping protocol: its mutators raise TypeError, as a mappingproxy's do",
    "artifact/_json.py:FrozenList._readonly":
        "immutable sequence protocol: its mutators raise TypeError, as a tuple's do",
    "artifact/segments.py:Segments.__getitem__":
        "sequence protocol: IndexError ends iteration; AssertionError marks an unreachable line",
    "artifact/artifact.py:require_serializable":
        "AssertionError marks an unreachable line (the ExportError is raised just before)",
    "artifact/integrity.py:verify":
        "AssertionError marks an unreachable line (a mismatch is found in the loop)",
    "ir/structural.py:assert_structural_equal":
        "an assertion helper for tests: AssertionError is its documented contract",
    "ir/graph.py:Expr.type":
        "abstract property: NotImplementedError means a subclass forgot it (a kiln bug)",
    "runtime/function.py:PackedFunction._invoke":
        "abstract method: NotImplementedError means a subclass forgot it (a kiln bug)",
    "transform/pass_base.py:Pass.run":
        "abstract method: NotImplementedError means a subclass forgot it (a pass's bug)",
    "transform/pass_base.py:FunctionPass.run_on_function":
        "abstract method: NotImplementedError means a subclass forgot it (a pass's bug)",
    "artifact/schema.py:Schema._check":
        "abstract method: NotImplementedError means a subclass forgot it (a kiln bug)",
    "artifact/schema.py:Schema.describe":
        "abstract method: NotImplementedError means a subclass forgot it (a kiln bug)",
    "driver/cache.py:_safe_dirs":
        "an OSError inside the cache: every caller turns it into a CacheWarning (no cache)",
    "frontend/onnx/shape_values.py:_floordiv":
        "integer-division protocol: ZeroDivisionError, which its caller turns into 'unknown'",
    "ir/_interp_runtime.py:_ipow":
        "integer-power protocol: ZeroDivisionError, which the interpreter turns into a "
        "CallError",
}

# Files other branches are converting while this test lands (issue 22); the scan
# skips them until they are merged, then this list shrinks to nothing.
PENDING: frozenset[str] = frozenset()


def _raised_name(node: ast.Raise) -> str | None:
    """The name of the class `node` raises when it is a plain name (`X` or `X(...)`)."""
    exc = node.exc
    if isinstance(exc, ast.Call):
        exc = exc.func
    return exc.id if isinstance(exc, ast.Name) else None


class _Scanner(ast.NodeVisitor):
    """Collects (line, "Class.function", exception) of every builtin exception raised."""

    def __init__(self) -> None:
        self.scope: list[str] = []
        self.found: list[tuple[int, str, str]] = []

    def _nested(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _nested

    def visit_Raise(self, node: ast.Raise) -> None:
        name = _raised_name(node)
        if name in BUILTIN_EXCEPTIONS:
            self.found.append((node.lineno, ".".join(self.scope) or "<module>", name))
        self.generic_visit(node)


def builtin_raises(source: str) -> list[tuple[int, str, str]]:
    """(line, qualified function, exception) of each `raise` of a builtin exception."""
    scanner = _Scanner()
    scanner.visit(ast.parse(source))
    return scanner.found


@functools.cache  # both allow-list tests read the same scan
def _scan() -> dict[str, list[tuple[int, str]]]:
    """"file:function" -> [(line, exception)] over src/kiln, PENDING files left out."""
    found: dict[str, list[tuple[int, str]]] = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel in PENDING:
            continue
        for line, where, exc in builtin_raises(path.read_text(encoding="utf-8")):
            found.setdefault(f"{rel}:{where}", []).append((line, exc))
    return found


def test_no_builtin_exception_leaves_kiln_outside_the_allow_list() -> None:
    offences = [f"src/kiln/{key.partition(':')[0]}:{line}: {key.partition(':')[2]} raises "
                f"{exc}" for key, hits in _scan().items() if key not in ALLOWED
                for line, exc in hits]
    assert not offences, (
        "raise a subclass of kiln.errors instead (or add 'file:function' to ALLOWED with "
        "the reason Python needs the builtin):\n" + "\n".join(offences))


def test_every_allow_list_entry_still_raises_a_builtin() -> None:
    stale = sorted(set(ALLOWED) - set(_scan()))
    assert not stale, f"no longer raise a builtin exception; drop them from ALLOWED: {stale}"


def test_pending_files_exist() -> None:
    assert all((SRC / rel).is_file() for rel in PENDING), "a PENDING file moved; update it"


def test_the_scanner_finds_what_it_must() -> None:
    source = ("def f():\n    raise ValueError('x')\n"
              "class C:\n    def g(self):\n        raise KeyError\n"
              "    def h(self):\n        raise errors.CallError('fine')\n"
              "def k(e):\n    raise e\n")
    assert builtin_raises(source) == [(2, "f", "ValueError"), (5, "C.g", "KeyError")]


def test_every_kiln_error_keeps_a_builtin_base() -> None:
    """`except ValueError` (or RuntimeError, ...) keeps catching what it caught before."""
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass)
               if issubclass(c, errors.KilnError) and c is not errors.KilnError]
    assert len(classes) >= 10
    for cls in classes:
        assert any(base.__module__ == "builtins" and base is not Exception
                   for base in cls.__mro__[1:]), cls.__name__
        assert cls.__name__ in kiln.__all__, f"{cls.__name__} is not exported by kiln"
