"""Compile and export a fixed set of models into a directory (for test_reproducible.py).

`python reproducible_build.py OUT_DIR [--wasm]`: every file it writes must come out
byte for byte the same from another process (another hash seed, another temp dir).
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnx


def _static(proto: onnx.ModelProto) -> bool:
    """Whether every input dimension is a number (MLF and wasm take static shapes only)."""
    return all(d.HasField("dim_value") for v in proto.graph.input
               for d in v.type.tensor_type.shape.dim)


# Exports left out, with why: the encoder's C sources (in its .tar) are what its model
# can change; compiling them (.so, .a: a fifth of a build's time) runs the C compiler as
# the resnet's c files already do, whose flags and paths do not depend on the model.
SUFFIXES: dict[tuple[str, str], tuple[str, ...]] = {("encoder_dyn", "c"): (".tar",)}


def main(out: Path, wasm: bool) -> None:
    import kiln
    from kiln.export.wasm import export_wasm
    from support import dynamic_models  # tests/ is on PYTHONPATH (test_reproducible.py)
    from support import small_models as builders

    out.mkdir(parents=True, exist_ok=True)
    models = {
        # convolutions (7x7, 3x3 and 1x1, strides 1 and 2), batch norms, residual adds,
        # pools, parallel loops: ResNet-18's first two stages (each later stage repeats
        # the second's kernels at other sizes, and the suite's time is budgeted)
        "resnet": builders.resnet18(widths=(8, 16)),
        # attention, GEMMs, reshapes, symbolic batch and seq (the static transformer
        # adds nothing a build could depend on, and the suite's time is budgeted)
        "encoder_dyn": dynamic_models.encoder(layers=1),
    }
    for name, proto in models.items():
        mod = kiln.frontend.from_onnx(proto)
        built = {target: kiln.compile(mod, target) for target in ("llvm", "c")}
        for target, ex in built.items():
            for suffix in SUFFIXES.get((name, target), (".so", ".tar", ".a")):
                ex.export_library(out / f"{name}-{target}{suffix}")
        if _static(proto):
            kiln.export_model_library_format(built["c"], out / f"{name}-mlf.tar")
            if wasm:
                export_wasm(kiln.compile(mod, "web/wasm32"), out / f"{name}.wasm")


if __name__ == "__main__":
    main(Path(sys.argv[1]), "--wasm" in sys.argv[2:])
