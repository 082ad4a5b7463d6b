"""What every JSON form of the compile cache shares: its error, and dtypes by name."""

from __future__ import annotations

import torch


class CacheFormatError(ValueError):
    """A cached JSON document that does not have the expected form."""


_DTYPES: dict[str, torch.dtype] = {
    str(v).removeprefix("torch."): v for v in vars(torch).values() if isinstance(v, torch.dtype)
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise CacheFormatError(f"unknown dtype {name!r}") from None
