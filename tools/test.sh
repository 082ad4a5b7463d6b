#!/usr/bin/env bash
# The project's one test command. Run from anywhere: bash tools/test.sh
#
#   0. uv sync --locked              the workspace venv matches uv.lock (a no-op when it does),
#                                    then its site-packages compiled to bytecode once (the
#                                    environment may set PYTHONDONTWRITEBYTECODE: without .pyc
#                                    files every test subprocess compiled torch's sources again,
#                                    ~4.5 s per `import torch`; a no-op when they are current)
#   1. pytest                        every package's tests and tests/, on 2 workers (xdist,
#                                    work stealing);
#                                    slow tests included. Exit 5 (nothing collected) fails.
#   2. mypy                          strict (from pyproject) over packages/, tests included,
#                                    and the typed scripts in tools/
#   3. lint-imports                  the import-linter contracts in pyproject
#   4. isolated installs             tools/check_isolated_installs.py: each package alone in a
#                                    fresh venv, imported, its fast tests run
#                                    (AOTKIT_ISOLATED_TESTS=fast|all|none picks which tests)
#   5. ruff                          ruff check (rules in pyproject) over packages/ and tools/
#
# Steps 1-5 all run even when one fails; the last line sums them up and the exit status is
# non-zero if any failed. Extra arguments go to pytest (step 1), e.g. -k or -x.
#
# Why "mypy packages/" and not "mypy --strict packages/": [tool.mypy] already sets
# strict = true, and --strict on the command line would also turn warn_unused_ignores back on,
# which the config turns off on purpose. Test files need no __init__.py: with
# explicit_package_bases, packages/<area>/tests/test_x.py is the module
# packages.<area>.tests.test_x, so test files in different packages may share names.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# make the ambient environment irrelevant: always the workspace venv, always Python 3.11
unset VIRTUAL_ENV
export UV_PYTHON="${UV_PYTHON:-3.11}"

if ! command -v uv >/dev/null 2>&1; then
    echo "tools/test.sh: uv is not on PATH (python3 -m pip install uv)" >&2
    exit 2
fi

names=()
results=()
times=()

step() {
    # step NAME COMMAND...: run, time and record one step
    local name="$1"
    shift
    echo
    echo "=== ${name}: $*"
    local start=$SECONDS
    "$@"
    local rc=$?
    local took=$((SECONDS - start))
    names+=("$name")
    results+=("$rc")
    times+=("$took")
    echo "=== ${name}: exit ${rc} after ${took} s"
    return "$rc"
}

total_start=$SECONDS

if ! step "sync" uv sync --locked; then
    echo
    echo "tools/test.sh: 'uv sync --locked' failed (is uv.lock up to date? run 'uv lock')"
    echo "steps: 0 passed, 1 failed"
    exit 1
fi

# See step 0: compileall writes .pyc files whatever PYTHONDONTWRITEBYTECODE says
site_packages=$(uv run --locked python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
uv run --locked python -m compileall -q -j 0 "$site_packages" packages/*/src >/dev/null 2>&1 || true

test_paths=(packages)
[[ -d tests ]] && test_paths+=(tests) # git keeps no empty folders: tests/ may be missing
# worksteal: a worker that runs out of tests takes queued ones from the other, so the
# last minutes are not one worker alone on the long fresh-process tests
step "pytest" uv run --locked python -m pytest -n 2 --dist worksteal "${test_paths[@]}" "$@"
step "mypy" uv run --locked mypy packages/ tools/check_isolated_installs.py
step "import-linter" uv run --locked lint-imports
step "isolated-installs" uv run --locked python tools/check_isolated_installs.py \
    --tests "${AOTKIT_ISOLATED_TESTS:-fast}"
step "ruff" uv run --locked ruff check packages tools

echo
echo "=== summary (total $((SECONDS - total_start)) s)"
passed=0
failed=0
for i in "${!names[@]}"; do
    [[ "${names[$i]}" == "sync" ]] && continue
    if [[ "${results[$i]}" == 0 ]]; then
        status="ok"
        passed=$((passed + 1))
    else
        status="FAILED (exit ${results[$i]})"
        failed=$((failed + 1))
    fi
    printf '    %-18s %5s s  %s\n' "${names[$i]}" "${times[$i]}" "$status"
done
echo "steps: ${passed} passed, ${failed} failed"
[[ "$failed" == 0 ]]
