"""Custom operators in the on-disk cache key.

# Note [Custom operators in the on-disk cache key]
# A custom operator's Python code shapes what aotkit traces and stores, yet the program's
# fingerprint never reaches it (the program calls it through ``torch.ops`` or the
# dispatcher): its fake/meta kernel gives the graph's shapes and the metadata, its
# autograd formula (``setup_context``/``backward``) is traced into the joint graph, a
# CompositeImplicitAutograd kernel is inlined into the graph, a mutating op's schema
# chooses ``auto_functionalized``, and an op without a fake kernel runs its real kernel on
# fake-converted inputs. So the key holds, for every operator of the process with user
# code (the traced program may reach any of them, and a decomposition inlines ops the
# program never names; torch's own, some registered lazily when a feature is first
# imported, are left to torch's version so that keys agree between processes):
#   * ``torch.library.custom_op`` operators: the schema and the code (bytecode, constants,
#     closures, globals: See Note [On-disk cache keys]) of every function the
#     ``CustomOpDef`` holds: the op's function, its fake, setup_context, backward, vmap,
#     per-device kernels and torch_dispatch rules;
#   * ``torch.library.register_fake`` kernels of any operator (the simple registry);
#   * the schema of every operator not defined by torch.
# Python kernels the dispatcher holds but Python cannot read back (``Library.impl``,
# ``torch.library.register_kernel``/``register_autograd`` on an operator not made with
# ``custom_op``) cannot be keyed on their code: a compilation whose trace reaches one is
# not cached (logged, named with the fix), wherever it was registered; the others are
# (See Note [Refusing only the compilations that reach an unkeyable kernel] in
# ``_reach``, ``unkeyable_operators``). Found by
# ``torch._C._dispatch_dump``'s "registered at" sites: a kernel registered from torch's
# own files (or torch's C++ build) is torch's, covered by torch's version.
# Known gaps, documented: torch's own Python Meta kernels of ``aten`` ops, and every
# Python kernel in torch's other own namespaces (``prims``, ``_c10d_functional``...), are
# assumed torch's (a user who overrides one with ``Library("aten", "IMPL").impl(...,
# "Meta")`` is not seen); a registration is classified once per process, so re-registering the
# same (operator, dispatch key) with ``Library.impl`` after the first compilation is not
# seen; C++ kernels of extensions are not keyed (as torch's own).
"""

from __future__ import annotations

import os
import re
import types
from typing import Any

import torch
import torch.library

from ._fingerprint import Fingerprint

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
# torch's helpers that register a user's function: the function is read back from
# the CustomOpDef or the simple registry, or the registration is refused
_HELPERS = (os.path.join(_TORCH_DIR, "library.py"), os.path.join(_TORCH_DIR, "_library", ""))
# torch's own namespaces: operators torch defines through the same helpers a user would
# (``torch.library.define``/``impl``), whose sites therefore do not tell their owner
_TORCH_NAMESPACES = frozenset({
    "aten", "prims", "debugprims", "rngprims", "_c10d_functional", "c10d_functional",
    "_c10d_functional_autograd", "_dtensor", "fsdp", "streams", "quantized_decomposed",
    "symm_mem", "inductor", "mempool", "onnx", "onnx_symbolic", "flex_lib", "flex_gemm",
    "coor", "_native", "_inductor_test", "export", "debug_mode_ops", "higher_order",
})
_LINE = re.compile(r"(\w+)(?:\[alias\])?: registered at (.*):\d+ :: \(none\)")
_DEF = re.compile(r"^debug: registered at (.*):\d+$", re.M)
_SCHEMA = re.compile(r"^schema: (.*)$", re.M)

# per process: the "ns/name/DispatchKey" registrations classified so far, and those of
# them that cannot be keyed, with the reason
_seen: set[str] = set()
_refused: dict[str, str] = {}
# per process: qualname -> (definition site, schema, {dispatch key: site of its Python kernel})
_dumps: dict[str, tuple[str, str, dict[str, str]]] = {}


def unkeyable_operators() -> dict[str, str]:
    """The operators (``"ns::name"``) that have a Python kernel the key cannot read back,
    each with why and the fix. See Note [Refusing only the compilations that reach an
    unkeyable kernel] in ``_reach``."""
    impls = torch.library._impls
    _classify_new(impls)
    # still registered only (a destroyed Library takes its kernels away)
    return {_operator_name(k): reason for k, reason in _refused.items() if k in impls}


def _operator_name(registration: str) -> str:
    """``"ns::name"`` of a ``torch.library._impls`` entry (``"ns/name.overload/Key"``)."""
    ns, rest = registration.split("/", 1)
    return f"{ns}::{rest.rsplit('/', 1)[0].split('.', 1)[0]}"


