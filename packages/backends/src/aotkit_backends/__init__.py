"""aotkit_backends: graph compilers for aotkit (nop, printing, boxing helpers, TorchInductor).

Every compiler here follows the ``aotkit_schemas.Compiler`` protocol and returns a boxed
callable: see Note [Boxed calling convention] in ``aotkit_schemas``. Third-party compilers can
check themselves against ``aotkit_backends.testing.CompilerConformance``.
"""

from ._boxing import BoxedCallable as BoxedCallable
from ._boxing import is_boxed as is_boxed
from ._boxing import make_boxed_compiler as make_boxed_compiler
from ._boxing import make_boxed_func as make_boxed_func
from ._fast_graph import graph_function as graph_function
from ._inductor import InductorUnavailableError as InductorUnavailableError
from ._inductor import inductor_available as inductor_available
from ._inductor import inductor_compiler as inductor_compiler
from ._inductor import inductor_decompositions as inductor_decompositions
from ._inductor import inductor_unavailable_reason as inductor_unavailable_reason
from ._inductor import make_inductor_compiler as make_inductor_compiler
from ._inductor_passes import GraphRole as GraphRole
from ._inductor_passes import joint_graph_passes as inductor_joint_graph_passes
from ._inductor_passes import mark_user_visible_outputs as mark_user_visible_outputs
from ._inductor_pre_grad import inductor_pre_grad_passes as inductor_pre_grad_passes
from ._inductor_settings import InductorSettingsUndescribable as InductorSettingsUndescribable
from ._inductor_settings import inductor_settings_key as inductor_settings_key
from ._nop import nop as nop
from ._print import make_print_compiler as make_print_compiler
from ._print import print_compiler as print_compiler
from ._tokens import TokensThroughHigherOrderOpError as TokensThroughHigherOrderOpError

__all__ = [
    "TokensThroughHigherOrderOpError",
    "BoxedCallable",
    "GraphRole",
    "InductorSettingsUndescribable",
    "InductorUnavailableError",
    "graph_function",
    "inductor_available",
    "inductor_compiler",
    "inductor_decompositions",
    "inductor_joint_graph_passes",
    "inductor_pre_grad_passes",
    "inductor_settings_key",
    "inductor_unavailable_reason",
    "make_inductor_compiler",
    "is_boxed",
    "make_boxed_compiler",
    "make_boxed_func",
    "make_print_compiler",
    "mark_user_visible_outputs",
    "nop",
    "print_compiler",
]
