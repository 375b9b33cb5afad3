"""Compile time and memory for a large model: a VGG-19-shaped ONNX file (~548 MiB of weights).

    .venv/bin/python bench/compile_memory.py [--scale 1.0] [--target llvm] [--keep model.onnx]
        [--model vgg19|bert] [--mlf]

Builds the model with onnx.helper (random weights), then in this process times
and measures peak RSS (VmHWM, reset between stages through /proc/self/clear_refs)
for: importing it (`from_onnx(onnx.load(...))`), `kiln.compile` with a cold
compile cache (a fresh $KILN_CACHE_DIR), and `export_library(".so")`; then the
per-step times a TimingInstrument saw (docs/compile.md, "Timing a build").
`--model bert` takes bench/nets.py's BERT-base-like encoder instead; `--mlf` adds
a stage exporting a Model Library Format tar (goal, docs/mlf.md: <= 15 s and
<= 2x the weights' RSS for BERT-base; the tar <= 1.1x the weights + 5 MB).
Goal (docs/compile.md): compile + export in a few seconds with a peak RSS under
2.2x the weight bytes (the importer's arrays plus any the compiler packed: the
library's weights blob is written from them, never joined into a copy).
Prints a table; asserts nothing (this is not a test). Linux only.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

CFG: list[int | str] = [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512,
                        512, "M", 512, 512, 512, 512, "M"]


def vgg19(path: Path, scale: float) -> int:
    """Write a VGG-19-shaped model (224x224 input) to `path`; its weight bytes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits = [], []
    h, cin, size = "x", 3, 224
    for k, c in enumerate(CFG):
        if c == "M":
            nodes.append(helper.make_node("MaxPool", [h], [f"p{k}"], kernel_shape=[2, 2],
                                          strides=[2, 2]))
            h, size = f"p{k}", size // 2
            continue
        cout = max(1, int(int(c) * scale))
        w = rng.standard_normal((cout, cin, 3, 3), dtype=np.float32) * np.float32(
            np.sqrt(2 / (cin * 9)))
        inits += [numpy_helper.from_array(w, f"conv{k}.w"),
                  numpy_helper.from_array(np.zeros(cout, np.float32), f"conv{k}.b")]
        nodes += [helper.make_node("Conv", [h, f"conv{k}.w", f"conv{k}.b"], [f"c{k}"],
                                   pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{k}"], [f"r{k}"])]
        h, cin = f"r{k}", cout
    nodes.append(helper.make_node("Flatten", [h], ["flat"]))
    h, din = "flat", cin * size * size
    for j, dout in enumerate([max(1, int(4096 * scale))] * 2 + [1000]):
        w = rng.standard_normal((dout, din), dtype=np.float32) * np.float32(np.sqrt(1 / din))
        inits += [numpy_helper.from_array(w, f"fc{j}.w"),
                  numpy_helper.from_array(np.zeros(dout, np.float32), f"fc{j}.b")]
        nodes.append(helper.make_node("Gemm", [h, f"fc{j}.w", f"fc{j}.b"], [f"f{j}"], transB=1))
        h, din = f"f{j}", dout
        if j < 2:
            nodes.append(helper.make_node("Relu", [h], [f"fr{j}"]))
            h = f"fr{j}"
    graph = helper.make_graph(
        nodes, "vgg19", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 224, 224])],
        [helper.make_tensor_value_info(h, TensorProto.FLOAT, [1, 1000])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return sum(int(np.prod(i.dims)) * 4 for i in inits)


def _status() -> dict[str, float]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) / 1024
    return out


def _stage(name: str, fn: Any, weights_mib: float) -> Any:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    mem = _status()
    print(f"{name:10s} {seconds:7.2f} s   peak RSS {mem['VmHWM']:7.0f} MiB "
          f"({mem['VmHWM'] / weights_mib:4.2f}x weights)   after {mem['VmRSS']:7.0f} MiB")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="channel scale (1.0: VGG-19)")
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--keep", type=Path, help="write (or reuse) the model here")
    parser.add_argument("--model", choices=("vgg19", "bert"), default="vgg19")
    parser.add_argument("--mlf", action="store_true", help="also export a Model Library "
                        "Format tar (docs/mlf.md)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kiln-bench-"))
    os.environ["KILN_CACHE_DIR"] = str(work / "cache")
    model = args.keep or work / f"{args.model}.onnx"
    if not model.exists() and args.model == "bert":
        import onnx
        from nets import bert

        onnx.save(bert()[0], model)
    elif not model.exists():
        vgg19(model, args.scale)
    # float32 weights: 4 bytes per element of every initializer (read without loading it).
    weights = 4 * (model.stat().st_size // 4)
    weights_mib = weights / 2**20
    print(f"model: {model.stat().st_size / 2**20:.0f} MiB ONNX file (~ the weights), "
          f"target {args.target}")

    import onnx

    import kiln
    from kiln.frontend.onnx import from_onnx
    from kiln.transform import PassContext, TimingInstrument

    mod = _stage("import", lambda: from_onnx(onnx.load(model)), weights_mib)
    timing = TimingInstrument()
    with PassContext(instruments=[timing]):
        ex = _stage("compile", lambda: kiln.compile(mod, args.target), weights_mib)
        _stage("export", lambda: ex.export_library(work / "model.so"), weights_mib)
    if args.mlf:
        mlf = _stage("mlf", lambda: kiln.export_model_library_format(ex, work / "model.tar"),
                     weights_mib)
        print(f"mlf tar: {mlf.stat().st_size / 2**20:.1f} MiB "
              f"({mlf.stat().st_size / weights:.3f}x the weights)")
    print("\n".join(timing.report().split("\n\n")[-1:]))


if __name__ == "__main__":
    main()
