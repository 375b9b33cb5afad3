"""onnxruntime's public names that kiln does not have, each with what to use instead.

A script written for onnxruntime that reaches one of these gets a KilnError
(UsageError) saying that kiln does not do it and what to do, never an AttributeError:
`kiln.__getattr__` and `kiln.session.__getattr__` ask `missing(None, name)`, the
session classes' `__getattr__` ask `missing("InferenceSession", name)` and so on.
The module names are those of `dir(onnxruntime)` (1.32) that kiln does not define;
tests/session/test_ort_names.py checks that every public name of the installed
onnxruntime is either defined by kiln or listed here.
"""

from __future__ import annotations

from kiln.errors import UsageError

_PROVIDERS = ("kiln runs on the CPU it compiled for; there are no execution provider "
              "libraries or devices to choose (GPU libraries: kiln.compile(model, 'cuda "
              "-arch=sm_XY'), docs/gpu.md)")
_MEMORY = ("kiln allocates with the library's own planned workspace; there are no "
           "allocators or memory infos to configure (docs/runtime.md)")
_EPCONTEXT = "kiln has no execution-provider context models: its compiled library is that"
_COMPILE = ("kiln compiles ahead of time: kiln.compile(model, target).export_library('m.so') "
            "(or `kiln compile model.onnx -o m.so`), then InferenceSession('m.so')")
_SPARSE = "kiln has dense tensors only; pass a numpy array (sparse.toarray())"
_LORA = "kiln has no LoRA adapters: merge the adapter into the ONNX weights and compile that"
_VERSION = "kiln is not onnxruntime; kiln.__version__ is kiln's version"

# onnxruntime module-level name -> what kiln says instead.
MODULE: dict[str, str] = {
    "AdapterFormat": _LORA, "LoraAdapter": _LORA,
    "ModelCompiler": _COMPILE, "OrtCompileApiFlags": _COMPILE,
    "ModelPackage": _COMPILE, "ModelPackageComponentContext": _COMPILE,
    "ModelPackageContext": _COMPILE, "ModelPackageOptions": _COMPILE,
    "ModelPackageWriteMode": _COMPILE,
    "OrtAllocatorType": _MEMORY, "OrtArenaCfg": _MEMORY, "OrtDeviceMemoryType": _MEMORY,
    "OrtMemType": _MEMORY, "OrtMemoryInfo": _MEMORY, "OrtMemoryInfoDeviceType": _MEMORY,
    "create_and_register_allocator": _MEMORY, "create_and_register_allocator_v2": _MEMORY,
    "OrtDevice": _PROVIDERS, "OrtDeviceVendorId": _PROVIDERS, "OrtEpDevice": _PROVIDERS,
    "OrtHardwareDevice": _PROVIDERS, "OrtHardwareDeviceType": _PROVIDERS,
    "OrtExecutionProviderDevicePolicy": _PROVIDERS, "get_ep_devices": _PROVIDERS,
    "register_execution_provider_library": _PROVIDERS,
    "unregister_execution_provider_library": _PROVIDERS, "preload_dlls": _PROVIDERS,
    "OrtSyncStream": _PROVIDERS, "copy_tensors": "kiln's values are numpy arrays: copy them "
                                                 "with numpy (np.copyto)",
    "cuda_version": _PROVIDERS, "has_collective_ops": "kiln has no collective ops",
    "OrtEpAssignedNode": _PROVIDERS, "OrtEpAssignedSubgraph": _PROVIDERS,
    "OrtEpContextData": _EPCONTEXT, "OrtEpContextDataBuffer": _EPCONTEXT,
    "OrtExternalInitializerInfo": "kiln compiles the weights into the library; external data "
                                  "is read when the ONNX file is compiled",
    "OrtSparseFormat": _SPARSE, "SparseTensor": _SPARSE,
    "SessionIOBinding": "use session.io_binding() (kiln.IOBinding)",
    "capi": "kiln has no onnxruntime C API binding; its C API is kiln.h (docs/abi.md)",
    # onnxruntime's subpackages: attributes of the module once something imported them
    "backend": "kiln has no ONNX backend-test adapter: compile with kiln.compile or open a "
               "kiln.InferenceSession",
    "datasets": "kiln ships no sample models: tests build theirs with onnx.helper",
    "quantization": "quantize with onnxruntime.quantization (kiln compiles its output: "
                    "QDQ, QOperator, quantize_dynamic, MatMulNBits)",
    "tools": "use onnxruntime.tools with onnxruntime; kiln's own tools are its CLI (docs/cli.md)",
    "transformers": "optimize with onnxruntime.transformers (kiln imports the standard ops; "
                    "see docs/ops.md for the contrib ops it takes)",
    "import_capi_exception": "kiln raises kiln.KilnError subclasses (kiln.errors)",
    "onnxruntime_validation": "kiln checks its libraries when it loads them",
    "get_build_info": _VERSION, "get_version_string": _VERSION, "version": _VERSION,
    "package_name": _VERSION,
    "print_debug_info": "kiln prints its build with `kiln inspect m.so` and the host's CPU "
                        "with `kiln targets`",
    "set_default_logger_callback": "kiln does not log runs; warnings go through Python's "
                                   "warnings module, compile progress to the 'kiln' logger",
    "set_seed": "kiln's compiled models have no random ops to seed",
}

