"""A decoder LLM's memory end to end: build, compile, export, load and generate, one
step per fresh process, the peak RSS of each against the weights (issue 61).

    .venv/bin/python bench/llm_memory.py --dir DIR [--hidden 2048] [--layers 22]
                                         [--heads 32,4] [--ffn 5632] [--vocab 32000]
                                         [--precisions fp32,int4] [--prompt 128]
                                         [--new 128] [--threads 2] [--codegen llvm]
                                         [--skip-genai]

The defaults are TinyLlama's sizes (1.1B parameters: 4.1 GiB of float32 weights). A
transformers LlamaForCausalLM of those sizes with random weights (tests/support/genai.py)
goes through onnxruntime-genai's model builder at each precision (`-p fp32`, `-p int4
-e cpu`); the folders are kept under `--dir` and used again by a later run (the int4
build peaks at about 2.4x the float32 weights). Then, per precision, each in a fresh process,
one at a time:

1. compile: `kiln.from_onnx` and `kiln.compile` (compile cache off), the peak RSS;
2. export: `export_library` with the weights embedded, then `weights="external"`, the
   peak of each (the process's high-water mark reset between them through
   /proc/self/clear_refs, so each is the export's own over what the compile left);
3. generate, per library: `load_module` then `kiln.generate` of `--new` greedy tokens
   after a `--prompt`-token prompt, in a process that imports only kiln's runtime side
   (numpy); its peak RSS against the weights plus the KV cache (the goal: at most 1.15x);
4. onnxruntime-genai's own `og.Generator` on the builder's folder, greedy, the tokens the
   kiln rows are compared with, and its peak RSS.

"weights" is the builder's model.onnx with its external data; "KV cache" is what the
cache holds at the last step (2 x layers x kv heads x head size x (prompt + new) floats).
Prints one line per step and a table at the end; asserts nothing. Wall times on a shared
host are inflated; the RSS figures are not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
MIB = 2**20


def peak_rss_mib() -> float:
    """This process's peak resident set since start or the last reset_peak() (VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_mib(field: str = "VmRSS") -> float:
    """This process's resident set now (VmRSS; RssAnon, RssFile: its two parts)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak() -> None:
    """Start VmHWM again from the current RSS (Linux: clear_refs 5)."""
    Path("/proc/self/clear_refs").write_text("5")


def step_hf(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(TESTS))
    from support import genai  # heavy: torch and transformers, this step only

    heads, kv_heads = (int(h) for h in args.heads.split(","))
    genai.save_hf_model("llama", args.dir / "hf", vocab=args.vocab, hidden_size=args.hidden,
                        intermediate_size=args.ffn, num_hidden_layers=args.layers,
                        num_attention_heads=heads, num_key_value_heads=kv_heads,
                        max_position_embeddings=max(256, 2 * (args.prompt + args.new)))
    return {"peak_mib": peak_rss_mib()}


def step_build(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(TESTS))
    from support import genai  # heavy: torch and the builder, this step only

    genai.build(args.dir / "hf", args.dir / args.precision, args.precision)
    return {"peak_mib": peak_rss_mib()}


def step_compile(args: argparse.Namespace) -> dict[str, Any]:
    os.environ["KILN_CACHE"] = "0"
    import warnings

    import kiln  # heavy: the compiler, this step only

    folder = args.dir / args.precision
    out: dict[str, Any] = {"start_mib": rss_mib()}
    start = time.perf_counter()
    with warnings.catch_warnings():
        # the builder declares a constant [1] a scalar (kiln's onnx_checker)
        warnings.filterwarnings("ignore", "the model's value_info declares")
        module = kiln.frontend.from_onnx(str(folder / "model.onnx"))
    out["import_s"] = time.perf_counter() - start
    out["import_peak_mib"] = peak_rss_mib()
    exe = kiln.compile(module, args.codegen)
    del module
    out["compile_s"] = time.perf_counter() - start
    out["compile_peak_mib"] = peak_rss_mib()
    out["after_compile_mib"] = rss_mib()
    for kind, options in (("embedded", {}), ("external", {"weights": "external"})):
        reset_peak()
        start = time.perf_counter()
        exe.export_library(folder / f"kiln_{kind}.so", **options)
        out[f"{kind}_s"] = time.perf_counter() - start
        out[f"{kind}_peak_mib"] = peak_rss_mib()
    return out


def step_generate(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    import kiln.runtime  # the deploy side only: numpy
    from kiln.runtime.generation import generate

    folder = args.dir / args.precision
    kiln.runtime.set_num_threads(args.threads)
    ids = prompt(args)
    out: dict[str, Any] = {"start_mib": rss_mib()}
    start = time.perf_counter()
    lib = kiln.runtime.load_module(folder / f"kiln_{args.kind}.so")
    out["load_ms"] = (time.perf_counter() - start) * 1e3
    stamps: list[float] = []
    start = time.perf_counter()
    tokens = generate(lib, ids, args.new,
                      on_token=lambda t: stamps.append(time.perf_counter()))
    out["first_ms"] = (stamps[0] - start) * 1e3
    out["decode_tps"] = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    out["tokens"] = np.asarray(tokens).tolist()
    out["peak_mib"] = peak_rss_mib()
    out["end_anon_mib"], out["end_file_mib"] = rss_mib("RssAnon"), rss_mib("RssFile")
    out["modules"] = sorted(m for m in ("llvmlite", "onnx", "kiln.codegen", "torch")
                            if m in sys.modules)
    return out


def step_genai(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import onnxruntime_genai as og  # optional: the reference runtime

    folder = args.dir / args.precision
    sys.path.insert(0, str(TESTS))
    from support import genai  # the threads in genai_config.json

    genai.set_threads(folder, args.threads)
    ids = prompt(args)
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=ids.shape[1] + args.new)
    generator = og.Generator(model, params)
    stamps: list[float] = []
    start = time.perf_counter()
    generator.append_tokens(ids.astype(np.int32))
    while not generator.is_done():
        generator.generate_next_token()
        stamps.append(time.perf_counter())
    tokens = np.asarray(generator.get_sequence(0), np.int64)[None, ids.shape[1]:]
    return {"first_ms": (stamps[0] - start) * 1e3,
            "decode_tps": (len(stamps) - 1) / (stamps[-1] - stamps[0]),
            "tokens": tokens.tolist(), "peak_mib": peak_rss_mib()}


def prompt(args: argparse.Namespace) -> Any:
    """The prompt: `--prompt` ids above the builder's special tokens (0-2), seeded."""
    import numpy as np

    return np.random.default_rng(0).integers(3, args.vocab, (1, args.prompt)).astype(np.int64)


