"""Generation with a Llama-style decoder: prefill, time to first token, tokens/s, peak RSS.

    .venv/bin/python bench/llm.py [--hidden 512] [--layers 8] [--heads 8,2] [--vocab 32000]
                                  [--ffn N] [--prompt 128] [--new 64] [--threads 2]
                                  [--rounds 3] [--precisions fp32,int4] [--genai]
                                  [--accuracy-level 4] [--cpus 0,1] [--write-docs]

The model is tests/models/hf_decoders.py's Llama (grouped-query attention, rotary
embeddings, RMSNorm; the FFN twice the hidden size) at the size given, random weights,
exported by torch (TorchScript) with its cache and every axis dynamic. `int4` is that
file with its MatMuls quantized by onnxruntime's MatMulNBitsQuantizer (4 bits, blocks of
32, symmetric, accuracy level 4 as onnxruntime-genai's builder writes for CPUs: A
quantized to int8 per block in both runtimes; `--accuracy-level 0` leaves it unset, the
float32 sums), as users quantize for onnxruntime-genai.

Each (runtime, precision) runs in a fresh process (so peak RSS is its own): kiln compiles
the file as exported once (`kiln.compile`, no pins; the time is printed), exports the
library, and each process loads it (what a deploy host does; the weights checked at
load, `verify_weights=True`) and generates with
`kiln.generate`; onnxruntime runs the same file
with the same greedy loop written out (the presents fed back as the pasts, numpy argmax).
A round is one prompt of `--prompt` tokens and `--new` greedy tokens; the rounds of the
two runtimes alternate and each column is the median: the time to the first token in ms (the
prompt's prefill, one call from an empty cache, and choosing its token), decode tokens/s
over the other tokens, and
the process's peak RSS (MiB, VmHWM after the last round) beside the weights (the model
file) and the key/value cache of one sequence of prompt + new positions, and the peak
over the two (issue 61's memory goal: at most 1.15x). Both generate the same tokens or
the row says how many differ.

`--genai` measures onnxruntime-genai instead of plain onnxruntime, on its own files: a
transformers LlamaForCausalLM of the same sizes (random weights, seeded;
tests/support/genai.py) goes through onnxruntime-genai's model builder (`-p fp32` and
`-p int4 -e cpu`: MatMulNBits at accuracy level 4, GroupQueryAttention with RoPE
inside, SkipSimplifiedLayerNormalization), kiln compiles the builder's model.onnx as
written, and onnxruntime-genai generates with its own `og.Generator` (greedy, its
shared-buffer cache) in its process, kiln with `kiln.generate` on its library in its
own; the tokens are compared with genai's. The time to the first token is the prompt's
prefill and the first choice in both. Run with onnxruntime-genai importable (a
dependency in requirements.txt, or PYTHONPATH=src:/path/to/genai beside the venv).
Asserts nothing (not a test).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from doc_table import machine_line, markdown_table, write_block
from harness import describe_target

import kiln

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "models"))

import hf_decoders  # noqa: E402  (tests/models, on the path just above)

from support import genai  # noqa: E402  (tests, on the path just above)

DOCS = ROOT / "docs" / "performance.md"
COLUMNS = ["precision", "runtime", "first token ms", "decode tokens/s",
           "peak RSS MiB", "weights MiB", "KV cache MiB", "peak / (weights + KV)",
           "tokens equal"]


def build_files(args: argparse.Namespace, where: Path) -> dict[str, Path]:
    """The exported model (fp32) and its 4-bit form, saved under `where`."""
    heads, kv_heads = (int(h) for h in args.heads.split(","))
    decoder = hf_decoders.llama(args.layers, vocab=args.vocab, past=True,
                                width=(args.hidden, heads, kv_heads), eager=False)
    fp32 = hf_decoders.export(decoder, "torchscript", plain_names=True)
    files = {"fp32": where / "llama_fp32.onnx"}
    onnx.save(fp32, files["fp32"])
    if "int4" in args.precisions:
        from onnxruntime.quantization import matmul_nbits_quantizer  # heavy: only for int4

        level = args.accuracy_level or None  # 0: unset, the float32 sums
        q = matmul_nbits_quantizer.MatMulNBitsQuantizer(fp32, bits=4, block_size=32,
                                                        is_symmetric=True,
                                                        accuracy_level=level)
        q.process()
        files["int4"] = where / "llama_int4.onnx"
        onnx.save(q.model.model, files["int4"])
    return files


def build_genai_files(args: argparse.Namespace, where: Path) -> dict[str, Path]:
    """onnxruntime-genai's builder folders (fp32, int4) of a Llama of the sizes given."""
    heads, kv_heads = (int(h) for h in args.heads.split(","))
    hf = genai.save_hf_model("llama", where / "hf", vocab=args.vocab, hidden_size=args.hidden,
                             intermediate_size=args.ffn or 2 * args.hidden,
                             num_hidden_layers=args.layers, num_attention_heads=heads,
                             num_key_value_heads=kv_heads,
                             max_position_embeddings=max(256, 2 * (args.prompt + args.new)))
    return {p: genai.build(hf, where / p, p) / "model.onnx" for p in args.precisions.split(",")}


