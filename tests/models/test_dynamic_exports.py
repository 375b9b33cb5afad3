"""Decoders as users export them, every axis dynamic, imported with no pins (issue 59).

Tiny configurations (one layer, width 64 over 4 heads, a vocabulary of VOCAB tokens,
random weights after `torch.manual_seed(0)`; tests/models/hf_decoders.py), exported by
both torch exporters with `batch`, `seq`, `past_seq` (and `enc_seq`) dynamic; the
dynamo exporter gets plain axis names (`dynamic_shapes={"input_ids": {0: "batch",
1: "seq"}}`, as users write them):

- GPT-2 without a cache (transformers' default SDPA attention): its dynamo export holds
  position ids `Range(0, batch*seq // batch)`, arithmetic kiln must prove
  (kiln.ir.polynomial);
- decoders with past key/values (`PAST_CASES`): GPT-2 (keys over the cache viewed as
  `[-1, past_seq + seq, 16]`), a Llama (grouped-query attention, 4 query heads over 2
  key/value heads, rotary embeddings whose positions start at `past_seq`), and the T5
  and Whisper decoders over `encoder_hidden_states` (cross-attention recomputed from the
  encoder's states at each step, the self-attention cache fed back; T5's relative
  position buckets, Whisper's learned positions from `past_seq`), and the rest of the
  Llama family as transformers writes it (Qwen2, Phi-3, Mistral, Gemma).

Each model is exported and compiled once (a module-scope fixture; llvm, one case also
c), matches onnxruntime at two sizes, and, with a cache, a greedy loop of STEPS tokens
from a prompt of 4 and an empty past (`past_seq` = 0: a symbolic dimension takes 0 by
default, as onnxruntime's do), feeding the present back as the past, gives
onnxruntime's tokens: kiln's through `kiln.generate` (streaming each step's tokens),
onnxruntime's through the loop written out here. GPT-2's library also generates from
plain C (examples/c_deploy/generate.c) the tokens `kiln.generate` gives.

The suite is at its time bound, so CI runs GPT-2 with a cache with both exporters and
the Llama, T5, Whisper, Qwen2 and Phi-3 with one exporter each (`CI_PAST_CASES`:
Llama, T5 and Phi-3 with TorchScript, Whisper and Qwen2 with dynamo); `KILN_FULL_MODELS=1`
runs every model with both (Mistral and Gemma too), and GPT-2 without a cache.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from support.c_programs import EXAMPLES, build_c_program
from support.reference import ort_session

pytest.importorskip("torch", reason="exporting transformers models needs torch")
pytest.importorskip("transformers", reason="the models are built with transformers")

import hf_decoders

import kiln
from kiln.ir.shape_expr import dim_text

MAX_REL_L2 = 1e-4
VOCAB = 101
WIDTH = (64, 4)          # hidden size, query heads: head_dim 16
# One layer: a layer's patterns are the same at any depth (the exports' cost grows with
# it, the compile's does not: each distinct kernel compiles once); two present key/value
# pairs per layer still check that each is fed back as its own past.
LAYERS = 1
SIZES = ({"batch": 1, "seq": 3, "past_seq": 2, "enc_seq": 5},
         {"batch": 3, "seq": 6, "past_seq": 5, "enc_seq": 2})
STEPS = 64
PROMPT = (2, 4)          # batch, tokens
ENC_SEQ = 7              # the encoder's length in the greedy loop
FULL = os.environ.get("KILN_FULL_MODELS") == "1"

DECODERS: dict[str, Callable[[], hf_decoders.Decoder]] = {
    "gpt2": lambda: hf_decoders.gpt2(LAYERS, past=False, vocab=VOCAB, width=WIDTH,
                                     eager=False),
    "gpt2_past": lambda: hf_decoders.gpt2(LAYERS, past=True, vocab=VOCAB, width=WIDTH,
                                          eager=False),
    "llama_past": lambda: hf_decoders.llama(LAYERS, vocab=VOCAB, past=True,
                                            width=(*WIDTH, 2), eager=False),
    # the rest of the Llama family (hf_decoders.LLAMA_FAMILY): Qwen2's q/k/v biases,
    # Phi-3's fused projections, Mistral's sliding window, Gemma's scaled embedding
    **{f"{arch}_past": functools.partial(hf_decoders.llama, LAYERS, vocab=VOCAB, past=True,
                                         width=(*WIDTH, 2), eager=False, arch=arch)
       for arch in ("qwen2", "phi3", "mistral", "gemma")},
    "t5_decoder_past": lambda: hf_decoders.t5_decoder(LAYERS, vocab=VOCAB, past=True,
                                                      width=WIDTH),
    "whisper_decoder_past": lambda: hf_decoders.whisper_decoder(LAYERS, vocab=VOCAB,
                                                                past=True, width=WIDTH),
}
PAST_CASES = [(name, exporter) for name in DECODERS if name.endswith("_past")
              for exporter in hf_decoders.EXPORTERS]
# In CI, GPT-2 with a cache runs with both exporters and the others with one each, the
# two alternating (a dynamo export costs 10-30 s on 2 cores, a TorchScript one 1-10 s).
# GPT-2 without a cache runs with KILN_FULL_MODELS=1 only: its dynamo export's
# `Range(0, batch*seq // batch)` is tests/dynamic/test_symbolic_arith.py's pattern, its
# TorchScript export's are tests/models/test_transformers_decoders.py's gpt2 case.
CI_PAST_CASES = [("gpt2_past", "torchscript"), ("gpt2_past", "dynamo"),
                 ("llama_past", "torchscript"), ("t5_decoder_past", "torchscript"),
                 ("whisper_decoder_past", "dynamo"), ("qwen2_past", "dynamo"),
                 ("phi3_past", "torchscript")]
# The case also compiled for the c backend.
C_CASE = ("gpt2_past", "torchscript")


@dataclass
class Compiled:
    """One decoder exported with every axis dynamic, imported with no pins or bounds,
    compiled for each target in `mains`."""

    decoder: hf_decoders.Decoder
    model: Any
    module: Any
    exes: dict[str, Any]

    @property
    def mains(self) -> dict[str, Any]:
        return {t: exe["main"] for t, exe in self.exes.items()}


def _rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want)
                 / max(float(np.linalg.norm(want)), 1e-30))


def _outputs(result: Any) -> list[np.ndarray]:
    return [np.asarray(r) for r in (result if isinstance(result, (tuple, list)) else [result])]


def _compile(name: str, exporter: str) -> Compiled:
    if exporter == "dynamo":
        pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
    decoder = DECODERS[name]()
    model = hf_decoders.export(decoder, exporter, plain_names=True)
    module = kiln.frontend.from_onnx(model)   # no pins, no bounds
    targets = ("llvm", "c") if (name, exporter) == C_CASE else ("llvm",)
    return Compiled(decoder, model, module, {t: kiln.compile(module, t) for t in targets})


@pytest.fixture(scope="module")
def compiled(request: pytest.FixtureRequest) -> Iterator[Compiled]:
    """The case `request.param` = (model, exporter), exported and compiled once."""
    yield _compile(*request.param)


def _check_symbolic(compiled: Compiled) -> None:
    named = {i.name: [d for d in i.dims if isinstance(d, str)] for i in compiled.decoder.inputs}
    assert {p.name: [dim_text(d) for d in p.type.shape if not isinstance(d, int)]
            for p in compiled.module["main"].params} == named   # every axis symbolic


def _check_sizes(compiled: Compiled, session: Any) -> None:
    decoder = compiled.decoder
    for target, main in compiled.mains.items():
        for sizes in SIZES:
            feeds = hf_decoders.feeds(decoder, sizes, seed=sum(sizes.values()))
            wants = session.run(None, feeds)
            gots = _outputs(main(*feeds.values()))
            assert len(gots) == len(wants) == len(decoder.outputs)
            for name, got, want in zip(decoder.outputs, gots, wants, strict=True):
                assert got.shape == want.shape, f"{name} at {sizes} on {target}"
                err = _rel_l2(got, want)
                assert err < MAX_REL_L2, f"{name} at {sizes} on {target}: rel. L2 {err:.2e}"


@pytest.mark.slow  # exports and compiles: runs first (tests/conftest.py)
@pytest.mark.skipif(not FULL, reason="in CI through its patterns: set KILN_FULL_MODELS=1")
@pytest.mark.parametrize("compiled", [("gpt2", e) for e in hf_decoders.EXPORTERS],
                         indirect=True, ids="-".join)
def test_gpt2_as_exported_matches_onnxruntime(compiled: Compiled) -> None:
    _check_symbolic(compiled)
    _check_sizes(compiled, ort_session(compiled.model))


def _prompt(decoder: hf_decoders.Decoder) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """A prompt of PROMPT token ids and the decoder's other inputs that stay the same at
    every step (the encoder's states, if it takes them)."""
    rng = np.random.default_rng(5)
    ids = rng.integers(0, VOCAB, PROMPT).astype(np.int64)
    sizes = {"batch": PROMPT[0], "enc_seq": ENC_SEQ}
    fixed = {i.name: rng.standard_normal(tuple(sizes[d] if isinstance(d, str) else d
                                               for d in i.dims)).astype(np.float32)
             for i in decoder.inputs[1:] if "past_seq" not in i.dims}
    return ids, fixed


def _greedy(step: Callable[..., Any], decoder: hf_decoders.Decoder) -> list[list[int]]:
    """STEPS tokens of greedy decoding from an empty past, written out as a reference:
    `step(*inputs)` returns the logits and the present key/values, fed back as the next
    past; the fixed inputs are `_prompt`'s."""
    ids, fixed = _prompt(decoder)
    past = [np.zeros(tuple({"batch": PROMPT[0], "past_seq": 0}[d] if isinstance(d, str) else d
                           for d in i.dims), np.float32)
            for i in decoder.inputs if "past_seq" in i.dims]
    tokens = []
    for _ in range(STEPS):
        logits, *present = _outputs(step(ids, *fixed.values(), *past))
        token = np.argmax(logits[:, -1, :], axis=-1)
        tokens.append(token.tolist())
        ids, past = token[:, None].astype(np.int64), present
    return tokens


@pytest.mark.slow  # exports and compiles: runs first (tests/conftest.py)
@pytest.mark.parametrize("compiled", PAST_CASES if FULL else CI_PAST_CASES, indirect=True,
                         ids="-".join)
def test_decoder_with_a_cache_as_exported(compiled: Compiled, tmp_path: Path) -> None:
    _check_symbolic(compiled)
    session = ort_session(compiled.model)
    _check_sizes(compiled, session)
    names = [i.name for i in compiled.decoder.inputs]
    want = _greedy(lambda *a: session.run(None, dict(zip(names, a, strict=True))),
                   compiled.decoder)
    ids, fixed = _prompt(compiled.decoder)
    for target, main in compiled.mains.items():
        streamed: list[list[int]] = []
        got = kiln.generate(main, ids, STEPS, inputs=fixed,
                            on_token=lambda t, seen=streamed: seen.append(t.tolist()))
        assert got.T.tolist() == want == streamed, f"{target}: kiln {got.T}, onnxruntime {want}"
    if "c" in compiled.exes:          # C_CASE: GPT-2 (TorchScript)
        _check_c_program(compiled, ids[:1], tmp_path)


def _check_c_program(compiled: Compiled, prompt: np.ndarray, tmp: Path) -> None:
    """examples/c_deploy/generate.c, plain C over the exported library, and
    generate_entry.c, through the library's generation entry, generate the tokens
    kiln.generate does from the same library (one row: generate.c's batch)."""
    lib = compiled.exes["llvm"].export_library(tmp / "decoder.so")
    program = build_c_program(EXAMPLES / "generate.c", tmp / "generate")
    pasts = [i for i in compiled.decoder.inputs if "past_seq" in i.dims]
    heads, head_dim = pasts[0].dims[1], pasts[0].dims[3]
    done = subprocess.run([str(program), str(lib), "kiln_", "main", str(STEPS),
                           f"{len(pasts)}:{heads}:{head_dim}", *map(str, prompt[0])],
                          capture_output=True, text=True, timeout=300, check=True)
    want = kiln.generate(kiln.runtime.load_module(lib), prompt, STEPS)[0]
    assert [int(t) for t in done.stdout.split()] == want.tolist()
    # The library's own C loop, `kiln__generate_main` (examples/c_deploy/generate_entry.c).
    program = build_c_program(EXAMPLES / "generate_entry.c", tmp / "generate_entry")
    done = subprocess.run([str(program), str(lib), "kiln_", "main", str(STEPS), "1", "-1", "0",
                           *map(str, prompt[0])], capture_output=True, text=True, timeout=300,
                          check=True)
    assert [int(t) for t in done.stdout.split()] == want.tolist()
