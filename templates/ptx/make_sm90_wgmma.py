"""Writes sm90_wgmma.cuh: the wgmma.mma_async wrappers, whose operand lists are too long to type."""

import os

NS = (64, 128, 192, 256)  # every N a shipped tile uses (BN of one consumer warpgroup)
out = []
out.append('''// wgmma.mma_async wrappers, one per N the sm90 templates use: D(64xN, fp32) (+)= A(64x16) * B(16xN),
// A and B from shared-memory matrix descriptors.
// PTX ISA §9.7.15 "Asynchronous Warpgroup Level Matrix Multiply-Accumulate: wgmma.mma_async".
//
// The operand lists are long (N/2 accumulators per thread), so this file is written out by
// templates/ptx/make_sm90_wgmma.py: edit the pattern there and run it. The pattern is the same for
// every N: "+f" accumulators, two descriptors, a predicate that zeroes D when scale_d == 0 (the first
// k step of a tile), then the immediate scale-a, scale-b (1: no negation) and transpose flags
// (0: K-major in shared memory, 1: M- or N-major).
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace gemmgen {
namespace ptx {

// PTX ISA §9.7.15 "Asynchronous Warpgroup Level Matrix Multiply-Accumulate: wgmma.mma_async".
template <int N, typename T, int TRANS_A, int TRANS_B>
struct Wgmma;
''')
for n in NS:
    regs = n // 2
    # (C++ type, PTX type, k per instruction, whether it takes transpose immediates): tf32 reads both operands
    # K-major only (PTX ISA: the transpose immediates are for .f16/.bf16), so it is specialized for 0, 0.
    for tname, ptx, k, trans in (("__half", "f16", 16, True), ("__nv_bfloat16", "bf16", 16, True),
                                 ("float", "tf32", 8, False)):
        dl = ", ".join(f"%{i}" for i in range(regs))
        body = []
        body.append('// PTX ISA §9.7.15 "Asynchronous Warpgroup Level Matrix Multiply-Accumulate: wgmma.mma_async".')
        if trans:
            body.append("template <int TRANS_A, int TRANS_B>")
            body.append(f"struct Wgmma<{n}, {tname}, TRANS_A, TRANS_B> {{")
        else:
            body.append("template <>")
            body.append(f"struct Wgmma<{n}, {tname}, 0, 0> {{")
        body.append(f"  static constexpr int kAccum = {regs};")
        body.append(f"  __device__ __forceinline__ static void run(float (&d)[{regs}], uint64_t desc_a, uint64_t desc_b, int scale_d) {{")
        body.append("    asm volatile(")
        body.append('        "{\\n"')
        body.append('        ".reg .pred p;\\n"')
        body.append(f'        "setp.ne.b32 p, %{regs + 2}, 0;\\n"')
        # split the register list over lines of 16
        body.append(f'        "wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{ptx}.{ptx} "')
        chunks = [list(range(i, min(i + 16, regs))) for i in range(0, regs, 16)]
        for ci, chunk in enumerate(chunks):
            s = ", ".join(f"%{i}" for i in chunk)
            pre = "{" if ci == 0 else ""
            post = "}, " if ci == len(chunks) - 1 else ", "
            body.append(f'        "{pre}{s}{post}"')
        tail = f", %{regs + 3}, %{regs + 4}" if trans else ""
        body.append(f'        "%{regs}, %{regs + 1}, p, 1, 1{tail};\\n"')
        body.append('        "}\\n"')
        outs = []
        for i in range(0, regs, 8):
            outs.append(", ".join(f'"+f"(d[{j}])' for j in range(i, min(i + 8, regs))))
        body.append("        : " + (",\n          ".join(outs)))
        immediates = ', "n"(TRANS_A), "n"(TRANS_B)' if trans else ""
        body.append(f'        : "l"(desc_a), "l"(desc_b), "r"(scale_d){immediates});')
        body.append("  }")
        body.append("};")
        body.append("")
        out.append("\n".join(body))
out.append('''}  // namespace ptx
}  // namespace gemmgen
''')
open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "sm90_wgmma.cuh"), "w").write("\n".join(out))
