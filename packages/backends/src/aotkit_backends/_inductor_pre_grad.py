"""Inductor's pre-grad passes, run by ``aotkit_inductor`` on dynamo's graph as torch's
``inductor`` backend runs them.

# Note [Inductor pre-grad passes]
# What torch's ``inductor`` backend does (``torch/_inductor/compile_fx.py`` and
# ``torch/_functorch/aot_autograd.py`` of torch 2.15):
#   * Where: ``compile_fx`` -> ``_compile_fx_main`` hands ``run_pre_grad_passes`` to
#     ``aot_module_simplified(..., pre_grad_passes=run_pre_grad_passes)``, which calls it
#     as ``pre_grad_passes(mod, args)`` on dynamo's GraphModule itself (torch IR, before
#     functionalization; modified in place), with the example inputs dynamo passed the
#     backend (not re-fakified), only when ``mod`` is a ``GraphModule`` (never dynamo's
#     ``GmWrapper`` of a graph with list inputs).
#   * When: ``torch._inductor.codecache.resolve_pre_grad_pass_timing()``. "late" (the
#     default: no ``config.pre_grad_custom_pass``, or every custom pass a
#     ``CustomGraphPass`` with a ``uuid()``): after the parameters are read and the
#     AOTAutogradCache lookup, on a miss only, before the inputs are fakified and the
#     graph is traced; a warm hit pays nothing for them. "early"
#     (``config.pre_grad_pass_timing = "early"``, or "default" with a custom pass without
#     a uuid, which torch warns about): before anything else, on every compile, the cache
#     then keyed on the rewritten graph. "late" asked for with a uuid-less pass raises.
#   * What (``_recursive_pre_grad_passes`` -> ``fx_passes.pre_grad.pre_grad_passes``):
#     nothing when ``config.use_pre_grad_passes`` is off; subgraphs first; with
#     ``config.pattern_matcher`` (on by default): numpy-compat kwarg normalization,
#     ``fuse_fx`` (cat sinking after pointwise ops; permute fusions when
#     ``config.permute_fusion`` and not CPU; identity removal and conv-bn folding of
#     ``call_module`` conv/bn pairs only under ``config.freezing``, grad mode off, CPU
#     inputs), the split/cat normalization and the group/batch fusions named in
#     ``config.pre_grad_fusion_options`` (empty by default), the efficient conv-bn eval
#     rewrite (``config.efficient_conv_bn_eval_fx_passes``, not under freezing; eval-mode
#     batch norm after a convolution, training allowed), the Gumbel-max rewrite
#     (``config.apply_gumbel_max_trick``); ``config.is_predispatch`` runs the pre-dispatch
#     ATen variants instead. Then, pattern matcher or not, each
#     ``config.pre_grad_custom_pass`` (one or a list), a stable topological sort, the
#     quantization lift-up, lint and recompile. ``config.add_pre_grad_passes`` /
#     ``remove_pre_grad_passes`` select passes by name. Grad mode and ``is_inference`` do
#     not choose the passes (the graph is not yet split): only conv-bn folding reads grad
#     mode, and only under freezing.
#   * Around them: ``compile_fx``'s python dispatcher and ``V.fake_mode`` set to the
#     inputs' fake mode (a new one allowing real inputs when they are real).
# ``aotkit_inductor`` passes ``inductor_pre_grad_passes`` (Inductor's own pipeline,
# ``run_pre_grad_passes``, in that context: Inductor is the compiler, so calling its pass
# pipeline is using it) as ``pre_grad_passes``; aotkit's ``aot_module_simplified`` applies
# it with torch's timing against aotkit's on-disk cache (See Note [Pre-grad passes after
# the cache lookup] in aotkit_frontends). Its cache key carries Inductor's settings
# (``inductor_settings_key``: every config above, custom passes by ``uuid()``; a pass
# without one makes the compilation uncacheable), so a changed pass never reuses an entry
# made under another (See Note [Inductor settings in the on-disk cache key]).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.fx
from aotkit_schemas import mark_cache_key
from torch._guards import detect_fake_mode

from ._inductor_settings import inductor_settings_key


def inductor_pre_grad_passes(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any]
) -> torch.fx.GraphModule:
    """Run Inductor's pre-grad passes on ``gm`` (dynamo's graph, torch IR), in place, and
    return the resulting GraphModule, as torch's ``inductor`` backend does. See Note
    [Inductor pre-grad passes]. ``example_inputs``: the inputs dynamo passed the backend
    (fake or real)."""
    # imported here: Inductor takes seconds to import (See Note [Import cost])
    from torch._dispatch.python import enable_python_dispatcher
    from torch._inductor.compile_fx import run_pre_grad_passes
    from torch._inductor.virtualized import V
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake_mode = detect_fake_mode(example_inputs) or FakeTensorMode(allow_non_fake_inputs=True)
    with enable_python_dispatcher(), V.set_fake_mode(fake_mode):
        out: torch.fx.GraphModule = run_pre_grad_passes(gm, example_inputs)
    return out


# See Note [Compiler cache keys] in aotkit_schemas: what the passes do is a function of
# Inductor's config (custom passes by uuid)
mark_cache_key(inductor_pre_grad_passes, "aotkit.inductor.pre_grad/1", settings=inductor_settings_key)
