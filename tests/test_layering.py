"""The package layering, read from the source (docs/README.md, "The developer map").

The layers, bottom first (`LAYERS`): a module imports only from its own
package and from lower layers; packages that share a layer do not import one
another (except within `base`). On top of the order, `FORBIDDEN` holds the
finer rules inside a package, and the runtime side (runtime, artifact, base)
imports nothing outside the standard library but numpy (and the optional
packages listed in `RUNTIME_OPTIONAL`).

Every `import` and `from ... import` in every module of src/kiln counts, including
the ones inside functions and under `if TYPE_CHECKING:`, and so does
`importlib.import_module("kiln....")` with a literal name: a lazy import is
still a dependency.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import pytest

import kiln

SRC = Path(kiln.__file__).resolve().parent
# one worker, so the parse cache below serves every test
pytestmark = pytest.mark.xdist_group("layering")

# The layers, bottom first: the first element of a module's name under kiln.
LAYERS: list[tuple[str, ...]] = [
    ("errors", "escape", "_registry", "_bfloat16", "dim_expr"),  # base
    ("ir", "target", "artifact"),
    ("runtime",),  # numpy only: what a deploy host installs
    ("mlf",),  # the MLF reader: runtime side, builds with the system C compiler
    ("tuning",),  # measured kernel choices, read by the passes that choose kernels
    ("script", "ops"),
    ("kernels",),  # hand-built kernels: an op's target-tuned lowering (kiln.kernels)
    ("transform",),
    ("codegen",),
    ("export",),
    ("frontend",),  # ONNX import: kiln.compile (driver) accepts an ONNX model
    ("driver",),
    ("session", "distributed"),  # onnxruntime-style sessions; build matrices on Ray
    ("cli",),
    ("demo", "__main__"),  # entry points over everything
]
RANK = {package: rank for rank, layer in enumerate(LAYERS) for package in layer}
BASE = LAYERS[0]

# (importing module, imported package) pairs the order allows anyway, with the reason.
# Empty: add one only with the reason the import cannot follow the order.
ALLOWED: dict[tuple[str, str], str] = {}

# Packages that make up the compiler: what `runtime` and `artifact` must not need.
COMPILER = ("ir", "script", "transform", "codegen", "ops", "kernels", "frontend", "driver",
            "target", "export", "cli")

# Third-party packages the runtime side may import (lazily, behind a clear error).
RUNTIME_OPTIONAL = {
    "numpy": "the one dependency of a deploy host",
    "ml_dtypes": "bfloat16/float8 arrays (the `ml-dtypes` extra)",
    "elftools": "disassembling objects in Module.inspect_source (pyelftools)",
}
RUNTIME_SIDE = ("runtime", "artifact", "mlf", *BASE)

# (importing layer, imported layer) pairs that must not occur; "codegen/llvm" is a
# path prefix, so the rule also covers its submodules.
FORBIDDEN: list[tuple[str, str]] = [
    *(("ir", other) for other in ("transform", "codegen", "ops", "frontend", "script",
                                   "driver")),
    ("transform", "codegen"),
    # Backends read what passes made through kiln.ir (ir/outlined.py, ir/terminate.py,
    # ir/profiling.py, ir/gpu_launch.py, ir/steps.py), never the passes themselves.
    ("codegen", "transform"),
    # The host entries and C-family text serve both backends (codegen/cfamily).
    ("codegen/llvm", "codegen/c"),
    ("codegen/host", "codegen/c"),
    ("codegen/cfamily", "codegen/c"),
    *(("runtime", other) for other in COMPILER),
    *(("artifact", other) for other in COMPILER),
]


def _module_name(path: Path) -> str:
    parts = ["kiln", *path.relative_to(SRC).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name of a (possibly relative) `from` import."""
    if level == 0:
        return name or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def _is_module(dotted: str) -> bool:
    parts = dotted.split(".")
    if parts[0] != "kiln":
        return False
    path = SRC.joinpath(*parts[1:])
    return path.is_dir() or path.with_suffix(".py").is_file()


