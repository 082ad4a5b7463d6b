"""aotkit_runtime: the generated autograd.Function and the runtime wrappers."""

from ._autograd_function import AutogradPlan as AutogradPlan
from ._autograd_function import make_autograd_function as make_autograd_function
from ._call import as_list_caller as as_list_caller
from ._epilogue import make_epilogue as make_epilogue
from ._epilogue import needs_epilogue as needs_epilogue

__all__ = [
    "AutogradPlan",
    "as_list_caller",
    "make_autograd_function",
    "make_epilogue",
    "needs_epilogue",
]
