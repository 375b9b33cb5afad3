"""Host detection, lazy llvmlite, and the leaf rule for kiln.target."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
import textwrap

import kiln.target
from kiln.target import Target

TARGET_DIR = pathlib.Path(kiln.target.__file__).parent


def test_from_host_matches_llvmlite() -> None:
    import llvmlite.binding as llvm

    host = Target.from_host()
    features = llvm.get_host_cpu_features()
    expected = tuple(("+" if on else "-") + name for name, on in sorted(features.items()))
    assert host.kind.name == "llvm"
    assert host.get("mtriple") == llvm.get_process_triple()
    assert host.get("mcpu") == llvm.get_host_cpu_name()
    assert host.get("mattr") == expected
    assert list(host.get("mattr")) == sorted(host.get("mattr"), key=lambda f: f[1:])
    assert set(features.flatten().split(",")) == set(host.get("mattr"))


def test_from_host_is_cached_and_round_trips() -> None:
    assert Target.from_host() is Target.from_host()
    assert Target(Target.from_host().export()) == Target.from_host()


def _run(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, check=True, timeout=60,
    )
    return result.stdout.strip()


def test_llvm_target_is_equal_across_processes() -> None:
    out = _run(
        """
        from kiln.target import Target
        print(Target("llvm").fingerprint(), Target("nvidia/jetson-agx-orin").fingerprint())
        """
    )
    assert out.split() == [
        Target("llvm").fingerprint(), Target("nvidia/jetson-agx-orin").fingerprint()
    ]


def test_import_does_not_load_llvmlite_and_works_without_it() -> None:
    out = _run(
        """
        import sys
        import kiln.target
        assert "llvmlite" not in sys.modules, "kiln.target imported llvmlite eagerly"
        sys.modules["llvmlite"] = None  # now make it unimportable
        sys.modules["llvmlite.binding"] = None
        from kiln.target import Target, TargetError
        print(Target("nvidia/a100").get("arch"))
        print(Target("llvm -mtriple=aarch64-linux-gnu").get("mtriple"))
        print(Target("llvm").get("mtriple").count("-") >= 2)
        try:
            Target.from_host()
        except TargetError as err:
            print("needs llvmlite" in str(err))
        """
    )
    assert out.splitlines() == ["sm_80", "aarch64-linux-gnu", "True", "True"]


def test_target_package_is_a_leaf() -> None:
    allowed = ("kiln.target", "kiln._registry", "kiln.errors")
    for path in TARGET_DIR.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name.startswith("kiln"):
                    assert name.startswith(allowed), f"{path.name} imports {name}"
        top_level = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
        for node in top_level:
            module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
            eager = (module or "").startswith("llvmlite")
            assert not eager, f"{path.name} imports llvmlite at module level"
