"""The switch: whether repeated regions are shared, and from how many repeats.

# Note [When sharing pays]
# Sharing a region costs something of its own: the region is traced as a subgraph
# (invoke_subgraph), which takes the two-pass flow with torch's Python functionalization
# instead of aotkit's single pass, and every repeat becomes a higher-order call with its
# getitems. That fixed cost is only won back when enough repeats skip their retrace: an
# earlier measurement found sharing slower than the linear trace at 2 layers. So the
# default shares a region only when it repeats at least DEFAULT_MIN_REPEATS (6) times;
# shallower models compile as before, op for op. Regions of fewer than 4 operations are
# never shared (a lone Linear costs more as a call than as its retrace).
#
# With the schema of each distinct region call generated once (See Note [Region schemas
# generated once]), sharing pays at 24 layers: aotkit's AOT layer takes 0.52x the unshared
# time on Llama and 0.81x on GPT-2 (tools/bench/regions_depth.py). It stays off by default
# until the zoo has been trained with it through both backends; ``AOTKIT_DEDUP_REGIONS``
# sets the default when aotkit is imported: ``0`` turns sharing
# off, ``1`` turns it on with the default threshold, ``N >= 2`` sets the threshold to N.
# ``set_dedup_regions(value)`` changes it for the process; ``with dedup_regions(value):``
# for a block (a context variable: other threads keep theirs). ``value`` is False/True
# or a threshold (an int >= 2; 0 means off, 1 means on with the default).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator

ENV_VAR = "AOTKIT_DEDUP_REGIONS"
DEFAULT_MIN_REPEATS = 6

__all__ = ["ENV_VAR", "DEFAULT_MIN_REPEATS", "dedup_regions", "set_dedup_regions", "min_repeats"]


def _threshold(value: bool | int | str) -> int:
    """0 for off, else the least number of repeats that is shared."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("", "1", "on", "true", "yes"):
            return DEFAULT_MIN_REPEATS
        if text in ("0", "off", "false", "no"):
            return 0
        if not text.isdigit():
            raise ValueError(
                f"{ENV_VAR}={value!r}: expected 0 (off), 1 (on, sharing regions that repeat "
                f"at least {DEFAULT_MIN_REPEATS} times) or a number N >= 2 of repeats"
            )
        value = int(text)
    if value is True:
        return DEFAULT_MIN_REPEATS
    if value is False:
        return 0
    if value < 0:
        raise ValueError(f"dedup_regions({value}): a threshold must be 0, 1 or a count >= 2")
    return DEFAULT_MIN_REPEATS if value == 1 else int(value)


# off by default for now: measured (tools/bench/regions_depth.py, AOTKIT_CACHE=0) the AOT
# layer is still slower with sharing (Llama 8 layers 1.18x), until aotkit traces an
# invoke_subgraph once per identifier (part A of issue 36). Turn on with =1 or N.
_PROCESS = [_threshold(os.environ.get(ENV_VAR, "0"))]
_SCOPED: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "aotkit_dedup_regions", default=None
)


def min_repeats() -> int:
    """The least number of repeats a region needs to be shared; 0 when sharing is off.
    See Note [When sharing pays]."""
    scoped = _SCOPED.get()
    return _PROCESS[0] if scoped is None else scoped


def set_dedup_regions(value: bool | int) -> None:
    """Turn region sharing on/off for the process, or set its threshold. See Note [When
    sharing pays]."""
    _PROCESS[0] = _threshold(value)


@contextlib.contextmanager
def dedup_regions(value: bool | int) -> Iterator[None]:
    """Region sharing on/off (or its threshold) inside the block. See Note [When sharing
    pays]."""
    token = _SCOPED.set(_threshold(value))
    try:
        yield
    finally:
        _SCOPED.reset(token)
