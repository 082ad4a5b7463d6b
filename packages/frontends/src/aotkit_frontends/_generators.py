"""Kept for imports of the old location: the generator check lives in capture now
(See Note [Generators created while tracing] in aotkit_capture)."""

from aotkit_capture import GENERATOR_CREATED_MESSAGE as GENERATOR_CREATED_MESSAGE
from aotkit_capture import GeneratorCreatedInTraceError as GeneratorCreatedInTraceError

__all__ = ["GENERATOR_CREATED_MESSAGE", "GeneratorCreatedInTraceError"]
