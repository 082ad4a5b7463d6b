"""Donated buffers offered to the backward's compiler.

# Note [Donated buffers reused by the backward's compiler]
# The donated saved tensors (See Note [Donated buffers] in aotkit_capture) are held by the
# autograd node only, so a backward that runs once may reuse their memory in place for its
# own intermediates and gradients, as torch's Inductor does with torch's AOTAutograd. That
# is not a detail: on resnet18 (CPU) torch's inductor step without it costs 1.09x, the
# backward 1.13x, from fresh allocations and page faults.
#
# * At the backward's (lazy) compile, capture puts a ``DonatedInputs`` on the backward
#   graph's ``gm.meta[DONATED_INPUTS_KEY]``: the backward-input positions of the donated
#   buffers, or ``withheld=True`` when the compiling backward keeps its graph
#   (``retain_graph``/``create_graph``): then the saved tensors are read again and nothing
#   may be reused. As torch: the first backward decides.
# * A compiler that reuses them (aotkit_inductor) marks what it returns with
#   ``mark_uses_donated_inputs``. For a withheld graph it must not load an artifact that
#   was compiled with donation (Inductor's cache keys do not include it).
# * The runtime then refuses every later backward that keeps its graph through that
#   compiled backward, with torch's message (``DONATED_BUFFER_KEEP_GRAPH_ERROR``): it would
#   read saved tensors a previous run of the same compiled code may have overwritten.
#   Compilers that do not mark their result (nop, aotkit_eager) keep ``retain_graph``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DONATED_INPUTS_KEY = "aotkit_donated_inputs"

DONATED_BUFFER_KEEP_GRAPH_ERROR = (
    "This backward function was compiled with non-empty donated buffers which requires "
    "create_graph=False and retain_graph=False. Please keep backward(create_graph=False, "
    "retain_graph=False) across all backward() function calls, or set "
    "torch._functorch.config.donated_buffer=False to disable donated buffer."
)

_USES_DONATED_ATTR = "_aotkit_uses_donated_inputs"


@dataclass(frozen=True)
class DonatedInputs:
    """The donated buffers among a backward graph's inputs. See Note [Donated buffers
    reused by the backward's compiler]."""

    # backward-input positions (saved SymInts first, then saved tensors, then tangents)
    indices: tuple[int, ...]
    # the compiling backward keeps its graph: nothing may be reused
    withheld: bool = False

    @property
    def offered(self) -> tuple[int, ...]:
        """The positions the compiler may reuse: none when withheld."""
        return () if self.withheld else self.indices


def mark_uses_donated_inputs(compiled: Callable[..., Any]) -> None:
    """Record that ``compiled`` may overwrite the donated buffers it is given."""
    setattr(compiled, _USES_DONATED_ATTR, True)


def uses_donated_inputs(compiled: Callable[..., Any]) -> bool:
    """Whether ``mark_uses_donated_inputs`` was called on ``compiled``."""
    return getattr(compiled, _USES_DONATED_ATTR, False) is True
