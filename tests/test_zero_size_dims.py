"""Zero-size symbolic dimensions (issue 59): an empty batch, the empty past of a generation
loop's first step and an empty sequence run as onnxruntime runs them, on llvm and c, from
Python, from an exported library in a fresh process and from plain C; a Reshape whose -1
would divide by 0 is refused at call time naming the node, as onnxruntime refuses it;
explicit bounds (`shape_dict`, `kiln.SessionOptions.shape_dict`) still hold."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest

import kiln
from kiln.errors import CallError, UsageError
from support.c_programs import program_and_library
from support.dynamic_models import cnn, encoder
from support.graphs import GraphBuilder
from support.graphs import value_info as vi
from support.processes import outputs_in_fresh_process
from support.reference import onnxruntime_outputs

WIDTH, HEADS = 16, 2
HEAD = WIDTH // HEADS


def _mlp() -> onnx.ModelProto:
    b = GraphBuilder(3)
    h = b.op("Relu", b.proj("x", 32, 64))
    b.nodes.append(onnx.helper.make_node("Softmax", [b.proj(h, 64, 10)], ["probs"], axis=-1))
    return b.model([vi("x", ["batch", 32])], [vi("probs", ["batch", 10])], 17, "mlp")


def _rows() -> onnx.ModelProto:
    """The row kernels over `[batch, seq, 8]`: a mean over seq (over no element it is 0,
    as onnxruntime gives it, not 0/0), a Softmax over seq, a LayerNorm of each row."""
    b = GraphBuilder(4)
    for out, value in (("mean", b.op("ReduceMean", "x", axes=[1], keepdims=0)),
                       ("soft", b.op("Softmax", "x", axis=1)), ("norm", b.layer_norm("x", 8))):
        b.nodes.append(onnx.helper.make_node("Identity", [value], [out]))
    return b.model([vi("x", ["batch", "seq", 8])],
                   [vi("mean", ["batch", 8]), vi("soft", ["batch", "seq", 8]),
                    vi("norm", ["batch", "seq", 8])], 17, "rows")


def _lstm() -> onnx.ModelProto:
    """An LSTM over `[seq, 2, 4]`: an empty sequence gives the initial (zero) state."""
    b = GraphBuilder(6)
    b.node("LSTM", ["x", b.weight(1, 32, 4), b.weight(1, 32, 8)], ["y", "h"], hidden_size=8)
    return b.model([vi("x", ["seq", 2, 4])], [vi("y", ["seq", 1, 2, 8]), vi("h", [1, 2, 8])],
                   14, "lstm")


def _attention() -> onnx.ModelProto:
    """One decoder attention block over a key/value cache `past_seq` long: LayerNorm,
    q/k/v projections split into heads, the cache concatenated with the new keys and
    values (returned as the present), a causal mask from Range(0, past + seq) and
    Range(past, past + seq) as GPT-2 exports it, Softmax, the output projection."""
    b = GraphBuilder(5)
    i64 = lambda *v: b.const(np.array(v, np.int64), "i")  # noqa: E731
    h = b.layer_norm("x", WIDTH)

    def heads(x: str) -> str:  # [batch, seq, 16] -> [batch, 2, seq, 8]
        return b.op("Transpose", b.op("Reshape", x, i64(0, 0, HEADS, HEAD)), perm=[0, 2, 1, 3])

    q, k, v = (heads(b.proj(h, WIDTH, WIDTH)) for _ in range(3))
    b.node("Concat", ["past_k", k], ["present_k"], axis=2)
    b.node("Concat", ["past_v", v], ["present_v"], axis=2)
    past = b.op("Gather", b.op("Shape", "past_k"), i64(2), axis=0)
    seq = b.op("Gather", b.op("Shape", "x"), i64(1), axis=0)
    total = b.op("Add", past, seq)
    one = b.const(np.array(1, np.int64), "one")
    kv_pos = b.op("Range", b.const(np.array(0, np.int64), "zero"), total, one)
    q_pos = b.op("Unsqueeze", b.op("Range", past, total, one), i64(1))
    allowed = b.op("LessOrEqual", kv_pos, q_pos)
    scores = b.op("Div", b.op("MatMul", q, b.op("Transpose", "present_k", perm=[0, 1, 3, 2])),
                  b.const(np.array(np.sqrt(HEAD), np.float32), "scale"))
    scores = b.op("Where", allowed, scores, b.const(np.array(-1e9, np.float32), "masked"))
    ctx = b.op("MatMul", b.op("Softmax", scores, axis=-1), "present_v")
    merged = b.op("Reshape", b.op("Transpose", ctx, perm=[0, 2, 1, 3]), i64(0, 0, WIDTH))
    b.nodes.append(onnx.helper.make_node("Identity", [b.proj(merged, WIDTH, WIDTH)], ["y"]))
    cache = ["batch", HEADS, "past_seq", HEAD]
    return b.model([vi("x", ["batch", "seq", WIDTH]), vi("past_k", cache), vi("past_v", cache)],
                   [vi("y", ["batch", "seq", WIDTH]),
                    vi("present_k", ["batch", HEADS, "past_seq + seq", HEAD]),
                    vi("present_v", ["batch", HEADS, "past_seq + seq", HEAD])], 17, "attention")


def _feeds(model: onnx.ModelProto, sizes: dict[str, int]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(sum(sizes.values()))
    return {v.name: rng.standard_normal(
        [d.dim_value if d.HasField("dim_value") else sizes[d.dim_param]
         for d in v.type.tensor_type.shape.dim]).astype(np.float32) for v in model.graph.input}


MODELS = {"mlp": _mlp(), "cnn": cnn(), "attention": _attention(), "rows": _rows(),
          "lstm": _lstm()}
# Each model at sizes with a 0 (and one without, so the one library serves both).
SIZES = {
    "mlp": [{"batch": 0}, {"batch": 3}],
    "cnn": [{"batch": 0}, {"batch": 2}],
    "rows": [{"batch": 2, "seq": 0}, {"batch": 0, "seq": 3}, {"batch": 2, "seq": 3}],
    "lstm": [{"seq": 0}, {"seq": 3}],
    "attention": [{"batch": 2, "seq": 3, "past_seq": 0},   # a generation loop's first step
                  {"batch": 2, "seq": 1, "past_seq": 3},   # a later step
                  {"batch": 0, "seq": 3, "past_seq": 0},   # an empty batch
                  {"batch": 2, "seq": 0, "past_seq": 3}],  # an empty sequence
}
_BUILT: dict[tuple[str, str], kiln.driver.Executable] = {}


def _compiled(name: str, target: str) -> kiln.driver.Executable:
    if (name, target) not in _BUILT:
        _BUILT[name, target] = kiln.compile(kiln.frontend.from_onnx(MODELS[name]), target)
    return _BUILT[name, target]


def _assert_like(gots: object, wants: list[np.ndarray], what: str) -> None:
    gots = list(gots) if isinstance(gots, (tuple, list)) else [gots]
    assert len(gots) == len(wants)
    for got, want in zip(gots, wants, strict=True):
        got = np.asarray(got)
        assert got.shape == want.shape, f"{what}: {got.shape} != {want.shape}"
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=what)


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_zero_sizes_run_as_onnxruntime_runs_them(name: str, target: str) -> None:
    ex = _compiled(name, target)
    assert all(d["min"] == 0 and d["max"] is None for d in ex["main"].signature["dims"])
    for sizes in SIZES[name]:
        feed = _feeds(MODELS[name], sizes)
        wants = onnxruntime_outputs(MODELS[name], feed)
        assert ex["main"].output_shapes(*feed.values()) == [w.shape for w in wants]
        _assert_like(ex["main"](*feed.values()), wants, f"{name} at {sizes}")


def test_the_first_generation_step_runs_from_an_exported_library(tmp_path: Path) -> None:
    # the c backend's library (plain C from Python, and dynamic.c below, take both)
    feed = _feeds(MODELS["attention"], {"batch": 2, "seq": 3, "past_seq": 0})
    got = outputs_in_fresh_process(_compiled("attention", "c"), feed, tmp_path, threads=2)
    _assert_like(got, onnxruntime_outputs(MODELS["attention"], feed), "fresh process")


@pytest.fixture(scope="module", params=["llvm", "c"])
def cnn_program(request: pytest.FixtureRequest,
                tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """examples/c_deploy/dynamic.c and the CNN's library (one backend)."""
    return program_and_library(request, tmp_path_factory, MODELS["cnn"], "dynamic")


