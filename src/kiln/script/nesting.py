"""How deep a DSL text nests, measured without recursion before anything walks it.

Python's `ast.parse` and the DSL parser both recurse once per level of the
syntax tree, so a hand-written `a + b + c + ...` thousands of terms long would
exhaust Python's frames. `text_depth_bound` reads the tokens (an iterative scan)
for an upper bound of the tree's depth before `ast.parse` runs; `ast_depth`
measures the parsed tree exactly before the DSL parser walks it.
"""

from __future__ import annotations

import ast
import io
import keyword
import tokenize

# Tokens that end an operand list at their bracket level: the operands around
# them are siblings, so their depths do not add up.
_SEPARATORS = frozenset({",", ":", ";", "=", ":=", "->"})
_OPEN, _CLOSE = frozenset("([{"), frozenset(")]}")
_NOT_OPERATORS = frozenset({"True", "False", "None"})


def text_depth_bound(text: str) -> int:
    """An upper bound of the depth of the syntax tree of `text`: per logical line,
    the operators and keywords since the last separator at every open bracket level,
    plus a few levels per bracket and per indentation."""
    deepest = indent = 0
    stack = [0]
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            kind, s = tok.type, tok.string
            if kind == tokenize.INDENT:
                indent += 1
            elif kind == tokenize.DEDENT:
                indent -= 1
            elif kind == tokenize.NEWLINE:
                stack = [0]
            elif kind == tokenize.OP:
                if s in _OPEN:
                    stack[-1] += 1
                    stack.append(0)
                elif s in _CLOSE:
                    if len(stack) > 1:
                        stack.pop()
                elif s in _SEPARATORS or (s.endswith("=") and s not in ("==", "!=", "<=", ">=")):
                    stack[-1] = 0
                else:
                    stack[-1] += 1
            elif kind == tokenize.NAME and keyword.iskeyword(s) and s not in _NOT_OPERATORS:
                stack[-1] += 1
            elif kind == tokenize.STRING and "f" in s.split("'")[0].split('"')[0].lower():
                stack[-1] += len(s)  # an f-string's fields parse into expressions too
            deepest = max(deepest, 3 * indent + sum(stack) + 2 * len(stack))
    except (tokenize.TokenError, SyntaxError):
        pass  # ast.parse reports malformed text with a better message
    return deepest


def ast_depth(tree: ast.AST) -> int:
    """The depth of a Python syntax tree (a leaf is 1), walked without recursion."""
    deepest = 0
    stack = [(tree, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        stack.extend((c, d + 1) for c in ast.iter_child_nodes(node))
    return deepest
