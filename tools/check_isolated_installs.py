"""Check that every workspace package installs, imports and tests on its own.

For each ``packages/<area>`` this creates a fresh virtual environment (``uv venv``), installs
into it the package itself with all its extras, the workspace packages it declares
(transitively, read from the ``pyproject.toml`` files) and pytest, all as built wheels with
``--no-sources``, so that an undeclared dependency on a sibling package cannot be satisfied
by accident. Versions of
third-party packages are pinned to ``uv.lock`` (exported as constraints), and uv's cache
makes the torch install a matter of seconds. Then it

1. imports the package and every module in it (``pkgutil.walk_packages``), checking that
   they come from the venv, not from the source tree, and that ``py.typed`` was installed;
2. runs the package's own tests (``packages/<area>/tests``), by default only those not
   marked ``slow``: the full suite already runs in the workspace (tools/test.sh step 2), this
   run is about declared dependencies. Test modules that import hypothesis, scipy or numpy
   get those installed too.

Usage: python tools/check_isolated_installs.py [--tests fast|all|none] [--jobs N]
       [--keep] [AREA ...]
Exit status: 0 when every package passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parent.parent
PACKAGES_DIR = ROOT / "packages"
PYTHON_VERSION = "3.11"
TEST_TIMEOUT_S = 900
# third-party modules that test files may import beyond the package's own dependencies,
# mapped to their distribution names (all are in the workspace's dev group)
TEST_EXTRAS = {"hypothesis": "hypothesis", "scipy": "scipy", "numpy": "numpy"}

TestsMode = Literal["fast", "all", "none"]


def normalize(name: str) -> str:
    """PEP 503 normalized distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise ValueError(f"cannot read a distribution name from {requirement!r}")
    return normalize(match.group(1))


@dataclass(frozen=True)
class Package:
    area: str
    path: Path
    dist: str
    import_name: str
    # workspace distributions this one declares directly
    workspace_deps: tuple[str, ...]
    # names of its optional-dependency groups ([project.optional-dependencies])
    extras: tuple[str, ...] = ()
    # workspace distributions that only its extras declare (e.g. a ``testing`` extra that
    # brings the sibling packages its own tests compile with)
    extra_workspace_deps: tuple[str, ...] = ()

    def requirement(self, with_extras: bool) -> str:
        """A PEP 508 direct reference to the package's directory, optionally with all extras."""
        extras = f"[{','.join(self.extras)}]" if with_extras and self.extras else ""
        return f"{self.dist}{extras} @ {self.path.as_uri()}"


@dataclass
class Result:
    package: Package
    ok: bool = True
    problems: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    tests_summary: str = ""
    log: list[str] = field(default_factory=list)

    def fail(self, problem: str) -> None:
        self.ok = False
        self.problems.append(problem)


def discover_packages() -> dict[str, Package]:
    """Workspace packages by distribution name."""
    raw: dict[str, tuple[Path, dict[str, Any]]] = {}
    for pyproject in sorted(PACKAGES_DIR.glob("*/pyproject.toml")):
        data = tomllib.loads(pyproject.read_text())
        raw[normalize(data["project"]["name"])] = (pyproject.parent, data)
    packages: dict[str, Package] = {}
    for dist, (path, data) in raw.items():
        deps = [requirement_name(r) for r in data["project"].get("dependencies", [])]
        optional = data["project"].get("optional-dependencies", {})
        extra_deps = {requirement_name(r) for group in optional.values() for r in group}
        packages[dist] = Package(
            area=path.name,
            path=path,
            dist=dist,
            import_name=import_name_of(path, data),
            workspace_deps=tuple(d for d in deps if d in raw),
            extras=tuple(sorted(optional)),
            extra_workspace_deps=tuple(sorted(d for d in extra_deps if d in raw)),
        )
    return packages


def import_name_of(path: Path, data: dict[str, Any]) -> str:
    """The top-level module the wheel installs (hatch's wheel ``packages`` setting)."""
    try:
        wheel = data["tool"]["hatch"]["build"]["targets"]["wheel"]
        return Path(wheel["packages"][0]).name
    except (KeyError, IndexError, TypeError):
        return normalize(data["project"]["name"]).replace("-", "_")


