// A list of problems (GemmArgs::list) as a table built on the device: the host copies each problem's pointers, sizes
// and first work unit (a ListSeed, 80 bytes) and three template maps encoded once per call; a warp per problem makes
// its ListProblem entry, its maps the templates with the problem's address, extents and row stride replaced
// (tensormap.replace). Encoding every problem's three maps on the host cost about 1 us each: 0.4 ms of a call of 128
// small problems, three times the GPU's work (docs/grouped.md, "The list form's kernel").
#pragma once

#include <cstdint>
#include <cuda.h>

#include "../common/alignment.cuh"
#include "../common/gemm_args.h"
#include "../ptx/sm90.cuh"
#include "gemm_kernel.cuh"

namespace gemmgen {
namespace sm90 {

// The tensor map `from` copied into `staged` (shared memory) by the lanes of a warp, 8 bytes a lane; the caller
// __syncwarp()s before changing it.
__device__ __forceinline__ void stage_tensormap(CUtensorMap& staged, const CUtensorMap& from, int lane) {
  if (lane < 16) reinterpret_cast<uint64_t*>(&staged)[lane] = reinterpret_cast<const uint64_t*>(&from)[lane];
}

// One listed problem as the host hands it to build_list: the caller's problem and its first work unit (the units of
// the problems before it, which sizes the grid and so is counted on the host anyway).
struct ListSeed {
  GemmListProblem problem;
  int64_t first_unit;
};

struct ListBuild {
  const ListSeed* seeds;  // (device)
  ListProblem* table;     // one entry per seed (device, 128-byte aligned)
  int count;
};

constexpr int kListBuildWarps = 4;  // problems per block of build_list (a warp each)

// The map at `staged` (shared memory) readdressed to a matrix of `inner` x `outer` elements of ELEM_BYTES, `ld`
// elements between its rows (dimension 1), as one matrix (launch.cuh's tensor_map: dimension 2 is 1, its stride
// one matrix past the end). The box, element type and swizzle stay the template's.
template <int ELEM_BYTES>
__device__ __forceinline__ void readdress_map(uint32_t staged, const void* base, int64_t inner, int64_t outer,
                                              int64_t ld) {
  ptx::tensormap_replace_global_address(staged, base);
  ptx::tensormap_replace_global_dim<0>(staged, static_cast<int>(inner));
  ptx::tensormap_replace_global_dim<1>(staged, static_cast<int>(outer));
  ptx::tensormap_replace_global_stride<0>(staged, ld * ELEM_BYTES);
  ptx::tensormap_replace_global_stride<1>(staged, outer * ld * ELEM_BYTES);
}

// Problem i's entry, as launch.cuh's list_entry wrote it on the host: its sizes and units as the kernel counts them,
// A's and B's maps where it loads (rows, columns and K all nonzero), D's where D goes out by TMA (row-major D keeping
// the 16-byte rule), each released to the tensormap proxy for the list kernel's acquire.
template <class Cfg>
__device__ __forceinline__ void build_list_problem(const CUtensorMap& a, const CUtensorMap& b, const CUtensorMap& d,
                                                   const ListBuild& build) {
  using K = Kernel<Cfg>;
  using Out = typename Cfg::Out;
  __shared__ alignas(128) CUtensorMap staged[kListBuildWarps][3];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int i = static_cast<int>(blockIdx.x) * kListBuildWarps + warp;
  if (i >= build.count) return;  // (the whole warp)
  const ListSeed seed = build.seeds[i];
  const GemmListProblem& q = seed.problem;
  GemmArgs one{};  // the problem as a single call: its tiles and units as the kernel counts them
  one.m = q.m;
  one.n = q.n;
  one.k = q.k;
  const auto sizes = K::problem(one);
  const bool work = q.m > 0 && q.n > 0;
  const bool loads = work && q.k > 0;
  const bool d_tma = work && Cfg::kDRowMajor && fast_aligned(q.d, q.ldd, sizeof(Out));

  if (loads) {
    stage_tensormap(staged[warp][0], a, lane);
    stage_tensormap(staged[warp][1], b, lane);
  }
  if (d_tma) stage_tensormap(staged[warp][2], d, lane);
  __syncwarp();
  const auto at = [&](int m) { return static_cast<uint32_t>(__cvta_generic_to_shared(&staged[warp][m])); };
  if (lane == 0) {
    if (loads) {
      // K-major operands keep k innermost (launch.cuh's operand_map)
      if (Cfg::kAKMajor) readdress_map<sizeof(typename Cfg::Elem)>(at(0), q.a, q.k, q.m, q.lda);
      else readdress_map<sizeof(typename Cfg::Elem)>(at(0), q.a, q.m, q.k, q.lda);
      if (Cfg::kBKMajor) readdress_map<sizeof(typename Cfg::ElemB)>(at(1), q.b, q.k, q.n, q.ldb);
      else readdress_map<sizeof(typename Cfg::ElemB)>(at(1), q.b, q.n, q.k, q.ldb);
    }
    if (d_tma) readdress_map<sizeof(Out)>(at(2), q.d, q.n, q.m, q.ldd);
  }
  __syncwarp();
  ListProblem& entry = build.table[i];
  if (loads) {
    ptx::tensormap_copy_release(&entry.a, at(0));
    ptx::tensormap_copy_release(&entry.b, at(1));
  }
  if (d_tma) ptx::tensormap_copy_release(&entry.d, at(2));
  if (lane == 0) {
    entry.d_ptr = q.d;
    entry.ldd = q.ldd;
    entry.m = sizes.m;
    entry.n = sizes.n;
    entry.k_tiles = sizes.k_tiles;
    entry.k_begin = 0;
    entry.first_unit = static_cast<int>(seed.first_unit);
    entry.units_m = work ? sizes.units_m : 0;
    entry.units_n = work ? sizes.units_n : 0;
    entry.d_tma = d_tma ? 1 : 0;
  }
}

template <class Cfg>
__global__ void __launch_bounds__(kListBuildWarps * 32)
    build_list(const __grid_constant__ CUtensorMap a, const __grid_constant__ CUtensorMap b,
               const __grid_constant__ CUtensorMap d, const ListBuild build) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  build_list_problem<Cfg>(a, b, d, build);
#elif defined(__CUDA_ARCH__)
  // tensormap.replace exists only in sm_90a (as build_k_groups, k_groups.cuh)
  __trap();
#endif
}

}  // namespace sm90
}  // namespace gemmgen
