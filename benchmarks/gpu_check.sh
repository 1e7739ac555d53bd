#!/usr/bin/env bash
# The GPU check of the course, in one go on one CUDA machine (an H100/H200-class GPU, Python 3.12,
# torch, transformers and pytest installed): tests/test_cuda.py, the timing notebooks (01, 04, 05,
# 06, 07, 08) under strict nbval, and benchmarks/bench_gpu.py --quick, each under its own time limit
# (9 minutes in all at most, so that one 10-minute command holds it), with a log per part and one summary.
#
#   benchmarks/gpu_check.sh [LOG_DIR]            run it (LOG_DIR: default $OUT, else ./gpu_check_out)
#   benchmarks/gpu_check.sh --fetch-wheels       on a machine with pip and the network: put the wheels of
#                                                nbval, ipykernel, nbclient, ipywidgets and what they need
#                                                (for CPython 3.12 on x86-64 Linux) in .whl/
#
# A GPU machine without those packages gets them from .whl/ (installed into /tmp/site, on PYTHONPATH
# for the tests and the notebooks' kernels), so .whl/ must travel with the checkout.
# Exit status: 0 when every part passed within its limit, 1 otherwise.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1

# name==version, as in the course's own environment (CPython 3.12, manylinux x86-64 where compiled).
WHEELS=(nbval==0.11.0 nbformat==5.11.1 nbclient==0.11.0 jupyter_client==8.10.0 jupyter_core==5.9.1
        ipykernel==7.4.0 ipython==9.18.1 ipython_pygments_lexers==1.1.1 traitlets==5.16.1 tornado==6.6.1
        pyzmq==27.3.0 comm==0.2.3 debugpy==1.8.22 matplotlib-inline==0.2.2 nest-asyncio2==1.7.4
        platformdirs==4.14.8 fastjsonschema==2.22.3 jsonschema==4.26.0 jsonschema-specifications==2025.9.1
        referencing==0.37.0 rpds-py==2026.9.1 jedi==0.20.1 parso==0.8.7 prompt_toolkit==3.0.53 wcwidth==0.9.4
        pexpect==4.9.0 ptyprocess==0.7.0 stack_data==0.6.3 asttokens==3.0.2 executing==2.3.0 pure_eval==0.2.4
        ipywidgets==8.1.9 widgetsnbextension==4.0.16 jupyterlab_widgets==3.0.17)

if [ "${1:-}" = "--fetch-wheels" ]; then
    EXCLUDE="$(git rev-parse --git-common-dir)/info/exclude"  # in a worktree too: .whl/ is never committed
    grep -qx '/.whl/' "$EXCLUDE" 2>/dev/null || echo '/.whl/' >> "$EXCLUDE"
    PY="${PYTHON:-python3}"
    exec "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl "${WHEELS[@]}"
fi

LOGS="${1:-${OUT:-$ROOT/gpu_check_out}}"
mkdir -p "$LOGS"
SUMMARY="$LOGS/summary.txt"
: > "$SUMMARY"
START=$(date +%s)
say() { echo "$*" | tee -a "$SUMMARY"; }

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl > "$LOGS/pip.log" 2>&1 || { say "wheel install failed: see pip.log"; exit 1; }
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
say "machine: $(python3 -c 'import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA")'), python $(python3 -c 'import platform; print(platform.python_version())'), torch $(python3 -c 'import torch; print(torch.__version__)')"
python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || { say "no CUDA GPU: nothing to check"; exit 1; }

FAILED=0
part() {  # part NAME LIMIT_S COMMAND...: run one part under its limit, log it, record its verdict
    local name=$1 limit=$2; shift 2
    local t0=$(date +%s)
    timeout --signal=INT --kill-after=15 "$limit" "$@" > "$LOGS/$name.log" 2>&1
    local rc=$? spent=$(( $(date +%s) - t0 ))
    local verdict=passed
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then verdict="STOPPED at its ${limit} s limit"; elif [ $rc -ne 0 ]; then verdict="FAILED (exit $rc)"; fi
    [ "$verdict" = passed ] || FAILED=$((FAILED + 1))
    say "$name: $verdict in ${spent} s; last line: $(grep -v '^\s*$' "$LOGS/$name.log" | tail -n 1)"
}

part test_cuda 150 python3 -m pytest tests/test_cuda.py -q -p no:cacheprovider -o addopts="" -rfEs
part notebooks 240 python3 -m pytest --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg \
    -q -p no:cacheprovider -o addopts="" notebooks/01_decode_is_memory_bound.ipynb notebooks/04_gpt2_pair.ipynb \
    notebooks/05_choosing_a_draft.ipynb notebooks/06_tree_verification.ipynb \
    notebooks/07_when_speculation_hurts.ipynb notebooks/08_pitfalls_and_practice.ipynb
part bench_gpu 150 python3 benchmarks/bench_gpu.py --quick --out "$LOGS/bench_gpu.json"

TOTAL=$(( $(date +%s) - START ))
if [ $FAILED -eq 0 ] && [ $TOTAL -le 900 ]; then V=met; else V="NOT met"; fi
say "[$V] test_cuda, the timing notebooks under strict nbval and bench_gpu.py --quick in one script within 15 minutes: $FAILED failed part(s), ${TOTAL} s"
grep -E '^\[(met|NOT met|not measured)\]' "$LOGS/bench_gpu.log" >> "$SUMMARY" 2>/dev/null
[ $FAILED -eq 0 ]
