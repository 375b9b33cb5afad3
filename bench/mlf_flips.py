"""One-bit flips over a Model Library Format archive, more of them than the test runs
(a tool run by hand; the test is tests/mlf/test_mlf_flips.py, docs/security.md quotes
both).

    .venv/bin/python bench/mlf_flips.py [--flips 3000] [--seed N] [--archive model.tar]

Without `--archive`, the archive of the test's tiny model is exported to a temporary
folder. Each flip goes through `kiln.mlf.extract_checked` (all `kiln.mlf.load` checks
before it compiles); a flip that passes must leave every file and metadata.json's content
as exported. Prints the counts per region of the tar and every flip that was neither
refused with a KilnError nor harmless, and how many flips hit a weight's bytes and were
refused naming the weight (MLF version 4's per-weight SHA-256s; a version-3 archive's
refusals name only the `.params` file); exits 1 if a flip was neither refused nor
harmless.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "mlf")]

from mlf_mutants import addrelu  # noqa: E402
from test_mlf_flips import fuzz, summary, weight_flips  # noqa: E402

import kiln  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--flips", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--archive", type=Path, help="an MLF archive of version 3 or later "
                        "(version 4 and later name a damaged weight)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kiln-mlf-flips-") as work:
        archive = args.archive or kiln.export_model_library_format(
            addrelu(), Path(work) / "addrelu.tar", model_name="addrelu")
        results, _ = fuzz(archive, Path(work), args.flips, args.seed)
    print(summary(results))
    count, named = weight_flips(results)
    print(f"weights: {count} flips in the .params data, {sum(named.values())} refused "
          "naming the weight: " + (", ".join(f"{n} {w}" for w, n in sorted(named.items()))
                                   or "none"))
    bad = [r for r in results if r[3] not in ("refused", "identical")]
    for region, byte, bit, kind, detail in bad:
        print(f"byte {byte} bit {bit} ({region[0]} {region[1]}): {kind} {detail}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
