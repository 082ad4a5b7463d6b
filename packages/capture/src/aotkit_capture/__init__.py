"""aotkit_capture: the compile pipeline, from a flat function and its flat inputs to
compiled graphs and a runner.

``compile_flat`` runs the steps of docs/architecture.md: input layout, fakification,
metadata, the traces (``aotkit_tracing``), partitioning, the compilers, the runtime
wrapping and shape guards; a compile cache plugs in through ``aotkit_schemas.CompileCache``
(See Note [The compile cache seam]). Also the export traces, and the pieces a compile
cache's restore shares with a fresh compilation (``training_call``, ``inference_call``,
``finish_compilation``, ...). The user-facing entry points live in ``aotkit_frontends``;
the names of ``aotkit_tracing``'s traces are re-exported here.
"""

from aotkit_tracing import (
    BACKWARD_INPUT_METADATA_MUTATION as BACKWARD_INPUT_METADATA_MUTATION,
)
from aotkit_tracing import (
    BACKWARD_TANGENT_METADATA_MUTATION as BACKWARD_TANGENT_METADATA_MUTATION,
)
from aotkit_tracing import COMPILATIONS_IN_PROGRESS as COMPILATIONS_IN_PROGRESS
from aotkit_tracing import AOTCompileError as AOTCompileError
from aotkit_tracing import FlatFn as FlatFn
from aotkit_tracing import GeneratorStateError as GeneratorStateError
from aotkit_tracing import InputRebindError as InputRebindError
from aotkit_tracing import NotSinglePass as NotSinglePass
from aotkit_tracing import (
    UnsupportedHigherOrderOperatorError as UnsupportedHigherOrderOperatorError,
)
from aotkit_tracing import backward_spanning_scope as backward_spanning_scope
from aotkit_tracing import call_preserving_node_meta as call_preserving_node_meta
from aotkit_tracing import entered_until_backward_traced as entered_until_backward_traced
from aotkit_tracing import explain_tracing_errors as explain_tracing_errors
from aotkit_tracing import inside_a_trace as inside_a_trace
from aotkit_tracing import trace_inference as trace_inference
from aotkit_tracing import trace_joint as trace_joint
from aotkit_tracing import trace_single_pass as trace_single_pass

from ._pipeline import PipelineCache as PipelineCache
from ._pipeline import compile_flat as compile_flat
from ._saved_tensor_hooks import SavedTensorHookContext as SavedTensorHookContext
from ._saved_tensor_hooks import (
    get_saved_tensor_hook_context as get_saved_tensor_hook_context,
)
from ._saved_tensor_hooks import saved_tensors_hooks_key as saved_tensors_hooks_key
from .compile._compile import CompiledArtifacts as CompiledArtifacts
from .compile._compile import Runner as Runner
from .compile._compile import _fakify as fakify_compiled_inputs
from .compile._compile import finish as finish_compilation
from .compile._compile_lock import COMPILE_LOCK as COMPILE_LOCK
from .compile._compiled_calls import compiling_under_fakes as compiling_under_fakes
from .compile._compiled_calls import inference_call as inference_call
from .compile._compiled_calls import training_call as training_call
from .compile._context import get_aot_compilation_context as get_aot_compilation_context
from .compile._context import get_aot_graph_name as get_aot_graph_name
from .compile._context import get_graph_being_compiled as get_graph_being_compiled
from .compile._context import set_model_name as set_model_name
from .compile._context import track_graph_compiling as track_graph_compiling
from .compile._descriptors import graph_descriptors as graph_descriptors
from .compile._examples import DeferredExamples as DeferredExamples
from .compile._examples import LazyFakes as LazyFakes
from .compile._gc import CollectionPause as CollectionPause
from .compile._logs import log_restored_partition as log_restored_partition
from .compile._paths import notify_compiled as notify_compiled
from .compile._paths import record_compilations as record_compilations
from .compile._paths import refuse_single_pass as refuse_single_pass
from .compile._shape_guards import ShapeGuard as ShapeGuard
from .export._export_trace import AOTExportError as AOTExportError
from .export._export_trace import TracedGraphs as TracedGraphs
from .export._export_trace import retrace_flat as retrace_flat
from .export._export_trace import trace_for_export as trace_for_export
from .inputs._ambient import AMBIENT_FIELDS as AMBIENT_FIELDS
from .inputs._ambient import ambient_key as ambient_key
from .inputs._captured_tensors import CapturedTensorError as CapturedTensorError
from .inputs._captured_tensors import captured_tensor_error as captured_tensor_error
from .inputs._captured_tensors import is_captured_tensor_error as is_captured_tensor_error
from .inputs._fakify import construct_fake_mode as construct_fake_mode
from .inputs._fakify import fakify_inputs as fakify_inputs
from .inputs._generators import GENERATOR_CREATED_MESSAGE as GENERATOR_CREATED_MESSAGE
from .inputs._generators import GeneratorCreatedInTraceError as GeneratorCreatedInTraceError
from .inputs._input_kinds import VALUE_KINDS as VALUE_KINDS
from .inputs._input_kinds import UnsupportedInputError as UnsupportedInputError
from .inputs._input_kinds import check_input_kinds as check_input_kinds
from .inputs._input_kinds import is_opaque_constant as is_opaque_constant
from .inputs._requires_grad_changes import changes_from_json as changes_from_json
from .inputs._requires_grad_changes import flipping_runner as flipping_runner
from .inputs._requires_grad_changes import temporarily_flipped as temporarily_flipped
from .inputs._subclass_keys import SubclassKey as SubclassKey
from .inputs._subclass_keys import UnkeyableSubclassContextError as UnkeyableSubclassContextError
from .inputs._subclass_keys import subclass_key as subclass_key

