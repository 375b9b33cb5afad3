"""Weights past the small code model's reach (issue 60): kernels address a large pool
through a base pointer read at run time, and the weights go to x86-64's large data
sections (`.lrodata` embedded, `.lbss` for an external weights file's regions), so
nothing folds an offset into a 32-bit relocation and the code and small data stay
within +-2 GiB of each other (kiln.codegen.constants.LARGE_CONSTS_BYTES).

Always on: the path forced on a small model (the threshold lowered), llvm and c, the
library embedded and external, results against onnxruntime; and a real pool past 2 GiB
(`test_a_pool_past_two_gib`: a 2.02 GiB Gather table, cheap to make, see there). With
KILN_FULL_MODELS=1: two 16384 x 36864 float32 MatMuls (4.5 GiB of weights), built and
run for real.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

import kiln
from kiln.artifact import safe_tar
from kiln.artifact.elf import SHT_SYMTAB, read_symbols, section_name
from kiln.artifact.integrity import CHUNK_SIZE
from kiln.artifact.weights_file import read_header
from kiln.codegen import constants
from kiln.runtime import load_module
from kiln.runtime.data_object import SHF_X86_64_LARGE
from support.c_programs import EXAMPLES, build_c_program
from support.graphs import GraphBuilder
from support.processes import run_python
from support.reference import onnxruntime_outputs

FULL = os.environ.get("KILN_FULL_MODELS") == "1"
X86_64 = os.uname().machine == "x86_64"


def matmul_chain(sizes: list[int], seed: int = 60,
                 weights: list[onnx.TensorProto] | None = None) -> onnx.ModelProto:
    """`y = relu(x @ W0) @ W1 ...`, float32, x of shape (4, sizes[0]); `weights`, when
    given, are the initializers as they are (e.g. naming external data)."""
    gb = GraphBuilder(seed)
    last = gb.input("x", [4, sizes[0]])
    for i, (k, n) in enumerate(itertools.pairwise(sizes)):
        w = gb.const(weights[i]) if weights else gb.const(
            gb.rng.standard_normal((k, n), dtype=np.float32) * np.float32(k ** -0.5), f"w{i}")
        last = gb.op("MatMul", last, w)
        if i + 2 < len(sizes):
            last = gb.op("Relu", last)
    gb.nodes[-1].output[0] = "y"
    gb.output("y", [4, sizes[-1]])
    return gb.model(check=weights is None)


def large_sections(so: Path) -> dict[str, int]:
    """Size of every section of `so` flagged SHF_X86_64_LARGE, by name."""
    with open(so, "rb") as f:
        elf = read_symbols(f.fileno(), str(so), (SHT_SYMTAB,))
        return {section_name(elf, f.fileno(), i): s.size for i, s in enumerate(elf.sections)
                if s.flags & SHF_X86_64_LARGE}


@pytest.fixture(scope="module")
def forced(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The small chain compiled with the large path forced, for llvm and c, each exported
    embedded and external; onnxruntime's answer."""
    model = matmul_chain([64, 96, 48])
    x = np.random.default_rng(1).standard_normal((4, 64), dtype=np.float32)
    folder = tmp_path_factory.mktemp("large")
    out: dict[str, object] = {"x": x, "ref": onnxruntime_outputs(model, {"x": x})[0]}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(constants, "LARGE_CONSTS_BYTES", 0)
        for codegen in ("llvm", "c"):
            ex = kiln.compile(model, codegen)
            out[codegen] = ex
            out[f"{codegen}/embedded"] = Path(ex.export_library(folder / f"{codegen}.so"))
            out[f"{codegen}/external"] = Path(ex.export_library(
                folder / f"{codegen}_ext.so", weights="external"))
    return out


