"""Names from a model are data, never code: every one goes through kiln.escape.

A tensor or node name holding `*/` once ended a comment in host.c and put a
`__attribute__((constructor))` function into the library. These tests feed the
code generators names with comment ends, quotes, newlines, backslashes, NUL,
trigraphs, non-ASCII text and 10,000 characters (and arbitrary Unicode from
hypothesis), compile what comes out with `cc -Werror`, and check the library
exports exactly the symbols of docs/abi.md. Loading and running happen in a
fresh process so a payload that did run would show as a signal.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from c_helpers import CC, have_cc
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import kiln
from kiln import escape
from kiln.artifact import elf
from kiln.driver import Executable
from kiln.ir import IRBuilder
from kiln.ir.module import IRModule
from kiln.runtime import load_module
from kiln.runtime.dynsym import dynamic_symbols
from kiln.runtime.threads import POOL_EXPORTS

pytestmark = pytest.mark.skipif(not have_cc(), reason="needs a C compiler")

# Each would break out of a comment, a string literal or a line, or overflow a limit.
PAYLOAD = ('x */ __attribute__((constructor)) static void pwned(void) { abort(); } /* '
           '"q" \\ \n \r \t \0 é 名 ??/ \U0001f600 // #include <stdio.h>')
HOSTILE = [PAYLOAD, "*/", '"', "\\", "\n", "\0", "??/", "é", "a" * 10_000, PAYLOAD * 40, ""]
# Every example compiles C: report a failure as found, do not spend minutes shrinking it.
NO_SHRINK = (Phase.explicit, Phase.generate)
WERROR = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-c"]


def abi_symbols(metadata: dict) -> set[str]:
    """The dynamic symbols docs/abi.md promises: entries, last error, metadata, CPU check,
    thread controls, blob."""
    prefix = metadata["prefix"]
    return ({sig["symbol"] for sig in metadata["functions"].values()}
            | {f"{prefix}_last_error", f"{prefix}_metadata", f"{prefix}_cpu_missing",
               f"{prefix}_blob"} | {f"{prefix}_{name}" for name in POOL_EXPORTS})


def defined_dynamic_symbols(path: Path) -> set[str]:
    return {name for name, _type, shndx, _size in dynamic_symbols(str(path))
            if name and shndx != 0}


def all_symbol_names(path: Path) -> set[str]:
    """Names in .dynsym and .symtab (static functions too), read by kiln's ELF reader.

    An injected `pwned` function would be there; sanitised names that merely
    contain the word (a static array named after a parameter) are harmless.
    """
    with open(path, "rb") as f:
        found = elf.read_symbols(f.fileno(), str(path), (elf.SHT_DYNSYM, elf.SHT_SYMTAB))
    return {s.name for s in found.symbols}


# ------------------------------------------------------------------ kiln.escape itself


@given(st.text())
def test_comment_text_cannot_end_or_start_a_comment(text: str) -> None:
    out = escape.c_comment(text)
    assert len(out) <= escape.MAX_COMMENT
    assert "*" not in out and "\\" not in out and "?" not in out and "\n" not in out
    assert out.isascii() and out.isprintable()


@given(st.text())
def test_identifiers_are_ascii_bounded_and_stable(hint: str) -> None:
    name = escape.c_identifier(hint)
    assert re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name)
    assert len(name) <= escape.MAX_IDENTIFIER
    assert escape.c_identifier(hint) == name


@given(st.text(min_size=1), st.text(min_size=1))
def test_symbol_names_are_identifiers_and_distinct(a: str, b: str) -> None:
    sa, sb = escape.symbol_name(a), escape.symbol_name(b)
    for name, symbol in ((a, sa), (b, sb)):
        assert escape.is_c_identifier(symbol)
        assert len(symbol) <= escape.MAX_SYMBOL_NAME + 3
        # Plain names stay readable (the ABI's `{prefix}{name}`); others are mangled
        # into `_x...`, which no plain name can equal (IR names never start with `_`).
        assert (symbol == name) != symbol.startswith("_x")
    assert (sa == sb) == (a == b)


def test_long_identifiers_keep_distinct_hints_apart() -> None:
    a, b = "t" * 5000 + "a", "t" * 5000 + "b"
    assert escape.c_identifier(a) != escape.c_identifier(b)
    assert escape.symbol_name("main") == "main"
    assert escape.symbol_name("é").startswith("_x")


@settings(max_examples=10, deadline=None, database=None, phases=NO_SHRINK,
          suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(st.text(), min_size=1, max_size=4))
def test_char_arrays_hold_exactly_the_utf8_bytes(texts: list[str], tmp_path_factory) -> None:
    texts = [*texts, PAYLOAD, "\0" + "x" * (escape.MAX_STRING_LITERAL + 10)]
    tmp = tmp_path_factory.mktemp("strings")
    lines = ["#include <stdio.h>", ""]
    for k, text in enumerate(texts):
        init = escape.c_char_array(text)
        lines += [f"static const char s{k}[] =", *init[:-1], init[-1] + ";"]
        lines += [f"static const char l{k}[] = {escape.c_string_literal(text[:50])};"]
    lines += ["", "static void dump(const char* s, size_t n) {",
              "  size_t i;", '  printf("=");',
              '  for (i = 0; i < n; ++i) printf("%02x", (unsigned char)s[i]);',
              '  printf("\\n");', "}", "", "int main(void) {"]
    for k in range(len(texts)):
        lines += [f"  dump(s{k}, sizeof s{k} - 1);", f"  dump(l{k}, sizeof l{k} - 1);"]
    lines += ["  return 0;", "}", ""]
    src = tmp / "strings.c"
    src.write_text("\n".join(lines))
    exe = tmp / "strings"
    subprocess.run([CC, "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-o", str(exe),
                    str(src)], check=True, capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    want = [f"={v}" for text in texts
            for v in (escape.utf8(text).hex(), escape.utf8(text[:50]).hex())]
    assert out.splitlines() == want


# ------------------------------------------------------------------ generated C, both backends


def names_module(fname: str, x: str, y: str, loop: str) -> IRModule:
    """`fname(X, Y)`: Y[i] = X[i] * 2 + 1, with every name chosen by the caller."""
    ib = IRBuilder()
    with ib.prim_func(fname):
        xs = ib.arg(x, (4,), "float32")
        ys = ib.arg(y, (4,), "float32")
        with ib.for_range(4, name=loop) as i:
            ib.store(ys, [i], xs[i] * 2.0 + 1.0)
    return ib.get()


def build_with_werror(mod: IRModule, target: str, tmp: Path) -> Path:
    """Compile every C artifact with -Werror, then export the library as kiln does."""
    exe = kiln.compile(mod, target)
    for art in exe.artifacts:
        if art.file_name.endswith(".c"):
            src = tmp / f"{art.codegen_id}_{art.file_name}"
            src.write_bytes(art.content)
            flags = [f for f in art.metadata.get("cflags", []) if f.startswith("-D")]
            proc = subprocess.run([CC, *WERROR, *flags, "-o", str(src) + ".o", str(src)],
                                  capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr[-3000:]
    so = tmp / "lib.so"
    exe.export_library(so)
    assert defined_dynamic_symbols(so) == abi_symbols(exe.metadata)
    assert "pwned" not in all_symbol_names(so)
    return so


function_names = st.from_regex(r"[^\W\d_][\w]{0,30}", fullmatch=True).filter(str.isidentifier)
any_names = st.one_of(st.text(max_size=40), st.sampled_from(HOSTILE))


@pytest.mark.parametrize("target", ["c", "llvm"])
@settings(max_examples=15, deadline=None, database=None, phases=NO_SHRINK,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(fname=function_names, x=any_names, y=any_names, loop=any_names)
def test_arbitrary_unicode_names_compile_with_werror(
        target: str, fname: str, x: str, y: str, loop: str, tmp_path_factory) -> None:
    tmp = tmp_path_factory.mktemp(f"names-{target}")
    build_with_werror(names_module(fname, x, y, loop), target, tmp)


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_long_and_non_ascii_function_names_get_mangled_symbols(target: str, tmp_path) -> None:
    long_name = "f" * 10_000
    mod = names_module(long_name, PAYLOAD, "y" * 10_000, PAYLOAD)
    mod2 = names_module("résumé_名", "x", "y", "i")
    so = build_with_werror(mod, target, tmp_path)
    meta = load_module(str(so)).metadata
    symbol = meta["functions"][long_name]["symbol"]
    assert symbol.startswith("kiln__x") and len(symbol) < 100
    exe = kiln.compile(mod2, target)
    symbol2 = exe.metadata["functions"]["résumé_名"]["symbol"]
    assert escape.is_c_identifier(symbol2) and symbol2.startswith("kiln__x")
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(_call(exe, "résumé_名", x), x * 2 + 1)


def _call(exe: Executable, name: str, x: np.ndarray) -> np.ndarray:
    y = np.zeros(4, np.float32)
    exe[name](x, y)
    return y


# ------------------------------------------------------------------ an ONNX model, end to end

_BUILD = textwrap.dedent("""
    import sys
    from onnx import TensorProto, helper
    import kiln
    from kiln.frontend.onnx import from_onnx

    evil = sys.stdin.read()
    a, b, o = evil + "A", evil + "B", evil + "O"
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in (a, b)]
    output = helper.make_tensor_value_info(o, TensorProto.FLOAT, [4])
    nodes = [helper.make_node("Add", [a, b], [evil + "t"], name=evil + "add"),
             helper.make_node("Relu", [evil + "t"], [o], name=evil + "relu")]
    graph = helper.make_graph(nodes, evil + "graph", inputs, [output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    kiln.compile(from_onnx(model), sys.argv[1]).export_library(sys.argv[2])
""")

_RUN = textwrap.dedent("""
    import json, sys
    import numpy as np
    from kiln.runtime import load_module

    lib = load_module(sys.argv[1])
    x = np.array([-1, 2, -3, 4], np.float32)
    y = np.array([0.5, -5, 1, 1], np.float32)
    out = lib["main"](x, y)
    try:
        lib["main"](x, y.astype(np.float64))
        error = ""
    except Exception as exc:
        error = str(exc)
    sig = lib.metadata["functions"]["main"]
    print(json.dumps({"out": np.asarray(out).tolist(), "error": error,
                      "names": [p["name"] for p in sig["params"]],
                      "results": [r["name"] for r in sig["results"]]}))
""")


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_hostile_onnx_names_load_and_run_in_a_fresh_process(target: str, tmp_path: Path) -> None:
    evil = PAYLOAD + "n" * 10_000
    so = tmp_path / "model.so"
    built = subprocess.run([sys.executable, "-c", _BUILD, target, str(so)], input=evil,
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    ran = subprocess.run([sys.executable, "-c", _RUN, str(so)], capture_output=True, text=True,
                         timeout=600)
    assert ran.returncode == 0, f"exit {ran.returncode}: {ran.stderr[-3000:]}"
    result = json.loads(ran.stdout)
    np.testing.assert_array_equal(result["out"], [0, 0, 0, 5])
    assert result["names"] == [evil + "A", evil + "B"]
    assert result["results"] == [evil + "O"]
    # The rejected call names the parameter (the C message stops at its NUL byte).
    assert result["error"].startswith(f"main: argument 1 '{PAYLOAD.split(chr(0))[0]}")
    meta = json.loads(subprocess.run(
        [sys.executable, "-c", "import json, sys; from kiln.runtime import load_module; "
         "print(json.dumps(load_module(sys.argv[1]).metadata))", str(so)],
        capture_output=True, text=True, check=True).stdout)
    assert defined_dynamic_symbols(so) == abi_symbols(meta)
    assert "pwned" not in all_symbol_names(so)


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_names_that_spell_the_same_identifier(target: str, tmp_path: Path) -> None:
    """`a b`, `a_b`, `a\\nb` all spell `a_b`; both backends still keep them apart."""
    ib = IRBuilder()
    with ib.prim_func("f"):
        xs = [ib.arg(name, (4,), "float32") for name in ("a b", "a_b", "a\nb", "arg1", "arg1")]
        y = ib.arg("arg2", (4,), "float32")
        with ib.for_range(4, name="a b") as i:
            ib.store(y, [i], xs[0][i] + xs[1][i] * 2.0 + xs[2][i] * 3.0 + xs[3][i] * 4.0
                     + xs[4][i] * 5.0)
    so = build_with_werror(ib.get(), target, tmp_path)
    lib = load_module(str(so))
    ones = np.ones(4, np.float32)
    out = np.zeros(4, np.float32)
    lib["f"](ones, ones * 10, ones * 100, ones * 1000, ones * 10000, out)
    np.testing.assert_array_equal(out, np.full(4, 1 + 20 + 300 + 4000 + 50000, np.float32))
