"""kiln.generate over a small decoder with a cache, against the same decoder recomputed
from the whole sequence in numpy at every step (no cache), so a wrong past, position or
mask changes the tokens.

The decoder: token and position embeddings `h` [batch, seq, D]; the present is the past
with this step's `h` appended along the cached axis; logits = (h + mean of the present
over the cached axis, scaled by the attention mask's sum / total) @ W. Its names are
Hugging Face's (`input_ids`, `attention_mask`, `position_ids`, `past_key_values.0.key`,
`logits`, `present.0.key`) and it takes an extra `bias` input (as an encoder's states)."""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto

import kiln
from kiln.codegen.decoder_layout import DecoderLayout, decoder_layout
from kiln.runtime import generation
from support.c_programs import EXAMPLES, build_c_program
from support.graphs import GraphBuilder

VOCAB, D, MAX_POS = 23, 8, 64
PROMPT = np.array([[3, 1, 4, 1], [5, 9, 2, 6], [5, 3, 5, 8]], np.int64)
STEPS = 12

# One compile of the decoder for the module: its tests run on one xdist worker.
pytestmark = pytest.mark.xdist_group("generation")


def _decoder(seed: int = 0, *, bias: bool = True) -> tuple[Any, dict[str, np.ndarray]]:
    b = GraphBuilder(seed)
    rng = np.random.default_rng(seed)
    w = {"emb": rng.standard_normal((VOCAB, D)).astype(np.float32),
         "pos": rng.standard_normal((MAX_POS, D)).astype(np.float32),
         "head": rng.standard_normal((D, VOCAB)).astype(np.float32)}
    b.consts(w)
    ids = b.input("input_ids", ["batch", "seq"], TensorProto.INT64)
    mask = b.input("attention_mask", ["batch", "total"], TensorProto.INT64)
    pos = b.input("position_ids", ["batch", "seq"], TensorProto.INT64)
    past = b.input("past_key_values.0.key", ["batch", 1, "past_seq", D])
    h = b.op("Add", b.op("Gather", "emb", ids), b.op("Gather", "pos", pos))
    b.node("Concat", [past, b.op("Unsqueeze", h, b.const(np.array([1]), "ax"))],
           ["present.0.key"], axis=2)
    total = b.op("Cast", b.op("ReduceSum", mask, b.const(np.array([1]), "ax"), keepdims=1),
                 to=TensorProto.FLOAT)                                  # [batch, 1]
    ctx = b.op("Div", b.op("ReduceSum", "present.0.key", b.const(np.array([2]), "ax"),
                           keepdims=0), b.op("Unsqueeze", total, b.const(np.array([2]), "ax")))
    if bias:
        ctx = b.op("Add", ctx, b.op("Unsqueeze", b.input("bias", ["batch", D]),
                                    b.const(np.array([1]), "ax")))
    b.node("MatMul", [b.op("Add", h, ctx), "head"], ["logits"])       # ctx [batch, 1, D]
    b.output("logits", ["batch", "seq", VOCAB])
    b.output("present.0.key", ["batch", 1, "total", D])
    return b.model(), w


