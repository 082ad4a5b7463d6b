"""One process of tests/test_disk_cache_inductor.py: torch.compile(backend="aotkit_inductor")
of a small MLP, a training step and an inference call, checked against eager; prints the
results and what the run did (aotkit's cache counters, Inductor's key computations and
FX-graph-cache hits) as JSON.

argv[1]: JSON ``{"aotkit": dir, "config": {inductor config name: value}, "functorch":
{functorch config name: value}, "threads": n, "dynamic": bool, "batch": n}`` (all but
"aotkit" optional; dynamic: ``torch.compile(dynamic=True)``, batch: the batch size, 5 by
default); Inductor's
cache directory comes from TORCHINDUCTOR_CACHE_DIR.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
import torch._inductor.codecache as codecache


def main(spec: dict[str, Any]) -> dict[str, Any]:
    import aotkit  # noqa: F401  (registers the backends)
    from aotkit_capture import cache_counters
    from aotkit_schemas import disk_cache_config
    from torch._dynamo.utils import counters
    from torch._inductor import config

    disk_cache_config.dir = spec["aotkit"]
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

    torch.manual_seed(0)
    mod = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    batch = spec.get("batch", 5)
    x = torch.randn(batch, 8, requires_grad=True)
    opt = torch.compile(mod, backend="aotkit_inductor", dynamic=spec.get("dynamic", False))
    out = opt(x)
    out.sum().backward()
    grads = [p.grad.clone() for p in mod.parameters()] + [x.grad.clone()]
    expected = mod(x)
    for p in mod.parameters():
        p.grad = None
    x.grad = None
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    for got, want in zip(grads, [*[p.grad for p in mod.parameters()], x.grad], strict=True):
        torch.testing.assert_close(got, want)
    with torch.no_grad():
        y = torch.randn(batch, 8)  # the same shape: a static recompile for grad mode
        inference = opt(y)
        torch.testing.assert_close(inference, mod(y))
    return {
        "out": out.tolist(),
        "grads": [g.tolist() for g in grads],
        "inference": inference.tolist(),
        "counters": dict(cache_counters),
        "fx_graph_hashes": hashes[0],
        "fxgraph_cache_hit": counters["inductor"]["fxgraph_cache_hit"],
    }


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
