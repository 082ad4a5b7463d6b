"""Run every corpus case eagerly, through aotkit and through torch; compare.

See Note [What the differential harness compares] in ``_harness.py``. Eager is always the
reference. torch's AOTAutograd is the oracle for the *case*: it must agree with eager unless
the case records ``TorchDiffers``, and then it must really differ.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree
from _harness import (
    Run,
    aotkit_meta,
    compare_runs,
    compile_problems,
    make_call,
    run_case,
    tensor_output_kinds,
    unsafe_view_outputs,
)
from aotkit_schemas import OutputType
from corpus import Case, all_cases
from torch._functorch._aot_autograd.collect_metadata_analysis import (
    run_functionalized_fw_and_collect_metadata,
)
from torch._functorch._aot_autograd.descriptors import PlainAOTInput
from torch._subclasses.fake_tensor import FakeTensorMode

CASES = all_cases()


def _param(case: Case) -> Any:
    marks = []
    if case.aotkit_bug is not None:
        marks.append(pytest.mark.xfail(strict=True, reason=f"BUG: {case.aotkit_bug}"))
    return pytest.param(case, id=case.name, marks=marks)


def _torch_meta(case: Case, run: Run) -> Any:
    """torch's own metadata pass on the case's first inputs (tensor inputs and outputs only)."""
    call = make_call(case, 0)
    flat, spec = pytree.tree_flatten((call.args, call.kwargs))

    def flat_fn(*flat_args: Any) -> list[Any]:
        args, kwargs = pytree.tree_unflatten(list(flat_args), spec)
        return pytree.tree_leaves(case.program(*args, **kwargs))

    mode = FakeTensorMode()
    fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in flat]
    with torch.set_grad_enabled(case.grad_enabled), mode:
        meta = run_functionalized_fw_and_collect_metadata(
            flat_fn,
            flat_args_descs=[PlainAOTInput(i) for i in range(len(flat))],
            keep_input_mutations=case.keep_inference_input_mutations,
        )(*fake)
    outs = [o.output_type for o in meta.output_info if issubclass(o.raw_type, torch.Tensor)]
    ins = [
        info.mutation_type
        for a, info in zip(flat, meta.input_info, strict=True)
        if isinstance(a, torch.Tensor)
    ]
    return tuple(outs), tuple(ins)


def _metadata_problems(case: Case, aot: Run) -> list[str]:
    if case.expect_outputs is None and case.expect_inputs is None:
        return []
    problems = []
    meta, layout = aotkit_meta(aot)
    outs = tuple(tensor_output_kinds(aot))
    ins = tuple(i.mutation_type for i in meta.input_info)
    if case.expect_outputs is not None and outs != case.expect_outputs:
        problems.append(f"aotkit output kinds {_names(outs)}, expected {_names(case.expect_outputs)}")
    if case.expect_inputs is not None and ins != case.expect_inputs:
        problems.append(f"aotkit mutation kinds {_names(ins)}, expected {_names(case.expect_inputs)}")
    if layout.is_trivial and not case.module:
        try:
            t_outs, t_ins = _torch_meta(case, aot)
        except Exception as e:
            if case.torch_differs is not None and case.torch_differs.raises:
                return problems  # torch rejects the program; recorded in the case
            return [*problems, f"torch's metadata pass raised {type(e).__name__}: {e}"]
        if case.expect_outputs is not None and _names(t_outs) != _names(case.expect_outputs):
            problems.append(f"torch's metadata pass says outputs {_names(t_outs)}")
        torch_ins = case.torch_expect_inputs or case.expect_inputs
        if torch_ins is not None and _names(t_ins) != _names(torch_ins):
            problems.append(f"torch's metadata pass says inputs {_names(t_ins)}")
    return problems


def _names(kinds: Any) -> str:
    return "(" + ", ".join(k.name for k in kinds) + ")"


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_corpus_case(case: Case) -> None:
    eager = run_case(case, "eager")
    problems: list[str] = []
    first = eager.observations[0]
    if case.eager_raises and first.raised is None and first.backward_raised is None:
        problems.append("the case says eager raises, but it did not")
    if not case.eager_raises and eager.observations[-1].raised is not None:
        problems.append(f"eager raised: {eager.observations[-1].raised}")

    aot = run_case(case, "aotkit")
    unsafe = unsafe_view_outputs(aot)
    problems += compare_runs(eager, aot, case, unsafe_views=unsafe)
    problems += compile_problems(aot)
    if case.boxed:
        boxed = run_case(case, "aotkit_boxed")
        problems += compare_runs(eager, boxed, case, unsafe_views=unsafe)
        problems += compile_problems(boxed)
    if not case.eager_raises:
        problems += _metadata_problems(case, aot)

    oracle = run_case(case, "torch")
    torch_problems = compare_runs(eager, oracle, case, unsafe_views=unsafe)
    torch_problems += compile_problems(oracle)
    if case.torch_differs is None:
        problems += [f"torch disagrees with eager (record TorchDiffers?): {p}" for p in torch_problems]
        if (
            not torch_problems
            and aot.counts
            and oracle.counts
            # comparable only when both compiled (torch may raise where aotkit defers an
            # error to backward, as eager does)
            and aot.observations[0].raised is None
            and oracle.observations[0].raised is None
            and (aot.counts[0]["fw"], aot.counts[0]["inference"])
            != (oracle.counts[0]["fw"], oracle.counts[0]["inference"])
        ):
            problems.append(f"aotkit compiled {aot.counts[0]}, torch compiled {oracle.counts[0]}")
    elif not torch_problems:
        problems.append(f"recorded TorchDiffers({case.torch_differs.reason!r}) but torch agrees")
    elif case.torch_differs.raises and oracle.observations[-1].raised is None:
        problems.append("recorded that torch raises, but it did not")

    assert not problems, f"{case.name}:\n  " + "\n  ".join(problems)


def test_corpus_size_and_coverage() -> None:
    """The corpus keeps its breadth: case counts and every output and mutation kind."""
    core = [c for c in CASES if c.category == "core"]
    mutation = [c for c in CASES if c.category == "mutation"]
    assert len(core) >= 40, len(core)
    assert len(mutation) >= 60, len(mutation)
    seen_out = {k for c in CASES for k in (c.expect_outputs or ())}
    assert seen_out == set(OutputType), set(OutputType) - seen_out
    from aotkit_schemas import MutationType

    seen_mut = {k for c in CASES for k in (c.expect_inputs or ())}
    assert seen_mut == set(MutationType), set(MutationType) - seen_mut
