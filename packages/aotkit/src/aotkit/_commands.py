"""The ``inspect`` and ``compare`` subcommands of ``aotkit`` (registered by ``_cli``)."""

from __future__ import annotations

import argparse
import sys

from ._factory import FACTORY_HELP, FactoryError, load_factory

INSPECT_DESCRIPTION = """\
Show what aotkit does with a model: how it treats the inputs and outputs (mutations,
aliases), optionally the joint, forward and backward graphs, and one line per partitioner
with what the forward saves for the backward (tensors, bytes) and what the backward
computes again (nodes, FLOPs). With --picture, draw the partition: the joint graph's nodes
in execution order, forward and backward regions, which values are saved and recomputed,
and the bytes kept alive for the backward over time.

example: aotkit inspect my_model.py:make --graphs --picture partition.png
"""

COMPARE_DESCRIPTION = """\
Run every registered partitioner, and the memory-budget partitioner over a sweep of
budgets, on the same joint graph; print saved bytes against recompute FLOPs with the
Pareto front marked (no other partition saves fewer bytes while recomputing fewer FLOPs),
and with --picture draw the front beside the table.

example: aotkit compare my_model.py:make --picture front.png
"""


def add_inspect(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "inspect", help="show the graphs and partitions aotkit makes of a model",
        description=INSPECT_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("factory", help=FACTORY_HELP)
    p.add_argument("--graphs", action="store_true",
                   help="also print the joint, forward and backward graphs")
    p.add_argument("--partitioner", action="append", dest="partitioners", metavar="NAME",
                   help="report only this partitioner (repeatable; default: all registered)")
    p.add_argument("--picture", metavar="OUT.png|OUT.svg",
                   help="draw the partition picture to this file")
    p.add_argument("--picture-partitioner", default="min_cut", metavar="NAME",
                   help="the partitioner whose split --picture draws (default: min_cut)")
    p.set_defaults(run=_run_inspect)


def add_compare(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "compare", help="compare every partitioner: saved bytes vs recompute FLOPs",
        description=COMPARE_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("factory", help=FACTORY_HELP)
    p.add_argument("--budgets", default=None, metavar="B1,B2,...",
                   help="memory budgets to sweep, between 0 and 1 "
                        "(default: 0,0.1,0.2,0.3,0.5,0.7,0.9,1)")
    p.add_argument("--picture", metavar="OUT.png|OUT.svg",
                   help="draw the Pareto front and the table to this file")
    p.set_defaults(run=_run_compare)


def _load(spec: str) -> tuple[object, tuple[object, ...]] | None:
    try:
        return load_factory(spec)
    except FactoryError as e:
        print(f"aotkit: {e}", file=sys.stderr)
        return None


def _run_inspect(args: argparse.Namespace) -> int:
    from ._inspect_print import inspect

    loaded = _load(args.factory)
    if loaded is None:
        return 2
    model, inputs = loaded
    inspect(model, *inputs, graphs=args.graphs, partitioners=args.partitioners,  # type: ignore[arg-type]
            picture=args.picture, picture_partitioner=args.picture_partitioner)
    return 0


def _run_compare(args: argparse.Namespace) -> int:
    from ._compare import BUDGETS, compare

    loaded = _load(args.factory)
    if loaded is None:
        return 2
    budgets = BUDGETS
    if args.budgets:
        budgets = tuple(float(b) for b in args.budgets.split(","))
    model, inputs = loaded
    compare(model, *inputs, budgets=budgets, picture=args.picture)  # type: ignore[arg-type]
    return 0