def custom_ops_key() -> list[Any]:
    """The custom operators' part of the disk key: the code of every kernel it can read
    back. See Note [Custom operators in the on-disk cache key]; the kernels it cannot read
    are ``unkeyable_operators``'."""
    _classify_new(torch.library._impls)
    from torch._library.custom_ops import OPDEFS
    from torch._library.simple_registry import singleton

    parts: list[Any] = []
    # torch's own (some are registered lazily, when a feature is first imported: keyed,
    # they would make keys differ between processes): covered by torch's version.
    # Skipped before anything is sorted (about a hundred of them: the sorts by repr cost
    # the first key of a process milliseconds)
    for qualname in _outside_torch("opdefs", OPDEFS):
        opdef = OPDEFS[qualname]
        fns = (
            opdef._init_fn, opdef._abstract_fn, opdef._setup_context_fn, opdef._backward_fn,
            opdef._vmap_fn, *(f for _, f in sorted(opdef._backend_fns.items(), key=repr)),
            *(f for _, f in sorted(opdef._torch_dispatch_fns.items(), key=repr)),
        )
        if not any(_user_code(f) for f in fns):  # torch's code only
            continue
        fp = Fingerprint()
        fp.put("custom_op", qualname, str(opdef._schema), sorted(map(str, opdef._tags)),
               sorted(map(repr, opdef._autocast_dtype.items())))
        for f in fns:
            _kernel(fp, f)
        parts.append((qualname, fp.hexdigest()))
    for qualname in _outside_torch("fakes", singleton._data):
        entry = singleton._data[qualname]
        kernels = entry.fake_impl.kernels
        funcs = (kernels[-1].func if kernels else None, *entry.torch_dispatch_rules._data.values())
        if not any(_user_code(f) for f in funcs):  # the newest fake kernel runs
            continue
        fp = Fingerprint()
        fp.put("fake", qualname, sorted(map(repr, entry.torch_dispatch_rules._data)))
        for f in funcs:
            _kernel(fp, f)
        parts.append((qualname, fp.hexdigest()))
        parts.append(("schema", qualname, _dump(qualname)[1]))
    parts += _foreign_schemas()
    return parts


# Note [Operator names outside torch, per key]
# Every key (each warm start's first call) walks the process's few hundred registered
# operators for the few defined outside torch's namespaces (usually none). The names that
# pass, sorted, are kept per registry with the set of names they were picked from, and
# picked again only when that set changed (a set comparison, no sort, no prefix test); the
# foreign schemas are kept until ``_dump`` reads an operator again. What is keyed for each
# name is read anew by every key, as before.
_outside_memo: dict[str, tuple[frozenset[str], list[str]]] = {}
_schemas_memo: list[Any] = []


def _outside_torch(label: str, registry: Any) -> list[str]:
    """``registry``'s names outside torch's namespaces, sorted. See Note [Operator names
    outside torch, per key]."""
    names = frozenset(registry)  # (the fake-kernel registry is a WeakValueDictionary)
    memo = _outside_memo.get(label)
    if memo is not None and names == memo[0]:
        return memo[1]
    picked = sorted(q for q in names if not _torch_namespace(q))
    _outside_memo[label] = (names, picked)
    return picked


def _foreign_schemas() -> list[Any]:
    """The schemas of the operators read so far that were defined outside torch (a user's
    file, an extension), sorted by name."""
    if not _schemas_memo:
        _schemas_memo.append([
            ("schema", qualname, schema)
            for qualname, (def_site, schema, _) in sorted(_dumps.items())
            if not _torch_namespace(qualname)
            and not def_site.startswith(_TORCH_DIR)
            and not _torch_site(def_site)
        ])
    out: list[Any] = _schemas_memo[0]
    return out


def _classify_new(impls: set[str]) -> None:
    """Classify the registrations not seen before (See Note [Registrations classified at
    import])."""
    new = impls - _seen
    if not new:
        return
    # torch's own namespaces' kernels (aten's: its Meta kernels) need no look
    for k in sorted(
        k for k in new
        # (one split and a set lookup per registration: a key may check a few hundred)
        if k.partition("/")[0] not in _TORCH_NAMESPACES
        or (k.startswith("aten/") and not k.endswith("/Meta"))
    ):
        reason = _classify(k)
        if reason is not None:
            _refused[k] = reason
    _seen.update(new)


