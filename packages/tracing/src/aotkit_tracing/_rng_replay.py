"""Random ops that a joint trace runs twice from one generator state replay one draw.

# Note [RNG replay keys]
# ``torch.utils.checkpoint`` (non-reentrant) recomputes its region during the backward
# after setting the generator back to the state the forward saw, so eager draws the same
# dropout mask twice. A trace over fake tensors draws nothing: every random op becomes an
# independent node, and the recomputation would draw a fresh mask. To see the replay, the
# joint trace keys each random op by the *real* CPU generator's state when it runs, then
# moves the generator to a new state derived from that key (``manual_seed`` of a hash of
# it). Keys then repeat exactly when the generator was put back to an earlier state, which
# is what checkpoint's ``set_rng_state`` does and what makes eager repeat a draw. After the
# trace:
#
# * the first node with a key becomes ``run_and_save_rng_state(op, ...)``: the forward's
#   draw, returning the state it drew from;
# * every later node with that key becomes ``run_with_rng_state(state, op, ...)``: the
#   same numbers, and the generator is left where it was, as checkpoint's ``fork_rng``
#   leaves it.
#
# The generator's state before the trace is restored after it, so tracing draws nothing
# from the user's stream. Random ops on other devices are not keyed (no device here to
# prove it on); their recomputations draw afresh, as before. Only with functionalized RNG
# on (Note [Functionalized RNG] in aotkit_schemas).
#
# Note [An unkeyed backward]
# The keying mode is a Python dispatch layer every op of the trace passes through. A
# replay needs a random op run twice from one generator state; if the forward ran no
# random op, the backward could replay only a draw of its own, after resetting the
# generator itself. The single pass therefore runs the backward without keying when
# the forward drew nothing (``unkeyed_if_nothing_drew``: the mode is taken off the stack,
# or only stops keying when a layer of the single pass needs its frame, See Note [One
# dispatch frame for aotkit's trace layers]), and abandons its graph for the two-pass
# flow, whose trace keys everything, if that backward traced any random op
# (``draws_randomness``). Programs with dropout keep the keying throughout.
#
# Note [Checkpointed random ops with functionalized RNG off]
# With the switch off, graphs hold no RNG state ops, so a checkpointed region's
# recomputation would draw a new mask where eager replays the forward's: the gradients
# would be silently wrong. The keys are still recorded; a repeated key (a replay eager
# does) raises an error naming the switch, before anything runs.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import get_proxy_mode
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    _disable_current_modes,
    _get_current_dispatch_mode,
    _pop_mode_temporarily,
)

from aotkit_tracing.core._device_queries import OWN_MODES, fake_device, is_device_query

__all__ = [
    "RngEvent",
    "RngTimeline",
    "draws_randomness",
    "keyed_rng",
    "rng_forward_end",
    "trace_layer",
    "unkeyed_if_nothing_drew",
]

KEY = "aotkit_rng_key"

CHECKPOINT_RNG_OFF_MESSAGE = (
    "aotkit: a region recomputed in the backward (torch.utils.checkpoint) draws random "
    "numbers ({op}); eager replays the forward's draws there, which needs functionalized "
    "RNG, and it is off. Without it the backward would use new random numbers and the "
    "gradients would be wrong. Turn it on (aotkit.set_functionalize_rng(True), the "
    "default, or `with aotkit.functionalize_rng(True):` around the first call), or move "
    "the random op out of the checkpointed region. See Note [Checkpointed random ops with "
    "functionalized RNG off] in aotkit_capture."
)


def _draws(func: Any) -> bool:
    return isinstance(func, torch._ops.OpOverload) and (
        torch.Tag.nondeterministic_seeded in func.tags
    )


def _on_cpu(out: Any) -> bool:
    values = out if isinstance(out, (tuple, list)) else (out,)
    return any(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in values)


def state_hash(state: torch.Tensor) -> bytes:
    """The identity of a generator state (See Note [RNG replay keys])."""
    return hashlib.sha256(bytes(state.tolist())).digest()


def _post_seed(key: bytes, func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> int:
    """The seed of the state a draw leaves behind in the trace: a function of the state it
    drew from and of what it drew (op, sizes, dtypes, scalars), as eager's next state is.
    See Note [Generator states the function sets] in _rng_states."""
    def describe(a: Any) -> str:
        if isinstance(a, torch.Tensor):
            return f"T{tuple(a.shape)}{a.dtype}{a.device}"
        return repr(a)

    text = "|".join([str(func), *map(describe, args), *(f"{k}={describe(v)}" for k, v in kwargs.items())])
    digest = hashlib.sha256(key + text.encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclass
class RngEvent:
    """One thing a keyed trace saw of the default CPU generator, in trace order: a draw
    (``kind == "draw"``), or its state at the forward's end or at the trace's end. See
    Note [Generator states the function sets] in _rng_states."""

    kind: str  # "draw", "forward_end" or "end"
    key: bytes  # the hash of the state a draw started from, or of the state at a mark
    state: torch.Tensor  # that state (it becomes a constant when no earlier state is it)
    # a draw: the hash of the state it left; the forward's end: of the backward's start
    post: bytes = b""
    nodes: list[torch.fx.Node] = field(default_factory=list)  # a draw's random nodes
    last: torch.fx.Node | None = None  # a mark: the newest node of the graph then


# Note [States of other generators]
# A ``torch.Generator`` passed to the function (or held by it) is drawn from by the graph
# on every call, continuing its stream as eager does. If the function sets that
# generator's state (``g.manual_seed(0)``, ``g.set_state(s)``), eager restarts the stream
# and the graph would not: a silently wrong value from the second call on. The keyed
# trace follows each such generator as it follows the default one (Note [RNG replay
# keys]): generators among the traced function's arguments start from a fresh state,
# every draw must start from the state the previous draw from it left, and the trace
# must end there; otherwise the trace raises ``GeneratorStateError`` naming the fix (only
# the default generator's states are replayed: See Note [Generator states the function
# sets] in _rng_states). Every generator is put back to its state before the trace.

GENERATOR_STATE_MESSAGE = (
    "aotkit: the traced function sets the state of a torch.Generator it draws from "
    "(generator.manual_seed, generator.set_state, or a fork of it){where}. The compiled "
    "graph draws from the generator on every call and would continue its stream where eager "
    "starts it again. Seed or set the generator outside the compiled function, or draw "
    "from the default generator, whose states (torch.manual_seed, torch.set_rng_state, "
    "torch.random.fork_rng) aotkit replays. See Note [States of other generators] in "
    "aotkit_capture."
)


class GeneratorStateError(RuntimeError):
    """A traced function sets the state of a non-default generator it draws from."""


class _OtherGenerators:
    """The non-default generators a keyed trace draws from. See Note [States of other
    generators]."""

    def __init__(self) -> None:
        # [generator, its state before the trace, the hash of its live state, the hashes
        # of the states it drew from], arguments first. A draw names its generator through another Python object than the
        # argument (it went through the dispatcher), so generators are told apart by
        # their live state, fresh and so unique.
        self.seen: list[list[Any]] = []

    def start(self, args: Sequence[Any]) -> None:
        import torch.utils._pytree as pytree

        for a in pytree.tree_leaves(list(args)):
            if isinstance(a, torch.Generator) and a is not torch.default_generator:
                saved = a.get_state()
                a.manual_seed(_fresh_seed())
                self.seen.append([a, saved, state_hash(a.get_state()), set()])

    def draw(self, gen: torch.Generator, func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        with _disable_current_modes():
            key = state_hash(gen.get_state())
            entry = next((e for e in self.seen if e[2] == key), None)
            if entry is None:
                if any(key in e[3] for e in self.seen):  # set back to an earlier state
                    raise GeneratorStateError(GENERATOR_STATE_MESSAGE.format(where=f" before {func}"))
                # first seen here (a global), or seeded by the function (the end sees it)
                entry = [gen, gen.get_state(), key, set()]
                self.seen.append(entry)
        out = func(*args, **kwargs)
        with _disable_current_modes():
            gen.manual_seed(_post_seed(key, func, args, kwargs))
            entry[3].add(key)
            entry[2] = state_hash(gen.get_state())
        return out

    def check_end(self) -> None:
        """Raise when a generator is not where its last draw left it (or, for an
        argument never drawn from here, where the trace started it)."""
        with _disable_current_modes():
            for gen, _, live, _ in self.seen:
                if state_hash(gen.get_state()) != live:
                    raise GeneratorStateError(GENERATOR_STATE_MESSAGE.format(where=""))

    def restore(self) -> None:
        with _disable_current_modes():
            for gen, saved, _, _ in reversed(self.seen):  # the arguments' own states last
                gen.set_state(saved)


@dataclass
class RngTimeline:
    """What a keyed trace saw of the generator: the hash of its (fresh) state at the
    start, then every event. Filled by ``keyed_rng``."""

    start: bytes = b""
    events: list[RngEvent] = field(default_factory=list)
    others: _OtherGenerators = field(default_factory=_OtherGenerators)


_FRESH = itertools.count()
_TIMELINES = threading.local()  # the keyed traces running on this thread, innermost last


def _fresh_seed() -> int:
    digest = hashlib.sha256(b"aotkit fresh generator state %d" % next(_FRESH)).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def fresh_state() -> bytes:
    """Seed the generator with a state no user code makes, and return its hash: the
    symbol for "the generator as the caller left it" (See Note [Generator states the
    function sets] in _rng_states)."""
    with _disable_current_modes():
        torch.default_generator.manual_seed(_fresh_seed())
        return state_hash(torch.default_generator.get_state())


def _newest_node() -> torch.fx.Node | None:
    mode = get_proxy_mode()
    if mode is None:
        return None
    nodes = mode.tracer.graph.nodes
    return next(iter(reversed(nodes)), None) if len(nodes) else None


def _mark(timeline: RngTimeline, kind: str) -> RngEvent:
    with _disable_current_modes():
        state = torch.default_generator.get_state()
    event = RngEvent(kind, state_hash(state), state, last=_newest_node())
    timeline.events.append(event)
    return event


def rng_forward_end() -> None:
    """Inside a joint trace made by ``keyed_rng`` with a timeline: record the generator's
    state where the forward ends, then start the backward from a fresh state (the caller
    may draw between forward and backward). See Note [Generator states the function
    sets] in _rng_states."""
    stack = getattr(_TIMELINES, "stack", None)
    if not stack or stack[-1] is None:
        return
    event = _mark(stack[-1], "forward_end")
    event.post = fresh_state()


# One layer of the single pass sitting in the keying mode's frame: See Note [One dispatch
# frame for aotkit's trace layers]. Called with the op, its arguments and ``run``, which
# runs the op (keyed); returns the op's result.
TraceLayer = Callable[[Any, Sequence[Any], dict[str, Any], Callable[..., Any]], Any]


class _RngKeys(TorchDispatchMode):  # type: ignore[no-untyped-call,misc]
    """Tags each random op's new graph nodes with the generator state it ran from.

    See Note [RNG replay keys]. Higher-order operators run below it (their bodies' random
    ops are not keyed; See Note [Higher-order operators]). It also carries the single
    pass's per-op layer, if any (See Note [One dispatch frame for aotkit's trace layers]).
    """

    supports_higher_order_operators = True

    def __init__(self, *, keying: bool = True) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.draws = 0  # random ops seen (See Note [An unkeyed backward])
        self.keying = keying
        self.layer: TraceLayer | None = None
        self.timeline: RngTimeline | None = None

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # lets torch.cond & co. trace their branches with dynamo under this mode
        # (See Note [Higher-order operators] in aotkit_tracing)
        return True

    def __torch_dispatch__(
        self,
        func: Any,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if is_device_query(func, args):  # See Note [Device queries in the trace's dispatch modes]
            return fake_device(args[0])
        layer = self.layer
        if layer is not None:
            return layer(func, args, kwargs or {}, self._run)
        return self._run(func, args, kwargs or {})

    def _run(self, func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        if not self.keying or not _draws(func):
            return func(*args, **kwargs)
        self.draws += 1
        generator = kwargs.get("generator")
        if self.timeline is not None and isinstance(generator, torch.Generator):
            # See Note [States of other generators]
            return self.timeline.others.draw(generator, func, args, kwargs)
        mode = get_proxy_mode()
        graph = mode.tracer.graph if mode is not None else None
        before = set(graph.nodes) if graph is not None else set()
        with _disable_current_modes():
            state = torch.default_generator.get_state()
        key = state_hash(state)
        out = func(*args, **kwargs)
        if graph is None or not _on_cpu(out):
            return out
        nodes = [
            node
            for node in graph.nodes
            if node not in before and node.op == "call_function" and _draws(node.target)
        ]
        for node in nodes:
            node.meta[KEY] = key
        with _disable_current_modes():
            torch.default_generator.manual_seed(_post_seed(key, func, args, kwargs))
            post = state_hash(torch.default_generator.get_state())
        if self.timeline is not None and nodes:
            self.timeline.events.append(RngEvent("draw", key, state, post, nodes))
        return out


OWN_MODES.add(_RngKeys)


# Note [One dispatch frame for aotkit's trace layers]
# Every op of a trace passes through each Python dispatch mode on the stack, and each mode
# costs a Python frame and a re-dispatch per op (about 10-20 us; a BERT joint trace runs
# about 300 ops through them). The single pass has per-op work besides the RNG keying: the
# forward's op gate and fake-cache flags (Note [Single-pass joint trace], Note [Fake-cache
# keys of the single pass's forward]) and the backward's view flags (Note [Fake-cache keys
# of the single pass's backward]). Rather than a mode each, they are layers installed in
# the keying mode that ``keyed_rng`` already pushed (``trace_layer``): the mode answers
# device queries, then hands the op to the layer, which calls ``run`` (the keying) where a
# mode of its own would have called ``func``. The order is the one the separate modes had:
# the layer (pushed last, so on top) sees the op first, the keying runs below it. Without
# the keying mode on top of the stack (a trace not made by ``keyed_rng``) the layer gets a
# mode of its own that does not key, as before.


@contextlib.contextmanager
def trace_layer(layer: TraceLayer | None) -> Iterator[None]:
    """Run the block with ``layer`` seeing every op of the trace, in the keying mode's frame
    when that mode is on top. See Note [One dispatch frame for aotkit's trace layers]."""
    if layer is None:
        yield
        return
    mode = _get_current_dispatch_mode()
    if not isinstance(mode, _RngKeys):
        own = _RngKeys(keying=False)
        own.layer = layer
        with own:
            yield
        return
    previous = mode.layer
    mode.layer = layer
    try:
        yield
    finally:
        mode.layer = previous


@contextlib.contextmanager
def unkeyed_if_nothing_drew(layer: TraceLayer | None = None) -> Iterator[bool]:
    """Inside ``keyed_rng``'s trace: while no random op has run yet, stop keying for the
    block (taking the keying mode off the dispatch stack, unless ``layer`` needs its frame).
    Yields whether it did; if so, the caller must refuse a graph whose block traced a random
    op. See Note [An unkeyed backward]. ``layer`` sees every op of the block (See Note [One
    dispatch frame for aotkit's trace layers])."""
    mode = _get_current_dispatch_mode()
    if not isinstance(mode, _RngKeys) or mode.draws:
        with trace_layer(layer):
            yield False
        return
    if layer is None:
        with _pop_mode_temporarily():
            yield True
        return
    mode.keying = False
    try:
        with trace_layer(layer):
            yield True
    finally:
        mode.keying = True


def is_rng_keying_mode(mode: Any) -> bool:
    """Whether ``mode`` is ``keyed_rng``'s dispatch mode (it only keys random ops)."""
    return isinstance(mode, _RngKeys)


def draws_randomness(graph: torch.fx.Graph) -> bool:
    """Whether ``graph`` holds a random op (See Note [An unkeyed backward])."""
    return any(n.op == "call_function" and _draws(n.target) for n in graph.nodes)


def keyed_rng(fn: Callable[..., Any], timeline: RngTimeline | None = None) -> Callable[..., Any]:
    """Wrap a function traced by make_fx so its random ops carry replay keys.

    Also with functionalized RNG off, so that a replay it would need is refused (See Note
    [Checkpointed random ops with functionalized RNG off]). See Note [RNG replay keys].
    With ``timeline``, the trace starts from a fresh generator state and records every
    draw and the final state in it (See Note [Generator states the function sets] in
    _rng_states).
    """

    @functools.wraps(fn)
    def traced(*args: Any) -> Any:
        with _disable_current_modes():
            saved = torch.default_generator.get_state()
        stack = _TIMELINES.__dict__.setdefault("stack", [])
        stack.append(timeline)
        try:
            if timeline is not None:
                timeline.start = fresh_state()
                with _disable_current_modes():
                    timeline.others.start(args)
            mode = _RngKeys()  # type: ignore[no-untyped-call]
            mode.timeline = timeline
            with mode:
                out = fn(*args)
            if timeline is not None:
                _mark(timeline, "end")
                timeline.others.check_end()
            return out
        finally:
            stack.pop()
            with _disable_current_modes():
                torch.default_generator.set_state(saved)
            if timeline is not None:
                timeline.others.restore()

    return traced
