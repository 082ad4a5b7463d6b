"""Generator states a traced function reads and sets, replayed by the graph.

# Note [Generator states the function sets]
# ``torch.random.fork_rng()``, ``torch.manual_seed``, ``torch.set_rng_state`` and
# checkpoint's ``preserve_rng_state`` set the default generator's state from Python: no
# graph records that. The graph drew from the live generator on every call, so a draw
# after ``fork_rng`` (or inside it) continued the stream where eager starts again, and the
# generator was left where eager does not leave it: the first call matched eager, the
# second did not. What eager does with the generator is fully seen by two things: the
# state each draw starts from and the state the call leaves. A keyed trace (See Note [RNG
# replay keys]) records both in an ``RngTimeline``: it starts from a fresh state (the
# symbol START: the generator as the caller left it), each draw leaves a state derived
# from the state it drew from and what it drew (equal states in the trace are equal
# states in eager), the forward's end is marked and the backward starts from another
# fresh state (BW: the caller may draw between forward and backward), and the state at the
# end is recorded. Each recorded state is then named by the first symbol that had it:
# START, BW, "after draw i", or a constant (a state the function made from outside
# values: ``manual_seed(7)``, a saved state tensor; its bytes go into the graph).
#
# The rewrite replays that timeline at run time with the live generator, keeping track of
# which symbol the live generator holds (``live``; START at the graph's start):
#   * a draw from ``live``: left as it is (it advances the generator, as in eager);
#   * a draw from another state whose following state nothing reads later (checkpoint's
#     recomputation, a draw repeated after ``fork_rng``): ``run_with_rng_state(state, op)``,
#     which leaves the generator alone (Note [RNG replay keys]);
#   * a draw from another state that later draws or the end continue from (draws inside
#     ``fork_rng`` after ``manual_seed``, or after ``set_rng_state``): the graph sets the
#     generator to that state first (``aotkit_rng::set_state``), then draws;
#   * at the forward's end and at the end, when eager's state is not ``live``: the graph
#     sets it (``fork_rng`` restoring the state it saved, ``manual_seed`` with no draw).
# A state the graph needs as a value is the one saved by the first draw from it
# (``run_and_save_rng_state``), else read where it is live (``aotkit_rng::get_state``:
# START at the graph's start, BW at the backward's), else the constant. The two ops are
# side effects (never dead code, never recomputed or moved by the partitioners); those in
# the backward are tagged ``must_be_in_backward``. So every call draws eager's numbers and
# leaves eager's state, through forward and backward. The single pass, the inference
# trace of a program that draws nothing and changes nothing, and a program that only
# replays (checkpoint) get the graphs they had. With functionalized RNG off, a program
# that needs a state op raises (Note [Checkpointed random ops with functionalized RNG
# off]). Other generators (``torch.Generator`` objects, devices) are not followed here.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import torch
import torch.fx
from aotkit_schemas import functionalize_rng_enabled
from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state
from torch.utils._python_dispatch import _disable_current_modes

from ._rng_replay import KEY, RngTimeline, draws_randomness, fresh_state, keyed_rng, state_hash

__all__ = [
    "NeedsStateOps", "generator_state_kept", "rewrite_rng_states", "trace_inference_rng"
]


@torch.library.custom_op("aotkit_rng::get_state", mutates_args=())
def get_state() -> torch.Tensor:
    """The default CPU generator's state. See Note [Generator states the function sets]."""
    return torch.default_generator.get_state()


@get_state.register_fake
def _get_state_fake() -> torch.Tensor:
    return torch.empty(int(torch.default_generator.get_state().numel()), dtype=torch.uint8)


@torch.library.custom_op("aotkit_rng::set_state", mutates_args=())
def set_state(state: torch.Tensor) -> None:
    """Set the default CPU generator's state. See Note [Generator states the function
    sets]."""
    torch.default_generator.set_state(state)


@set_state.register_fake
def _set_state_fake(state: torch.Tensor) -> None:
    return None


GET_STATE = torch.ops.aotkit_rng.get_state.default
SET_STATE = torch.ops.aotkit_rng.set_state.default
torch.fx.node._side_effectful_functions.update({GET_STATE, SET_STATE})

STATE_OPS_OFF_MESSAGE = (
    "aotkit: the traced function sets the random generator's state ({what}: "
    "torch.random.fork_rng, torch.manual_seed or torch.set_rng_state), and functionalized "
    "RNG is off, so the graph cannot replay it: later calls would continue the random "
    "stream where eager starts again. Turn it on (aotkit.set_functionalize_rng(True), the "
    "default), or set the generator's state outside the compiled function. See Note "
    "[Generator states the function sets] in aotkit_capture."
)

