"""Untrusted strings in generated code: the one place they are spelled.

Names in a model (ONNX tensor, node and graph names, kiln.script parameter
names, output names) are arbitrary Unicode of any length. Every one of them
that reaches generated C, LLVM IR, a symbol name or a linker argument goes
through exactly one of these functions, each of which returns text whose
alphabet cannot end the construct it is placed in:

- `c_string_literal`: one C string literal, every byte escaped as needed;
- `c_char_array`: the initializer of a `char[]` (literals, or a byte list when
  long): names in error messages, the metadata JSON;
- `c_comment`: text for inside `/* ... */`: printable ASCII without `*`, `\\`,
  `?` or `"`, bounded length;
- `c_identifier`: `[A-Za-z][A-Za-z0-9_]*` of bounded length: C locals, LLVM
  value names;
- `symbol_name`: the part of a library symbol that stands for a function
  (docs/abi.md, "Symbols");
- `is_c_identifier`: the check for prefixes, extern names and exported symbols;
- `int64_literal`: an `int64_t` value as C text (numbers are not user strings, but
  every generated file spells them this one way);
- `html_text`: text or a quoted attribute value of an HTML page (`kiln inspect
  --report`).

This module is a leaf (standard library and kiln.errors only) so the exporter and the runtime
side may use it as well as the code generators.
"""

from __future__ import annotations

import hashlib
import re

from kiln.errors import CompileError

# ISO C99 compilers must accept string literals of 4095 characters; -pedantic
# warns beyond that, so longer strings become byte lists.
MAX_STRING_LITERAL = 4000
# Longest identifier `c_identifier` returns (C99 guarantees 63 significant
# characters for internal identifiers).
MAX_IDENTIFIER = 63
# Longest function name used verbatim in a symbol; longer ones are mangled.
MAX_SYMBOL_NAME = 200
# Longest comment text `c_comment` returns.
MAX_COMMENT = 120

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PLAIN_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_NOT_IDENT_CHAR = re.compile(r"[^A-Za-z0-9_]")
# Characters kept in comments: no `*` (so neither `*/` nor `/*` can form), no `\`
# (no line splice), no `?` (no trigraph), nothing outside printable ASCII.
_COMMENT_SAFE = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 _.,:;=+-[]()<>!#%&|~'{}^@$/")
# The mangled-name marker: entries of mangled names start with `{prefix}_x`.
_MANGLED = "_x"
_HASH_CHARS = 16


def html_text(text: object) -> str:
    """`text` for HTML element content or a double-quoted attribute: `& < > " '` escaped."""
    import html  # lazy: its entity table costs 5 ms of every start, pages are rare

    return html.escape(str(text), quote=True)


def utf8(text: str) -> bytes:
    """`text` as UTF-8; a lone surrogate (possible in a Python str) is kept as its bytes."""
    return text.encode("utf-8", "surrogatepass")


def digest(text: str, chars: int = _HASH_CHARS) -> str:
    """A stable lowercase hex digest of `text` (SHA-256, first `chars` digits)."""
    return hashlib.sha256(utf8(text)).hexdigest()[:chars]


def int64_literal(value: int) -> str:
    """An `int64_t` value as C text: a plain literal when it fits an `int`, else
    `INT64_C(...)`; the two extremes by name (`-9223372036854775808` is not a literal)."""
    value = int(value)
    if not -(1 << 63) <= value < (1 << 63):
        raise CompileError(f"{value} does not fit int64_t")
    if value == -(1 << 63):
        return "INT64_MIN"
    if value == (1 << 63) - 1:
        return "INT64_MAX"
    return str(value) if -(1 << 31) < value < (1 << 31) else f"INT64_C({value})"


def c_string_literal(text: str) -> str:
    """`text` (as UTF-8) as one C string literal, with every needed escape.

    Only printable ASCII other than `"`, `\\` and `?` is written as itself;
    every other byte (newline, NUL, non-ASCII) is a three-digit octal escape
    (a hex escape would swallow a following hex digit; `?` is escaped so no
    trigraph can form). The caller keeps the text under MAX_STRING_LITERAL
    bytes or uses `c_char_array`.
    """
    out = ['"']
    for byte in utf8(text):
        ch = chr(byte)
        if ch in '"\\?':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif 0x20 <= byte < 0x7F:
            out.append(ch)
        else:
            out.append(f"\\{byte:03o}")
    out.append('"')
    return "".join(out)


