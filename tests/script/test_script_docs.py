"""The examples in docs/ir.md run as written."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

from kiln.script import from_source

DOC = Path(__file__).resolve().parents[2] / "docs" / "ir.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_worked_example_runs(tmp_path: Path) -> None:
    example = _python_blocks()[-1]
    assert "evaluate" in example
    script = tmp_path / "worked_example.py"  # decorators read a real source file
    script.write_text(example)
    runpy.run_path(str(script), run_name="__main__")


def test_dsl_sample_parses() -> None:
    mod = from_source(_python_blocks()[0])
    assert list(mod) == ["scale"] and dict(mod.attrs) == {"origin": "example"}
