#!/bin/bash
# Device side: the order-dependent failure of test_cpp_autograd_matches_the_python_formula (stop 10's note),
# once as committed and once with every launch error traced (gpu/debug/trace_launch_errors.py); logs under $OUT.
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 GEMMGEN_CACHE_DIR=${GEMMGEN_CACHE_DIR:-/tmp/gg-cache}
python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1
ldd --version | head -1 > "$OUT/glibc.txt"
[ -n "${SKIP_UNTRACED:-}" ] || python3 -m pytest -x -q -m gpu tests/gpu/test_jit_runtime_gpu.py 2>&1 | tail -40 > "$OUT/as_committed.log"
python3 gpu/debug/trace_launch_errors.py
python3 -m pytest -x -q -s -m gpu tests/gpu/test_jit_runtime_gpu.py 2>&1 | grep -v '^\[gemmgen\]' | tail -80 > "$OUT/traced.log"; grep -B3 -A3 "encode:" "$OUT/traced.log"
git checkout templates/
tail -5 "$OUT/as_committed.log"; grep -v "maps %" "$OUT/traced.log" | grep "trace\|passed\|failed" | tail -20
