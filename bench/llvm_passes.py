"""Where LLVM's time goes in one model's cold compile: by part and by pass.

    .venv/bin/python bench/llvm_passes.py --model resnet50 [--target "llvm -mcpu=znver3"]
                                          [--repeat 3] [--passes 25] [--parts 12]
                                          [--llvm-option -enable-misched=false ...]

Compiles a model of the CNN zoo (tests/models/zoo.py; or `resnet18` of bench/nets.py)
once, in this process, with an empty kernel cache and one codegen job, keeping the text
of every part as kiln.codegen.llvm.parts.compile_part gets it (each part under the
model's name of its first kernel). Then compiles every part again, `--repeat` times
in turn, as a part is compiled (parse and verify, the optimisation pipeline at the
target's `opt_level`, object emission), with LLVM's pass timers on
(`llvmlite.binding.set_time_passes`), after `--llvm-option`s are given to LLVM
(`llvmlite.binding.set_option`; process-wide, so this bench runs them in its own
process). Prints the parts by CPU time (the repetitions' minimum), the three steps'
CPU seconds per repetition, and the costliest passes summed over the parts
(codegen passes of all parts under one name). The CPU time of one thread is what a
loaded or shared host disturbs least; compare two option sets in two runs of this bench
alternating, minima of several repetitions (docs/performance.md, "Compile time, round
twenty-five"). Asserts nothing (this is not a test).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the zoo builds its graphs with tests/support
sys.path.insert(0, str(ROOT / "tests" / "models"))

# one of LLVM's pass timer rows: four "seconds (percent)" columns, then the pass's name
_TIMER_ROW = re.compile(r"\s*(?:[\d.]+\s+\(\s*[\d.]+%\)\s+){3}([\d.]+)\s+\(\s*[\d.]+%\)\s+(.+)")


def model_named(name: str) -> Any:
    """The ONNX model `name`: a zoo entry at its published size, or bench/nets.py's
    ResNet-18."""
    if name == "resnet18":
        import nets

        return nets.resnet18()[0]
    import zoo

    if name not in zoo.ZOO:
        raise SystemExit(f"unknown model {name!r}; choose from resnet18, {', '.join(zoo.ZOO)}")
    return zoo.ZOO[name].model("full")


def part_texts(name: str, target: Any) -> dict[str, str]:
    """Each part's text of `name`'s cold compile, under its first kernel's model name."""
    import kiln
    from kiln.codegen.llvm import part_names, parts
    from kiln.frontend import from_onnx

    model_names: dict[str, str] = {}
    texts: dict[str, str] = {}
    content_named, compile_part = part_names.content_named, parts.compile_part

    def naming(*args: Any, **kwargs: Any) -> Any:
        named = content_named(*args, **kwargs)
        model_names.update(named.names)
        return named

    def keeping(text: str, config: Any, tm: Any) -> Any:
        defined = re.findall(r'^define [^@]*@"?([\w.$-]+)', text, re.M)
        shown = [model_names.get(d, d) for d in defined]
        kernels = [s for s in shown if "_par" not in s and "trampoline" not in s]
        texts[(kernels or shown or ["?"])[0]] = text
        return compile_part(text, config, tm)

    os.environ["KILN_CODEGEN_JOBS"] = "1"
    part_names.content_named, parts.compile_part = naming, keeping
    with tempfile.TemporaryDirectory(prefix="kiln-llvm-passes-") as cache:
        os.environ["KILN_CACHE_DIR"] = cache  # empty: every part is compiled
        try:
            kiln.compile(from_onnx(model_named(name)), target)["main"]
        finally:
            part_names.content_named, parts.compile_part = content_named, compile_part
    return texts


def time_parts(texts: dict[str, str], target: Any) -> tuple[dict[str, float], dict[str, float],
                                                            dict[str, float]]:
    """One repetition: (CPU s per part, per step, per pass) of compiling every part."""
    from kiln.codegen.llvm.target_machine import (
        llvm_binding,
        machine_config,
        optimize,
        parse_and_verify,
    )

    llvm = llvm_binding()
    config = machine_config(target)
    tm = config.target_machine()
    per_part: dict[str, float] = {}
    steps = dict.fromkeys(("parse", "optimize", "emit"), 0.0)
    llvm.set_time_passes(True)
    for name, text in texts.items():
        t0 = time.thread_time()
        mod = parse_and_verify(text, context=llvm.create_context())
        t1 = time.thread_time()
        optimize(mod, tm, config.opt_level)
        t2 = time.thread_time()
        tm.emit_object(mod)
        t3 = time.thread_time()
        per_part[name] = t3 - t0
        for step, seconds in zip(steps, (t1 - t0, t2 - t1, t3 - t2)):
            steps[step] += seconds
    report = llvm.report_and_reset_timings()
    llvm.set_time_passes(False)
    per_pass: dict[str, float] = {}
    for line in report.splitlines():
        row = _TIMER_ROW.match(line)
        if row and not row.group(2).startswith("Total"):
            # "InstCombinePass on f" and codegen's "X86 DAG->DAG Instruction Selection #3"
            # name one pass many times
            pass_name = re.sub(r" #\d+$", "", row.group(2).split(" on ")[0].strip())
            per_pass[pass_name] = per_pass.get(pass_name, 0.0) + float(row.group(1))
    return per_part, steps, per_pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--target", default="host", help="kiln target (default: this host)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--passes", type=int, default=25, help="passes printed")
    parser.add_argument("--parts", type=int, default=12, help="parts printed")
    parser.add_argument("--llvm-option", action="append", default=[],
                        help="an LLVM command-line option, e.g. -enable-misched=false")
    args = parser.parse_args()

    from harness import describe_target

    import kiln
    from kiln.codegen.llvm.target_machine import llvm_binding

    target = kiln.Target.from_host() if args.target == "host" else kiln.Target(args.target)
    texts = part_texts(args.model, target)
    for option in args.llvm_option:
        llvm_binding().set_option("", option)
    runs = [time_parts(texts, target) for _ in range(max(1, args.repeat))]
    print(f"{args.model}: {len(texts)} parts, target {describe_target(target)}, LLVM options "
          f"{' '.join(args.llvm_option) or '(none)'}; CPU seconds of one thread")
    for i, (_, steps, _) in enumerate(runs):
        print(f"repetition {i + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in steps.items())
              + f", all {sum(steps.values()):.3f}")
    print(f"\nparts (minimum of {len(runs)}):")
    best = {name: min(r[0][name] for r in runs) for name in texts}
    for name, seconds in sorted(best.items(), key=lambda kv: -kv[1])[:args.parts]:
        print(f"  {seconds:7.3f}  {name}")
    print(f"\npasses (minimum of {len(runs)}, summed over the parts):")
    passes = {p: min(r[2].get(p, 0.0) for r in runs) for p in runs[0][2]}
    for pass_name, seconds in sorted(passes.items(), key=lambda kv: -kv[1])[:args.passes]:
        print(f"  {seconds:7.3f}  {pass_name}")


if __name__ == "__main__":
    main()
