"""The ``aotkit`` command."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from aotkit_capture import cache_dir, cache_enabled, clear_entries, list_entries

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
    cache = sub.add_parser(
        "cache",
        help="the on-disk compile cache: where it is and its size (default), list, clear",
    )
    cache.add_argument("action", nargs="?", choices=("info", "list", "clear"), default="info")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return run_demo(steps=args.steps)
    if args.command == "cache":
        return _cache_command(args.action)
    parser.error(f"unknown command {args.command}")
    return 2


def _cache_command(action: str) -> int:
    entries = list_entries()
    if action == "clear":
        print(f"removed {clear_entries()} files from {cache_dir()}")
        return 0
    if action == "list":
        for path, size in entries:
            print(f"{size:>10}  {path}")
        return 0
    state = "on" if cache_enabled(default=False) else "off (on for the torch.compile backends)"
    print(f"directory: {cache_dir()}")
    print(f"aot_function/aot_module: {state}; set AOTKIT_CACHE=0/1 to force")
    print(f"entries: {len(entries)}, {sum(size for _, size in entries)} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
