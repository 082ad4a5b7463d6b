"""aotkit_frontends: aot_function, aot_module, the export APIs and the torch.compile backend.

The user-facing entry points and their argument handling; the tracing core they share is
``aotkit_capture``, whose public errors and compilation-context queries are re-exported here.
"""

from aotkit_capture import AOTCompileError as AOTCompileError
from aotkit_capture import AOTExportError as AOTExportError
from aotkit_capture import CompiledArtifacts as CompiledArtifacts
from aotkit_capture import GeneratorCreatedInTraceError as GeneratorCreatedInTraceError
from aotkit_capture import SavedTensorHookContext as SavedTensorHookContext
from aotkit_capture import get_aot_compilation_context as get_aot_compilation_context
from aotkit_capture import get_aot_graph_name as get_aot_graph_name
from aotkit_capture import get_graph_being_compiled as get_graph_being_compiled
from aotkit_capture import get_saved_tensor_hook_context as get_saved_tensor_hook_context

from aotkit_frontends.module_state._attribute_guard import (
    TensorAttributeAssignedError as TensorAttributeAssignedError,
)

from ._aot_function import AOTModule as AOTModule
from ._aot_function import CompiledCache as CompiledCache
from ._aot_function import aot_function as aot_function
from ._aot_function import aot_module as aot_module
from ._aot_function import compiled_function as compiled_function
from ._aot_function import compiled_module as compiled_module
from ._dynamo_backend import AotAutograd as AotAutograd
from ._dynamo_backend import aot_autograd as aot_autograd
from ._dynamo_backend import default_decompositions as default_decompositions
from ._dynamo_backend import device_from_inputs as device_from_inputs
from ._dynamo_backend import dtype_from_inputs as dtype_from_inputs
from ._dynamo_backend import fake_tensor_unsupported as fake_tensor_unsupported
from ._dynamo_backend import mem_efficient_fusion_kwargs as mem_efficient_fusion_kwargs
from ._dynamo_backend import register_dynamo_backends as register_dynamo_backends
from ._export import aot_export_joint_simple as aot_export_joint_simple
from ._export import aot_export_module as aot_export_module
from ._joint_descriptors import JointDescriptorError as JointDescriptorError
from ._joint_descriptors import JointWithDescriptors as JointWithDescriptors
from ._joint_descriptors import (
    aot_compile_joint_with_descriptors as aot_compile_joint_with_descriptors,
)
from ._joint_descriptors import (
    aot_export_joint_with_descriptors as aot_export_joint_with_descriptors,
)
from ._outputs import UnsupportedOutputError as UnsupportedOutputError
from ._simplified import aot_module_simplified as aot_module_simplified

__all__ = [
    "JointDescriptorError",
    "JointWithDescriptors",
    "aot_compile_joint_with_descriptors",
    "aot_export_joint_with_descriptors",
    "AOTCompileError",
    "AOTExportError",
    "AOTModule",
    "AotAutograd",
    "CompiledArtifacts",
    "CompiledCache",
    "GeneratorCreatedInTraceError",
    "SavedTensorHookContext",
    "TensorAttributeAssignedError",
    "UnsupportedOutputError",
    "aot_autograd",
    "aot_export_joint_simple",
    "aot_export_module",
    "aot_function",
    "aot_module",
    "aot_module_simplified",
    "compiled_function",
    "compiled_module",
    "default_decompositions",
    "device_from_inputs",
    "dtype_from_inputs",
    "fake_tensor_unsupported",
    "get_aot_compilation_context",
    "get_aot_graph_name",
    "get_graph_being_compiled",
    "get_saved_tensor_hook_context",
    "mem_efficient_fusion_kwargs",
    "register_dynamo_backends",
]