@pytest.mark.parametrize("explicit", [False, True])
def test_plain_c_runs_an_empty_batch(cnn_program: tuple[Path, Path], tmp_path: Path,
                                     explicit: bool) -> None:
    # explicit: the entry checks the given result shape; else output_shapes_main gives it
    program, lib = cnn_program
    (tmp_path / "image.bin").write_bytes(b"")
    proc = subprocess.run([str(program), str(lib), "kiln_", "main",
                           f"{tmp_path / 'out.bin'}:{'0,10' if explicit else '2'}",
                           f"{tmp_path / 'image.bin'}:float32:0,3,16,16"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "shape 0,10"
    assert (tmp_path / "out.bin").read_bytes() == b""


def test_a_reshape_minus_one_over_zero_is_refused_naming_the_node() -> None:
    # The head merge Reshape(ctx, [0, 0, -1]) divides the element count by batch*seq;
    # onnxruntime refuses it at batch 0, and so does kiln, at call time, by node.
    model = encoder(layers=1, width=16, heads=2, ffn=32)
    feed = {"features": np.zeros((0, 4, 16), np.float32), "mask": np.ones((0, 4), np.int64)}
    with pytest.raises(Exception, match="Reshape"):
        onnxruntime_outputs(model, feed)
    ex = kiln.compile(kiln.frontend.from_onnx(model), "llvm")
    match = (r"main: node 'reshape_\d+' \(Reshape\): the -1 of shape \[batch, seq, -1\] divides "
             r"the element count by batch\*seq, which is 0 here \(onnxruntime refuses it too\)")
    for call in (ex["main"], ex["main"].output_shapes):
        with pytest.raises(CallError, match=match):
            call(*feed.values())
    feed = {"features": np.ones((2, 4, 16), np.float32), "mask": np.ones((2, 4), np.int64)}
    assert ex["main"].output_shapes(*feed.values()) == [(2, 4, 16)]


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_a_global_pool_over_an_empty_image_is_refused_naming_the_node(target: str) -> None:
    b = GraphBuilder()
    b.node("GlobalAveragePool", ["x"], ["y"], name="gap")
    model = b.model([vi("x", ["n", 4, "h", "w"])], [vi("y", ["n", 4, 1, 1])], 13)
    ex = kiln.compile(kiln.frontend.from_onnx(model), target)
    empty = np.zeros((1, 4, 0, 3), np.float32)
    with pytest.raises(Exception, match="GlobalAveragePool"):
        onnxruntime_outputs(model, {"x": empty})
    with pytest.raises(CallError, match=r"main: node 'gap' \(GlobalAveragePool\): a global "
                                        r"pool's window is the whole image, of h\*w elements, "
                                        r"which is 0 here"):
        ex["main"](empty)
    feed = {"x": np.ones((0, 4, 2, 3), np.float32)}  # an empty batch is fine
    _assert_like(ex["main"](*feed.values()), onnxruntime_outputs(model, feed), "empty batch")


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_a_conv_over_an_image_smaller_than_its_kernel_is_refused_naming_the_node(
        target: str) -> None:
    # onnxruntime's Conv refuses an empty or negative output image ("Invalid input
    # shape"), where its pools give an empty result; kiln refuses the same, by node
    b = GraphBuilder()
    b.consts({"w": np.ones((2, 3, 3, 3), np.float32)})
    b.node("Conv", ["x", "w"], ["y"], name="conv")
    model = b.model([vi("x", ["n", 3, "h", "w"])], [vi("y", ["n", 2, None, None])], 13)
    ex = kiln.compile(kiln.frontend.from_onnx(model), target)
    for h, size in ((2, 0), (1, -1)):
        small = np.ones((1, 3, h, 4), np.float32)
        with pytest.raises(Exception, match="Invalid input shape"):
            onnxruntime_outputs(model, {"x": small})
        with pytest.raises(CallError, match=rf"main: node 'conv' \(Conv\): Conv's output image "
                                            rf"is h - 2 along spatial axis 0 .*, which is "
                                            rf"{size} here"):
            ex["main"](small)
    for shape in ((0, 3, 3, 5), (2, 3, 3, 3)):   # an empty batch, the smallest image
        feed = {"x": np.ones(shape, np.float32)}
        _assert_like(ex["main"](*feed.values()), onnxruntime_outputs(model, feed), str(shape))


def test_explicit_bounds_still_refuse_sizes_outside_them() -> None:
    model = MODELS["attention"]
    mod = kiln.frontend.from_onnx(model, {"past_seq": range(1, 5), "batch": range(0, 3)})
    ex = kiln.compile(mod, "c")
    dims = {d["name"]: (d["min"], d["max"]) for d in ex["main"].signature["dims"]}
    assert dims == {"batch": (0, 2), "past_seq": (1, 4), "seq": (0, None)}
    for sizes, text in (({"past_seq": 0}, "'past_seq' = 0 is below its minimum 1"),
                        ({"past_seq": 5}, "'past_seq' = 5 is above its maximum 4"),
                        ({"batch": 3}, "'batch' = 3 is above its maximum 2")):
        feed = _feeds(model, {"batch": 1, "seq": 2, "past_seq": 2, **sizes})
        with pytest.raises(CallError, match=f"main: dimension {text}"):
            ex["main"](*feed.values())
    feed = _feeds(model, {"batch": 0, "seq": 2, "past_seq": 4})
    _assert_like(ex["main"](*feed.values()), onnxruntime_outputs(model, feed), "in range")


def test_a_session_runs_an_empty_batch(tmp_path: Path) -> None:
    path = tmp_path / "mlp.onnx"
    onnx.save(MODELS["mlp"], path)
    feed = _feeds(MODELS["mlp"], {"batch": 0})
    sess = kiln.InferenceSession(str(path))
    assert sess.get_inputs()[0].shape == ["batch", 32]
    _assert_like(sess.run(None, feed), onnxruntime_outputs(path, feed), "default bounds")


def test_session_options_take_shape_dict_bounds(tmp_path: Path) -> None:
    path = tmp_path / "attention.onnx"
    onnx.save(MODELS["attention"], path)
    first = _feeds(MODELS["attention"], {"batch": 1, "seq": 4, "past_seq": 0})
    want = onnxruntime_outputs(path, first)
    opts = kiln.SessionOptions()
    opts.shape_dict = {"past_seq": range(0, 4)}
    sess = kiln.InferenceSession(str(path), opts)
    _assert_like(sess.run(None, first), want, "past_seq in range(0, 4)")
    late = _feeds(MODELS["attention"], {"batch": 1, "seq": 1, "past_seq": 4})
    with pytest.raises(CallError, match="dimension 'past_seq' = 4 is above its maximum 3"):
        sess.run(None, late)
    library = _compiled("mlp", "llvm").export_library(tmp_path / "mlp.so")
    with pytest.raises(UsageError, match="shape_dict applies when the session compiles"):
        kiln.InferenceSession(str(library), opts)