START: tuple[str, int] = ("start", 0)
BW: tuple[str, int] = ("backward", 0)
Symbol = tuple[str, int]


class NeedsStateOps(Exception):
    """The graph needs generator state ops, which the caller cannot place."""


def _sources(timeline: RngTimeline) -> list[Symbol]:
    """The symbol naming the state each event starts from (a draw) or sees (a mark)."""
    known: dict[bytes, Symbol] = {timeline.start: START}
    sources = []
    for i, e in enumerate(timeline.events):
        sources.append(known.setdefault(e.key, ("const", i)))
        if e.kind == "draw":
            known.setdefault(e.post, ("post", i))
        elif e.kind == "forward_end":
            known.setdefault(e.post, BW)
    return sources


def _plan(timeline: RngTimeline, sources: list[Symbol]) -> list[str]:
    """One action per event: "plain", "replay", "set_then_draw", "set" or "none"."""
    events = timeline.events
    later: list[set[Symbol]] = [set() for _ in events]
    seen: set[Symbol] = set()
    for i in reversed(range(len(events))):
        later[i] = set(seen)
        seen.add(sources[i])
    live = START
    actions = []
    for i, e in enumerate(events):
        src = sources[i]
        if e.kind == "draw":
            if src == live:
                actions.append("plain")
                live = ("post", i)
            elif ("post", i) in later[i]:
                actions.append("set_then_draw")
                live = ("post", i)
            else:
                actions.append("replay")
        else:
            actions.append("set" if src != live else "none")
            live = BW if e.kind == "forward_end" else src
    return actions


