"""One library for every size: models with symbolic dimensions compiled once, exported,
loaded in a fresh process and run at many sizes against onnxruntime (llvm and c).

The encoder has symbolic `(batch, seq)` shared by its two inputs (features and an
attention mask): Reshape with 0/-1 targets, attention, LayerNormalization, Gelu. The
CNN has a symbolic batch. The checks of docs/abi.md ("check 7") name the dimension
and both arguments, from Python here and from C in test_c_dynamic.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import kiln
from kiln.errors import CallError
from kiln.frontend.onnx import from_onnx
from kiln.runtime import load_module
from kiln.script import from_source
from kiln.transform.pipeline import default_graph_pipeline
from support.dynamic_models import cnn, encoder, feeds, reference
from support.numerics import rel_l2

TARGETS = ["llvm", "c"]
ENCODER_SIZES = [(1, 1), (1, 32), (3, 7), (2, 200), (1, 512)]
CNN_BATCHES = [1, 3, 8]

# Runs in a fresh interpreter: load the library, run every feed, save the results.
RUNNER = """
import sys
import numpy as np
from kiln.runtime import load_module
lib = load_module(sys.argv[1])
feeds = np.load(sys.argv[2])
count = int(feeds["count"])
names = [str(n) for n in feeds["names"]]
out = {}
for k in range(count):
    out[f"r{k}"] = lib["main"](*[feeds[f"{k}_{n}"] for n in names])