def _reference_logits(w: dict[str, np.ndarray], seq: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """The last position's logits of every row, from the whole sequence `seq`."""
    h = w["emb"][seq] + w["pos"][np.arange(seq.shape[1])]
    ctx = h.mean(axis=1) + bias
    return (h[:, -1] + ctx) @ w["head"]


def _reference_greedy(w: dict[str, np.ndarray], bias: np.ndarray, steps: int,
                      penalty: float = 1.0) -> np.ndarray:
    seq = PROMPT.copy()
    for _ in range(steps):
        logits = _reference_logits(w, seq, bias).astype(np.float64)
        for row, seen in enumerate(seq):
            picked = logits[row, seen]
            logits[row, seen] = np.where(picked > 0, picked / penalty, picked * penalty)
        seq = np.concatenate([seq, logits.argmax(axis=-1)[:, None]], axis=1)
    return seq[:, PROMPT.shape[1]:]


@pytest.fixture(scope="module")
def built() -> tuple[Any, dict[str, np.ndarray], np.ndarray]:
    model, w = _decoder()
    bias = np.random.default_rng(1).standard_normal((PROMPT.shape[0], D)).astype(np.float32)
    return kiln.compile(kiln.frontend.from_onnx(model), "llvm"), w, bias


class _Recorder:
    """A decoder function that records each call's arguments and `out=` arrays."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.name, self.params, self.results = fn, fn.name, fn.params, fn.results
        self.calls: list[tuple[tuple[Any, ...], Any]] = []

    def output_shapes(self, *args: Any) -> list[tuple[int, ...]]:
        return list(self.fn.output_shapes(*args))

    def __call__(self, *args: Any, out: Any = None) -> Any:
        self.calls.append((args, out))
        return self.fn(*args, out=out)


def test_greedy_equals_recomputing_the_whole_sequence(built: Any) -> None:
    """The tokens are the reference's; each call writes its present into one of two
    buffers allocated for the whole generation (alternating), and the next call reads
    it there as its past, uncopied."""
    exe, w, bias = built
    streamed: list[list[int]] = []
    recorder = _Recorder(exe["main"])
    got = kiln.generate(recorder, PROMPT, STEPS, inputs={"bias": bias},
                        on_token=lambda t: streamed.append(t.tolist()))
    want = _reference_greedy(w, bias, STEPS)
    assert got.dtype == np.int64 and got.shape == (PROMPT.shape[0], STEPS)
    np.testing.assert_array_equal(got, want)
    assert streamed == got.T.tolist()
    past = [p["name"] for p in recorder.params].index("past_key_values.0.key")
    presents = [out[1] for _, out in recorder.calls]
    assert len(presents) == STEPS
    for k in range(1, STEPS):
        assert np.shares_memory(recorder.calls[k][0][past], presents[k - 1])
        assert not np.shares_memory(presents[k], presents[k - 1])
        if k > 1:
            assert presents[k].ctypes.data == presents[k - 2].ctypes.data
    penalised = kiln.generate(exe["main"], PROMPT, STEPS, inputs={"bias": bias},
                              repetition_penalty=1.7)
    np.testing.assert_array_equal(penalised, _reference_greedy(w, bias, STEPS, 1.7))
    assert not np.array_equal(penalised, got)       # the penalty changed some choice


def test_a_loaded_library_generates_the_same(built: Any, tmp_path: Any) -> None:
    exe, _, bias = built
    path = tmp_path / "decoder.so"
    exe.export_library(path)
    lib = kiln.runtime.load_module(path)
    np.testing.assert_array_equal(kiln.generate(lib, PROMPT, 5, inputs={"bias": bias}),
                                  kiln.generate(exe, PROMPT, 5, inputs={"bias": bias}))


def test_sampling_keeps_to_the_top_k_and_follows_the_seed(built: Any) -> None:
    exe, w, bias = built
    kw: dict[str, Any] = {"inputs": {"bias": bias}, "do_sample": True}
    greedy = kiln.generate(exe, PROMPT, STEPS, inputs={"bias": bias})
    np.testing.assert_array_equal(kiln.generate(exe, PROMPT, STEPS, top_k=1, seed=3, **kw), greedy)
    np.testing.assert_array_equal(kiln.generate(exe, PROMPT, STEPS, top_p=1e-6, seed=3, **kw),
                                  greedy)
    a = kiln.generate(exe, PROMPT, STEPS, top_k=3, temperature=2.0, seed=7, **kw)
    np.testing.assert_array_equal(a, kiln.generate(exe, PROMPT, STEPS, top_k=3,
                                                   temperature=2.0, seed=7, **kw))
    assert not np.array_equal(a, greedy)
    seq = PROMPT
    for step in range(STEPS):                       # every token among that step's top 3
        top3 = np.argsort(_reference_logits(w, seq, bias), axis=-1)[:, -3:]
        assert all(a[r, step] in top3[r] for r in range(len(a)))
        seq = np.concatenate([seq, a[:, step:step + 1]], axis=1)


def test_stop_tokens_end_rows_and_the_loop(built: Any) -> None:
    exe, _, bias = built
    greedy = kiln.generate(exe, PROMPT, STEPS, inputs={"bias": bias})
    stop = int(greedy[0, 2])
    got = kiln.generate(exe, PROMPT, STEPS, inputs={"bias": bias}, stop_tokens=[stop],
                        pad_token=-1)
    for row, want in zip(got, greedy, strict=True):
        end = next((k for k, t in enumerate(want) if t == stop), None)
        if end is None:
            np.testing.assert_array_equal(row, want[:len(row)])
        else:                                       # the stop token, then padding
            np.testing.assert_array_equal(row[:end + 1], want[:end + 1])
            assert (row[end + 1:] == -1).all()
    if all(stop in want for want in greedy):
        assert got.shape[1] < STEPS
    # a cache for every position of 10**15 tokens cannot be reserved: the loop allocates
    # each step's presents instead, and the stop tokens end it after the first step
    first = kiln.generate(exe, PROMPT, 10**15, inputs={"bias": bias},
                          stop_tokens=range(VOCAB))
    np.testing.assert_array_equal(first, greedy[:, :1])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({}, "missing: bias"),
    ({"inputs": {"bias": None, "other": 1}}, "not an input of the loop: other"),
    ({"inputs": {"bias": None}, "temperature": 0}, "temperature must be > 0"),
    ({"inputs": {"bias": None}, "top_p": 1.5}, "top_p must be in"),
    ({"inputs": {"bias": None}, "function": "decode"}, "no function 'decode'"),
])
def test_bad_arguments_are_refused(built: Any, kwargs: dict[str, Any], message: str) -> None:
    exe, _, _ = built
    with pytest.raises(kiln.UsageError, match=message):
        kiln.generate(exe, PROMPT, 2, **kwargs)


def test_a_function_without_a_cache_is_refused_by_name() -> None:
    b = GraphBuilder()
    b.node("Gather", [b.const(np.eye(5, dtype=np.float32)), b.input("input_ids", ["b", "s"],
                                                                  TensorProto.INT64)], ["logits"])
    b.output("logits", ["b", "s", 5])
    f = kiln.compile(kiln.frontend.from_onnx(b.model()), "llvm")["main"]
    with pytest.raises(kiln.UsageError, match="no past key/value inputs"):
        kiln.generate(f, np.zeros((1, 2), np.int64), 2, inputs={})


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_the_library_generates_from_plain_c(target: str, tmp_path: Path) -> None:
    """A decoder's library has `{prefix}_generate_main` (the same loop, in C), which
    kiln.generate runs from Python and examples/c_deploy/generate_entry.c from C: its
    tokens are the Python loop's and the reference's, with and without a stop token; its
    token callback sees every step's tokens in order and may end the loop; a failed
    step's message reaches the program."""
    model, w = _decoder(bias=False)
    exe = kiln.compile(kiln.frontend.from_onnx(model), target)
    lib = exe.export_library(tmp_path / "decoder.so")
    program = build_c_program(EXAMPLES / "generate_entry.c", tmp_path / "generate")
    loaded = kiln.runtime.load_module(lib)
    _check_last_position(exe, loaded)

    def run(stop: int, pad: int, prompt: np.ndarray = PROMPT,
            stop_after: int = 0) -> subprocess.CompletedProcess:
        return subprocess.run([str(program), str(lib), "kiln_", "main", str(STEPS),
                               str(len(prompt)), str(stop), str(pad),
                               *map(str, prompt.reshape(-1))], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "STOP_AFTER": str(stop_after)})

    streamed: list[list[int]] = []
    greedy = kiln.generate(loaded, PROMPT, STEPS, on_token=lambda t: streamed.append(t.tolist()))
    np.testing.assert_array_equal(greedy, _reference_greedy(w, np.zeros((1, D), np.float32),
                                                            STEPS))
    assert streamed == greedy.T.tolist()
    np.testing.assert_array_equal(kiln.generate(loaded, PROMPT, STEPS, native=False), greedy)
    for native in (True, False):                    # on_token ends both loops alike
        early = kiln.generate(loaded, PROMPT, STEPS, native=native,
                              on_token=lambda t: t[0] == greedy[0, 2])
        np.testing.assert_array_equal(early, greedy[:, :3])

    def fail(tokens: np.ndarray) -> None:
        raise ValueError(f"on_token failed at {tokens.tolist()}")

    with pytest.raises(ValueError, match=rf"at \[{greedy[0, 0]}, "):  # raised through C
        kiln.generate(loaded, PROMPT, STEPS, on_token=fail)
    done = run(-1, 0)
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.loadtxt(done.stdout.splitlines(), np.int64), greedy)
    assert done.stderr.splitlines() == [f"step {k}: " + " ".join(map(str, col))
                                        for k, col in enumerate(greedy.T.tolist())]
    done = run(-1, 0, stop_after=4)
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.loadtxt(done.stdout.splitlines(), np.int64), greedy[:, :4])
    assert len(done.stderr.splitlines()) == 4
    stop = int(greedy[0, 2])
    done = run(stop, -1)
    assert done.returncode == 0, done.stderr
    want = kiln.generate(loaded, PROMPT, STEPS, stop_tokens=[stop], pad_token=-1)
    np.testing.assert_array_equal(
        np.loadtxt(done.stdout.splitlines(), np.int64, ndmin=2), want)
    done = run(-1, 0, np.array([[1, VOCAB + 5]]))
    assert done.returncode == 2 and "gather: an index is out of range" in done.stderr


