"""Where kiln's greedy tokens part from onnxruntime-genai's on the builder's files, and why.

    PYTHONPATH=src:bench .venv/bin/python bench/llm_agreement.py [--hidden 1024]
        [--layers 24] [--heads 16,4] [--ffn 4864] [--vocab 32000] [--prompt 128]
        [--new 128] [--threads 2] [--precisions fp32,int4] [--layer-std S] [--head-std S]
        [--order-target TARGET]

bench/llm.py --genai's model (its build_genai_files: a transformers Llama with random
weights, tests/support/genai.py, through onnxruntime-genai's builder at `-p fp32` and
`-p int4 -e cpu`, MatMulNBits at accuracy level 4). `--layer-std` and `--head-std` draw
the decoder layers' and the LM head's matrices again from N(0, std) before the build
(default: genai.save_hf_model's N(0, 0.2) everywhere, which makes the 24-layer stack
chaotic and its logits move with the last bit of every sum); a trained-like model takes
`--layer-std 0.02 --head-std 0.2`.

For each precision: onnxruntime-genai's `og.Generator` greedy, its logits at every step;
kiln (the builder's model.onnx compiled as written) free-running, and teacher-forced
(fed genai's tokens one at a time, the same decode steps as genai's), its logits at
every step. Printed:

- tokens equal free-running (the first parting step) and teacher-forced;
- at each teacher-forced step where kiln chooses another token: genai's choice `a` and
  kiln's `b`, genai's margin `g[a] - g[b]`, kiln's `k[b] - k[a]`, and |k - g| on `a` and
  `b`; with `--order-target`, the same |difference| between kiln's build and one for
  that target (`o`);
- per precision, the median and maximum over steps of max |k - g| over the vocabulary
  (and of |k - o|), beside genai's top-2 margins;
- the LM head's MatMulNBits alone (int4): onnxruntime's and kiln's outputs for random
  rows of A, one a call, against a numpy reference of accuracy level 4 (A quantized as
  MLAS' QuantizeARow_CompInt8 does, the integer block sums exact) summed three ways:
  exactly (float64), in MLAS' structure (each block's int8 sum times scale_a * scale_b,
  then the zero point's sum over blocks of A's scaled sums times -zp * scale_b as a
  second sum) and in kiln's (scale_b * (scale_a * sum - zp * scale_a * sum(q)) a block,
  one sum); and the share of A's int8 codes that change when A moves by 2^-20 of itself
  (the distance the float32 models' logits keep): how often level 4's rounding turns an
  order-sized difference into a quantization step.

Asserts nothing (not a test). Run with onnxruntime-genai importable.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from llm import build_genai_files

import kiln
from kiln.runtime.generation import DecoderRoles
from support import genai  # tests/, on the path that importing llm set


@contextlib.contextmanager
def redrawn_weights(layer_std: float, head_std: float) -> Iterator[None]:
    """genai.save_hf_model with the layers' and the LM head's matrices drawn again from
    N(0, std) (0: left as drawn) before the builder reads them."""
    save = genai.save_hf_model
    if not layer_std and not head_std:
        yield
        return

    def save_redrawn(*args: Any, **kwargs: Any) -> Path:
        import torch
        import transformers

        where: Path = save(*args, **kwargs)
        model = transformers.AutoModelForCausalLM.from_pretrained(where)
        torch.manual_seed(1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                std = head_std if name.startswith("lm_head") else \
                    layer_std if ".layers." in name else 0.0
                if p.dim() > 1 and std:
                    p.normal_(0.0, std)
        model.save_pretrained(where)
        return where

    genai.save_hf_model = save_redrawn
    try:
        yield
    finally:
        genai.save_hf_model = save


def genai_run(folder: Path, prompt: np.ndarray, new: int, threads: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """onnxruntime-genai's greedy tokens [new] and the logits [new, vocab] they came from."""
    import onnxruntime_genai as og  # optional: run with it importable

    genai.set_threads(folder, threads)
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=prompt.shape[1] + new)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt.astype(np.int32))
    tokens, logits = [], []
    for _ in range(new):  # no stop token in the prompt's range: every step runs
        # the logits of the tokens so far (append_tokens and each step run the model on
        # what they add), the ones the next choice is made from
        logits.append(np.asarray(generator.get_logits(), np.float32).reshape(-1))
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return np.array(tokens), np.stack(logits)


