"""Every public entry point given a file, bytes or option it cannot use raises a KilnError
subclass whose message names the input (docs/security.md; docs/session.md, "Errors").

The inputs are made here: bytes that are no model, a model cut at several points
(one of them right after its graph, which protobuf still parses), a kiln library
renamed `.onnx`, an ONNX file renamed `.so`, empty files, directories, missing paths,
and libraries cut short. Each entry point meets each input it cannot take, table by
table. Entry points that dlopen a library (`load_module`, `InferenceSession` over a
`.so`, `kiln run`) meet the damaged ones in child processes, where a crash is a
result, not the end of the test run.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import kiln
import kiln.mlf
from kiln.cli.main import main as kiln_cli
from kiln.errors import (
    ArgumentTypeError,
    CallError,
    ExportError,
    KilnError,
    UsageError,
)
from kiln.frontend import from_onnx
from kiln.runtime import load_module
from support.graphs import GraphBuilder
from support.processes import run_isolated

CPU = "CPUExecutionProvider"


def _model() -> onnx.ModelProto:
    """y[1, 4] = Relu(x[1, 8] @ W): static shapes, so a binding's shape can be wrong."""
    b = GraphBuilder()
    b.const(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32), name="W")
    b.node("MatMul", ["x", "W"], ["h"])
    b.node("Relu", ["h"], ["y"])
    b.input("x", [1, 8])
    b.output("y", [1, 4])
    return b.model(name="tiny")


