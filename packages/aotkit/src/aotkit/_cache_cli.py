"""``aotkit cache``: where the on-disk compile cache is, its size, ``list`` and ``clear``.

See Note [On-disk compile cache] in aotkit_cache.
"""

from __future__ import annotations

import argparse

from aotkit_cache import cache_dir, clear_entries, list_entries
from aotkit_schemas import disk_cache_enabled


def add_cache_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``aotkit cache [where|size|list|clear]`` (default: ``where`` and ``size``)."""
    cache = sub.add_parser(
        "cache",
        help="the on-disk compile cache: where it is, its size, list, clear",
    )
    cache.add_argument(
        "action", nargs="?", choices=("info", "where", "size", "list", "clear"), default="info"
    )
    cache.set_defaults(run=lambda args: cache_command(args.action))


def cache_command(action: str) -> int:
    if action == "where":
        print(cache_dir())
        return 0
    if action == "clear":
        print(f"removed {clear_entries()} files from {cache_dir()}")
        return 0
    entries = list_entries()
    if action == "list":
        for path, size in entries:
            print(f"{size:>10}  {path}")
        return 0
    total = sum(size for _, size in entries)
    if action == "size":
        print(f"{len(entries)} entries, {total} bytes")
        return 0
    state = "on" if disk_cache_enabled(default=False) else "off"
    print(f"directory: {cache_dir()}")
    print(
        f"aot_function/aot_module: {state} (AOTKIT_CACHE=0/1 or aotkit_schemas.disk_cache_config "
        "decide; the aotkit_eager/aotkit_inductor torch.compile backends default to on)"
    )
    print(f"entries: {len(entries)}, {total} bytes")
    return 0
