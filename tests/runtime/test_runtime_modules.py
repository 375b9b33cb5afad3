"""The Module tree, loaders and the code-loading process (jit == deploy path)."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kiln.codegen  # noqa: F401  (the compiler registers the llvmjit and python loaders)
from kiln._registry import RegistryError
from kiln.artifact import Artifact, ArtifactSet, InMemoryArtifact
from kiln.errors import ExportError, FormatError, KilnError
from kiln.export import export_library
from kiln.runtime import (
    LOADERS,
    FunctionTableModule,
    HostModule,
    LibraryModule,
    LoadContext,
    Module,
    PackedFunction,
    load_artifacts,
    load_module,
    register_loader,
)
from support import handmade_lib as hm

META = hm.library_metadata("kiln_")


class PyFunction(PackedFunction):
    """A PackedFunction implemented in Python (what a toy loader returns)."""

    def __init__(self, signature: dict[str, Any], body: Any) -> None:
        super().__init__(signature)
        self.body = body

    def _invoke(self, values: list[Any], wheres: Any) -> None:
        self.body(*values)


CALLS: list[tuple[list[Artifact], LoadContext]] = []


def toy_loader(artifacts: list[Any], ctx: LoadContext) -> Module:
    """Loader "toy": each artifact is JSON {"name": f, "add": c}: f(X, Y) writes Y = X + c."""
    CALLS.append((list(artifacts), ctx))
    functions: dict[str, PackedFunction] = {}
    for a in artifacts:
        spec = json.loads(a.value if isinstance(a, InMemoryArtifact) else a.content)
        sig = {"name": spec["name"], "kind": "tensor",
               "params": [hm._t("X", [4], "float32"), hm._t("Y", [4], "float32")],
               "results": []}

        def body(x: np.ndarray, y: np.ndarray, c: float = spec["add"]) -> None:
            y[...] = x + np.float32(c)

        functions[spec["name"]] = PyFunction(sig, body)
    return FunctionTableModule("toy", functions, metadata=ctx.metadata, artifacts=artifacts)


@pytest.fixture
def toy() -> Iterator[None]:
    register_loader("toy", toy_loader)
    CALLS.clear()
    yield
    LOADERS.unregister("toy")


def toy_artifact(name: str, add: float, loader: str = "toy") -> Artifact:
    spec = json.dumps({"name": name, "add": add}).encode()
    return Artifact("toygen", loader, f"{name}.json", spec)


def mapped_files() -> set[str]:
    with open("/proc/self/maps") as f:
        return {line.split(maxsplit=5)[5].strip() for line in f if len(line.split()) >= 6}


# ------------------------------------------------------------------ the jit path
def test_jit_links_and_dlopens_a_real_file(hand_lib: Module) -> None:
    assert isinstance(hand_lib, LibraryModule)
    assert hand_lib.kind == "library"
    assert hand_lib.path.suffix == ".so" and hand_lib.path.is_file()
    assert str(hand_lib.path) in mapped_files()


def test_closing_a_jit_module_unmaps_it_and_removes_its_directory() -> None:
    mod = load_artifacts(hm.artifacts(), metadata=META, prefix="kiln_")
    path = mod.path
    fn = mod["add_one"]
    mod.close()
    assert not path.exists()
    assert str(path) not in mapped_files()
    with pytest.raises(KilnError, match="is closed"):
        fn(np.zeros(4, np.float32), np.zeros(4, np.float32))
    mod.close()  # idempotent


def test_garbage_collection_releases_the_library() -> None:
    mod = load_artifacts(hm.artifacts(), metadata=META, prefix="kiln_")
    path = mod.path
    del mod
    gc.collect()
    assert not path.exists()


def test_context_manager_closes() -> None:
    with load_artifacts(hm.artifacts(), metadata=META, prefix="kiln_") as mod:
        np.testing.assert_array_equal(mod["main"](np.zeros(4, np.float32)), hm.WEIGHTS)
    assert mod.closed
    assert mod.get_function("main") is None


def test_workspace_dir_keeps_the_build(tmp_path: Path) -> None:
    mod = load_artifacts(hm.artifacts(), metadata=META, prefix="kiln_", workspace_dir=tmp_path)
    assert mod.path.parent.parent == tmp_path.resolve()
    assert (mod.path.parent / "build" / "native" / "host" / "host.c").is_file()
    mod.close()
    assert mod.path.exists()


def test_toolchain_errors_surface_as_compile_errors() -> None:
    from kiln.errors import CompileError

    arts = hm.artifacts()
    arts.add(Artifact("bad", "native", "broken.c", b"int f(void) { return x; }\n"))
    with pytest.raises(CompileError,
                       match=r"(?s)compiling bad/broken.c failed.*cc -c.*x. undeclared"):
        load_artifacts(arts, metadata=META, prefix="kiln_")


# ------------------------------------------------------------------ the Module API
def test_module_api(hand_lib: Module) -> None:
    assert hand_lib.function_names() == ["add_one", "scale_add", "main", "split"]
    assert hand_lib.implements_function("main")
    assert not hand_lib.implements_function("nope")
    assert hand_lib.get_function("nope") is None
    assert "split" in hand_lib and "nope" not in hand_lib
    assert hand_lib.metadata["prefix"] == "kiln_"
    assert hand_lib.metadata["functions"]["main"]["results"][0]["name"] == "y"
    with pytest.raises(KilnError, match=r"no function 'mian' .* did you mean 'main'\? Known: "
                                        r"add_one, scale_add, main, split"):
        hand_lib["mian"]


def test_inspect_source(hand_lib: Module) -> None:
    src = hand_lib.inspect_source("c")
    assert "// ---- c/kernels.c" in src and "kiln__kernel_add_one" in src
    assert "// ---- host/host.c" in src
    # read through the blob's own file mapping, not copied out at load (kiln.runtime.blob_view)
    host = next(a for a in hand_lib.artifacts if a.file_name == "host.c")
    assert isinstance(host.content, memoryview) and host.content.readonly
    asm = hand_lib.inspect_source("asm")  # only C sources: what cc -S makes of them
    assert "# ---- c/kernels.c" in asm and "kiln__kernel_add_one:" in asm
    with pytest.raises(KilnError, match=r"no artifact to show as 'll' \(needs \.bc or \.ll"):
        hand_lib.inspect_source("ll")
    with pytest.raises(ValueError, match=r"unknown source format 'py'; choose 'c', 'll' or 'asm'"):
        hand_lib.inspect_source("py")


def test_inspect_source_falls_back_to_the_imports() -> None:
    source = Artifact("gen", "toy", "k.c", b"int gen_kernel(void) { return 42; }\n")
    root = HostModule()
    root.import_module(FunctionTableModule("toy", {}, artifacts=[source]))
    assert "return 42;" in root.inspect_source("c")
    assert "gen_kernel:" in root.inspect_source("asm")


def test_inspect_source_asm_from_an_object_artifact(tmp_path: Path) -> None:
    import subprocess

    src = tmp_path / "extra.c"
    src.write_text("int kiln_extra_helper(int x) { return 3 * x; }\n")
    obj = tmp_path / "extra.o"
    subprocess.run(["cc", "-c", "-fPIC", "-o", str(obj), str(src)], check=True)
    arts = hm.artifacts()
    arts.add(Artifact("obj", "none", "extra.o", obj.read_bytes()))  # carried for inspection
    with load_artifacts(arts, metadata=META, prefix="kiln_") as mod:
        assert "kiln_extra_helper" in mod.inspect_source("asm")


# ------------------------------------------------------------------ loaders and the tree
def test_loader_groups_are_loaded_and_imported(toy: None) -> None:
    arts = hm.artifacts(extra=[toy_artifact("plus_ten", 10), toy_artifact("plus_one", 1),
                               Artifact("doc", "none", "notes.json", b"{}")])
    with load_artifacts(arts, metadata=META, prefix="kiln_") as mod:
        assert isinstance(mod, LibraryModule)
        assert [m.kind for m in mod.imports] == ["toy"]
        (loaded, ctx), = CALLS
        assert [a.file_name for a in loaded] == ["plus_ten.json", "plus_one.json"]
        assert loaded[0].content == toy_artifact("plus_ten", 10).content
        assert ctx.prefix == "kiln_" and ctx.host is mod and ctx.metadata["prefix"] == "kiln_"
        assert mod.function_names() == ["add_one", "scale_add", "main", "split",
                                        "plus_ten", "plus_one"]
        assert not mod.implements_function("plus_ten")
        assert mod.implements_function("plus_ten", query_imports=True)
        y = np.zeros(4, np.float32)
        mod["plus_ten"](np.ones(4, np.float32), y)
        np.testing.assert_array_equal(y, np.full(4, 11, np.float32))
        # the "none" group is inspectable from the root, never loaded
        assert any(a.file_name == "notes.json" for a in mod.artifacts)


def test_loader_groups_travel_inside_an_exported_library(toy: None, tmp_path: Path) -> None:
    arts = hm.artifacts(extra=[toy_artifact("plus_two", 2)])
    so = export_library(arts, META, tmp_path / "lib.so", prefix="kiln_")
    with load_module(so) as mod:
        (loaded, _ctx), = CALLS
        assert loaded[0].content == arts.get("toygen", "plus_two.json").content  # type: ignore[union-attr]
        y = np.zeros(4, np.float32)
        mod["plus_two"](np.zeros(4, np.float32), y)
        np.testing.assert_array_equal(y, np.full(4, 2, np.float32))


def test_without_native_code_the_root_is_a_host_module(toy: None) -> None:
    arts = ArtifactSet([toy_artifact("plus_one", 1)])
    mod = load_artifacts(arts, metadata={"prefix": "kiln_"}, prefix="kiln_")
    assert isinstance(mod, HostModule) and mod.kind == "host"
    assert [m.kind for m in mod.imports] == ["toy"]
    y = np.zeros(4, np.float32)
    mod["plus_one"](np.ones(4, np.float32), y)
    np.testing.assert_array_equal(y, np.full(4, 2, np.float32))


def test_in_memory_artifacts_load_directly_but_never_export(toy: None, tmp_path: Path) -> None:
    live = InMemoryArtifact("toygen", "toy", "live.json", json.dumps({"name": "live", "add": 5}))
    arts = hm.artifacts(extra=[live])
    with load_artifacts(arts, metadata=META, prefix="kiln_") as mod:
        y = np.zeros(4, np.float32)
        mod["live"](np.zeros(4, np.float32), y)
        np.testing.assert_array_equal(y, np.full(4, 5, np.float32))
        np.testing.assert_array_equal(mod["main"](np.zeros(4, np.float32)), hm.WEIGHTS)
    for suffix in (".so", ".tar", ".a"):
        with pytest.raises(ExportError, match="lives in memory"):
            export_library(arts, META, tmp_path / f"lib{suffix}", prefix="kiln_")
    assert list(tmp_path.iterdir()) == []


def test_unknown_loader_is_a_clear_error(tmp_path: Path) -> None:
    arts = hm.artifacts(extra=[toy_artifact("x", 1, loader="cudaa")])
    with pytest.raises(KilnError, match=r"unknown loader 'cudaa'.*Known: .*llvmjit, .*python.*"
                                        r"register_loader\('cudaa', fn\)"):
        load_artifacts(arts, metadata=META, prefix="kiln_")


def test_a_loader_must_return_a_module(tmp_path: Path) -> None:
    register_loader("broken", lambda arts, ctx: "not a module")
    try:
        with pytest.raises(KilnError, match="loader 'broken' returned str"):
            load_artifacts(ArtifactSet([toy_artifact("x", 1, loader="broken")]),
                           metadata={}, prefix="kiln_")
    finally:
        LOADERS.unregister("broken")


def test_register_loader_rules(toy: None) -> None:
    with pytest.raises(RegistryError, match="loader 'toy' is already registered"):
        register_loader("toy", toy_loader)
    register_loader("toy", toy_loader, override=True)
    for reserved in ("native", "none"):
        with pytest.raises(KilnError, match="reserved"):
            register_loader(reserved, toy_loader)
    assert {"llvmjit", "python"} <= set(LOADERS.names())
    with pytest.raises(KilnError, match="a function or lazy="):
        register_loader("lazy_toy")
    register_loader("lazy_toy", lazy="support.handmade_lib:artifacts")
    try:
        assert LOADERS.get("lazy_toy") is hm.artifacts  # resolved on first use
    finally:
        LOADERS.unregister("lazy_toy")


def test_import_cycles_are_refused() -> None:
    a, b = HostModule(), HostModule()
    a.import_module(b)
    with pytest.raises(KilnError, match="cycle"):
        b.import_module(a)


# ------------------------------------------------------------------ reloading
def test_reexporting_over_a_loaded_library_loads_the_new_file(tmp_path: Path) -> None:
    """dlopen would hand back the old library for the same path; kiln must not."""
    so = tmp_path / "model.so"
    export_library(hm.artifacts("kiln_"), META, so, prefix="kiln_")
    first = load_module(so)
    x = np.zeros(4, np.float32)
    np.testing.assert_array_equal(first["main"](x), hm.WEIGHTS)

    arts = ArtifactSet(a if a.file_name != "constants.bin" else
                       Artifact(a.codegen_id, a.loader, a.file_name,
                                (hm.WEIGHTS * 3).tobytes(), a.metadata)
                       for a in hm.artifacts("kiln_"))
    export_library(arts, META, so, prefix="kiln_")
    second = load_module(so)
    np.testing.assert_array_equal(second["main"](x), hm.WEIGHTS * 3)
    np.testing.assert_array_equal(first["main"](x), hm.WEIGHTS)  # the old one still works
    first.close()
    second.close()


def test_load_module_rejects_unknown_suffixes(tmp_path: Path) -> None:
    p = tmp_path / "model.dll"
    p.write_bytes(b"MZ")
    with pytest.raises(FormatError, match=r"cannot load a \.dll file; kiln loads \.so and \.tar"):
        load_module(p)
    with pytest.raises(FileNotFoundError):
        load_module(tmp_path / "missing.so")


def test_exiting_without_close_leaves_no_temporary_files(tmp_path: Path) -> None:
    """Modules kept alive until interpreter exit (e.g. in a cycle) still clean up."""
    from support.processes import run_python

    script = ("from support import handmade_lib as hm\n"
              "from kiln.runtime import load_artifacts\n"
              "m = load_artifacts(hm.artifacts(), metadata=hm.library_metadata('kiln_'), "
              "prefix='kiln_')\n"
              "m.self_ref = m\n"
              "print(m.path)\n")
    proc = run_python(script, env={"TMPDIR": str(tmp_path)}, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith(str(tmp_path.resolve()))
    assert list(tmp_path.iterdir()) == []
