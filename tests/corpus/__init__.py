"""The differential corpus: small named programs, each registered once with ``@case``.

A case is a function plus a seeded input factory. The harness (``tests/_harness.py``) runs
every case eagerly, through ``aotkit_frontends.aot_function``/``aot_module`` and through
torch's own AOTAutograd, and compares everything observable. Adding a case is one function::

    @case(inputs=lambda: (rand(3, 4, grad=True),))
    def sin_cos(x):
        return x.sin().cos()

The factory is called once per run, after ``torch.manual_seed``, so every run gets fresh,
identical inputs. It returns the positional arguments as a tuple, or ``Call(args, kwargs)``.
For ``module=True`` cases the decorated function takes no arguments and builds the module
(also after a fixed seed, so every run gets identical parameters).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from aotkit_schemas import MutationType, OutputType

Category = Literal["core", "mutation"]

# The modules holding cases, loaded by ``all_cases()``.
_CORPUS_MODULES = (
    "corpus.core",
    "corpus.pytrees",
    "corpus.modules",
    "corpus.outputs",
    "corpus.mutations",
    "corpus.aliased_inputs",
    "corpus.layouts",
    "corpus.fresh_tensors",
)


@dataclass(frozen=True)
class Call:
    """Positional and keyword arguments of one call."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TorchDiffers:
    """torch's AOTAutograd disagrees with eager on this case (or raises, ``raises=True``).

    aotkit is then compared with eager only. The harness checks that torch really does
    differ, so a stale record fails instead of hiding a change.
    """

    reason: str
    raises: bool = False


@dataclass(frozen=True)
class Case:
    name: str
    category: Category
    program: Callable[..., Any]
    inputs: Callable[[], Any]
    # program() builds an nn.Module, compiled with aot_module
    module: bool = False
    keep_inference_input_mutations: bool = False
    # run the call under torch.no_grad() when False
    grad_enabled: bool = True
    # expected aotkit metadata: one OutputType per *tensor* output leaf, one MutationType
    # per *tensor* input leaf (compiled inputs, i.e. after dedupe/synthetic bases)
    expect_outputs: tuple[OutputType, ...] | None = None
    expect_inputs: tuple[MutationType, ...] | None = None
    # torch's metadata pass, where it classifies inputs differently on purpose
    torch_expect_inputs: tuple[MutationType, ...] | None = None
    torch_differs: TorchDiffers | None = None
    # eager raises on this program (in the call or in backward); every compiled run must
    # raise too, at the same point or earlier
    eager_raises: bool = False
    # user code run on (outputs, args) right after the call, e.g. mutating an output
    after: Callable[[Any, tuple[Any, ...]], None] | None = None
    # number of calls with fresh inputs (the second must not compile anything new)
    calls: int = 2
    # for module cases: an optimizer stepped after every backward
    optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer] | None = None
    # also run aotkit with boxed compilers (see Note [Boxed calling convention])
    boxed: bool = False
    rtol: float = 1.3e-6
    atol: float = 1e-5
    # a known aotkit bug or limitation this case exposes: the case runs as
    # xfail(strict=True), so fixing it is noticed
    aotkit_bug: str | None = None


CASES: dict[str, Case] = {}


def case_registrar(category: Category) -> Callable[..., Callable[[Callable[..., Any]], Any]]:
    """``case = case_registrar("core")`` gives a corpus module its ``@case(...)``."""

    def case(*, inputs: Callable[[], Any], name: str | None = None, **options: Any) -> Any:
        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            key = name or fn.__name__
            if key in CASES:
                raise ValueError(f"duplicate corpus case {key!r}")
            CASES[key] = Case(name=key, category=category, program=fn, inputs=inputs, **options)
            return fn

        return register

    return case


def all_cases() -> list[Case]:
    for mod in _CORPUS_MODULES:
        importlib.import_module(mod)
    return list(CASES.values())


# ---- input helpers -------------------------------------------------------------------


# Short names for expected kinds, shared by the corpus modules.
NA = OutputType.non_alias
IS_INPUT = OutputType.is_input
OF_INPUT = OutputType.alias_of_input
OF_INTER = OutputType.alias_of_intermediate
OF_INTER_SAVE = OutputType.alias_of_intermediate_save_as_output
OF_INTER_USER = OutputType.alias_of_intermediate_base_is_user_output
UNSAFE = OutputType.unsafe_view_alias
CUSTOM = OutputType.custom_function_view
NM = MutationType.NOT_MUTATED
IN_GRAPH = MutationType.MUTATED_IN_GRAPH
OUT_GRAPH = MutationType.MUTATED_OUT_GRAPH


def rand(*shape: int, grad: bool = False, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A fresh random leaf tensor."""
    return torch.randn(*shape, dtype=dtype, requires_grad=grad)


def nonleaf(*shape: int) -> torch.Tensor:
    """A tensor that requires grad but is not a leaf (so it may be mutated in place)."""
    return torch.randn(*shape, requires_grad=True).clone()


def ints(high: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, high, shape)
