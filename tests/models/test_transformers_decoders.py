"""Hugging Face decoders exported with every axis dynamic, compiled once with every axis
symbolic, run at three sizes against onnxruntime (issue 23).

The models (tests/models/hf_decoders.py): GPT-2 without a cache and with past
key/values as inputs (`past_seq` symbolic, the present key/values returned), the
T5-small decoder and the Whisper-tiny decoder (with `encoder_hidden_states`,
`enc_seq` symbolic) and a Llama-architecture model from a small configuration
(rotary embeddings, RMSNorm, grouped-query attention). Random weights from the
published configurations; each export runs in the test (in memory, no network).

Each case compiles once for llvm, is exported with `export_library` and loaded back,
and the loaded library runs the three sizes; every output must match onnxruntime's
with a relative L2 error below 1e-4. One case also runs its library in a fresh process.

CI size: GPT-2 with past key/values runs with 2 decoder layers instead of the published
12 (each layer's past must reach its own layer, and its present come back as its own
output), the others with 1 (GPT-2, T5, Whisper and the Llama repeat one layer's op
patterns: every pattern is kept, and a second layer adds only export time), a
vocabulary of CI_VOCAB tokens instead of 32000 to 51865 (the embedding tables and LM
heads held most of the weights, and their export, compile and load most of the time;
their ops and widths are kept), and each model with one exporter, alternating
(`CI_EXPORTER`). The three sizes cost little: exports and compiles dominate.
`KILN_FULL_MODELS=1` runs both exporters for every model, adds the published layer
counts and vocabularies, and reports compile time and per-size latency of kiln and
onnxruntime (run with `-s` to see them).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from support.processes import child_env
from support.reference import ort_session

pytest.importorskip("torch", reason="exporting transformers models needs torch")
pytest.importorskip("transformers", reason="the models are built with transformers")

import hf_decoders

import kiln
from kiln.runtime import load_module

MAX_REL_L2 = 1e-4
FULL = os.environ.get("KILN_FULL_MODELS") == "1"
# Decoder layers in CI: two where the cache is an input, one elsewhere (module docstring).
CI_LAYERS = {"gpt2_past": 2}
# No multiple of any vector width or GEMM tile, as the published 50257 and 51865 are not.
CI_VOCAB = 2003

# Three sizes per dimension variable (the decoders use some of them each).
SIZES = ({"batch": 1, "seq": 1, "past_seq": 1, "enc_seq": 1},
         {"batch": 2, "seq": 7, "past_seq": 4, "enc_seq": 5},
         {"batch": 3, "seq": 16, "past_seq": 9, "enc_seq": 11})


# Each builder takes (layers, vocab); None keeps the published value.
MODELS = {
    "gpt2": lambda layers, vocab: hf_decoders.gpt2(layers, vocab=vocab),
    "gpt2_past": lambda layers, vocab: hf_decoders.gpt2(layers, past=True, vocab=vocab),
    "t5_decoder": hf_decoders.t5_decoder,
    "whisper_decoder": hf_decoders.whisper_decoder,
    "llama": hf_decoders.llama,
}
# The case whose library also runs in a fresh process (several outputs: the present
# key/values come back too).
FRESH_PROCESS_CASE = ("gpt2_past", "dynamo")


def _rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want)
                 / max(float(np.linalg.norm(want)), 1e-30))


def _symbolic_input_dims(mod: Any) -> dict[str, list[str]]:
    """The dimensions of each parameter of `main` that are not numbers, as texts."""
    from kiln.ir.shape_expr import dim_text

    return {p.name: [dim_text(d) for d in p.type.shape if not isinstance(d, int)]
            for p in mod["main"].params}


class Compiled:
    """One decoder exported, compiled (symbolic) and exported as a library."""

    def __init__(self, name: str, exporter: str, layers: int | None, vocab: int | None,
                 directory: Path) -> None:
        if exporter == "dynamo":
            pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
        self.decoder = MODELS[name](layers, vocab)
        self.model = hf_decoders.export(self.decoder, exporter)
        self.module = kiln.frontend.from_onnx(self.model)
        start = time.perf_counter()
        executable = kiln.compile(self.module, "llvm")
        self.compile_seconds = time.perf_counter() - start
        self.library = directory / f"{name}_{exporter}.so"
        executable.export_library(self.library)
        self.session = ort_session(self.model)

    def feeds(self, sizes: dict[str, int]) -> dict[str, np.ndarray]:
        return hf_decoders.feeds(self.decoder, sizes, seed=sum(sizes.values()))


def _outputs(result: Any) -> list[np.ndarray]:
    return [np.asarray(r) for r in (result if isinstance(result, (tuple, list)) else [result])]


def _check(compiled: Compiled, outputs_of: Any) -> None:
    """Every size's outputs, `outputs_of(feeds of every size)` (one list of outputs per
    size), against onnxruntime's."""
    every = [compiled.feeds(sizes) for sizes in SIZES]
    for sizes, feeds, gots in zip(SIZES, every, outputs_of(every), strict=True):
        wants = compiled.session.run(None, feeds)
        assert len(gots) == len(wants) == len(compiled.decoder.outputs)
        for out_name, got, want in zip(compiled.decoder.outputs, gots, wants, strict=True):
            assert got.shape == want.shape, f"{out_name} at {sizes}"
            err = _rel_l2(got, want)
            assert err < MAX_REL_L2, f"{out_name} at {sizes}: rel. L2 {err:.2e}"


