"""aotkit's nop runs graphs through a generated graph function (See Note [Graph functions] in
aotkit_backends). On every graph of every corpus case, the graph function must dispatch the
same overloads in the same order as the GraphModule and return bitwise-equal outputs, and
the whole run through nop's calling convention must still match eager."""

from __future__ import annotations

import pytest
from _harness import compare_runs, run_case, unsafe_view_outputs
from corpus import Case, all_cases

CASES = [c for c in all_cases() if c.aotkit_bug is None]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in CASES])
def test_graph_function_matches_graph(case: Case) -> None:
    eager = run_case(case, "eager")
    run = run_case(case, "aotkit_graph_function")
    assert run.log is not None
    assert run.log.graphs or eager.observations[0].raised is not None  # something was checked
    assert run.log.graph_function_problems == []
    unsafe = unsafe_view_outputs(run)
    assert compare_runs(eager, run, case, unsafe_views=unsafe) == []
