"""The ``aotkit`` command."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ._cache_cli import add_cache_command
from ._demo import run_demo


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="aotkit", description="Ahead-of-time autograd for PyTorch."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="train a small MLP eagerly and through aot_module and compare"
    )
    demo.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    add_cache_command(sub)
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is not None:
        return int(args.handler(args))
    if args.command == "demo":
        return run_demo(steps=args.steps)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