# In CI each model runs with one exporter, the two alternating (each exporter's patterns
# are met by several models); KILN_FULL_MODELS=1 runs both for every model.
CI_EXPORTER = {"gpt2": "torchscript", "gpt2_past": "dynamo", "t5_decoder": "dynamo",
               "whisper_decoder": "torchscript", "llama": "dynamo"}
CI_CASES = [(name, exporter) for name in MODELS for exporter in hf_decoders.EXPORTERS
            if FULL or CI_EXPORTER[name] == exporter]


@pytest.mark.slow  # runs first (tests/conftest.py)
@pytest.mark.parametrize(("name", "exporter"), CI_CASES)
def test_decoder_matches_onnxruntime_at_three_sizes(name: str, exporter: str,
                                                     tmp_path: Path) -> None:
    compiled = Compiled(name, exporter, CI_LAYERS.get(name, 1), CI_VOCAB, tmp_path)
    # Every axis the export left dynamic is symbolic in kiln.
    named = {i.name: [d for d in i.dims if isinstance(d, str)]
             for i in compiled.decoder.inputs}
    assert _symbolic_input_dims(compiled.module) == named
    library = load_module(compiled.library)["main"]
    _check(compiled, lambda every: [_outputs(library(*f.values())) for f in every])
    if (name, exporter) == FRESH_PROCESS_CASE:
        _check(compiled, lambda every: _run_in_fresh_process(compiled.library, every, tmp_path))


def _run_in_fresh_process(library: Path, every: list[dict[str, np.ndarray]],
                          directory: Path) -> list[list[np.ndarray]]:
    """The outputs of `library` on each of `every` (feeds), computed by one new Python
    process that has neither onnx nor torch (a subprocess: a crash there fails this
    test cleanly) and loads the library once."""
    for k, feeds in enumerate(every):
        np.savez(directory / f"feeds{k}.npz", **feeds)
    script = textwrap.dedent(f"""
        import sys
        sys.modules["onnx"] = sys.modules["torch"] = None   # the deploy side needs neither
        import numpy as np
        from kiln.runtime import load_module
        main = load_module({str(library)!r})["main"]
        for k in range({len(every)}):
            feeds = np.load({str(directory)!r} + f"/feeds{{k}}.npz")
            result = main(*(feeds[name] for name in feeds.files))
            result = result if isinstance(result, (tuple, list)) else [result]
            np.savez({str(directory)!r} + f"/outputs{{k}}.npz", *[np.asarray(r) for r in result])
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, env=child_env())
    assert proc.returncode == 0, proc.stderr
    outputs = [np.load(directory / f"outputs{k}.npz") for k in range(len(every))]
    return [[out[f"arr_{k}"] for k in range(len(out.files))] for out in outputs]


def _median_seconds(fn: Any, repeat: int = 5) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


@pytest.mark.skipif(not FULL, reason="published layer counts: set KILN_FULL_MODELS=1")
@pytest.mark.parametrize("exporter", hf_decoders.EXPORTERS)
@pytest.mark.parametrize("name", list(MODELS))
def test_full_size_decoder(name: str, exporter: str, tmp_path: Path) -> None:
    """The published configuration; prints compile time and per-size latency."""
    compiled = Compiled(name, exporter, None, None, tmp_path)
    library = load_module(compiled.library)["main"]
    _check(compiled, lambda every: [_outputs(library(*f.values())) for f in every])
    print(f"\n{name} ({exporter}): compile {compiled.compile_seconds:.1f} s")
    for sizes in SIZES:
        feeds = compiled.feeds(sizes)
        err = max(_rel_l2(g, w) for g, w in zip(_outputs(library(*feeds.values())),
                                                  compiled.session.run(None, feeds), strict=True))
        ours = _median_seconds(lambda feeds=feeds: library(*feeds.values()))
        theirs = _median_seconds(lambda feeds=feeds: compiled.session.run(None, feeds))
        used = {k: v for k, v in sizes.items()
                if any(k in i.dims for i in compiled.decoder.inputs)}
        print(f"  {used}: kiln {ours * 1e3:.2f} ms, onnxruntime {theirs * 1e3:.2f} ms, "
              f"rel. L2 {err:.1e}")

