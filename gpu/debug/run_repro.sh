#!/bin/bash
# Device-side: build the segv handler, then the emitted-package crash repro; logs under $OUT.
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 GEMMGEN_CACHE_DIR=/tmp/gg-cache
python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1
gcc -shared -fPIC -O0 -g gpu/debug/segv_backtrace.c -o /tmp/segv_backtrace.so
which gdb cuda-gdb > "$OUT/tools.txt" 2>&1
python3 gpu/debug/emitted_repro.py 2>&1 | tee "$OUT/repro.log"
