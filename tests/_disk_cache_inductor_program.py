"""One process of tests/test_disk_cache_inductor.py: torch.compile(backend="aotkit_inductor")
of a small MLP, a training step and an inference call, checked against eager; prints the
results and what the run did (aotkit's cache counters, Inductor's key computations and
FX-graph-cache hits) as JSON.

argv[1]: JSON ``{"aotkit": dir, "config": {inductor config name: value}, "functorch":
{functorch config name: value}, "threads": n, "dynamic": bool, "batch": n, "pre_grad":
uuid}`` (all but "aotkit" optional; dynamic: ``torch.compile(dynamic=True)``, batch: the
batch size, 5 by default; model: "convnet" for three conv/batch-norm blocks instead of
the MLP; channels_last: the convnet and its input in channels-last memory format;
pre_grad: a counting ``config.pre_grad_custom_pass`` with that uuid); Inductor's cache
directory comes from TORCHINDUCTOR_CACHE_DIR, and its FX graph cache (the artifacts aotkit's
entries name by key) from AOTKIT_TEST_FXGRAPH_DIR when that is set: the tests give each run
its own FX graph cache but share the compiled kernels (the C++ sources and libraries, keyed
by their source by Inductor itself), so a graph compiled again generates its code again but
does not run the C++ compiler on a kernel an earlier process built. Also reports how often Inductor's pre-grad
passes ran (``run_pre_grad_passes``), the custom pass was called and Inductor generated
code (``fx_codegen_and_compile``: a graph compiled rather than loaded from its cache),
and the module's buffers after the calls (BatchNorm's running statistics).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch._inductor.codecache as codecache
import torch._inductor.compile_fx as compile_fx
from torch._inductor.custom_graph_pass import CustomGraphPass


class CountingPass(CustomGraphPass):
    def __init__(self, uuid: str) -> None:
        self._uuid = uuid
        self.calls = 0

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.calls += 1

    def uuid(self) -> Any:
        return self._uuid


def main(spec: dict[str, Any]) -> dict[str, Any]:
    import aotkit  # noqa: F401  (registers the backends)
    from aotkit_cache import cache_counters
    from aotkit_schemas import disk_cache_config
    from torch._dynamo.utils import counters
    from torch._inductor import config

    disk_cache_config.dir = spec["aotkit"]
    fxgraph_dir = os.environ.get("AOTKIT_TEST_FXGRAPH_DIR")
    if fxgraph_dir is not None:
        codecache.FxGraphCache._get_tmp_dir = staticmethod(  # type: ignore[method-assign]
            lambda: fxgraph_dir
        )
    for name, value in spec.get("config", {}).items():
        setattr(config, name, value)
    for name, value in spec.get("functorch", {}).items():
        setattr(torch._functorch.config, name, value)
    if "threads" in spec:
        torch.set_num_threads(spec["threads"])
    hashes = [0]
    real_hash = codecache.compiled_fx_graph_hash

    def counted_hash(*args: Any, **kwargs: Any) -> Any:
        hashes[0] += 1
        return real_hash(*args, **kwargs)

    codecache.compiled_fx_graph_hash = counted_hash  # type: ignore[assignment]
    pre_grad_runs = [0]
    real_pre_grad = compile_fx.run_pre_grad_passes

    def counted_pre_grad(*args: Any, **kwargs: Any) -> Any:
        pre_grad_runs[0] += 1
        return real_pre_grad(*args, **kwargs)

    compile_fx.run_pre_grad_passes = counted_pre_grad
    codegens = [0]
    real_codegen = compile_fx.fx_codegen_and_compile

    def counted_codegen(*args: Any, **kwargs: Any) -> Any:
        codegens[0] += 1
        return real_codegen(*args, **kwargs)

    compile_fx.fx_codegen_and_compile = counted_codegen
    custom = None
    if "pre_grad" in spec:
        custom = CountingPass(spec["pre_grad"])
        config.pre_grad_custom_pass = custom

    torch.manual_seed(0)
    batch = spec.get("batch", 5)
    if spec.get("model") == "convnet":  # convolutions: Inductor's layout optimization
        blocks: list[torch.nn.Module] = []
        for cin, cout in ((3, 16), (16, 32), (32, 64)):
            blocks += [
                torch.nn.Conv2d(cin, cout, 3, padding=1), torch.nn.BatchNorm2d(cout), torch.nn.ReLU()
            ]
        # pooled into a linear layer: a summed batch norm output has (nearly) zero gradient
        blocks += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 4)]
        mod = torch.nn.Sequential(*blocks)
        x = torch.randn(batch, 3, 32, 32)
        if spec.get("channels_last"):
            mod = mod.to(memory_format=torch.channels_last)
            x = x.to(memory_format=torch.channels_last)
        x.requires_grad_(True)
        # Inductor's convolutions and batch-norm reductions round differently from eager's
        tol: dict[str, float] = {"rtol": 1e-4, "atol": 1e-4}
    else:
        mod = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
        x = torch.randn(batch, 8, requires_grad=True)
        tol = {}
    opt = torch.compile(mod, backend="aotkit_inductor", dynamic=spec.get("dynamic", False))
    out = opt(x)
    out.sum().backward()
    grads = [p.grad.clone() for p in mod.parameters()] + [x.grad.clone()]
    buffers = [b.clone() for b in mod.buffers()]  # before eager's call updates them
    expected = mod(x)
    for p in mod.parameters():
        p.grad = None
    x.grad = None
    expected.sum().backward()
    torch.testing.assert_close(out, expected, **tol)
    for got, want in zip(grads, [*[p.grad for p in mod.parameters()], x.grad], strict=True):
        torch.testing.assert_close(got, want, **tol)
    with torch.no_grad():
        y = torch.randn_like(x)  # the same shape: a static recompile for grad mode
        inference = opt(y)
        torch.testing.assert_close(inference, mod(y), **tol)
    return {
        "out": out.tolist(),
        "grads": [g.tolist() for g in grads],
        "inference": inference.tolist(),
        "buffers": [b.tolist() for b in buffers],
        "strides": [list(out.stride()), list(x.grad.stride())],
        "counters": dict(cache_counters),
        "fx_graph_hashes": hashes[0],
        "fxgraph_cache_hit": counters["inductor"]["fxgraph_cache_hit"],
        "pre_grad_runs": pre_grad_runs[0],
        "inductor_codegens": codegens[0],
        "pre_grad_calls": None if custom is None else custom.calls,
    }


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
