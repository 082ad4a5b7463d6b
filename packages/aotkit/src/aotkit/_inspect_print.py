"""``aotkit.inspect``: what aotkit makes of a function or module, without writing code
(See Note [Inspecting a compilation] in ``_inspect``)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from aotkit_partitioners import available_partitioners

from ._inspect import Capture, _graph_text, capture, metadata_summary, report_table
from ._picture import draw_partition


def inspect(
    fn_or_module: Callable[..., Any],
    *args: Any,
    graphs: bool = False,
    partitioners: Sequence[str] | None = None,
    picture: str | None = None,
    picture_partitioner: str = "min_cut",
    file: TextIO | None = None,
) -> Capture:
    """Print what aotkit does with ``fn_or_module(*args)``: the metadata summary (input
    mutations, output aliases), with ``graphs`` the joint, forward and backward graphs, and
    a partition report per partitioner (default: every registered one). ``picture`` (a
    ``.png`` or ``.svg`` path) also draws the split chosen by ``picture_partitioner``.
    Returns the ``Capture`` for further study."""
    out = file or sys.stdout
    cap = capture(fn_or_module, *args)
    print("== metadata ==", file=out)
    print(metadata_summary(cap.meta, cap.input_descs), file=out)
    if cap.joint is None:
        if graphs and cap.inference is not None:
            print(_graph_text(cap.inference, "Inference graph"), file=out)
        print("no input requires grad: traced for inference only, nothing to partition",
              file=out)
        return cap
    names = list(partitioners) if partitioners else available_partitioners()
    if picture is not None and picture_partitioner not in names:
        names.append(picture_partitioner)
    for name in names:
        cap.partition(name)
    if graphs:
        print(_graph_text(cap.joint, "Joint graph"), file=out)
        first = next((o for o in cap.outcomes.values() if o.fw_module is not None), None)
        if first is not None and first.fw_module is not None and first.bw_module is not None:
            print(_graph_text(first.fw_module, f"Forward graph ({first.name})"), file=out)
            print(_graph_text(first.bw_module, f"Backward graph ({first.name})"), file=out)
    print("== partitions ==", file=out)
    print(report_table(list(cap.outcomes.values())), file=out)
    if picture is not None:
        chosen = cap.outcomes[picture_partitioner]
        if chosen.report is None:
            print(f"no picture: {picture_partitioner} failed ({chosen.error})", file=out)
        else:
            draw_partition(cap, chosen, picture)
            print(f"wrote {picture} (partition by {picture_partitioner})", file=out)
    return cap
