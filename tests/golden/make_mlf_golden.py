"""Generate the dated golden Model Library Format archive of the current MLF version.

Run once per MLF version and check the output in; never regenerate an existing file
(it guards that newer kilns still read old archives). The model comes from
tests/mlf/mlf_mutants.py (`addrelu`: y = relu(x + b), b = [0.5, -1, 2, -0.25]):

    PYTHONPATH=tests:tests/mlf .venv/bin/python tests/golden/make_mlf_golden.py 2026-11-27

tests/mlf/test_mlf_versions.py loads the golden of every version and checks the answer.
"""

from __future__ import annotations

import os
import sys

from mlf_mutants import addrelu

import kiln
from kiln.export.mlf import MLF_VERSION

HERE = os.path.dirname(os.path.abspath(__file__))


def main(date: str) -> None:
    if any(n.startswith(f"mlf_v{MLF_VERSION}_") for n in os.listdir(HERE)):
        sys.exit(f"a golden MLF archive of version {MLF_VERSION} exists; it is never "
                 "regenerated")
    path = os.path.join(HERE, f"mlf_v{MLF_VERSION}_{date}.tar")
    os.environ.pop("SOURCE_DATE_EPOCH", None)  # export_datetime: the epoch
    kiln.export_model_library_format(addrelu(), path, model_name="addrelu")
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "2026-11-27")