def _genai_step(path: Path, threads: int) -> Callable[..., Any]:
    import onnxruntime_genai as og  # optional: --genai only

    genai.set_threads(path.parent, threads)
    model = og.Model(str(path.parent))

    def generate(ids: np.ndarray, new: int, on_token: Callable[[np.ndarray], object]) -> Any:
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=ids.shape[1] + new)
        generator = og.Generator(model, params)
        generator.append_tokens(ids.astype(np.int32))
        out = []
        while not generator.is_done():
            generator.generate_next_token()
            token = np.asarray(generator.get_next_tokens(), np.int64)
            on_token(token)
            out.append(token)
        return np.stack(out, axis=1)

    return generate


def _ort_step(path: Path, threads: int) -> Callable[..., Any]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    pasts = [i for i in session.get_inputs() if "past" in i.name]

    def generate(ids: np.ndarray, new: int, on_token: Callable[[np.ndarray], object]) -> Any:
        past = [np.zeros([ids.shape[0] if d == "batch" else 0 if isinstance(d, str) else d
                          for d in p.shape], np.float32) for p in pasts]
        out = []
        for _ in range(new):
            logits, *past = session.run(None, dict(zip(names, [ids, *past], strict=True)))
            ids = np.argmax(logits[:, -1, :], axis=-1)[:, None].astype(np.int64)
            on_token(ids[:, 0])
            out.append(ids[:, 0])
        return np.stack(out, axis=1)

    return generate


def kv_cache_mib(path: Path, positions: int) -> float:
    """The key/value cache of one sequence of `positions` positions: every past input of
    the library's decoder with the batch 1 and its cached axis that long."""
    from kiln.runtime.generation import DecoderRoles

    lib = kiln.runtime.load_module(path.with_suffix(".so"))
    roles = DecoderRoles.of(lib["main"])
    total = 0
    for past, axis in zip(roles.pasts, roles.past_axes, strict=True):
        dims = [positions if k == axis else d if isinstance(d, int) else 1
                for k, d in enumerate(past["shape"])]
        total += int(np.prod(dims)) * np.dtype(past["dtype"]).itemsize
    lib.close()
    return total / 2**20


def _kiln_step(path: Path, threads: int) -> Callable[..., Any]:
    kiln.runtime.set_num_threads(threads)
    # exported by the parent; its weights checked now, at load, rather than beside the
    # first calls (the default, "lazy"): the check's hand-back of the gathered rows
    # would otherwise land in the warm-up and the timed prompt (docs/performance.md,
    # "The first token by call number"); the load itself is not timed
    exe = kiln.runtime.load_module(path.with_suffix(".so"), verify_weights=True)

    def generate(ids: np.ndarray, new: int, on_token: Callable[[np.ndarray], object]) -> Any:
        return kiln.generate(exe, ids, new, on_token=on_token)

    return generate


def child(args: argparse.Namespace) -> None:
    """One runtime on one file: `--rounds` generations, their times as JSON on stdout."""
    path = Path(args.child_file)
    if args.cpus:  # as `taskset -c`: the runtimes on these CPUs, the build on all
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    if args.child == "kiln" and args.copy_library:  # a deployed library: written by cp
        copied = path.with_name(path.stem + "_copied.onnx")
        subprocess.run(["cp", str(path.with_suffix(".so")), str(copied.with_suffix(".so"))],
                       check=True)
        path = copied
    step = {"kiln": _kiln_step, "ort": _ort_step, "genai": _genai_step}[args.child]
    generate = step(path, args.threads)
    # above the builder's special tokens (0-2), and no stop token: every row runs --new
    ids = np.random.default_rng(0).integers(3, args.vocab, (1, args.prompt)).astype(np.int64)
    generate(ids, 2, lambda t: None)                    # warm: first-call costs out
    rounds = []
    for _ in range(args.rounds):
        stamps: list[float] = []
        start = time.perf_counter()
        tokens = generate(ids, args.new, lambda t, s=stamps: s.append(time.perf_counter()))
        rounds.append({"first": stamps[0] - start,
                       "decode": (stamps[-1] - stamps[0]) / max(len(stamps) - 1, 1)})
    json.dump({"rounds": rounds, "tokens": tokens.tolist(),
               "rss_mib": peak_rss_mib()}, sys.stdout)


