"""Symbolic sizes in the on-disk cache: expressions as JSON trees, an entry's shape facts.

# Note [Dynamic shapes in the on-disk cache]
# A compilation traced with symbolic sizes (aot_function(dynamic=True), or dynamo's fake
# inputs under torch.compile(dynamic=True)) is stored with its *shape facts*, all in
# terms of the ShapeEnv's symbols after its replacements (``ShapeEnv.replace``):
#   * per compiled input: the expression of every size, stride and storage offset of a
#     tensor, or the expression of a SymInt (a Python int made symbolic); a symbol is
#     *bound* by its first occurrence as a bare symbol, in input order. Every other
#     symbol in the entry (guards, graph values) must be bound, else the compilation is
#     ``Uncacheable`` (unbacked sizes from ``.item()``/``nonzero`` are never stored);
#   * the value range of every bound symbol, and every ShapeEnv guard (``shape_env.guards``,
#     trivially true ones dropped).
# Expressions are JSON trees, never strings to evaluate: an int, ``{"s": name}``,
# ``{"b": bool}``, or ``{"o": op, "a": [args]}`` with ``op`` from a closed table
# (+, *, ** by a natural number, //, %, max, min, comparisons, and, or, not). Reading
# one only walks the tree and applies those operators; anything else is a
# ``CacheFormatError``. A sympy class outside the table makes the entry Uncacheable.
# Using an entry for new inputs: bind the symbols to the new inputs' values (ints of
# real inputs, or the hints of dynamo's SymInts); the entry applies only when every
# input expression evaluates to the new input's actual size/stride/offset, every symbol
# is in its range and every guard holds. Otherwise it is skipped (not an error) and the
# program is compiled again, stored as another entry under the same key (entries of one
# key differ by a hash of their facts, See Note [On-disk compile cache]).
# When it applies, the graphs' values are rebuilt by evaluating their trees on the
# symbols of the new fake inputs (aot_function: inputs fakified again with a fresh
# ShapeEnv; dynamo: its own fakes), and every stored guard is evaluated on those symbols
# and asserted with ``bool()``: the ShapeEnv records it as a guard, so dynamo guards the
# frame on what the skipped trace would have guarded.
# The key of a symbolic compilation leaves out what the facts check (the sizes of
# dynamic inputs and the values of ints); for dynamo's inputs it has their expressions
# with symbols renamed in order of first occurrence, and the ShapeEnv's ranges and guards
# under the same names (the trace may have read them).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from aotkit_schemas import CacheFormatError, Uncacheable

_MAX_DEPTH = 64


def _reduce(fn: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    def apply(*args: Any) -> Any:
        if len(args) < 2:
            raise CacheFormatError("an n-ary operator needs two arguments or more")
        return functools.reduce(fn, args)

    return apply


def _binary(fn: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    def apply(*args: Any) -> Any:
        if len(args) != 2:
            raise CacheFormatError("a binary operator needs two arguments")
        return fn(*args)

    return apply


def _pow(base: Any, exp: Any) -> Any:
    if type(exp) is not int or not 0 <= exp <= 64:
        raise CacheFormatError("an exponent must be a natural number")
    return base**exp


def _not(*args: Any) -> Any:
    if len(args) != 1:
        raise CacheFormatError("not takes one argument")
    return torch.sym_not(args[0])


_OPS: dict[str, Callable[..., Any]] = {
    "add": _reduce(operator.add),
    "mul": _reduce(operator.mul),
    "pow": _binary(_pow),
    "floordiv": _binary(operator.floordiv),
    "mod": _binary(operator.mod),
    "max": _reduce(torch.sym_max),
    "min": _reduce(torch.sym_min),
    "eq": _binary(operator.eq),
    "ne": _binary(operator.ne),
    "lt": _binary(operator.lt),
    "le": _binary(operator.le),
    "gt": _binary(operator.gt),
    "ge": _binary(operator.ge),
    "and": _reduce(operator.and_),
    "or": _reduce(operator.or_),
    "not": _not,
}


@functools.cache
def _sympy_ops() -> dict[type, str]:
    import sympy
    from torch.utils._sympy import functions as F

    return {
        sympy.Add: "add", sympy.Mul: "mul", sympy.Pow: "pow", F.PowByNatural: "pow",
        F.FloorDiv: "floordiv", F.PythonMod: "mod", F.Mod: "mod", sympy.Mod: "mod",
        F.Max: "max", F.Min: "min", sympy.Max: "max", sympy.Min: "min",
        sympy.Eq: "eq", sympy.Ne: "ne", sympy.StrictLessThan: "lt", sympy.LessThan: "le",
        sympy.StrictGreaterThan: "gt", sympy.GreaterThan: "ge",
        sympy.And: "and", sympy.Or: "or", sympy.Not: "not",
    }


def expr_to_tree(e: Any) -> Any:
    """The JSON tree of a sympy expression; Uncacheable outside the closed table."""
    import sympy

    if isinstance(e, bool) or e is sympy.true or e is sympy.false:
        return {"b": bool(e)}
    if isinstance(e, int):
        return e
    if isinstance(e, sympy.Integer):
        return int(e)
    if isinstance(e, sympy.Symbol):
        return {"s": e.name}
    op = _sympy_ops().get(type(e))
    if op is None:
        raise Uncacheable(f"a shape expression uses {type(e).__name__}")
    return {"o": op, "a": [expr_to_tree(a) for a in e.args]}


def eval_tree(tree: Any, env: dict[str, Any], depth: int = 0) -> Any:
    """A tree's value with symbols from ``env`` (ints or SymInts); CacheFormatError for
    anything outside Note [Dynamic shapes in the on-disk cache]'s closed form."""
    if depth > _MAX_DEPTH:
        raise CacheFormatError("a shape expression nests too deeply")
    if type(tree) is int:
        return tree
    if isinstance(tree, dict):
        if len(tree) == 1 and type(tree.get("s")) is str:
            try:
                return env[tree["s"]]
            except KeyError:
                raise CacheFormatError(f"unbound symbol {tree['s']!r}") from None
        if len(tree) == 1 and type(tree.get("b")) is bool:
            return tree["b"]
        if len(tree) == 2 and isinstance(tree.get("a"), list):
            fn = _OPS.get(tree.get("o"))  # type: ignore[arg-type]
            if fn is not None:
                return fn(*(eval_tree(a, env, depth + 1) for a in tree["a"]))
    raise CacheFormatError(f"bad shape expression {tree!r}")


