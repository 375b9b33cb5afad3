"""onnxruntime-genai's model builder as the exporter, its own generator as the reference
(issue 61; docs/llm.md, "With onnxruntime-genai's builder").

Tiny Llama, Qwen2 and Phi-3 configurations (CASES: each family, each precision;
with KILN_FULL_MODELS=1 Mistral and Gemma too, every family in both precisions;
transformers configs, one layer, hidden 64 over 4 query and 2 key/value heads, random
weights after `torch.manual_seed(0)`; tests/support/genai.py) go through the builder
(`python -m onnxruntime_genai.models.builder -p fp32|int4 -e cpu`, called in this
process). Each file is compiled by kiln as written, with no pins (its head size
`kv_cache_dim` is pinned by GroupQueryAttention's contract, docs/onnx.md), and
`kiln.generate` greedy is compared with onnxruntime-genai's own `og.Generator` (greedy,
the same prompt, the builder's end-of-sequence token stopping both):

- float32: the tokens are equal;
- int4: the builder writes MatMulNBits at accuracy level 4, which onnxruntime computes
  with the activations quantized to int8 per block, as kiln's products do (the same
  int8 codes and integer sums), but the blocks' float32 sums, the attention and the
  norms add in other orders (docs/llm.md, "How far a 4-bit model may differ"), so a
  free-running sequence may part at a close choice and never meet again. The
  agreement is taken teacher-forced, kiln's choice at each position of genai's
  sequence, reported (`record_property`) and held to INT4_AGREEMENT, the issue's 120
  of 128;
- one library exported and loaded (`export_library`, `load_module`) generates genai's
  tokens too, from Python and from a plain C program through its `{prefix}_generate_main`
  (examples/c_deploy/generate_entry.c; GroupQueryAttention's present length is a run-time
  dimension the C loop reads back after each call, kiln.codegen.decoder_layout).
"""

from __future__ import annotations

import os
import subprocess
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="the models are built with torch and transformers")
pytest.importorskip("transformers", reason="the models are built with transformers")
pytest.importorskip("onnxruntime_genai", reason="the builder and the reference generator are "
                    "onnxruntime-genai's (requirements.txt)")

import kiln
from kiln.runtime import generation
from support import genai
from support.c_programs import EXAMPLES, build_c_program

FAMILIES = ("llama", "qwen2", "phi3", "mistral", "gemma")
PROMPT = np.random.default_rng(7).integers(3, 256, (1, 8)).astype(np.int64)
STEPS = 32
#: kiln's int4 choices at genai's positions: at least the issue's 120 of 128.
INT4_AGREEMENT = 120 / 128

pytestmark = pytest.mark.xdist_group("genai_builder")


#: (family, precision) built and compiled: every family and both precisions, Llama in
#: both (each compile is seconds of the suite's time, so not all six).
#: KILN_FULL_MODELS=1: every family (Mistral and Gemma too) in both precisions.
CASES = tuple((f, p) for f in FAMILIES for p in ("fp32", "int4")) \
    if os.environ.get("KILN_FULL_MODELS") == "1" else \
    (("llama", "fp32"), ("llama", "int4"), ("qwen2", "int4"), ("phi3", "fp32"))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """The builder's folder of each case."""
    root = tmp_path_factory.mktemp("genai")
    out = {}
    for family in dict.fromkeys(f for f, _ in CASES):
        hf = genai.save_hf_model(family, root / family)
        for precision in ("fp32", "int4"):
            if (family, precision) in CASES:
                out[family, precision] = genai.build(hf, root / f"{family}_{precision}",
                                                     precision)
    return out


@pytest.fixture(scope="module")
def compiled(built: dict[tuple[str, str], Path]) -> Any:
    """kiln's Executable of a (family, precision) build, compiled once (llvm, no pins)."""
    exes: dict[tuple[str, str], Any] = {}

    def get(key: tuple[str, str]) -> Any:
        if key not in exes:
            with warnings.catch_warnings():
                # the builder declares a constant [1] a scalar in value_info (onnx_checker)
                warnings.filterwarnings("ignore", "the model's value_info declares",
                                        UserWarning)
                exes[key] = kiln.compile(
                    kiln.frontend.from_onnx(str(built[key] / "model.onnx")), "llvm")
        return exes[key]

    return get


@pytest.fixture(scope="module")
def genai_tokens(built: dict[tuple[str, str], Path]) -> Any:
    """onnxruntime-genai's greedy tokens of a (family, precision) build, run once."""
    tokens: dict[tuple[str, str], np.ndarray] = {}

    def get(key: tuple[str, str]) -> np.ndarray:
        if key not in tokens:
            tokens[key] = genai.genai_greedy(built[key], PROMPT, STEPS)
        return tokens[key]

    return get


@pytest.fixture(scope="module", params=CASES, ids=lambda c: "-".join(c))
def case(request: pytest.FixtureRequest, compiled: Any, genai_tokens: Any
         ) -> tuple[str, Any, np.ndarray]:
    """(precision, kiln's Executable, genai's greedy tokens) of one build."""
    return request.param[1], compiled(request.param), genai_tokens(request.param)


