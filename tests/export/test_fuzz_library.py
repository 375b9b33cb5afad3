"""Fuzzing exported `.so` files: bit flips and truncations, each loaded and run in a subprocess.

Every mutant is classified as
- `error`: load_module or the call raised a kiln error (FormatError, KilnError, ...);
- `same`: it loaded and gave exactly the original output (the damage hit bytes
  nothing reads, e.g. padding or an unused symbol);
- `changed`: it ran and gave another output — a silent wrong answer;
- `crash`: the process died from a signal; `hang`: it did not finish in time.

The regions the kiln format covers (the blob: header, section table, sections,
checksum; the linked weights after it; truncations, which the file-size checks
catch) must give only `error` or `same`. Damage elsewhere (machine code,
relocations, dynamic section, ELF headers) is what `dlopen` and the CPU run;
kiln cannot check it without hashing the whole file, so those counts are
reported, not asserted (docs/format.md lists them).
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.artifact import blob
from kiln.artifact.elf import SHT_DYNSYM, find_blob_symbol, read_symbols, section_name
from kiln.ir import IRBuilder
from kiln.ir import graph as g
from kiln.runtime import load_module
from support.processes import run_isolated

ROWS, COLS = 64, 256
COVERED = ("blob header", "blob section table", "blob sections", "blob checksum", "weights",
           "truncation")
PER_REGION = 24
BATCH = 25
# A load and call takes a fraction of a second; a mutant whose machine code loops (a
# .text flip) is stopped by the worker's watchdog after MUTANT_S (run_isolated). HANG_S
# bounds a whole batch of 25 in case the watchdog itself cannot run.
MUTANT_S = 8
HANG_S = 120
SEED = 20261122

WORKER = r"""
import json, sys
import numpy as np
from kiln.runtime import load_module
x = np.load(sys.argv[1])
ref = np.load(sys.argv[2])
for path in sys.argv[4:]:
    watch(float(sys.argv[3]))
    try:
        with load_module(path) as lib:
            out = lib["main"](x)
        kind = "same" if out.shape == ref.shape and np.array_equal(out, ref, equal_nan=True) \
            else "changed"
    except Exception as exc:  # classified by the parent: which error types are clean
        kind = "error:" + type(exc).__name__
    unwatch()
    print(json.dumps([path, kind]), flush=True)
"""


def build_library(folder: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    """main(idx) = gather(table, idx) + bias, exported to a .so; (path, input, output)."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    bias = rng.standard_normal(COLS).astype(np.float32)
    ib = IRBuilder()
    with ib.function("main"):
        idx = ib.param("idx", (ROWS,), "int64")
        rows = ib.emit(kiln.ops.call("gather", g.Constant(table, "table"), idx, axis=0), "rows")
        ib.ret(ib.emit(kiln.ops.call("add", rows, g.Constant(bias, "bias")), "y"))
    so = folder / "model.so"
    kiln.compile(ib.get(), "llvm").export_library(so)
    x = np.arange(ROWS, dtype=np.int64)[::-1].copy()
    with load_module(so) as lib:
        y = lib["main"](x)
    np.testing.assert_array_equal(y, table[x] + bias)
    return so, x, y


def regions(so: Path) -> dict[str, tuple[int, int]]:
    """File byte ranges [start, end) of the parts of the library."""
    with open(so, "rb") as f:
        sym = find_blob_symbol(f, str(so))
        elf = read_symbols(f.fileno(), str(so), (SHT_DYNSYM,))
        names = {section_name(elf, f.fileno(), i): s for i, s in enumerate(elf.sections)}
    data = so.read_bytes()
    start = sym.file_offset
    total = blob.blob_length(data[start:start + blob.HEADER_SIZE])
    contents = blob.unpack(data[start:start + total])
    (weights,) = contents.linked
    table_end = blob.HEADER_SIZE + 5 * 24
    out = {
        "elf header": (0, 64),
        "blob header": (start, start + blob.HEADER_SIZE),
        "blob section table": (start + blob.HEADER_SIZE, start + table_end),
        "blob sections": (start + table_end, start + total - blob.CHECKSUM_SIZE),
        "blob checksum": (start + total - blob.CHECKSUM_SIZE, start + total),
        "weights": (start + weights.offset, start + weights.offset + weights.length),
    }
    for label, section in ((".text", ".text"), ("dynamic symbols", ".dynsym"),
                           ("dynamic strings", ".dynstr"), ("dynamic section", ".dynamic"),
                           ("relocations", ".rela.dyn")):
        if section in names:
            s = names[section]
            out[label] = (s.offset, s.offset + s.size)
    return out