def bare_symbol(tree: Any) -> str | None:
    if isinstance(tree, dict) and len(tree) == 1 and type(tree.get("s")) is str:
        name: str = tree["s"]
        return name
    return None


def tree_symbols(tree: Any, out: set[str]) -> set[str]:
    name = bare_symbol(tree)
    if name is not None:
        out.add(name)
    elif isinstance(tree, dict) and isinstance(tree.get("a"), list):
        for a in tree["a"]:
            tree_symbols(a, out)
    return out


class SymbolicForm:
    """Converts the sizes of one ShapeEnv's values into trees, checking their symbols."""

    def __init__(self, shape_env: Any) -> None:
        self.shape_env = shape_env
        self.bound: set[str] | None = None

    def tree(self, x: Any) -> Any:
        if type(x) is int:
            return x
        if isinstance(x, torch.SymInt):
            t = expr_to_tree(self.shape_env.replace(x.node.expr))
            if self.bound is not None and not tree_symbols(t, set()) <= self.bound:
                raise Uncacheable("a graph value uses a symbol no input binds (unbacked?)")
            return t
        raise Uncacheable(f"a size of type {type(x).__name__} has no cache form")

    def tensor(self, t: torch.Tensor) -> dict[str, Any]:
        return {
            "size": [self.tree(d) for d in t.shape],
            "stride": [self.tree(d) for d in t.stride()],
            "offset": self.tree(t.storage_offset()),
        }

    def facts(self, values: Sequence[Any]) -> dict[str, Any]:
        """The shape facts of Note [Dynamic shapes in the on-disk cache] for the compiled
        inputs ``values`` (fakes and SymInts of this ShapeEnv)."""
        inputs: list[Any] = []
        for v in values:
            if isinstance(v, torch.Tensor):
                inputs.append(self.tensor(v))
            elif isinstance(v, torch.SymInt):
                inputs.append({"int": self.tree(v)})
            elif isinstance(v, (torch.SymFloat, torch.SymBool)):
                raise Uncacheable(f"a {type(v).__name__} input has no cache form")
            else:
                inputs.append(None)
        bound = [n for n in _bare_occurrences(inputs)]
        self.bound = set(bound)
        used: set[str] = set()
        for spec in inputs:
            for t in _spec_trees(spec):
                tree_symbols(t, used)
        if not used <= self.bound:
            raise Uncacheable("an input size uses a symbol no input binds")
        by_name = {s.name: vr for s, vr in self.shape_env.var_to_range.items()}
        ranges = {}
        for name in bound:
            vr = by_name.get(name)
            if vr is None:
                raise Uncacheable(f"symbol {name} has no range")
            ranges[name] = [_bound_int(vr.lower), _bound_int(vr.upper)]
        guards = []
        for g in self.shape_env.guards:
            t = expr_to_tree(self.shape_env.replace(g.expr))
            if t == {"b": True}:
                continue
            if not tree_symbols(t, set()) <= self.bound:
                raise Uncacheable("a shape guard reads a symbol no input binds")
            guards.append(t)
        return {"inputs": inputs, "ranges": ranges, "guards": guards}


