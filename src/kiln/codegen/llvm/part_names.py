"""Parts named by their content: a kernel compiled once serves every model that has it.

Two models number the same kernel differently (`fused_conv2d_nchwc_relu_3` in one,
`fused_conv2d_nchwc_relu_7` in another, with the same body). A part that calls no
other part's functions (a kernel with its loop bodies; kiln.codegen.llvm.split) is
therefore parsed by LLVM, the functions it defines renamed `__kiln_part_<i>_` in the
part's order through LLVM's API, and printed by LLVM again: the kernel cache keys the
part by that text, into which no model's names enter (LLVM's printer also numbers
metadata and attribute groups anew), and the part is compiled under names made from
the key (`content_name`). Its object, bitcode and declarations are then the same for
every model that has the kernel.

The model's names come back where something calls them: the joined kernels.o gives
each of the part's visible functions the model's name as an alias (`ld -r --defsym`,
kiln.codegen.llvm.parts.join_objects), which host.c's entries and the graph
function's part call; the declarations that part is compiled with, and the functions
of kernels.bc, are renamed through LLVM's API. Nothing is renamed in text: every
name changes on a parsed module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kiln.codegen.llvm.target_machine import llvm_binding, parse_and_verify

PLACEHOLDER = "__kiln_part_{}_"
_HIDDEN_LINKAGE = ("internal", "private")


def content_name(key: str, index: int) -> str:
    """The symbol of function `index` (in the part's order) of the part keyed `key`."""
    return f"kiln_part_{key[:24]}_{index}"


def links_aliases(triple: str) -> bool:
    """Whether objects for `triple` are ELF, whose `ld -r --defsym` gives the aliases."""
    return not any(os_name in triple for os_name in ("darwin", "apple", "windows", "wasm"))


@dataclass
class ContentNamed:
    """A part parsed and renamed to its content names."""

    key: str  # the kernel cache's key (its text under placeholder names)
    module: Any  # the llvmlite ModuleRef, its functions under content names
    names: dict[str, str]  # content name -> the model's name, every function it defines
    aliases: dict[str, str]  # the model's name -> content name, functions others call

    def text(self) -> str:
        """The LLVM IR a miss compiles."""
        return str(self.module)


def content_named(text: str, functions: Sequence[str], key_of: Callable[[str], str],
                  taken: set[str]) -> ContentNamed:
    """`text`, a part defining `functions` and calling no other part's, keyed and named by
    its content; `taken`: the keys of this module's parts so far (a kernel twice in one
    module gets a key and names per copy)."""
    llvm = llvm_binding()
    module = parse_and_verify(text, context=llvm.create_context())
    defined = [module.get_function(name) for name in functions]
    for i, fn in enumerate(defined):
        fn.name = PLACEHOLDER.format(i)
    canonical = str(module)
    key = key_of(canonical)
    copy = 1
    while key in taken:
        key = key_of(f"{canonical}\n; copy {copy}")
        copy += 1
    taken.add(key)
    names, aliases = {}, {}
    for i, (fn, model_name) in enumerate(zip(defined, functions)):
        fn.name = content_name(key, i)
        names[fn.name] = model_name
        if fn.linkage.name not in _HIDDEN_LINKAGE:
            aliases[model_name] = fn.name
    return ContentNamed(key, module, names, aliases)


def declaration_lines(module: Any, defined: bool = True) -> str:
    """`name\\0declare ...` lines of `module`'s visible functions, definitions (or, with
    `defined` false, declarations), attribute groups written inline: each line parses
    on its own, with what LLVM inferred of the function."""
    text = str(module)
    groups = {}
    for line in text.splitlines():
        if line.startswith("attributes #") and line.endswith(" }"):
            number, _, body = line.removeprefix("attributes #").partition(" = { ")
            groups[number] = body.removesuffix(" }")
    head_word = "define" if defined else "declare"
    lines = []
    for fn in module.functions:
        if fn.is_declaration == defined or fn.linkage.name in _HIDDEN_LINKAGE:
            continue
        head = next(line for line in str(fn).splitlines() if line.startswith(head_word))
        head = head.removesuffix("{").rstrip()
        # `#3` names an attribute group: written out, the line stands on its own
        head = " ".join(groups.get(t[1:], t) if t.startswith("#") else t
                        for t in head.split(" "))
        lines.append(f"{fn.name}\0declare" + head.removeprefix(head_word))
    return "\n".join(lines)


def model_declarations(declarations: str, names: Mapping[str, str]) -> str:
    """A content-named part's declarations (`declaration_lines`) under the model's names
    (`names`: content name -> model name): parsed, renamed and printed by LLVM."""
    if not declarations:
        return declarations
    llvm = llvm_binding()
    module = parse_and_verify("\n".join(line.split("\0", 1)[1]
                                        for line in declarations.splitlines()),
                              "a cached kernel's declarations", llvm.create_context())
    for fn in module.functions:
        fn.name = names.get(fn.name, fn.name)
    return declaration_lines(module, defined=False)


def rename_functions(module: Any, names: Mapping[str, str]) -> None:
    """Rename the functions of the llvmlite ModuleRef `module` named in `names`."""
    for fn in module.functions:
        if fn.name in names:
            fn.name = names[fn.name]


__all__ = ["PLACEHOLDER", "ContentNamed", "content_name", "content_named", "declaration_lines",
           "links_aliases", "model_declarations", "rename_functions"]
