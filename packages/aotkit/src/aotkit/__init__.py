"""aotkit: ahead-of-time autograd for PyTorch.

The meta-package: it re-exports the public API of the aotkit packages and provides the
``aotkit`` command. ``torch.compile(backend="aotkit_eager")`` and ``"aotkit_inductor"``
work without importing it: dynamo finds them through entry points.
"""

import sys

from aotkit_backends import inductor_compiler as inductor_compiler
from aotkit_backends import make_boxed_compiler as make_boxed_compiler
from aotkit_backends import make_boxed_func as make_boxed_func
from aotkit_backends import nop as nop
from aotkit_backends import print_compiler as print_compiler
from aotkit_frontends import AOTCompileError as AOTCompileError
from aotkit_frontends import AOTExportError as AOTExportError
from aotkit_frontends import GeneratorCreatedInTraceError as GeneratorCreatedInTraceError
from aotkit_frontends import JointDescriptorError as JointDescriptorError
from aotkit_frontends import JointWithDescriptors as JointWithDescriptors
from aotkit_frontends import SavedTensorHookContext as SavedTensorHookContext
from aotkit_frontends import aot_autograd as aot_autograd
from aotkit_frontends import (
    aot_compile_joint_with_descriptors as aot_compile_joint_with_descriptors,
)
from aotkit_frontends import aot_export_joint_simple as aot_export_joint_simple
from aotkit_frontends import aot_export_joint_with_descriptors as aot_export_joint_with_descriptors
from aotkit_frontends import aot_export_module as aot_export_module
from aotkit_frontends import aot_function as aot_function
from aotkit_frontends import aot_module as aot_module
from aotkit_frontends import aot_module_simplified as aot_module_simplified
from aotkit_frontends import compiled_function as compiled_function
from aotkit_frontends import compiled_module as compiled_module
from aotkit_frontends import get_aot_compilation_context as get_aot_compilation_context
from aotkit_frontends import get_aot_graph_name as get_aot_graph_name
from aotkit_frontends import get_graph_being_compiled as get_graph_being_compiled
from aotkit_frontends import get_saved_tensor_hook_context as get_saved_tensor_hook_context
from aotkit_frontends import mem_efficient_fusion_kwargs as mem_efficient_fusion_kwargs
from aotkit_frontends import register_dynamo_backends as register_dynamo_backends
from aotkit_partitioners import available_partitioners as available_partitioners
from aotkit_partitioners import default_partition as default_partition
from aotkit_partitioners import get_partitioner as get_partitioner
from aotkit_partitioners import memory_budget_partition as memory_budget_partition
from aotkit_partitioners import (
    min_cut_rematerialization_partition as min_cut_rematerialization_partition,
)
from aotkit_partitioners import register_partitioner as register_partitioner
from aotkit_regions import dedup_regions as dedup_regions
from aotkit_regions import mark_repeated_blocks as mark_repeated_blocks
from aotkit_regions import set_dedup_regions as set_dedup_regions
from aotkit_regions import unmark_repeated_blocks as unmark_repeated_blocks
from aotkit_schemas import AOTConfig as AOTConfig
from aotkit_schemas import BackwardSignature as BackwardSignature
from aotkit_schemas import GraphSignature as GraphSignature
from aotkit_schemas import InputAliasInfo as InputAliasInfo
from aotkit_schemas import JointPassError as JointPassError
from aotkit_schemas import MutationType as MutationType
from aotkit_schemas import OutputAliasInfo as OutputAliasInfo
from aotkit_schemas import OutputType as OutputType
from aotkit_schemas import ViewAndMutationMeta as ViewAndMutationMeta
from aotkit_schemas import functionalize_rng as functionalize_rng
from aotkit_schemas import set_functionalize_rng as set_functionalize_rng

from ._compare import compare as compare
from ._inspect_print import inspect as inspect

__version__ = "0.1.0"

# dynamo finds aotkit's backends through entry points; register them at once only when
# dynamo is loaded already (it costs nothing then). See Note [Import cost].
if "torch._dynamo" in sys.modules:
    register_dynamo_backends()

__all__ = [
    "JointDescriptorError",
    "JointWithDescriptors",
    "aot_compile_joint_with_descriptors",
    "aot_export_joint_with_descriptors",
    "JointPassError",
    "dedup_regions",
    "mark_repeated_blocks",
    "set_dedup_regions",
    "unmark_repeated_blocks",
    "AOTCompileError",
    "AOTConfig",
    "AOTExportError",
    "BackwardSignature",
    "GeneratorCreatedInTraceError",
    "GraphSignature",
    "InputAliasInfo",
    "MutationType",
    "OutputAliasInfo",
    "OutputType",
    "SavedTensorHookContext",
    "ViewAndMutationMeta",
    "aot_autograd",
    "aot_export_joint_simple",
    "aot_export_module",
    "aot_function",
    "aot_module",
    "aot_module_simplified",
    "available_partitioners",
    "compare",
    "compiled_function",
    "compiled_module",
    "default_partition",
    "functionalize_rng",
    "get_aot_compilation_context",
    "get_aot_graph_name",
    "get_graph_being_compiled",
    "get_partitioner",
    "get_saved_tensor_hook_context",
    "inductor_compiler",
    "inspect",
    "make_boxed_compiler",
    "make_boxed_func",
    "mem_efficient_fusion_kwargs",
    "memory_budget_partition",
    "min_cut_rematerialization_partition",
    "nop",
    "print_compiler",
    "register_dynamo_backends",
    "register_partitioner",
    "set_functionalize_rng",
]
