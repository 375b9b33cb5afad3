"""Decoders as users export them, every axis dynamic, imported with no pins (issue 59).

A tiny GPT-2 (2 layers, width 64, 4 heads, random weights after `torch.manual_seed(0)`,
transformers' default SDPA attention), exported by both torch exporters with `batch`,
`seq` and `past_seq` dynamic, with and without past key/values; and a tiny Llama with
a cache (grouped-query attention, 4 query heads over 2 key/value heads, rotary
embeddings) exported by the dynamo exporter. The dynamo exporter gets plain axis
names (`dynamic_shapes={"input_ids": {0: "batch", 1: "seq"}}`, as users write them).
Those exports hold the arithmetic kiln must prove (kiln.ir.polynomial): position ids
`Range(0, batch*seq // batch)`, and keys over the cache viewed as `[-1, past_seq + seq,
16]`. Each compiles once for llvm (one case also for c) and matches onnxruntime at two
sizes; with past key/values, a greedy loop of STEPS tokens from a prompt of 4, feeding
the present back as the past, gives onnxruntime's tokens.

The loop starts from an empty past with no pins and no bounds: a symbolic dimension
takes 0 by default, as onnxruntime's do.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from support.reference import ort_session

pytest.importorskip("torch", reason="exporting transformers models needs torch")
pytest.importorskip("transformers", reason="the models are built with transformers")

import hf_decoders

import kiln
from kiln.ir.shape_expr import dim_text

MAX_REL_L2 = 1e-4
VOCAB = 101
WIDTH = (64, 4)          # n_embd, n_head: head_dim 16
LAYERS = 2
SIZES = ({"batch": 1, "seq": 3, "past_seq": 2}, {"batch": 3, "seq": 6, "past_seq": 5})
STEPS = 8


def _decoder(past: bool) -> hf_decoders.Decoder:
    return hf_decoders.gpt2(LAYERS, past=past, vocab=VOCAB, width=WIDTH, eager=False)


def _rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want)
                 / max(float(np.linalg.norm(want)), 1e-30))


def _outputs(result: Any) -> list[np.ndarray]:
    return [np.asarray(r) for r in (result if isinstance(result, (tuple, list)) else [result])]


def _export(past: bool, exporter: str) -> tuple[hf_decoders.Decoder, Any]:
    if exporter == "dynamo":
        pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
    decoder = _decoder(past)
    return decoder, hf_decoders.export(decoder, exporter, plain_names=True)


def _check_sizes(decoder: hf_decoders.Decoder, model: Any, run: Any) -> None:
    session = ort_session(model)
    for sizes in SIZES:
        feeds = hf_decoders.feeds(decoder, sizes, seed=sum(sizes.values()))
        wants = session.run(None, feeds)
        gots = _outputs(run(*feeds.values()))
        assert len(gots) == len(wants) == len(decoder.outputs)
        for name, got, want in zip(decoder.outputs, gots, wants, strict=True):
            assert got.shape == want.shape, f"{name} at {sizes}"
            err = _rel_l2(got, want)
            assert err < MAX_REL_L2, f"{name} at {sizes}: rel. L2 {err:.2e}"


@pytest.mark.slow  # exports and compiles: runs first (tests/conftest.py)
@pytest.mark.parametrize(("past", "exporter"), [(False, "torchscript"), (False, "dynamo"),
                                                (True, "torchscript"), (True, "dynamo")])
def test_gpt2_as_exported_matches_onnxruntime(past: bool, exporter: str) -> None:
    decoder, model = _export(past, exporter)
    module = kiln.frontend.from_onnx(model)   # no pins, no bounds
    named = {i.name: [d for d in i.dims if isinstance(d, str)] for i in decoder.inputs}
    assert {p.name: [dim_text(d) for d in p.type.shape if not isinstance(d, int)]
            for p in module["main"].params} == named   # every axis symbolic
    targets = ("llvm", "c") if (past, exporter) == (True, "torchscript") else ("llvm",)
    for target in targets:
        main = kiln.compile(module, target)["main"]
        _check_sizes(decoder, model, main)
    if past:  # the last one compiled
        _check_greedy_loop(decoder, model, main)


def _greedy(step: Any, prompt: np.ndarray, decoder: hf_decoders.Decoder) -> list[list[int]]:
    """STEPS tokens of greedy decoding from an empty past: `step(ids, *past)` returns the
    logits and the present key/values, fed back as the next past."""
    sizes = {"batch": prompt.shape[0], "past_seq": 0}
    past = [np.zeros(tuple(sizes[d] if isinstance(d, str) else d for d in i.dims), np.float32)
            for i in decoder.inputs[1:]]
    ids, tokens = prompt, []
    for _ in range(STEPS):
        logits, *present = _outputs(step(ids, *past))
        token = np.argmax(logits[:, -1, :], axis=-1)
        tokens.append(token.tolist())
        ids, past = token[:, None].astype(np.int64), present
    return tokens


def _check_greedy_loop(decoder: hf_decoders.Decoder, model: Any, main: Any) -> None:
    session = ort_session(model)
    names = [i.name for i in decoder.inputs]
    prompt = np.random.default_rng(5).integers(0, VOCAB, (2, 4)).astype(np.int64)
    want = _greedy(lambda *a: session.run(None, dict(zip(names, a, strict=True))), prompt,
                   decoder)
    got = _greedy(main, prompt, decoder)
    assert got == want, f"kiln {got}, onnxruntime {want}"


@pytest.mark.slow  # an export and a compile: runs first (tests/conftest.py)
def test_llama_with_a_cache_as_exported_matches_onnxruntime() -> None:
    # Grouped-query attention (4 query heads over 2 key/value heads) and rotary
    # embeddings whose positions start at past_seq. The dynamo exporter only: the
    # TorchScript export of the same model takes minutes to compile on 2 cores.
    pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
    decoder = hf_decoders.llama(LAYERS, vocab=VOCAB, past=True, width=(64, 4, 2), eager=False)
    model = hf_decoders.export(decoder, "dynamo", plain_names=True)
    main = kiln.compile(kiln.frontend.from_onnx(model), "llvm")["main"]
    _check_sizes(decoder, model, main)
    _check_greedy_loop(decoder, model, main)