def _graph_end(model: onnx.ModelProto) -> int:
    """The byte where the serialized model's graph ends: what follows (the opset
    imports) is cut off there, and the rest still parses as a ModelProto."""
    head = onnx.ModelProto()
    head.CopyFrom(model)
    del head.opset_import[:]
    cut = head.SerializeToString()
    assert model.SerializeToString().startswith(cut), "the opset imports are not last"
    return len(cut)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every hostile input by name, plus "model.onnx", "lib.so" and "lib.tar" (good)."""
    root = tmp_path_factory.mktemp("hostile")
    model = _model()
    data = model.SerializeToString()
    good = root / "model.onnx"
    good.write_bytes(data)
    ex = kiln.compile(good)
    library = ex.export_library(root / "lib.so")
    archive = ex.export_library(root / "lib.tar")
    lib_bytes, tar_bytes = library.read_bytes(), archive.read_bytes()
    made = {
        "junk.onnx": b"this is not a model\n" * 8 + b"\xff\xfe\x00",
        "empty.onnx": b"",
        "cut1.onnx": data[:1],
        "cut-quarter.onnx": data[:len(data) // 4],
        "cut-half.onnx": data[:len(data) // 2],
        "cut-last-byte.onnx": data[:-1],
        "cut-after-graph.onnx": data[:_graph_end(model)],
        "library.onnx": lib_bytes,
        "model.so": data,
        "empty.so": b"",
        "cut-header.so": lib_bytes[:40],
        "cut-half.so": lib_bytes[:len(lib_bytes) // 2],
        "cut-last-byte.so": lib_bytes[:-1],
        "junk.tar": b"junk" * 300,
        "cut-half.tar": tar_bytes[:len(tar_bytes) // 2],
    }
    paths = {"model.onnx": good, "lib.so": library, "lib.tar": archive}
    for name, content in made.items():
        paths[name] = root / name
        paths[name].write_bytes(content)
    for name in ("dir.onnx", "dir.so"):
        paths[name] = root / name
        paths[name].mkdir()
    for name in ("missing.onnx", "missing.so"):
        paths[name] = root / name
    return paths


GOOD = {"model.onnx", "lib.so", "lib.tar"}
HOSTILE = ["junk.onnx", "empty.onnx", "cut1.onnx", "cut-quarter.onnx", "cut-half.onnx",
           "cut-last-byte.onnx", "cut-after-graph.onnx", "library.onnx", "model.so",
           "empty.so", "cut-header.so", "cut-half.so", "cut-last-byte.so", "junk.tar",
           "cut-half.tar", "dir.onnx", "dir.so", "missing.onnx", "missing.so"]
# Inputs that open a library file with the dynamic loader: tried in child processes.
LOADED = [name for name in HOSTILE if name.endswith((".so", ".tar")) and
          not name.startswith(("dir", "missing"))]
FILES = [name for name in HOSTILE if not name.startswith(("dir", "missing"))]


def _cli(*argv: str) -> Callable[[], None]:
    """The `kiln` command as an entry point: it must fail with the documented exit code 2
    and one line `kiln VERB: error: ...`; that line is raised as a UsageError so the
    tables below check it like any other error."""
    def call() -> None:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = kiln_cli(list(argv))
        lines = err.getvalue().strip().splitlines()
        assert code == 2 and len(lines) == 1, (code, err.getvalue())
        assert lines[0].startswith(f"kiln {argv[0]}: error: "), lines
        raise UsageError(lines[0])
    return call


# entry point -> (call on a path, the inputs it can take: the table skips them)
ON_PATHS: dict[str, tuple[Callable[[Path], Any], set[str]]] = {
    "InferenceSession(path)": (lambda p: kiln.InferenceSession(p), set()),
    "from_onnx(path)": (from_onnx, {"model.so"}),  # an ONNX model, whatever its name
    "kiln.compile(path)": (lambda p: kiln.compile(p), {"model.so"}),
    "kiln.artifact.load": (kiln.artifact.load, {"library.onnx"}),  # a library, by content
    "kiln.mlf.load": (kiln.mlf.load, set()),
    "kiln compile": (lambda p: _cli("compile", str(p), "-o", str(p) + ".out.so")(),
                     {"model.so"}),
    "kiln inspect": (lambda p: _cli("inspect", str(p))(), set()),
}
PATH_CASES = [(entry, name) for entry, (_, takes) in ON_PATHS.items() for name in HOSTILE
              if name not in takes and not (entry.startswith("InferenceSession")
                                            and name in LOADED)]


@pytest.mark.parametrize("entry, name", PATH_CASES)
def test_a_path_it_cannot_use_is_a_kiln_error_naming_it(files: dict[str, Path], entry: str,
                                                       name: str) -> None:
    call = ON_PATHS[entry][0]
    with pytest.raises(KilnError) as caught:
        call(files[name])
    assert type(caught.value) is not KilnError, "raise the subclass that says what failed"
    assert name in str(caught.value), str(caught.value)


ON_BYTES: dict[str, Callable[[bytes], Any]] = {
    "InferenceSession(bytes)": kiln.InferenceSession,
    "from_onnx(bytes)": from_onnx,
}
BYTES_CASES = [(entry, name) for entry in ON_BYTES for name in FILES if name != "model.so"]


@pytest.mark.parametrize("entry, name", BYTES_CASES)
def test_bytes_that_are_no_model_are_a_frontend_error_saying_what_they_hold(
        files: dict[str, Path], entry: str, name: str) -> None:
    data = files[name].read_bytes()
    with pytest.raises(kiln.FrontendError, match=rf"these {len(data)} (model )?bytes"):
        ON_BYTES[entry](data)


def test_a_file_of_another_format_is_named_for_what_it_is(files: dict[str, Path]) -> None:
    with pytest.raises(kiln.FrontendError, match=r"library\.onnx' is not a readable ONNX "
                                                 r"model: it is an ELF file"):
        kiln.InferenceSession(files["library.onnx"])
    with pytest.raises(kiln.FrontendError, match=r"cut-after-graph\.onnx' hold an ONNX model "
                                                 r"of IR version \d+ without its opset "
                                                 r"imports: the file is truncated"):
        from_onnx(files["cut-after-graph.onnx"])
    with pytest.raises(kiln.FrontendError, match=r"empty\.onnx' hold no ONNX graph: it is "
                                                 r"empty"):
        kiln.InferenceSession(str(files["empty.onnx"]))


# A child tries each damaged library with every entry point that loads one and prints
# [path, [error class, is a KilnError subclass, message] per entry point].
LOADER = """
import contextlib, io, json, sys
import kiln
from kiln.cli.main import main as cli
from kiln.runtime import load_module