np.savez(sys.argv[3], **out)
"""


def _encoder() -> onnx.ModelProto:
    return encoder(layers=2, width=32, heads=2, ffn=64, gelu_op=True)


@pytest.fixture(scope="module", params=[
    # one xdist worker runs each target's tests (`make test` distributes with --dist
    # loadgroup): both models are compiled once per target, not once per worker
    pytest.param(t, marks=pytest.mark.xdist_group(f"native-dynamic-{t}")) for t in TARGETS])
def libraries(request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[kiln.Executable, Path]]:
    """Per model: the executable compiled once for symbolic sizes, and its exported .so."""
    tmp = tmp_path_factory.mktemp(f"dyn_{request.param}")
    out = {}
    for name, model in (("encoder", _encoder()), ("cnn", cnn())):
        exe = kiln.compile(from_onnx(model), request.param)
        exe.export_library(tmp / f"{name}.so")
        out[name] = (exe, tmp / f"{name}.so")
    return out


def _run_fresh(lib: Path, feeds_list: list[dict[str, np.ndarray]], tmp: Path) -> list[np.ndarray]:
    names = list(feeds_list[0])
    arrays = {f"{k}_{n}": f[n] for k, f in enumerate(feeds_list) for n in names}
    np.savez(tmp / "feeds.npz", count=len(feeds_list), names=np.array(names), **arrays)
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(lib), str(tmp / "feeds.npz"),
                           str(tmp / "out.npz")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    results = np.load(tmp / "out.npz")
    return [results[f"r{k}"] for k in range(len(feeds_list))]


def test_the_encoder_runs_every_size_from_one_library(libraries, tmp_path) -> None:
    exe, so = libraries["encoder"]
    model = _encoder()
    feeds_list = [feeds(model, {"batch": b, "seq": s}) for b, s in ENCODER_SIZES]
    fresh = _run_fresh(so, feeds_list, tmp_path)
    for (b, s), feed, got in zip(ENCODER_SIZES, feeds_list, fresh):
        want = reference(model, feed)
        assert got.shape == (b, s, 32)
        assert rel_l2(got, want) < 1e-4, (b, s)
        in_process = exe["main"](*feed.values())
        np.testing.assert_array_equal(in_process, got)  # same code, bit for bit


def test_the_cnn_runs_every_batch_from_one_library(libraries, tmp_path) -> None:
    _, so = libraries["cnn"]
    model = cnn()
    feeds_list = [feeds(model, {"batch": b}) for b in CNN_BATCHES]
    for batch, feed, got in zip(CNN_BATCHES, feeds_list, _run_fresh(so, feeds_list, tmp_path)):
        assert got.shape == (batch, 10)
        assert rel_l2(got, reference(model, feed)) < 1e-4, batch


def test_out_and_output_shapes(libraries) -> None:
    exe, _ = libraries["encoder"]
    main = exe["main"]
    feed = feeds(_encoder(), {"batch": 3, "seq": 7})
    assert main.output_shapes(*feed.values()) == [(3, 7, 32)]
    out = np.full((3, 7, 32), np.nan, np.float32)
    assert main(*feed.values(), out=out) is out
    np.testing.assert_array_equal(out, main(*feed.values()))
    with pytest.raises(CallError, match=re.escape(
            "main: dimension 'seq' is 7 in argument 0 'features' but 8 in argument 2 "
            "'encoded'")):
        main(*feed.values(), out=np.empty((3, 8, 32), np.float32))


def test_a_dimension_with_two_sizes_names_it_and_both_inputs(libraries) -> None:
    main = libraries["encoder"][0]["main"]
    features = feeds(_encoder(), {"batch": 2, "seq": 7})["features"]
    mask = np.ones((2, 9), np.int64)
    with pytest.raises(CallError) as err:
        main(features, mask)
    assert str(err.value) == ("main: dimension 'seq' is 7 in argument 0 'features' but 9 in "
                              "argument 1 'mask'")


def test_a_dimension_outside_its_bounds_is_refused() -> None:
    model = cnn()
    exe = kiln.compile(from_onnx(model, shape_dict={"batch": range(2, 5)}), "llvm")
    main = exe["main"]
    assert exe.metadata["functions"]["main"]["dims"] == [{"name": "batch", "min": 2, "max": 4}]
    with pytest.raises(CallError, match=re.escape("main: dimension 'batch' = 1 is below its "
                                                  "minimum 2")):
        main(feeds(model, {"batch": 1})["image"])
    with pytest.raises(CallError, match=re.escape("main: dimension 'batch' = 5 is above its "
                                                  "maximum 4")):
        main(feeds(model, {"batch": 5})["image"])
    feed = feeds(model, {"batch": 3})
    assert rel_l2(main(feed["image"]), reference(model, feed)) < 1e-4
    assert "1 <= batch" not in exe.inspect() and "2 <= batch <= 4" in exe.inspect()


def test_the_lowered_module_prints_and_parses_back() -> None:
    """The symbolic workspace (offsets as expressions) round-trips through the DSL, and
    the reference interpreter runs the lowered module (dims passed last, by name order)."""
    model = encoder(layers=1, width=16, heads=2, ffn=32)
    mod = default_graph_pipeline()(from_onnx(model))
    feed = feeds(model, {"batch": 2, "seq": 5})
    out = np.zeros((2, 5, 16), np.float32)
    kiln.evaluate(mod, "main", feed["features"], feed["mask"], out, 2, 5)
    assert rel_l2(out, reference(model, feed)) < 1e-4
    text = mod.script()
    assert "def main(" in text and "seq: T.int64" in text
    back = from_source(text)
    for name, fn in mod.functions.items():  # kernels share main's variables by name
        kiln.ir.assert_structural_equal(back.functions[name], fn, map_free_vars=True)


def test_inspect_shows_the_symbolic_shapes(libraries) -> None:
    _, so = libraries["encoder"]
    proc = subprocess.run([sys.executable, "-m", "kiln", "inspect", str(so)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"input\s+features\s+\(batch, seq, 32\)\s+float32", proc.stdout)
    assert re.search(r"dim\s+seq\s+0 <= seq", proc.stdout)  # sizes from 0, as onnxruntime
    assert load_module(str(so)).metadata["functions"]["main"]["params"][1]["shape"] == [
        "batch", "seq"]
    report = so.with_suffix(".html")
    proc = subprocess.run([sys.executable, "-m", "kiln", "inspect", str(so), "--report",
                           str(report)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "workspace batch*seq*" in report.read_text()  # the size's expression


def test_the_llvmjit_target_checks_and_runs_in_python() -> None:
    """llvmjit has no C entry: RawKernelFunction binds, checks and passes the dims."""
    model = _encoder()
    main = kiln.compile(from_onnx(model), "llvmjit")["main"]
    assert type(main).__name__ == "RawKernelFunction"
    for b, s in ((1, 1), (3, 7), (2, 40)):
        feed = feeds(model, {"batch": b, "seq": s})
        assert rel_l2(main(*feed.values()), reference(model, feed)) < 1e-4
    with pytest.raises(CallError, match=re.escape(
            "main: dimension 'seq' is 7 in argument 0 'features' but 9 in argument 1 'mask'")):
        main(np.zeros((2, 7, 32), np.float32), np.ones((2, 9), np.int64))


def test_kiln_run_fills_symbolic_inputs_at_the_sizes_given(libraries) -> None:
    _, so = libraries["encoder"]
    run = [sys.executable, "-m", "kiln", "run", str(so), "--fill", "random"]
    proc = subprocess.run([*run, "--size", "batch=2", "--size", "seq=9"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "encoded: shape (2, 9, 32) dtype float32" in proc.stdout
    proc = subprocess.run(run, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "input 'features' has the symbolic shape [batch, seq, 32]" in proc.stderr
    assert "--size NAME=N" in proc.stderr


@pytest.mark.parametrize("dim", ["if", "batch size", "名前", "None", "0"])
def test_any_dim_param_name_round_trips_through_a_library(dim: str, tmp_path) -> None:
    """A dim_param is a model's string: it becomes an identifier that no Python keyword
    spells, so the library's metadata and the C entry hold it safely."""
    model = cnn(dim)
    exe = kiln.compile(from_onnx(model), "c")
    exe.export_library(tmp_path / "m.so")
    lib = load_module(str(tmp_path / "m.so"))
    (name,) = [d["name"] for d in lib.metadata["functions"]["main"]["dims"]]
    assert name.isidentifier()
    feed = feeds(model, {dim: 3})
    assert rel_l2(lib["main"](*feed.values()), reference(model, feed)) < 1e-4
    assert lib["main"](np.zeros((0, 3, 16, 16), np.float32)).shape == (0, 10)
    with pytest.raises(CallError, match=re.escape(f"expected shape [{name}, 3, 16, 16]")):
        lib["main"](np.zeros((2, 4, 16, 16), np.float32))