def make_mutants(so: Path, folder: Path, rng: random.Random) -> list[tuple[Path, str]]:
    data = so.read_bytes()
    mutants: list[tuple[Path, str]] = []

    def add(region: str, content: bytes) -> None:
        path = folder / f"m{len(mutants):04d}.so"
        path.write_bytes(content)
        mutants.append((path, region))

    for region, (lo, hi) in regions(so).items():
        offsets = {lo, hi - 1} | {rng.randrange(lo, hi) for _ in range(PER_REGION - 2)}
        for off in sorted(offsets):
            mutated = bytearray(data)
            mutated[off] ^= 1 << rng.randrange(8)
            add(region, bytes(mutated))
    cuts = {0, 1, 63, 64, len(data) - 1, len(data) // 2} | {
        rng.randrange(len(data)) for _ in range(PER_REGION - 6)}
    for cut in sorted(cuts):
        add("truncation", data[:cut])
    return mutants


def run_batches(mutants: list[tuple[Path, str]], x_file: Path,
                y_file: Path) -> dict[Path, str]:
    """Outcome per mutant; a worker killed by a signal loses only the mutant it was on."""
    results = run_isolated(WORKER, [str(x_file), str(y_file)], [p for p, _r in mutants],
                           batch=BATCH, item_s=MUTANT_S, batch_s=HANG_S)
    return {p: outcome[0] for p, outcome in results.items()}


def test_fuzz_exported_library(tmp_path: Path) -> None:
    so, x, y = build_library(tmp_path)
    x_file, y_file = tmp_path / "x.npy", tmp_path / "y.npy"
    np.save(x_file, x)
    np.save(y_file, y)
    mutants = make_mutants(so, tmp_path, random.Random(SEED))
    assert len(mutants) >= 200
    results = run_batches(mutants, x_file, y_file)

    table: dict[str, Counter[str]] = {}
    for path, region in mutants:
        kind = results[path]
        kind = "error" if kind.startswith("error:") else kind.split(":")[0]
        table.setdefault(region, Counter())[kind] += 1
    report = "\n".join(f"{region:20s} " + "  ".join(f"{k}={n}" for k, n in sorted(c.items()))
                       for region, c in table.items())
    print(f"\n{len(mutants)} mutants\n{report}")

    # Which errors are clean: kiln's own, or what the OS reports for an unreadable file.
    clean = {"error:FormatError", "error:KilnError", "error:CallError", "error:OSError",
             "error:FileNotFoundError"}
    unclean = {str(p): k for p, k in results.items()
               if k.startswith("error:") and k not in clean}
    assert not unclean, f"mutants raised non-kiln errors: {unclean}"
    for region in COVERED:
        counts = table[region]
        assert counts["changed"] == 0, f"{region}: silent wrong answers\n{report}"
        assert counts["crash"] == 0 and counts["hang"] == 0, f"{region}: crashes\n{report}"
    # Every flip of the weights is caught (they are all read by the hash check).
    assert table["weights"]["error"] == sum(table["weights"].values())


@pytest.mark.parametrize("mode", ["lazy", True])
def test_damaged_weights_are_a_format_error_naming_the_range(tmp_path: Path,
                                                               mode: bool | str) -> None:
    so, x, _y = build_library(tmp_path)
    lo, _hi = regions(so)["weights"]
    data = bytearray(so.read_bytes())
    data[lo + 5000] ^= 0x80
    bad = tmp_path / "bad.so"
    bad.write_bytes(bytes(data))
    message = (r"linked data llvm/constants\.bin: checksum \(kiln.lane64/1\) mismatch "
               r"in bytes \[0, ")
    if mode is True:
        with pytest.raises(kiln.FormatError, match=message):
            load_module(bad, verify_weights=True)
        return
    with load_module(bad) as lib:  # lazy: loading stays cheap
        for _ in range(2):  # and every call refuses, not only the first
            with pytest.raises(kiln.FormatError, match=message):
                lib["main"](x)


def test_verify_weights_false_trusts_the_file(tmp_path: Path) -> None:
    so, x, y = build_library(tmp_path)
    lo, _hi = regions(so)["weights"]
    data = bytearray(so.read_bytes())
    data[lo + ROWS * COLS * 4 - 1] ^= 0x01  # the last row of the table: not gathered below
    bad = tmp_path / "trusted.so"
    bad.write_bytes(bytes(data))
    with load_module(bad, verify_weights=False) as lib:
        np.testing.assert_array_equal(lib["main"](x[1:2].repeat(ROWS)), y[1:2].repeat(ROWS, 0))
    with pytest.raises(ValueError, match="verify_weights must be True, False or 'lazy'"):
        load_module(so, verify_weights="sometimes")