@pytest.fixture(scope="module")
def llama_library(compiled: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The float32 Llama build's library, exported once."""
    return Path(compiled(("llama", "fp32")).export_library(
        tmp_path_factory.mktemp("genai_lib") / "llama.so"))


def _assert_genai_tokens(lib: Any, want: np.ndarray, native: bool = True) -> None:
    """`kiln.generate` greedy gives `want`; genai drops the end-of-sequence token it
    stops at, kiln returns it as the row's last."""
    got = np.asarray(kiln.generate(lib, PROMPT, STEPS, stop_tokens=[genai.EOS],
                                   native=native))
    if got.shape[1] == want.shape[1] + 1:
        assert got[0, -1] == genai.EOS, (got, want)
        got = got[:, :-1]
    np.testing.assert_array_equal(got, want)


def _teacher_forced(exe: Any, want: np.ndarray) -> np.ndarray:
    """kiln's greedy choice after the prompt and each prefix of `want`: one call over the
    whole sequence from an empty cache."""
    fn = exe["main"]
    ids = np.concatenate([PROMPT, want[:, :-1]], axis=1)
    feeds: dict[str, np.ndarray] = {"input_ids": ids,
                                    "attention_mask": np.ones_like(ids)}
    for p in fn.signature["params"]:
        if p["name"].startswith("past"):
            feeds[p["name"]] = np.zeros([1, p["shape"][1], 0, p["shape"][3]], np.float32)
    logits = np.asarray(fn(**feeds)[0])
    # the companion a generation's prompt call runs (kiln.transform.last_position): the
    # last row, to the rounding of products whose tiles sum in an order set by the rows
    last = np.asarray(exe[fn.signature["last_position"]](**feeds)[0])
    np.testing.assert_allclose(last, logits[:, -1:], rtol=1e-5, atol=1e-5)
    assert last[0, 0].argmax() == logits[0, -1].argmax()
    return logits[0, PROMPT.shape[1] - 1:].argmax(-1)[None]


def test_builder_file_compiles_with_only_the_cache_length_free(case) -> None:  # type: ignore[no-untyped-def]
    _, exe, _ = case
    pasts = [p for p in exe["main"].signature["params"] if p["name"].startswith("past")]
    assert pasts and all(p["shape"][1:] == [2, "past_sequence_length", 16] for p in pasts)


def test_greedy_tokens_match_onnxruntime_genai(case, record_property) -> None:  # type: ignore[no-untyped-def]
    precision, exe, want = case
    forced = _teacher_forced(exe, want)
    agreement = float((forced == want).mean())
    record_property("int4_agreement" if precision == "int4" else "fp32_agreement", agreement)
    if precision == "fp32":
        _assert_genai_tokens(exe, want)
        assert agreement == 1.0
        # the Python loop keeps the cache in place (one buffer per past, each present
        # marked in place of its past) and grows it when full: here from 4 new positions
        fn = exe["main"]
        assert generation.shared_cache(fn, generation.DecoderRoles.of(fn))
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(generation, "SHARED_STEPS", 4)
            _assert_genai_tokens(exe, want, native=False)
    else:
        got = np.asarray(kiln.generate(exe, PROMPT, STEPS, stop_tokens=[genai.EOS]))
        n = min(got.shape[1], want.shape[1])
        parted = np.flatnonzero(got[0, :n] != want[0, :n])
        record_property("int4_free_running_equal_steps", int(parted[0]) if parted.size else n)
        assert agreement >= INT4_AGREEMENT, (agreement, forced, want)


def test_loaded_library_generates_genai_tokens(llama_library: Path, genai_tokens: Any
                                               ) -> None:
    lib = kiln.runtime.load_module(llama_library)
    _assert_genai_tokens(lib, genai_tokens(("llama", "fp32")))


def test_a_c_program_generates_genai_tokens(llama_library: Path, genai_tokens: Any,
                                            tmp_path: Path) -> None:
    """The builder's library has `kiln__generate_main` though its presents' length is a
    run-time dimension: a C program (cc -Werror) generates 16 greedy tokens through it,
    those of onnxruntime-genai and of kiln.generate; with genai's end-of-sequence token
    as the stop token, a batch of two rows (the prompt twice) gives the same."""
    program = build_c_program(EXAMPLES / "generate_entry.c", tmp_path / "generate")
    want = genai_tokens(("llama", "fp32"))[:, :16]

    def run(batch: int, stop: int) -> np.ndarray:
        done = subprocess.run([str(program), str(llama_library), "kiln_", "main", "16",
                               str(batch), str(stop), "0",
                               *map(str, np.repeat(PROMPT, batch, 0).reshape(-1))],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return np.loadtxt(done.stdout.splitlines(), np.int64, ndmin=2)

    assert genai.EOS not in want  # else the first run would stop early
    np.testing.assert_array_equal(run(1, -1), want)
    np.testing.assert_array_equal(run(2, genai.EOS), np.repeat(want, 2, 0))
