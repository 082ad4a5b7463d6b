"""``aotkit demo``: train a small character-level GPT eagerly and through aotkit.

# Note [The demo]
# The demo trains two copies of one seeded GPT (``_gpt``) on the same batches of the text
# shipped in ``aotkit/data``, one eagerly and one through ``aot_module``, and shows:
#   1. both loss curves side by side (they agree to float rounding);
#   2. compile time against torch's AOTAutograd: a fresh model through
#      ``torch.compile(backend="aot_eager")`` and ``backend="aotkit_eager"``, first step
#      minus a steady step, so both include dynamo's capture and differ in the AOT layer
#      (both backends are warmed up on a tiny function first, so that neither pays for
#      first imports);
#   3. what each partitioner saves for the backward (``aotkit.inspect``'s table);
#   4. the partition picture (Note [Partition picture]).
# It runs in well under a minute on two cores; ``--steps`` keeps CI runs tiny.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import torch
from aotkit_backends import nop
from aotkit_frontends import aot_module

from ._gpt import GPT, CharData, make_gpt

DEMO_DESCRIPTION = """\
Train a small GPT-style model (character level, 2 layers, on the first chapter of Pride
and Prejudice shipped with aotkit) eagerly and through aotkit's aot_module, with a progress
bar. Then print the two loss curves side by side, the compile time of aotkit against
torch's AOTAutograd (both under torch.compile), the bytes each partitioner saves for the
backward, and write the partition picture. Exits 1 if the loss curves disagree.
About 20 seconds of CPU time with the defaults; for a run of a few seconds:

example: aotkit demo --steps 5 --no-compile-times --picture none
"""


def add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo", help="train a small GPT eagerly and through aotkit and compare",
        description=DEMO_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per batch (default 16)")
    p.add_argument("--picture", default="aotkit-demo-partition.png", metavar="OUT.png|OUT.svg",
                   help="where to write the partition picture (default "
                        "aotkit-demo-partition.png; 'none' to skip)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (default 1: fastest for a model this small, "
                        "and robust on a busy machine)")
    p.add_argument("--no-compile-times", action="store_true",
                   help="skip the torch.compile comparison with torch's AOTAutograd")
    p.set_defaults(run=lambda a: run_demo(
        steps=a.steps, batch_size=a.batch_size,
        picture=None if a.picture == "none" else a.picture,
        compile_times=not a.no_compile_times, threads=a.threads,
    ))


def _progress(steps: int, desc: str) -> Any:
    from tqdm import tqdm  # type: ignore[import-untyped]

    return tqdm(range(steps), desc=desc, unit="step", file=sys.stderr, leave=True,
                dynamic_ncols=True, mininterval=0.5)


def _train(
    model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], desc: str
) -> tuple[list[float], float]:
    """Losses per step, and the seconds the first step took."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses: list[float] = []
    first = 0.0
    bar = _progress(len(batches), desc)
    for i in bar:
        start = time.perf_counter()
        x, y = batches[i]
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if i == 0:
            first = time.perf_counter() - start
        if i % 10 == 0:
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    return losses, first


def _compile_seconds(make: Callable[[], GPT], batch: tuple[torch.Tensor, torch.Tensor],
                     backend: str) -> float:
    """First forward+backward through ``torch.compile(backend=...)`` minus a steady one."""
    import torch._dynamo as dynamo

    dynamo.reset()
    model = torch.compile(make(), backend=backend)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        model(*batch).backward()
        times.append(time.perf_counter() - start)
    return times[0] - min(times[1:])


def _curves(eager: list[float], compiled: list[float], stream: TextIO) -> float:
    print("step   eager loss   aotkit loss", file=stream)
    every = max(1, len(eager) // 10)
    for i in [*range(0, len(eager), every), len(eager) - 1]:
        if i % every == 0 or i == len(eager) - 1:
            print(f"{i:4d}   {eager[i]:10.4f}   {compiled[i]:11.4f}", file=stream)
    worst = max(abs(a - b) for a, b in zip(eager, compiled, strict=True))
    return worst


def run_demo(
    steps: int = 200,
    batch_size: int = 16,
    picture: str | None = "aotkit-demo-partition.png",
    compile_times: bool = True,
    out: TextIO | None = None,
    threads: int | None = 1,
) -> int:
    """See Note [The demo]. Returns 0 when the loss curves agree, else 1. ``threads``
    sets torch's intra-op threads for the process (None leaves them)."""
    from ._compare import run_all
    from ._inspect import capture, report_table

    stream = out or sys.stdout
    steps = max(1, steps)
    if threads is not None:
        torch.set_num_threads(threads)
    model, data = make_gpt()
    g = torch.Generator().manual_seed(1)
    batches = [data.batch(batch_size, g) for _ in range(steps)]
    print(f"GPT: {sum(p.numel() for p in model.parameters()):,} parameters, "
          f"{data.vocab_size} characters, {len(data.ids):,} characters of text", file=stream)

    compiled_model = copy.deepcopy(model)
    eager, _ = _train(model, batches, "eager ")
    compiled, first = _train(aot_module(compiled_model, nop), batches, "aotkit")
    worst = _curves(eager, compiled, stream)
    same = worst <= 1e-4 * max(1.0, max(abs(a) for a in eager))
    print(f"max |eager - aotkit| loss = {worst:.2e} -> {'MATCH' if same else 'MISMATCH'}",
          file=stream)
    print(f"aotkit first step (trace + partition + compile): {first:.2f}s", file=stream)

    if compile_times:
        import torch._dynamo as dynamo

        # first-use costs (dynamo's and each backend's imports and caches) go to neither
        for backend in ("aotkit_eager", "aot_eager"):
            warm = torch.compile(lambda t: (t * 2).sin().sum(), backend=backend)
            warm(torch.ones(2, requires_grad=True)).backward()
            dynamo.reset()
        make = _fresh(data)
        # The first GPT compile of each backend still pays first-use costs the tiny warm-up
        # did not reach (decompositions, kernels' fake impls): one round is discarded, then
        # the two backends take turns and the medians are compared.
        rounds: dict[str, list[float]] = {"aotkit_eager": [], "aot_eager": []}
        for _ in range(4):
            for backend, times in rounds.items():
                times.append(_compile_seconds(make, batches[0], backend))
        ours, theirs = (statistics.median(t[1:]) for t in rounds.values())
        print(f"compile time under torch.compile (median of 3 alternating rounds): aotkit_eager "
              f"{ours:.2f}s, torch aot_eager {theirs:.2f}s (ratio {ours / max(theirs, 1e-9):.2f})",
              file=stream)

    cap = capture(_fresh(data)(), *batches[0])
    outcomes = run_all(cap, budgets=(0.0, 0.5))
    print("saved for the backward, per partitioner:", file=stream)
    print(report_table(outcomes), file=stream)
    if picture is not None:
        from ._picture import draw_partition

        chosen = cap.outcomes.get("min_cut") or outcomes[0]
        draw_partition(cap, chosen, picture)
        print(f"wrote the partition picture ({chosen.name}) to {picture}", file=stream)
    return 0 if same else 1


def _fresh(data: CharData) -> Callable[[], GPT]:
    def make() -> GPT:
        model, _ = make_gpt()
        return model

    return make
