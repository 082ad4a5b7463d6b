"""aotkit_tracing: the traces of a flat function over fake inputs.

The single pass (metadata and joint in one native trace), the joint and inference traces
(native or Python functionalization, or none), saved-output detaches, forward/backward
tags, and what the traces thread through: RNG replay keys, effect tokens, higher-order
operators, tensor subclasses (desugared), autocast and its cast cache, input rebinds and
``requires_grad`` changes, the tracing-error translation. The compile pipeline that calls
them is ``aotkit_capture.compile_flat``.
"""

from ._errors import AOTCompileError as AOTCompileError
from ._errors import explain_tracing_errors as explain_tracing_errors
from ._hops import UnsupportedHigherOrderOperatorError as UnsupportedHigherOrderOperatorError
from .core._backward_mutations import (
    BACKWARD_INPUT_METADATA_MUTATION as BACKWARD_INPUT_METADATA_MUTATION,
)
from .core._backward_mutations import (
    BACKWARD_TANGENT_METADATA_MUTATION as BACKWARD_TANGENT_METADATA_MUTATION,
)
from .core._node_meta import call_preserving_node_meta as call_preserving_node_meta
from .core._single_pass import NotSinglePass as NotSinglePass
from .core._single_pass import trace_single_pass as trace_single_pass
from .core._trace import FlatFn as FlatFn
from .core._trace import trace_inference as trace_inference
from .core._trace import trace_joint as trace_joint
from .core._trace_scope import backward_spanning_scope as backward_spanning_scope
from .core._trace_scope import entered_until_backward_traced as entered_until_backward_traced
from .core._trace_scope import new_compilation as new_compilation
from .inputs._input_rebinds import InputRebindError as InputRebindError
from .inputs._input_rebinds import checking_input_rebinds as checking_input_rebinds

__all__ = [
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
