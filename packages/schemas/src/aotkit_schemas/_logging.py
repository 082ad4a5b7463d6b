"""aotkit's loggers and the ``AOTKIT_LOGS`` setting, in ``TORCH_LOGS``'s grammar.

# Note [aotkit loggers]
# Every aotkit package logs through the ``aotkit`` hierarchy of Python loggers, one logger
# per stage of the pipeline, plus a few *artifacts* (whole graphs, reports) that are only
# printed when asked for by name:
#
#     stage loggers   aotkit.capture  aotkit.partition  aotkit.compile  aotkit.runtime
#                     aotkit.cache    aotkit.guards  aotkit.regions (repeated regions shared)
#     artifacts       graphs      -> aotkit.capture.graphs     forward/backward/inference graphs
#                     joint       -> aotkit.capture.joint      the joint graph
#                     partition   -> aotkit.partition          the partition report
#                     guards      -> aotkit.guards             shape guards of each entry
#                     recompiles  -> aotkit.cache.recompiles   why a call compiled again
#                     cache       -> aotkit.cache              cache hits and misses
#
# Quiet by default: nothing is printed until ``AOTKIT_LOGS`` (read at import) or
# ``set_logs`` names a logger. The grammar is ``TORCH_LOGS``'s: a comma-separated list of
# names, ``+name`` for DEBUG, ``-name`` for ERROR only, a bare name for INFO; ``all`` (or
# ``aotkit``) means every logger; a dotted module name (``aotkit.capture``,
# ``aotkit_capture.compile._compile``) names that logger directly. Artifact loggers do not inherit
# their stage's level: ``+capture`` does not print every graph, ``graphs`` does.
#
# ``TORCH_LOGS=aot_graphs`` / ``aot_joint_graph`` (or ``torch._logging.set_logs``) also turn
# on ``graphs`` / ``joint`` while aotkit compiles, and ``TORCH_LOGS=recompiles`` turns on
# ``recompiles``: see ``artifact_enabled``.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import Any

from torch._logging._internal import log_state

ROOT = "aotkit"
ENV_VAR = "AOTKIT_LOGS"

STAGES: tuple[str, ...] = (
    "capture", "partition", "compile", "runtime", "cache", "guards", "regions"
)
# artifact name -> logger name; See Note [aotkit loggers]
ARTIFACTS: dict[str, str] = {
    "graphs": "aotkit.capture.graphs",
    "joint": "aotkit.capture.joint",
    "partition": "aotkit.partition",
    "guards": "aotkit.guards",
    "recompiles": "aotkit.cache.recompiles",
    "cache": "aotkit.cache",
}
# the torch artifact that also turns on an aotkit artifact
TORCH_ARTIFACTS: dict[str, str] = {
    "graphs": "aot_graphs", "joint": "aot_joint_graph", "recompiles": "recompiles"
}
# artifacts whose logger is not a stage logger: they never inherit a stage's level
_LEAF_ARTIFACTS = ("graphs", "joint", "recompiles")

_FORMAT = "[%(asctime)s] [%(name)s] %(levelname)s %(message)s"
_handler: logging.Handler | None = None


class LogSpecError(ValueError):
    """An ``AOTKIT_LOGS`` / ``set_logs`` string names something aotkit does not log."""


@dataclass(frozen=True)
class LogSettings:
    """The levels one ``AOTKIT_LOGS`` string asks for: logger name -> level."""

    levels: dict[str, int]


def get_logger(name: str) -> logging.Logger:
    """The logger of a stage (``"capture"``) or artifact (``"graphs"``), or a dotted
    ``aotkit.*`` name. See Note [aotkit loggers]."""
    if name in ARTIFACTS:
        return logging.getLogger(ARTIFACTS[name])
    if name in STAGES:
        return logging.getLogger(f"{ROOT}.{name}")
    if name == ROOT or name.startswith(ROOT + "."):
        return logging.getLogger(name)
    raise LogSpecError(_unknown(name))


def _unknown(name: str) -> str:
    valid = sorted(set(STAGES) | set(ARTIFACTS))
    return (
        f"unknown aotkit log name {name!r}; valid names: {', '.join(valid)}, 'all', or a "
        "dotted module name such as 'aotkit.capture' (prefix '+' for DEBUG, '-' for ERROR)"
    )


def parse_log_spec(spec: str) -> LogSettings:
    """Parse a ``TORCH_LOGS``-style string: ``"graphs,+capture,-cache"``."""
    levels: dict[str, int] = {}
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        level = logging.INFO
        if item[0] == "+":
            level, item = logging.DEBUG, item[1:]
        elif item[0] == "-":
            level, item = logging.ERROR, item[1:]
        if item in ("all", ROOT):
            levels[ROOT] = level
            for leaf in _LEAF_ARTIFACTS:
                levels[ARTIFACTS[leaf]] = level
            continue
        if "." in item and not item.startswith(ROOT + "."):
            # a module name such as aotkit_capture.compile._compile
            if not item.startswith("aotkit_"):
                raise LogSpecError(_unknown(item))
            levels[item] = level
            continue
        levels[get_logger(item).name] = level
    return LogSettings(levels)


def _reset() -> None:
    for name in [ROOT, *(f"{ROOT}.{s}" for s in STAGES), *ARTIFACTS.values()]:
        logging.getLogger(name).setLevel(logging.NOTSET)
    for leaf in _LEAF_ARTIFACTS:
        # See Note [aotkit loggers]: artifacts are printed only when named
        logging.getLogger(ARTIFACTS[leaf]).setLevel(logging.WARNING)


def ensure_handler(stream: object = None) -> logging.Handler:
    """The one stderr handler (torch's format) on the ``aotkit`` logger."""
    global _handler
    root = logging.getLogger(ROOT)
    if _handler is None:
        _handler = logging.StreamHandler(stream or sys.stderr)  # type: ignore[arg-type]
        _handler.setFormatter(logging.Formatter(_FORMAT))
    if _handler not in root.handlers:
        root.addHandler(_handler)
    return _handler


def set_logs(spec: str | None = None) -> LogSettings:
    """Configure aotkit's loggers from a ``TORCH_LOGS``-style string (``None`` reads
    ``AOTKIT_LOGS``; ``""`` turns everything back off). See Note [aotkit loggers]."""
    if spec is None:
        spec = os.environ.get(ENV_VAR, "")
    settings = parse_log_spec(spec)
    _reset()
    for name, level in settings.levels.items():
        logging.getLogger(name).setLevel(level)
    if settings.levels:
        ensure_handler()
        # Python names below aotkit_* (module loggers) reach the handler through aotkit
        for name in settings.levels:
            if name.startswith("aotkit_"):
                logger = logging.getLogger(name)
                if _handler is not None and _handler not in logger.handlers:
                    logger.addHandler(_handler)
    return settings


def artifact_enabled(name: str) -> bool:
    """Whether the artifact ``name`` is to be printed: asked for through ``AOTKIT_LOGS`` /
    ``set_logs``, or through the matching ``TORCH_LOGS`` artifact."""
    if get_logger(name).isEnabledFor(logging.INFO):
        return True
    torch_name = TORCH_ARTIFACTS.get(name)
    return torch_name is not None and bool(log_state.is_artifact_enabled(torch_name))  # type: ignore[no-untyped-call]


def log_artifact(name: str, msg: str, *args: Any) -> None:
    """Print an artifact at INFO if ``artifact_enabled(name)``. When only ``TORCH_LOGS``
    asked for it, the record bypasses the logger's level and goes to aotkit's handler
    (torch's handlers sit on torch's own loggers)."""
    logger = get_logger(name)
    if logger.isEnabledFor(logging.INFO):
        logger.info(msg, *args)
    elif artifact_enabled(name):
        ensure_handler()
        logger.handle(logger.makeRecord(logger.name, logging.INFO, "(aotkit)", 0, msg, args, None))


_reset()
logging.getLogger(ROOT).addHandler(logging.NullHandler())
if os.environ.get(ENV_VAR):
    set_logs()
