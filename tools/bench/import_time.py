"""Import cost: ``python -c "import aotkit"`` against ``python -c "import torch"``.

Whole processes, as a user pays them: each round runs every statement once in a fresh
interpreter, in turn (so that load on the machine hits them alike), and the table shows the
median wall time per statement and its ratio to ``import torch``. Target (issue 12):
``import aotkit`` at most 1.3x ``import torch``. See Note [Import cost] in aotkit_frontends.

Usage: uv run python tools/bench/import_time.py [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

STATEMENTS = {
    "torch": "import torch",
    "aotkit": "import aotkit",
    "aotkit_partitioners": "import aotkit_partitioners",
    "torch aot_function": "from torch._functorch.aot_autograd import aot_function",
}


def run_once(statement: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", statement], check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="fresh processes per statement")
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in STATEMENTS}
    run_once("import torch")  # warm the file cache
    for _ in range(args.rounds):
        for name, statement in STATEMENTS.items():
            times[name].append(run_once(statement))
    base = statistics.median(times["torch"])
    print(f"{'statement':<56} {'median s':>9} {'x torch':>8}")
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"{STATEMENTS[name]:<56} {median:9.2f} {median / base:8.2f}")


if __name__ == "__main__":
    main()
