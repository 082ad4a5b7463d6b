"""Load ``path/to/file.py:factory``: a function returning a module or function and inputs."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


class FactoryError(ValueError):
    """A ``file.py:factory`` spec that cannot be loaded or returns the wrong thing."""


FACTORY_HELP = (
    "FILE.py:FACTORY, where FACTORY() takes no arguments and returns (model, inputs): "
    "an nn.Module or function and a tuple of its example inputs (a single tensor is "
    "allowed); at least one input or parameter should require grad to see a partition"
)


def load_factory(spec: str) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """Import ``FILE.py`` and call its ``FACTORY``; return the model and its inputs."""
    path_text, sep, name = spec.rpartition(":")
    if not sep or not path_text or not name:
        raise FactoryError(f"expected {FACTORY_HELP}; got {spec!r}")
    path = Path(path_text)
    if not path.is_file():
        raise FactoryError(f"{path} is not a file (in {spec!r}); expected {FACTORY_HELP}")
    module_name = f"_aotkit_factory_{abs(hash(path.resolve()))}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise FactoryError(f"cannot import {path} as a Python file")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module
    loader_spec.loader.exec_module(module)
    factory = getattr(module, name, None)
    if not callable(factory):
        raise FactoryError(f"{path} has no callable named {name!r}")
    made = factory()
    if not (isinstance(made, tuple) and len(made) == 2 and callable(made[0])):
        raise FactoryError(
            f"{spec} returned {type(made).__name__}; expected {FACTORY_HELP}"
        )
    model, inputs = made
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    return model, tuple(inputs)