__all__ = [
    "graph_descriptors",
    "COMPILE_LOCK",
    "GeneratorStateError",
    "SubclassKey",
    "UnkeyableSubclassContextError",
    "subclass_key",
    "COMPILATIONS_IN_PROGRESS",
    "inside_a_trace",
    "AMBIENT_FIELDS",
    "AOTCompileError",
    "AOTExportError",
    "BACKWARD_INPUT_METADATA_MUTATION",
    "BACKWARD_TANGENT_METADATA_MUTATION",
    "CapturedTensorError",
    "CollectionPause",
    "CompiledArtifacts",
    "DeferredExamples",
    "FlatFn",
    "GENERATOR_CREATED_MESSAGE",
    "GeneratorCreatedInTraceError",
    "InputRebindError",
    "LazyFakes",
    "NotSinglePass",
    "PipelineCache",
    "Runner",
    "SavedTensorHookContext",
    "ShapeGuard",
    "TracedGraphs",
    "UnsupportedHigherOrderOperatorError",
    "UnsupportedInputError",
    "SubclassKey",
    "UnkeyableSubclassContextError",
    "subclass_key",
    "VALUE_KINDS",
    "ambient_key",
    "backward_spanning_scope",
    "call_preserving_node_meta",
    "captured_tensor_error",
    "changes_from_json",
    "check_input_kinds",
    "compile_flat",
    "compiling_under_fakes",
    "construct_fake_mode",
    "entered_until_backward_traced",
    "inside_a_trace",
    "explain_tracing_errors",
    "fakify_compiled_inputs",
    "fakify_inputs",
    "finish_compilation",
    "flipping_runner",
    "get_aot_compilation_context",
    "get_aot_graph_name",
    "get_graph_being_compiled",
    "get_saved_tensor_hook_context",
    "inference_call",
    "is_captured_tensor_error",
    "is_opaque_constant",
    "log_restored_partition",
    "notify_compiled",
    "record_compilations",
    "refuse_single_pass",
    "retrace_flat",
    "saved_tensors_hooks_key",
    "set_model_name",
    "temporarily_flipped",
    "trace_for_export",
    "trace_inference",
    "trace_joint",
    "trace_single_pass",
    "track_graph_compiling",
    "training_call",
]
