"""A jit library reads its constants where they lie in this process (kiln.runtime.jit_constants).

`Executable.jit()` links the library with the constants' room left a hole and points the
kernels' table slots at the constants' bytes in memory; a constant not aligned as the
kernels assume is written into the library instead. Checked: the slots read memory and
the library's own bytes stay unwritten (zero) for those, the answers equal the exported
library's bit for bit, a swap moves the library onto its own (rewritten) constants, the
bytes outlive the Executable, a kept workspace library holds every byte, and a compile
cache hit reads its constants in place too.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import kiln
from kiln.artifact import ArtifactSet
from kiln.artifact.segments import Segments
from kiln.runtime import jit_constants, load_artifacts, load_module
from support.graphs import GraphBuilder

X = np.random.default_rng(71).standard_normal((4, 64)).astype(np.float32)
ALIGN = 64


def model(seed: int = 71) -> onnx.ModelProto:
    b = GraphBuilder(seed=seed)
    h = b.op("Relu", b.linear(b.input("x", [4, 64]), 64, 96))
    h = b.op("MatMul", h, b.weight(96, 80))
    b.output(b.op("Add", h, b.weight(80)), [4, 80])
    return b.model()


def constants(ex: Any) -> Any:
    return next(a for a in ex.artifacts if a.file_name == "constants.bin")


def relaid(ex: Any, misaligned: set[int]) -> ArtifactSet:
    """`ex`'s artifacts with the constants as pieces of memory of their own: each table
    entry 64-byte aligned, or 16 bytes past that for the indexes in `misaligned`."""
    art = constants(ex)
    data = bytes(art.content)
    parts: list[Any] = []
    end = 0
    for i, (offset, size) in sorted(enumerate(art.metadata["table"]), key=lambda e: e[1][0]):
        parts.append(data[end:offset])
        shift = 16 if i in misaligned else 0
        raw = np.empty(size + ALIGN + shift, np.uint8)
        start = -raw.ctypes.data % ALIGN + shift
        raw[start:start + size] = np.frombuffer(data, np.uint8, size, offset)
        parts.append(raw[start:start + size])
        end = offset + size
    parts.append(data[end:])
    return ArtifactSet(replace(a, content=Segments(parts)) if a is art else a
                       for a in ex.artifacts)


def jit(ex: Any, artifacts: ArtifactSet, **kwargs: Any) -> Any:
    return load_artifacts(artifacts, metadata=ex.metadata, prefix=ex.prefix, **kwargs)


@pytest.fixture(scope="module", params=["llvm", "c"])
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> dict[str, Any]:
    """The model built by codegen `request.param` (both read constants through the
    table) and its exported library's answer."""
    tmp = tmp_path_factory.mktemp(f"jit_constants_{request.param}")
    ex = kiln.compile(model(), request.param)
    with load_module(ex.export_library(tmp / "model.so")) as lib:
        want = lib["main"](X)
    return {"ex": ex, "want": want, "tmp": tmp, "target": request.param}


def test_slots_read_the_constants_in_memory(built: dict[str, Any]) -> None:
    ex = built["ex"]
    table = constants(ex).metadata["table"]
    assert len(table) >= 3
    with jit(ex, relaid(ex, set())) as lib:
        placed = jit_constants.placement(lib)
        assert placed is not None and len(placed) == len(table)
        for home, read, size in placed:
            assert read != home and read % ALIGN == 0
            assert ctypes.string_at(home, size) == bytes(size)  # never written: a hole
        np.testing.assert_array_equal(lib["main"](X), built["want"])


def test_a_misaligned_constant_is_written_into_the_library(built: dict[str, Any]) -> None:
    ex = built["ex"]
    data = bytes(constants(ex).content)
    with jit(ex, relaid(ex, {1})) as lib:
        placed = jit_constants.placement(lib)
        assert placed is not None
        for i, ((home, read, size), (offset, _n)) in enumerate(
                zip(placed, constants(ex).metadata["table"])):
            if i == 1:
                assert read == home
                assert ctypes.string_at(home, size) == data[offset:offset + size]
            else:
                assert read != home
        np.testing.assert_array_equal(lib["main"](X), built["want"])