def _user_code(f: Any, depth: int = 0) -> bool:
    """Whether ``f`` is, or (a torch wrapper) closes over, a function outside torch."""
    if f is None:
        return False
    module = getattr(f, "__module__", None) or ""
    if not (module == "torch" or module.startswith("torch.")):
        return True
    if isinstance(f, types.FunctionType) and depth < 3:
        for c in f.__closure__ or ():
            v = _cell(c)
            if callable(v) and not isinstance(v, type) and _user_code(v, depth + 1):
                return True
    return False


def _torch_namespace(qualname: str) -> bool:
    """Whether ``"ns::name"`` (or a bare namespace) is one of torch's namespaces."""
    return qualname.partition("::")[0] in _TORCH_NAMESPACES


def _cell(c: Any) -> Any:
    try:
        return c.cell_contents
    except ValueError:  # an empty cell
        return None


def _kernel(fp: Fingerprint, f: Any, depth: int = 0) -> None:
    """A kernel's code; torch's wrappers are looked through to the functions they close
    over (library code is otherwise fingerprinted by name only)."""
    if f is None:
        fp.put(None)
        return
    module = getattr(f, "__module__", None) or ""
    if isinstance(f, types.FunctionType) and (module == "torch" or module.startswith("torch.")):
        fp.put("libfn", module, f.__qualname__)
        if depth < 3:
            for c in f.__closure__ or ():
                v = _cell(c)
                if callable(v) and not isinstance(v, type):
                    _kernel(fp, v, depth + 1)
        return
    fp.value(f)


def _torch_site(site: str) -> bool:
    if site.startswith(_TORCH_DIR):
        return not site.startswith(_HELPERS)
    root = _torch_build_root()
    return root is not None and site.startswith(root)


_build_root: list[str | None] = []


def _torch_build_root() -> str | None:
    """Where torch's C++ was built (the "registered at" prefix of its native operators)."""
    if not _build_root:
        # any native operator's schema is registered in RegisterSchema.cpp; this one has
        # few kernels, so its dump is short (add.Tensor's cost a warm start 0.1 ms)
        m = _DEF.search(torch._C._dispatch_dump("aten::_version"))
        suffix = "build/aten/src/ATen/RegisterSchema.cpp"
        root = m.group(1) if m else ""
        _build_root.append(root[: -len(suffix)] if root.endswith(suffix) else None)
    return _build_root[0]


def _dump(qualname: str) -> tuple[str, str, dict[str, str]]:
    """The operator's definition site, schema and Python kernels' sites, read now (a
    registration made since the last read shows) and kept for the schema part."""
    text = torch._C._dispatch_dump(qualname)
    _schemas_memo.clear()  # See Note [Operator names outside torch, per key]
    m = _DEF.search(text)
    s = _SCHEMA.search(text)
    d = _dumps[qualname] = (
        m.group(1) if m else "",
        s.group(1) if s else "",
        {m[1]: m[2] for line in text.splitlines()
         if line.endswith(":: (none) [ boxed ]") and (m := _LINE.match(line))},
    )
    return d


def _classify(key: str) -> str | None:
    """None when the Python kernel registered under ``key`` ("ns/name/DispatchKey") is
    torch's or is keyed by its code; else why it cannot be keyed."""
    ns, rest = key.split("/", 1)
    name, dk = rest.rsplit("/", 1)
    qualname = f"{ns}::{name}"
    try:
        def_site, _, kernels = _dump(qualname)
    except RuntimeError:
        return None  # no such operator any more: nothing can call it
    site = kernels.get(dk)
    if site is None or _torch_site(site):
        return None
    from torch._library.custom_ops import OPDEFS
    from torch._library.simple_registry import singleton

    if site.startswith(_HELPERS):
        if qualname in OPDEFS or _torch_site(def_site) or ns in _TORCH_NAMESPACES:
            return None
        entry = singleton.get(qualname)
        if dk == "Meta" and entry is not None and entry.fake_impl.kernel is not None:
            return None
    return (
        f"operator {qualname} has a Python {dk} kernel registered at {site} "
        "(Library.impl, or torch.library.register_kernel/register_autograd on an operator "
        "not made with torch.library.custom_op): the cache cannot key its code. Define the "
        "operator with torch.library.custom_op (and register_fake/register_autograd on it) "
        "to make it cacheable"
    )


# Note [Registrations classified at import]
# Classifying a registration reads the dispatcher's dump of its operator (tens of
# microseconds each); a process has about 40 Python kernels outside torch's own namespaces
# from torch's own files (c10d, onednn, mkldnn...) before any user code runs, and
# classifying them on the first key cost every warm start's first call about a
# millisecond. They are classified once here, at import; a registration made later (a
# user's, or one torch makes when a feature is first imported) is classified at the first
# key after it, as before. The classification itself is the same.
_classify_new(torch.library._impls)