@pytest.mark.parametrize("codegen", ["llvm", "c"])
@pytest.mark.parametrize("weights", ["embedded", "external"])
def test_forced_large_path_matches_onnxruntime(forced, codegen, weights):
    ex = forced[codegen]
    data = [a for a in ex.artifacts if a.file_name == "constants.bin"]  # type: ignore[attr-defined]
    assert data and data[0].metadata.get("large") is True
    so = forced[f"{codegen}/{weights}"]
    with load_module(so, verify_weights=True) as lib:
        np.testing.assert_allclose(lib["main"](forced["x"]), forced["ref"], rtol=1e-5,
                                   atol=1e-5)
    if X86_64:  # the weights sit in a large-data section
        names = large_sections(so)
        assert any(n.startswith(".lrodata" if weights == "embedded" else ".lbss")
                   for n in names), names


def test_small_pools_keep_the_small_path(forced):
    ex = kiln.compile(matmul_chain([64, 96, 48]), "c")
    data = [a for a in ex.artifacts if a.file_name == "constants.bin"]
    assert "large" not in data[0].metadata
    source = next(a for a in ex.artifacts if a.file_name == "kernels.c").content
    assert b"kiln_consts_base" not in bytes(source)


def external_chain(folder: Path, sizes: list[int], seed: int) -> Path:
    """`matmul_chain(sizes)` saved with its weights as external data, written block by
    block (a ModelProto cannot hold 2 GiB, and the test never holds a weight whole)."""
    rng = np.random.default_rng(seed)
    weights = []
    with open(folder / "weights.data", "wb") as f:
        for i, (k, n) in enumerate(itertools.pairwise(sizes)):
            offset = f.tell()
            for start in range(0, k, 1024):
                rows = min(1024, k - start)
                f.write((rng.standard_normal((rows, n), dtype=np.float32)
                         * np.float32(k ** -0.5)).tobytes())
            t = TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=[k, n],
                            data_location=TensorProto.EXTERNAL)
            for key, value in (("location", "weights.data"), ("offset", str(offset)),
                               ("length", str(k * n * 4))):
                entry = t.external_data.add()
                entry.key, entry.value = key, value
            weights.append(t)
    path = folder / "chain.onnx"
    onnx.save(matmul_chain(sizes, weights=weights), path)
    return path


@pytest.mark.skipif(not FULL, reason="4.5 GiB of weights: KILN_FULL_MODELS=1")
@pytest.mark.skipif(not X86_64, reason="the large-data sections are x86-64's")
def test_four_and_a_half_gib_of_weights(tmp_path):
    model = external_chain(tmp_path, [16384, 36864, 16384], seed=4)
    x = np.random.default_rng(2).standard_normal((4, 16384), dtype=np.float32)
    options = ort.SessionOptions()  # without prepacking, which would copy the 4.5 GiB
    options.add_session_config_entry("session.disable_prepacking", "1")
    ref = onnxruntime_outputs(model, {"x": x}, options)[0]
    ex = kiln.compile(model, "llvm")
    libraries = [ex.export_library(tmp_path / "big.so"),
                 ex.export_library(tmp_path / "big_ext.so", weights="external")]
    del ex
    for so in libraries:
        with load_module(so) as lib:
            np.testing.assert_allclose(lib["main"](x), ref, rtol=1e-4, atol=1e-4)
    deploy = build_c_program(EXAMPLES / "deploy.c", tmp_path / "deploy")
    x.tofile(tmp_path / "x.bin")
    for so in libraries:  # plain C: maps the .weights, checks the chunks, runs
        subprocess.run([str(deploy), str(so), "kiln_", str(tmp_path / "x.bin"), "4,16384",
                        str(tmp_path / "y.bin"), "4,16384"], check=True, timeout=600)
        np.testing.assert_allclose(np.fromfile(tmp_path / "y.bin", np.float32).reshape(4, -1),
                                   ref, rtol=1e-4, atol=1e-4)
    # The object's `.lrodata.kiln__blob` is `.lrodata` in the linked library.
    assert any(n.startswith(".lrodata") for n in large_sections(libraries[0]))


def test_an_archive_over_the_readers_limits_is_refused_at_export(forced, tmp_path, monkeypatch):
    monkeypatch.setattr(safe_tar, "MAX_MEMBER_BYTES", 1000)
    with pytest.raises(kiln.ExportError, match=r"is \d+ bytes and the artifacts.*export a \.so"):
        forced["llvm"].export_library(tmp_path / "big.tar")  # type: ignore[attr-defined]
    assert not (tmp_path / "big.tar").exists()


