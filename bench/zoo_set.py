"""The published architectures of tests/models/zoo.py at their published sizes, as
bench model builders (`bench/models.py --models zoo`).

The zoo is the tests' model set (onnx.helper graphs with deterministic random weights);
like bench/compile.py, this script reads it from tests/models rather than keeping a
second copy. Only models whose inputs are float tensors are taken (the zoo's BERT takes
token ids; `bert` in bench/nets.py is the BERT-base-like encoder on embeddings).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "models"))

Shapes = dict[str, list[int]]

# name -> zoo builder arguments (published input size; GPT-2 small and ViT-B/16 at 12 layers)
PUBLISHED: dict[str, dict[str, object]] = {
    "resnet50": {}, "squeezenet": {}, "shufflenet": {}, "inception": {},
    "densenet121": {}, "efficientnet": {}, "vgg19": {},
    "gpt2": {"seq": 128, "layers": 12}, "vit": {"image": 224, "layers": 12},
}


def _builder(name: str) -> Callable[[], tuple[onnx.ModelProto, Shapes]]:
    def build() -> tuple[onnx.ModelProto, Shapes]:
        import zoo

        model = getattr(zoo, name)(**PUBLISHED[name])
        shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
                  for v in model.graph.input}
        return model, shapes
    return build


ZOO: dict[str, Callable[[], tuple[onnx.ModelProto, Shapes]]] = {
    name: _builder(name) for name in PUBLISHED}
