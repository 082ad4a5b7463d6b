"""aotkit: ahead-of-time autograd for PyTorch.

The meta-package: it re-exports the public API of the aotkit packages. Importing it also
registers the ``aotkit_eager`` and ``aotkit_inductor`` torch.compile backends.
"""

from aotkit_backends import make_boxed_compiler as make_boxed_compiler
from aotkit_backends import make_boxed_func as make_boxed_func
from aotkit_backends import nop as nop
from aotkit_backends import print_compiler as print_compiler
from aotkit_frontends import AOTCompileError as AOTCompileError
from aotkit_frontends import aot_function as aot_function
from aotkit_frontends import aot_module as aot_module
from aotkit_frontends import compiled_function as compiled_function
from aotkit_frontends import compiled_module as compiled_module
from aotkit_partitioners import default_partition as default_partition
from aotkit_schemas import AOTConfig as AOTConfig
from aotkit_schemas import BackwardSignature as BackwardSignature
from aotkit_schemas import GraphSignature as GraphSignature
from aotkit_schemas import InputAliasInfo as InputAliasInfo
from aotkit_schemas import MutationType as MutationType
from aotkit_schemas import OutputAliasInfo as OutputAliasInfo
from aotkit_schemas import OutputType as OutputType
from aotkit_schemas import ViewAndMutationMeta as ViewAndMutationMeta

__version__ = "0.1.0"

__all__ = [
    "AOTCompileError",
    "AOTConfig",
    "BackwardSignature",
    "GraphSignature",
    "InputAliasInfo",
    "MutationType",
    "OutputAliasInfo",
    "OutputType",
    "ViewAndMutationMeta",
    "aot_function",
    "aot_module",
    "compiled_function",
    "compiled_module",
    "default_partition",
    "make_boxed_compiler",
    "make_boxed_func",
    "nop",
    "print_compiler",
]