def peak_rss_mib() -> float:
    """This process's peak resident set (VmHWM: ru_maxrss would keep the parent's peak,
    which Linux carries across fork and exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_child(runtime: str, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", runtime, "--child-file", str(path),
               *(f"--{k}={v}" for k, v in (("threads", args.threads), ("rounds", 1),
                                          ("prompt", args.prompt), ("new", args.new),
                                          ("vocab", args.vocab), ("cpus", args.cpus))),
               *(["--copy-library"] if args.copy_library else [])]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{runtime} on {path.name} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def weights_mib(path: Path) -> float:
    """The model file's size with its external data (the builder's model.onnx.data)."""
    data = path.with_name(path.name + ".data")
    return (path.stat().st_size + (data.stat().st_size if data.exists() else 0)) / 2**20


def rows_of(precision: str, path: Path, args: argparse.Namespace) -> list[list[str]]:
    """Alternating rounds of both runtimes on `path`: the two rows."""
    reference = "genai" if args.genai else "ort"
    results: dict[str, list[dict[str, Any]]] = {"kiln": [], reference: []}
    for _ in range(args.rounds):
        for runtime in results:
            results[runtime].append(run_child(runtime, path, args))
    want = np.array(results[reference][0]["tokens"])
    kv = kv_cache_mib(path, args.prompt + args.new)
    rows = []
    for runtime, runs in results.items():
        first = float(np.median([r["rounds"][0]["first"] for r in runs])) * 1e3
        decode = float(np.median([r["rounds"][0]["decode"] for r in runs]))
        got = np.array(runs[0]["tokens"])[:, :want.shape[1]]
        equal = int((got == want[:, :got.shape[1]]).sum())
        peak = float(np.median([r["rss_mib"] for r in runs]))
        rows.append([precision, runtime, f"{first:.1f}", f"{1 / decode:.1f}", f"{peak:.0f}",
                     f"{weights_mib(path):.0f}", f"{kv:.1f}",
                     f"{peak / (weights_mib(path) + kv):.3f}x", f"{equal}/{want.size}"])
        print("  ".join(f"{c:>14}" for c in rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", default="8,2", help="query heads, key/value heads")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--ffn", type=int, default=0, help="FFN width (default 2x hidden)")
    parser.add_argument("--genai", action="store_true",
                        help="onnxruntime-genai's builder files and runtime, not onnxruntime's")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precisions", default="fp32,int4")
    parser.add_argument("--accuracy-level", type=int, choices=(0, 4), default=4,
                        help="the int4 file's MatMulNBits accuracy_level (0: unset, float32 "
                             "sums; not for --genai, whose builder writes 4)")
    parser.add_argument("--cpus", default="",
                        help="CPUs (as 0,1) each runtime's process is pinned to, as taskset "
                             "-c does (the files are built and compiled on all)")
    parser.add_argument("--copy-library", action="store_true",
                        help="kiln loads a copy of its library made with cp just before")
    parser.add_argument("--write-docs", action="store_true",
                        help="write the table to docs/performance.md (block 'llm')")
    parser.add_argument("--child", choices=("kiln", "ort", "genai"), help=argparse.SUPPRESS)
    parser.add_argument("--child-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    print(f"kiln: {describe_target(kiln.Target.from_host())}; {args.threads} threads each")
    load_before = os.getloadavg()[0]
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        files = (build_genai_files if args.genai else build_files)(args, Path(tmp))
        print("  ".join(f"{c:>14}" for c in COLUMNS))
        for precision in args.precisions.split(","):
            start = time.perf_counter()
            with warnings.catch_warnings():
                # the builder declares a constant [1] a scalar (kiln's onnx_checker)
                warnings.filterwarnings("ignore", "the model's value_info declares")
                module = kiln.frontend.from_onnx(str(files[precision]))
            kiln.compile(module, kiln.Target.from_host()).export_library(
                files[precision].with_suffix(".so"))
            print(f"{precision}: kiln compiled and exported in "
                  f"{time.perf_counter() - start:.1f} s", flush=True)
            rows += rows_of(precision, files[precision], args)
    if args.write_docs:
        command = " ".join(["bench/llm.py", *sys.argv[1:]])
        write_block(DOCS, "llm_genai" if args.genai else "llm", [
            machine_line(command, describe_target(kiln.Target.from_host()), load_before,
                         os.getloadavg()[0]), "", *markdown_table(COLUMNS, rows)])


if __name__ == "__main__":
    main()
