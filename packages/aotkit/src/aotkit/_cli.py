"""The ``aotkit`` command: each subcommand registers itself from its own module."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ._cache_cli import add_cache_command
from ._commands import add_compare, add_inspect
from ._demo import add_demo


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="aotkit", description="Ahead-of-time autograd for PyTorch."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_demo(sub)
    add_inspect(sub)
    add_compare(sub)
    add_cache_command(sub)
    args = parser.parse_args(argv)
    # each add_* registers its handler with set_defaults(run=...)
    run = getattr(args, "run", None)
    if run is None:
        parser.error(f"no handler for command {args.command}")
    code: int = run(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