def _bound_int(x: Any) -> int | None:
    import sympy

    if x.is_integer and x.is_finite and isinstance(x, sympy.Integer):
        return int(x)
    return None  # +-infinity


def _spec_trees(spec: Any) -> list[Any]:
    if spec is None:
        return []
    if "int" in spec:
        return [spec["int"]]
    return [*spec["size"], *spec["stride"], spec["offset"]]


def _bare_occurrences(inputs: Sequence[Any]) -> list[str]:
    seen: dict[str, None] = {}
    for spec in inputs:
        for t in _spec_trees(spec):
            name = bare_symbol(t)
            if name is not None:
                seen.setdefault(name)
    return list(seen)


def _actual(spec: Any, v: Any, hint: Callable[[Any], Any]) -> list[Any] | None:
    """The new input's values for ``spec``'s trees, or None when its kind differs."""
    if spec is None:
        return []
    if not isinstance(spec, dict):
        raise CacheFormatError("bad input shape facts")
    if "int" in spec:
        if isinstance(v, bool) or not isinstance(v, (int, torch.SymInt)):
            return None
        return [hint(v)]
    if not isinstance(v, torch.Tensor):
        return None
    size, stride = spec.get("size"), spec.get("stride")
    if not isinstance(size, list) or not isinstance(stride, list):
        raise CacheFormatError("bad input shape facts")
    if len(size) != v.dim() or len(stride) != v.dim():
        return None
    return [*map(hint, v.shape), *map(hint, v.stride()), hint(v.storage_offset())]


def _hint(x: Any) -> int:
    if isinstance(x, torch.SymInt):
        h = x.node.hint
        if h is None:
            raise CacheFormatError("an input size has no hint")
        return int(h)
    return int(x)


def check_facts(facts: Any, values: Sequence[Any]) -> bool:
    """Whether the entry with ``facts`` applies to the compiled inputs ``values`` (real
    inputs, or fakes whose hints are read). CacheFormatError for malformed facts."""
    if not isinstance(facts, dict):
        raise CacheFormatError("bad shape facts")
    inputs, ranges, guards = facts.get("inputs"), facts.get("ranges"), facts.get("guards")
    if not isinstance(inputs, list) or not isinstance(ranges, dict) or not isinstance(guards, list):
        raise CacheFormatError("bad shape facts")
    if len(inputs) != len(values):
        raise CacheFormatError("shape facts for another number of inputs")
    pairs: list[tuple[Any, Any]] = []
    for spec, v in zip(inputs, values, strict=True):
        actual = _actual(spec, v, _hint)
        if actual is None:
            return False
        pairs.extend(zip(_spec_trees(spec), actual, strict=True))
    env: dict[str, int] = {}
    for t, a in pairs:
        name = bare_symbol(t)
        if name is not None:
            env.setdefault(name, a)
    try:
        if any(eval_tree(t, env) != a for t, a in pairs):
            return False
        for name, r in ranges.items():
            if name not in env or not isinstance(r, list) or len(r) != 2:
                raise CacheFormatError("bad symbol range")
            lo, hi = r
            if (lo is not None and env[name] < lo) or (hi is not None and env[name] > hi):
                return False
        return all(bool(eval_tree(g, env)) for g in guards)
    except (ZeroDivisionError, ArithmeticError):
        return False