def _check_last_position(exe: Any, loaded: Any) -> None:
    """The decoder's companion (metadata "last_position", kiln.transform.last_position)
    returns the full call's last row of logits and the same presents; both loops run the
    prompt's call on it (the C loop's decoder table names its entry)."""
    main = loaded["main"]
    companion = loaded[main.signature["last_position"]]
    assert generation.prompt_function(main) is companion
    older = _Recorder(main)  # a library without the key (metadata 9 and before)
    older.signature, older.owner = {k: v for k, v in main.signature.items()
                                    if k != "last_position"}, loaded
    assert generation.prompt_function(older) is older
    assert "generate_symbol" not in companion.signature
    feeds = {"input_ids": PROMPT, "attention_mask": np.ones_like(PROMPT),
             "position_ids": np.tile(np.arange(PROMPT.shape[1]), (PROMPT.shape[0], 1)),
             "past_key_values.0.key": np.zeros((PROMPT.shape[0], 1, 0, D), np.float32)}
    full, last = main(**feeds), companion(**feeds)
    assert last[0].shape == (PROMPT.shape[0], 1, VOCAB)
    # the float32 product's sums round in an order that depends on the call's rows
    np.testing.assert_allclose(last[0], full[0][:, -1:], rtol=1e-6, atol=1e-5)
    np.testing.assert_array_equal(last[1], full[1])
    entry = f"{exe.prefix}main_last_position, {exe.prefix}_output_shapes_main_last_position"
    assert any(entry in a.content.decode(errors="replace") for a in exe.artifacts
               if a.file_name.endswith(".c"))