class _Rewriter:
    def __init__(
        self,
        gm: torch.fx.GraphModule,
        timeline: RngTimeline,
        sources: list[Symbol],
        actions: list[str],
        forward_made: list[torch.fx.Node] | None,
    ) -> None:
        self.gm, self.graph = gm, gm.graph
        self.events, self.sources, self.actions = timeline.events, sources, actions
        self.forward = set(forward_made) if forward_made is not None else None
        self.saved: dict[torch.fx.Node, torch.fx.Node] = {}  # draw node -> its saved state
        self.replaced: dict[torch.fx.Node, torch.fx.Node] = {}  # erased node -> its successor
        self.values: dict[Symbol, torch.fx.Node] = {}
        self.backward_start: torch.fx.Node | None = None
        vals = [n.meta.get("val") for n in self.graph.nodes]
        self.fake_mode = next(
            (v.fake_mode for v in vals if isinstance(v, torch.Tensor) and hasattr(v, "fake_mode")),
            None,
        )

    def _fake(self, t: torch.Tensor) -> Any:
        return self.fake_mode.from_tensor(t) if self.fake_mode is not None else t

    def _in_backward(self, anchor: torch.fx.Node) -> bool:
        return (
            self.forward is not None
            and anchor.op != "placeholder"
            and anchor not in self.forward
        )

    def _new(self, target: Any, args: tuple[Any, ...], val: Any, backward: bool) -> torch.fx.Node:
        node = self.graph.create_node("call_function", target, args, {})
        node.meta["val"] = val
        if backward:
            node.meta["partitioner_tag"] = "must_be_in_backward"
        return node

    def _pos(self, node: torch.fx.Node) -> torch.fx.Node:
        """Where ``node`` is now (a draw rewritten by this pass is replaced)."""
        while node in self.replaced:
            node = self.replaced[node]
        return node

    def saved_state(self, draw: torch.fx.Node) -> torch.fx.Node:
        """``draw`` rewritten as ``run_and_save_rng_state``; the state it drew from."""
        state = self.saved.get(draw)
        if state is not None:
            return state
        graph = self.graph
        val = draw.meta.get("val")
        like = val[0] if isinstance(val, (tuple, list)) else val
        target = cast(torch.fx.node.Argument, draw.target)
        with graph.inserting_before(draw):
            pair = graph.create_node(
                "call_function", run_and_save_rng_state, (target, *draw.args), dict(draw.kwargs)
            )
            state = graph.create_node(
                "call_function", operator.getitem, (pair, 0), {}, name=f"rng_state_{draw.name}"
            )
            value = graph.create_node("call_function", operator.getitem, (pair, 1), {})
        with _disable_current_modes():
            example = torch.default_generator.get_state()
        mode = getattr(like, "fake_mode", None)
        state_val = mode.from_tensor(example) if mode is not None else example
        state.meta = {k: v for k, v in draw.meta.items() if k not in ("val", KEY)}
        state.meta["val"] = state_val
        pair.meta = {k: v for k, v in draw.meta.items() if k not in ("val", KEY)}
        pair.meta["val"] = (state_val, val)
        value.meta = {k: v for k, v in draw.meta.items() if k != KEY}
        draw.replace_all_uses_with(value)
        graph.erase_node(draw)
        self.saved[draw] = state
        self.replaced[draw] = value
        return state

    def _provider(self, symbol: Symbol, before: int) -> int | None:
        """The first draw before event ``before`` that drew from ``symbol`` in place."""
        for i in range(before):
            if self.sources[i] == symbol and self.actions[i] in ("plain", "set_then_draw"):
                return i
        return None

    def value(self, symbol: Symbol, before: int) -> torch.fx.Node:
        """A node holding the state ``symbol``, usable by event ``before``."""
        node = self.values.get(symbol)
        if node is None:
            provider = self._provider(symbol, before)
            if provider is not None:
                node = self.saved_state(self.events[provider].nodes[0])
            else:
                node = self._read(symbol)
            self.values[symbol] = node
        return node

    def _read(self, symbol: Symbol) -> torch.fx.Node:
        kind, i = symbol
        if kind == "const":
            name = f"_aotkit_rng_state{i}"
            owner = self.graph.owning_module or self.gm
            with _disable_current_modes():
                owner.register_buffer(name, self.events[i].state.clone(), persistent=False)
            with self.graph.inserting_after(self._after_placeholders()):
                node = self.graph.get_attr(name)
            node.meta["val"] = self._fake(self.events[i].state)
            return node
        if kind == "start":
            anchor, backward = self._after_placeholders(), False
        elif kind == "backward":
            assert self.backward_start is not None, "BW is read after the forward's end"
            anchor, backward = self._pos(self.backward_start), True
        else:  # the state after draw i, read right after it
            original = self.events[i].nodes[-1]
            anchor, backward = self._pos(original), self._in_backward(original)
        with _disable_current_modes():
            example = torch.default_generator.get_state()
        with self.graph.inserting_after(anchor):
            return self._new(GET_STATE, (), self._fake(example), backward)

    def _after_placeholders(self) -> torch.fx.Node:
        placeholders: list[torch.fx.Node] = list(self.graph.find_nodes(op="placeholder"))
        if placeholders:
            return placeholders[-1]
        first: torch.fx.Node = next(iter(self.graph.nodes))
        return first

    def run(self, forward_made: list[torch.fx.Node] | None) -> None:
        uses = [
            i for i, a in enumerate(self.actions) if a in ("replay", "set", "set_then_draw")
        ]
        # the draws whose saved state a later event reads become run_and_save_rng_state
        # first, so that nothing inserted below is anchored on a node they replace
        for i in uses:
            provider = self._provider(self.sources[i], i)
            if provider is not None:
                self.value(self.sources[i], i)
        output = next(iter(self.graph.find_nodes(op="output")))
        for i, (e, action) in enumerate(zip(self.events, self.actions, strict=True)):
            if e.kind == "forward_end":
                anchor = self._pos(e.last) if e.last is not None else self._after_placeholders()
                if action == "set":
                    state = self.value(self.sources[i], i)
                    with self.graph.inserting_after(anchor):
                        anchor = self._new(SET_STATE, (state,), None, False)
                self.backward_start = anchor
            elif e.kind == "end":
                if action == "set":
                    state = self.value(self.sources[i], i)
                    with self.graph.inserting_before(output):
                        self._new(SET_STATE, (state,), None, self.forward is not None)
            elif action == "set_then_draw":
                state = self.value(self.sources[i], i)
                first = e.nodes[0]
                with self.graph.inserting_before(self._pos(first)):
                    self._new(SET_STATE, (state,), None, self._in_backward(first))
            elif action == "replay":
                state = self.value(self.sources[i], i)
                for node in e.nodes:
                    self._replay(node, state)
        if forward_made is not None and self.backward_start is not None:
            # the forward ends at its last node, or at the state op placed after it
            forward_made.append(self._pos(self.backward_start))

    def _replay(self, node: torch.fx.Node, state: torch.fx.Node) -> None:
        graph = self.graph
        with graph.inserting_before(node):
            replay = graph.create_node(
                "call_function",
                run_with_rng_state,
                (state, cast(torch.fx.node.Argument, node.target), *node.args),
                dict(node.kwargs),
            )
        replay.meta = {k: v for k, v in node.meta.items() if k != KEY}
        node.replace_all_uses_with(replay)
        graph.erase_node(node)
        self.replaced[node] = replay


