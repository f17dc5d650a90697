// Groups along K (GemmArgs::groups_along_k) as a list of problems built on the device: one entry per group, its
// tensor maps made from the call's three maps with the group's K range, so that no group's size is read on the host
// (the call is one launch more than a list call, with no copy of a table to the device) and the list kernel
// (ProblemList) walks the groups as problems.
#pragma once

#include <cstdint>
#include <cuda.h>

#include "../ptx/sm90.cuh"
#include "gemm_kernel.cuh"
#include "list_table.cuh"

namespace gemmgen {
namespace sm90 {

// What build_k_groups needs besides the three maps: the ends, the table to fill, and what every group shares.
struct KGroups {
  const int32_t* ends;     // the groups' ends along K (device)
  ListProblem* table;      // one entry per group (device, 128-byte aligned)
  int groups, k;           // the groups, and K of A and B (the ends' total)
  int m, n, units_m, units_n;
  char* d;                 // D[0]; D[g] at d + g * d_stride_bytes, ldd elements between its rows (columns)
  int64_t d_stride_bytes, ldd;
  int d_tma;               // whether D goes out by TMA (through the map of D[0], readdressed per group)
};

constexpr int kKGroupWarps = 4;  // groups per block of build_k_groups (a warp each)

// The largest of v over the warp's lanes.
__device__ __forceinline__ int warp_max(int v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const int other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = other > v ? other : v;
  }
  return v;
}

// Group g's K range [start, end): the ends' running maximum clamped into [0, k] (ends that decrease or pass K leave
// values outside every group, as grouped rows' ends leave rows), computed by a warp without a scan over the groups.
__device__ __forceinline__ void k_group_range(const KGroups& groups, int g, int lane, int& start, int& end) {
  int before = 0, through = 0;
  for (int j = lane; j <= g; j += 32) {
    const int e = load_readonly(groups.ends + j);
    through = e > through ? e : through;
    if (j < g) before = e > before ? e : before;
  }
  through = warp_max(through);
  before = warp_max(before);
  end = through > groups.k ? groups.k : through;
  start = before > end ? end : before;
}

// The table of a call's groups along K, a warp per group: A's and B's maps with their K extent cut at the group's
// end (TMA fills what lies past it with zeros, so a group's last k tile adds nothing of the next group) and its
// first k value as the problem's k_begin; D's map moved to the group's matrix. Each map is staged in shared memory,
// changed there (tensormap.replace) and copied out with a release to the tensormap proxy, which the list kernel's
// producer and epilogue acquire before their first TMA operation through it.
template <class Cfg>
__device__ __forceinline__ void build_k_group(const CUtensorMap& a, const CUtensorMap& b, const CUtensorMap& d,
                                              const KGroups& groups) {
  constexpr int kBlockK = Kernel<Cfg>::kBlockK;
  __shared__ alignas(128) CUtensorMap staged[kKGroupWarps][3];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = static_cast<int>(blockIdx.x) * kKGroupWarps + warp;
  if (g >= groups.groups) return;  // (the whole warp)
  int start = 0, end = 0;
  k_group_range(groups, g, lane, start, end);

  stage_tensormap(staged[warp][0], a, lane);
  stage_tensormap(staged[warp][1], b, lane);
  if (groups.d_tma) stage_tensormap(staged[warp][2], d, lane);
  __syncwarp();
  const auto at = [&](int i) { return static_cast<uint32_t>(__cvta_generic_to_shared(&staged[warp][i])); };
  if (lane == 0) {
    const int extent = end > 0 ? end : 1;  // (an extent of 0 is no map; an empty group loads nothing)
    // K is the outer dimension (1) of both maps: choose_k_grouped_path launches nothing else.
    ptx::tensormap_replace_global_dim<1>(at(0), extent);
    ptx::tensormap_replace_global_dim<1>(at(1), extent);
    if (groups.d_tma) ptx::tensormap_replace_global_address(at(2), groups.d + g * groups.d_stride_bytes);
  }
  __syncwarp();
  ListProblem& entry = groups.table[g];
  ptx::tensormap_copy_release(&entry.a, at(0));
  ptx::tensormap_copy_release(&entry.b, at(1));
  if (groups.d_tma) ptx::tensormap_copy_release(&entry.d, at(2));
  if (lane == 0) {
    entry.d_ptr = groups.d + g * groups.d_stride_bytes;
    entry.ldd = groups.ldd;
    entry.m = groups.m;
    entry.n = groups.n;
    entry.k_tiles = (end - start + kBlockK - 1) / kBlockK;
    entry.k_begin = start;
    entry.first_unit = g * groups.units_m * groups.units_n;
    entry.units_m = groups.units_m;
    entry.units_n = groups.units_n;
    entry.d_tma = groups.d_tma;
  }
}

template <class Cfg>
__global__ void __launch_bounds__(kKGroupWarps * 32)
    build_k_groups(const __grid_constant__ CUtensorMap a, const __grid_constant__ CUtensorMap b,
                   const __grid_constant__ CUtensorMap d, const KGroups groups) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  build_k_group<Cfg>(a, b, d, groups);
#elif defined(__CUDA_ARCH__)
  // tensormap.replace and tensormap.cp_fenceproxy exist only in sm_90a; a package that also carries older targets
  // compiles this for them too, and never launches it there (as the GEMM kernel's stub, sm90/gemm.cu.j2).
  __trap();
#endif
}

}  // namespace sm90
}  // namespace gemmgen