def test_a_decoder_with_other_inputs_has_no_c_loop(built: Any, tmp_path: Path) -> None:
    """The C loop cannot give an encoder's states: a decoder taking them (here `bias`)
    gets no `{prefix}_generate_main` (kiln.generate's `inputs=` is the way there)."""
    exe, _, _ = built
    lib = ctypes.CDLL(str(exe.export_library(tmp_path / "decoder.so")))
    assert hasattr(lib, "kiln__output_shapes_main") and not hasattr(lib, "kiln__generate_main")


def _builder_like_signature(**places: int) -> dict[str, Any]:
    """A decoder's metadata signature as onnxruntime-genai's builder's compiles to: its
    present's length a run-time dimension at (result, axis) `places`."""
    past = ["batch", 2, "past", 16]
    return {
        "name": "main", "kind": "graph",
        "params": [{"name": "input_ids", "kind": "tensor", "shape": ["batch", "seq"],
                    "dtype": "int64"},
                   {"name": "attention_mask", "kind": "tensor", "shape": ["batch", "total"],
                    "dtype": "int64"},
                   {"name": "past_key_values.0.key", "kind": "tensor", "shape": past,
                    "dtype": "float32"}],
        "results": [{"name": "logits", "kind": "tensor", "shape": ["batch", "seq", VOCAB],
                     "dtype": "float32"},
                    {"name": "present.0.key", "kind": "tensor",
                     "shape": ["batch", 2, "past + seq", 16], "dtype": "float32"}],
        "runtime_dims": [{"name": "present_length", "bound": "past + seq",
                          "places": [{"result": places["result"], "axis": places["axis"],
                                      "actual": "present_length"}]}]}


def test_the_c_loop_reads_a_present_length_sized_by_data() -> None:
    """A present whose cached length is known after the call only (GroupQueryAttention's
    total_sequence_length) still gets the C loop, which reads it back after each call;
    another result sized by its data (here the logits' sequence axis) gets none."""
    layout = decoder_layout(_builder_like_signature(result=1, axis=2))
    assert isinstance(layout, DecoderLayout) and layout.presents == (1,)
    assert decoder_layout(_builder_like_signature(result=0, axis=1)) == (
        "it has results sized by their data other than its presents' cached lengths")
