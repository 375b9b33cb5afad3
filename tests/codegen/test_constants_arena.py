"""The weights of a model file are read once into an arena that becomes the
library's weight blob as it stands (no copy), and the library still matches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import kiln
from kiln.codegen.constants import CONST_ALIGN, ConstantPool
from kiln.frontend import from_onnx
from kiln.ir import graph as g
from kiln.ops import pack_memory
from kiln.transform import PassContext
from support.graphs import GraphBuilder
from support.reference import ort_session


def _mlp(path: Path) -> np.ndarray:
    rng = np.random.default_rng(1)
    w1 = rng.standard_normal((64, 48)).astype(np.float32)
    w2 = rng.standard_normal((10, 48)).astype(np.float32)  # Gemm transB: read in place
    b2 = rng.standard_normal((10,)).astype(np.float32)
    b = GraphBuilder()
    b.node("MatMul", ["x", "w1"], ["h"])
    b.node("Relu", ["h"], ["r"])
    b.node("Gemm", ["r", "w2", "b2"], ["y"], transB=1)
    b.consts({"w1": w1, "w2": w2, "b2": b2})
    b.input("x", [3, 64])
    b.output("y", [3, 10])
    onnx.save(b.model(name="mlp"), path)
    return rng.standard_normal((3, 64)).astype(np.float32)


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_arena_is_the_weight_blob(tmp_path: Path, target: str,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # a large model's arena lies on a mapping of small pages (kiln.ops.pack_memory):
    # map this small one too, so the adoption sees an arena that views a buffer
    monkeypatch.setattr(pack_memory, "MIN_MAPPED_BYTES", 1)
    x = _mlp(tmp_path / "m.onnx")
    mod = from_onnx(str(tmp_path / "m.onnx"))
    # block-matmuls packs dense weights into new arrays (one copy, like folded BatchNorm);
    # this test is about weights the compiler keeps as they are
    with PassContext(config={"kiln.cache": False}, disabled_passes=["block-matmuls"]):
        ex = kiln.compile(mod, target)
    consts = next(a for a in ex.artifacts if a.file_name == "constants.bin")
    assert isinstance(consts.content, memoryview) and consts.content.readonly
    weights = [a for f in mod.graph_funcs().values() for b in f.bindings
               for a in getattr(b.value, "args", ()) if isinstance(a, g.Constant)]
    # views of the arena, an array over the mapping's buffer (not numpy's memory)
    assert all(isinstance(w.data.base, np.ndarray) and isinstance(w.data.base.base, memoryview)
               for w in weights)
    blob = np.frombuffer(consts.content, np.uint8)
    assert weights and all(np.shares_memory(blob, w.data) for w in weights)
    want = ort_session(tmp_path / "m.onnx").run(None, {"x": x})[0]
    np.testing.assert_allclose(ex.jit()["main"](x), want, rtol=1e-5, atol=1e-5)
    lib = kiln.runtime.load_module(ex.export_library(tmp_path / "m.so"), verify_weights=True)
    np.testing.assert_allclose(lib["main"](x), want, rtol=1e-5, atol=1e-5)
    tar = kiln.runtime.load_module(ex.export_library(tmp_path / "m.tar"))
    np.testing.assert_allclose(tar["main"](x), want, rtol=1e-5, atol=1e-5)


def _arena(size: int) -> np.ndarray:
    raw = np.zeros(size + CONST_ALIGN, np.uint8)
    start = -raw.ctypes.data % CONST_ALIGN
    return raw[start:start + size]


def _pool(*arrays: np.ndarray) -> ConstantPool:
    pool = ConstantPool()
    for a in arrays:
        pool.add(a)
    pool._adopt_arena()
    return pool


def test_adoption_rules() -> None:
    arena = _arena(4096)
    a, b = arena[0:1024].view(np.float32), arena[1024:4096].view(np.float32)
    pool = _pool(b, a)  # module order differs from memory order: places are kept
    assert isinstance(pool.to_bytes(), memoryview)
    assert (pool.offset(a), pool.offset(b), pool.size) == (0, 1024, 4096)
    # Overlap, misalignment, data the module dropped, a foreign array: copied instead.
    assert isinstance(_pool(a, arena[512:1536].view(np.float32)).to_bytes(), bytes)
    assert isinstance(_pool(arena[4:1028].view(np.float32)).to_bytes(), bytes)
    assert isinstance(_pool(a, arena[3072:4096].view(np.float32)).to_bytes(), bytes)
    assert isinstance(_pool(a, np.ones(4, np.float32)).to_bytes(), bytes)
    # A constant added later (by a code generator) ends the adoption: still one blob.
    late = np.arange(3, dtype=np.float32)
    pool = _pool(a, b)
    offset = pool.add(late)
    blob = pool.to_bytes()
    assert isinstance(blob, bytes) and len(blob) == pool.size
    assert blob[offset:offset + 12] == late.tobytes()
    assert blob[:4096] == arena.tobytes()
