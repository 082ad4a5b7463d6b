"""aotkit_capture: from a flat function and its flat inputs to compiled graphs and a runner.

Fakification, the metadata and joint traces (single pass, two passes, native or Python
functionalization), saved-output detaches, forward/backward tags, shape guards, the
tracing-error translation, the compile pipeline (``compile_flat``) and the export traces.
The user-facing entry points that call it live in ``aotkit_frontends``.
"""

from ._ambient import AMBIENT_FIELDS as AMBIENT_FIELDS
from ._ambient import ambient_key as ambient_key
from ._backward_mutations import (
    BACKWARD_INPUT_METADATA_MUTATION as BACKWARD_INPUT_METADATA_MUTATION,
)
from ._backward_mutations import (
    BACKWARD_TANGENT_METADATA_MUTATION as BACKWARD_TANGENT_METADATA_MUTATION,
)
from ._captured_tensors import CapturedTensorError as CapturedTensorError
from ._captured_tensors import captured_tensor_error as captured_tensor_error
from ._captured_tensors import is_captured_tensor_error as is_captured_tensor_error
from ._compile import CompiledArtifacts as CompiledArtifacts
from ._compile import Runner as Runner
from ._compile_lock import COMPILE_LOCK as COMPILE_LOCK
from ._context import get_aot_compilation_context as get_aot_compilation_context
from ._context import get_aot_graph_name as get_aot_graph_name
from ._context import get_graph_being_compiled as get_graph_being_compiled
from ._context import set_model_name as set_model_name
from ._context import track_graph_compiling as track_graph_compiling
from ._disk_cache import cache_counters as cache_counters
from ._disk_cache import cache_dir as cache_dir
from ._disk_cache import clear_entries as clear_entries
from ._disk_cache import list_entries as list_entries
from ._disk_cache_compile import compile_flat as compile_flat
from ._disk_cache_entry import CacheSidecar as CacheSidecar
from ._disk_cache_key import Uncacheable as Uncacheable
from ._disk_cache_key import ambient_state_key as ambient_state_key
from ._disk_cache_key import program_fingerprint as program_fingerprint
from ._errors import AOTCompileError as AOTCompileError
from ._errors import explain_tracing_errors as explain_tracing_errors
from ._export_trace import AOTExportError as AOTExportError
from ._export_trace import TracedGraphs as TracedGraphs
from ._export_trace import retrace_flat as retrace_flat
from ._export_trace import trace_for_export as trace_for_export
from ._fakify import construct_fake_mode as construct_fake_mode
from ._fakify import fakify_inputs as fakify_inputs
from ._generators import GENERATOR_CREATED_MESSAGE as GENERATOR_CREATED_MESSAGE
from ._generators import GeneratorCreatedInTraceError as GeneratorCreatedInTraceError
from ._hops import UnsupportedHigherOrderOperatorError as UnsupportedHigherOrderOperatorError
from ._input_kinds import VALUE_KINDS as VALUE_KINDS
from ._input_kinds import UnsupportedInputError as UnsupportedInputError
from ._input_kinds import check_input_kinds as check_input_kinds
from ._input_kinds import is_opaque_constant as is_opaque_constant
from ._input_rebinds import InputRebindError as InputRebindError
from ._node_meta import call_preserving_node_meta as call_preserving_node_meta
from ._paths import record_compilations as record_compilations
from ._rng_replay import GeneratorStateError as GeneratorStateError
from ._saved_tensor_hooks import SavedTensorHookContext as SavedTensorHookContext
from ._saved_tensor_hooks import (
    get_saved_tensor_hook_context as get_saved_tensor_hook_context,
)
from ._shape_guards import ShapeGuard as ShapeGuard
from ._single_pass import NotSinglePass as NotSinglePass
from ._single_pass import trace_single_pass as trace_single_pass
from ._subclass_keys import SubclassKey as SubclassKey
from ._subclass_keys import UnkeyableSubclassContextError as UnkeyableSubclassContextError
from ._subclass_keys import subclass_key as subclass_key
from ._trace import FlatFn as FlatFn
from ._trace import trace_inference as trace_inference
from ._trace import trace_joint as trace_joint
from ._trace_scope import backward_spanning_scope as backward_spanning_scope
from ._trace_scope import entered_until_backward_traced as entered_until_backward_traced

__all__ = [
    "GeneratorStateError",
    "COMPILE_LOCK",
    "CacheSidecar",
    "Uncacheable",
    "AMBIENT_FIELDS",
    "ambient_key",
    "ambient_state_key",
    "cache_counters",
    "cache_dir",
    "clear_entries",
    "list_entries",
    "program_fingerprint",
    "BACKWARD_INPUT_METADATA_MUTATION",
    "BACKWARD_TANGENT_METADATA_MUTATION",
    "AOTCompileError",
    "AOTExportError",
    "CapturedTensorError",
    "CompiledArtifacts",
    "FlatFn",
    "GENERATOR_CREATED_MESSAGE",
    "GeneratorCreatedInTraceError",
    "InputRebindError",
    "NotSinglePass",
    "Runner",
    "ShapeGuard",
    "TracedGraphs",
    "UnsupportedHigherOrderOperatorError",
    "UnsupportedInputError",
    "SubclassKey",
    "UnkeyableSubclassContextError",
    "subclass_key",
    "VALUE_KINDS",
    "backward_spanning_scope",
    "call_preserving_node_meta",
    "captured_tensor_error",
    "check_input_kinds",
    "compile_flat",
    "construct_fake_mode",
    "entered_until_backward_traced",
    "explain_tracing_errors",
    "fakify_inputs",
    "get_aot_compilation_context",
    "get_aot_graph_name",
    "get_graph_being_compiled",
    "is_captured_tensor_error",
    "is_opaque_constant",
    "record_compilations",
    "retrace_flat",
    "set_model_name",
    "trace_for_export",
    "trace_inference",
    "trace_joint",
    "trace_single_pass",
    "track_graph_compiling",
    "SavedTensorHookContext",
    "get_saved_tensor_hook_context",
]
