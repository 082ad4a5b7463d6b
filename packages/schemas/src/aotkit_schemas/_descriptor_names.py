"""Names of graph inputs for people: parameters and buffers by FQN, long lists grouped.

See Note [Inputs named by their descriptors].
"""

from __future__ import annotations

from collections.abc import Sequence

from ._descriptors import (
    AOTInput,
    BufferAOTInput,
    ParamAOTInput,
    PlainAOTInput,
    SubclassGetAttrAOTInput,
)

# Note [Inputs named by their descriptors]
# ``aotkit inspect``, the partition picture and the logs name a graph input by its
# descriptor (See Note [Graph descriptors]): a parameter or buffer by its FQN, the user's
# i-th flat input as ``input i``, anything else by the descriptor's ``expr()``; an input
# without a descriptor as ``input i`` of the compiled inputs. A list of more than
# ``GROUP_AT`` inputs that share a fact (``data mutated``) prints as one line: how many,
# what they are (``BatchNorm running stats`` when every name is a BatchNorm statistic, else
# parameters, buffers or inputs), the fact, and the first two names.

GROUP_AT = 4
_BN_STATS = ("running_mean", "running_var", "num_batches_tracked")


def input_name(desc: AOTInput | None, position: int) -> str:
    """A person's name for the graph input ``desc`` (at compiled ``position``)."""
    if isinstance(desc, (ParamAOTInput, BufferAOTInput)):
        return desc.target
    if isinstance(desc, PlainAOTInput):
        return f"input {desc.idx}"
    if isinstance(desc, SubclassGetAttrAOTInput):
        return f"{input_name(desc.base, position)}.{desc.attr}"
    if desc is None:
        return f"input {position}"
    return desc.expr()


def _kind(descs: Sequence[AOTInput | None], names: Sequence[str]) -> str:
    if all(isinstance(d, BufferAOTInput) for d in descs):
        if all(n.rpartition(".")[2] in _BN_STATS for n in names):
            return "BatchNorm running stats"
        return "buffers"
    if all(isinstance(d, ParamAOTInput) for d in descs):
        return "parameters"
    return "inputs"


def grouped_input_lines(
    facts: Sequence[tuple[int, AOTInput | None, str]], indent: str = "  "
) -> list[str]:
    """``facts``: (compiled position, descriptor, what is true of it); one line per input,
    or per group of more than GROUP_AT inputs sharing what is true of them."""
    by_fact: dict[str, list[tuple[int, AOTInput | None]]] = {}
    for position, desc, fact in facts:
        by_fact.setdefault(fact, []).append((position, desc))
    lines: list[str] = []
    for fact, members in by_fact.items():
        names = [input_name(d, p) for p, d in members]
        if len(members) <= GROUP_AT:
            lines += [f"{indent}{n}: {fact}" for n in names]
            continue
        kind = _kind([d for _, d in members], names)
        lines.append(f"{indent}{len(members)} {kind}: {fact} ({names[0]}, {names[1]}, …)")
    return lines
