"""Writes sm90_wgmma.cuh: the wgmma.mma_async wrappers, whose operand lists are too long to type."""

import os

NS = (64, 128, 192, 256)  # every N a shipped tile uses (BN of one consumer warpgroup)
# The N tiles between them, in steps of 16, for the 16-bit and fp8 types (tiles whose N is no multiple of 64: a tile
# count that fills the SMs, as cuBLAS's 80-, 112- and 144-wide tiles and DeepGEMM's 112-160-wide fp8 tiles do;
# spec/config.py SM90_ODD_BLOCK_N).
ODD_NS = (80, 96, 112, 144, 160, 176, 208, 224, 240)
# N tiles narrower than 64, for the 16-bit types (spec/config.py SM90_NARROW_BLOCK_N): a layer of 512-1024 columns at
# 256-512 tokens fills the SMs with 64 x 16-48 tiles, as cuBLAS's 64x16, 64x24, 64x32 and 64x48 kernels do.
NARROW_NS = (16, 32, 48)
NARROW_N_TYPES = ("__half", "__nv_bfloat16")
E4M3, E5M2 = "__nv_fp8_e4m3", "__nv_fp8_e5m2"
ODD_N_TYPES = ("__half", "__nv_bfloat16", E4M3, E5M2)
# (A's C++ type, B's (None: A's), PTX types, k per instruction, whether it takes transpose immediates).
TYPES = (("__half", None, "f32.f16.f16", 16, True), ("__nv_bfloat16", None, "f32.bf16.bf16", 16, True),
         ("float", None, "f32.tf32.tf32", 8, False),
         (E4M3, None, "f32.e4m3.e4m3", 32, False), (E5M2, None, "f32.e5m2.e5m2", 32, False),
         (E4M3, E5M2, "f32.e4m3.e5m2", 32, False), (E5M2, E4M3, "f32.e5m2.e4m3", 32, False),
         ("int8_t", None, "s32.s8.s8", 32, False))
out = []
out.append('''// wgmma.mma_async wrappers, one per N the sm90 templates use and input type: D(64xN, fp32) (+)= A(64xK) *
// B(KxN), K = 32 bytes of k values (k16 for 16-bit types, k8 tf32, k32 fp8), A and B from shared-memory
// matrix descriptors.
// PTX ISA §9.7.15 "Asynchronous Warpgroup Level Matrix Multiply-Accumulate: wgmma.mma_async".
//
// The operand lists are long (N/2 accumulators per thread), so this file is written out by
// templates/ptx/make_sm90_wgmma.py: edit the pattern there and run it. The pattern is the same for
// every N: "+f" accumulators, two descriptors, a predicate that zeroes D when scale_d == 0 (the first
// k step of a tile), then the immediate scale-a, scale-b (1: no negation) and transpose flags
// (0: K-major in shared memory, 1: M- or N-major). int8 (int32 accumulators, "+r") has neither immediate.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace gemmgen {
namespace ptx {

// PTX ISA §9.7.15 "Asynchronous Warpgroup Level Matrix Multiply-Accumulate: wgmma.mma_async".
// T: A's element type; TB: B's (they differ only for the e4m3 x e5m2 mixes of fp8).
template <int N, typename T, int TRANS_A, int TRANS_B, typename TB = T>
struct Wgmma;
''')
for n in sorted(NS + ODD_NS + NARROW_NS):
    regs = n // 2
    # tf32, fp8 and int8 read both operands K-major only (PTX ISA: the transpose immediates are for .f16/.bf16),
    # so they are specialized for 0, 0. Integer wgmma has no scale-a/scale-b immediates and int32 accumulators.
    for tname, tbname, ptx, k, trans in TYPES:
        if n in ODD_NS and tname not in ODD_N_TYPES or n in NARROW_NS and tname not in NARROW_N_TYPES:
            continue
        integer = ptx.startswith("s32")
        dl = ", ".join(f"%{i}" for i in range(regs))
        body = []
        body.append('// PTX ISA §9.7.15 "Asynchronous Warpgroup Level Matrix Multiply-Accumulate: wgmma.mma_async".')
        if trans:
            body.append("template <int TRANS_A, int TRANS_B>")
            body.append(f"struct Wgmma<{n}, {tname}, TRANS_A, TRANS_B> {{")
        else:
            body.append("template <>")
            mixed = f", {tbname}" if tbname else ""
            body.append(f"struct Wgmma<{n}, {tname}, 0, 0{mixed}> {{")
        accum = "int32_t" if integer else "float"
        body.append(f"  using Accum = {accum};")
        body.append(f"  static constexpr int kAccum = {regs};")
        body.append(f"  __device__ __forceinline__ static void run({accum} (&d)[{regs}], uint64_t desc_a, uint64_t desc_b, int scale_d) {{")
        body.append("    asm volatile(")
        body.append('        "{\\n"')
        body.append('        ".reg .pred p;\\n"')
        body.append(f'        "setp.ne.b32 p, %{regs + 2}, 0;\\n"')
        # split the register list over lines of 16
        body.append(f'        "wgmma.mma_async.sync.aligned.m64n{n}k{k}.{ptx} "')
        chunks = [list(range(i, min(i + 16, regs))) for i in range(0, regs, 16)]
        for ci, chunk in enumerate(chunks):
            s = ", ".join(f"%{i}" for i in chunk)
            pre = "{" if ci == 0 else ""
            post = "}, " if ci == len(chunks) - 1 else ", "
            body.append(f'        "{pre}{s}{post}"')
        tail = f", %{regs + 3}, %{regs + 4}" if trans else ""
        scales = "" if integer else ", 1, 1"
        body.append(f'        "%{regs}, %{regs + 1}, p{scales}{tail};\\n"')
        body.append('        "}\\n"')
        outs = []
        reg, per_line = ('"+r"(d[{}])', 8) if integer else ('"+f"(d[{}])', 8)
        for i in range(0, regs, per_line):
            outs.append(", ".join(reg.format(j) for j in range(i, min(i + per_line, regs))))
        body.append("        : " + (",\n          ".join(outs)))
        immediates = ', "n"(TRANS_A), "n"(TRANS_B)' if trans else ""
        body.append(f'        : "l"(desc_a), "l"(desc_b), "r"(scale_d){immediates});')
        body.append("  }")
        body.append("};")
        body.append("")
        out.append("\n".join(body))
