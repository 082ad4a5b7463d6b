"""Running a compiled training call whose graphs carry inlined saved-tensors hooks.

# Note [Inlined saved-tensors hooks at run time]
# When the innermost ``torch.autograd.graph.saved_tensors_hooks`` at compile time are two
# ``torch.fx.GraphModule``s, capture inlines them into the graphs (See Note [Inlined
# saved-tensors hooks] in aotkit_capture): the forward already returns packed values and
# the backward unpacks them. The hooks are still on autograd's stack on the caller's side,
# so the generated autograd.Function's ``save_for_backward`` would pack the packed values
# a second time. As torch does, the whole call runs with the default hooks disabled
# (``_saved_tensors_hooks_disable``, which also makes pushing new hooks inside the call an
# error), and the previous disabled state is put back afterwards. That holds for every
# program compiled under inlineable hooks, also when the filtering mode left nothing to
# inline: the hooks then apply to nothing, as in torch.
#
# The graphs are only right under the hooks they were compiled with. aot_function and
# aot_module key their caches on them (See Note [Ambient state in the compile key]) and
# dynamo guards on them, so a call under other hooks recompiles; a callable from
# ``aot_module_simplified`` called directly has no cache, so each call checks that the
# innermost hooks are the very objects of compile time and raises otherwise, rather than
# apply stale hooks in silence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

_autograd: Any = torch._C._autograd

_DISABLED_MESSAGE = (
    "aotkit: saved tensors hooks that are torch.fx.GraphModules were inlined into the "
    "compiled forward and backward graphs, and are disabled while the compiled region "
    "runs. Pushing saved tensors hooks inside a compiled region is not supported; enter "
    "them around the call instead (other hooks cause a recompilation)."
)


def stale_hooks_message(current: Any) -> str:
    """The error of a call under other hooks than the compiled graphs inlined."""
    now = "no saved tensors hooks" if current is None else (
        f"saved tensors hooks ({type(current[0]).__name__}, {type(current[1]).__name__}) "
        "that are not the compiled ones"
    )
    return (
        "aotkit: this compiled function was compiled under saved tensors hooks that are "
        "torch.fx.GraphModules, and inlined them into its graphs; it is now called with "
        f"{now}. Reusing the graphs would apply the wrong hooks. Compile again under the "
        "hooks in force at the call (aot_function/aot_module and torch.compile recompile "
        "by themselves), or call it under the same hook objects."
    )


def with_inlined_saved_tensors_hooks(
    call: Callable[[list[Any]], Sequence[Any]], pack: Any, unpack: Any
) -> Callable[[list[Any]], Sequence[Any]]:
    """``call`` run with autograd's saved-tensors hooks disabled, after checking that the
    innermost hooks are ``pack``/``unpack``. See Note [Inlined saved-tensors hooks at run
    time]."""
    top = _autograd._top_saved_tensors_default_hooks
    get_message = _autograd._saved_tensors_hooks_get_disabled_error_message
    disable = _autograd._saved_tensors_hooks_disable
    enable = _autograd._saved_tensors_hooks_enable

    def run_without_hooks(args: list[Any]) -> Sequence[Any]:
        current = top(True)
        if current is None or current[0] is not pack or current[1] is not unpack:
            raise RuntimeError(stale_hooks_message(current))
        previous = get_message()
        disable(_DISABLED_MESSAGE, False)
        try:
            return call(args)
        finally:
            if previous is None:
                enable()
            else:
                disable(previous, False)

    return run_without_hooks