def test_swap_moves_the_library_onto_its_own_constants(built: dict[str, Any]) -> None:
    ex = built["ex"]
    new_model = model(seed=72)
    new = {i.name: numpy_helper.to_array(i) for i in new_model.graph.initializer}
    with load_module(kiln.compile(new_model, built["target"]).export_library(
            built["tmp"] / "new.so")) as fresh:
        want_new = fresh["main"](X)
    with jit(ex, relaid(ex, {0})) as lib:
        assert jit_constants.placement(lib) is not None
        lib.swap_weights(new)
        assert jit_constants.placement(lib) is None  # its own bytes from now on
        np.testing.assert_array_equal(lib["main"](X), want_new)
    with jit(ex, relaid(ex, set())) as lib:  # the arrays it read are untouched
        np.testing.assert_array_equal(lib["main"](X), built["want"])


def test_a_kept_workspace_library_holds_every_byte(built: dict[str, Any],
                                                   tmp_path: Path) -> None:
    ex = built["ex"]
    with jit(ex, relaid(ex, set()), workspace_dir=tmp_path) as lib:
        assert jit_constants.placement(lib) is None
        kept = Path(lib.path)
        np.testing.assert_array_equal(lib["main"](X), built["want"])
    with load_module(kept, verify_weights=True) as again:  # its weight check passes
        np.testing.assert_array_equal(again["main"](X), built["want"])


def test_the_constants_outlive_the_executable(tmp_path: Path) -> None:
    """The module keeps the bytes its slots point at: the Executable, the model and the
    artifacts dropped and their memory reused, it still answers right (a subprocess: a
    dangling slot could crash)."""
    path = tmp_path / "m.onnx"
    onnx.save(model(), path)
    script = f"""
import gc, dataclasses, numpy as np, onnxruntime as ort, kiln
from kiln.artifact import ArtifactSet
from kiln.runtime import jit_constants, load_artifacts
x = np.random.default_rng(3).standard_normal((4, 64)).astype(np.float32)
want = ort.InferenceSession({str(path)!r}).run(None, {{"x": x}})[0]
ex = kiln.compile(kiln.frontend.from_onnx({str(path)!r}), "llvm")
art = next(a for a in ex.artifacts if a.file_name == "constants.bin")
data = bytes(art.content)
raw = np.empty(len(data) + 64, np.uint8)
start = -raw.ctypes.data % 64
raw[start:start + len(data)] = np.frombuffer(data, np.uint8)
view = memoryview(raw[start:start + len(data)]).toreadonly()
arts = ArtifactSet(dataclasses.replace(a, content=view) if a is art else a
                   for a in ex.artifacts)
lib = load_artifacts(arts, metadata=ex.metadata, prefix=ex.prefix)
assert jit_constants.placement(lib) is not None
del ex, art, data, raw, view, arts
gc.collect()
junk = [np.full(1 << 16, 7, np.uint8) for _ in range(64)]
np.testing.assert_allclose(lib["main"](x), want, rtol=1e-5, atol=1e-5)
print("ok")
"""
    env = {**os.environ, "KILN_CACHE": "0"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_a_cache_hit_reads_its_constants_in_place(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path,
                                                  built: dict[str, Any]) -> None:
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KILN_CACHE", raising=False)
    first = kiln.compile(model(), built["target"])
    again = kiln.compile(model(), built["target"])
    assert not first.cache_hit and again.cache_hit
    content = constants(again).content
    assert isinstance(content, memoryview) and content.readonly
    assert np.frombuffer(content, np.uint8).ctypes.data % ALIGN == 0
    with again.jit() as lib:
        assert jit_constants.placement(lib) is not None
        np.testing.assert_array_equal(lib["main"](X), built["want"])


def test_an_archive_loads_its_weights_in_place(tmp_path: Path) -> None:
    """`load_module("x.tar")` reads members of 1 MiB or more into aligned memory, so the
    library it links reads the constants there: the same answers as the `.so`."""
    b = GraphBuilder(seed=73)
    h = b.op("Relu", b.linear(b.input("x", [4, 64]), 64, 640))  # 160 KiB
    b.output(b.op("MatMul", h, b.weight(640, 512)), [4, 512])  # 1.25 MiB
    ex = kiln.compile(b.model(), "llvm")
    with load_module(ex.export_library(tmp_path / "m.so")) as lib:
        want = lib["main"](X)
    with load_module(ex.export_library(tmp_path / "m.tar")) as lib:
        placed = jit_constants.placement(lib)
        assert placed is not None and all(read != home for home, read, _n in placed)
        np.testing.assert_array_equal(lib["main"](X), want)
