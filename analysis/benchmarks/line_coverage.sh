#!/usr/bin/env bash
# Line coverage of diffsweep/ and kernels/ by the test suite, the same command for any checkout
# (issue #30: before and after a change to the tests). Every Python process the tests start is
# measured (coverage's `patch = subprocess`: the xdist workers, CLI processes, torchrun ranks, local
# jobs), except code that runs from a launch's snapshot copy (it lies outside the checkout).
#
#   bash analysis/benchmarks/line_coverage.sh CHECKOUT [PYTEST_ARGS...]
#
# CHECKOUT gets its own .venv (pip install -e '.[test]' coverage); the result is the last line
# of `coverage report` (TOTAL), and CHECKOUT/coverage.txt the whole report. PYTEST_ARGS default to
# `-m "not slurm"` (no Slurm cluster needed; give the same ones before and after).
set -euo pipefail
checkout="$(cd "$1" && pwd)"
shift
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-m "not slurm")
cd "$checkout"
[ -x .venv/bin/python ] || python3 -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
pip install -q torch==2.13.0 -e '.[test]' coverage >/dev/null
[ -n "$(ls data/sources 2>/dev/null)" ] || diffsweep data fetch-demo >/dev/null
cat > .coveragerc <<EOF
[run]
source = $checkout/diffsweep, $checkout/kernels
parallel = true
patch = subprocess
data_file = $checkout/.coverage
EOF
rm -f .coverage .coverage.*
export COVERAGE_RCFILE="$checkout/.coveragerc" TORCHINDUCTOR_CACHE_DIR="$checkout/.inductor"
set +e
coverage run -m pytest -n 3 --dist loadgroup -q -p no:cacheprovider --basetemp="$checkout/.pytest-tmp" "${args[@]}" \
    > "$checkout/coverage-pytest.log" 2>&1
echo "pytest exit $? ($(tail -n 1 "$checkout/coverage-pytest.log"))"
set -e
coverage combine -q
coverage report --precision=2 > coverage.txt
tail -n 1 coverage.txt