# The always-on case past 2 GiB. `table[r] = block[r % PERIOD]` (PERIOD rows of
# random floats, an odd count so that no power-of-two offset error lands on an equal
# row) and `y = table[i] + bias`: the data file is the block written over and over (no
# random numbers for 2 GiB), and the reference is exact math in numpy
# (`block[i % PERIOD] + bias`, one float32 add, so the comparison is exact and needs
# no onnxruntime). A Gather keeps the table as imported: the pool is the importer's
# array, with no packed copy (a MatMul's panels would double the memory and the time).
# The bias is stored after the table, past 2 GiB, in the ONNX data file and in the pool.
TABLE_COLS = 4096  # one row is 16 KiB
TABLE_ROWS = (1 << 31) // (TABLE_COLS * 4) + 1536  # 2.02 GiB, 519 chunks of 4 MiB
PERIOD = 61
# Rows at 0, 1 GiB, the last row below 2 GiB, the first one at 2 GiB, the last row.
ROWS = [0, 1 << 16, (1 << 17) - 1, 1 << 17, TABLE_ROWS - 1]
POOL_ROOM = 7 << 30  # the process holds the pool; the ONNX data, .o, .so, .weights


def external_tensor(name: str, dims: list[int], offset: int) -> onnx.TensorProto:
    """A float32 initializer `name` held in `table.data` at `offset`."""
    t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=dims,
                    data_location=TensorProto.EXTERNAL)
    length = 4 * int(np.prod(dims))
    for key, value in (("location", "table.data"), ("offset", str(offset)),
                       ("length", str(length))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    return t


def tiled_table_model(folder: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    """`y = Gather(table, int64(i)) + bias` saved with its weights as external data (the
    table, then the bias past 2 GiB); returns the model's path, the block and the bias.
    The row numbers come in as float32 (exact below 2^24) so that plain C's
    examples/c_deploy/deploy.c, which feeds one float32 tensor, runs it too."""
    rng = np.random.default_rng(60)
    block = rng.standard_normal((PERIOD, TABLE_COLS), dtype=np.float32)
    bias = rng.standard_normal(TABLE_COLS, dtype=np.float32)
    run = np.tile(block, (1024 // PERIOD, 1))  # ~16 MiB written per call
    with open(folder / "table.data", "wb") as f:
        for start in range(0, TABLE_ROWS, len(run)):
            f.write(run[:min(len(run), TABLE_ROWS - start)])  # the block's phase holds
        bias_at = f.tell()
        f.write(bias)
    gb = GraphBuilder()
    index = gb.op("Cast", gb.input("i", [len(ROWS)]), to=TensorProto.INT64)
    table = gb.const(external_tensor("table", [TABLE_ROWS, TABLE_COLS], 0))
    rows = gb.op("Gather", table, index)
    gb.node("Add", [rows, gb.const(external_tensor("bias", [TABLE_COLS], bias_at))], ["y"])
    gb.output("y", [len(ROWS), TABLE_COLS])
    path = folder / "table.onnx"
    onnx.save(gb.model(check=False), path)
    return path, block, bias


def room_for_the_pool(folder: Path) -> str | None:
    """Why this host cannot take the 2 GiB case, or None: free disk under `folder` and
    available memory each at least POOL_ROOM."""
    st = os.statvfs(folder)
    if st.f_bavail * st.f_frsize < POOL_ROOM:
        return f"{st.f_bavail * st.f_frsize >> 20} MiB free under {folder}"
    with open("/proc/meminfo") as f:
        available = next((int(line.split()[1]) << 10 for line in f
                          if line.startswith("MemAvailable:")), None)
    if available is None or available < POOL_ROOM:
        return f"{(available or 0) >> 20} MiB of memory available"
    return None


# In a fresh process: each library loaded with every chunk checked, run, its lane64
# table's chunk count read; then one byte past 2 GiB of the weights file flipped, and
# the load refused.
LOAD_RUN = """
import sys
import numpy as np
from kiln.runtime import load_module
from kiln.runtime.ctypes_abi import bind

embedded, external, flip_at, folder = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
index = np.load(folder + "/i.npy")
for name, so in (("embedded", embedded), ("external", external)):
    with load_module(so, verify_weights=True) as lib:
        np.save(f"{folder}/{name}.npy", lib["main"](index))
        print(name, bind(lib.cdll, lib.prefix + "_weights_chunks", "weights_chunks")())
with open(external + ".weights", "r+b") as f:
    f.seek(flip_at)
    byte = f.read(1)[0]
    f.seek(flip_at)
    f.write(bytes([byte ^ 0x40]))
try:
    with load_module(external, verify_weights=True) as lib:
        lib["main"](index)
except Exception as e:
    print("refused", type(e).__name__, e)
"""


@pytest.mark.slow
def test_a_pool_past_two_gib(tmp_path, monkeypatch):
    """A 2.02 GiB pool, compiled once, exported embedded and external, loaded in a fresh
    process and from plain C (deploy.c): the rows at and past 2 GiB, the bias after the
    table, the section sizes, the weights file's offsets and the check's chunk table
    past 512 chunks."""
    if why := room_for_the_pool(tmp_path):
        pytest.skip(f"a 2 GiB pool needs {POOL_ROOM >> 30} GiB of disk and memory: {why}")
    monkeypatch.setenv("KILN_CACHE", "0")  # the cache would hash and store 2 GiB again
    try:
        model, block, bias = tiled_table_model(tmp_path)
        ex = kiln.compile(model, "llvm")
        (tmp_path / "table.data").unlink()  # the pool holds the importer's copy
        pool = next(a for a in ex.artifacts if a.file_name == "constants.bin")
        # The table starts the pool, and the bias ends it, past 2 GiB.
        assert pool.size > (1 << 31) + 4 * TABLE_COLS
        assert bytes(pool.content[:4 * TABLE_COLS]) == block[0].tobytes()
        assert bytes(pool.content[pool.size - 4 * TABLE_COLS:pool.size]) == bias.tobytes()
        embedded = Path(ex.export_library(tmp_path / "table.so"))
        external = Path(ex.export_library(tmp_path / "table_ext.so", weights="external"))
        del ex, pool
        with open(str(external) + ".weights", "rb") as f:
            (tensor,) = read_header(f.fileno(), str(external)).tensors
        assert tensor.size > 1 << 31
        assert os.path.getsize(str(external) + ".weights") >= tensor.offset + tensor.size
        if X86_64:
            for so, section in ((embedded, ".lrodata"), (external, ".lbss")):
                sizes = large_sections(so)
                assert max(n for s, n in sizes.items() if s.startswith(section)) \
                    >= tensor.size, sizes
        np.save(tmp_path / "i.npy", np.array(ROWS, np.float32))
        want = block[np.array(ROWS) % PERIOD] + bias
        deploy = build_c_program(EXAMPLES / "deploy.c", tmp_path / "deploy")
        np.array(ROWS, np.float32).tofile(tmp_path / "i.bin")
        for so in (embedded, external):  # plain C: maps the .weights, checks, runs
            subprocess.run([str(deploy), str(so), "kiln_", str(tmp_path / "i.bin"),
                            str(len(ROWS)), str(tmp_path / "y.bin"),
                            f"{len(ROWS)},{TABLE_COLS}"], check=True, timeout=300)
            np.testing.assert_array_equal(
                np.fromfile(tmp_path / "y.bin", np.float32).reshape(want.shape), want, so.name)
        flip_at = tensor.offset + (1 << 31) + 5 * 4 * TABLE_COLS + 7  # row 2^17 + 5
        run = run_python(LOAD_RUN, str(embedded), str(external), str(flip_at), str(tmp_path))
        assert run.returncode == 0, run.stderr[-3000:]
        chunks = -(-tensor.size // CHUNK_SIZE)
        assert f"embedded {chunks}\nexternal {chunks}\n" in run.stdout
        assert "refused" in run.stdout and "damaged" in run.stdout, run.stdout
        for name in ("embedded", "external"):
            np.testing.assert_array_equal(np.load(tmp_path / f"{name}.npy"), want)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)  # 6 GiB that pytest would keep