def outcome(call):
    try:
        call()
    except Exception as exc:
        kiln_error = isinstance(exc, kiln.KilnError) and type(exc) is not kiln.KilnError
        return [type(exc).__name__, kiln_error, str(exc)]
    return ["no error", False, ""]

def cli_run(path):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli(["run", path, "--fill", "zeros"])
    lines = err.getvalue().strip().splitlines()
    ok = code == 2 and len(lines) == 1 and lines[0].startswith("kiln run: error: ")
    return [f"exit {code}", ok, err.getvalue()]

item_s = float(sys.argv[1])
for path in sys.argv[2:]:
    watch(item_s)
    print(json.dumps([path, outcome(lambda: load_module(path)),
                      outcome(lambda: kiln.InferenceSession(path)), cli_run(path)]),
          flush=True)
    unwatch()
"""


def test_damaged_libraries_are_kiln_errors_in_every_loader(files: dict[str, Path]) -> None:
    items = [files[name] for name in LOADED]
    results = run_isolated(LOADER, [], items, batch=len(items), item_s=60, batch_s=300)
    wrong = []
    for name, path in zip(LOADED, items):
        outcomes = results[path]
        for entry, outcome in zip(("load_module", "InferenceSession", "kiln run"), outcomes):
            if not isinstance(outcome, list) or not outcome[1] or name not in outcome[2]:
                wrong.append(f"{entry}({name}): {outcome}")
    assert not wrong, "\n".join(wrong)


# ------------------------------------------------------------------ wrong option types

@pytest.fixture(scope="module")
def library(files: dict[str, Path]) -> Path:
    return files["lib.so"]


def _threads(name: str, value: Any) -> kiln.SessionOptions:
    opts = kiln.SessionOptions()
    setattr(opts, name, value)
    return opts


# (what, arguments of InferenceSession after the library, error class, message)
SESSION_OPTIONS: list[tuple[str, tuple[Any, ...], dict[str, Any], type, str]] = [
    ("a string for sess_options", ("fast",), {}, ArgumentTypeError,
     r"sess_options must be a kiln\.SessionOptions or None, got str 'fast'"),
    ("a string for providers", (), {"providers": CPU}, ArgumentTypeError,
     r"providers must be None or a list .* got str 'CPUExecutionProvider'"),
    ("an int for providers", (), {"providers": 5}, ArgumentTypeError, r"providers must be"),
    ("a set for providers", (), {"providers": {CPU}}, ArgumentTypeError, r"providers must be"),
    ("an int as a provider", (), {"providers": [5]}, ArgumentTypeError,
     r"each provider must be a name \(str\) or a \(name, options dict\) tuple, got int 5"),
    ("a 1-tuple as a provider", (), {"providers": [(CPU,)]}, ArgumentTypeError,
     r"each provider must be .* got tuple"),
    ("options that are no dict", (), {"providers": [(CPU, 5)]}, ArgumentTypeError,
     r"each provider must be .* got tuple"),
    ("an int for provider_options", (), {"provider_options": 5}, ArgumentTypeError,
     r"provider_options must be None or a list of dicts"),
    ("a dict for provider_options", (), {"provider_options": {}}, ArgumentTypeError,
     r"provider_options must be None or a list of dicts"),
    ("provider_options of another length", (None, [CPU], [{}, {}]), {}, UsageError,
     r"1 provider\(s\) but 2 provider_options dict\(s\)"),
    ("provider_options beside (name, options) tuples", (None, [(CPU, {})], [{}]), {},
     ArgumentTypeError, r"with provider_options, providers must be names"),
    ("a string thread count", (_threads("intra_op_num_threads", "2"),), {}, UsageError,
     r"SessionOptions\.intra_op_num_threads must be an integer >= 0, got '2'"),
    ("a negative inter-op thread count", (_threads("inter_op_num_threads", -1),), {},
     UsageError, r"SessionOptions\.inter_op_num_threads must be an integer >= 0, got -1"),
    ("an unknown keyword", (), {"fast_mode": True}, UsageError, r"unknown keyword\(s\) fast_mode"),
]


@pytest.mark.parametrize("args, kwargs, error, message",
                         [case[1:] for case in SESSION_OPTIONS],
                         ids=[case[0] for case in SESSION_OPTIONS])
def test_session_options_of_the_wrong_type_name_the_parameter(
        library: Path, args: tuple[Any, ...], kwargs: dict[str, Any], error: type,
        message: str) -> None:
    with pytest.raises(error, match=message):
        kiln.InferenceSession(library, *args, **kwargs)


def test_options_as_onnxruntime_takes_them_are_accepted(library: Path) -> None:
    opts = kiln.SessionOptions()
    opts.intra_op_num_threads = 1
    for args, kwargs in [((opts, [CPU], [{}]), {}), ((), {"providers": [(CPU, {})]}),
                         ((), {"providers": (CPU,), "provider_options": None})]:
        sess = kiln.InferenceSession(library, *args, **kwargs)
        assert [o.name for o in sess.get_outputs()] == ["y"]


@pytest.fixture(scope="module")
def executable(files: dict[str, Path]) -> kiln.Executable:
    return kiln.compile(files["model.onnx"])  # from the compile cache the fixture filled


# (what, the call, error class, message)
OTHER_ENTRIES: list[tuple[str, Callable[[dict[str, Path], Any], Any], type, str]] = [
    ("load_module(int)", lambda f, ex: load_module(5), ArgumentTypeError,
     r"load_module: path must be a str or os\.PathLike, got int"),
    ("load_module(prefix=int)", lambda f, ex: load_module(f["lib.so"], prefix=5),
     ArgumentTypeError, r"load_module: prefix must be a str or None, got int"),
    ("load_module(a name too long)", lambda f, ex: load_module("x" * 5000 + ".so"),
     kiln.MissingFileError, r"x{100}.*: no such library file"),
    ("kiln.artifact.load(int)", lambda f, ex: kiln.artifact.load(5), ArgumentTypeError,
     r"kiln\.artifact\.load: path must be a str or os\.PathLike, got int"),
    ("kiln.artifact.load(a NUL in the name)", lambda f, ex: kiln.artifact.load("a\x00b.so"),
     kiln.MissingFileError, r"'a\\x00b\.so': no such file"),
    ("kiln.mlf.load(int)", lambda f, ex: kiln.mlf.load(5), ArgumentTypeError,
     r"kiln\.mlf\.load: path must be a str or os\.PathLike, got int"),
    ("kiln.mlf.load(a NUL in the name)", lambda f, ex: kiln.mlf.load("a\x00b.tar"),
     kiln.MissingFileError, r"'a\\x00b\.tar': no such archive \(its name holds a NUL\)"),
    ("Module[int]", lambda f, ex: load_module(f["lib.so"])[0], ArgumentTypeError,
     r"functions are looked up by name \(str\), got int 0"),
    ("export_library(int)", lambda f, ex: ex.export_library(5), ArgumentTypeError,
     r"export_library: file_name must be a str or os\.PathLike, got int"),
    ("export_library(below a file)",
     lambda f, ex: ex.export_library(f["model.onnx"] / "lib.so"), ExportError,
     r"cannot write '.*model\.onnx/lib\.so': .*; export to a directory you can write"),
    ("kiln.compile(profile=str)", lambda f, ex: kiln.compile(f["model.onnx"], profile="yes"),
     ArgumentTypeError, r"profile must be True or False, got str"),
]


@pytest.mark.parametrize("call, error, message", [case[1:] for case in OTHER_ENTRIES],
                         ids=[case[0] for case in OTHER_ENTRIES])
def test_other_entry_points_name_the_argument_of_the_wrong_type(
        files: dict[str, Path], executable: kiln.Executable, call: Callable[..., Any],
        error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        call(files, executable)


# ------------------------------------------------------------------ io_binding

@pytest.fixture(scope="module")
def session(library: Path) -> kiln.InferenceSession:
    return kiln.InferenceSession(library)


X = np.ones((1, 8), np.float32)
Y = np.zeros((1, 4), np.float32)
# An address no process maps: above every user-space address space kiln runs in.
UNMAPPED = 1 << 62

# (what, the binding call on io, error class, message)
BINDINGS: list[tuple[str, Callable[[kiln.IOBinding], Any], type, str]] = [
    ("a negative dimension", lambda io: io.bind_input("x", "cpu", 0, np.float32, (1, -8),
                                                      X.ctypes.data),
     UsageError, r"'x': shape \[1, -8\] has -8; every dimension must be an int >= 0"),
    ("a fractional dimension", lambda io: io.bind_input("x", "cpu", 0, np.float32, (1, 8.5),
                                                        X.ctypes.data),
     UsageError, r"'x': shape .* has 8\.5"),
    ("a shape that is a string", lambda io: io.bind_input("x", "cpu", 0, np.float32, "18",
                                                          X.ctypes.data),
     ArgumentTypeError, r"'x': shape must be a list of ints, got str"),
    ("a shape that is an int", lambda io: io.bind_input("x", "cpu", 0, np.float32, 8,
                                                        X.ctypes.data),
     ArgumentTypeError, r"'x': shape must be a list of ints, got int"),
    ("a shape the model does not take", lambda io: io.bind_input("x", "cpu", 0, np.float32,
                                                                 (2, 8), X.ctypes.data),
     CallError, r"'x': shape \[2, 8\] does not fit the model's \[1, 8\]"),
    ("an unknown dtype", lambda io: io.bind_input("x", "cpu", 0, "flaot32", (1, 8),
                                                  X.ctypes.data),
     UsageError, r"'x': element_type 'flaot32' is not a numpy dtype"),
    ("another dtype", lambda io: io.bind_input("x", "cpu", 0, np.float64, (1, 8),
                                               X.ctypes.data),
     CallError, r"'x': element_type float64 does not match the model's tensor\(float\)"),
    ("an object dtype", lambda io: io.bind_input("x", "cpu", 0, object, (1, 8), X.ctypes.data),
     CallError, r"'x': element_type object does not match"),
    ("a NULL pointer", lambda io: io.bind_input("x", "cpu", 0, np.float32, (1, 8), 0),
     UsageError, r"'x': buffer_ptr is NULL"),
    ("a negative pointer", lambda io: io.bind_input("x", "cpu", 0, np.float32, (1, 8), -64),
     UsageError, r"'x': buffer_ptr -0x40 with 32 bytes is not an address range"),
    ("a pointer past the address space",
     lambda io: io.bind_input("x", "cpu", 0, np.float32, (1, 8), 1 << 70),
     UsageError, r"'x': buffer_ptr 0x400000000000000000 .* is not an address range"),
    ("a pointer in the first page",
     lambda io: io.bind_output("y", "cpu", 0, np.float32, (1, 4), 1234),
     UsageError, r"'y': buffer_ptr 0x4d2 with 16 bytes is not an address range"),
    ("a string pointer", lambda io: io.bind_input("x", "cpu", 0, np.float32, (1, 8), "0x10"),
     ArgumentTypeError, r"'x': buffer_ptr must be an address \(an int"),
    ("a bool pointer", lambda io: io.bind_input("x", "cpu", 0, np.float32, (1, 8), True),
     ArgumentTypeError, r"'x': buffer_ptr must be an address"),
    ("a device type that is no string",
     lambda io: io.bind_input("x", 5, 0, np.float32, (1, 8), X.ctypes.data),
     UsageError, r"'x': kiln binds CPU memory only, got device_type 5"),
    ("a negative device id",
     lambda io: io.bind_input("x", "cpu", -1, np.float32, (1, 8), X.ctypes.data),
     UsageError, r"'x': device_id must be an int >= 0"),
    ("a name that is no string",
     lambda io: io.bind_input(0, "cpu", 0, np.float32, (1, 8), X.ctypes.data),
     ArgumentTypeError, r"the name of an input to bind must be a str, got int 0"),
    ("an unknown input", lambda io: io.bind_input("z", "cpu", 0, np.float32, (1, 8),
                                                  X.ctypes.data),
     CallError, r"'z' is not an input of this model; its inputs: x"),
    ("an unknown cpu input", lambda io: io.bind_cpu_input("z", X),
     CallError, r"'z' is not an input of this model; its inputs: x"),
    ("a list as an output name", lambda io: io.bind_output(["y"]),
     ArgumentTypeError, r"the name of an output to bind must be a str, got list"),
    ("an output of a negative dimension",
     lambda io: io.bind_output("y", "cpu", 0, np.float32, (1, -4), Y.ctypes.data),
     UsageError, r"'y': shape \[1, -4\] has -4"),
    ("a list as an OrtValue", lambda io: io.bind_ortvalue_input("x", X.tolist()),
     ArgumentTypeError, r"'x': an input binds to a numpy array or a DLPack tensor, got list"),
    ("a read-only output array",
     lambda io: io.bind_ortvalue_output("y", np.frombuffer(bytes(16), np.float32)
                                        .reshape(1, 4)),
     ArgumentTypeError, r"'y': an output binds to a writable numpy array"),
    ("an unknown OrtValue output", lambda io: io.bind_ortvalue_output("z", Y.copy()),
     CallError, r"'z' is not an output of this model; its outputs: y"),
]
if sys.platform.startswith("linux"):  # mincore answers there
    BINDINGS.append(("an unmapped pointer",
                     lambda io: io.bind_input("x", "cpu", 0, np.float32, (1, 8), UNMAPPED),
                     UsageError, r"'x': the 32 bytes at buffer_ptr 0x4000000000000000 are "
                                 r"not all mapped memory"))


@pytest.mark.parametrize("bind, error, message", [case[1:] for case in BINDINGS],
                         ids=[case[0] for case in BINDINGS])
def test_io_binding_checks_what_it_binds(session: kiln.InferenceSession,
                                         bind: Callable[[kiln.IOBinding], Any], error: type,
                                         message: str) -> None:
    io_binding = session.io_binding()
    with pytest.raises(error, match=message):
        bind(io_binding)
    assert not io_binding.inputs and not io_binding.outputs, "a refused binding is not kept"


def test_runs_refuse_what_is_not_a_binding_or_a_name_list(
        session: kiln.InferenceSession) -> None:
    with pytest.raises(ArgumentTypeError, match=r"run_with_iobinding takes the IOBinding of "
                                                r"session\.io_binding\(\), got str 'x'"):
        session.run_with_iobinding("x")  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match=r"output_names must be a list of names or "
                                                r"None, got int 5"):
        session.run(5, {"x": X})  # type: ignore[arg-type]


def test_ortvalue_bindings_take_arrays_and_get_outputs_returns_them(
        session: kiln.InferenceSession) -> None:
    want = session.run(None, {"x": X})[0]
    io_binding = session.io_binding()
    io_binding.bind_ortvalue_input("x", X)
    out = np.full((1, 4), np.nan, np.float32)
    io_binding.bind_ortvalue_output("y", out)
    session.run_with_iobinding(io_binding)
    np.testing.assert_array_equal(out, want)
    (got,) = io_binding.get_outputs()
    assert got.numpy() is out  # an OrtValue over the array the run wrote, not a copy
    (copied,) = io_binding.copy_outputs_to_cpu()
    assert copied is not out and np.array_equal(copied, out)