def _terms(k: int, spec: Any) -> list[tuple[Any, str]]:
    """(tree, input term) pairs of one input's facts, in ShapeGuard's vocabulary
    (``L['t0'].size()[1]``; See Note [Shape guards])."""
    if spec is None:
        return []
    if "int" in spec:
        return [(spec["int"], f"L['t{k}']")]
    terms = [(t, f"L['t{k}'].size()[{i}]") for i, t in enumerate(spec["size"])]
    terms += [(t, f"L['t{k}'].stride()[{i}]") for i, t in enumerate(spec["stride"])]
    terms.append((spec["offset"], f"L['t{k}'].storage_offset()"))
    return terms


def failing(facts: dict[str, Any], values: Sequence[Any]) -> list[str]:
    """Why ``check_facts`` refuses ``values``, as guard texts over the inputs (for the
    recompile log)."""
    if check_facts(facts, values):
        return []
    names: dict[str, str] = {}
    env: dict[str, int] = {}
    pairs: list[tuple[Any, str, Any]] = []
    out = []
    for k, (spec, v) in enumerate(zip(facts["inputs"], values, strict=True)):
        actual = _actual(spec, v, _hint)
        if actual is None:
            out.append(f"L['t{k}'] has another kind or number of dimensions")
            continue
        for (t, text), a in zip(_terms(k, spec), actual, strict=True):
            name = bare_symbol(t)
            if name is not None and name not in env:
                env[name], names[name] = a, text
            else:
                pairs.append((t, text, a))
    if out:
        return out
    for t, text, a in pairs:
        if not _holds(t, env, functools.partial(operator.eq, a)):
            out.append(f"{text} == {describe(t, names)}")
    for name, (lo, hi) in facts["ranges"].items():
        value = env[name]
        if (lo is None or value >= lo) and (hi is None or value <= hi):
            continue
        term = names[name]
        if lo is not None and hi is not None:
            out.append(f"{lo} <= {term} and {term} <= {hi}")
        else:
            out.append(f"{lo} <= {term}" if lo is not None else f"{term} <= {hi}")
    for g in facts["guards"]:
        if not _holds(g, env, bool):
            out.append(describe(g, names))
    return out or ["the inputs differ from the cached entry's shape facts"]


def _holds(tree: Any, env: dict[str, int], test: Callable[[Any], bool]) -> bool:
    try:
        return bool(test(eval_tree(tree, env)))
    except (CacheFormatError, ArithmeticError):
        return False


def bind_symbols(facts: dict[str, Any], fakes: Sequence[Any]) -> dict[str, Any]:
    """The stored symbols as the new fakes' SymInts (after ``check_facts`` passed on the
    same inputs); every input expression checked against the new fake's."""
    inputs = facts["inputs"]
    pairs: list[tuple[Any, Any]] = []
    for spec, v in zip(inputs, fakes, strict=True):
        actual = _actual(spec, v, lambda d: d)
        if actual is None:
            raise CacheFormatError("a fake input differs in kind from the cached one")
        pairs.extend(zip(_spec_trees(spec), actual, strict=True))
    env: dict[str, Any] = {}
    for t, a in pairs:
        name = bare_symbol(t)
        if name is not None and name not in env:
            if not isinstance(a, torch.SymInt):
                raise CacheFormatError(f"symbol {name} is a static size now")
            env[name] = a
    for t, a in pairs:
        if not _same_size(eval_tree(t, env), a):
            raise CacheFormatError("a fake input's sizes differ from the cached expressions")
    return env


def _same_size(x: Any, y: Any) -> bool:
    """Whether a stored size expression is the new fake's size. Where the fakes keep
    separate symbols for sizes the trace found equal (a replacement in its ShapeEnv), the
    equality is asserted, as the trace did (``check_facts`` has checked it holds)."""
    if type(x) is int and type(y) is int:
        return x == y
    return bool(x == y)


