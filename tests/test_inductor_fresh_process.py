"""aotkit_inductor as the first Inductor user of a fresh process.

Inductor's decompositions read ``torch._inductor.lowering`` as an attribute (its
max_pool2d_with_indices decomposition does), which Inductor's own compile path imports
before it traces. A process whose first compilation was aotkit_inductor's trace of a
max-pooling model raised "module 'torch._inductor' has no attribute 'lowering'" (found
by the zoo benchmark running timm's resnet18 first).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from aotkit_backends import inductor_unavailable_reason

pytestmark = pytest.mark.skipif(
    inductor_unavailable_reason() is not None, reason=str(inductor_unavailable_reason())
)

_PROGRAM = textwrap.dedent(
    """
    import sys
    import torch
    import torch.nn as nn
    import aotkit

    assert "torch._inductor.lowering" not in sys.modules
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.MaxPool2d(3, 2, 1), nn.Flatten(), nn.LazyLinear(2))
    x = torch.randn(2, 3, 12, 12)
    model(x)
    eager = [p.detach().clone() for p in model.parameters()]
    model(x).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model, backend="aotkit_inductor")
    compiled(x).sum().backward()
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-5)
    print("ok")
    """
)


def test_aotkit_inductor_traces_max_pool_first_in_a_fresh_process(tmp_path: object) -> None:
    env = dict(os.environ, AOTKIT_CACHE="0", TORCHINDUCTOR_CACHE_DIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")


def test_inductor_decompositions_import_lowering_in_a_fresh_process() -> None:
    """The one helper both aotkit_inductor's trace and inductor_compiler's retrace use."""
    program = (
        "import sys, torch\n"
        "from aotkit_backends import inductor_decompositions\n"
        "assert 'torch._inductor.lowering' not in sys.modules\n"
        "table = inductor_decompositions()\n"
        "assert 'torch._inductor.lowering' in sys.modules\n"
        "assert torch.ops.aten.max_pool2d_with_indices.default in table\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")
