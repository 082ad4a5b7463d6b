"""aotkit_runtime: the generated autograd.Function and the runtime wrappers."""

from ._autograd_function import BACKWARD_MUTATION_CREATE_GRAPH as BACKWARD_MUTATION_CREATE_GRAPH
from ._autograd_function import AutogradPlan as AutogradPlan
from ._autograd_function import make_autograd_function as make_autograd_function
from ._call import as_list_caller as as_list_caller
from ._deferred_errors import deferred_error as deferred_error
from ._deferred_errors import exception_path as exception_path
from ._effects import backward_with_tokens as backward_with_tokens
from ._effects import forward_with_tokens as forward_with_tokens
from ._epilogue import make_epilogue as make_epilogue
from ._epilogue import needs_epilogue as needs_epilogue
from ._higher_order import HigherOrder as HigherOrder
from ._saved_tensors_hooks import stale_hooks_message as stale_hooks_message
from ._saved_tensors_hooks import (
    with_inlined_saved_tensors_hooks as with_inlined_saved_tensors_hooks,
)
from ._subclass import SubclassZeros as SubclassZeros
from ._subclass import check_rebuildable as check_rebuildable
from ._subclass import create_subclass_metas as create_subclass_metas
from ._subclass import is_nested_int as is_nested_int
from ._subclass import is_subclass as is_subclass
from ._subclass import make_unwrapper as make_unwrapper
from ._subclass import make_wrapper as make_wrapper
from ._subclass import rebuild as rebuild
from ._subclass import subclass_backward as subclass_backward
from ._subclass import subclass_forward as subclass_forward
from ._subclass import unwrap_subclasses as unwrap_subclasses
from ._tangent_layout import TangentLayout as TangentLayout
from ._tangent_layout import coerce_tangent_layout as coerce_tangent_layout
from ._tangent_layout import tangent_layouts as tangent_layouts

__all__ = [
    "BACKWARD_MUTATION_CREATE_GRAPH",
    "AutogradPlan",
    "SubclassZeros",
    "TangentLayout",
    "as_list_caller",
    "backward_with_tokens",
    "check_rebuildable",
    "coerce_tangent_layout",
    "create_subclass_metas",
    "deferred_error",
    "exception_path",
    "forward_with_tokens",
    "is_nested_int",
    "is_subclass",
    "make_autograd_function",
    "HigherOrder",
    "make_epilogue",
    "make_unwrapper",
    "make_wrapper",
    "needs_epilogue",
    "rebuild",
    "stale_hooks_message",
    "subclass_backward",
    "subclass_forward",
    "tangent_layouts",
    "unwrap_subclasses",
    "with_inlined_saved_tensors_hooks",
]
