"""The on-disk key's program part tells every corpus program apart.

Two stale hits were found in session 15 (Note [The program in aot_function's disk key]):
two module classes with the same parameter shapes shared an entry, and so did ``f(x, y)``
and ``f(b=x, a=y)``. Both came from a program fingerprint that described too little. This
file checks the family across the whole differential corpus: every program the corpus
compiles (a function, or the module a ``module=True`` case builds) gets a fingerprint of
its own, unless the two programs are the same program (same function object, or modules
of one class with the same structure and the same parameter and buffer values; such cases
differ only in settings that other parts of the key hold: optimizer, keep_inference_input_mutations).
A program that cannot be fingerprinted is never stored, so it cannot be a stale hit.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
import torch.utils._pytree as pytree
from aotkit_cache import program_fingerprint
from aotkit_frontends._aot_function import disk_identity
from aotkit_schemas import Uncacheable
from corpus import all_cases


def _program(case: Any) -> Any:
    if not case.module:
        return case.program
    torch.manual_seed(0)
    return case.program()


def _same_program(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if not (isinstance(a, torch.nn.Module) and isinstance(b, torch.nn.Module)):
        return False
    if type(a) is not type(b) or repr(a) != repr(b):
        return False
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_every_corpus_program_has_its_own_fingerprint() -> None:
    groups: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    fingerprinted = 0
    for case in all_cases():
        program = _program(case)
        try:
            fp = program_fingerprint(program)
        except Uncacheable:
            continue
        fingerprinted += 1
        groups[fp].append((case.name, program))
    assert fingerprinted > 150  # the check must cover the corpus, not a handful of cases
    shared = []
    for members in groups.values():
        first_name, first = members[0]
        for name, program in members[1:]:
            if not _same_program(first, program):
                shared.append((first_name, name))
    assert shared == [], f"different programs share a disk-key fingerprint: {shared}"


def test_argument_structure_is_part_of_the_identity() -> None:
    """The same function called with positional, keyword and reordered keyword
    arguments: one flat input list, three identities."""

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a - b

    x, y = torch.ones(2), torch.zeros(2)
    specs = [
        pytree.tree_flatten(((x, y), {}))[1],
        pytree.tree_flatten(((), {"a": x, "b": y}))[1],
        pytree.tree_flatten(((), {"b": x, "a": y}))[1],
    ]
    identities = {disk_identity(f, spec) for spec in specs}
    assert None not in identities
    assert len(identities) == 3