def install_guards(facts: dict[str, Any], env: dict[str, Any]) -> None:
    """Assert every stored guard on the new symbols: the ShapeEnv records each as a guard
    (dynamo then guards its frame on it)."""
    for g in facts["guards"]:
        if not bool(eval_tree(g, env)):
            raise CacheFormatError("a cached shape guard fails on the new sizes")


def restored_guard(facts: dict[str, Any], layout: Any) -> Any:
    """The in-memory ShapeGuard of an entry restored from disk: its shape facts checked
    on every compiled input (See Note [Shape guards])."""
    from aotkit_capture import ShapeGuard

    n = len(facts["inputs"])
    names: dict[str, str] = {}
    for k, spec in enumerate(facts["inputs"]):
        for t, text in _terms(k, spec):
            name = bare_symbol(t)
            if name is not None:
                names.setdefault(name, text)

    def values(L: dict[str, Any]) -> list[Any]:
        return [L[f"t{k}"] for k in range(n)]

    return ShapeGuard(
        exprs=tuple(describe(g, names) for g in facts["guards"]),  # texts for logs only
        positions=tuple(range(n)),
        layout=layout,
        _check=lambda L: check_facts(facts, values(L)),
        _explain=lambda L: failing(facts, values(L)),
    )


class Canonical:
    """Symbolic sizes of dynamo's fake inputs for the cache key: symbols renamed ``c0``,
    ``c1``, ... in order of first bare occurrence, and the ShapeEnv's ranges and guards
    under those names. See Note [Dynamic shapes in the on-disk cache]."""

    def __init__(self) -> None:
        self.names: dict[Any, Any] = {}
        self.shape_env: Any = None

    def dim(self, x: Any) -> Any:
        if type(x) is int:
            return x
        if not isinstance(x, torch.SymInt):
            raise Uncacheable(f"a size of type {type(x).__name__}")
        import sympy

        env: Any = x.node.shape_env
        if self.shape_env is None:
            self.shape_env = env
        elif env is not self.shape_env:
            raise Uncacheable("inputs from two ShapeEnvs")
        e = env.replace(x.node.expr)
        if isinstance(e, sympy.Integer):
            return int(e)
        if isinstance(e, sympy.Symbol):
            if e not in self.names:
                self.names[e] = sympy.Symbol(f"c{len(self.names)}")
            return str(self.names[e])
        return self._text(e)

    def _text(self, e: Any) -> str:
        if not e.free_symbols <= set(self.names):
            raise Uncacheable("an input size uses a symbol no input binds")
        return str(e.xreplace(self.names))

    def state(self) -> list[Any]:
        """The ShapeEnv facts a trace may read: ranges of the inputs' symbols, guards."""
        if self.shape_env is None:
            return []
        env = self.shape_env
        ranges = {s.name: vr for s, vr in env.var_to_range.items()}
        out: list[Any] = [
            (str(n), str(ranges.get(s.name))) for s, n in self.names.items()
        ]
        for g in env.guards:
            e = env.replace(g.expr)
            if e.free_symbols <= set(self.names):
                out.append(self._text(e))
            else:
                raise Uncacheable("a shape guard reads a symbol no input binds")
        return out


_INFIX = {
    "add": "+", "mul": "*", "pow": "**", "floordiv": "//", "mod": "%", "eq": "==",
    "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "and": "and", "or": "or",
}


def describe(tree: Any, names: dict[str, str] | None = None) -> str:
    """A tree as readable text, symbols as ``names`` gives them (for logs and
    ShapeGuard.exprs; never evaluated)."""
    name = bare_symbol(tree)
    if name is not None:
        return (names or {}).get(name, name)
    if type(tree) is int:
        return str(tree)
    if isinstance(tree, dict) and "b" in tree:
        return str(tree["b"])
    if isinstance(tree, dict) and isinstance(tree.get("a"), list):
        op, args = tree.get("o"), [describe(a, names) for a in tree["a"]]
        args = [a if a.isidentifier() or a.lstrip("-").isdigit() or "[" in a and " " not in a
                else f"({a})" for a in args]
        if op in _INFIX:
            return f" {_INFIX[op]} ".join(args)
        if op == "not":
            return f"not {args[0]}"
        return f"{op}({', '.join(args)})"
    return repr(tree)
