"""Write the kernel replay test's golden digests (and, once, its int8 model files).

    PYTHONPATH=tests .venv/bin/python tests/replay/make_goldens.py   # goldens.json only
    PYTHONPATH=tests:tests/quantization .venv/bin/python tests/replay/make_goldens.py --models
                                                                     # the int8 files too

Regenerate goldens.json only in a commit that means to change generated kernels, and
say which in the commit message: tests/replay/test_replay.py compares every lowered
function of every model of the set, for every ISA of `TARGETS`, with this file. The
int8 files are made by onnxruntime's quantizer from the float models of the set and
kept, so a new quantizer version does not move the goldens.
"""

from __future__ import annotations

import json
import sys

import onnx
from replay_models import GOLDENS, MODELS, MODELS_DIR, TARGETS, digests


def write_int8_models() -> None:
    from quantized_models import quantize_dynamic_model, quantize_static_model

    from support import small_models

    MODELS_DIR.mkdir(exist_ok=True)
    made = {
        "resnet18_qdq": quantize_static_model(small_models.resnet18(), "QDQ"),
        "mobilenet_v2_qoperator": quantize_static_model(small_models.mobilenet_v2(),
                                                        "QOperator"),
        "transformer_dynamic_int8": quantize_dynamic_model(small_models.transformer()),
    }
    for name, model in made.items():
        onnx.save(model, str(MODELS_DIR / f"{name}.onnx"))


def main() -> None:
    if "--models" in sys.argv[1:]:
        write_int8_models()
    goldens = {model: {isa: digests(build(), target) for isa, target in TARGETS.items()}
               for model, build in MODELS.items()}
    GOLDENS.write_text(json.dumps(goldens, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDENS}: {len(goldens)} models x {len(TARGETS)} ISAs")


if __name__ == "__main__":
    main()
