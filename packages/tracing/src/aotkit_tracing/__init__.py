"""aotkit_tracing: the traces of a flat function over fake inputs.

The single pass (metadata and joint in one native trace), the joint and inference traces
(native or Python functionalization, or none), saved-output detaches, forward/backward
tags, and what the traces thread through: RNG replay keys, effect tokens, higher-order
operators, tensor subclasses (desugared), autocast and its cast cache, input rebinds and
``requires_grad`` changes, the tracing-error translation. The compile pipeline that calls
them is ``aotkit_capture.compile_flat``.
"""

from ._effects import count_backward_tokens as count_backward_tokens
from ._effects import token_inputs as token_inputs
from ._effects import with_backward_tokens as with_backward_tokens
from ._errors import AOTCompileError as AOTCompileError
from ._errors import explain_tracing_errors as explain_tracing_errors
from ._hops import UnsupportedHigherOrderOperatorError as UnsupportedHigherOrderOperatorError
from ._hops import check_no_effects_in_subgraphs as check_no_effects_in_subgraphs
from ._hops import effects_in_subgraph_error as effects_in_subgraph_error
from ._hops import retry_with_shape_env as retry_with_shape_env
from ._rng_replay import GeneratorStateError as GeneratorStateError
from ._rng_states import generator_state_kept as generator_state_kept
from ._subclass import SubclassLayer as SubclassLayer
from ._subclass import check_layer_applies as check_layer_applies
from ._subclass import needs_subclass_layer as needs_subclass_layer
from .autocast._autocast import autocast_at_compile as autocast_at_compile
from .autocast._autocast import backward_autocast_key as backward_autocast_key
from .autocast._autocast import preserved_autocast as preserved_autocast
from .autocast._autocast import run_without_autocast as run_without_autocast
from .autocast._autocast import without_autocast_compiling as without_autocast_compiling
from .core._backward_mutations import (
    BACKWARD_INPUT_METADATA_MUTATION as BACKWARD_INPUT_METADATA_MUTATION,
)
from .core._backward_mutations import BACKWARD_MUTATED_INPUTS_KEY as BACKWARD_MUTATED_INPUTS_KEY
from .core._backward_mutations import (
    BACKWARD_TANGENT_METADATA_MUTATION as BACKWARD_TANGENT_METADATA_MUTATION,
)
from .core._grad_mode_kernels import compiler_kernel_choices as compiler_kernel_choices
from .core._grad_mode_kernels import symbolic_dispatch as symbolic_dispatch
from .core._joint_parts import STALE_TANGENTS_KEY as STALE_TANGENTS_KEY
from .core._node_meta import call_preserving_node_meta as call_preserving_node_meta
from .core._node_meta import propagate_mutation_meta as propagate_mutation_meta
from .core._single_pass import NotSinglePass as NotSinglePass
from .core._single_pass import trace_single_pass as trace_single_pass
from .core._trace import NATIVE_FALLBACK_KEY as NATIVE_FALLBACK_KEY
from .core._trace import FlatFn as FlatFn
from .core._trace import trace_inference as trace_inference
from .core._trace import trace_joint as trace_joint
from .core._trace_scope import COMPILATIONS_IN_PROGRESS as COMPILATIONS_IN_PROGRESS
from .core._trace_scope import backward_spanning_scope as backward_spanning_scope
from .core._trace_scope import entered_until_backward_traced as entered_until_backward_traced
from .core._trace_scope import inside_a_trace as inside_a_trace
from .core._trace_scope import new_compilation as new_compilation
from .core._unfunctionalized import without_effect_tokens as without_effect_tokens
from .inputs._input_rebinds import InputRebindError as InputRebindError
from .inputs._input_rebinds import InputRequiresGradChanged as InputRequiresGradChanged
from .inputs._input_rebinds import checking_input_rebinds as checking_input_rebinds

__all__ = [
    "GeneratorStateError",
    "generator_state_kept",
    "check_no_effects_in_subgraphs",
    "effects_in_subgraph_error",
    "COMPILATIONS_IN_PROGRESS",
    "inside_a_trace",
    "BACKWARD_MUTATED_INPUTS_KEY",
    "InputRequiresGradChanged",
    "NATIVE_FALLBACK_KEY",
    "STALE_TANGENTS_KEY",
    "SubclassLayer",
    "autocast_at_compile",
    "backward_autocast_key",
    "check_layer_applies",
    "compiler_kernel_choices",
    "count_backward_tokens",
    "needs_subclass_layer",
    "preserved_autocast",
    "propagate_mutation_meta",
    "retry_with_shape_env",
    "run_without_autocast",
    "symbolic_dispatch",
    "token_inputs",
    "with_backward_tokens",
    "without_autocast_compiling",
    "without_effect_tokens",
    "AOTCompileError",
    "BACKWARD_INPUT_METADATA_MUTATION",
    "BACKWARD_TANGENT_METADATA_MUTATION",
    "FlatFn",
    "InputRebindError",
    "NotSinglePass",
    "UnsupportedHigherOrderOperatorError",
    "backward_spanning_scope",
    "call_preserving_node_meta",
    "checking_input_rebinds",
    "entered_until_backward_traced",
    "explain_tracing_errors",
    "new_compilation",
    "trace_inference",
    "trace_joint",
    "trace_single_pass",
]