def c_char_array(text: str, *, width: int = 80) -> list[str]:
    """Lines of the initializer of `static const char x[] = <lines>;` holding `text`.

    A string literal (split into chunks of `width` characters) while the UTF-8
    text fits in MAX_STRING_LITERAL bytes, else a brace list of octal character
    constants ending in `'\\000'` (a long name must not make `-pedantic` warn). The C array
    then holds exactly the UTF-8 bytes of `text` and a terminating NUL.
    """
    data = utf8(text)
    if len(data) <= MAX_STRING_LITERAL:
        chunks = [text[i:i + width] for i in range(0, len(text), width)] or [""]
        return [c_string_literal(chunk) for chunk in chunks]
    # Octal character constants: a `char` may be signed, and 240 would not fit it.
    values = [f"'\\{b:03o}'" for b in (*data, 0)]
    lines = [", ".join(values[i:i + 12]) for i in range(0, len(values), 12)]
    return ["{", *(f"  {line}," for line in lines), "}"]


def c_comment(text: str, *, limit: int = MAX_COMMENT) -> str:
    """`text` made safe inside a C block comment, at most `limit` characters.

    Every character outside a fixed printable-ASCII set (see `_COMMENT_SAFE`)
    becomes `_`, and long text is cut with `...` (which is not a trigraph).
    """
    safe = "".join(c if c in _COMMENT_SAFE else "_" for c in text)
    if len(safe) > limit:
        safe = safe[:max(limit - 3, 0)] + "..."
    return safe


def c_identifier(hint: str, *, limit: int = MAX_IDENTIFIER) -> str:
    """An ASCII identifier made from a name hint: valid in C and as an LLVM value name.

    Characters other than ASCII letters, digits and `_` become `_`; a name not
    starting with a letter gets a `v` (or `v_`) in front; one longer than
    `limit` is cut and ends in `_` and 8 hex digits of the full hint's hash, so
    distinct long hints stay distinct. Not injective on short hints: callers
    that need unique names (kiln.codegen.cfamily.printer.NameScope) number them.
    """
    name = _NOT_IDENT_CHAR.sub("_", hint) or "v"
    if not name[0].isalpha():
        name = ("v" if name[0] == "_" else "v_") + name
    if len(name) > limit:
        name = name[:limit - 9] + "_" + digest(hint, 8)
    return name


def is_c_identifier(name: object) -> bool:
    """True if `name` is a str spelling an ASCII C identifier."""
    return isinstance(name, str) and _IDENT.fullmatch(name) is not None


def symbol_name(name: str) -> str:
    """The part of a library symbol that stands for function `name` (docs/abi.md).

    A plain ASCII name (a letter, then letters, digits and `_`) of at most
    MAX_SYMBOL_NAME characters is used as is: `main` -> `kiln_main`. Any other
    name (non-ASCII, very long) becomes `_x` + 16 hex digits of its SHA-256 +
    `_` + a readable ASCII hint: stable, and distinct from every verbatim name
    (those never start with `_`), so entries stay collision-free.
    """
    if len(name) <= MAX_SYMBOL_NAME and _PLAIN_NAME.fullmatch(name):
        return name
    hint = _NOT_IDENT_CHAR.sub("_", name)[:32].rstrip("_")
    return f"{_MANGLED}{digest(name)}_{hint}" if hint else f"{_MANGLED}{digest(name)}"


__all__ = [
    "MAX_COMMENT",
    "MAX_IDENTIFIER",
    "MAX_STRING_LITERAL",
    "MAX_SYMBOL_NAME",
    "c_char_array",
    "c_comment",
    "c_identifier",
    "c_string_literal",
    "digest",
    "int64_literal",
    "is_c_identifier",
    "symbol_name",
    "utf8",
]
