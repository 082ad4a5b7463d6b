"""The Inductor settings an AOT result depends on, as a short string for cache keys.

# Note [Inductor settings in the on-disk cache key]
# aotkit_inductor's partition step runs Inductor's joint-graph passes (pattern rewrites
# switched by ``torch._inductor.config``: ``pattern_matcher``, ``joint_graph_constant_folding``,
# ``fallback_random``, custom joint passes, ...), its decomposition table is chosen and
# behaves by that config (``fallback_random``, ``size_asserts``...), and its inference
# compiler runs the joint passes on the graph aotkit then stores. So the graphs an
# on-disk entry holds depend on Inductor's config, not only on the program and inputs:
# ``inductor_settings_key()`` describes it, and the callables that read it declare it as
# their cache-key settings (``mark_cache_key(..., settings=inductor_settings_key)``, See
# Note [Compiler cache keys] in aotkit_schemas), as torch's AOTAutogradCache keys its
# entries on Inductor's config.
#   * What: every entry of ``torch._inductor.config`` and of its comms config that is not
#     marked compile-ignored (the set Inductor's own ``get_hash()`` covers), as plain data;
#     custom graph passes by their ``uuid()`` (as Inductor's FX graph cache keys them).
#   * Refused: a value with no process-independent description (a custom pass without
#     ``uuid()``, any object whose repr carries an address): the reader raises, and the
#     compilation is not cached. A doubt is a miss, never a reuse.
"""

from __future__ import annotations

import enum
import hashlib
from typing import Any

_PLAIN = (bool, int, float, str, bytes, type(None))


class InductorSettingsUndescribable(RuntimeError):
    """Inductor's config holds a setting with no stable description (a custom pass
    without ``uuid()``)."""


# plain-only descriptions by Inductor's own (cached) config hashes: a key costs microseconds
_MEMO: dict[tuple[bytes, bytes], str] = {}


def _describe(name: str, value: Any, objects: list[str], depth: int = 0) -> Any:
    """A plain, process-independent description of one config value."""
    if isinstance(value, _PLAIN) or isinstance(value, enum.Enum):
        return value
    if depth < 4 and isinstance(value, (list, tuple, set, frozenset)):
        items = [_describe(name, v, objects, depth + 1) for v in value]
        return sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items
    if depth < 4 and isinstance(value, dict):
        return sorted((repr(k), _describe(name, v, objects, depth + 1)) for k, v in value.items())
    uuid = getattr(value, "uuid", None)
    if callable(uuid):
        described = uuid()
        if isinstance(described, (str, bytes)):
            objects.append(name)
            return ("uuid", type(value).__qualname__, described)
    text = repr(value)
    if callable(value) or " at 0x" in text:
        raise InductorSettingsUndescribable(
            f"torch._inductor config {name} is set to {text}, which has no uuid(): "
            "compilations under it are not cached on disk (give the pass a uuid(), e.g. "
            "subclass torch._inductor.custom_graph_pass.CustomGraphPass)"
        )
    objects.append(name)
    return ("repr", type(value).__qualname__, text)


def _config_description(module: Any, objects: list[str]) -> list[Any]:
    # every entry Inductor's own config hash covers (not compile-ignored); torch caches
    # the dict until the config changes
    values = module._get_dict(ignored_keys=list(module._compile_ignored_keys), readonly_values=True)
    return [(k, _describe(k, values[k], objects)) for k in sorted(values)]


def inductor_settings_key() -> str:
    """A description of the Inductor settings aotkit_inductor's AOT result depends on.
    Raises InductorSettingsUndescribable. See Note [Inductor settings in the on-disk
    cache key]."""
    from torch._inductor import config, config_comms

    hashes = (config.get_hash(), config_comms.get_hash())  # type: ignore[attr-defined]
    known = _MEMO.get(hashes)
    if known is not None:
        return known
    objects: list[str] = []  # entries described by an object's uuid() or repr
    text = repr((_config_description(config, objects), _config_description(config_comms, objects)))
    key = "inductor:" + hashlib.sha256(text.encode()).hexdigest()[:32]
    if not objects:  # an object's description may change without its repr
        _MEMO[hashes] = key
    return key
