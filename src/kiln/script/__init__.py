"""kiln.script: kiln IR as Python text, printed and parsed back exactly.

    from kiln.script import ir_module, T, G

    @ir_module
    class MyModule:
        @T.prim_func
        def add_one(X: T.Buffer((4,), "float32"), Y: T.Buffer((4,), "float32")):
            for i in T.serial(4):
                Y[i] = X[i] + T.float32(1)

        @G.function
        def main(x: G.Tensor((4,), "float32")) -> G.Tensor((4,), "float32"):
            y: G.Tensor((4,), "float32") = G.call_tensor(
                "add_one", [x], G.Tensor((4,), "float32"))
            return y

    text = print_module(MyModule)          # or MyModule.script()
    assert_structural_equal(from_source(text), MyModule)

`print_module` / `print_func` write the DSL; `from_source` parses it (with
`ast`, driving `kiln.ir.IRBuilder`); the decorators parse a class or function
from its source file. docs/ir.md describes the language.
"""

from kiln.ir.metadata import ScriptText, load_metadata, save_metadata
from kiln.ir.printer import print_func, print_module
from kiln.script.decorators import ir_module
from kiln.script.diagnostics import ScriptError
from kiln.script.namespace import G, I, T
from kiln.script.source import from_source

__all__ = [
    "G", "I", "ScriptError", "ScriptText", "T", "from_source", "ir_module", "load_metadata",
    "print_func", "print_module", "save_metadata",
]
