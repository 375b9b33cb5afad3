"""Find the code blocks of a Markdown file and run them, in order, in one process.

The convention (tests/docs/test_doc_blocks.py runs it for README.md and every
docs/**/*.md, so a new page is picked up by itself):

- ```python blocks run in one fresh Python process per file, in order, sharing one
  namespace, from a scratch directory holding links to the repository's `models/`
  and `examples/`. A block whose first line starts with `>>>` is a doctest: its
  printed output must match (whitespace-normalized, `...` as a wildcard).
- ```sh, ```bash and ```console blocks run with `bash -e` in the same
  directory at their place in the order; `kiln` and `python` are this checkout's.
  Shell variables set in one block are defined in the next ones, as in one
  terminal. No `pipefail`, as in a user's shell: `kiln inspect m.so | head` is fine, so a
  command whose status matters must not be piped.
  In ```console blocks only `$ ` lines are commands. Lines that start with `make`,
  `pip`, `apt-get` or `sudo` change the machine and are skipped (the Makefile and
  tests/packaging cover them), and so are `pytest` runs (the suite runs itself)
  and `python bench/...` (benchmarks take minutes and print timings to read).
- ```c blocks that are complete programs (they define `main`) are compiled with
  `cc -Wall -Werror` against kiln's header; other C fragments are not compiled.
- Everything else (```text, ```json, ```llvm, ```toml, untagged) is not executed:
  use ```text for output and for code that only illustrates.

Run as a script (`python doc_blocks.py FILE.md`) it executes FILE.md's blocks and
exits non-zero naming the first block that failed (FILE.md:LINE).
"""

from __future__ import annotations

import doctest
import re
import subprocess
import sys
import traceback
import types
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
RUN = {"python": "python", "py": "python", "sh": "sh", "bash": "sh", "console": "console",
       "c": "c"}
SKIPPED_COMMANDS = re.compile(
    r"^\s*(make|pip|pip3|apt-get|sudo|(python -m )?pytest|(\S*/)?python3? bench/\S+)(\s|$)")


@dataclass(frozen=True)
class Block:
    """One fenced block: its kind ("python", "sh", "console", "c"), code and first line."""

    kind: str
    code: str
    line: int  # 1-based line of the block's first code line in the Markdown file


def blocks(text: str) -> list[Block]:
    """The runnable blocks of a Markdown text, in order."""
    found = []
    for match in FENCE.finditer(text):
        kind = RUN.get(match.group(1).lower())
        if kind is not None:
            line = text.count("\n", 0, match.start(2)) + 1
            found.append(Block(kind, match.group(2), line))
    return found


def _padded(block: Block) -> str:
    """The block's code preceded by blank lines, so line numbers are the Markdown file's."""
    return "\n" * (block.line - 1) + block.code


def shell_script(block: Block) -> str:
    """The bash script for a sh/console block; skipped lines say so on stderr."""
    lines = block.code.splitlines()
    if block.kind == "console":
        lines = [line[2:] if line.startswith("$ ") else "" for line in lines]
    lines = [f": skipped {line.strip()!r}" if SKIPPED_COMMANDS.match(line) else line
             for line in lines]
    # Line 1 is never part of a block (it holds at least the fence).
    # Variables carry over to the page's next block (`set -a` exports them), as in a terminal.
    header = ("set -e -a; if [ -f .shell_vars ]; then . ./.shell_vars; fi; "
              "trap 'export -p > .shell_vars' EXIT; "
              "trap 'echo \"failed at line $LINENO\" >&2' ERR")
    return header + "\n" * (block.line - 1) + "\n".join(lines) + "\n"


def _run_python(block: Block, source: Path, module: types.ModuleType) -> None:
    namespace = module.__dict__
    if block.code.lstrip().startswith(">>>"):
        test = doctest.DocTestParser().get_doctest(block.code, namespace, source.name,
                                                   str(source), block.line - 1)
        flags = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS
        runner = doctest.DocTestRunner(optionflags=flags)
        runner.run(test, out=sys.stderr.write, clear_globs=False)
        if runner.failures:
            raise AssertionError(f"{runner.failures} doctest example(s) failed")
        return
    # The DSL decorators read their class's source: it must live in a real file.
    script = Path(f".{source.name}.L{block.line}.py")
    script.write_text(_padded(block))
    module.__file__ = str(script.resolve())  # where `inspect` looks for a class's source
    exec(compile(script.read_text(), str(script), "exec"), namespace)


def _run_c(block: Block, source: Path, include_dir: str) -> None:
    if not re.search(r"\bmain\s*\(", block.code):
        return
    c_file = Path(f".{source.name}.L{block.line}.c")
    c_file.write_text(block.code)
    code = subprocess.run(["cc", "-Wall", "-Werror", "-I", include_dir, "-c", str(c_file),
                           "-o", str(c_file.with_suffix(".o"))]).returncode
    if code:
        raise RuntimeError(f"cc -Wall -Werror exited with status {code}")


def run_file(source: Path) -> int:
    """Run every block of `source` in the current directory; 0 when all pass."""
    # The blocks' namespace is `__main__`, as in a script (classes pickle, inspect finds them).
    module = types.ModuleType("__main__")
    sys.modules["__main__"] = module
    for block in blocks(source.read_text()):
        try:
            if block.kind == "python":
                _run_python(block, source, module)
            elif block.kind == "c":
                from kiln.runtime import include_dir

                _run_c(block, source, str(include_dir()))
            else:
                code = subprocess.run(["bash", "-c", shell_script(block)]).returncode
                if code:
                    raise RuntimeError(f"the {block.kind} block exited with status {code}")
        except BaseException:
            traceback.print_exc()
            print(f"FAILED {source}:{block.line} ({block.kind} block)", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(run_file(Path(sys.argv[1])))
