"""`kiln`: compile a model to one deployable file, inspect artifacts, list targets.

    kiln compile model.onnx [-t host] -o model.so|.tar|.a|.wasm
                 [--shape x=1,64 | batch=1 | seq=1:512]
                 [--profile]
    kiln inspect model.onnx [--format text|json]   (before compiling)
    kiln inspect model.so [--format text|json] [--weights] [--show llvm/kernels.bc --format ll]
                          [--report report.html [--profile-json prof.json]]
    kiln targets list [--kind K] | kiln targets show NAME | kiln targets kinds
    kiln run model.so --input x=x.npy | --inputs in.npz | --fill random|zeros [--size seq=N]
             [--output y.npy | --outputs out.npz] [--repeat N --warmup M] [--function main]
             [--profile [--profile-by op,group,kernel] [--top N]]
             [--profile-json prof.json] [--trace trace.json]
    kiln cache list|info|clear
    kiln build-many MATRIX.json -o DIR [--address ADDR | --in-process] [--cache-dir DIR]
    kiln tune model.onnx [-t host] --budget 10m -o model.tuning.json
              [--address ADDR | --in-process] [--workers N] [--threads N] [--shape ...]
    kiln compile model.onnx ... --tuning model.tuning.json

Errors are one line on stderr and exit code 2 (1 for an unexpected failure);
--debug shows the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

import kiln
from kiln import __version__
from kiln.cli import targets
from kiln.cli.build_many import cmd_build_many
from kiln.cli.flags import (
    MAX_LOOP_ITERATIONS,
    MAX_REPEAT,
    MAX_TOP,
    MAX_WORKERS,
    count,
    max_threads,
)
from kiln.cli.inspect import cmd_inspect, report_metadata
from kiln.cli.inspect_onnx import inspect_onnx
from kiln.cli.outputs import WASM, check_output
from kiln.cli.targets import normalize_argv
from kiln.cli.tune import cmd_tune
from kiln.errors import GenericKernelWarning, KilnError, UsageError, missing_dependency

# Errors about the user's input or environment: one line on stderr, exit code 2.
# Every kiln error is one (KilnError is their base); so are missing files.
USER_ERRORS = (KilnError, OSError, ValueError)


def _parse_shapes(items: Sequence[str]) -> dict[str, Any]:
    """`--shape` values as a from_onnx shape_dict: `x=1,?,64` (an input's shape, `?`
    keeps a dimension symbolic), `batch=1` (pins a dimension, or a 1-D input's shape),
    `seq=1:512` (bounds a dimension, both ends included)."""
    shapes: dict[str, Any] = {}
    for item in items:
        name, sep, dims = item.rpartition("=")
        if not sep or not name:
            raise UsageError(f"--shape expects NAME=D0,D1,..., NAME=SIZE or NAME=MIN:MAX, "
                             f"got {item!r}")
        try:
            if ":" in dims:
                lo, _, hi = dims.partition(":")
                shapes[name] = range(int(lo), int(hi) + 1)
            elif "," in dims or not dims:
                shapes[name] = tuple(None if d.strip() == "?" else int(d)
                                     for d in dims.split(",") if d)
            else:
                shapes[name] = int(dims)
        except ValueError:
            raise UsageError(f"--shape {item}: dimensions must be integers or '?', a range "
                             "MIN:MAX of integers") from None
    return shapes


def _model_file(path: str) -> None:
    """The model's size, checked before anything reads it (docs/security.md, "Limits")."""
    from kiln.frontend.onnx.file_limits import (
        check_model_file,  # heavy: kept off the cli's startup (kiln --help)
    )

    check_model_file(path)


def _cmd_compile(args: argparse.Namespace) -> int:
    from kiln.artifact import generic_kernels  # lazy: kept off the cli's startup (kiln --help)
    from kiln.driver.progress import (
        CompileProgress,  # heavy: kept off the cli's startup (kiln --help)
    )
    from kiln.frontend import from_onnx  # heavy: kept off the cli's startup (kiln --help)
    from kiln.target.describe import summarize  # heavy: kept off the cli's startup (kiln --help)
    from kiln.transform import PassContext  # heavy: kept off the cli's startup (kiln --help)
    from kiln.transform.instruments import (  # heavy: kept off the cli's startup (kiln --help)
        PassInstrument,
        TimingInstrument,
    )

    if args.mlf_source and not args.mlf:
        raise UsageError("--mlf-source adds the DSL source to a Model Library Format tar; "
                         "give --mlf MODEL_NAME too")
    if not args.mlf:  # an MLF archive is a .tar whatever its name
        check_output(args.output)
    wasm = args.output.lower().endswith(WASM)
    target = kiln.Target(args.target or ("web/wasm32" if wasm else "host"))
    t0 = time.perf_counter()
    timing = TimingInstrument()
    shapes = _parse_shapes(args.shape)
    _model_file(args.model)
    with CompileProgress(os.path.basename(args.model)) as progress:
        progress.stage("importing the ONNX model")
        mod = from_onnx(args.model, shapes, check=not args.no_check)
        instruments: list[PassInstrument] = [timing] if args.timings else []
        if progress.enabled:
            instruments.append(progress)
        with PassContext(instruments=instruments), warnings.catch_warnings():
            # printed below as a block, after the line saying where the library went
            warnings.simplefilter("ignore", GenericKernelWarning)
            ex = kiln.compile(mod, target, system_lib_prefix=args.prefix, profile=args.profile,
                              tuning=args.tuning,
                              max_loop_iterations=args.max_loop_iterations)
            if args.mlf:
                kiln.export_model_library_format(ex, args.output, model_name=args.mlf,
                                                 source=args.mlf_source)
            elif wasm:
                from kiln.export.wasm import (
                    export_wasm,  # heavy: kept off the cli's startup (kiln --help)
                )

                export_wasm(ex, args.output)
            else:
                ex.export_library(args.output, cc=args.cc)
    print(f"compiled {args.model} for {summarize(target)} -> {args.output} "
          f"in {time.perf_counter() - t0:.2f} s")
    generic = ex.metadata.get(generic_kernels.METADATA_KEY)
    if generic:
        print("warning: " + generic_kernels.report(generic))
    if args.timings:
        print(timing.report())
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    if args.file.lower().endswith(".onnx"):
        if args.report is not None or args.artifact is not None or args.weights:
            raise UsageError("--report, --show and --weights read a compiled library; for "
                             "an ONNX model, kiln inspect prints its inputs, outputs and ops")
        _model_file(args.file)
        print(inspect_onnx(args.file, args.format))
        return 0

    if args.report is not None:
        from kiln.cli.report import (  # heavy: kept off the cli's startup (kiln --help)
            read_profile,
            write_report,
        )

        metadata = report_metadata(args.file)
        profile = read_profile(args.profile_json) if args.profile_json else None
        print(write_report(metadata, os.path.basename(args.file), args.report, profile))
        return 0
    if args.profile_json is not None:
        raise UsageError("--profile-json goes with --report: it adds kernel times to the page")
    print(cmd_inspect(args.file, args.artifact, args.format, args.weights))
    return 0


def _cmd_targets(args: argparse.Namespace) -> int:
    if args.verb == "show":
        print(targets.cmd_show(args.name))
    elif args.verb == "kinds":
        print(targets.cmd_kinds())
    else:
        print(targets.cmd_list(args.kind))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from kiln.cli.run import cmd_run  # heavy: kept off the cli's startup (kiln --help)

    print(cmd_run(args.file, args.function, args.input, args.inputs, args.fill, args.output,
                  args.outputs, args.repeat, args.warmup, args.profile, args.size,
                  args.profile_json, args.trace, args.profile_by, args.top))
    return 0


def _cmd_build_many(args: argparse.Namespace) -> int:
    text, ok = cmd_build_many(args.matrix, args.output, args.address, args.in_process,
                              args.cache_dir)
    print(text)
    return 0 if ok else 1


def _cmd_tune(args: argparse.Namespace) -> int:
    print(cmd_tune(args.model, args.target, args.budget, args.output, args.address,
                   args.in_process, _parse_shapes(args.shape), args.workers, args.threads))
    return 0


def _human(n: float) -> str:
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB"):
        n /= 1024
        if n < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} GiB"