def kiln_run(exe: Any, prompt: np.ndarray, new: int, forced: np.ndarray | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """kiln's greedy tokens [new] and their logits [new, vocab]: free-running, or fed
    `forced` (genai's tokens) one a step, the prompt in one call first."""
    fn = exe["main"]
    roles = DecoderRoles.of(fn)
    names = [p["name"] for p in fn.params]
    past = [np.zeros([1 if isinstance(d, str) and k != a else 0 if k == a else d
                      for k, d in enumerate(p["shape"])], np.float32)
            for p, a in zip(roles.pasts, roles.past_axes, strict=True)]
    ids, cached, tokens, logits = prompt, 0, [], []
    for step in range(new):
        feeds = {roles.ids["name"]: ids.astype(roles.ids["dtype"])}
        feeds.update({p["name"]: v for p, v in zip(roles.pasts, past, strict=True)})
        if roles.mask is not None:
            feeds[roles.mask["name"]] = np.ones((1, cached + ids.shape[1]), roles.mask["dtype"])
        if roles.positions is not None:
            feeds[roles.positions["name"]] = np.arange(
                cached, cached + ids.shape[1], dtype=roles.positions["dtype"])[None]
        results = fn(*(feeds[n] for n in names)) if set(names) == set(feeds) else fn(**feeds)
        cached += ids.shape[1]
        past = [np.asarray(results[i]) for i in roles.presents]
        logits.append(np.asarray(results[roles.logits])[0, -1].astype(np.float32))
        tokens.append(int(logits[-1].argmax()))
        ids = np.array([[tokens[-1] if forced is None else forced[step]]])
    return np.array(tokens), np.stack(logits)


def compile_file(path: Path, target: Any) -> Any:
    """kiln's Executable of the builder's model.onnx for `target`, the time printed."""
    start = time.perf_counter()
    with warnings.catch_warnings():
        # the builder declares a constant [1] a scalar (kiln's onnx_checker)
        warnings.filterwarnings("ignore", "the model's value_info declares")
        exe = kiln.compile(kiln.frontend.from_onnx(str(path)), target)
    print(f"  compiled {path.parent.name} for {target if isinstance(target, str) else 'host'}"
          f" in {time.perf_counter() - start:.0f} s", flush=True)
    return exe


def agreement(precision: str, path: Path, args: argparse.Namespace) -> None:
    """One precision's tokens, parting steps and logit distances (module docstring)."""
    prompt = np.random.default_rng(0).integers(3, args.vocab, (1, args.prompt))
    want, g = genai_run(path.parent, prompt, args.new, args.threads)
    exe = compile_file(path, kiln.Target.from_host())
    free, _ = kiln_run(exe, prompt, args.new)
    forced, k = kiln_run(exe, prompt, args.new, forced=want)
    other = compile_file(path, args.order_target) if args.order_target else None
    o = kiln_run(other, prompt, args.new, forced=want)[1] if other is not None else k
    parted = np.flatnonzero(free != want)
    print(f"{precision}: free-running {int((free == want).sum())}/{args.new} equal, first "
          f"parting at step {parted[0] if parted.size else '-'}; teacher-forced "
          f"{int((forced == want).sum())}/{args.new} equal")
    print("  step      a      b  genai g[a]-g[b]  kiln k[b]-k[a]  |k-g| a,b"
          + ("          |k-o| a,b" if other is not None else ""))
    for s in np.flatnonzero(forced != want):
        a, b = want[s], forced[s]
        print(f"  {s:4d} {a:6d} {b:6d}  {g[s, a] - g[s, b]:15.3e} {k[s, b] - k[s, a]:15.3e}"
              f"  {abs(k[s, a] - g[s, a]):.2e},{abs(k[s, b] - g[s, b]):.2e}"
              + (f"  {abs(k[s, a] - o[s, a]):.2e},{abs(k[s, b] - o[s, b]):.2e}"
                 if other is not None else ""))
    top2 = np.sort(g, axis=1)[:, -2:]
    spread = np.abs(g).max(axis=1)
    distances = [("kiln - genai", np.abs(k - g).max(axis=1))]
    if other is not None:
        distances.append(("kiln - order build", np.abs(k - o).max(axis=1)))
    for what, d in distances:
        print(f"  max |{what}| over the vocabulary: median {np.median(d):.2e}, max "
              f"{d.max():.2e} over steps (genai's top-2 margin: median "
              f"{np.median(top2[:, 1] - top2[:, 0]):.2e}, min "
              f"{(top2[:, 1] - top2[:, 0]).min():.2e}; max |logit| median "
              f"{np.median(spread):.1f})")
    if precision == "int4":
        lm_head_check(path, exe_target=kiln.Target.from_host(), threads=args.threads)


def lm_head_check(path: Path, exe_target: Any, threads: int, rows: int = 32) -> None:
    """The model's last MatMulNBits (the LM head) alone: onnxruntime and kiln against the
    numpy reference summed three ways (module docstring)."""
    import onnxruntime as ort

    model = onnx.load(str(path))
    node = [n for n in model.graph.node if n.op_type == "MatMulNBits"][-1]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    k, n, block = attrs["K"], attrs["N"], attrs["block_size"]
    weights = [inits[name] for name in node.input[1:] if name]
    single = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("MatMulNBits", ["a", *[f"w{i}" for i in range(len(weights))]],
                               ["y"], domain="com.microsoft", **attrs)],
        "lm_head", [onnx.helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, ["m", k])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["m", n])],
        [onnx.numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)]),
        opset_imports=[onnx.helper.make_opsetid("", 17),
                       onnx.helper.make_opsetid("com.microsoft", 1)])
    a = np.random.default_rng(1).standard_normal((rows, k)).astype(np.float32)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(single.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    fn = kiln.compile(kiln.frontend.from_onnx(single), exe_target)["main"]
    # one row a call: the decode step's GEMV in both runtimes
    got_ort = np.concatenate([session.run(None, {"a": a[r:r + 1]})[0] for r in range(rows)])
    got_kiln = np.concatenate([np.asarray(fn(a[r:r + 1])) for r in range(rows)])
    exact, mlas, kilns = nbits_level4_reference(a, weights, k, n, block)
    scale = np.abs(exact).max()
    print(f"  LM head {k} x {n}, {rows} rows, max |difference| / max |output| "
          f"({scale:.1f}):")
    for name, x, y in (("onnxruntime - exact", got_ort, exact),
                       ("kiln - exact", got_kiln, exact),
                       ("kiln - onnxruntime", got_kiln, got_ort),
                       ("MLAS order - exact", mlas, exact),
                       ("kiln order - exact", kilns, exact),
                       ("MLAS order - kiln order", mlas, kilns),
                       ("onnxruntime - MLAS order", got_ort, mlas),
                       ("kiln - kiln order", got_kiln, kilns)):
        print(f"    {name:26s} {np.abs(x - y).max() / scale:.2e}")
    flipped = codes_flipped(k, block)
    print(f"  A nudged by 2^-20 of itself (as the float32 models' logits are apart): "
          f"{flipped:.1e} of its int8 codes change")


def codes_flipped(k: int, block: int, rows: int = 4096) -> float:
    """The share of A's int8 codes (MLAS' quantization, random normal rows) that change
    when each value moves by 2^-20 of itself, up or down."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((rows, k // block, block)).astype(np.float32)
    nudged = a * (1 + rng.choice([-1.0, 1.0], a.shape).astype(np.float32) * np.float32(2**-20))

    def codes(x: np.ndarray) -> np.ndarray:
        return np.rint(x * (np.float32(127) / np.abs(x).max(axis=-1, keepdims=True)))

    return float((codes(a) != codes(nudged)).mean())


def nbits_level4_reference(a: np.ndarray, weights: list[np.ndarray], k: int, n: int,
                           block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MatMulNBits (4 bits) at accuracy level 4 in numpy: (exact, MLAS' order, kiln's)."""
    blocks = -(-k // block)
    packed = weights[0].reshape(n, blocks, block // 2)
    codes = np.stack([packed & 15, packed >> 4], axis=-1).reshape(n, blocks, block)
    scale_b = weights[1].reshape(n, blocks).astype(np.float32)
    if len(weights) > 2:
        zp_bytes = weights[2].reshape(n, -1)
        zp = np.stack([zp_bytes & 15, zp_bytes >> 4], axis=-1).reshape(n, -1)[:, :blocks]
    else:
        zp = np.full((n, blocks), 8)
    pad = np.zeros((a.shape[0], blocks * block), np.float32)
    pad[:, :k] = a
    ab = pad.reshape(a.shape[0], blocks, block)
    amax = np.abs(ab).max(axis=-1)
    scale_a = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(ab * inv[..., None]).astype(np.int64)                   # [rows, blocks, block]
    dot = np.einsum("rbk,nbk->rnb", q, codes.astype(np.int64))       # exact int sums
    qsum = q.sum(axis=-1)                                               # [rows, blocks]
    exact = np.einsum("rnb,rb,nb->rn", (dot - zp[None] * qsum[:, None]).astype(np.float64),
                      scale_a.astype(np.float64), scale_b.astype(np.float64))
    f32 = np.float32
    mlas = np.zeros((a.shape[0], n), f32)
    zero_term = np.zeros((a.shape[0], n), f32)
    kilns = np.zeros((a.shape[0], n), f32)
    for blk in range(blocks):
        sab = (scale_a[:, blk, None] * scale_b[None, :, blk]).astype(f32)
        mlas = _fma(dot[:, :, blk].astype(f32), sab, mlas)
        blksum = (scale_a[:, blk] * qsum[:, blk].astype(f32)).astype(f32)
        zero_term = _fma(blksum[:, None], (-zp[:, blk] * scale_b[:, blk]).astype(f32)[None],
                         zero_term)
        part = (scale_a[:, blk, None] * dot[:, :, blk].astype(f32)
                - zp[None, :, blk].astype(f32) * blksum[:, None]).astype(f32)
        kilns = _fma(scale_b[None, :, blk], part, kilns)
    return exact, (mlas + zero_term).astype(f32), kilns


def _fma(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """x * y + z rounded once to float32 (float64 holds the float32 product exactly)."""
    return (x.astype(np.float64) * y.astype(np.float64) + z).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--heads", default="16,4", help="query heads, key/value heads")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--ffn", type=int, default=4864)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precisions", default="fp32,int4")
    parser.add_argument("--layer-std", type=float, default=0.0,
                        help="draw the decoder layers' matrices from N(0, std) (0: as drawn)")
    parser.add_argument("--head-std", type=float, default=0.0,
                        help="draw the LM head from N(0, std) (0: as drawn)")
    parser.add_argument("--order-target", default="",
                        help="a second kiln build to compare with, as "
                             "'llvm -mcpu=znver4 -mattr=-avx512f' (default: none)")
    args = parser.parse_args()
    kiln.runtime.set_num_threads(args.threads)
    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)  # the builder's
    print(f"layers N(0, {args.layer_std or 0.2}), LM head N(0, {args.head_std or 0.2})")
    with tempfile.TemporaryDirectory() as tmp:
        with redrawn_weights(args.layer_std, args.head_std):
            files = build_genai_files(args, Path(tmp))
        for precision, path in files.items():
            agreement(precision, path, args)


if __name__ == "__main__":
    main()
