"""aotkit_frontends: aot_function, aot_module and the capture of joint graphs."""

from ._aot_function import AOTModule as AOTModule
from ._aot_function import CompiledCache as CompiledCache
from ._aot_function import aot_function as aot_function
from ._aot_function import aot_module as aot_module
from ._aot_function import compiled_function as compiled_function
from ._aot_function import compiled_module as compiled_module
from ._compile import CompiledArtifacts as CompiledArtifacts
from ._errors import AOTCompileError as AOTCompileError
from ._outputs import UnsupportedOutputError as UnsupportedOutputError

__all__ = [
    "AOTCompileError",
    "AOTModule",
    "CompiledArtifacts",
    "CompiledCache",
    "UnsupportedOutputError",
    "aot_function",
    "aot_module",
    "compiled_function",
    "compiled_module",
]
