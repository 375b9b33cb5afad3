"""`kiln`: compile a model to one deployable file, inspect artifacts, list targets.

    kiln compile model.onnx -t llvm -o model.so [--shape input=1,3,224,224]
    kiln inspect model.so [--artifact llvm/kernels.bc --format ll]
    kiln targets [--tags | --kinds] [NAME]
    kiln run model.so [--input x=x.npy] [--function main]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.errors import KilnError, missing_dependency

# Errors about the user's input or environment: one line on stderr, exit code 2.
# Every kiln error is one (KilnError is their base); so are missing files.
USER_ERRORS = (KilnError, OSError, ValueError)


def _parse_shapes(items: Sequence[str]) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, dims = item.rpartition("=")
        if not sep or not name:
            raise ValueError(f"--shape expects NAME=D0,D1,..., got {item!r}")
        shapes[name] = tuple(int(d) for d in dims.split(",") if d)
    return shapes


def _cmd_compile(args: argparse.Namespace) -> int:
    import kiln
    from kiln.frontend import from_onnx

    target = kiln.Target(args.target) if args.target != "host" else kiln.Target.from_host()
    t0 = time.perf_counter()
    mod = from_onnx(args.model, _parse_shapes(args.shape))
    ex = kiln.compile(mod, target, system_lib_prefix=args.prefix)
    ex.export_library(args.output)
    print(f"compiled {args.model} for {target.kind.name} -> {args.output} "
          f"in {time.perf_counter() - t0:.2f} s")
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from kiln.artifact import inspect_artifact, load

    artifacts = load(args.file)
    if args.artifact is None:
        print(artifacts.inspect())
        return 0
    codegen_id, _, file_name = args.artifact.partition("/")
    found = artifacts.get(codegen_id, file_name)
    if found is None:
        names = ", ".join(f"{a.codegen_id}/{a.file_name}" for a in artifacts)
        raise ValueError(f"no artifact {args.artifact!r} in {args.file}; it has: {names}")
    print(inspect_artifact(found, args.format))
    return 0


def _cmd_targets(args: argparse.Namespace) -> int:
    from kiln import target

    if args.name:
        print(target.describe(args.name))
    elif args.kinds:
        print("\n".join(target.list_kinds()))
    else:
        print("\n".join(target.list_tags()))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from kiln.runtime import load_module

    lib = load_module(args.file)
    fn = lib[args.function]
    inputs: dict[str, Any] = {}
    for item in args.input:
        name, _, path = item.partition("=")
        inputs[name] = np.load(path)
    t0 = time.perf_counter()
    out = fn(**inputs)
    dt = (time.perf_counter() - t0) * 1e3
    outs = out if isinstance(out, tuple) else (out,)
    for k, o in enumerate(outs):
        if o is not None:
            print(f"output {k}: shape {o.shape} dtype {o.dtype}\n{o}")
    print(f"{args.function}: {dt:.3f} ms")
    return 0


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _cmd_cache(args: argparse.Namespace) -> int:
    from kiln.driver import cache

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
    p = argparse.ArgumentParser(prog="kiln", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("compile", help="compile an ONNX model to .so, .tar or .a")
    c.add_argument("model", help="path of the .onnx model")
    c.add_argument("-t", "--target", default="host",
                   help="target: 'host' (default), a kind, a tag, or JSON")
    c.add_argument("-o", "--output", required=True, help="output file (.so, .tar or .a)")
    c.add_argument("--shape", action="append", default=[],
                   help="bind an input shape: NAME=D0,D1,... (repeatable)")
    c.add_argument("--prefix", default=None, help="system_lib_prefix for the C symbols")
    c.set_defaults(func=_cmd_compile)

    i = sub.add_parser("inspect", help="list (or show) the artifacts inside a .so or .tar")
    i.add_argument("file")
    i.add_argument("--artifact", help="CODEGEN/FILE to show, e.g. llvm/kernels.bc")
    i.add_argument("--format", default=None, help="view: c, ll, asm, json, hex, symbols")
    i.set_defaults(func=_cmd_inspect)

    t = sub.add_parser("targets", help="list target tags or kinds, or describe one")
    t.add_argument("name", nargs="?")
    t.add_argument("--kinds", action="store_true", help="list kinds instead of tags")
    t.set_defaults(func=_cmd_targets)

    r = sub.add_parser("run", help="load a library and call one of its functions")
    r.add_argument("file")
    r.add_argument("--function", default="main")
    r.add_argument("--input", action="append", default=[], help="NAME=path.npy (repeatable)")
    r.set_defaults(func=_cmd_run)

    k = sub.add_parser("cache", help="list, describe or clear the compile cache")
    k.add_argument("action", choices=("list", "info", "clear"))
    k.set_defaults(func=_cmd_cache)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `kiln` command with `argv` (default: sys.argv[1:]); the exit code."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except USER_ERRORS as exc:
        print(f"kiln {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        missing = missing_dependency(exc, f"kiln {args.command}")
        if missing is None:
            raise
        print(f"kiln {args.command}: error: {missing}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