_SESSION_ONLY = {
    "set_providers": "kiln's session runs on the CPU it was compiled for; make a new session",
    "disable_fallback": "kiln's session has one provider: nothing to fall back from",
    "enable_fallback": "kiln's session has one provider: nothing to fall back from",
    "run_async": "call run() on a thread (concurrent.futures); kiln's run releases the GIL",
    "get_tuning_results": "kiln's tuning is `kiln tune` (a JSON database, docs/tuning.md)",
    "set_tuning_results": "kiln's tuning is `kiln tune` (a JSON database, docs/tuning.md)",
    "get_input_memory_infos": _MEMORY, "get_output_memory_infos": _MEMORY,
    "get_input_epdevices": _PROVIDERS, "get_provider_graph_assignment_info": _PROVIDERS,
    "set_ep_dynamic_options": _PROVIDERS,
    "release_captured_graph": "kiln has no captured graphs (CUDA graphs)",
    "run_with_ortvaluevector": "use run_with_ort_values(output_names, {name: OrtValue})",
    "create_ortvalue_from_shape_and_type": "use OrtValue.ortvalue_from_shape_and_type(shape, "
                                           "dtype)",
}
_OPTIONS_ONLY = {
    "add_external_initializers": "kiln compiles the weights into the library: put them in "
                                 "the ONNX model",
    "add_external_initializers_from_files_in_memory": "kiln compiles the weights into the "
                                                      "library: put them in the ONNX model",
    "add_initializer": "kiln compiles the weights into the library: put them in the ONNX model",
    "add_provider": _PROVIDERS, "add_provider_for_devices": _PROVIDERS,
    "set_provider_selection_policy": _PROVIDERS,
    "set_provider_selection_policy_delegate": _PROVIDERS,
    "set_ep_context_data_read_func": _EPCONTEXT, "clear_ep_context_data_read_func": _EPCONTEXT,
    "register_custom_ops_library": "kiln has no custom-op libraries: add the operator to kiln "
                                   "(docs/ops.md, 'add an operator')",
    "set_load_cancellation_flag": "a kiln compile cannot be cancelled; stop a run with "
                                  "RunOptions.terminate",
    "add_free_dimension_override_by_denotation": "pin a dimension by its name with "
                                                 "SessionOptions.shape_dict",
}
_VALUE_ONLY = {
    "as_sparse_tensor": _SPARSE, "is_sparse_tensor": _SPARSE,
    "ort_value_from_sparse_tensor": _SPARSE,
    "ortvalue_from_numpy_with_onnx_type": "kiln's OrtValue holds numpy dtypes: "
                                          "OrtValue.ortvalue_from_numpy(array)",
    "is_tensor_sequence": "kiln's models take and return tensors only",
}
_BINDING_ONLY = {
    "get_outputs_as_ortvaluevector": "use get_outputs(), a list of OrtValues",
}
_RUN_ONLY = {
    "add_active_adapter": _LORA,
}

# class name -> its onnxruntime methods and attributes that kiln's class does not have.
CLASSES: dict[str, dict[str, str]] = {
    "InferenceSession": _SESSION_ONLY, "SessionOptions": _OPTIONS_ONLY,
    "OrtValue": _VALUE_ONLY, "IOBinding": _BINDING_ONLY, "RunOptions": _RUN_ONLY,
}


def missing(owner: str | None, name: str) -> Exception:
    """The exception for `owner.name` (owner None: the module): a UsageError saying
    that kiln does not do it and what to use for an onnxruntime name, else the plain
    AttributeError Python raises."""
    table = MODULE if owner is None else CLASSES.get(owner, {})
    where = "onnxruntime" if owner is None else f"onnxruntime.{owner}"
    if name in table:
        return UsageError(f"{where}.{name}: kiln does not have it; {table[name]}")
    label = "module 'kiln'" if owner is None else f"'{owner}' object"
    return AttributeError(f"{label} has no attribute {name!r}")


__all__ = ["CLASSES", "MODULE", "missing"]
