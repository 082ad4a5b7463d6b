"""Are the graphs Inductor compiles for aotkit_inductor the ones it compiles for inductor?

For each zoo model (``zoo.py``'s, built from configs, nothing downloaded), one training
step is compiled with ``torch.compile(backend="aotkit_inductor")`` and with
``backend="inductor"``; every graph handed to Inductor's ``_compile_fx_inner`` is kept.
Each pair of graphs (forward, backward, in order) is compared in a canonical form: node
``i`` is ``v<i>``, and each node is its op, target and arguments in those names, so node
names do not count and everything else does. Reported per graph: the node counts, whether
the op multisets are equal, whether the canonical forms are equal, and the first node
where they differ (usually the order of independent nodes, or the output's container).

When the graphs are the same (or hold the same ops), a gap in Inductor's compile time
between the two backends is Inductor's own run-to-run variation, not a property of the
graphs aotkit produced.

Usage:
  uv run --group bench python tools/bench/inductor_graphs.py --models micro_pointwise,mobilenetv3
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
os.environ.setdefault("AOTKIT_CACHE", "0")

import argparse  # noqa: E402
import collections  # noqa: E402
from typing import Any  # noqa: E402

import aotkit  # noqa: E402, F401  (registers aotkit_inductor)
import torch  # noqa: E402
import torch._inductor.compile_fx as compile_fx  # noqa: E402
import zoo  # noqa: E402


def compiled_graphs(model: str, backend: str) -> list[torch.fx.GraphModule]:
    """The graphs Inductor compiles for one training step of ``model`` under ``backend``."""
    seen: list[torch.fx.GraphModule] = []
    real = compile_fx._compile_fx_inner

    def spy(gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        seen.append(gm)
        return real(gm, example_inputs, **kwargs)

    compile_fx._compile_fx_inner = spy
    try:
        torch._dynamo.reset()
        built = zoo.build(model)
        torch.compile(built.module, backend=backend)(*built.inputs).backward()
    finally:
        compile_fx._compile_fx_inner = real
    return seen


def canonical(gm: torch.fx.GraphModule) -> list[str]:
    names = {n: f"v{i}" for i, n in enumerate(gm.graph.nodes)}
    out = []
    for n in gm.graph.nodes:
        args = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: names[a])
        out.append(f"{names[n]} = {n.op} {n.target} {args}")
    return out


def ops(gm: torch.fx.GraphModule) -> collections.Counter[str]:
    return collections.Counter(f"{n.op} {n.target}" for n in gm.graph.nodes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", default="micro_pointwise")
    args = ap.parse_args()
    for model in args.models.split(","):
        ours = compiled_graphs(model, "aotkit_inductor")
        theirs = compiled_graphs(model, "inductor")
        print(f"== {model}: {len(ours)} graphs (aotkit_inductor), {len(theirs)} (inductor)")
        for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
            ca, cb = canonical(a), canonical(b)
            line = (f"  graph {i}: nodes {len(ca)}/{len(cb)}, same ops {ops(a) == ops(b)}, "
                    f"same graph {ca == cb}")
            diff = next((k for k, (x, y) in enumerate(zip(ca, cb, strict=False)) if x != y), None)
            print(line)
            if diff is not None:
                print(f"    first difference at node {diff}:")
                print(f"      aotkit_inductor: {ca[diff][:160]}")
                print(f"      inductor:        {cb[diff][:160]}")


if __name__ == "__main__":
    main()