def workspace_closure(
    dist: str, packages: dict[str, Package], *, with_extras: bool = False
) -> list[Package]:
    """``dist`` and every workspace package it needs, dependencies first; with
    ``with_extras``, also those that ``dist``'s own extras declare."""
    order: list[Package] = []
    seen: set[str] = set()

    def visit(name: str, stack: tuple[str, ...]) -> None:
        if name in stack:
            raise ValueError(f"dependency cycle: {' -> '.join((*stack, name))}")
        if name in seen:
            return
        for dep in packages[name].workspace_deps:
            visit(dep, (*stack, name))
        seen.add(name)
        order.append(packages[name])

    if with_extras:
        for dep in packages[dist].extra_workspace_deps:
            visit(dep, ())
    visit(dist, ())
    return order


def topological_order(packages: dict[str, Package]) -> list[Package]:
    order: list[Package] = []
    for dist in sorted(packages):
        for package in workspace_closure(dist, packages):
            if package not in order:
                order.append(package)
    return order


def test_extras(tests_dir: Path) -> list[str]:
    """Distributions from TEST_EXTRAS that the test files import."""
    needed: set[str] = set()
    for path in tests_dir.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top in TEST_EXTRAS:
                    needed.add(TEST_EXTRAS[top])
    return sorted(needed)