def imports_in(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`, nested ones included."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module)
            found.append((node.lineno, base))
            # `from kiln import ops` imports the package kiln.ops.
            found.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names
                         if _is_module(f"{base}.{alias.name}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            found.append((node.lineno, node.args[0].value))
    return found


@functools.cache  # several tests below read every module: parse each once
def imports_of(path: Path) -> list[tuple[int, str]]:
    return imports_in(path.read_text(encoding="utf-8"), _module_name(path),
                      path.name == "__init__.py")


def _layer(dotted: str) -> str:
    """"kiln.codegen.llvm.jit" -> "codegen/llvm/jit" (empty outside kiln)."""
    parts = dotted.split(".")
    return "/".join(parts[1:]) if parts[0] == "kiln" else ""


def _within(layer: str, prefix: str) -> bool:
    return layer == prefix or layer.startswith(prefix + "/")


def offences(module: str, imports: list[tuple[int, str]]) -> list[tuple[int, str, str]]:
    """(line, imported module, broken rule) for each import `module` must not make."""
    here = _layer(module)
    out = []
    for line, target in imports:
        there = _layer(target)
        for src, dst in FORBIDDEN:
            if _within(here, src) and _within(there, dst) and not _within(there, src):
                out.append((line, target, f"{src} must not import {dst}"))
    return out


def violations(files: list[Path]) -> list[str]:
    return [f"{path.relative_to(SRC.parent)}:{line}: imports {target} ({rule})"
            for path in files
            for line, target, rule in offences(_module_name(path), imports_of(path))]


def _package(dotted: str) -> str:
    parts = dotted.split(".")
    return parts[1] if parts[0] == "kiln" and len(parts) > 1 else ""


def order_offences(module: str, imports: list[tuple[int, str]]) -> list[tuple[int, str, str]]:
    """(line, imported module, broken rule) for each import against the layer order."""
    here = _package(module)
    out = []
    for line, target in imports:
        there = _package(target)
        # The root `kiln` resolves its names lazily (kiln/__init__.py): no layer.
        if not here or not there or there == here or (module, there) in ALLOWED:
            continue
        if here not in RANK or there not in RANK:
            out.append((line, target, f"kiln.{here or there} is in no layer (LAYERS)"))
        elif RANK[there] > RANK[here]:
            out.append((line, target, f"{here} is below {there}"))
        elif RANK[there] == RANK[here] and here not in BASE:
            out.append((line, target, f"{here} and {there} share a layer"))
    return out


def test_layering_holds() -> None:
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 100  # the walk found the package
    bad = violations(files)
    assert not bad, "layering violations:\n" + "\n".join(bad)


def test_layer_order_holds() -> None:
    bad = [f"{path.relative_to(SRC.parent)}:{line}: imports {target} ({rule})"
           for path in sorted(SRC.rglob("*.py"))
           for line, target, rule in order_offences(_module_name(path), imports_of(path))]
    assert not bad, "layer order violations:\n" + "\n".join(bad)


def test_every_package_has_a_layer() -> None:
    packages = {p.stem for p in SRC.iterdir()
                if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert packages - set(RANK) == set()


def test_allowed_exceptions_are_still_needed() -> None:
    used = {(_module_name(path), _package(target))
            for path in SRC.rglob("*.py") for _, target in imports_of(path)}
    assert set(ALLOWED) - used == set()


def test_the_runtime_side_needs_only_numpy() -> None:
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        if _package(_module_name(path)) not in RUNTIME_SIDE:
            continue
        for line, target in imports_of(path):
            top = target.split(".")[0]
            if top and top != "kiln" and top not in sys.stdlib_module_names \
                    and top not in RUNTIME_OPTIONAL:
                bad.append(f"{path.relative_to(SRC.parent)}:{line}: imports {target}")
    assert not bad, "the runtime side imports third-party packages:\n" + "\n".join(bad)


@pytest.mark.parametrize("module, source, broken", [
    ("kiln.runtime.probe", "from kiln.export import export_library\n", True),
    ("kiln.ops.probe", "def f():\n    from kiln.transform import Pass\n", True),
    ("kiln.ops.probe", "from kiln.script import T\n", True),  # same layer
    ("kiln.codegen.probe", "from kiln.transform import Pass\n", False),  # FORBIDDEN, not order
    ("kiln.driver.probe", "from kiln.frontend.onnx import from_onnx\n", False),
    ("kiln.frontend.probe", "from kiln.driver.cache import parse_size\n", True),
    ("kiln.escape", "from kiln.errors import KilnError\n", False),  # base imports base
])
def test_the_order_rule(module: str, source: str, broken: bool) -> None:
    assert bool(order_offences(module, imports_in(source, module))) == broken


@pytest.mark.parametrize("source, expected", [
    ("from kiln.codegen.naming import x\n", "kiln.codegen.naming"),
    ("def f():\n    import kiln.ops as ops\n", "kiln.ops"),
    ("def f():\n    from kiln import ops\n", "kiln.ops"),
    ("from ..codegen import naming\n", "kiln.codegen.naming"),
    ("if TYPE_CHECKING:\n    from kiln.transform import Pass\n", "kiln.transform"),
    ("import importlib\nimportlib.import_module('kiln.frontend')\n", "kiln.frontend"),
])
def test_the_walk_sees_every_kind_of_import(source: str, expected: str) -> None:
    # The same text in a module of kiln.ir breaks a rule; in kiln.driver it does not.
    found = imports_in(source, "kiln.ir.probe")
    assert expected in [name for _, name in found]
    assert [target for _, target, _ in offences("kiln.ir.probe", found)]
    assert not offences("kiln.driver.probe", imports_in(source, "kiln.driver.probe"))


def test_codegen_must_not_import_transform() -> None:
    found = imports_in("from kiln.transform.outline import OutlineParallelLoops\n"
                       "from kiln.ir.outlined import kernel_funcs\n", "kiln.codegen.c.probe")
    assert [target for _, target, _ in offences("kiln.codegen.c.probe", found)] == [
        "kiln.transform.outline"]


def test_codegen_llvm_rule_is_about_the_c_backend_only() -> None:
    found = imports_in("from kiln.codegen.c.kernel import x\nfrom kiln.codegen import naming\n",
                       "kiln.codegen.llvm.probe")
    assert [target for _, target, _ in offences("kiln.codegen.llvm.probe", found)] == [
        "kiln.codegen.c.kernel"]


def test_the_developer_map_is_the_layer_list() -> None:
    """docs/README.md's layer table names the packages of `LAYERS`, layer by layer."""
    import re

    text = (SRC.parents[1] / "docs" / "README.md").read_text(encoding="utf-8")
    table = text.split("| layer (bottom first) | packages | may use |", 1)[1].split("\n\n", 1)[0]
    rows = [line.split("|")[2] for line in table.splitlines()[2:] if line.startswith("|")]
    documented = [sorted(set(re.findall(r"`(\w+)`", row)) & set(RANK)) for row in rows]
    assert documented == [sorted(layer) for layer in LAYERS]
