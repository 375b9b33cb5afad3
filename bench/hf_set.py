"""Hugging Face `transformers` models at their published configurations, exported with
`torch.onnx.export` as bench model builders (`bench/models.py --models hf`).

Random weights from each published configuration (no network), exported in memory by
tests/models/hf_export.py (the tests' exporter, read from tests/models rather than
kept twice) with every size pinned: batch 1, DistilBERT at sequence 128, ConvNeXt-Tiny
at 224x224 and the Whisper-base encoder at 30 s of audio (80 mel bins x 3000 frames).
These need torch and transformers; without them a builder raises ImportError, which
bench/models.py reports as a skipped model.

A text model's inputs are token ids and a mask, not float tensors: `FEEDS` gives each
model's inputs (the other bench models take standard-normal float32 inputs).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "models"))


Shapes = dict[str, list[int]]
Feeds = Callable[[np.random.Generator], dict[str, np.ndarray]]

SEQ = 128
IMAGE = 224
MEL_BINS, FRAMES = 80, 3000  # 30 s of audio: Whisper's encoder requires 3000 frames


def _distilbert() -> Any:
    import transformers  # distilbert-base-uncased: the config's defaults, 6 layers

    return transformers.DistilBertModel(transformers.DistilBertConfig())


def _convnext() -> Any:
    import transformers  # convnext-tiny-224: the config's defaults, depths (3, 3, 9, 3)

    return transformers.ConvNextModel(transformers.ConvNextConfig())


def _whisper_encoder() -> Any:
    import transformers

    # whisper-base: d_model 512, 6 encoder layers of 8 heads, feed-forward 2048, 80 mels.
    config = transformers.WhisperConfig(
        vocab_size=51865, num_mel_bins=MEL_BINS, d_model=512, encoder_layers=6,
        encoder_attention_heads=8, encoder_ffn_dim=2048, decoder_layers=6,
        decoder_attention_heads=8, decoder_ffn_dim=2048, max_source_positions=FRAMES // 2)
    return transformers.WhisperModel(config).get_encoder()


def _tokens(rng: np.random.Generator) -> dict[str, np.ndarray]:
    ids = rng.integers(2, 30522, (1, SEQ)).astype(np.int64)  # BERT's vocabulary
    return {"input_ids": ids, "attention_mask": np.ones((1, SEQ), np.int64)}


def _dense(name: str, *shape: int) -> Feeds:
    def feeds(rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {name: rng.standard_normal((1, *shape)).astype(np.float32)}
    return feeds


# name -> (the torch module's builder, its inputs, the exporter that exports it)
_MODELS: dict[str, tuple[Callable[[], Any], Feeds, str]] = {
    "distilbert": (_distilbert, _tokens, "torchscript"),
    "convnext": (_convnext, _dense("pixel_values", 3, IMAGE, IMAGE), "torchscript"),
    "whisper_encoder": (_whisper_encoder, _dense("input_features", MEL_BINS, FRAMES),
                        "torchscript"),
}

FEEDS: dict[str, Feeds] = {name: feeds for name, (_, feeds, _) in _MODELS.items()}


def torch_model(name: str) -> tuple[Callable[[], Any], Feeds, str]:
    """Model `name`'s torch-module builder, its inputs and its exporter, for an export
    with other axes dynamic (bench/as_exported.py)."""
    return _MODELS[name]


def _builder(name: str) -> Callable[[], tuple[onnx.ModelProto, Shapes]]:
    def build() -> tuple[onnx.ModelProto, Shapes]:
        import hf_export
        import torch

        make, feeds, exporter = _MODELS[name]
        torch.manual_seed(0)  # the random weights
        example = {k: torch.from_numpy(v) for k, v in feeds(np.random.default_rng(0)).items()}
        model = hf_export.export(make().eval(), example, {}, exporter)
        shapes = {k: list(v.shape) for k, v in example.items()}
        return model, shapes
    return build


HF: dict[str, Callable[[], tuple[onnx.ModelProto, Shapes]]] = {
    name: _builder(name) for name in _MODELS}