def run(cmd: Sequence[str | Path], result: Result, *, cwd: Path, timeout: float) -> tuple[int, str]:
    """Run a command, keep its output in the result's log; (exit code, stdout).

    A command that times out counts as exit code -1.
    """
    shown = " ".join("<script>" if "\n" in str(c) else str(c) for c in cmd)
    try:
        proc = subprocess.run(
            [str(c) for c in cmd],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        result.log.append(f"$ {shown}\n(timed out after {timeout:.0f} s)")
        return -1, ""
    result.log.append(f"$ {shown}\n{proc.stdout}{proc.stderr}".rstrip())
    return proc.returncode, proc.stdout


IMPORT_CHECK = """
import importlib, pathlib, pkgutil, sys
name, venv = sys.argv[1], pathlib.Path(sys.argv[2]).resolve()
top = importlib.import_module(name)
where = pathlib.Path(top.__file__).resolve()
if venv not in where.parents:
    sys.exit(f"{name} was imported from {where}, not from the isolated venv {venv}")
if not (where.parent / "py.typed").is_file():
    sys.exit(f"{name} was installed without py.typed")
count = 1
for info in pkgutil.walk_packages(top.__path__, prefix=name + "."):
    importlib.import_module(info.name)
    count += 1
print(f"imported {count} modules of {name}")
"""


def check_package(
    package: Package,
    packages: dict[str, Package],
    constraints: Path,
    work_dir: Path,
    tests: TestsMode,
) -> Result:
    result = Result(package)
    venv = work_dir / package.area
    python = venv / "bin" / "python"
    uv = shutil.which("uv") or "uv"

    start = time.perf_counter()
    code, _ = run(
        [uv, "venv", "-q", "--python", PYTHON_VERSION, venv], result, cwd=work_dir, timeout=300
    )
    if code != 0:
        result.fail("could not create a venv")
        return result
    tests_dir = package.path / "tests"
    has_tests = tests != "none" and tests_dir.is_dir() and any(tests_dir.rglob("test_*.py"))
    extras = ["pytest", *test_extras(tests_dir)] if has_tests else []
    closure = workspace_closure(package.dist, packages, with_extras=True)
    install: list[str | Path] = [uv, "pip", "install", "-q", "--python", python, "--no-sources"]
    # the package under test with all its extras (its tests may exercise them), its
    # workspace dependencies as plain requirements
    requirements = [p.requirement(with_extras=p is package) for p in closure]
    install += ["-c", constraints, *requirements, *extras]
    code, _ = run(install, result, cwd=work_dir, timeout=900)
    result.timings["install"] = time.perf_counter() - start
    if code != 0:
        result.fail("install failed (an undeclared or unresolvable dependency?)")
        return result

    start = time.perf_counter()
    code, _ = run(
        [python, "-c", IMPORT_CHECK, package.import_name, venv], result, cwd=work_dir, timeout=300
    )
    result.timings["import"] = time.perf_counter() - start
    if code != 0:
        result.fail(f"import {package.import_name} failed")
        return result

    if not has_tests:
        result.tests_summary = "no tests" if tests != "none" else "tests not run"
        return result
    start = time.perf_counter()
    cmd: list[str | Path] = [
        python, "-m", "pytest", tests_dir,
        "-c", ROOT / "pyproject.toml", "--rootdir", ROOT, "-p", "no:cacheprovider",
    ]  # fmt: skip
    if tests == "fast":
        cmd += ["-m", "not slow"]
    returncode, stdout = run(cmd, result, cwd=work_dir, timeout=TEST_TIMEOUT_S)
    result.timings["tests"] = time.perf_counter() - start
    lines = [line for line in stdout.splitlines() if line.strip()]
    result.tests_summary = lines[-1].strip("= ") if lines else "(no output)"
    if returncode == 5:
        # nothing collected: a placeholder package, or only slow tests in fast mode
        result.tests_summary = "no tests collected"
    elif returncode != 0:
        result.fail(f"tests failed (pytest exit {returncode})")
    return result


def export_constraints(path: Path) -> None:
    subprocess.run(
        [
            "uv",
            "export",
            "--locked",
            "--no-emit-workspace",
            "--no-hashes",
            "--all-groups",
            "--no-header",
            "--no-annotate",
            "--format",
            "requirements-txt",
            "-q",
            "-o",
            path,
        ],  # fmt: skip
        cwd=ROOT,
        check=True,
        stdin=subprocess.DEVNULL,
    )


def print_report(results: Iterable[Result], verbose: bool) -> None:
    for r in results:
        status = "PASS" if r.ok else "FAIL"
        times = "  ".join(f"{k} {v:5.1f}s" for k, v in r.timings.items())
        print(f"{status}  {r.package.dist:<22} {times:<40} {r.tests_summary}")
        for problem in r.problems:
            print(f"      -> {problem}")
        if verbose or not r.ok:
            for entry in r.log:
                print("      | " + entry.replace("\n", "\n      | "))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("areas", nargs="*", help="packages/<area> to check (default: all)")
    parser.add_argument(
        "--tests",
        choices=["fast", "all", "none"],
        default="fast",
        help="which tests to run in each venv (default: fast, i.e. -m 'not slow')",
    )
    parser.add_argument("--jobs", type=int, default=2, help="packages checked in parallel")
    parser.add_argument("--keep", action="store_true", help="keep the venvs and print where")
    parser.add_argument("--verbose", action="store_true", help="print every command's output")
    args = parser.parse_args(argv)

    packages = discover_packages()
    order = topological_order(packages)
    if args.areas:
        unknown = set(args.areas) - {p.area for p in order}
        if unknown:
            parser.error(f"unknown areas: {sorted(unknown)}")
        order = [p for p in order if p.area in args.areas]

    total_start = time.perf_counter()
    work_dir = Path(tempfile.mkdtemp(prefix="aotkit-isolated-"))
    try:
        constraints = work_dir / "constraints.txt"
        export_constraints(constraints)
        print(
            f"checking {len(order)} packages in isolated venvs under {work_dir} "
            f"(tests: {args.tests}, jobs: {args.jobs}): {', '.join(p.area for p in order)}",
            flush=True,
        )
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = [
                pool.submit(check_package, p, packages, constraints, work_dir, args.tests)
                for p in order
            ]
            results = [f.result() for f in futures]
        print_report(results, args.verbose)
    finally:
        if args.keep:
            print(f"venvs kept in {work_dir}")
        else:
            shutil.rmtree(work_dir, ignore_errors=True)

    failed = [r.package.area for r in results if not r.ok]
    elapsed = time.perf_counter() - total_start
    if failed:
        print(
            f"isolated installs: {len(failed)} of {len(results)} packages FAILED "
            f"({', '.join(failed)}) in {elapsed:.0f} s"
        )
        return 1
    print(f"isolated installs: all {len(results)} packages passed in {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
