"""One compilation at a time per process.

# Note [Concurrent first calls]
# Compiling is not safe from two threads at once: make_fx's tracer keeps its patcher in a
# module global of torch.fx (``CURRENT_PATCHER``), which two overlapping traces corrupt
# (the second to finish raised "CURRENT_PATCHER is None in finally block", and the first
# to finish reverted the other trace's patches), the RNG replay keys move the process's
# default generator and put it back (Note [RNG replay keys]), and the recording of
# created generators swaps ``torch.Generator`` (Note [Generators created while tracing]).
# So every compilation holds ``COMPILE_LOCK``: ``compile_flat`` (aot_function,
# aot_module, aot_module_simplified and the torch.compile backends), the export traces,
# and the backward's compile at its first call (once per entry: a second thread waiting
# for it gets the first one's result). The lock is reentrant: a compiler, a traced
# function or a lazy backward that compiles another aotkit function on the same thread
# takes it again rather than deadlocking; dynamo's own compile lock is taken before this
# one, never after (dynamo refuses to compile inside an FX trace).
# aot_function's cache takes the lock only on a miss, and looks again under it: of four
# threads making the first call of one fresh function, one compiles and the others find
# its entry when they get the lock. A hit never takes it (the hot path reads the last
# entry as one tuple, so a thread never sees one call's key with another's entry).
"""

from __future__ import annotations

import threading

COMPILE_LOCK = threading.RLock()