def _cmd_cache(args: argparse.Namespace) -> int:
    from kiln.driver import cache  # heavy: kept off the cli's startup (kiln --help)

    if args.action == "list":
        entries = cache.list_entries()
        for e in entries:
            used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used))
            print(f"{e.key[:16]}  {_human(e.size):>10}  last used {used}  "
                  f"{', '.join(e.artifacts)}")
        print(f"{len(entries)} entries, {_human(cache.usage())} on disk in {cache.cache_dir()}")
    elif args.action == "info":
        facts = cache.info()
        cap = facts["max_bytes"]
        print(f"directory: {facts['dir']}\nenabled:   {facts['enabled']}\n"
              f"entries:   {facts['entries']}\nobjects:   {facts['objects']}\n"
              f"size:      {_human(facts['bytes'])} of {_human(cap) if cap else 'no limit'} "
              "($KILN_CACHE_MAX)")
    else:
        try:
            freed = cache.clear()
        except PermissionError as exc:
            print(f"kiln cache: error: {exc}", file=sys.stderr)
            return 2
        print(f"removed {_human(freed)} from {cache.cache_dir()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `kiln` command and its subcommands."""

    # --debug is accepted before or after the command (SUPPRESS: a later default of
    # False must not overwrite an earlier --debug).
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the traceback of an error")
    p = argparse.ArgumentParser(prog="kiln", description=__doc__, parents=[debug],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"kiln {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def verb(subs: Any, name: str, summary: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = subs.add_parser(name, parents=[debug], help=summary)
        return parser

    c = verb(sub, "compile", "compile an ONNX model to .so, .tar, .a or .wasm")
    c.add_argument("model", help="path of the .onnx model")
    c.add_argument("-t", "--target", default=None,
                   help="target: 'host' (default; 'web/wasm32' for a .wasm output), a kind, "
                        "a tag, or JSON")
    c.add_argument("-o", "--output", required=True,
                   help="output file (.so, .tar or .a; .wasm: a WebAssembly module)")
    c.add_argument("--shape", action="append", default=[],
                   help="bind an input shape NAME=D0,?,D2 ('?' stays symbolic), pin a "
                        "dimension NAME=SIZE or bound it NAME=MIN:MAX (repeatable)")
    c.add_argument("--no-check", action="store_true",
                   help="skip onnx's full model check (with strict shape inference) at import")
    c.add_argument("--prefix", default=None, help="system_lib_prefix for the C symbols")
    c.add_argument("--mlf", metavar="MODEL_NAME", default=None,
                   help="write a Model Library Format tar (docs/mlf.md) with this model name")
    c.add_argument("--mlf-source", action="store_true",
                   help="with --mlf: add the compiled IR as kiln DSL text (src/<model>.py)")
    c.add_argument("--timings", action="store_true",
                   help="print the time of every pass and backend step")
    c.add_argument("--profile", action="store_true",
                   help="time every kernel call in the library (read with kiln run --profile)")
    c.add_argument("--max-loop-iterations", type=count(1, MAX_LOOP_ITERATIONS), default=None,
                   metavar="N", help="fail a call whose Loop would start iteration N + 1 "
                                     "(default: no limit, as onnxruntime)")
    c.add_argument("--cc", default=None,
                   help="C compiler for the export (default: $CC, else the one the target "
                        "needs, e.g. aarch64-linux-gnu-gcc)")
    c.add_argument("--tuning", default=None, metavar="DB.json",
                   help="apply a tuning database written by `kiln tune` (its fingerprint "
                        "goes into the library metadata)")
    c.set_defaults(func=_cmd_compile)

    i = verb(sub, "inspect", "what a .so, .tar, .a or MLF tar holds: functions, artifacts; "
                             "an .onnx model's inputs, outputs and ops")
    i.add_argument("file")
    i.add_argument("--artifact", "--show", dest="artifact",
                   help="CODEGEN/FILE to show, e.g. llvm/kernels.bc")
    i.add_argument("--format", default=None,
                   help="text (default) or json for the report; with --artifact the view: "
                        "c, ll, asm, json, hex, symbols")
    i.add_argument("--weights", action="store_true", help="list each weight tensor's SHA-256")
    i.add_argument("--report", metavar="PAGE.html", default=None,
                   help="write a self-contained HTML page: summary, kernel graph (zoom, "
                        "search) and memory plan")
    i.add_argument("--profile-json", metavar="FILE.json", default=None,
                   help="with --report: show the kernel times of `kiln run --profile-json`")
    i.set_defaults(func=_cmd_inspect)

    t = verb(sub, "targets", "list target tags or kinds, or describe one")
    tsub = t.add_subparsers(dest="verb", required=True, metavar="VERB")
    tl = verb(tsub, "list", "the target tags, with whether kiln can compile for them")
    tl.add_argument("--kind", default=None, help="only the tags of this kind")
    ts = verb(tsub, "show", "describe a kind (its attributes) or a tag (its config)")
    ts.add_argument("name")
    verb(tsub, "kinds", "the target kinds, with whether a codegen exists")
    t.set_defaults(func=_cmd_targets)

    r = verb(sub, "run", "load a library and call one of its functions")
    r.add_argument("file")
    r.add_argument("--function", default="main", help="function to call (default: main)")
    r.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="one input from a .npy file (repeatable); the name may be left out "
                        "when the function has exactly one input")
    r.add_argument("--inputs", default=None, metavar="FILE.npz",
                   help="inputs from a .npz archive, by name")
    r.add_argument("--fill", choices=("random", "zeros"), default=None,
                   help="make up the inputs not given (random is seeded; symbolic "
                        "dimensions take their --size)")
    r.add_argument("--size", action="append", default=[], metavar="NAME=N",
                   help="the size of a symbolic dimension of filled inputs (repeatable), "
                        "e.g. --size batch=4 --size seq=128")
    r.add_argument("--output", default=None, metavar="FILE.npy",
                   help="save the only output")
    r.add_argument("--outputs", default=None, metavar="FILE.npz",
                   help="save every output, by name")
    r.add_argument("--repeat", type=count(0, MAX_REPEAT), default=0, metavar="N",
                   help=f"time N more calls and print median, p90 and min latency (N up "
                        f"to {MAX_REPEAT})")
    r.add_argument("--warmup", type=count(0, MAX_REPEAT), default=3, metavar="M",
                   help="untimed calls before the timed ones (default 3)")
    r.add_argument("--profile", action="store_true",
                   help="print kernel times by op type and fused group (library built "
                        "with kiln compile --profile; docs/profiling.md)")
    r.add_argument("--profile-by", default="op,group", metavar="KEYS",
                   help="the --profile tables: comma-separated op, group, kernel "
                        "(default op,group)")
    r.add_argument("--top", type=count(1, MAX_TOP), default=None, metavar="N",
                   help="rows per --profile table before the 'other' row (default: the "
                        "fewest holding 95%% of the time, at most 9)")
    r.add_argument("--profile-json", default=None, metavar="FILE.json",
                   help="write the kernel times (every kernel call, op type, fused group) "
                        "as JSON; the report takes it (kiln inspect --profile-json)")
    r.add_argument("--trace", default=None, metavar="FILE.json",
                   help="write a Chrome trace-event file of the timed calls "
                        "(ui.perfetto.dev, chrome://tracing)")
    r.set_defaults(func=_cmd_run)

    k = verb(sub, "cache", "list, describe or clear the compile cache")
    k.add_argument("action", choices=("list", "info", "clear"))
    k.set_defaults(func=_cmd_cache)

    b = verb(sub, "build-many", "compile a models x targets matrix (on Ray when installed)")
    b.add_argument("matrix", help="JSON (or YAML) file: {\"models\": [...], \"targets\": [...]}")
    b.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="directory for MODEL--TARGET.{so,tar,wasm} and build-summary.json")
    where = b.add_mutually_exclusive_group()
    where.add_argument("--address", default=None,
                       help="join this Ray cluster ('auto' or HOST:PORT); default: start a "
                            "local Ray instance when Ray is installed")
    where.add_argument("--in-process", action="store_true",
                       help="build in this process, one cell after another (no Ray)")
    b.add_argument("--cache-dir", default=None,
                   help="compile cache shared by every task (shared storage on a cluster)")
    b.set_defaults(func=_cmd_build_many)

    u = verb(sub, "tune", "measure kernel variants of a model on this CPU; write a tuning "
                          "database for `kiln compile --tuning`")
    u.add_argument("model", help="path of the .onnx model")
    u.add_argument("-t", "--target", default=None,
                   help="target whose CPU runs the measurements (default: host)")
    u.add_argument("--budget", default="10m", help="time to spend, e.g. 10m, 120s (default 10m)")
    u.add_argument("-o", "--output", required=True, metavar="DB.json",
                   help="tuning database (merged into when it exists)")
    u.add_argument("--shape", action="append", default=[],
                   help="bind an input shape or dimension, as for kiln compile (repeatable)")
    on = u.add_mutually_exclusive_group()
    on.add_argument("--address", default=None,
                    help="join this Ray cluster ('auto' or HOST:PORT); default: a local Ray "
                         "instance when Ray is installed")
    on.add_argument("--in-process", action="store_true", help="tune in this process (no Ray)")
    u.add_argument("--workers", type=count(1, MAX_WORKERS), default=None,
                   help="CPUs of the local Ray instance (default: all)")
    u.add_argument("--threads", type=count(1, max_threads), default=None,
                   help="threads of the measured kernels (default: the runtime's, "
                        "$KILN_NUM_THREADS or one per CPU); tune for the count you deploy with")
    u.set_defaults(func=_cmd_tune)
    return p


def _quiet_closed_pipe() -> int:
    """stdout's reader went away (`kiln ... | head`): say nothing more, as the shell expects.

    Python's documented recipe (the `signal` module's note on SIGPIPE): point
    stdout at devnull so the interpreter's final flush cannot fail again.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141  # 128 + SIGPIPE, what a shell reports for a killed writer


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `kiln` command with `argv` (default: sys.argv[1:]); the exit code."""

    words = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(normalize_argv(words))
    args.debug = getattr(args, "debug", False)
    where = f"kiln {args.command}"
    try:
        code: int = args.func(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        return _quiet_closed_pipe()
    except KeyboardInterrupt:
        print(f"{where}: interrupted", file=sys.stderr)
        return 130
    except USER_ERRORS as exc:
        if args.debug:
            raise
        print(f"{where}: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        missing = missing_dependency(exc, where)
        if args.debug:
            raise
        print(f"{where}: error: {missing if missing is not None else exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if args.debug:
            raise
        print(f"{where}: internal error: {type(exc).__name__}: {exc} "
              "(rerun with --debug for the traceback, and please report it)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
