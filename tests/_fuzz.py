"""Hypothesis settings shared by the fuzzers: a fixed sample in CI, a drawn one with a seed."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, seed, settings


def fuzz_settings(examples_var: str, default_examples: int) -> Callable[..., Any]:
    """A decorator: ``examples_var`` (an environment variable) sets the number of examples;
    ``AOTKIT_FUZZ_SEED`` draws a seeded sample instead of the derandomized one CI runs."""
    examples = int(os.environ.get(examples_var, str(default_examples)))
    drawn_seed = os.environ.get("AOTKIT_FUZZ_SEED")

    def configure(test: Callable[..., Any]) -> Callable[..., Any]:
        test = settings(
            max_examples=examples,
            deadline=None,
            derandomize=drawn_seed is None,  # CI: the same fixed sample every run
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )(test)
        if drawn_seed is not None:
            test = seed(int(drawn_seed))(test)
        return test

    return configure
