"""Debug aid (device side, never committed into a kernel by default): rewrite templates/sm90/launch.cuh and
templates/common/launch.cuh in place so that every error return prints its line, the error, the tensor
maps' addresses modulo 64 and any error already pending in the thread before the launch began.

    python3 gpu/debug/trace_launch_errors.py && python3 -m pytest ...   (then git checkout templates/)
"""
from pathlib import Path
import re

ROOT = Path(__file__).resolve().parents[2]
TRACE = ('{ fprintf(stderr, "[trace] %s:%d error %d (%s)\\n", __FILE__, __LINE__, (int)(E), '
         'cudaGetErrorString((cudaError_t)(E))); }')


def patch(path: Path) -> None:
    src = path.read_text()
    src = src.replace("#include <cstdint>", "#include <cstdint>\n#include <cstdio>", 1)
    src = src.replace("if (err != cudaSuccess) return static_cast<int>(err);",
                      "if (err != cudaSuccess) { " + TRACE.replace("(E)", "(err)") + " return static_cast<int>(err); }")
    src = src.replace("return static_cast<int>(cudaGetLastError());",
                      "{ const cudaError_t last = cudaGetLastError(); if (last != cudaSuccess) "
                      + TRACE.replace("(E)", "(last)") + " return static_cast<int>(last); }")
    # what was pending before this launch started, and where the thread's cached maps live
    src = re.sub(r"(if \(args->m <= 0 \|\| args->n <= 0\) return 0;)",
                 r'\1\n  { const cudaError_t pending = cudaPeekAtLastError(); if (pending != cudaSuccess) '
                 r'fprintf(stderr, "[trace] pending before launch: %d (%s)\\n", (int)pending, cudaGetErrorString(pending)); }',
                 src)
    src = src.replace("thread_local CachedMap map_d;",
                      "thread_local CachedMap map_d;\n  fprintf(stderr, \"[trace] maps %% 64: a %d b %d d %d\\n\", "
                      "(int)(reinterpret_cast<uintptr_t>(&map_a.map) % 64), (int)(reinterpret_cast<uintptr_t>(&map_b.map) % 64), "
                      "(int)(reinterpret_cast<uintptr_t>(&map_d.map) % 64));")
    src = src.replace("  cache.valid = res == CUDA_SUCCESS;",
                      "  if (res != CUDA_SUCCESS) fprintf(stderr, \"[trace] encode: CUresult %d base %p dims %llu x %llu "
                      "pitch %llu bytes box %d x %d elem %d\\n\", (int)res, base, (unsigned long long)dims[0], "
                      "(unsigned long long)dims[1], (unsigned long long)strides[0], BOX_INNER, BOX_OUTER, (int)sizeof(Elem));\n"
                      "  cache.valid = res == CUDA_SUCCESS;")
    path.write_text(src)
    print("patched", path, src.count("[trace]"), "trace points")


for rel in ("templates/sm90/launch.cuh", "templates/common/launch.cuh"):
    patch(ROOT / rel)
