"""Compare the Inductor output code of aotkit_inductor and torch's inductor, per zoo model.

Deterministic, not timed: each backend compiles the model once (a training step, so the
lazy backward compiles too) while ``GraphLowering.save_output_code`` collects every
generated wrapper module. Per graph (forward, backward, in compile order) it counts what
the steady step executes: C++ kernels called, extern calls (``extern_kernels.*``), ATen
fallbacks (``torch.ops.*``), buffers allocated (``empty_strided``), ``reinterpret_tensor``
views, ``as_strided``, ``copy_``, the number of inputs and returned values. It also counts
the Python work around the compiled graphs: the autograd saved tensors of one step and
their layouts (saved tensors hooks).

    uv run --group bench python tools/bench/inductor_code.py --models resnet18,micro_convnet
    uv run --group bench python tools/bench/inductor_code.py --models resnet18 --dump /tmp/rc

``--dump DIR`` writes every output code to ``DIR/<model>.<backend>.<n>.py`` for a diff, and
the FX graph Inductor got for it (``_compile_fx_inner``'s input, with shapes and strides) to
``DIR/<model>.<backend>.<n>.fx.txt``: which values each partition saves and recomputes.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
import zoo  # noqa: E402  (sets the cache environment before torch is imported)

_COUNTS = {
    "kernels": re.compile(r"^\s+cpp_fused_\w+\(", re.M),
    "extern": re.compile(r"\bextern_kernels\.\w+\(", re.M),
    "aten_fallback": re.compile(r"\btorch\.ops\.\w+\.\w+\.\w+\(", re.M),
    "alloc": re.compile(r"\bempty_strided_cpu\(|\bempty_strided\(", re.M),
    "reinterpret": re.compile(r"\breinterpret_tensor\(", re.M),
    "as_strided": re.compile(r"\.as_strided\(", re.M),
    "copy_": re.compile(r"\.copy_\(", re.M),
    "del": re.compile(r"^\s+del ", re.M),
}


def _call_body(code: str) -> str:
    start = code.find("def call(")
    if start < 0:
        start = code.find("def call_")
    end = code.find("\ndef benchmark_compiled_module", start)
    return code[start:end if end > 0 else None]


def summarize(code: str) -> dict[str, Any]:
    body = _call_body(code)
    out: dict[str, Any] = {k: len(rx.findall(body)) for k, rx in _COUNTS.items()}
    m = re.search(r"^\s+(\w+(?:, \w+)*),? = args\n", body, re.M)
    out["inputs"] = len(m.group(1).split(", ")) if m else -1
    m = re.search(r"^\s+return \((.*)\)\s*$", body, re.M)
    out["outputs"] = len([x for x in m.group(1).split(", ") if x.strip()]) if m else -1
    out["externs"] = Counter(re.findall(r"\bextern_kernels\.(\w+)\(", body))
    out["fallbacks"] = Counter(re.findall(r"\btorch\.ops\.(\w+\.\w+\.\w+)\(", body))
    out["lines"] = body.count("\n")
    return out


GRAPHS: list[str] = []  # the FX graphs of the last capture(), in compile order


def capture(name: str, backend: Any) -> tuple[list[str], list[tuple[tuple[int, ...], tuple[int, ...], str]]]:
    import torch._inductor.compile_fx as compile_fx
    from torch._inductor.graph import GraphLowering

    codes: list[str] = []
    saved = GraphLowering.save_output_code
    inner = compile_fx._compile_fx_inner
    GRAPHS.clear()

    def recording_inner(gm: torch.fx.GraphModule, *a: Any, **kw: Any) -> Any:
        GRAPHS.append(gm.print_readable(print_output=False, include_stride=True))
        return inner(gm, *a, **kw)

    GraphLowering.save_output_code = codes.append  # type: ignore[assignment]
    compile_fx._compile_fx_inner = recording_inner  # type: ignore[assignment]
    try:
        torch._dynamo.reset()
        t = zoo.make_trainer(name, backend)
        t.step()
    finally:
        GraphLowering.save_output_code = saved  # type: ignore[assignment]
        compile_fx._compile_fx_inner = inner  # type: ignore[assignment]
    layouts: list[tuple[tuple[int, ...], tuple[int, ...], str]] = []
    resident = {x.untyped_storage().data_ptr() for x in t.built.resident}

    def pack(x: torch.Tensor) -> torch.Tensor:
        if x.untyped_storage().data_ptr() not in resident:
            layouts.append((tuple(x.shape), tuple(x.stride()), str(x.dtype).removeprefix("torch.")))
        return x

    t.opt.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        loss = t.fn(*t.built.inputs)
    loss.backward()
    return codes, layouts


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet18")
    p.add_argument("--backends", default="aotkit_inductor,inductor")
    p.add_argument("--dump", default=None, help="write each output code into this folder")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    backends = {"aotkit_inductor": "aotkit_inductor", "inductor": "inductor"}
    kinds = args.backends.split(",")
    for name in args.models.split(","):
        results = {}
        for kind in kinds:
            codes, layouts = capture(name, backends.get(kind, kind))
            results[kind] = (codes, layouts)
            if args.dump:
                os.makedirs(args.dump, exist_ok=True)
                for i, c in enumerate(codes):
                    Path(args.dump, f"{name}.{kind}.{i}.py").write_text(c)
                for i, g in enumerate(GRAPHS):
                    Path(args.dump, f"{name}.{kind}.{i}.fx.txt").write_text(g)
        print(f"== {name}")
        n = max(len(r[0]) for r in results.values())
        for i in range(n):
            sums = {k: summarize(r[0][i]) if i < len(r[0]) else None for k, r in results.items()}
            print(f"  graph {i}:")
            keys = [k for k in next(s for s in sums.values() if s) if not isinstance(next(s for s in sums.values() if s)[k], Counter)]
            for key in keys:
                vals = [str(s[key]) if s else "-" for s in sums.values()]
                mark = "" if len(set(vals)) == 1 else "   <-- differs"
                print(f"    {key:14s} " + " ".join(f"{v:>8s}" for v in vals) + mark)
            for key in ("externs", "fallbacks"):
                cs = [s[key] if s else Counter() for s in sums.values()]
                if len(cs) == 2 and cs[0] != cs[1]:
                    print(f"    {key} ours-theirs: {dict(cs[0] - cs[1])}  theirs-ours: {dict(cs[1] - cs[0])}")
        lays = [Counter(r[1]) for r in results.values()]
        print("  saved tensors: " + " ".join(str(len(r[1])) for r in results.values()))
        if len(lays) == 2 and lays[0] != lays[1]:
            print(f"    ours-theirs: {dict(lays[0] - lays[1])}")
            print(f"    theirs-ours: {dict(lays[1] - lays[0])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