# tf32 with A from registers (four .b32 registers of a k8 step: a0 (row r, k c), a1 (r + 8, c), a2 (r, c + 4), a3 (r + 8,
# c + 4), r = 16 warp + lane / 4, c = lane % 4): the kernels whose A is M-major in global memory read it from shared
# memory into registers (Kernel::kARegisters) rather than transpose it there, since wgmma reads tf32 K-major only.
out.append('''// PTX ISA §9.7.15 "Asynchronous Warpgroup Level Matrix Multiply-Accumulate: wgmma.mma_async", A in registers
// (§9.7.15.5.1.1: the m64nNk8 fragment of .tf32, four .b32 registers a thread).
template <int N>
struct WgmmaTf32RegA;
''')
for n in NS:
    regs = n // 2
    body = ['// PTX ISA §9.7.15 "Asynchronous Warpgroup Level Matrix Multiply-Accumulate: wgmma.mma_async".',
            "template <>", f"struct WgmmaTf32RegA<{n}> {{", f"  static constexpr int kAccum = {regs};",
            f"  __device__ __forceinline__ static void run(float (&d)[{regs}], const uint32_t (&a)[4], uint64_t desc_b, "
            "int scale_d) {",
            "    asm volatile(", '        "{\\n"', '        ".reg .pred p;\\n"',
            f'        "setp.ne.b32 p, %{regs + 5}, 0;\\n"',
            f'        "wgmma.mma_async.sync.aligned.m64n{n}k8.f32.tf32.tf32 "']
    chunks = [list(range(i, min(i + 16, regs))) for i in range(0, regs, 16)]
    for ci, chunk in enumerate(chunks):
        pre = "{" if ci == 0 else ""
        post = "}, " if ci == len(chunks) - 1 else ", "
        body.append(f'        "{pre}{", ".join(f"%{i}" for i in chunk)}{post}"')
    body.append(f'        "{{%{regs}, %{regs + 1}, %{regs + 2}, %{regs + 3}}}, %{regs + 4}, p, 1, 1;\\n"')
    body.append('        "}\\n"')
    outs = [", ".join(f'"+f"(d[{j}])' for j in range(i, min(i + 8, regs))) for i in range(0, regs, 8)]
    body.append("        : " + ",\n          ".join(outs))
    body.append('        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));')
    body += ["  }", "};", ""]
    out.append("\n".join(body))
out.append('''}  // namespace ptx
}  // namespace gemmgen
''')
open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "sm90_wgmma.cuh"), "w").write("\n".join(out))
