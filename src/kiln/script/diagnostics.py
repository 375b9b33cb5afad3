"""Parse errors that point at the DSL source: line, column, the line itself and a caret."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from kiln.errors import IRError


class ScriptError(IRError):
    """A DSL text could not be parsed; `line`/`col` are 1-based (0 when unknown)."""

    def __init__(self, message: str, *, line: int = 0, col: int = 0, detail: str = "") -> None:
        super().__init__(message)
        self.line = line
        self.col = col
        self.detail = detail  # the message without location and quote


@dataclass(frozen=True)
class Source:
    """DSL text plus where it came from, so errors report positions in the user's file.

    `text` is what `ast.parse` sees; `lines` are the original lines (for
    quoting); the text is `lines` with `indent` columns removed and starts at
    file line `line_offset + 1`.
    """

    text: str
    lines: tuple[str, ...]
    filename: str = ""
    line_offset: int = 0
    indent: int = 0

    @staticmethod
    def from_text(text: str, filename: str = "") -> Source:
        return Source(text, tuple(text.splitlines()), filename)

    @staticmethod
    def from_file_lines(lines: list[str], filename: str, first_line: int) -> Source:
        """Source of a decorated definition: strip the common indentation."""
        stripped = [ln.rstrip("\n").rstrip("\r") for ln in lines]
        indents = [len(ln) - len(ln.lstrip()) for ln in stripped if ln.strip()]
        indent = min(indents) if indents else 0
        text = "\n".join(ln[indent:] if ln.strip() else "" for ln in stripped) + "\n"
        return Source(text, tuple(stripped), filename, first_line - 1, indent)

    def _line_text(self, lineno: int) -> str:
        """The original text of parsed line `lineno` (1-based)."""
        if 1 <= lineno <= len(self.lines):
            return self.lines[lineno - 1]
        return ""

    def error(self, node: ast.AST | None, message: str) -> ScriptError:
        """A ScriptError for `node`: 'line L, col C: message' plus the quoted line."""
        lineno = getattr(node, "lineno", None)
        if node is None or lineno is None:
            where = f"{self.filename}: " if self.filename else ""
            return ScriptError(f"{where}{message}", detail=message)
        col_bytes = getattr(node, "col_offset", 0) or 0
        end_line = getattr(node, "end_lineno", None)
        end_bytes = getattr(node, "end_col_offset", None)
        parsed = self.text.splitlines()
        raw = parsed[lineno - 1] if 1 <= lineno <= len(parsed) else ""
        # ast columns count UTF-8 bytes of the parsed (dedented) line.
        col = len(raw.encode()[:col_bytes].decode(errors="ignore"))
        width = 1
        if end_line == lineno and end_bytes is not None:
            width = max(1, len(raw.encode()[:end_bytes].decode(errors="ignore")) - col)
        return self._make(lineno, col, width, message)

    def error_at(self, lineno: int, col0: int, message: str) -> ScriptError:
        """A ScriptError at parsed line `lineno`, 0-based character column `col0`."""
        return self._make(lineno, col0, 1, message)

    def _make(self, lineno: int, col0: int, width: int, message: str) -> ScriptError:
        line = lineno + self.line_offset
        col = col0 + self.indent + 1
        where = f"{self.filename}, " if self.filename else ""
        text = f"{where}line {line}, col {col}: {message}"
        quoted = self._line_text(lineno)
        if quoted.strip():
            shown = quoted.expandtabs(1)
            caret = " " * (col - 1) + "^" * min(width, max(1, len(shown) - col + 1))
            text += f"\n    {shown}\n    {caret}"
        return ScriptError(text, line=line, col=col, detail=message)
