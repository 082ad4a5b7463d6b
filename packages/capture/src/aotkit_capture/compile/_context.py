"""Which graph is being compiled: the names compilers can query while they run.

# Note [Graph names during compilation]
# Every compilation gets an id (``AOTConfig.aot_id``, one per aot_function /
# aot_module_simplified / export call, counted from 0 per process). While a graph is handed to
# a user callable, the name of that graph is ``f"{aot_id}_{stage}"`` with stage one of
# ``joint`` (the partitioner), ``forward``, ``backward`` or ``inference`` (the compilers), as
# in torch. ``get_aot_compilation_context()`` returns ``([name], model_name, nth_graph)``
# (an empty list outside a compiler call), where ``nth_graph`` counts the stages entered so
# far in this process; ``get_aot_graph_name()`` joins them into
# ``f"{model_name}__{name}_{nth_graph}"``. Under dynamo, the TracingContext's
# ``aot_graph_name`` is set to ``[name]`` for the duration too (Inductor prints it in the code
# it generates). The backward graph is compiled at the first backward call and carries the id
# of the compilation that produced it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from aotkit_schemas import AOTConfig
from torch._guards import TracingContext

_graph_being_compiled: list[str] = []
_nth_graph: int = 0
_model_name: str = "model"


def set_model_name(name: str) -> None:
    """Set the model name reported by ``get_aot_compilation_context`` and
    ``get_aot_graph_name`` (``"model"`` by default)."""
    global _model_name
    _model_name = name


def get_aot_compilation_context() -> tuple[list[str], str, int]:
    """``(graphs being compiled, model name, nth graph)``; see Note [Graph names during
    compilation]. The list is a copy: e.g. ``(['0_forward'], 'model', 0)``."""
    return list(_graph_being_compiled), _model_name, _nth_graph


def get_aot_graph_name() -> str:
    """The name of the graph being compiled, ``f"{model_name}__{name}_{nth_graph}"``."""
    return f"{_model_name}__{'_'.join(_graph_being_compiled)}_{_nth_graph}"


get_graph_being_compiled = get_aot_graph_name


@contextlib.contextmanager
def track_graph_compiling(cfg: AOTConfig, stage: str) -> Iterator[None]:
    """Run the body (one partitioner or compiler call) as stage ``stage`` of compilation
    ``cfg.aot_id``. See Note [Graph names during compilation]."""
    global _graph_being_compiled, _nth_graph
    previous = _graph_being_compiled
    _graph_being_compiled = [f"{cfg.aot_id}_{stage}"]
    tracing = TracingContext.try_get()
    previous_tracing_name = tracing.aot_graph_name if tracing is not None else None
    if tracing is not None:
        tracing.aot_graph_name = _graph_being_compiled
    try:
        yield
    finally:
        _nth_graph += 1
        _graph_being_compiled = previous
        if tracing is not None:
            tracing.aot_graph_name = previous_tracing_name
