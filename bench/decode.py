"""Per-token decode latency of decoders with past key/values, as exported (issue 59).

    .venv/bin/python bench/decode.py [--models gpt2,llama,t5,whisper] [--exporter torchscript]
                                     [--prompt 32] [--pasts 32,64,96] [--threads 2]
                                     [--rounds 5] [--seconds 1.0] [--write-docs]

Each model is a small but realistic configuration of tests/models/hf_decoders.py
(`CONFIGS`: 4 layers, hidden 256 over 4 heads of 64, a vocabulary of VOCAB tokens;
Llama with 2 key/value heads; T5 and Whisper over an encoder output of ENC_SEQ
positions), with random weights, exported by `--exporter` with every axis dynamic
and compiled by kiln as exported: `kiln.compile(from_onnx(model))`, no pins, what
`kiln.InferenceSession(path)` compiles. onnxruntime runs the same file in the same
process (`intra_op_num_threads` = `--threads`, kiln's pool as many).

A prompt of `--prompt` tokens is prefilled from an empty past (by onnxruntime, whose
present key/values both runtimes then read), then greedy decoding continues one token
a step; at each past length of `--pasts` one decode step (one new token over that
past) is timed for each runtime in alternating blocks (bench/harness.py), each through
its fastest public call (kiln's `prepare` where it takes the call, else the plain
call; onnxruntime's IOBinding with the outputs preallocated). Columns: median
milliseconds per token of each, kiln/ort (the median of paired rounds; the goal is at
most 1.0), and the relative L2 error of kiln's logits. `--write-docs` writes the
table to the block `decode` of docs/performance.md. Asserts nothing (not a test).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from doc_table import machine_line, markdown_table, write_block
from harness import (
    alternating_blocks,
    calls_within,
    describe_target,
    kiln_fastest_call,
    ort_bound_run,
    paired_ratio,
    pooled_ms,
    rel_l2,
)

import kiln
from kiln.frontend import from_onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "models"))

import hf_decoders  # noqa: E402  (tests/models, on the path just above)

DOCS = ROOT / "docs" / "performance.md"
VOCAB = 8192
LAYERS = 4
ENC_SEQ = 64
CONFIGS: dict[str, Callable[[], hf_decoders.Decoder]] = {
    "gpt2": lambda: hf_decoders.gpt2(LAYERS, past=True, vocab=VOCAB, width=(256, 4),
                                     eager=False),
    "llama": lambda: hf_decoders.llama(LAYERS, vocab=VOCAB, past=True, width=(256, 4, 2),
                                       eager=False),
    "t5": lambda: hf_decoders.t5_decoder(LAYERS, vocab=VOCAB, past=True, width=(256, 4)),
    "whisper": lambda: hf_decoders.whisper_decoder(LAYERS, vocab=VOCAB, past=True,
                                                   width=(256, 4)),
}
COLUMNS = ["model", "past", "kiln ms/token", "ort ms/token", "kiln/ort", "rel L2 (logits)"]


def ort_session(model: onnx.ModelProto, threads: int) -> Any:
    """An onnxruntime CPU session of `model` with `threads` intra-op threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


class Loop:
    """A greedy decoding loop of `decoder` driven by onnxruntime: `feeds()` are the
    inputs of the next step (its one new token over the past so far), `step()` takes it."""

    def __init__(self, decoder: hf_decoders.Decoder, session: Any, prompt: int) -> None:
        rng = np.random.default_rng(0)
        self.names = [i.name for i in decoder.inputs]
        sizes = {"batch": 1, "past_seq": 0, "enc_seq": ENC_SEQ}

        def shape(i: hf_decoders.Input) -> tuple[int, ...]:
            return tuple(sizes[d] if isinstance(d, str) else d for d in i.dims)

        self.fixed = [rng.standard_normal(shape(i)).astype(np.float32)
                      for i in decoder.inputs[1:] if "past_seq" not in i.dims]
        self.past = [np.zeros(shape(i), np.float32) for i in decoder.inputs
                     if "past_seq" in i.dims]
        self.session = session
        self.ids = rng.integers(0, VOCAB, (1, prompt)).astype(np.int64)
        self.step()   # the prefill

    def past_len(self) -> int:
        return int(self.past[0].shape[2])

    def feeds(self) -> dict[str, np.ndarray]:
        return dict(zip(self.names, [self.ids, *self.fixed, *self.past], strict=True))

    def step(self) -> None:
        logits, *self.past = self.session.run(None, self.feeds())
        self.ids = np.argmax(logits[:, -1:, :], axis=-1).astype(np.int64)


def time_step(main: Any, session: Any, feeds: dict[str, np.ndarray], rounds: int,
              seconds: float) -> list[str]:
    """One decode step of kiln and onnxruntime on `feeds`, timed: the row's cells."""
    wants = session.run(None, feeds)
    args = list(feeds.values())
    got = np.asarray(main(*args)[0])
    fns = {"kiln": kiln_fastest_call(main, args),
           "ort": ort_bound_run(session, feeds, [np.empty_like(w) for w in wants])}
    calls = calls_within(fns, 400, seconds)
    times = alternating_blocks(fns, calls, rounds)
    ms = pooled_ms(times)
    return [f"{ms['kiln']:.3f}", f"{ms['ort']:.3f}",
            f"{paired_ratio(times['kiln'], times['ort']):.2f}",
            f"{rel_l2(got, wants[0]):.1e}"]


def rows_of(name: str, args: argparse.Namespace) -> list[list[str]]:
    """The rows of model `name`: one per past length of `--pasts`."""
    decoder = CONFIGS[name]()
    model = hf_decoders.export(decoder, args.exporter, plain_names=True)
    main = kiln.compile(from_onnx(model), args.target)["main"]
    session = ort_session(model, args.threads)
    loop = Loop(decoder, session, args.prompt)
    rows = []
    for past in sorted(int(p) for p in args.pasts.split(",")):
        while loop.past_len() < past:
            loop.step()
        row = [name, str(past), *time_step(main, session, loop.feeds(), args.rounds,
                                            args.seconds)]
        print("  ".join(f"{cell:>12}" for cell in row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(CONFIGS),
                        help=f"comma-separated, from {', '.join(CONFIGS)}")
    parser.add_argument("--exporter", default="torchscript", choices=hf_decoders.EXPORTERS)
    parser.add_argument("--prompt", type=int, default=32, help="prefilled tokens")
    parser.add_argument("--pasts", default="32,64,96", help="past lengths timed")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0,
                        help="about how long each past length's timed calls take")
    parser.add_argument("--write-docs", action="store_true",
                        help="write the table to docs/performance.md (block 'decode')")
    args = parser.parse_args()
    args.target = kiln.Target.from_host()
    kiln.runtime.set_num_threads(args.threads)
    names = args.models.split(",")
    for name in names:
        if name not in CONFIGS:
            raise SystemExit(f"unknown model {name!r}; choose from {', '.join(CONFIGS)}")
    print(f"kiln: {describe_target(args.target)}; onnxruntime {args.threads} threads")
    print("  ".join(f"{c:>12}" for c in COLUMNS))
    load_before = os.getloadavg()[0]
    rows: list[list[str]] = []
    for name in names:
        rows += rows_of(name, args)
    if args.write_docs:
        command = " ".join(["bench/decode.py", *sys.argv[1:]])
        write_block(DOCS, "decode", [
            machine_line(command, describe_target(args.target), load_before,
                         os.getloadavg()[0]), "", *markdown_table(COLUMNS, rows)])


if __name__ == "__main__":
    main()
