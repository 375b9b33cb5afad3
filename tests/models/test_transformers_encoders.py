"""Hugging Face `transformers` encoders exported with `torch.onnx.export`, every axis
symbolic (issue 23): BERT-base, DistilBERT, RoBERTa, ViT, ConvNeXt, the Whisper-tiny
encoder and the T5-small encoder.

Each model is built from its published configuration with random weights
(`transformers.XConfig()` defaults, or the published hyper-parameters typed in; no
network), exported in memory by both exporters where they work (TorchScript with
`dynamic_axes`, dynamo with `dynamic_shapes`; tests/models/hf_export.py), imported
with no dimension pinned, compiled once for llvm, exported with `export_library`,
loaded back, and run at three sizes against onnxruntime (rel. L2 < 1e-4; two where only
the batch is symbolic: `_sizes`). One library is also loaded and run in a fresh process.

In CI the models keep their published configuration except the number of layers,
reduced to 1 (`num_hidden_layers`, `n_layers`, `encoder_layers`; ConvNeXt: one block
per stage; T5: 2, `num_layers`, as its first layer computes the relative position bias
that the later ones reuse; BERT-base at full depth is tests/models/test_zoo.py's), and
the text models' vocabulary, reduced to CI_VOCAB
tokens (the word-embedding table, one Gather, held most of the weights and so most of
the export, compile and load time): every op pattern of a layer is kept, and the
suite's time stays within its budget. For the same reason CI exports each model with
one exporter, alternating between them: BERT with TorchScript (whose export has the
attention-mask reshape `[batch*seq] -> [batch, 1, 1, seq]`); BERT through the dynamo
exporter, every axis symbolic, is the example of docs/tutorials/from-pytorch.md (run
by tests/docs), and RoBERTa, the same encoder, runs here with dynamo.
`KILN_FULL_MODELS=1` runs the published configurations unchanged with both exporters
and prints, per model, the compile time and each size's latency in kiln and
onnxruntime (`pytest -s`).

The axes: text models `input_ids`, `attention_mask` (and BERT's `token_type_ids`)
`[batch, seq]`; ViT and ConvNeXt `pixel_values` `[batch, 3, 224, 224]`; Whisper
`input_features` `[batch, 80, 3000]` (its encoder requires 3000 frames, so only the
batch is symbolic). ViT's image size stays fixed: a different size needs
`interpolate_pos_encoding=True`, whose bicubic resize of the position table to a
size computed from the image kiln does not import with symbolic sizes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from support.reference import ort_session

torch = pytest.importorskip("torch", reason="the transformers tests export with torch")
transformers = pytest.importorskip("transformers", reason="the models come from transformers")

import hf_export  # noqa: E402

import kiln  # noqa: E402
from kiln.ir.shape_expr import is_static  # noqa: E402
from kiln.runtime import load_module  # noqa: E402

FULL = os.environ.get("KILN_FULL_MODELS") == "1"
MAX_REL_L2 = 1e-4
CI_VOCAB = 2003  # the text models' vocabulary in CI (module docstring)
TEXT_AXES = {0: "batch", 1: "seq"}
EXAMPLE = (2, 8)  # the (batch, seq) the exporters trace

Feeds = Callable[[np.random.Generator, int, int], dict[str, np.ndarray]]


@dataclass(frozen=True)
class Case:
    """One model: how to build it (full published size or CI's 2 layers), its inputs at
    a `(batch, seq)` size, the axes left symbolic, and the exporters that export it."""

    build: Callable[[bool], Any]
    feeds: Feeds
    axes: Mapping[str, Mapping[int, str]]
    ci_exporters: tuple[str, ...]  # both run with KILN_FULL_MODELS=1 (module docstring)


def _text(names: tuple[str, ...], vocab: int) -> Feeds:
    """Token ids in [2, vocab) (no padding or special ids), masks keeping a random prefix
    of at least one token, token types 0/1."""
    def feeds(rng: np.random.Generator, b: int, s: int) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for name in names:
            if name == "input_ids":
                out[name] = rng.integers(2, vocab, (b, s)).astype(np.int64)
            elif name == "attention_mask":
                keep = rng.integers(1, s + 1, (b, 1))
                out[name] = (np.arange(s) < keep).astype(np.int64)
            else:
                out[name] = rng.integers(0, 2, (b, s)).astype(np.int64)
        return out
    return feeds


def _dense(name: str, shape: tuple[int, ...]) -> Feeds:
    def feeds(rng: np.random.Generator, b: int, s: int) -> dict[str, np.ndarray]:
        return {name: rng.standard_normal((b, *shape)).astype(np.float32)}
    return feeds


def _layers(full: bool, key: str) -> dict[str, Any]:
    # one layer in CI: a layer's op patterns are the same at any depth, and the exports,
    # weights and runs grow with it (the compile hardly does: each kernel compiles once)
    return {} if full else {key: 1}


def _vocab(full: bool, published: int) -> int:
    return published if full else CI_VOCAB


def _bert(full: bool) -> Any:
    return transformers.BertModel(transformers.BertConfig(
        vocab_size=_vocab(full, 30522), **_layers(full, "num_hidden_layers")))


def _distilbert(full: bool) -> Any:
    return transformers.DistilBertModel(transformers.DistilBertConfig(
        vocab_size=_vocab(full, 30522), **_layers(full, "n_layers")))


def _roberta(full: bool) -> Any:
    # roberta-base: the BERT-base shape with RoBERTa's vocabulary and positions.
    config = transformers.RobertaConfig(vocab_size=_vocab(full, 50265),
                                        max_position_embeddings=514,
                                        type_vocab_size=1, layer_norm_eps=1e-5,
                                        **_layers(full, "num_hidden_layers"))
    return transformers.RobertaModel(config)


def _t5_encoder(full: bool) -> Any:
    # t5-small: d_model 512, 6 layers, 8 heads of 64, ReLU feed-forward of 2048.
    config = transformers.T5Config(vocab_size=_vocab(full, 32128), d_model=512, d_kv=64,
                                   d_ff=2048,
                                   num_layers=6 if full else 2, num_heads=8,
                                   feed_forward_proj="relu")
    return transformers.T5EncoderModel(config)


def _vit(full: bool) -> Any:
    return transformers.ViTModel(transformers.ViTConfig(**_layers(full, "num_hidden_layers")))


def _convnext(full: bool) -> Any:
    # convnext-tiny (the config's defaults): depths (3, 3, 9, 3); CI keeps one per stage.
    return transformers.ConvNextModel(
        transformers.ConvNextConfig(**({} if full else {"depths": [1, 1, 1, 1]})))


def _whisper_encoder(full: bool) -> Any:
    # whisper-tiny: d_model 384, 4 encoder layers of 6 heads, feed-forward 1536, 80 mels.
    config = transformers.WhisperConfig(
        vocab_size=51865, num_mel_bins=80, d_model=384, encoder_layers=4 if full else 1,
        encoder_attention_heads=6, encoder_ffn_dim=1536, decoder_layers=4,
        decoder_attention_heads=6, decoder_ffn_dim=1536, max_source_positions=1500)
    return transformers.WhisperModel(config).get_encoder()


_BERT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_TEXT_INPUTS = ("input_ids", "attention_mask")
_TS, _DYNAMO = ("torchscript",), ("dynamo",)
CASES: dict[str, Case] = {
    "bert": Case(_bert, _text(_BERT_INPUTS, _vocab(FULL, 30522)),
                 dict.fromkeys(_BERT_INPUTS, TEXT_AXES), _TS),
    "distilbert": Case(_distilbert, _text(_TEXT_INPUTS, _vocab(FULL, 30522)),
                       dict.fromkeys(_TEXT_INPUTS, TEXT_AXES), _TS),
    "roberta": Case(_roberta, _text(_TEXT_INPUTS, _vocab(FULL, 50265)),
                    dict.fromkeys(_TEXT_INPUTS, TEXT_AXES), _DYNAMO),
    "t5_encoder": Case(_t5_encoder, _text(_TEXT_INPUTS, _vocab(FULL, 32128)),
                       dict.fromkeys(_TEXT_INPUTS, TEXT_AXES), _TS),
    "vit": Case(_vit, _dense("pixel_values", (3, 224, 224)), {"pixel_values": {0: "batch"}},
                _DYNAMO),
    "convnext": Case(_convnext, _dense("pixel_values", (3, 224, 224)),
                     {"pixel_values": {0: "batch"}}, _TS),
    "whisper_encoder": Case(_whisper_encoder, _dense("input_features", (80, 3000)),
                            {"input_features": {0: "batch"}}, _DYNAMO),
}

# The model whose library also runs in a fresh process (the smallest to export).
FRESH_PROCESS = ("distilbert", "torchscript")


def _exporter_params() -> list[Any]:
    params = []
    for name, case in CASES.items():
        for exporter in hf_export.EXPORTERS if FULL else case.ci_exporters:
            marks = [pytest.mark.skipif(
                exporter == "dynamo" and not _has("onnxscript"),
                reason="the dynamo exporter needs onnxscript")]
            params.append(pytest.param(name, exporter, id=f"{name}-{exporter}", marks=marks))
    return params


def _sizes(case: Case) -> list[tuple[int, int]]:
    """hf_export.SIZES, less the export example's batch where only the batch is symbolic
    (the image and audio models, whose feeds ignore `seq`): that run would repeat the
    traced size (KILN_FULL_MODELS=1 runs all three, for the latency report)."""
    symbols = {name for axes in case.axes.values() for name in axes.values()}
    return [(b, s) for b, s in hf_export.SIZES
            if FULL or "seq" in symbols or b != EXAMPLE[0]]


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _timed(fn: Callable[[], Any], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


@pytest.mark.slow  # runs first (tests/conftest.py)
@pytest.mark.parametrize(("name", "exporter"), _exporter_params())
def test_encoder_with_every_axis_symbolic_matches_onnxruntime(name: str, exporter: str,
                                                              tmp_path: Path) -> None:
    case = CASES[name]
    rng = np.random.default_rng(0)
    example = {k: torch.from_numpy(v) for k, v in case.feeds(rng, *EXAMPLE).items()}
    proto = hf_export.export(case.build(FULL).eval(), example, case.axes, exporter)

    mod = kiln.frontend.from_onnx(proto)  # no shape_dict: nothing pinned
    main = mod["main"]
    for param in main.params:  # type: ignore[union-attr]
        shape = param.type.shape
        symbolic = {k: getattr(d, "name", str(d)) for k, d in enumerate(shape)
                    if not is_static(d)}
        assert symbolic == dict(case.axes[param.name]), f"{param.name}: {param.type}"
    start = time.perf_counter()
    exe = kiln.compile(mod, "llvm")
    compile_s = time.perf_counter() - start
    library = tmp_path / f"{name}.so"
    exe.export_library(library)
    run = load_module(library)["main"]


    session = ort_session(proto)
    report = [f"{name} ({exporter}{', full size' if FULL else ''}): compile {compile_s:.1f} s"]
    for b, s in _sizes(case):
        feeds = case.feeds(rng, b, s)
        err = hf_export.compare_with_onnxruntime(run, session, feeds)
        assert err < MAX_REL_L2, f"{name} via {exporter} at batch={b}, seq={s}: rel. L2 {err}"
        if FULL:
            kiln_s = _timed(lambda f=feeds: run(*f.values()))
            ort_s = _timed(lambda f=feeds: session.run(None, f))
            report.append(f"  batch={b} seq={s}: kiln {kiln_s * 1e3:.1f} ms, onnxruntime "
                          f"{ort_s * 1e3:.1f} ms, rel. L2 {err:.1e}")
    if FULL:
        print("\n".join(report))
    if (name, exporter) == FRESH_PROCESS:
        _check_in_fresh_process(library, case.feeds(rng, *hf_export.SIZES[-1]), session,
                                tmp_path)


def _check_in_fresh_process(library: Path, feeds: Mapping[str, np.ndarray], session: Any,
                            tmp_path: Path) -> None:
    """Load `library` in a new interpreter with no torch or onnx, run it on `feeds`, and
    compare with onnxruntime's result."""
    want = np.asarray(session.run(None, dict(feeds))[0])
    np.savez(tmp_path / "feeds.npz", **feeds)
    script = textwrap.dedent(f"""
        import sys
        sys.modules["onnx"] = None    # the deploy side needs neither onnx
        sys.modules["torch"] = None   # nor torch
        import numpy as np
        from kiln.runtime import load_module
        feeds = np.load({str(tmp_path / "feeds.npz")!r})
        out = load_module({str(library)!r})["main"](*[feeds[k] for k in {list(feeds)!r}])
        np.save({str(tmp_path / "out.npy")!r}, out)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300,
                   capture_output=True, text=True)
    got = np.load(tmp_path / "out.npy")
    assert got.shape == want.shape
    assert hf_export.rel_l2(got, want) < MAX_REL_L2