def rewrite_rng_states(
    gm: torch.fx.GraphModule,
    timeline: RngTimeline,
    *,
    forward_made: list[torch.fx.Node] | None = None,
    state_ops: bool = True,
) -> int:
    """Rewrite ``gm`` to replay the generator states its keyed trace saw; returns the
    number of rewritten draws and state ops. ``forward_made``: the joint's forward nodes (a
    state op placed at the forward's end is appended). ``state_ops=False`` raises
    NeedsStateOps rather than adding ``aotkit_rng`` ops. See Note [Generator states the
    function sets]."""
    for node in gm.graph.nodes:
        node.meta.pop(KEY, None)
    sources = _sources(timeline)
    actions = _plan(timeline, sources)
    needs_ops = _needs_ops(sources, actions)
    replays = actions.count("replay")
    if not replays and not needs_ops:
        return 0
    if not functionalize_rng_enabled():
        if needs_ops:
            raise RuntimeError(STATE_OPS_OFF_MESSAGE.format(what=_first_op(timeline, actions)))
        from ._rng_replay import CHECKPOINT_RNG_OFF_MESSAGE

        op = timeline.events[actions.index("replay")].nodes[0].target
        raise RuntimeError(CHECKPOINT_RNG_OFF_MESSAGE.format(op=op))
    if needs_ops and not state_ops:
        raise NeedsStateOps("the function sets the random generator's state")
    _Rewriter(gm, timeline, sources, actions, forward_made).run(forward_made)
    gm.graph.lint()
    gm.recompile()
    return replays + sum(a != "plain" and a != "none" for a in actions)


def _needs_ops(sources: list[Symbol], actions: list[str]) -> bool:
    """Whether the rewrite adds a state op or constant: a set, or a replay of a state no
    earlier draw saved."""
    drawn: set[Symbol] = set()
    for src, action in zip(sources, actions, strict=True):
        if action in ("set", "set_then_draw") or (action == "replay" and src not in drawn):
            return True
        if action == "plain":
            drawn.add(src)
    return False


def _first_op(timeline: RngTimeline, actions: list[str]) -> str:
    for e, a in zip(timeline.events, actions, strict=True):
        if a in ("set", "set_then_draw", "replay"):
            return f"before {e.nodes[0].target}" if e.nodes else f"at the {e.kind.replace('_', ' ')}"
    return "somewhere"


def trace_inference_rng(
    make: Callable[[Callable[..., Any]], torch.fx.GraphModule], fn: Callable[..., Any]
) -> torch.fx.GraphModule:
    """``make(fn)`` (an inference trace), traced again keyed when it draws or changes the
    generator's state, and rewritten. See Note [Generator states the function sets]."""
    with _disable_current_modes():
        before = torch.default_generator.get_state()
    try:
        # from a fresh state: an earlier run of the function (the metadata pass) may have
        # left the state its ``manual_seed`` makes
        fresh = fresh_state()
        gm = make(fn)
        with _disable_current_modes():
            changed = state_hash(torch.default_generator.get_state()) != fresh
    finally:
        with _disable_current_modes():
            torch.default_generator.set_state(before)
    if not changed and not draws_randomness(gm.graph):
        return gm
    timeline = RngTimeline()
    gm = make(keyed_rng(fn, timeline))
    rewrite_rng_states(gm, timeline)
    return gm


@contextlib.contextmanager
def generator_state_kept(flat_args: Sequence[Any] = ()) -> Iterator[None]:
    """Put the default generator's state, and that of every generator in ``flat_args``,
    back after the block: a compilation runs the user's function on fake tensors, whose
    ``manual_seed`` or ``set_rng_state`` set the real generators (See Note [Generator
    states the function sets])."""
    generators = [torch.default_generator]
    generators += [a for a in flat_args if isinstance(a, torch.Generator)]
    with _disable_current_modes():
        saved = [g.get_state() for g in generators]
    try:
        yield
    finally:
        with _disable_current_modes():
            for g, state in zip(reversed(generators), reversed(saved), strict=True):
                g.set_state(state)