STEPS = {"hf": step_hf, "build": step_build, "compile": step_compile,
         "generate": step_generate, "genai": step_genai}


def run_step(step: str, args: argparse.Namespace, **extra: str) -> dict[str, Any]:
    """`step` in a fresh process; its JSON result (the last line of its stdout)."""
    free = available_mib()
    command = [sys.executable, __file__, "--step", step, *sys.argv[1:],
               *(f"--{k}={v}" for k, v in extra.items())]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"step {step} {extra} failed ({done.returncode}):\n"
                         f"{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["wall_s"] = time.perf_counter() - start
    shown = {k: (round(v, 1) if isinstance(v, float) else v) for k, v in result.items()
             if k != "tokens"}
    print(f"{step} {' '.join(extra.values())}: {shown} (host had {free:.0f} MiB available)",
          flush=True)
    return result


def available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def weights_mib(folder: Path) -> float:
    """The builder's model.onnx with its external data."""
    return sum(p.stat().st_size for p in folder.glob("model.onnx*")) / MIB


def kv_cache_mib(args: argparse.Namespace) -> float:
    heads, kv_heads = (int(h) for h in args.heads.split(","))
    head = args.hidden // heads
    return 2 * args.layers * kv_heads * head * (args.prompt + args.new) * 4 / MIB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--heads", default="32,4", help="query heads, key/value heads")
    parser.add_argument("--ffn", type=int, default=5632)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--precisions", default="fp32,int4")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--codegen", default="llvm")
    parser.add_argument("--skip-genai", action="store_true")
    parser.add_argument("--only", default="", help="steps to run (default all), e.g. "
                        "compile,generate")
    parser.add_argument("--step", choices=STEPS, help=argparse.SUPPRESS)
    parser.add_argument("--precision", help=argparse.SUPPRESS)
    parser.add_argument("--kind", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.dir = args.dir.resolve()
    if args.step:
        print(json.dumps(STEPS[args.step](args)))
        return
    drive(args)


def drive(args: argparse.Namespace) -> None:
    """Every step of every precision, one process at a time; the table."""
    only = set(args.only.split(",")) if args.only else set(STEPS)
    args.dir.mkdir(parents=True, exist_ok=True)
    if "hf" in only and not (args.dir / "hf" / "config.json").exists():
        run_step("hf", args)
    kv = kv_cache_mib(args)
    print(f"KV cache at {args.prompt + args.new} positions: {kv:.1f} MiB")
    for precision in args.precisions.split(","):
        folder = args.dir / precision
        if "build" in only and not (folder / "model.onnx").exists():
            run_step("build", args, precision=precision)
        weights = weights_mib(folder)
        print(f"{precision}: weights {weights:.0f} MiB; goal for generating: "
              f"{1.15 * (weights + kv):.0f} MiB", flush=True)
        if "compile" in only:
            run_step("compile", args, precision=precision)
        want = None
        if "genai" in only and not args.skip_genai:
            want = run_step("genai", args, precision=precision)["tokens"]
        if "generate" in only:
            for kind in ("embedded", "external"):
                got = run_step("generate", args, precision=precision, kind=kind)
                ratio = got["peak_mib"] / (weights + kv)
                equal = "" if want is None else \
                    f", tokens equal {sum(a == b for a, b in zip(got['tokens'][0], want[0]))}" \
                    f"/{len(want[0])}"
                print(f"  {precision} {kind}: peak {got['peak_mib']:.0f} MiB = {ratio:.3f}x "
                      f"(weights + KV cache){equal}", flush=True)


if __name__ == "__main__":
    main()
