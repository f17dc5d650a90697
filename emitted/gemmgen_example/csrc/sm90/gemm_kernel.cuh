// The sm90 GEMM family: TMA loads into 128-byte-swizzled shared memory, completing on mbarriers,
// wgmma from shared-memory descriptors, warp-specialized (one producer warpgroup, two consumer
// warpgroups), persistent tile schedules, thread-block clusters with TMA multicast.
//
// A generated kernel supplies a Config struct of compile-time constants (see sm90/gemm.cu.j2) and
// calls Kernel<Config>::run. Everything below is ordinary C++ over those constants.
//
// Roles (384 threads = 3 warpgroups):
//   warpgroup 0, the producer: one thread walks the CTA's tiles and k tiles, waits for a free slot of
//     the shared-memory ring ("empty" barrier), arms the slot's "full" barrier with the bytes to come
//     and issues the TMA loads of A and B; the other 127 threads only give their registers away, but in
//     a kernel with tf32 tiles that are M/N-major (Kernel::kTransposes), where warps 1-3 transpose each
//     slot's tiles in place before the slot is "full" (transpose_slots).
//   warpgroups 1 and 2, the consumers: wait on "full", issue wgmma on the slot, keep one wgmma group
//     in flight, free the previous slot on "empty" (in every CTA that wrote into it), and store the
//     accumulators. cooperative / ws: both consumers share each tile (each owns half its rows);
//     pingpong: they take alternate tiles, so one's epilogue overlaps the other's mainloop.
//
// Clusters: a CMxCN cluster is CM x CN CTAs on neighbouring tiles (rank = rm + CM * rn). The CM CTAs
// of one tile column need the same B tile, so each loads 1/CM of it and multicasts it to all of them;
// the CN CTAs of one tile row share A likewise (2x1: B shared by two, 1x2: A by two, 2x2: both). Each
// CTA's "full" barrier then expects the whole stage (its own loads and its peers' multicasts), and each
// slot is free only when the consumers of every CTA that writes into it (itself, its column peers and
// its row peers) have released it.
#pragma once

#include <cfloat>  // FLT_MIN
#include <cstdint>
#include <type_traits>
#include <cuda.h>  // CUtensorMap (a type only: nothing links against the driver)

#include "../common/alignment.cuh"
#include "../common/batch.cuh"
#include "../common/convert.cuh"
#include "../common/gemm_args.h"
#include "../ptx/sm90.cuh"

// Experiment switch for A/B runs on the GPU (gpu/ab_variants.py), off by default: 1 gives the cooperative
// schedule a stream-K partition of the work (docs/sm90.md, "Stream-K": -5 to -9 % at 4096^3, up to +2 % at
// 8192^3; at steady state -5 % and +0.5 %).
#ifndef GEMMGEN_SM90_STREAM_K
#define GEMMGEN_SM90_STREAM_K 0
#endif
// Timing experiment: split-K's parts summed by the k = 0 part alone, one partial tile after another (the
// stream-K owner's way), instead of each part adding its own slice of the tile (consume_stream_k).
#ifndef GEMMGEN_SM90_EXPERIMENT_SK_SERIAL_FIXUP
#define GEMMGEN_SM90_EXPERIMENT_SK_SERIAL_FIXUP 0
#endif
// Timing experiment only (wrong results): stream-K without its fixup, contributors store no partials and
// owners wait for none, to separate the fixup's cost from the rest of stream-K's.
#ifndef GEMMGEN_SM90_EXPERIMENT_SK_NO_FIXUP
#define GEMMGEN_SM90_EXPERIMENT_SK_NO_FIXUP 0
#endif
// Timing experiment (results unchanged): split-K's timeline. Each consumer warpgroup's first thread writes the global
// timer at its segment's start, its main loop's end, its partial tile's flag raised, the flags it waits for seen and
// its tile's store's end, and its SM, into args.aux (kTimelineWords words per block and consumer; gpu/sk_timeline.py).
#ifndef GEMMGEN_SM90_EXPERIMENT_SK_TIMELINE
#define GEMMGEN_SM90_EXPERIMENT_SK_TIMELINE 0
#endif
// TMA fills the rows (columns) of a box past the matrix edge with zeros at a fraction of the rate it loads real ones:
// a tile row of A wholly past M made its 2x1 cluster 1.5-1.7x slower (docs/sm90.md, "Loads past the matrix edge").
// So the loads that start past the tile's kept rows (columns) are not issued (OperandTile::skipped_bytes); 0 issues
// them as before. GEMMGEN_SM90_A_BOX_ROWS loads every K-major A slice in boxes of at most that many rows, so that a
// ragged M leaves fewer rows for TMA to fill; measured at 32 it won 10-25 % on ragged M and lost as much on small
// tiles with a short K (more loads to issue per stage), so it stays off (256: one box per slice). Instead the tiles
// that cross the last row of A alone load it in boxes of GEMMGEN_SM90_A_EDGE_BOX_ROWS rows (a second map of A,
// LoadMaps::a_edge; 0: off), and so skip all but the last box's padding. All three are switches for A/B runs
// (gpu/ab_variants.py).
#ifndef GEMMGEN_SM90_SKIP_OOB_LOADS
#define GEMMGEN_SM90_SKIP_OOB_LOADS 1
#endif
#ifndef GEMMGEN_SM90_A_BOX_ROWS
#define GEMMGEN_SM90_A_BOX_ROWS 256
#endif
#ifndef GEMMGEN_SM90_A_EDGE_BOX_ROWS
#define GEMMGEN_SM90_A_EDGE_BOX_ROWS 32
#endif
// Experiment (A/B runs only; 0 or 1: off): a problem's work units taken by the clusters in an interleaved order, unit c
// going to position (c % G) * (U / G) + c / G of the raster (interleave_units), so that clusters launched G apart
// take neighbouring tiles. Whether the clusters the hardware places side by side then share more of their operands
// in L2 is what an A/B of G against 0 shows (docs/corpus.md, "ncu beside cuBLAS on the worst mid-size rows": cuBLAS's
// kernel delivers 2.33 bytes per byte read from L2 where ours delivers 1.44-1.79 on the same tile).
#ifndef GEMMGEN_SM90_EXPERIMENT_UNIT_INTERLEAVE
#define GEMMGEN_SM90_EXPERIMENT_UNIT_INTERLEAVE 0
#endif
// Timing experiment only (wrong results): tf32 tiles that are M/N-major are not transposed (the transposer warps only
// pass the slots on), to separate the transposes' cost from the rest of the M/N-major path's.
#ifndef GEMMGEN_SM90_EXPERIMENT_SKIP_TRANSPOSE
#define GEMMGEN_SM90_EXPERIMENT_SKIP_TRANSPOSE 0
#endif
// tf32 with an M-major A (layouts nn, nt): each consumer thread reads its wgmma fragments of A from the tile TMA wrote
// (RegisterFragmentA) and issues wgmma with A from registers, instead of the transposer warps transposing A's chunks
// in place (Kernel::kARegisters). Measured (H200, bench_dtypes.py, h200_bench_tf32_a_registers.json): nn 0.75-0.83x
// cuBLAS TF32 transposed -> 0.97-1.17x from registers, nt 0.74-0.91x -> 0.94-0.99x. 0 builds the transpose.
#ifndef GEMMGEN_SM90_TF32_A_REGISTERS
#define GEMMGEN_SM90_TF32_A_REGISTERS 1
#endif
// Timing experiments only (wrong results), to find what per-block scaling costs beside the per-tensor kernel's main
// loop: SCALES_CONST promotes with scales of 1 (no loads, no products); ONE_SPLIT takes every tile's columns as the
// first scale block's (no branch on the split point).
#ifndef GEMMGEN_SM90_EXPERIMENT_SCALES_CONST
#define GEMMGEN_SM90_EXPERIMENT_SCALES_CONST 0
#endif
#ifndef GEMMGEN_SM90_EXPERIMENT_ONE_SPLIT
#define GEMMGEN_SM90_EXPERIMENT_ONE_SPLIT 0
#endif
// A grouped or listed warpgroup tile of two m64 blocks whose rows end in the first issues that block's wgmmas only
// (Kernel::mainloop_of_rows); 0 issues both, as a dense tile does (for A/B runs).
#ifndef GEMMGEN_SM90_TRIM_EMPTY_BLOCKS
#define GEMMGEN_SM90_TRIM_EMPTY_BLOCKS 1
#endif
// An epilogue with an M x N operand read element by element (not by TMA: Epilogue::kStraightLine is off) runs the
// inner parts of this many n8 blocks as straight-line code, their operand loads in flight together
// (Kernel::run_epilogue); 0: element by element behind bounds checks.
#ifndef GEMMGEN_SM90_EPILOGUE_MATRIX_PART
#define GEMMGEN_SM90_EPILOGUE_MATRIX_PART 4
#endif
// The promoted (fp8) main loop waits for the next k tile's slot while this k tile's wgmmas run and keeps its
// descriptors' and barriers' bases in registers (Kernel::mainloop_promoted); 0: the slot is waited for after the
// promotion, the bases left to the compiler (for A/B runs). The unrolled block-scaled loop keeps that order
// (Kernel::kPromotedEarlyWait).
#ifndef GEMMGEN_SM90_PROMOTED_EARLY_WAIT
#define GEMMGEN_SM90_PROMOTED_EARLY_WAIT 1
#endif
// The block-scaled main loop's unroll factor (Kernel::kPromotedUnroll; for A/B runs).
#ifndef GEMMGEN_SM90_BLOCK_SCALED_UNROLL
#define GEMMGEN_SM90_BLOCK_SCALED_UNROLL 3
#endif
// 1: per-block scaling's B scales loaded as warp-uniform values also where the main loop is unrolled (BlockScales;
// for A/B runs).
#ifndef GEMMGEN_SM90_UNIFORM_B_SCALES
#define GEMMGEN_SM90_UNIFORM_B_SCALES 0
#endif

namespace gemmgen {
namespace sm90 {

// Stream-K, hybrid with data-parallel waves: with G clusters and U work units of K k tiles, the first
// floor(U / G) waves of units go whole to the clusters in raster order (unit c + w * G for cluster c,
// as the data-parallel schedule; consecutive clusters work on neighbouring tiles, which share A and B
// in L2), and only the last U mod G units are cut: their iterations, in unit-major order, are dealt out
// in G contiguous shares, one per cluster, after its whole units. A cut unit is finished by the cluster
// holding its k = 0 iteration, its "owner" (there it is the last segment of the share); every other
// cluster with a part of it is a "contributor" (there it is the first segment): it leaves fp32 partial
// sums in a workspace and raises a flag before anything else of its share, so the owner only waits for
// work queued ahead of its own. (Cutting every unit into equal shares instead, v1 of this experiment,
// ran 25-55 % slower: each cluster walked its own stretch of the matrix, and L2 reuse was lost.)
// A tail of fewer iterations than clusters (an empty share could not be told from a missing part)
// stays data-parallel. With fewer units than clusters (a small M), every unit is cut: the launch then
// starts at most units x k_tiles clusters, and each unit's k tiles are split among consecutive clusters
// (split-K, summed in cluster order).
struct StreamK {
  struct Segment {
    int unit, kt_begin, kt_end;  // k tiles [kt_begin, kt_end) of work unit `unit`
  };

  int units, k_tiles, clusters;
  int whole_waves;    // waves of whole units before the cut tail
  int64_t tail_begin; // the first iteration of the cut tail (unit-major)

  __host__ __device__ __forceinline__ StreamK(int units_, int k_tiles_, int clusters_)
      : units(units_), k_tiles(k_tiles_), clusters(clusters_) {
    const int rest = units % clusters;  // all of them when there are fewer units than clusters
    const bool cut = rest > 0 && static_cast<int64_t>(rest) * k_tiles >= clusters;
    whole_waves = cut ? units / clusters : (units + clusters - 1) / clusters;
    tail_begin = static_cast<int64_t>(cut ? units - rest : units) * k_tiles;
  }

  // Whole unit of wave w for cluster c, or -1 past the end.
  __host__ __device__ __forceinline__ int whole_unit(int c, int w) const {
    const int unit = c + w * clusters;
    return static_cast<int64_t>(unit) * k_tiles < tail_begin ? unit : -1;
  }

  // The first iteration of cluster c's share of the cut tail (it ends where the next one begins).
  __host__ __device__ __forceinline__ int64_t share_begin(int c) const {
    const int64_t tail = static_cast<int64_t>(units) * k_tiles - tail_begin;
    return tail_begin + tail * c / clusters;
  }

  // Whether cluster c's share begins inside `unit` (after its k = 0 iteration): then its first segment
  // is a part of the unit that the unit's owner must add. The owner's contributors are the clusters
  // after it for which this holds, consecutively.
  __host__ __device__ __forceinline__ bool begins_inside(int c, int unit) const {
    const int64_t begin = share_begin(c);
    return begin > static_cast<int64_t>(unit) * k_tiles && begin < static_cast<int64_t>(unit + 1) * k_tiles;
  }

  // The segment that starts at iteration `it` of a share ending at `end`.
  __host__ __device__ __forceinline__ Segment segment(int64_t it, int64_t end) const {
    Segment s;
    s.unit = static_cast<int>(it / k_tiles);
    s.kt_begin = static_cast<int>(it % k_tiles);
    const int64_t stop = s.kt_begin + (end - it);
    s.kt_end = stop < k_tiles ? static_cast<int>(stop) : k_tiles;
    return s;
  }

  // Calls f(segment) for cluster c's work in order: its whole units, then the segments of its share.
  template <class F>
  __host__ __device__ __forceinline__ void for_each_segment(int c, F&& f) const {
    for (int w = 0; whole_unit(c, w) >= 0; ++w) f(Segment{whole_unit(c, w), 0, k_tiles});
    const int64_t end = share_begin(c + 1);
    for (int64_t it = share_begin(c); it < end;) {
      const Segment s = segment(it, end);
      f(s);
      it += s.kt_end - s.kt_begin;
    }
  }
};

enum class Schedule { kWarpSpecialized, kCooperative, kPingpong };

constexpr int kSwizzleRowBytes = 128;    // the span of the 128-byte swizzle pattern
constexpr int kSwizzleAtomBytes = 1024;  // 8 rows of 128 bytes: the unit the pattern repeats in
constexpr int kMmaM = 64;                // wgmma m64nNkK
constexpr int kMmaKBytes = 32;           // wgmma's k step in bytes, for every input type (k16 for 16-bit types)
// Grouped rows (GemmArgs::group_ends: a mixture of experts' tokens sorted by expert) as work units, in group
// order: group g's rows [end(g - 1), end(g)) (masked groups: [g * slab, g * slab + count(g))) in blocks of
// rows_per_unit (a cluster's tiles along M), times
// units_n along N; an empty group has none. The group sizes are device data, so every thread that walks the
// units counts and finds them itself, from the same ends.
// A read of data no thread writes during the kernel (through the read-only cache); a plain read on the host, where
// the walks below are tested.
template <typename T>
__host__ __device__ __forceinline__ T load_readonly(const T* at) {
#ifdef __CUDA_ARCH__
  return __ldg(at);
#else
  return *at;
#endif
}

struct GroupedRows {
  const int32_t* ends;  // each group's end, or (masked: slab > 0) its row count
  int groups, m, rows_per_unit, units_n;
  int slab;             // masked groups (GemmArgs::group_rows): group g's rows start at g * slab; 0: contiguous

  __host__ __device__ __forceinline__ static int load(const int32_t* at) { return load_readonly(at); }
  // Group g's first row: the previous group's end, or its slab's first row.
  __host__ __device__ __forceinline__ int start(int g, int previous_end) const {
    return slab > 0 ? g * slab : previous_end;
  }
  // Group g's end, clamped into [row0 (its first row), m]: ends that decrease or pass M leave rows outside every
  // group, never outside A and D; a masked count is clamped into [0, slab] first, so a group stays in its slab.
  __host__ __device__ __forceinline__ int clamp_end(int e, int row0) const {
    if (slab > 0) e = row0 + (e < 0 ? 0 : e > slab ? slab : e);
    return e < row0 ? row0 : e > m ? m : e;
  }
  __host__ __device__ __forceinline__ int end(int g, int row0) const { return clamp_end(load(ends + g), row0); }
  __host__ __device__ __forceinline__ int units_m(int rows) const { return (rows + rows_per_unit - 1) / rows_per_unit; }
  // The units of all groups, counted by one thread (the reference for warp_units; the host tests walk this way).
  __host__ __device__ __forceinline__ int units() const {
    int total = 0, row_end = 0;
    for (int g = 0; g < groups; ++g) {
      const int row0 = start(g, row_end);
      row_end = end(g, row0);
      total += units_m(row_end - row0) * units_n;
    }
    return total;
  }

#ifdef __CUDACC__
  // -- Walks a whole warp runs together: every lane calls them with the same arguments. One thread's walk waits on
  // each group's load and division in turn, about 65 ns a group on the H200, twice per CTA (the count, then the seek
  // to its first unit): 17 us of a decode step's 32.5 us over 128 experts, its rows in the last ones
  // (gpu/grouped_overhead_probe.py). A warp takes 32 groups a step.
  static constexpr unsigned kAll = 0xffffffffu;  // every lane of the warp (the shuffles' and the ballot's mask)

  // Lane l's group base + l of a chunk of 32, given the previous group's clamped end (carry): its rows, its units
  // and the chunk's units before it; the chunk's units in total (every lane).
  struct Chunk {
    int row0, row_end, units_m, units, before, total;
  };
  __device__ __forceinline__ Chunk warp_chunk(int base, int carry) const {
    const int lane = static_cast<int>(threadIdx.x % 32);
    const int g = base + lane;
    const int e = g < groups ? load(ends + g) : 0;
    Chunk c;
    if (slab > 0) {
      c.row0 = start(g, 0);
      c.row_end = clamp_end(e, c.row0);
    } else {
      // Clamped one after another (clamp_end), group g ends at min(m, max(carry, ends[base..g])): a running maximum.
      int most = e;
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const int v = __shfl_up_sync(kAll, most, d);
        if (lane >= d) most = most > v ? most : v;
      }
      most = most > carry ? most : carry;
      c.row_end = most < m ? most : m;
      const int previous = __shfl_up_sync(kAll, c.row_end, 1);
      c.row0 = lane == 0 ? carry : previous;
    }
    c.units_m = g < groups ? units_m(c.row_end - c.row0) : 0;
    c.units = c.units_m * units_n;
    int sum = c.units;  // inclusive prefix sum over the lanes
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int v = __shfl_up_sync(kAll, sum, d);
      if (lane >= d) sum += v;
    }
    c.before = sum - c.units;
    c.total = __shfl_sync(kAll, sum, 31);
    return c;
  }

  // units(), by a warp.
  __device__ __forceinline__ int warp_units() const {
    int total = 0, carry = 0;
#pragma unroll 1
    for (int base = 0; base < groups; base += 32) {
      const Chunk c = warp_chunk(base, carry);
      total += c.total;
      carry = __shfl_sync(kAll, c.row_end, 31);
    }
    return total;
  }
#endif

  // A walk over the groups, for units that only increase: the group holding the current unit.
  struct Walk {
    int group = -1;
    int first_unit = 0, units = 0, units_m = 0;  // the group's first unit, its units, its blocks along M
    int row0 = 0, row_end = 0;                   // the group's rows [row0, row_end) of A and D

    // Whether `unit` lies past the current group (and a group follows).
    __host__ __device__ __forceinline__ bool past(const GroupedRows& rows, int unit) const {
      return unit >= first_unit + units && group + 1 < rows.groups;
    }
    // One thread's walk (the reference for warp_seek).
    __host__ __device__ __forceinline__ void seek(const GroupedRows& rows, int unit) {
      while (past(rows, unit)) {
        first_unit += units;
        ++group;
        row0 = rows.start(group, row_end);
        row_end = rows.end(group, row0);
        units_m = rows.units_m(row_end - row0);
        units = units_m * rows.units_n;
      }
    }
#ifdef __CUDACC__
    // seek(), by a warp (the same state in every lane): the group holding `unit` among the next 32, else 32 on;
    // past the last unit, the last group (as seek).
    __device__ __forceinline__ void warp_seek(const GroupedRows& rows, int unit) {
      if (!past(rows, unit)) return;
      const int lane = static_cast<int>(threadIdx.x % 32);
      int base = group + 1, first = first_unit + units, carry = row_end;
#pragma unroll 1
      for (;;) {
        const Chunk c = rows.warp_chunk(base, carry);
        const unsigned holds = __ballot_sync(kAll, base + lane < rows.groups && unit < first + c.before + c.units);
        const int last = rows.groups - 1 - base;  // the last group's lane, where this chunk has it
        if (holds != 0 || last < 32) {
          const int t = holds != 0 ? __ffs(holds) - 1 : last;
          group = base + t;
          first_unit = first + __shfl_sync(kAll, c.before, t);
          units_m = __shfl_sync(kAll, c.units_m, t);
          units = __shfl_sync(kAll, c.units, t);
          row0 = __shfl_sync(kAll, c.row0, t);
          row_end = __shfl_sync(kAll, c.row_end, t);
          return;
        }
        first += c.total;
        carry = __shfl_sync(kAll, c.row_end, 31);
        base += 32;
      }
    }
#endif
  };
};

// The maps the producer loads the operands through. a_edge: A in the boxes of OperandTile's MAX_BOX_ROWS =
// GEMMGEN_SM90_A_EDGE_BOX_ROWS, for the tiles that cross A's last row; nullptr where there is none (a listed problem's
// maps, a call whose tiles all end inside A), and the tiles load A through `a` then.
struct LoadMaps {
  const CUtensorMap* a;
  const CUtensorMap* a_edge;
  const CUtensorMap* b;
};

// The most blocks LaunchWorkspace::order ranks (an SM count; SM indices fit a byte).
constexpr int kMaxOrderedBlocks = 256;

// What a launch passes beside the maps and GemmArgs: stream-K's exchange and the blocks' order.
// Stream-K's exchange between the clusters that share a unit: one fp32 partial tile and one flag per slot (CTA and
// consumer warpgroup, Kernel::partial_slot). A part raises its flag to `epoch` once its partial tile is written, and
// a reader waits until the flag equals `epoch`. The host never hands a launch flags that already hold its epoch:
// either zeroed flags and epoch 1 (a CUDA graph's capture), or its stream's own flags, which only earlier launches on
// that stream wrote, each with an epoch of its own (stream_k_flags in sm90/launch.cuh), so that no launch
// has to zero them first.
struct LaunchWorkspace {
  float* partials;
  int* flags;
  int epoch;
  // Blocks [0, ordered) take unit order[b] first (block_order.cuh: ranked by the SM each lands on), the others
  // unit blockIdx.x / CLUSTER; 0 for stream-K, whose parts follow the block index.
  int ordered;
  uint8_t order[kMaxOrderedBlocks];
};

// A list of problems (GemmArgs::list) as the kernel reads it: per problem, its tensor maps and sizes, which the host
// launch encodes and copies to the device before the kernel starts (GemmArgs::list_device), or, for groups along K,
// builds on the device (build_k_groups). The work units are (problem, cluster-sized block of tiles) pairs,
// problem-major; first_unit is the units of the problems before. 128-byte aligned: tensormap.replace and
// tensormap.cp_fenceproxy take maps at 128-byte boundaries.
struct alignas(128) ListProblem {
  CUtensorMap a, b;  // (128 bytes each)
  CUtensorMap d;     // zeros where D goes out by direct stores (d_tma == 0)
  void* d_ptr;       // D's base and leading dimension, for the direct stores
  int64_t ldd;
  int m, n, k_tiles;
  int k_begin;       // the problem's first k value in its A and B maps (groups along K: the group's start; else 0)
  int first_unit, units_m, units_n;
  int d_tma;
};

struct ProblemList {
  const ListProblem* problems;
  int count;

  // The units of all problems: the last one's first unit plus its own.
  __host__ __device__ __forceinline__ int units() const {
    if (count == 0) return 0;
    const ListProblem& last = problems[count - 1];
    return load_readonly(&last.first_unit) + load_readonly(&last.units_m) * load_readonly(&last.units_n);
  }

  // One thread's walk over the problems, for units that only increase: the problem holding the current unit and
  // its sizes (loaded once per problem, not per tile).
  struct Walk {
    int problem = -1;
    int first_unit = 0, units = 0, units_m = 0, units_n = 0;
    int m = 0, n = 0, k_tiles = 0, k_begin = 0;

    __host__ __device__ __forceinline__ void seek(const ProblemList& list, int unit) {
      while (unit >= first_unit + units && problem + 1 < list.count) {
        const ListProblem& next = list.problems[++problem];
        first_unit = load_readonly(&next.first_unit);
        units_m = load_readonly(&next.units_m);
        units_n = load_readonly(&next.units_n);
        units = units_m * units_n;
        m = load_readonly(&next.m);
        n = load_readonly(&next.n);
        k_tiles = load_readonly(&next.k_tiles);
        k_begin = load_readonly(&next.k_begin);
      }
    }
  };
};

// How a kernel's work units map to tiles: one problem or a batch (kFlat), grouped rows (kRows: GroupedRows), or a
// list of problems (kList: ProblemList).
enum class Walking { kFlat, kRows, kList };
template <Walking W>
using WalkOf = std::conditional_t<W == Walking::kList, ProblemList::Walk, GroupedRows::Walk>;

// A k tile is one 128-byte swizzle row of k values (64 16-bit elements), so its k extent depends on the
// element size and its bytes do not.
template <int ELEM_BYTES>
constexpr int kBlockKOf = kSwizzleRowBytes / ELEM_BYTES;
constexpr int kWarpgroupThreads = 128;
constexpr int kConsumerWarpgroups = 2;
constexpr int kThreads = (1 + kConsumerWarpgroups) * kWarpgroupThreads;
// setmaxnreg budgets: 40 + 2 x 232 registers x 128 threads = 64512 of the SM's 65536. A kernel whose producer
// warpgroup also transposes tiles, or loads an M-major tf32 A that the consumers read into registers
// (Kernel::kWideProducer), moves 16 of each consumer's registers to it: 72 + 2 x 216.
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 232;
constexpr int kTransposingProducerRegisters = 72;
constexpr int kTransposingConsumerRegisters = 216;
constexpr int kSmemAlignSlack = 1024;    // dynamic shared memory is rounded up to a swizzle atom

// One operand's tile of one pipeline stage in shared memory: ROWS (M or N) x kBlockK elements of ELEM_BYTES, as
// TMA writes it with the 128-byte swizzle (shown for 16-bit elements, kBlockK = 64).
//   K-major (K contiguous in global memory): ROWS rows of 64 k values, 128 bytes each.
//   M/N-major: ROWS/64 chunks; each chunk is 64 rows (one per k) of 64 M/N values.
// PARTS: how many CTAs of the cluster share the operand tile; each loads 1/PARTS of it and multicasts
// it to all of them (K-major: a slice of the rows; M/N-major: a slice of the k rows of every chunk).
// The rows of the boxes that load a K-major slice of `slice_rows` rows, given at most `max_rows` each: the largest
// multiple of 8 (whole swizzle atoms) that divides the slice, so that the slice is whole boxes.
constexpr int box_rows_of(int slice_rows, int max_rows) {
  for (int rows = max_rows < slice_rows ? max_rows - max_rows % 8 : slice_rows; rows >= 8; rows -= 8) {
    if (slice_rows % rows == 0) return rows;
  }
  return slice_rows;
}

template <int ROWS, bool K_MAJOR, int PARTS, int ELEM_BYTES, int MAX_BOX_ROWS = 256>
struct OperandTile {
  static constexpr int kBlockK = kBlockKOf<ELEM_BYTES>;
  static constexpr int kMmaK = kMmaKBytes / ELEM_BYTES;
  static constexpr int kRowElems = kSwizzleRowBytes / ELEM_BYTES;  // elements of one 128-byte row
  static constexpr int kBytes = ROWS * kBlockK * ELEM_BYTES;
  static constexpr int kChunkBytes = kBlockK * kSwizzleRowBytes;  // M/N-major: kBlockK k rows of kRowElems
  static constexpr int kChunks = K_MAJOR ? 1 : ROWS / kRowElems;
  static constexpr bool kShared = PARTS > 1;
  static constexpr bool kSkipOobLoads = GEMMGEN_SM90_SKIP_OOB_LOADS;
  // The rows (K-major) or k rows (M/N-major) of one CTA's slice.
  static constexpr int kSliceRows = (K_MAJOR ? ROWS : kBlockK) / PARTS;
  // K-major: a slice is loaded as kLoads boxes of kBoxRows rows (at most MAX_BOX_ROWS); M/N-major: one box per chunk.
  static constexpr int kBoxRows = K_MAJOR ? box_rows_of(kSliceRows, MAX_BOX_ROWS) : kSliceRows;
  static constexpr int kLoads = K_MAJOR ? kSliceRows / kBoxRows : kChunks;
  // What one load covers along M (N), all sharers' loads together, and the bytes of one (skipped_bytes).
  static constexpr int kUnitRows = K_MAJOR ? kBoxRows : kRowElems;
  static constexpr int kUnits = K_MAJOR ? ROWS / kBoxRows : kChunks;
  static constexpr int kUnitBytes = K_MAJOR ? kBoxRows * kSwizzleRowBytes : kChunkBytes;
  // The TMA box (innermost first) the host must encode for this operand.
  static constexpr int kBoxInner = kRowElems;
  static constexpr int kBoxOuter = kBoxRows;
  static_assert(K_MAJOR ? ROWS % 8 == 0 : ROWS % kRowElems == 0,
                "K-major tiles are whole 8-row swizzle atoms; M/N-major ones whole chunks of one 128-byte row");
  static_assert(kSliceRows % 8 == 0, "a slice is whole 1024-byte swizzle atoms, so each CTA's writes keep the pattern");
  static_assert(kSliceRows % kBoxRows == 0 && kBoxRows % 8 == 0, "a slice is whole boxes of whole swizzle atoms");
  static_assert(kBoxOuter <= 256, "a TMA box is at most 256 elements along each dimension");

  // Issue this CTA's loads of the stage: rows [mn0, mn0 + ROWS), k values [k0, k0 + kBlockK) of matrix `matrix`
  // (the map's third dimension: the problem of a batch, 0 for an operand shared by all problems).
  // `part`: this CTA's slice; `sharers`: the cluster ranks that share the tile (bit r: rank r).
  // `extent`: the tile's rows (columns) from which on the product is not stored; with GEMMGEN_SM90_SKIP_OOB_LOADS the
  // loads that start there are not issued (skipped_bytes).
  __device__ __forceinline__ static void load(const void* tmap, uint32_t dst, uint32_t full_bar, int mn0, int k0,
                                              int matrix, int part, uint16_t sharers, int extent) {
    const int offset = kShared ? part * kSliceRows : 0;
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      if constexpr (K_MAJOR) {
        const int row = offset + i * kBoxRows;
        if (kSkipOobLoads && mn0 + row >= extent) break;   // and so are the boxes after it
        const uint32_t to = dst + row * kSwizzleRowBytes;
        if constexpr (kShared) {
          ptx::tma_load_3d_multicast(to, tmap, full_bar, k0, mn0 + row, matrix, sharers);
        } else {
          ptx::tma_load_3d(to, tmap, full_bar, k0, mn0 + row, matrix);
        }
      } else {
        if (kSkipOobLoads && mn0 + i * kRowElems >= extent) break;
        const uint32_t to = dst + i * kChunkBytes + offset * kSwizzleRowBytes;
        if constexpr (kShared) {
          ptx::tma_load_3d_multicast(to, tmap, full_bar, mn0 + i * kRowElems, k0 + offset, matrix, sharers);
        } else {
          ptx::tma_load_3d(to, tmap, full_bar, mn0 + i * kRowElems, k0, matrix);
        }
      }
    }
  }

  // The bytes of a stage that no sharer of the tile loads when GEMMGEN_SM90_SKIP_OOB_LOADS is on: the loads (K-major:
  // boxes of kBoxRows rows; M/N-major: chunks of one 128-byte row) that start at or past `extent`. TMA would only zero-fill
  // them, and a row of A (column of B) reaches only the same row (column) of the product, which the epilogue does
  // not store past `extent`; so the stale bytes left in those slots are never seen. Every sharer computes the same
  // sum from the same tile origin, so each one's barrier expects exactly the bytes that arrive.
  __device__ __forceinline__ static int skipped_bytes(int mn0, int extent) {
    return (kUnits - __popc(loaded_units(mn0, extent))) * kUnitBytes;
  }
  // The loads (units) load() issues, one bit each: those that start before `extent` (all of them without
  // GEMMGEN_SM90_SKIP_OOB_LOADS). The transposer warps transpose exactly these chunks of an M/N-major tf32 tile.
  __device__ __forceinline__ static uint32_t loaded_units(int mn0, int extent) {
    static_assert(kUnits <= 32, "one bit per unit");
    uint32_t units = 0;
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      if (!kSkipOobLoads || mn0 + u * kUnitRows < extent) units |= 1u << u;
    }
    return units;
  }

  // wgmma descriptor of the tile at `base` (its first rows, k step 0). Other rows and k steps of the same
  // tile, and the same place in another stage, differ only in the start address: ptx::desc_advance by
  // offset_units, so that the main loop adds constants instead of encoding a descriptor per wgmma.
  __device__ __forceinline__ static uint64_t descriptor(uint32_t base) {
    if constexpr (K_MAJOR) {
      return ptx::smem_descriptor(base, /*leading (unused)=*/16, /*stride: 8-row groups=*/kSwizzleAtomBytes);
    } else {
      return ptx::smem_descriptor(base, /*leading: 64-element chunks=*/kChunkBytes,
                                  /*stride: 8-k groups=*/kSwizzleAtomBytes);
    }
  }

  // Where rows [row0, ...) at k step `kk` (k values 16*kk .. 16*kk + 15) start, from the tile's start, in
  // the descriptor's 16-byte address units. K-major: a k step moves 32 bytes along the 128-byte row (the
  // swizzle is applied by hardware on the final address); M/N-major: a k step is 16 rows of 128 bytes =
  // two swizzle atoms, and rows come in 64-element chunks.
  __host__ __device__ static constexpr uint32_t offset_units(int row0, int kk) {
    return K_MAJOR ? (row0 * kSwizzleRowBytes + kk * kMmaKBytes) / 16
                   : ((row0 / kRowElems) * kChunkBytes + kk * kMmaK * kSwizzleRowBytes) / 16;
  }
};

// One m64 block's wgmma for a k step across the tile's BN columns. wgmma takes N up to 256, so a wider
// tile (BN = 320) issues two: n256 on B's rows [0, 256) into accumulators [0, 128), then the rest of the
// rows into the accumulators after them. Both keep the fragment layout (n8 block j at d[4j .. 4j + 3]).
template <int BN, typename T, typename TB, int TRANS_A, int TRANS_B, class TileB>
struct TileMma {
  static constexpr int kFirstN = BN > 256 ? 256 : BN;
  using First = ptx::Wgmma<kFirstN, T, TRANS_A, TRANS_B, TB>;
  using Rest = ptx::Wgmma<(BN > 256 ? BN - 256 : 64), T, TRANS_A, TRANS_B, TB>;  // instantiated only when BN > 256
  static constexpr int kAccum = BN / 2;
  using Accum = typename First::Accum;  // float, or int32_t for int8
  __device__ __forceinline__ static void run(Accum (&d)[kAccum], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    First::run(*reinterpret_cast<Accum(*)[First::kAccum]>(&d[0]), desc_a, desc_b, scale_d);
    if constexpr (BN > 256) {
      Rest::run(*reinterpret_cast<Accum(*)[Rest::kAccum]>(&d[First::kAccum]), desc_a,
                ptx::desc_advance(desc_b, TileB::offset_units(kFirstN, 0)), scale_d);
    }
  }
};

// Maps a linear work-unit index to a (cluster-sized) block of tiles, walking along M or N in groups
// of RASTER_GROUP units so that consecutive units reuse A or B tiles from L2 (Triton's GROUP_M order).
template <bool ALONG_M, int RASTER_GROUP>
struct Raster {
  __device__ __forceinline__ static void coords(int unit, int units_m, int units_n, int& um, int& un) {
    const int fast = ALONG_M ? units_m : units_n;  // the direction a group walks first
    const int slow = ALONG_M ? units_n : units_m;
    const int per_group = RASTER_GROUP * slow;
    const int group = unit / per_group;
    const int first = group * RASTER_GROUP;
    const int size = min(fast - first, RASTER_GROUP);
    const int within = unit - group * per_group;
    const int f = first + within % size, s = within / size;
    um = ALONG_M ? f : s;
    un = ALONG_M ? s : f;
  }
};

// GEMMGEN_SM90_EXPERIMENT_UNIT_INTERLEAVE's order: of `units` units read as G rows of units / G (the units past the
// last whole row stay in place), the one at `unit` in the column-major walk.
__host__ __device__ __forceinline__ constexpr int interleave_units(int unit, int units, int g) {
  const int per_row = g > 1 ? units / g : 0;
  return per_row == 0 || unit >= per_row * g ? unit : (unit % g) * per_row + unit / g;
}

// A 32 x 32 fp32 chunk of an M/N-major tile in shared memory (32 k rows of 32 M or N values, TMA's 128-byte swizzle:
// 16-byte piece j of row r at r * 128 + (j ^ r % 8) * 16, a function of the address in a 1024-byte-aligned chunk),
// transposed in place by one warp, becomes the K-major tile's 32 rows of the same M (N) values under the same
// swizzle (Kernel::transpose_slots: tf32, which wgmma reads K-major only). Seen as 8 x 8 blocks of 4 x 4, block
// (R, C) goes to (C, R), transposed. Each lane moves one block per round: in round p, lane 8q + R (quarter-warp q)
// takes C = R + 2q + p (mod 8), so round 0 moves the 32 blocks with C - R even and round 1 the others, each round a
// set closed under (R, C) -> (C, R): the warp loads all of a round's blocks, syncs, and stores them, and no store
// reaches a block of the other round. The eight lanes of a quarter-warp (one shared-memory wavefront of 16-byte
// accesses) reach eight different 16-byte bank groups at every load and store. Host-callable for
// tests/test_sm90_transpose.py.
struct ChunkTranspose {
  static constexpr int kRows = 32;
  static constexpr int kRounds = 2;
  struct Block {
    int r, c;  // rows 4r .. 4r + 3, piece c: moved to rows 4c .. 4c + 3, piece r
  };
  __host__ __device__ __forceinline__ static constexpr Block block(int lane, int round) {
    return {lane % 8, (lane % 8 + 2 * (lane / 8) + round) % 8};
  }
  // Byte offset of 16-byte piece `piece` (elements 4 * piece .. 4 * piece + 3) of row `row` of the chunk.
  __host__ __device__ __forceinline__ static constexpr uint32_t piece_offset(int row, int piece) {
    return static_cast<uint32_t>(row * kSwizzleRowBytes + ((piece ^ (row & 7)) << 4));
  }
};

// wgmma's A fragment of one k8 step of tf32, read from an M-major tile as TMA writes it (OperandTile, M/N-major: chunks
// of 32 k rows x 32 M values, 128 bytes a k row, 16-byte unit u of k row r at u ^ (r % 8)). PTX ISA §9.7.15.5.1.1
// (m64nNk8, .tf32): lane l of warp w holds rows r = 16w + l/4 and r + 8 at k c = l % 4 and c + 4, a0 (r, c), a1 (r + 8,
// c), a2 (r, c + 4), a3 (r + 8, c + 4). A warp loading a0 alone would meet 2-way bank conflicts (its rows fall in units
// u0 and u0 + 1, u0 a multiple of 4, which k rows c = 0..3 swizzle onto the same four units), so each row's two
// registers come in two passes in which lanes 0-15 read k c and lanes 16-31 k c + 4, then the other way round: units u0
// ^ {0..3} and (u0 + 1) ^ {4..7}, disjoint. Host-callable for tests/test_sm90_transpose.py.
struct RegisterFragmentA {
  static constexpr int kChunkRows = 32;  // M values of a chunk's 128-byte k row
  static constexpr int kChunkBytes = 32 * kSwizzleRowBytes;  // a k tile of tf32 is 32 k rows
  // Byte offset of element (m, k) of the tile (m from the tile's first row, k from the k tile's first k).
  __host__ __device__ __forceinline__ static constexpr uint32_t offset(int m, int k) {
    return static_cast<uint32_t>((m / kChunkRows) * kChunkBytes + k * kSwizzleRowBytes +
                                 ((((m % kChunkRows) / 4) ^ (k % 8)) << 4) + (m % 4) * 4);
  }
  // The k that lane `lane` reads in pass `pass` (0, 1) of k step kk.
  __host__ __device__ __forceinline__ static constexpr int pass_k(int lane, int kk, int pass) {
    return 8 * kk + lane % 4 + 4 * ((lane >= 16) != (pass == 1) ? 1 : 0);
  }
  // A k step is 8 k rows further on whatever the lane and pass (its k % 8 is the lane's, so the swizzle is the same):
  // offset(m, pass_k(lane, kk, pass)) = offset(m, pass_k(lane, 0, pass)) + kk * kStepBytes.
  static constexpr uint32_t kStepBytes = 8 * kSwizzleRowBytes;
  // The pass whose load is register a[r] (0 .. 3) of lane `lane`.
  __host__ __device__ __forceinline__ static constexpr int pass_of(int lane, int r) {
    return (lane >= 16) != (r >= 2) ? 1 : 0;
  }
  // The fragment row (0 .. 63 of an m64 block) of lane `lane` of warp `warp` in register a[h] and a[2 + h].
  __host__ __device__ __forceinline__ static constexpr int row(int warp, int lane, int h) {
    return 16 * warp + lane / 4 + 8 * h;
  }
};

template <class Cfg>
struct Kernel {
  using Elem = typename Cfg::Elem;
  using Out = typename Cfg::Out;
  static constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, STAGES = Cfg::kStages;
  static constexpr int CM = Cfg::kClusterM, CN = Cfg::kClusterN, CLUSTER = CM * CN;
  static constexpr Schedule SCHEDULE = Cfg::kSchedule;
  static constexpr bool PINGPONG = SCHEDULE == Schedule::kPingpong;
  static constexpr bool PERSISTENT = SCHEDULE != Schedule::kWarpSpecialized;
  static_assert(Cfg::kBlockK == kBlockKOf<sizeof(Elem)>, "the sm90 templates take BK = one 128-byte row of k values");
  static_assert((CM == 1 || CM == 2 || CM == 4) && (CN == 1 || CN == 2 || CN == 4) && CLUSTER <= 4,
                "clusters are 1x1, 2x1, 1x2, 2x2, 4x1 or 1x4");

  // The CN CTAs of a tile row share A; the CM CTAs of a tile column share B.
  static constexpr int kElemBytes = static_cast<int>(sizeof(Elem));
  using TileA = OperandTile<BM, Cfg::kAKMajor, CN, kElemBytes, GEMMGEN_SM90_A_BOX_ROWS>;
  using TileB = OperandTile<BN, Cfg::kBKMajor, CM, kElemBytes>;
  // The same tile of A in smaller boxes, for the tiles that cross A's last row (LoadMaps::a_edge); the boxes land
  // where one large box would put them (the swizzle repeats every 8 rows), so the consumers read either alike.
  using TileAEdge = OperandTile<BM, Cfg::kAKMajor, CN, kElemBytes, GEMMGEN_SM90_A_EDGE_BOX_ROWS>;
  static constexpr bool kAEdgeBoxes =
      Cfg::kAKMajor && GEMMGEN_SM90_A_EDGE_BOX_ROWS > 0 && TileAEdge::kBoxRows < TileA::kBoxRows;
  static constexpr int kBlockK = TileA::kBlockK, kMmaK = TileA::kMmaK;
  // tf32 operands that are M/N-major in global memory (every layout but tn): wgmma reads tf32 from shared memory
  // K-major only (PTX ISA §9.7.15.5.1), so TMA loads them M/N-major, as for 16-bit types, and the producer
  // warpgroup's other warps transpose each stage's chunks in place (transpose_slots) before the consumers read the
  // stage as a K-major tile (MmaTileA, MmaTileB).
  // An M-major tf32 A is read into registers instead (kARegisters, mainloop_a_registers; GEMMGEN_SM90_TF32_A_REGISTERS
  // 0 transposes it), and only B is transposed (layouts tt, nt).
  static constexpr bool kARegisters = GEMMGEN_SM90_TF32_A_REGISTERS && std::is_same_v<Elem, float> && !Cfg::kAKMajor;
  static constexpr bool kTransposeA = std::is_same_v<Elem, float> && !Cfg::kAKMajor && !kARegisters;
  static constexpr bool kTransposeB = std::is_same_v<typename Cfg::ElemB, float> && !Cfg::kBKMajor;
  static constexpr bool kTransposes = kTransposeA || kTransposeB;
  static constexpr bool kMmaAKMajor = Cfg::kAKMajor || kTransposeA || kARegisters;  // (registers: no descriptor of A)
  // The producer warpgroup's register budget: the transposing one's where it transposes, and where its warp 0 issues
  // the loads of an M-major tf32 A of many chunks (a 256-row tile's 8 per k tile spilled at 40 registers).
  static constexpr bool kWideProducer = kTransposes || kARegisters;
  static constexpr bool kMmaBKMajor = Cfg::kBKMajor || kTransposeB;
  using MmaTileA = OperandTile<BM, kMmaAKMajor, CN, kElemBytes>;
  using MmaTileB = OperandTile<BN, kMmaBKMajor, CM, kElemBytes>;
  // Warps 1-3 of the producer warpgroup (warp 0 issues the loads); each of their threads arrives on "full".
  static constexpr int kTransposerWarps = 3;
  static constexpr int kFullArrivals = kTransposes ? kTransposerWarps * 32 : 1;
  // The CTAs that write into a CTA's ring slots: itself, its CM - 1 column peers, its CN - 1 row peers.
  static constexpr int WRITERS_PER_SLOT = CM + CN - 1;
  static constexpr int STAGE_BYTES = TileA::kBytes + TileB::kBytes;
  static constexpr int RING_BYTES = STAGES * STAGE_BYTES;
  // Epilogue staging for the TMA store of a row-major D: per consumer warpgroup two buffers of one
  // subtile, 64 rows x 128 bytes (64 16-bit or 32 fp32 columns) in the 128-byte swizzle, so that the
  // fragment writes are free of bank conflicts; while TMA stores one buffer, the other is filled.
  static constexpr int kEpiRows = 64;
  static constexpr int kEpiCols = kSwizzleRowBytes / static_cast<int>(sizeof(Out));
  static constexpr int kEpiBufferBytes = kEpiRows * kSwizzleRowBytes;
  // A consumer warpgroup's share of a tile: rows [row_in_tile, row_in_tile + WG_M), columns [col_in_tile, col_in_tile +
  // WG_N). A pingpong warpgroup takes whole tiles; cooperative (and ws) tiles of 128 or 256 rows split along M (all BN
  // columns each); a 64-row cooperative tile splits along N (both the same 64 rows, BN / 2 columns each), so that two
  // wgmma streams run where a 64-row pingpong tile, the only tile of its CTA, leaves the second warpgroup idle; so
  // does a 192-row one (three m64 blocks each: 192 rows do not halve into whole m64 blocks).
  // A 64-row cooperative tile of promoted fp8 may instead interleave K (Cfg::kInterleaveK): its two consumer warpgroups
  // take alternate k tiles, each summing and promoting its own into accumulators of the whole tile, so that one
  // promotes while the other's wgmmas run (a 64-row pingpong tile, its CTA's only one, promotes alone), at the whole
  // tile's wgmma width; at the tile's end the second hands its sums over through the epilogue's staging buffers and
  // the first adds them and runs the epilogue (hand_over_sums, take_over_sums).
  static constexpr bool INTERLEAVE_K = Cfg::kInterleaveK;
  static constexpr bool SPLIT_N = !PINGPONG && !INTERLEAVE_K && (BM == kMmaM || BM == 3 * kMmaM);
  static constexpr int WG_M = PINGPONG || SPLIT_N || INTERLEAVE_K ? BM : BM / kConsumerWarpgroups;
  static constexpr int WG_N = SPLIT_N ? BN / kConsumerWarpgroups : BN;
  static constexpr int MMA_BLOCKS_M = WG_M / kMmaM;
  // (One buffer per subtile, so that no store is waited for inside a tile, measured no faster: docs/sm90.md,
  // "The epilogue".)
  static constexpr int kEpiBuffers = 2;
  // Staged in the ring (Cfg::kStagingInRing): a tile's staging buffers are the ring slot of its last k tile, which the
  // consumer holds (does not release to the producer) until its stores have read them, so that the shared memory of
  // the staging buffers goes to the ring as more stages. A cooperative tile's two warpgroups share the slot.
  static constexpr bool kStagingInRing = Cfg::kStagingInRing;
  static constexpr int kSlotStagingBytes = (PINGPONG ? 1 : kConsumerWarpgroups) * kEpiBuffers * kEpiBufferBytes;
  static constexpr int EPILOGUE_BYTES = kStagingInRing ? 0 : kConsumerWarpgroups * kEpiBuffers * kEpiBufferBytes;
  // The epilogue's source (an M x N operand, C in alpha * acc + beta * C; Cfg::Epilogue::kSourceSlot) comes
  // by TMA into the staging buffers themselves, one subtile per buffer, and is read from there just before
  // D's subtile overwrites it (as CUTLASS reuses C's shared memory for D): no shared memory of its own, so
  // the ring keeps its stages. Each buffer has a barrier that the source's bytes complete.
  static constexpr bool kSourced = Cfg::Epilogue::kSourceSlot >= 0;
  static constexpr int SOURCE_BARRIERS = kSourced ? kConsumerWarpgroups * kEpiBuffers : 0;
  // A transposing kernel's TMA loads complete on a "loaded" barrier per slot, and the transposer warps' arrivals make
  // the slot full.
  static constexpr int LOADED_BARRIERS = kTransposes ? STAGES : 0;
  static constexpr int BARRIER_BYTES = (2 * STAGES + SOURCE_BARRIERS + LOADED_BARRIERS) * 8;
  static constexpr int CHUNK_WORD_BYTES = kTransposes ? STAGES * 4 : 0;  // after the barriers (Smem::chunks)
  static constexpr int SMEM_BYTES = RING_BYTES + EPILOGUE_BYTES + kSmemAlignSlack;
  static_assert(BARRIER_BYTES + CHUNK_WORD_BYTES <= kSmemAlignSlack / 2, "barriers live in the alignment slack");
  static_assert(SMEM_BYTES <= Cfg::kMaxSmemBytes, "the planner keeps the ring within the arch's shared memory");
  static_assert(!kStagingInRing || (STAGE_BYTES >= kSlotStagingBytes && !kSourced && !kTransposes && !kARegisters &&
                                    !Cfg::kPromote && !Cfg::kStreamK && !GEMMGEN_SM90_STREAM_K),
                "staging in the ring: a slot holds the tile's staging buffers, mainloop's whole tiles only "
                "(spec/config.py check_staging_in_ring)");
  static constexpr int CONSUMERS_PER_STAGE = PINGPONG || INTERLEAVE_K ? 1 : kConsumerWarpgroups;
  using Mma = TileMma<WG_N, Elem, typename Cfg::ElemB, kMmaAKMajor ? 0 : 1, kMmaBKMajor ? 0 : 1, MmaTileB>;
  static_assert(sizeof(typename Cfg::ElemB) == sizeof(Elem), "A and B differ only as fp8 formats (one byte each)");
  static constexpr int ACCUM = Mma::kAccum;  // per m64 block and thread
  static_assert(WG_M % kMmaM == 0, "a consumer warpgroup owns whole m64 blocks");
  static_assert(MMA_BLOCKS_M * ACCUM <= 160, "accumulators beyond 160 of the 232 registers per thread would spill");
  static_assert(!SPLIT_N || BN % (kConsumerWarpgroups * 64) == 0,
                "a tile split along N: whole 64-column epilogue subtiles and B chunks per warpgroup");
  static_assert(!INTERLEAVE_K || (!PINGPONG && BM == kMmaM && Cfg::kPromote && !kSourced && !kStagingInRing &&
                                  !Cfg::kStreamK &&
                                  MMA_BLOCKS_M * ACCUM * kWarpgroupThreads * 4 <= EPILOGUE_BYTES),
                "k interleaved: a 64-row cooperative promoted tile whose sums fit the staging buffers, which no source "
                "operand uses (spec/config.py check_interleave_k)");

  // Promotion (fp8, see mainloop_promoted) holds a second set of accumulators, the current k tile's; per-block
  // scales (fp8 with scale="block") are applied there.
  static constexpr bool kBlockScaled = Cfg::Epilogue::kRowBlocksSlot >= 0;
  static_assert(!kBlockScaled || Cfg::kPromote, "block scales are applied where k tiles are promoted");
  static_assert(kBlockScaled == (Cfg::Epilogue::kColBlocksSlot >= 0), "A and B are block-scaled together");
  static_assert(!kBlockScaled || kBlockK == Cfg::Epilogue::kScaleBlockK,
                "a k tile is one scale block (8-bit types: BK = 128)");
  // Promotion sums each k tile in slices of PROMOTE_N columns, one slice after the other into `part`, so that the
  // tile's sums and one slice's fit the registers together: the whole tile up to 96 accumulators, halves beyond
  // (128x256: 128 + 64; the halves re-read A from shared memory, which has the bandwidth to spare).
  static constexpr int kPromotedMaxAccumulators = 96;  // spec/config.py SM90_PROMOTED_MAX_ACCUMULATORS
  // (Of this warpgroup's WG_N columns: the tile's, or its half of a 64-row tile split along N.)
  static constexpr int PROMOTE_N = MMA_BLOCKS_M * ACCUM <= kPromotedMaxAccumulators ? WG_N : WG_N / 2;
  static constexpr int PROMOTE_SLICES = WG_N / PROMOTE_N;
  static constexpr int SLICE_ACCUM = PROMOTE_N / 2;
  static_assert(!Cfg::kPromote || MMA_BLOCKS_M * (ACCUM + SLICE_ACCUM) <= 2 * kPromotedMaxAccumulators,
                "promotion keeps the tile's sums and a slice's: the planner limits the tile (spec/config.py)");
  static_assert(!kBlockScaled || BN <= 256, "a tile spans at most two 128-column scale blocks (BlockScales)");

  static constexpr bool STREAM_K = (GEMMGEN_SM90_STREAM_K || Cfg::kStreamK) && SCHEDULE != Schedule::kWarpSpecialized;
  // int8: wgmma sums into int32 registers (Accum); after the main loop they go on to the epilogue as fp32 values,
  // or, for an int32 D, as their bits in float variables (stored as they are: from_accumulator).
  using Accum = typename Mma::Accum;
  static constexpr bool kIntAccum = std::is_same_v<Accum, int32_t>;
  static constexpr bool kAccumBits = kIntAccum && std::is_same_v<Out, int32_t>;
  static_assert(!(STREAM_K && kIntAccum), "stream-K adds partial tiles as fp32");
  // Quantize-on-store (an fp8 D): each row's values in blocks of kQuantBlock columns, rounded to bf16 first (the
  // value a bf16 D holds), scaled by the block's s = max(amax, FLT_MIN) / the fp8 maximum into fp8, s written to
  // args.aux ((M, ceil(N / kQuantBlock)) fp32, row stride args.ldaux): generator.quantize(D_bf16, scale="block")
  // bit for bit (quantize_out). A block is 16 n8 blocks of the accumulator layout, whose rows each quad of lanes
  // holds: the block's amax is the quad's, two shuffles. One staging subtile of fp8 is exactly one block wide.
  static constexpr bool kQuantizesOut = kIsFp8<Out>;
  static constexpr int kQuantBlock = 128;  // spec/config.py QUANT_BLOCK
  static_assert(!kQuantizesOut || (WG_N % kQuantBlock == 0 && Cfg::kDRowMajor && !STREAM_K && !kSourced),
                "a quantized D: whole 128-column blocks per warpgroup, row-major, no stream-K, no source operand "
                "(spec/config.py check_quantized_out)");
  static_assert(!Cfg::kAmax || kQuantizesOut, "the amax of D is a quantized D's (spec/config.py check_config)");
  // Stream-K workspace: per CTA of the grid and consumer warpgroup one partial tile (fp32, in fragment
  // order: register r of thread t at r * 128 + t, so each access is coalesced) and one flag (LaunchWorkspace).
  static constexpr int kPartialFloats = WG_M * WG_N;
  static_assert(ACCUM % 4 == 0, "partial sums move as float4");
  __host__ __device__ __forceinline__ static size_t workspace_slots(int ctas) {
    return static_cast<size_t>(ctas) * kConsumerWarpgroups;
  }
  __host__ __device__ __forceinline__ static size_t workspace_partials_bytes(int ctas) {
    return workspace_slots(ctas) * kPartialFloats * sizeof(float);
  }

  // One problem's sizes and tiles; a batch (GemmArgs::batch) repeats them per problem, and its work units
  // are (problem, unit of the problem) pairs, problem-major. Grouped rows (GemmArgs::group_ends): the problems
  // are the groups, each of its own rows of A and D (m: all of them), walked in order (GroupWalk).
  struct Problem {
    int m, n, k;
    int tiles_m, tiles_n;  // CTA tiles
    int units_m, units_n;  // cluster-sized blocks of tiles
    int units_per_problem;
    int units;             // of all problems (grouped: counted on the device, with_group_units)
    int k_tiles;
    bool a_batched, b_batched;  // whether A's (B's) matrix differs per problem (else batch stride 0: one for all)
    const int32_t* group_ends;  // grouped rows: the groups' ends (masked: counts); null otherwise
    // Grouped rows' groups, or the list's problems. Negative for masked groups (GemmArgs::group_rows): -E, each group
    // a slab of m / E rows (no field of its own: a register more, live through every kernel, made the int8 128x256
    // fused-epilogue kernel spill).
    int groups;
    const ListProblem* list;    // a list of problems (on the device); null otherwise
    // A grouped tile's bounded problem (consume): its group's first column of the per-column operands, g * N, for an
    // epilogue that reads each group's own (Epilogue::kColsPerGroup: fp8 per-row scales, scale_b (E, N)); 0 otherwise.
    int group_cols;
  };

  // Also the host's (launch.cuh: the persistent grid is sized by p.units).
  __host__ __device__ __forceinline__ static Problem problem(const GemmArgs& args) {
    Problem p;
    p.m = static_cast<int>(args.m);
    p.n = static_cast<int>(args.n);
    p.k = static_cast<int>(args.k);
    p.tiles_m = (p.m + BM - 1) / BM;
    p.tiles_n = (p.n + BN - 1) / BN;
    p.units_m = (p.tiles_m + CM - 1) / CM;
    p.units_n = (p.tiles_n + CN - 1) / CN;
    p.units_per_problem = p.units_m * p.units_n;
    p.units = p.units_per_problem * static_cast<int>(batch_count(args));
    p.k_tiles = (p.k + kBlockK - 1) / kBlockK;
    p.a_batched = batch_count(args) > 1 && args.batch_stride_a != 0;
    p.b_batched = batch_count(args) > 1 && args.batch_stride_b != 0;
    p.group_ends = args.group_ends;
    p.groups = static_cast<int>(batch_count(args)) * (is_masked(args) ? -1 : 1);
    p.list = static_cast<const ListProblem*>(args.list_device);
    p.group_cols = 0;
    if (p.group_ends != nullptr || p.list != nullptr) p.units = 0;  // counted on the device: with_group_units
    return p;
  }

  // Whether some tile crosses A's last row (a ragged M, or a group's end), so that the launch encodes LoadMaps::a_edge
  // and the producer prefetches it. A listed problem's tiles load A through its own map (LoadMaps::a_edge null).
  __host__ __device__ __forceinline__ static bool uses_a_edge_map(const Problem& p) {
    return kAEdgeBoxes && p.list == nullptr && (p.group_ends != nullptr || p.m % BM != 0);
  }

  // Grouped rows as work units: clusters of CM tiles along M per unit.
  __device__ __forceinline__ static GroupedRows grouped_rows(const Problem& p) {
    const int groups = p.groups < 0 ? -p.groups : p.groups;
    return GroupedRows{p.group_ends, groups, p.m, BM * CM, p.units_n, p.groups < 0 ? p.m / groups : 0};
  }

  __device__ __forceinline__ static ProblemList problem_list(const Problem& p) { return ProblemList{p.list, p.groups}; }

  // The problem with its work units counted, for grouped rows (each warp counts them itself, from the same ends:
  // called by whole warps) and for a list of problems.
  __device__ __forceinline__ static Problem with_group_units(Problem p) {
    if (p.group_ends != nullptr) p.units = grouped_rows(p).warp_units();
    if (p.list != nullptr) p.units = problem_list(p).units();
    return p;
  }

  // Grouped rows: the walk at this block's first unit, found by a warp together (warp_seek; called by whole warps:
  // the producer's first, each consumer warp). The producer's thread and the consumers walk on alone from there:
  // their next units are a grid's stride on, and the first one's walk already went past every group before it.
  __device__ __forceinline__ static GroupedRows::Walk first_walk(const Problem& p, int first) {
    GroupedRows::Walk walk;
    if (Cfg::kWalksGroups && p.group_ends != nullptr && first < p.units) walk.warp_seek(grouped_rows(p), first);
    return walk;
  }
  template <Walking W>
  __device__ __forceinline__ static WalkOf<W> starting_walk(const GroupedRows::Walk& start) {
    if constexpr (W == Walking::kRows) {
      return start;
    } else {
      return WalkOf<W>{};
    }
  }

  // This CTA's place in its cluster: rank = rm + CM * rn, rm along M and rn along N.
  struct ClusterPlace {
    int rm, rn;
  };
  __device__ __forceinline__ static ClusterPlace place(uint32_t rank) {
    return {static_cast<int>(rank % CM), static_cast<int>(rank / CM)};
  }

  // A CTA's tile: its problem (of a batch, group or list), its origin in that problem's D (elements; grouped rows:
  // in the one D of all groups), where the problem's rows and columns end (M and N, a group's end, a listed
  // problem's M and N), its k tiles and where they start in A's and B's maps (a group along K's first k value).
  struct TileAt {
    int problem, m0, n0, row_end, col_end, k_tiles;
    int k_begin = 0;
    // The problem as the tile's epilogue bounds it: a group's rows end at its end, a listed problem's at its M, N.
    __device__ __forceinline__ Problem bounded(const Problem& p) const {
      Problem tile = p;
      tile.m = row_end;
      tile.n = col_end;
      return tile;
    }
  };

  // The tile this CTA computes for work unit `unit`; W: how units map to tiles, `walk` the calling thread's walk
  // over groups or listed problems (compile-time, so that the walk state costs the other calls no registers).
  template <Walking W>
  __device__ __forceinline__ static TileAt tile_origin(const Problem& p, int unit, uint32_t rank, WalkOf<W>& walk) {
    int problem, local, units_m, units_n = p.units_n, row0 = 0, row_end = p.m, col_end = p.n, k_tiles = p.k_tiles;
    int k_begin = 0;
    if constexpr (W == Walking::kRows) {
      walk.seek(grouped_rows(p), unit);
      problem = walk.group;
      local = unit - walk.first_unit;
      units_m = walk.units_m;
      row0 = walk.row0;
      row_end = walk.row_end;
    } else if constexpr (W == Walking::kList) {
      walk.seek(problem_list(p), unit);
      problem = walk.problem;
      local = unit - walk.first_unit;
      units_m = walk.units_m;
      units_n = walk.units_n;
      row_end = walk.m;
      col_end = walk.n;
      k_tiles = walk.k_tiles;
      k_begin = walk.k_begin;
    } else {
      problem = unit / p.units_per_problem;
      local = unit - problem * p.units_per_problem;
      units_m = p.units_m;
      if constexpr (GEMMGEN_SM90_EXPERIMENT_UNIT_INTERLEAVE > 1) {
        local = interleave_units(local, p.units_per_problem, GEMMGEN_SM90_EXPERIMENT_UNIT_INTERLEAVE);
      }
    }
    int um, un;
    Raster<Cfg::kRasterAlongM, Cfg::kRasterGroup>::coords(local, units_m, units_n, um, un);
    const ClusterPlace at = place(rank);
    return TileAt{problem, row0 + (um * CM + at.rm) * BM, (un * CN + at.rn) * BN, row_end, col_end, k_tiles,
                  k_begin};
  }

  struct Smem {
    uint32_t ring;   // stage s: A at ring + s * STAGE_BYTES, B right after it
    uint32_t full;   // STAGES barriers of 8 bytes
    uint32_t empty;
    uint32_t epilogue;  // kConsumerWarpgroups x kEpiBuffers staging buffers
    uint32_t source;    // SOURCE_BARRIERS barriers: the source's subtile in staging buffer (consumer, b) arrived
    uint32_t loaded;    // LOADED_BARRIERS barriers: slot s's loads arrived (a transposing kernel)
    uint32_t chunk_words;  // a transposing kernel: per slot, the chunks to transpose (chunks_to_transpose)
    __device__ __forceinline__ uint32_t a(int s) const { return ring + s * STAGE_BYTES; }
    __device__ __forceinline__ uint32_t b(int s) const { return ring + s * STAGE_BYTES + TileA::kBytes; }
    __device__ __forceinline__ uint32_t full_bar(int s) const { return full + s * 8; }
    __device__ __forceinline__ uint32_t empty_bar(int s) const { return empty + s * 8; }
    __device__ __forceinline__ uint32_t loaded_bar(int s) const { return loaded + s * 8; }
    __device__ __forceinline__ uint32_t chunks(int s) const { return chunk_words + s * 4; }
    // The barrier the slot's TMA loads complete on.
    __device__ __forceinline__ uint32_t load_bar(int s) const { return kTransposes ? loaded_bar(s) : full_bar(s); }
    __device__ __forceinline__ uint32_t epi_buffer(int consumer, int b) const {
      return epilogue + (consumer * kEpiBuffers + b) * kEpiBufferBytes;
    }
    __device__ __forceinline__ uint32_t source_bar(int consumer, int b) const {
      return source + (consumer * kEpiBuffers + b) * 8;
    }
  };

  // A position in the ring of stages: slot and the parity of the phase to wait for.
  struct RingPos {
    int stage = 0;
    uint32_t phase = 0;
    // The next slot (the main loops' step: a branch, not the general loop below).
    __device__ __forceinline__ void next() {
      if (++stage == STAGES) {
        stage = 0;
        phase ^= 1;
      }
    }
    __device__ __forceinline__ void advance(int steps) {
      stage += steps;
      while (stage >= STAGES) {
        stage -= STAGES;
        phase ^= 1;
      }
    }
  };

  // workspace: the stream-K partial sums and flags; unused otherwise.
  // tmap_source: the epilogue source's map when source_tma_possible(args), else unused.
  __device__ static void run(const LoadMaps& maps, const CUtensorMap* tmap_d, const CUtensorMap* tmap_source,
                             const GemmArgs& args, const LaunchWorkspace& workspace, char* smem_raw) {
    const uint32_t raw = ptx::smem_addr(smem_raw);
    const uint32_t aligned = (raw + kSmemAlignSlack - 1) & ~uint32_t(kSmemAlignSlack - 1);
    // (never: dynamic shared memory starts aligned)
    if (aligned - raw + BARRIER_BYTES + CHUNK_WORD_BYTES > kSmemAlignSlack) __trap();
    const uint32_t barriers = aligned + RING_BYTES + EPILOGUE_BYTES;
    Smem smem{aligned, barriers, barriers + STAGES * 8, aligned + RING_BYTES, barriers + 2 * STAGES * 8,
              barriers + (2 * STAGES + SOURCE_BARRIERS) * 8, barriers + BARRIER_BYTES};
    // Broadcast from lane 0 so that the compiler knows the warpgroup (and all derived from it: the
    // consumer's rows, its descriptors) to be warp-uniform and keeps it in uniform registers.
    const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / kWarpgroupThreads, 0);
    const uint32_t rank = CLUSTER > 1 ? ptx::cluster_ctarank() : 0;

    if (threadIdx.x == 0) {
      for (int s = 0; s < STAGES; ++s) {
        ptx::mbarrier_init(smem.full_bar(s), kFullArrivals);
        ptx::mbarrier_init(smem.empty_bar(s), CONSUMERS_PER_STAGE * WRITERS_PER_SLOT);
      }
      for (int s = 0; s < LOADED_BARRIERS; ++s) ptx::mbarrier_init(smem.loaded_bar(s), 1);
      for (int b = 0; b < SOURCE_BARRIERS; ++b) ptx::mbarrier_init(smem.source + b * 8, 1);
      ptx::fence_mbarrier_init_cluster();
    }
    // Barriers initialized before any CTA of the cluster loads into them or arrives on them.
    if constexpr (CLUSTER > 1) {
      ptx::cluster_sync();
    } else {
      __syncthreads();
    }
    // Launched early (launch.cuh: programmatic stream serialization), the block has come this far while the stream's
    // previous kernel may still run: nothing above touched global memory, and nothing below does before it is done.
    ptx::grid_dependency_wait();

    const int first = first_unit(workspace);  // this block's (cluster's) first work unit
    if (warpgroup == 0) {
      // Grouped rows: counted and walked to the first unit by the producer's whole warp, before its registers go
      // (kept in the walk the producer's one thread goes on with).
      Problem p = problem(args);
      GroupedRows::Walk start;
      if (threadIdx.x < 32) {
        p = with_group_units(p);
        start = first_walk(p, first);
      }
      ptx::setmaxnreg_dec<kWideProducer ? kTransposingProducerRegisters : kProducerRegisters>();
      if (threadIdx.x == 0) {
        produce(p, smem, maps, rank, first, start);
      } else if (kTransposes && threadIdx.x >= 32) {
        transpose_slots(smem);
      }
      __syncwarp();
    } else {
      ptx::setmaxnreg_inc<kWideProducer ? kTransposingConsumerRegisters : kConsumerRegisters>();
      const Problem p = with_group_units(problem(args));
      const GroupedRows::Walk start = first_walk(p, first);
      if constexpr (STREAM_K) {  // (not instantiated otherwise: its partial tiles are fp32 only)
        if (p.k_tiles > 0) {
          consume_stream_k(p, smem, args, tmap_d, rank, first, warpgroup - 1, workspace);
        } else {
          consume<Walking::kFlat>(p, smem, args, tmap_d, tmap_source, rank, first, warpgroup - 1);
        }
      } else if (Cfg::kWalksLists && p.list != nullptr) {
        consume<Cfg::kWalksLists ? Walking::kList : Walking::kFlat>(p, smem, args, tmap_d, tmap_source, rank,
                                                                    first, warpgroup - 1);
      } else if (Cfg::kWalksGroups && p.group_ends != nullptr) {
        consume<Cfg::kWalksGroups ? Walking::kRows : Walking::kFlat>(p, smem, args, tmap_d, tmap_source, rank,
                                                                     first, warpgroup - 1, start);
      } else {
        consume<Walking::kFlat>(p, smem, args, tmap_d, tmap_source, rank, first, warpgroup - 1);
      }
    }
    // A CTA's shared memory must outlive the peer's multicast writes and remote arrivals into it.
    if constexpr (CLUSTER > 1) ptx::cluster_sync();
  }

  // Which slice of each shared operand this CTA loads, and the ranks it multicasts that slice to:
  // A is shared along the tile row (same rm), B along the tile column (same rn).
  struct Sharing {
    int part_a, part_b;
    uint16_t sharers_a, sharers_b;
  };
  __device__ __forceinline__ static Sharing sharing(uint32_t rank) {
    const ClusterPlace at = place(rank);
    uint16_t row = 0;
    for (int j = 0; j < CN; ++j) row |= uint16_t(1u << (at.rm + CM * j));
    const uint16_t column = uint16_t(((1u << CM) - 1) << (CM * at.rn));
    return Sharing{at.rn, at.rm, row, column};
  }

  // Work units of this CTA's cluster: persistent schedules stride over all units by the number of
  // clusters in the grid; ws launches one cluster per unit, so its loop runs once. The first is the cluster's index,
  // or for a 1x1 grid the launch passes an order for (sm90/block_order.cuh) its block's place in that order.
  __device__ __forceinline__ static int first_unit(const LaunchWorkspace& workspace) {
    const int block = static_cast<int>(blockIdx.x);
    if constexpr (CLUSTER == 1) {
      if (block < workspace.ordered) return workspace.order[block];
    }
    return block / CLUSTER;
  }
  __device__ __forceinline__ static int unit_stride(const Problem& p) {
    return PERSISTENT ? static_cast<int>(gridDim.x) / CLUSTER : p.units;
  }

  __device__ static void produce(const Problem& p, const Smem& smem, const LoadMaps& maps, uint32_t rank, int first,
                                 GroupedRows::Walk start) {
    ptx::prefetch_tensormap(maps.a);
    ptx::prefetch_tensormap(maps.b);
    // (fetched ahead as A's and B's: the edge tiles come last in M, but a short K reaches them early)
    if (uses_a_edge_map(p)) ptx::prefetch_tensormap(maps.a_edge);
    const Sharing share = sharing(rank);
    RingPos pos;
    if (STREAM_K && p.k_tiles > 0) {
      const StreamK sk(p.units, p.k_tiles, static_cast<int>(gridDim.x) / CLUSTER);
      WalkOf<Walking::kFlat> walk;  // (unused: flat units)
      sk.for_each_segment(first, [&](const StreamK::Segment& s) {
        const TileAt at = tile_origin<Walking::kFlat>(p, s.unit, rank, walk);
        load_k_tiles(p, smem, maps, pos, at, s.kt_begin, s.kt_end, share);
      });
    } else if (Cfg::kWalksLists && p.list != nullptr) {
      produce_units<Cfg::kWalksLists ? Walking::kList : Walking::kFlat>(p, smem, maps, rank, first, pos, share, start);
    } else if (Cfg::kWalksGroups && p.group_ends != nullptr) {
      produce_units<Cfg::kWalksGroups ? Walking::kRows : Walking::kFlat>(p, smem, maps, rank, first, pos, share, start);
    } else {
      produce_units<Walking::kFlat>(p, smem, maps, rank, first, pos, share, start);
    }
    if constexpr (kTransposes) end_transposes(smem, pos);
    // Every load of this block is issued: the stream's next kernel may be scheduled (it waits for this one's end
    // before it touches memory), so that its launch overlaps this block's last tiles and epilogue.
    ptx::launch_dependents();
  }

  // The producer's loads of this cluster's whole work units. A listed problem's operands come through its own
  // maps, which the host wrote to global memory: acquired once per problem (the tensormap proxy's fence).
  template <Walking W>
  __device__ __forceinline__ static void produce_units(const Problem& p, const Smem& smem, const LoadMaps& maps,
                                                       uint32_t rank, int first, RingPos& pos, const Sharing& share,
                                                       GroupedRows::Walk start) {
    WalkOf<W> walk = starting_walk<W>(start);
    int acquired = -1;  // (kList) the problem whose maps this thread has acquired
    for (int unit = first; unit < p.units; unit += unit_stride(p)) {
      const TileAt at = tile_origin<W>(p, unit, rank, walk);
      if constexpr (W == Walking::kList) {
        const ListProblem& listed = p.list[at.problem];
        if (at.problem != acquired) {
          ptx::fence_proxy_tensormap_acquire(&listed.a);
          ptx::fence_proxy_tensormap_acquire(&listed.b);
          acquired = at.problem;
        }
        load_k_tiles(p, smem, LoadMaps{&listed.a, nullptr, &listed.b}, pos, at, 0, at.k_tiles, share);
      } else {
        load_k_tiles(p, smem, maps, pos, at, 0, at.k_tiles, share);
      }
    }
  }

  // The producer's TMA loads of k tiles [kt_begin, kt_end) of tile `at`, one ring slot each. A tile that crosses
  // A's last row loads A through the edge map, when there is one. Every sharer of the A tile sees the same origin
  // and the same maps, so all take the same boxes and expect the same bytes.
  __device__ __forceinline__ static void load_k_tiles(const Problem& p, const Smem& smem, const LoadMaps& maps,
                                                      RingPos& pos, const TileAt& at, int kt_begin, int kt_end,
                                                      const Sharing& share) {
    if (kAEdgeBoxes && maps.a_edge != nullptr && at.m0 + BM > at.row_end) {  // (a listed problem's: null)
      load_k_range<TileAEdge>(p, smem, maps.a_edge, maps.b, pos, at, kt_begin, kt_end, share);
    } else {
      load_k_range<TileA>(p, smem, maps.a, maps.b, pos, at, kt_begin, kt_end, share);
    }
  }

  // The loop of load_k_tiles, once per way of loading A: the choice is made once per tile, outside the loop, so that
  // an inner tile's loop is the one it had before the edge boxes.
  template <class LoadedA>
  __device__ __forceinline__ static void load_k_range(const Problem& p, const Smem& smem, const CUtensorMap* tmap_a,
                                                      const CUtensorMap* tmap_b, RingPos& pos, const TileAt& at,
                                                      int kt_begin, int kt_end, const Sharing& share) {
    const int matrix_a = p.a_batched ? at.problem : 0, matrix_b = p.b_batched ? at.problem : 0;
    const int stage_bytes =
        STAGE_BYTES - LoadedA::skipped_bytes(at.m0, at.row_end) - TileB::skipped_bytes(at.n0, at.col_end);
    const uint32_t chunks = kTransposes ? chunks_to_transpose(at) : 0;
    for (int kt = kt_begin; kt < kt_end; ++kt) {
      ptx::mbarrier_wait(smem.empty_bar(pos.stage), pos.phase ^ 1);
      if constexpr (kTransposes) ptx::st_shared_b32(smem.chunks(pos.stage), chunks);  // (before the arrival's release)
      const uint32_t full = smem.load_bar(pos.stage);
      ptx::mbarrier_arrive_expect_tx(full, stage_bytes);
      const int k0 = at.k_begin + kt * kBlockK;
      LoadedA::load(tmap_a, smem.a(pos.stage), full, at.m0, k0, matrix_a, share.part_a, share.sharers_a, at.row_end);
      TileB::load(tmap_b, smem.b(pos.stage), full, at.n0, k0, matrix_b, share.part_b, share.sharers_b, at.col_end);
      pos.next();
    }
  }

  // Which chunks of a slot the transposer warps transpose, one bit each (A's first, then B's): the M/N-major chunks
  // that the producer loads (OperandTile::loaded_units: those past the tile's kept rows or columns are skipped, and
  // their stale bytes reach only products that nothing stores, as in a K-major tile). kEndOfWork: no more slots.
  static constexpr int kChunksA = kTransposeA ? TileA::kChunks : 0;
  static constexpr int kChunksB = kTransposeB ? TileB::kChunks : 0;
  static constexpr uint32_t kEndOfWork = 1u << 31;
  static_assert(kChunksA + kChunksB < 31, "a slot's chunks are bits of one word");
  static_assert(!kTransposes || (TileA::kRowElems == ChunkTranspose::kRows &&
                                  TileA::kChunkBytes == ChunkTranspose::kRows * kSwizzleRowBytes),
                "transpose_round takes 32 x 32 fp32 chunks");
  __device__ __forceinline__ static uint32_t chunks_to_transpose(const TileAt& at) {
    const uint32_t a = kTransposeA ? TileA::loaded_units(at.m0, at.row_end) : 0;
    const uint32_t b = kTransposeB ? TileB::loaded_units(at.n0, at.col_end) : 0;
    return a | (b << kChunksA);
  }

  // The producer's last word to the transposer warps, after its last slot: the next slot says kEndOfWork (once the
  // consumers have freed it, since the transposers may still read that slot's word of the lap before).
  __device__ __forceinline__ static void end_transposes(const Smem& smem, const RingPos& pos) {
    ptx::mbarrier_wait(smem.empty_bar(pos.stage), pos.phase ^ 1);
    ptx::st_shared_b32(smem.chunks(pos.stage), kEndOfWork);
    ptx::mbarrier_arrive_expect_tx(smem.loaded_bar(pos.stage), 0);
  }

  // The transposer warps (a transposing kernel's producer warpgroup but its first warp), slot after slot until the
  // producer's kEndOfWork: wait for the slot's loads, transpose the chunks its word names in place (each warp every
  // kTransposerWarps-th), make the writes visible to wgmma (the async proxy) and arrive on the slot's "full" barrier.
  __device__ static void transpose_slots(const Smem& smem) {
    const int thread = static_cast<int>(threadIdx.x) - 32;
    const int warp = thread / 32, lane = thread % 32;
    for (RingPos pos;; pos.next()) {
      ptx::mbarrier_wait(smem.loaded_bar(pos.stage), pos.phase);
      const uint32_t chunks = ptx::ld_shared_b32(smem.chunks(pos.stage));
      if (chunks & kEndOfWork) return;
      // Whole chunks per warp, both rounds back to back (measured 3-19 % faster than the rounds as work units of their
      // own with one arrival per warp: h200_bench_tf32_by_chunk.json).
#pragma unroll 1
      for (int c = warp; c < kChunksA + kChunksB; c += kTransposerWarps) {
        if (GEMMGEN_SM90_EXPERIMENT_SKIP_TRANSPOSE || !((chunks >> c) & 1)) continue;
        const uint32_t chunk = c < kChunksA ? smem.a(pos.stage) + c * TileA::kChunkBytes
                                            : smem.b(pos.stage) + (c - kChunksA) * TileB::kChunkBytes;
#pragma unroll
        for (int round = 0; round < ChunkTranspose::kRounds; ++round) transpose_round(chunk, lane, round);
      }
      ptx::fence_proxy_async_smem();  // (this thread's writes, before its arrival's release)
      ptx::mbarrier_arrive(smem.full_bar(pos.stage));
    }
  }

  // Column j of the 4 x 4 block whose rows are `rows` (j known at compile time: a choice of registers).
  __device__ __forceinline__ static uint4 column(const uint4 (&rows)[4], int j) {
    const auto at = [j](const uint4& v) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; };
    return make_uint4(at(rows[0]), at(rows[1]), at(rows[2]), at(rows[3]));
  }
  // One round of a chunk's transpose by one warp, one 4 x 4 block per lane (ChunkTranspose::block): its four rows
  // loaded, the warp synced (every block of the round read before any is overwritten), its four columns stored as the
  // rows of its mirror.
  __device__ __forceinline__ static void transpose_round(uint32_t chunk, int lane, int round) {
    const ChunkTranspose::Block b = ChunkTranspose::block(lane, round);
    uint4 x[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = ptx::ld_shared_v4_b32(chunk + ChunkTranspose::piece_offset(4 * b.r + i, b.c));
    __syncwarp();
#pragma unroll
    for (int j = 0; j < 4; ++j) ptx::st_shared_16(chunk + ChunkTranspose::piece_offset(4 * b.c + j, b.r), column(x, j));
  }

  // W: how the units map to tiles (the launch passes grouped rows only to a config with Cfg::kWalksGroups, a list
  // only to one with Cfg::kWalksLists). start: grouped rows' walk at `first` (first_walk).
  template <Walking W>
  __device__ static void consume(const Problem& p, const Smem& smem, const GemmArgs& args, const CUtensorMap* tmap_d,
                                 const CUtensorMap* tmap_source, uint32_t rank, int first, int consumer,
                                 GroupedRows::Walk start = GroupedRows::Walk{}) {
    Epilogue epi{smem, tmap_d, consumer, 0, tma_store_possible(args), tmap_source, source_tma_possible(args)};
    epi.grouped = W == Walking::kRows;
    const int row_in_tile = WG_M == BM ? 0 : consumer * WG_M;
    const int col_in_tile = SPLIT_N ? consumer * WG_N : 0;
    RingPos pos;
    int local = 0;  // this CTA's work units so far
    WalkOf<W> walk = starting_walk<W>(start);
    for (int unit = first; unit < p.units; unit += unit_stride(p), ++local) {
      const TileAt at = tile_origin<W>(p, unit, rank, walk);
      if (PINGPONG && (local & 1) != consumer) {
        pos.advance(at.k_tiles);  // the other warpgroup's tile: its k tiles' slots
        continue;
      }
      const bool next_exists = unit + unit_stride(p) < p.units;  // pingpong: the other warpgroup's next tile
      const int m0 = at.m0, n0 = at.n0 + col_in_tile;  // (n0: this warpgroup's first column)
      Problem tile = W != Walking::kFlat ? at.bounded(p) : p;  // the stores' bounds (its group: set below)
      epi.problem = W == Walking::kFlat ? at.problem : 0;            // grouped rows share one D; listed: their own
      if constexpr (W == Walking::kList) epi.take_listed(p.list + at.problem);
      if constexpr (!Cfg::Epilogue::kIdentity) {
        Cfg::Epilogue::prefetch(args, m0 + row_in_tile, WG_M, n0, WG_N, threadIdx.x % kWarpgroupThreads,
                                kWarpgroupThreads);
      }
      if (PINGPONG && local > 0) wait_turn(consumer);
      if (at.k_tiles == 0) {
        // K = 0: D = 0, on a path of its own: zeroing the wgmma accumulators here would merge two
        // register assignments of them (ptxas then spills).
        if (PINGPONG && next_exists) pass_turn(consumer);
        if constexpr (INTERLEAVE_K) {
          if (consumer == 1) {  // nothing to hand over; the pairing of the staging buffers' turns kept
            if (local > 0) ptx::named_barrier_sync(kHandOverFree, 2 * kWarpgroupThreads);
            continue;
          }
        }
        if constexpr (kQuantizesOut) {
          store_quantized_of_zero(args, tile, m0 + row_in_tile, n0, epi.problem);
        } else if constexpr (Cfg::Epilogue::kIdentity && kStagingInRing) {  // (no slot held: no staging)
          const float zeros[MMA_BLOCKS_M][ACCUM] = {};
          store_direct(args, tile, zeros, m0 + row_in_tile, n0, epi.problem, epi.listed);
        } else if constexpr (Cfg::Epilogue::kIdentity) {
          const float zeros[MMA_BLOCKS_M][ACCUM] = {};
          epi.store(args, tile, zeros, m0 + row_in_tile, n0);
        } else {
          // (a zero array would spill beside the epilogue)
          store_epilogue_of_zero(args, tile, m0 + row_in_tile, n0, epi.problem);
        }
        if constexpr (INTERLEAVE_K) free_hand_over(next_exists);
        continue;
      }
      // The source's first subtiles come in while the main loop runs.
      const bool sourced = epi.load_source(tile, m0 + row_in_tile, n0);
      Accum acc[MMA_BLOCKS_M][ACCUM];
      if constexpr (Cfg::kPromote) {
        // (K interleaved: this warpgroup's k tiles, every other one from its own index on; both then go on past the
        // whole tile's)
        const RingPos tile_start = pos;
        if (INTERLEAVE_K && consumer == 1) pos.next();
        mainloop_promoted<INTERLEAVE_K ? kConsumerWarpgroups : 1>(
            p, smem, acc, row_in_tile, col_in_tile, pos, rank, INTERLEAVE_K ? consumer : 0, at.k_tiles,
            block_scales(args, p, m0 + row_in_tile, n0, W == Walking::kRows ? at.problem : 0));
        if constexpr (INTERLEAVE_K) {
          pos = tile_start;
          pos.advance(at.k_tiles);
        }
      } else {
        int last_slot;
        if constexpr (W == Walking::kFlat) {
          last_slot = mainloop(p, smem, acc, row_in_tile, col_in_tile, pos, rank, 0, at.k_tiles, kStagingInRing);
        } else {
          last_slot = mainloop_of_rows(tile.m - (m0 + row_in_tile), p, smem, acc, row_in_tile, col_in_tile, pos,
                                       rank, at.k_tiles, kStagingInRing);
        }
        if constexpr (kStagingInRing) epi.stage_in_slot(last_slot);
      }
      if (PINGPONG && next_exists) pass_turn(consumer);
      if constexpr (INTERLEAVE_K) {
        if (consumer == 1) {
          hand_over_sums(smem, acc, local > 0);
          continue;
        }
        take_over_sums(smem, acc);
      }
      // The group's per-column operands, from the walk's group (live through the main loop anyway): set here, after
      // the main loop, where a copy in `tile` from before it made the 128x256 per-row-scaled fp8 kernel spill.
      if constexpr (W == Walking::kRows && Cfg::Epilogue::kColsPerGroup) tile.group_cols = walk.group * p.n;
      if constexpr (kIntAccum) {
        // In place: a second array would be live beside acc, which the next tile's first wgmma reads ("+r").
        int_sums_for_epilogue(acc);
        store_tile(epi, args, tile, reinterpret_cast<float(&)[MMA_BLOCKS_M][ACCUM]>(acc), m0 + row_in_tile, n0,
                   sourced);
      } else {
        store_tile(epi, args, tile, acc, m0 + row_in_tile, n0, sourced);
      }
      if constexpr (kStagingInRing) epi.release_slot(rank);
      if constexpr (INTERLEAVE_K) free_hand_over(next_exists);
    }
    epi.finish();
  }

  // Interleaved K: the second consumer's sums of the tile to the first, through the epilogue's staging buffers (thread
  // t's accumulator pair j at pair j * 128 + t: both warpgroups hold the same fragment of the same tile, so each
  // thread adds what its peer thread wrote). Named barriers kHandOverFull (the sums written) and kHandOverFree (the
  // first consumer's stores of the tile before have read the buffers), 1 and 2: the pingpong turns', unused here.
  static constexpr uint32_t kHandOverFull = 1, kHandOverFree = 2;
  __device__ __forceinline__ static uint32_t hand_over_pair(const Smem& smem, int j) {
    return smem.epilogue + (j * kWarpgroupThreads + threadIdx.x % kWarpgroupThreads) * 8;
  }
  __device__ __forceinline__ static void hand_over_sums(const Smem& smem, const float (&acc)[MMA_BLOCKS_M][ACCUM],
                                                       bool after_a_tile) {
    if (after_a_tile) ptx::named_barrier_sync(kHandOverFree, 2 * kWarpgroupThreads);
#pragma unroll
    for (int i = 0; i < MMA_BLOCKS_M; ++i)
#pragma unroll
      for (int r = 0; r < ACCUM; r += 2)
        ptx::st_shared_v2_f32(hand_over_pair(smem, (i * ACCUM + r) / 2), acc[i][r], acc[i][r + 1]);
    ptx::named_barrier_arrive(kHandOverFull, 2 * kWarpgroupThreads);
  }
  __device__ __forceinline__ static void take_over_sums(const Smem& smem, float (&acc)[MMA_BLOCKS_M][ACCUM]) {
    ptx::named_barrier_sync(kHandOverFull, 2 * kWarpgroupThreads);
#pragma unroll
    for (int i = 0; i < MMA_BLOCKS_M; ++i)
#pragma unroll
      for (int r = 0; r < ACCUM; r += 2) {
        const float2 v = ptx::ld_shared_v2_f32(hand_over_pair(smem, (i * ACCUM + r) / 2));
        acc[i][r] += v.x;
        acc[i][r + 1] += v.y;
      }
    // every thread's share read before the epilogue's staging writes go over it
    ptx::named_barrier_sync(kEpiBarrier, kWarpgroupThreads);
  }
  // The first consumer, after a tile's epilogue: its stores have read the staging buffers, which the second consumer
  // may then write its next sums into (its every tile after the first waits for this).
  __device__ __forceinline__ static void free_hand_over(bool next_exists) {
    if (!next_exists) return;
    if (threadIdx.x % kWarpgroupThreads == 0) ptx::tma_store_wait_read<0>();
    ptx::named_barrier_arrive(kHandOverFree, 2 * kWarpgroupThreads);
  }

  template <class Epi>  // Epilogue, declared further down
  __device__ __forceinline__ static void store_tile(Epi& epi, const GemmArgs& args, const Problem& p,
                                                    float (&acc)[MMA_BLOCKS_M][ACCUM], int m0, int n0,
                                                    bool sourced) {
#if GEMMGEN_SM90_EXPERIMENT_NO_EPILOGUE
    // Timing experiment only, wrong results: what the epilogue costs (docs/sm90.md, "The epilogue"). The
    // never-taken branch keeps the accumulators live.
    if (acc[0][0] == 1234.5f) epi.store(args, p, acc, m0, n0, sourced);
#else
    epi.store(args, p, acc, m0, n0, sourced);
#endif
  }

  // The consumers under stream-K: this cluster's whole units (stored as usual), then the segments of its share
  // of the cut tail: a contributor's part (left in the workspace) or an owner's part (completed with the
  // contributors' parts, in cluster order, so the sum does not depend on timing, then stored). Pingpong: the two
  // consumers take alternate segments, whole tiles each, and take turns at the math as in consume; a cluster
  // contributes at most one part (its share's first segment), so its partial slot is consumer 0's whichever
  // consumer computed it.
  __device__ static void consume_stream_k(const Problem& p, const Smem& smem, const GemmArgs& args,
                                          const CUtensorMap* tmap_d, uint32_t rank, int cluster, int consumer,
                                          const LaunchWorkspace& ws) {
    Epilogue epi{smem, tmap_d, consumer, 0, tma_store_possible(args), nullptr, false};  // source read from global
    float* const workspace = ws.partials;
    int* const flags = ws.flags;
    const int epoch = ws.epoch;
    const int row_in_tile = WG_M == BM ? 0 : consumer * WG_M;
    const int col_in_tile = SPLIT_N ? consumer * WG_N : 0;
    const int slot_consumer = PINGPONG ? 0 : consumer;
    const StreamK sk(p.units, p.k_tiles, static_cast<int>(gridDim.x) / CLUSTER);
    int segments = 0;  // (pingpong: whether the other consumer has a next segment to take its turn for)
    if constexpr (PINGPONG) sk.for_each_segment(cluster, [&](const StreamK::Segment&) { ++segments; });
    int local = 0;     // this cluster's segments so far
    RingPos pos;
    WalkOf<Walking::kFlat> walk;  // (unused: flat units)
    auto compute = [&](const StreamK::Segment& s) {
      const int index = local++;
      if (PINGPONG && (index & 1) != consumer) {
        pos.advance(s.kt_end - s.kt_begin);  // the other warpgroup's segment: its k tiles' slots
        return;
      }
      const TileAt at = tile_origin<Walking::kFlat>(p, s.unit, rank, walk);
      const int m0 = at.m0, n0 = at.n0 + col_in_tile;  // (n0: this warpgroup's first column)
      epi.problem = at.problem;
      mark_timeline(args, consumer, kTimelineStart);
      if (PINGPONG && index > 0) wait_turn(consumer);
      float acc[MMA_BLOCKS_M][ACCUM];
      if constexpr (Cfg::kPromote) {
        mainloop_promoted(p, smem, acc, row_in_tile, col_in_tile, pos, rank, s.kt_begin, s.kt_end,
                          block_scales(args, p, m0 + row_in_tile, n0, 0));
      } else {
        mainloop(p, smem, acc, row_in_tile, col_in_tile, pos, rank, s.kt_begin, s.kt_end);
      }
      if (PINGPONG && index + 1 < segments) pass_turn(consumer);
      mark_timeline(args, consumer, kTimelineMainLoop);
      // Split-K in at least kSliceSumParts parts, this cluster's one segment one part of its unit: the parts add up
      // slices of it (1x1 clusters, as the planner takes split-K: a cluster's blocks would keep the values it needs
      // live through a 128x256 tile's main loop, a spill there).
      if (CLUSTER == 1 && sk.units < sk.clusters && sk.clusters / sk.units >= kSliceSumParts &&
          !GEMMGEN_SM90_EXPERIMENT_SK_SERIAL_FIXUP && !GEMMGEN_SM90_EXPERIMENT_SK_NO_FIXUP) {
        finish_split_k(args, p, acc, sk, cluster, rank, consumer, slot_consumer, workspace, flags, epoch,
                       m0 + row_in_tile, n0, at.problem);
        return;
      }
      if (s.kt_begin > 0) {  // a contributor: the owner adds this part and stores the tile
#if GEMMGEN_SM90_EXPERIMENT_SK_NO_FIXUP  // timing experiment only, wrong results: no partials exchanged
        if (acc[0][0] == 1234.5f) epi.store(args, p, acc, m0 + row_in_tile, n0);  // keeps acc live
        return;
#endif
        publish_tile(workspace, flags, partial_slot(cluster, rank, slot_consumer), epoch, consumer, acc);
        mark_timeline(args, consumer, kTimelinePublished);
        return;
      }
      // The owner of a cut unit: the parts of every cluster whose share begins inside it (the clusters after this
      // one), all their flags polled at once, then their tiles added in cluster order.
      if (!GEMMGEN_SM90_EXPERIMENT_SK_NO_FIXUP && s.kt_end < p.k_tiles) {
        int contributors = 0;
        while (cluster + 1 + contributors < sk.clusters && sk.begins_inside(cluster + 1 + contributors, s.unit)) {
          ++contributors;
        }
        const int first = partial_slot(cluster + 1, rank, slot_consumer);
        await_parts(flags + first, contributors, epoch, consumer);
        mark_timeline(args, consumer, kTimelineWaited);
        add_parts(workspace, first, contributors, acc);
      }
      epi.store(args, p, acc, m0 + row_in_tile, n0);
      mark_timeline(args, consumer, kTimelineStored);
    };
    sk.for_each_segment(cluster, compute);
    epi.finish();
  }

  // From this many parts of a unit on, its parts add up slices of it (finish_split_k); with fewer the owner adds the
  // other parts' tiles and stores the whole tile through the TMA epilogue. Measured (H100, bf16, gpu/split_k_ab.sh,
  // h100_ab_split_k_*.json), slices against the owner: 16 parts 0.753x cuBLAS against 0.524x (64 x 1024 x 8192), 8
  // parts 0.803x against 0.712x (128 x 1024 x 8192), 0.828x against 0.755x (48 x 2048 x 8192); 4 parts 0.99-0.92x of
  // the owner's time (a vocabulary head's dX: 0.637x against 0.691x), 2 parts 0.94-0.97x.
  static constexpr int kSliceSumParts = 8;

  // Split-K (fewer units than clusters: the launch cut every unit into parts = clusters / units equal k ranges, one
  // cluster each, cluster c holding part c % parts of unit c / parts). Every part leaves its partial sums in the
  // workspace; once all parts of the unit are there, each adds up its own share of the tile's n8 column blocks, in
  // part order (the same bits every run, whichever part adds them, and the same as the owner's sum), applies the
  // epilogue and stores them. The owner alone adding (parts - 1) partial tiles, one after another, read them through
  // one SM: 15 tiles of 32 KB at 64 x 1024 x 8192 (8 tiles of 64x128, 16 parts).
  template <typename ACC>
  __device__ __forceinline__ static void finish_split_k(const GemmArgs& args, const Problem& p,
                                                        ACC (&acc)[MMA_BLOCKS_M][ACCUM], const StreamK& sk, int cluster,
                                                        uint32_t rank, int consumer, int slot_consumer, float* workspace,
                                                        int* flags, int epoch, int m0, int n0, int problem) {
    const int parts = sk.clusters / sk.units;
    const int part = cluster % parts, first = cluster - part;
    publish_tile(workspace, flags, partial_slot(cluster, rank, slot_consumer), epoch, consumer, acc);
    mark_timeline(args, consumer, kTimelinePublished);
    await_parts(flags + partial_slot(first, rank, slot_consumer), parts, epoch, consumer);
    mark_timeline(args, consumer, kTimelineWaited);
    // This thread's float4 of n8 block 0 in the unit's first part (store_partial's layout: float4 (i * ACCUM + 4j) / 4
    // of every thread, thread-minor); the parts' slots follow each other kPartStride float4s apart.
    const float4* first_part = thread_vectors(workspace, partial_slot(first, rank, slot_consumer));
    store_share_of_parts(args, p, acc, part, parts, m0, n0, problem,
                         [&](int b) { return sum_parts(first_part + b * kWarpgroupThreads, parts); });
    mark_timeline(args, consumer, kTimelineStored);
  }

  // GEMMGEN_SM90_EXPERIMENT_SK_TIMELINE: the words each block and consumer warpgroup writes, and when.
  static constexpr int kTimelineStart = 0, kTimelineMainLoop = 1, kTimelineWaited = 2, kTimelineStored = 3,
                       kTimelineSm = 4, kTimelinePublished = 5, kTimelineWords = 8;
  __device__ __forceinline__ static void mark_timeline(const GemmArgs& args, int consumer, int word) {
    if constexpr (GEMMGEN_SM90_EXPERIMENT_SK_TIMELINE) {
      if (threadIdx.x % kWarpgroupThreads != 0 || args.aux == nullptr) return;
      uint64_t* at = static_cast<uint64_t*>(args.aux) + (blockIdx.x * kConsumerWarpgroups + consumer) * kTimelineWords;
      at[word] = ptx::global_timer();
      if (word == kTimelineStart) at[kTimelineSm] = ptx::sm_id();
    }
  }

  // A part's share of this warpgroup's n8 column blocks of the tile (blocks [kBlocks * part / parts, ...)): block b's
  // sum over the parts, sum_of(b) (b = (i * ACCUM + 4j) / 4: m64 block i, n8 block j), into acc, the epilogue applied,
  // stored directly.
  template <typename ACC, class SumOf>
  __device__ __forceinline__ static void store_share_of_parts(const GemmArgs& args, const Problem& p,
                                                              ACC (&acc)[MMA_BLOCKS_M][ACCUM], int part, int parts,
                                                              int m0, int n0, int problem, SumOf&& sum_of) {
    constexpr int kBlocksN = WG_N / 8;                    // n8 blocks per m64 block
    constexpr int kBlocks = MMA_BLOCKS_M * kBlocksN;      // this warpgroup's n8 blocks of the tile
    const int begin = kBlocks * part / parts, end = kBlocks * (part + 1) / parts;
#pragma unroll  // (whole: the block's registers are picked by constants)
    for (int b = 0; b < kBlocks; ++b) {
      if (b < begin || b >= end) continue;
      const int i = b / kBlocksN, j = b % kBlocksN;
      const float4 sum = sum_of(b);
      acc[i][4 * j] = sum.x;
      acc[i][4 * j + 1] = sum.y;
      acc[i][4 * j + 2] = sum.z;
      acc[i][4 * j + 3] = sum.w;
      apply_epilogue<1>(args, p, acc, m0, n0, i, j);
      store_direct_blocks<1>(args, p, acc, m0, n0, i, j, problem, nullptr);
    }
  }

  // sum += v, element by element (the parts' sums, added in part order).
  __device__ __forceinline__ static void add_to(float4& sum, const float4& v) {
    sum.x += v.x;
    sum.y += v.y;
    sum.z += v.z;
    sum.w += v.w;
  }

  // The sum of the float4 at `at` in each of `parts` consecutive parts' partial tiles, in part order.
  __device__ __forceinline__ static float4 sum_parts(const float4* at, int parts) {
    float4 sum = __ldcg(at);  // L2: written by other SMs
#pragma unroll 4
    for (int k = 1; k < parts; ++k) add_to(sum, __ldcg(at + k * kPartStride));
    return sum;
  }

  // Partial slots (and flags) from one cluster's to the next's; float4s from one cluster's partial tile to the next's.
  static constexpr int kClusterSlots = CLUSTER * kConsumerWarpgroups;
  static constexpr int64_t kSlotVectors = kPartialFloats / 4;
  static constexpr int64_t kPartStride = static_cast<int64_t>(kClusterSlots) * kSlotVectors;

  // This thread's first float4 in slot `slot`'s partial tile (store_partial's layout: float4 q of thread t at
  // q * kWarpgroupThreads + t).
  __device__ __forceinline__ static float4* thread_vectors(float* workspace, int slot) {
    return reinterpret_cast<float4*>(workspace) + static_cast<int64_t>(slot) * kSlotVectors +
           threadIdx.x % kWarpgroupThreads;
  }
  __device__ __forceinline__ static const float4* thread_vectors(const float* workspace, int slot) {
    return thread_vectors(const_cast<float*>(workspace), slot);
  }

  __device__ __forceinline__ static int partial_slot(int cluster, uint32_t rank, int consumer) {
    return (cluster * CLUSTER + static_cast<int>(rank)) * kConsumerWarpgroups + consumer;
  }

  // A part's partial tile into the workspace and its flag raised. (One bulk copy per warpgroup from the ring instead
  // of each thread's stores measured 0.925x the time over 15 split kernels: docs/sm90.md.)
  __device__ __forceinline__ static void publish_tile(float* workspace, int* flags, int slot, int epoch, int consumer,
                                                     const float (&acc)[MMA_BLOCKS_M][ACCUM]) {
    store_partial(workspace, slot, acc);
    publish_partial(flags + slot, epoch, consumer);
  }

  // f(q, v) for each float4 v of this thread's accumulators, q its index in the partial tile's layout (float4 q of
  // every thread side by side, thread-minor: q = (i * ACCUM + r) / 4 for m64 block i, accumulator r).
  template <class F>
  __device__ __forceinline__ static void for_each_partial_vector(const float (&acc)[MMA_BLOCKS_M][ACCUM], F&& f) {
#pragma unroll
    for (int i = 0; i < MMA_BLOCKS_M; ++i)
#pragma unroll
      for (int r = 0; r < ACCUM; r += 4)
        f((i * ACCUM + r) / 4, make_float4(acc[i][r], acc[i][r + 1], acc[i][r + 2], acc[i][r + 3]));
  }

  __device__ __forceinline__ static void store_partial(float* workspace, int slot,
                                                      const float (&acc)[MMA_BLOCKS_M][ACCUM]) {
    float4* mine = thread_vectors(workspace, slot);
    for_each_partial_vector(acc, [&](int q, const float4& v) { mine[q * kWarpgroupThreads] = v; });
  }

  // Every thread's partial sums written, then the flag raised to the launch's epoch. The warpgroup's barrier orders
  // the other threads' stores before the releasing thread's store, and a release is cumulative: it publishes what
  // the barrier ordered before it, so no thread needs a fence of its own (a __threadfence per thread, MEMBAR.SC.GPU,
  // measured 1.8 % slower over 12 split kernels: docs/sm90.md, "What a split's partial sums cost").
  __device__ __forceinline__ static void publish_partial(int* flag, int epoch, int consumer) {
    ptx::named_barrier_sync(kEpiBarrier + consumer, kWarpgroupThreads);
    if (threadIdx.x % kWarpgroupThreads == 0) ptx::st_release_gpu(flag, epoch);
  }

  // Wait until `flag` reads `epoch` (acquire: the partial sums published before it are visible after).
  __device__ __forceinline__ static void poll_flag(const int* flag, int epoch) {
    while (ptx::ld_acquire_gpu(flag) != epoch) {
    }
  }

  // The flags of `parts` consecutive clusters' parts from `first` on, one thread each, all polled at once; the
  // warpgroup's barrier then hands what they saw to the rest. (Polled one after another, each part cost the owner an
  // L2 round trip for its flag and another for its tile: docs/sm90.md, "What a split's partial sums cost".)
  __device__ __forceinline__ static void await_parts(const int* first, int parts, int epoch, int consumer) {
    for (int k = threadIdx.x % kWarpgroupThreads; k < parts; k += kWarpgroupThreads) {
      poll_flag(first + k * kClusterSlots, epoch);
    }
    ptx::named_barrier_sync(kEpiBarrier + consumer, kWarpgroupThreads);
  }

  // acc += the partial tiles of `parts` consecutive clusters' parts from slot `first` on, in cluster order (the same
  // bits every run). The loads of kPartsInFlight parts are issued before any of their sums, so that their L2 round
  // trips overlap; as many as the registers beside the accumulators hold (larger tiles: one part at a time, its loads
  // and sums interleaved by the compiler, add_partial).
  static constexpr int kPartialVectors = MMA_BLOCKS_M * ACCUM / 4;  // float4s of a thread's partial tile
  static constexpr int kPartsInFlight = kPartialVectors <= 8 ? 4 : 1;
  __device__ __forceinline__ static void add_parts(const float* workspace, int first, int parts,
                                                   float (&acc)[MMA_BLOCKS_M][ACCUM]) {
    if constexpr (kPartsInFlight == 1) {
      for (int k = 0; k < parts; ++k) add_partial(workspace, first + k * kClusterSlots, acc);
      return;
    }
    const float4* part0 = thread_vectors(workspace, first);
    for (int k0 = 0; k0 < parts; k0 += kPartsInFlight) {
      float4 v[kPartsInFlight][kPartialVectors];
#pragma unroll
      for (int k = 0; k < kPartsInFlight; ++k)
#pragma unroll
        for (int q = 0; q < kPartialVectors; ++q)
          if (k0 + k < parts) v[k][q] = __ldcg(part0 + (k0 + k) * kPartStride + q * kWarpgroupThreads);  // L2
#pragma unroll
      for (int k = 0; k < kPartsInFlight; ++k) {
        if (k0 + k >= parts) break;
#pragma unroll
        for (int q = 0; q < kPartialVectors; ++q) {
          float* a = &acc[(4 * q) / ACCUM][(4 * q) % ACCUM];
          a[0] += v[k][q].x;
          a[1] += v[k][q].y;
          a[2] += v[k][q].z;
          a[3] += v[k][q].w;
        }
      }
    }
  }

  __device__ __forceinline__ static void add_partial(const float* workspace, int slot,
                                                    float (&acc)[MMA_BLOCKS_M][ACCUM]) {
    const float4* part = thread_vectors(workspace, slot);
#pragma unroll
    for (int i = 0; i < MMA_BLOCKS_M; ++i)
#pragma unroll
      for (int r = 0; r < ACCUM; r += 4) {
        const float4 v = __ldcg(part + ((i * ACCUM + r) / 4) * kWarpgroupThreads);  // L2: written by another SM
        acc[i][r] += v.x;
        acc[i][r + 1] += v.y;
        acc[i][r + 2] += v.z;
        acc[i][r + 3] += v.w;
      }
  }

  // Pingpong turns: the mainloops of the two consumers run one after the other, in tile order, so that
  // one's epilogue overlaps the other's mainloop, and so that a consumer waiting for its first slot
  // is never more than one phase behind the ring (a parity wait cannot tell phases further apart).
  // Warpgroup w waits on named barrier kTurnBarrier + w; the other warpgroup arrives there when done.
  static constexpr uint32_t kTurnBarrier = 1;  // 0 is __syncthreads
  static constexpr uint32_t kTurnThreads = 2 * kWarpgroupThreads;
  __device__ __forceinline__ static void wait_turn(int consumer) {
    ptx::named_barrier_sync(kTurnBarrier + consumer, kTurnThreads);
  }
  __device__ __forceinline__ static void pass_turn(int consumer) {
    ptx::named_barrier_arrive(kTurnBarrier + (consumer ^ 1), kTurnThreads);
  }

  // The wgmmas of one k tile in ring slot `slot` into acc (not yet committed); its first k step overwrites acc
  // unless `accumulate`. stage0_a/stage0_b: the descriptors of slot 0 (this warpgroup's rows of A and columns of B).
  // COLUMNS < WG_N: the slice of the columns [column0, column0 + COLUMNS) only (B's rows there; promotion's slices).
  // BLOCKS < MMA_BLOCKS_M: the first BLOCKS m64 blocks only (a tile whose rows end inside it: mainloop_of_rows).
  template <int COLUMNS = WG_N, int BLOCKS = MMA_BLOCKS_M, typename A, int N>
  __device__ __forceinline__ static void issue_k_tile(A (&acc)[MMA_BLOCKS_M][N], uint64_t stage0_a,
                                                      uint64_t stage0_b, int slot, bool accumulate, int column0 = 0) {
    using SliceMma = TileMma<COLUMNS, Elem, typename Cfg::ElemB, kMmaAKMajor ? 0 : 1, kMmaBKMajor ? 0 : 1, MmaTileB>;
    static_assert(N == SliceMma::kAccum, "acc holds the slice's accumulators");
    fence_set(acc);
    ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockK / kMmaK; ++kk)
      issue_k_step<SliceMma, BLOCKS>(acc, stage0_a, stage0_b, slot, kk, column0, (accumulate || kk > 0) ? 1 : 0);
  }

  // The wgmmas of k step kk of the k tile in ring slot `slot`, one per m64 block (the first BLOCKS), into `set`
  // (scale_d 0: overwrite).
  template <class SliceMma, int BLOCKS = MMA_BLOCKS_M, typename A, int N>
  __device__ __forceinline__ static void issue_k_step(A (&set)[MMA_BLOCKS_M][N], uint64_t stage0_a, uint64_t stage0_b,
                                                      int slot, int kk, int column0, int scale_d) {
    const uint32_t stage = slot * (STAGE_BYTES / 16);
    const uint64_t desc_b = ptx::desc_advance(stage0_b, stage + MmaTileB::offset_units(column0, kk));
#pragma unroll
    for (int i = 0; i < BLOCKS; ++i) {
      const uint64_t desc_a = ptx::desc_advance(stage0_a, stage + MmaTileA::offset_units(i * kMmaM, kk));
      SliceMma::run(set[i], desc_a, desc_b, scale_d);
    }
  }

  // The compiler's view of the accumulators around the asynchronous wgmmas (fence_operand).
  template <typename A, int N>
  __device__ __forceinline__ static void fence_set(A (&set)[MMA_BLOCKS_M][N]) {
#pragma unroll
    for (int i = 0; i < MMA_BLOCKS_M; ++i)
#pragma unroll
      for (int r = 0; r < N; ++r) ptx::fence_operand(set[i][r]);
  }

  // A grouped or listed tile's main loop for its rows: `rows` of this warpgroup's WG_M hold rows of the tile's group
  // or problem (the rest: the next group's rows, or TMA's zeros past a listed A, which no store writes). A warpgroup
  // of two m64 blocks (pingpong's 128-row tiles, cooperative 256-row ones; not the three of a 192-row tile split
  // along N, unmeasured) whose rows end in the first issues that block's wgmmas only: a group's last tile row is half
  // empty on average. The second block's accumulators are left as they are (the stores are bounded by the group's
  // rows). Measured on MoE layers (docs/grouped.md, "Tiles that end inside their group"): 128x128 pingpong 1.019x
  // geomean. 16-bit types only: the trimmed tile's second copy of the loop made ptxas serialize every wgmma of the
  // fp8 128x128 pingpong kernel (C7515), dense calls included (0.63x), and one loop that branches between the two
  // sets of wgmmas read 0.956x the untrimmed kernel on the bf16 rows (h200_bench_moe_trim_k_tile_branch_ab.json).
  // A cooperative warpgroup with no rows at all skipping its wgmmas (its partner then has the tensor cores alone) read
  // 0.983x in one process against the pick on the cooperative rows (branch coop-warpgroup-skip), so it issues them.
  __device__ __forceinline__ static int mainloop_of_rows(int rows, const Problem& p, const Smem& smem,
                                                         Accum (&acc)[MMA_BLOCKS_M][ACCUM], int row_in_tile,
                                                         int col_in_tile, RingPos& pos, uint32_t rank, int kt_end,
                                                         bool hold_last) {
    if constexpr (!kARegisters && MMA_BLOCKS_M == 2 && sizeof(Elem) == 2 && GEMMGEN_SM90_TRIM_EMPTY_BLOCKS) {
      if (rows <= kMmaM) return mainloop<1>(p, smem, acc, row_in_tile, col_in_tile, pos, rank, 0, kt_end, hold_last);
    }
    return mainloop(p, smem, acc, row_in_tile, col_in_tile, pos, rank, 0, kt_end, hold_last);
  }

  // Accumulate one tile over k tiles [kt_begin, kt_end) (at least one), consuming that many slots of the
  // ring from `pos` on; the first k tile overwrites acc (its first BLOCKS m64 blocks: mainloop_of_rows). Returns the
  // last k tile's slot, which is released too unless `hold_last` (kStagingInRing: the epilogue stages D there, then
  // releases it).
  template <int BLOCKS = MMA_BLOCKS_M>
  __device__ __forceinline__ static int mainloop(const Problem& p, const Smem& smem, Accum (&acc)[MMA_BLOCKS_M][ACCUM],
                                                 int row_in_tile, int col_in_tile, RingPos& pos, uint32_t rank,
                                                 int kt_begin, int kt_end, bool hold_last = false) {
    if constexpr (kARegisters) {
      mainloop_a_registers(smem, acc, row_in_tile, col_in_tile, pos, rank, kt_begin, kt_end);
      return -1;
    }
    // Stage 0's descriptors, this warpgroup's rows of A and columns of B; a stage is STAGE_BYTES further on.
    uint64_t stage0_a = ptx::desc_advance(MmaTileA::descriptor(smem.a(0)), MmaTileA::offset_units(row_in_tile, 0));
    uint64_t stage0_b = ptx::desc_advance(MmaTileB::descriptor(smem.b(0)), MmaTileB::offset_units(col_in_tile, 0));
    // Kept in (uniform) registers, not derived again from the shared-memory window's base in every k tile
    // (8 instructions per k tile in the SASS otherwise).
    ptx::keep_in_register(stage0_a);
    ptx::keep_in_register(stage0_b);
    int previous = -1;
    for (int kt = kt_begin; kt < kt_end; ++kt) {
      ptx::mbarrier_wait(smem.full_bar(pos.stage), pos.phase);
      issue_k_tile<WG_N, BLOCKS>(acc, stage0_a, stage0_b, pos.stage, kt > kt_begin);
      ptx::wgmma_commit();
      fence_set(acc);
      // Keep this k tile's wgmma in flight; the previous one has finished reading its slot.
      ptx::wgmma_wait<1>();
      if (previous >= 0) release(smem, previous, rank);
      previous = pos.stage;
      pos.next();
    }
    ptx::wgmma_wait<0>();
    fence_set(acc);
    if (!hold_last) release(smem, previous, rank);
    return previous;
  }

  // kARegisters: A's fragments of one k step of one m64 block (four registers), and the wgmma that takes them.
  static constexpr int kKSteps = kBlockK / kMmaK;
  using AFragments = uint32_t[4];
  using RegAMma = ptx::WgmmaTf32RegA<(kARegisters ? WG_N : 64)>;
  static_assert(!kARegisters || (WG_N <= 256 && RegAMma::kAccum == ACCUM && kBlockK == 32 && kMmaK == 8 &&
                                 (kKSteps * MMA_BLOCKS_M) % 2 == 0 && BM % RegisterFragmentA::kChunkRows == 0 &&
                                 TileA::kChunkBytes == RegisterFragmentA::kChunkBytes),
                "A from registers: tf32, whole 32-row chunks of an M-major A, one wgmma across the columns");

  // Where this thread's loads of k step 0 are, for the rows [m0, m0 + 64) of the A tile: [row half h][pass], from the
  // tile's start (RegisterFragmentA; k step kk is kk * kStepBytes further on).
  struct FragmentOffsets {
    uint32_t at[2][2];
  };
  __device__ __forceinline__ static FragmentOffsets fragment_offsets(int m0, int thread) {
    using Frag = RegisterFragmentA;
    const int warp = thread / 32, lane = thread % 32;
    FragmentOffsets o;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int pass = 0; pass < 2; ++pass) {
        o.at[h][pass] = Frag::offset(m0 + Frag::row(warp, lane, h), Frag::pass_k(lane, 0, pass));
      }
    return o;
  }

  // This thread's fragments of A for k step kk from the A tile at `tile_a`: two conflict-free passes per row half, each
  // register then taken from the pass that read its k (RegisterFragmentA::pass_of).
  __device__ __forceinline__ static void load_a_fragments(AFragments& f, uint32_t tile_a, const FragmentOffsets& o,
                                                          int kk, int lane) {
    using Frag = RegisterFragmentA;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t pass0 = ptx::ld_shared_b32(tile_a + o.at[h][0] + kk * Frag::kStepBytes);
      const uint32_t pass1 = ptx::ld_shared_b32(tile_a + o.at[h][1] + kk * Frag::kStepBytes);
      f[h] = Frag::pass_of(lane, h) == 0 ? pass0 : pass1;  // (selects: the lane is known only at run time)
      f[2 + h] = Frag::pass_of(lane, 2 + h) == 0 ? pass0 : pass1;
    }
  }

  __device__ __forceinline__ static void fence_fragments(AFragments& f) {
#pragma unroll
    for (int r = 0; r < 4; ++r) ptx::fence_operand(f[r]);
  }

  // mainloop with A from registers (kARegisters): each wgmma (k step kk, m64 block i) a group of its own, its four
  // fragment registers loaded just before it into one of two sets, the groups taking them in turn (a k tile holds an
  // even number of groups, so group (kk, i) always takes set (kk * MMA_BLOCKS_M + i) % 2). A wgmma reads its A
  // registers until its group completes (PTX ISA §9.7.15.5.1.1): a set is loaded again only after the wait<1> that
  // follows the next group's commit has seen its group complete (fence_fragments keeps the compiler from reusing the
  // registers before then). As few registers as that on purpose: sets of 16 per k tile, two k tiles in flight, made the
  // fused epilogues spill (ptxas -v: 296 bytes with gelu to bf16 at 128x256), two sets of four do not.
  __device__ __forceinline__ static void mainloop_a_registers(const Smem& smem, Accum (&acc)[MMA_BLOCKS_M][ACCUM],
                                                              int row_in_tile, int col_in_tile, RingPos& pos,
                                                              uint32_t rank, int kt_begin, int kt_end) {
    if constexpr (kARegisters) {
      uint64_t stage0_b = ptx::desc_advance(MmaTileB::descriptor(smem.b(0)), MmaTileB::offset_units(col_in_tile, 0));
      ptx::keep_in_register(stage0_b);
      AFragments frags[2] = {};  // (zeroed: the first wait's fence reads the set no group has loaded yet)
      // (threadIdx read afresh each tile: offsets derived from it once, for every tile, spilled the epilogue of nt's
      // gelu kernel)
      const int thread = ptx::tid_x_fresh() % kWarpgroupThreads;
      FragmentOffsets offsets[MMA_BLOCKS_M];
#pragma unroll
      for (int i = 0; i < MMA_BLOCKS_M; ++i) offsets[i] = fragment_offsets(row_in_tile + i * kMmaM, thread);
      int previous = -1;
      for (int kt = kt_begin; kt < kt_end; ++kt) {
        ptx::mbarrier_wait(smem.full_bar(pos.stage), pos.phase);
        const uint32_t tile_a = smem.a(pos.stage), stage = pos.stage * (STAGE_BYTES / 16);
#pragma unroll
        for (int kk = 0; kk < kKSteps; ++kk) {
          const uint64_t desc_b = ptx::desc_advance(stage0_b, stage + MmaTileB::offset_units(0, kk));
          const int scale_d = kt > kt_begin || kk > 0 ? 1 : 0;  // the first k step of a tile overwrites acc
#pragma unroll
          for (int i = 0; i < MMA_BLOCKS_M; ++i) {
            constexpr int kSets = 2;
            const int set = (kk * MMA_BLOCKS_M + i) % kSets;
            load_a_fragments(frags[set], tile_a, offsets[i], kk, thread % 32);
            fence_set(acc);
            ptx::wgmma_fence();
            RegAMma::run(acc[i], frags[set], desc_b, scale_d);
            ptx::wgmma_commit();
            fence_set(acc);
            ptx::wgmma_wait<1>();  // the group before this one is done: its set is free (first: the k tile before's)
            fence_fragments(frags[1 - set]);
            if (kk == 0 && i == 0 && previous >= 0) release(smem, previous, rank);
          }
        }
        previous = pos.stage;
        pos.next();
      }
      ptx::wgmma_wait<0>();
      fence_set(acc);
      fence_fragments(frags[0]);
      fence_fragments(frags[1]);
      release(smem, previous, rank);
    }
  }

  // Where one thread's block scales of a tile are: scale_a (M x ceil(K/128), row-major) at its fragment rows, and
  // scale_b (ceil(N/128) x ceil(K/128), row-major) at the tile's first 128-column block and the next (a tile of
  // BN <= 256 columns starting at a multiple of 64 spans at most two). Rows and blocks beyond the matrix are
  // clamped to its last ones: their products are zeros (TMA fills them so) and their D elements are not stored.
  // Grouped rows: A's rows are every group's (scale_a's rows too), and group g multiplies B's matrix g, whose
  // scales are the g-th of scale_b's matrices, (ceil(N/128), ceil(K/128)) each, back to back.
  // The tile's columns 8j + (0..7) take the first block's scale for j < split, the next block's from there on.
  struct BlockScales {
    const float* a[MMA_BLOCKS_M][2];  // fragment rows (i, h): k block kb at a[i][h][kb]
    const float* b_first;             // k block kb at b_first[kb]
    const float* b_next;
    int split;                        // in 8-column groups, a multiple of kSplitStep, 1 .. WG_N / 8
  };
  struct NoScales {};
  using Scales = std::conditional_t<kBlockScaled, BlockScales, NoScales>;
  // One k block's scales as loaded (RawKBlockScales) and as promote takes them (KBlockScales: row scale times
  // column block scale, per fragment row).
  struct RawKBlockScales {
    float a[MMA_BLOCKS_M][2];
    float b_first, b_next;
  };
  struct KBlockScales {
    float first[MMA_BLOCKS_M][2];
    float next[MMA_BLOCKS_M][2];
  };
  // A warpgroup's n0 is a multiple of WG_N (BN, or half of it split along N), so the column where the next 128-wide
  // scale block begins is a multiple of gcd(WG_N, 128): a few split points, each with a promote of its own (a select
  // per element would cost more instructions than the additions it guards).
  static constexpr int kScaleColumns = 128;
  // The block-scaled main loop is unrolled by the depth of its scales' pipeline (in use, loaded, being loaded), so that
  // each k tile's loads have registers of their own: rolled, ptxas passes them on by moves each k tile, and a move
  // waits for its load, one k tile after it was issued instead of two (SASS; with the per-lane B scales of block_scales
  // measured +3.6-3.8 %: docs/dtypes.md).
  // Only where the k tile is summed whole (PROMOTE_SLICES 1): the sliced tiles spilled unrolled.
  static constexpr int kPromotedUnroll = kBlockScaled && PROMOTE_SLICES == 1 ? GEMMGEN_SM90_BLOCK_SCALED_UNROLL : 1;
  // The next slot waited for under this k tile's wgmmas (GEMMGEN_SM90_PROMOTED_EARLY_WAIT): not in the unrolled
  // block-scaled loop, where the wait's loop between the scales' loads and their use spilled 536 bytes and serialized
  // the wgmmas at 128x192 (0.89x) and read 0.96-1.01x at 128x128 and 0.97x at 64x128
  // (h200_fp8_promoted_early_wait.json). Nor in the block-scaled 128-row pingpong tile (sliced), where it spilled 24
  // bytes (ptxas; not measured).
  static constexpr bool kPromotedEarlyWait = GEMMGEN_SM90_PROMOTED_EARLY_WAIT && kPromotedUnroll == 1 &&
                                             !(kBlockScaled && PINGPONG && MMA_BLOCKS_M > 1);
  static constexpr int kSplitStep = (WG_N % kScaleColumns == 0 ? kScaleColumns
                                     : WG_N % 64 == 0 ? 64 : WG_N % 32 == 0 ? 32 : WG_N % 16 == 0 ? 16 : 8) / 8;

  __device__ __forceinline__ static Scales block_scales(const GemmArgs& args, const Problem& p, int m0, int n0,
                                                       int matrix_b) {
    if constexpr (!kBlockScaled) {
      return {};
    } else {
      constexpr int kRowsSlot = Cfg::Epilogue::kRowBlocksSlot, kColsSlot = Cfg::Epilogue::kColBlocksSlot;
      static_assert(Cfg::Epilogue::kScaleBlockK == kScaleColumns, "B's scale blocks are square");
      const float* scale_a = static_cast<const float*>(args.ep_ptr[kRowsSlot]);
      const int last_block = (p.n - 1) / kScaleColumns;
      const float* scale_b = static_cast<const float*>(args.ep_ptr[kColsSlot]) +
                             static_cast<int64_t>(matrix_b) * (last_block + 1) * args.ep_ld[kColsSlot];
      const int t = threadIdx.x % kWarpgroupThreads, warp = t / 32, lane = t % 32;
      BlockScales s;
#pragma unroll
      for (int i = 0; i < MMA_BLOCKS_M; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = min(m0 + i * kMmaM + warp * 16 + lane / 4 + 8 * h, p.m - 1);
          s.a[i][h] = scale_a + static_cast<int64_t>(row) * args.ep_ld[kRowsSlot];
        }
      const int first_block = n0 / kScaleColumns;
      // Every lane reads the same B scales, so ptxas loads them into uniform registers, and the move there (R2UR)
      // waits for the L2 round trip right after the load, in every k tile, instead of two k tiles later where the
      // value is used (SASS). A per-lane offset that is zero (p.m is never negative) but that ptxas cannot prove so
      // keeps them per lane, in ordinary registers: measured with the unrolled loop (kPromotedUnroll) +3.6-3.8 %;
      // alone, on the sliced tiles, -6 % (docs/dtypes.md), which keep the uniform loads.
      constexpr bool kPerLane = kPromotedUnroll > 1 && !GEMMGEN_SM90_UNIFORM_B_SCALES;
      const int64_t lane_zero = kPerLane ? static_cast<int64_t>(lane) * (p.m >> 31) : 0;
      s.b_first = scale_b + static_cast<int64_t>(first_block) * args.ep_ld[kColsSlot] + lane_zero;
      s.b_next = scale_b + static_cast<int64_t>(min(first_block + 1, last_block)) * args.ep_ld[kColsSlot] + lane_zero;
      s.split = min((first_block + 1) * kScaleColumns - n0, WG_N) / 8;
      return s;
    }
  }

  // k block kb's scales, from L2 (the loads are issued two k tiles ahead of their use: see mainloop_promoted).
  __device__ __forceinline__ static RawKBlockScales load_k_block_scales(const Scales& scales, int kb) {
    RawKBlockScales raw{};
    if constexpr (kBlockScaled && GEMMGEN_SM90_EXPERIMENT_SCALES_CONST) {
      raw.b_first = raw.b_next = 1.f;
#pragma unroll
      for (int i = 0; i < MMA_BLOCKS_M; ++i) raw.a[i][0] = raw.a[i][1] = 1.f;
    } else if constexpr (kBlockScaled) {
      raw.b_first = __ldg(scales.b_first + kb);
      raw.b_next = __ldg(scales.b_next + kb);
#pragma unroll
      for (int i = 0; i < MMA_BLOCKS_M; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) raw.a[i][h] = __ldg(scales.a[i][h] + kb);
    }
    return raw;
  }

  // The products promote takes. The empty asm pins the first use of the loaded values here: the compiler would
  // otherwise multiply right after the loads and so wait for L2 there, inside the k tile they were meant to hide in.
  __device__ __forceinline__ static KBlockScales scale_products(RawKBlockScales raw) {
    KBlockScales k{};
    if constexpr (kBlockScaled) {
      ptx::fence_operand(raw.b_first);
      ptx::fence_operand(raw.b_next);
#pragma unroll
      for (int i = 0; i < MMA_BLOCKS_M; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          ptx::fence_operand(raw.a[i][h]);
          k.first[i][h] = raw.a[i][h] * raw.b_first;
          k.next[i][h] = raw.a[i][h] * raw.b_next;
        }
    }
    return k;
  }

  // The main loop of fp8 (PTX ISA §9.7.15: fp8 wgmma accumulates into fp32 registers, but its additions keep
  // fewer bits than fp32): each k tile is summed alone in `part` (whole, or slice by slice: PROMOTE_N), then added
  // into acc in fp32 ("promotion", as DeepGEMM and CUTLASS do), times its scales under per-block scaling (a k tile
  // is one 128-wide scale block). The wait for part ends this warpgroup's overlap of k tiles (ptxas serializes
  // every wgmma if registers of a finished group are read while another group is in flight: docs/dtypes.md); the
  // other consumer warpgroup's wgmmas keep the tensor cores busy meanwhile. The ring protocol is mainloop's.
  template <int KSTEP = 1>  // every KSTEP-th k tile from kt_begin on (interleaved K: each warpgroup its own)
  __device__ __forceinline__ static void mainloop_promoted(const Problem& p, const Smem& smem,
                                                           float (&acc)[MMA_BLOCKS_M][ACCUM], int row_in_tile,
                                                           int col_in_tile, RingPos& pos, uint32_t rank, int kt_begin,
                                                           int kt_end, const Scales& scales) {
    uint64_t stage0_a = ptx::desc_advance(MmaTileA::descriptor(smem.a(0)), MmaTileA::offset_units(row_in_tile, 0));
    uint64_t stage0_b = MmaTileB::descriptor(smem.b(0));
    if constexpr (SPLIT_N) stage0_b = ptx::desc_advance(stage0_b, MmaTileB::offset_units(col_in_tile, 0));
    // The descriptors' and the full barriers' bases stay in registers (as in mainloop): derived again from the
    // shared-memory window's base in every k tile, they put an S2UR and ten uniform instructions between the
    // promotion and the next k tile's wgmmas, on the path the other warpgroup's wgmmas have to cover.
    uint32_t full_bars = smem.full_bar(0);
    if constexpr (kPromotedEarlyWait) {
      ptx::keep_in_register(stage0_a);
      ptx::keep_in_register(stage0_b);
      ptx::keep_in_register(full_bars);
    }
#pragma unroll
    for (int i = 0; i < MMA_BLOCKS_M; ++i)
#pragma unroll
      for (int r = 0; r < ACCUM; ++r) acc[i][r] = 0.f;
    float part[MMA_BLOCKS_M][SLICE_ACCUM];
    // Block scales: k block kt's products in k_scales, kt + 1's loaded values in `ahead`, and kt + 2's loads issued
    // beside kt's wgmmas, a whole k tile before their first use (an L2 load under the TMA traffic outlasts one).
    // (interleaved K: the second warpgroup of a one-k-tile tile has no k tile, and loads the first's scales; a clamp
    // here for every loop made ptxas spill 32-44 bytes in the unrolled block-scaled loops)
    const int kt_first = KSTEP == 1 ? kt_begin : min(kt_begin, kt_end - 1);
    KBlockScales k_scales = scale_products(load_k_block_scales(scales, kt_first));
    RawKBlockScales ahead = load_k_block_scales(scales, min(kt_begin + KSTEP, kt_end - 1));
    // The next k tile's slot is waited for while this one's wgmmas run (before their wait), so that its arrival is
    // known when the promotion ends and the next wgmmas issue right after it (cuBLAS' loop has the same order).
    if (kPromotedEarlyWait && kt_begin < kt_end) ptx::mbarrier_wait(full_bars + pos.stage * 8, pos.phase);
#pragma unroll kPromotedUnroll
    for (int kt = kt_begin; kt < kt_end; kt += KSTEP) {
      if (!kPromotedEarlyWait) ptx::mbarrier_wait(full_bars + pos.stage * 8, pos.phase);
      RawKBlockScales later;
#pragma unroll
      for (int slice = 0; slice < PROMOTE_SLICES; ++slice) {
        issue_k_tile<PROMOTE_N>(part, stage0_a, stage0_b, pos.stage, false, slice * PROMOTE_N);
        ptx::wgmma_commit();
        if (slice == 0) later = load_k_block_scales(scales, min(kt + 2 * KSTEP, kt_end - 1));
        if (kPromotedEarlyWait && slice == PROMOTE_SLICES - 1 && kt + KSTEP < kt_end) {
          RingPos upcoming = pos;
#pragma unroll
          for (int s = 0; s < KSTEP; ++s) upcoming.next();
          ptx::mbarrier_wait(full_bars + upcoming.stage * 8, upcoming.phase);
        }
        ptx::wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < MMA_BLOCKS_M; ++i)
#pragma unroll
          for (int r = 0; r < SLICE_ACCUM; ++r) ptx::fence_operand(part[i][r]);
        if (slice == PROMOTE_SLICES - 1) release(smem, pos.stage, rank);
        if constexpr (kBlockScaled) {
          promote_block_scaled<kSplitStep>(acc, part, slice, k_scales, scales.split);
        } else {
          promote_block<WG_N / 8>(acc, part, slice, nullptr);
        }
      }
#pragma unroll
      for (int s = 0; s < KSTEP; ++s) pos.next();
      k_scales = scale_products(ahead);
      ahead = later;
    }
  }

  // acc += part (no scales) or acc += part * its row's and column block's scale product (per-block scaling), part
  // holding the tile's columns from slice * PROMOTE_N on; the columns 8j + (0..7) with j < SPLIT take the first
  // block's scales. Fragment layout as in store_direct: acc[i][4j + 2h + e] is row 16w + l/4 + 8h, column
  // 8j + 2(l%4) + e.
  template <int SPLIT>
  __device__ __forceinline__ static void promote_block(float (&acc)[MMA_BLOCKS_M][ACCUM],
                                                       const float (&part)[MMA_BLOCKS_M][SLICE_ACCUM], int slice,
                                                       const KBlockScales* k_scales) {
#pragma unroll
    for (int i = 0; i < MMA_BLOCKS_M; ++i)
#pragma unroll
      for (int js = 0; js < PROMOTE_N / 8; ++js)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int j = slice * (PROMOTE_N / 8) + js, r = 4 * j + 2 * h + e, rs = 4 * js + 2 * h + e;
            if (k_scales == nullptr) {
              acc[i][r] += part[i][rs];
            } else {
              acc[i][r] = fmaf(part[i][rs], j < SPLIT ? k_scales->first[i][h] : k_scales->next[i][h], acc[i][r]);
            }
          }
  }

  // promote_block at the tile's split point, found among its few possible values (a warp-uniform branch).
  template <int SPLIT>
  __device__ __forceinline__ static void promote_block_scaled(float (&acc)[MMA_BLOCKS_M][ACCUM],
                                                              const float (&part)[MMA_BLOCKS_M][SLICE_ACCUM],
                                                              int slice, const KBlockScales& k_scales, int split) {
    if constexpr (SPLIT >= WG_N / 8 || GEMMGEN_SM90_EXPERIMENT_ONE_SPLIT) {
      promote_block<WG_N / 8>(acc, part, slice, &k_scales);
    } else {
      if (split == SPLIT) {
        promote_block<SPLIT>(acc, part, slice, &k_scales);
      } else {
        promote_block_scaled<SPLIT + kSplitStep>(acc, part, slice, k_scales, split);
      }
    }
  }

  // int8's int32 sums as the epilogue takes them: fp32 values (exact up to 2^24), or for an int32 D their bits
  // (no instruction: registers have no type in SASS), which from_accumulator stores as they are.
  // Each register then holds a float's bits.
  __device__ __forceinline__ static void int_sums_for_epilogue(int32_t (&acc)[MMA_BLOCKS_M][ACCUM]) {
    if constexpr (!kAccumBits) {
#pragma unroll
      for (int i = 0; i < MMA_BLOCKS_M; ++i)
#pragma unroll
        for (int r = 0; r < ACCUM; ++r) acc[i][r] = __float_as_int(static_cast<float>(acc[i][r]));
    }
  }

  // One thread of the warpgroup frees the slot in every CTA of the cluster that wrote into it: this one,
  // its column peers (which multicast slices of B into it) and its row peers (slices of A).
  __device__ __forceinline__ static void release(const Smem& smem, int stage, uint32_t rank) {
    if (threadIdx.x % kWarpgroupThreads == 0) {
      ptx::mbarrier_arrive(smem.empty_bar(stage));
      if constexpr (CLUSTER > 1) {
        const ClusterPlace at = place(rank);
#pragma unroll
        for (int i = 1; i < CM; ++i)
          ptx::mbarrier_arrive_cluster(smem.empty_bar(stage), (at.rm + i) % CM + CM * at.rn);
#pragma unroll
        for (int j = 1; j < CN; ++j)
          ptx::mbarrier_arrive_cluster(smem.empty_bar(stage), at.rm + CM * ((at.rn + j) % CN));
      }
    }
  }

  // Accumulators -> D, bounded by M and N. wgmma's fp32 layout: in m64 block i, warp w of the
  // warpgroup owns rows 16w .. 16w + 15; lane l holds rows l/4 and l/4 + 8, columns 8j + 2(l%4) + {0, 1}
  // at acc[i][4j + {0, 1}] and acc[i][4j + {2, 3}].
  // `problem`: the tile's problem of a batch; `listed`: of a list (its own D), else null.
  template <typename ACC>
  __device__ __forceinline__ static void store_direct(const GemmArgs& args, const Problem& p,
                                                      ACC (&acc)[MMA_BLOCKS_M][ACCUM], int m0, int n0, int problem,
                                                      const ListProblem* listed = nullptr) {
    quantize_out(args, p, acc, m0, n0);
#pragma unroll
    for (int i = 0; i < MMA_BLOCKS_M; ++i) {
      apply_epilogue<WG_N / 8>(args, p, acc, m0, n0, i, 0);
      store_direct_blocks<WG_N / 8>(args, p, acc, m0, n0, i, 0, problem, listed);
    }
  }

  // The n8 blocks [j0, j0 + BLOCKS) of m64 block i (epilogue applied) -> D, as store_direct writes them (i and j0
  // constants where inlined: they pick registers).
  template <int BLOCKS, typename ACC>
  __device__ __forceinline__ static void store_direct_blocks(const GemmArgs& args, const Problem& p,
                                                             ACC (&acc)[MMA_BLOCKS_M][ACCUM], int m0, int n0, int i,
                                                             int j0, int problem, const ListProblem* listed) {
    Out* d = listed != nullptr ? static_cast<Out*>(listed->d_ptr)
                               : static_cast<Out*>(args.d) + problem * args.batch_stride_d;
    const int64_t ldd = listed != nullptr ? listed->ldd : args.ldd;
    const int t = threadIdx.x % kWarpgroupThreads;
    const int warp = t / 32, lane = t % 32;
    // Pairs of row-neighbours go out as one access when D's rows keep them aligned.
    const bool pairs = Cfg::kDRowMajor && ldd % 2 == 0 &&
                       reinterpret_cast<uintptr_t>(d) % (2 * sizeof(Out)) == 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m0 + i * kMmaM + warp * 16 + lane / 4 + 8 * h;
      if (row >= p.m) continue;
#pragma unroll
      for (int j = j0; j < j0 + BLOCKS; ++j) {
        const int col = n0 + j * 8 + 2 * (lane % 4);
        const float x = acc[i][4 * j + 2 * h], y = acc[i][4 * j + 2 * h + 1];
        if constexpr (Cfg::kDRowMajor) {
          Out* at = d + static_cast<int64_t>(row) * ldd + col;
          if (pairs && col + 1 < p.n) {
            *reinterpret_cast<typename Pair<Out>::type*>(at) = Pair<Out>::make(x, y);
          } else {
            if (col < p.n) at[0] = from_accumulator<Out>(x);
            if (col + 1 < p.n) at[1] = from_accumulator<Out>(y);
          }
        } else {
          if (col < p.n) d[static_cast<int64_t>(col) * ldd + row] = from_accumulator<Out>(x);
          if (col + 1 < p.n) d[static_cast<int64_t>(col + 1) * ldd + row] = from_accumulator<Out>(y);
        }
      }
    }
  }

  // The fused epilogue (Cfg::Epilogue, rendered from the plan) on the accumulators in registers, element by
  // element inside M x N (the layout of store_direct), for m64 block i and the BLOCKS n8 blocks from j0: the
  // stores apply it one part at a time, just before they write the part, so that the operand loads of one
  // part (not of the whole tile) are in flight beside the accumulators. SOURCED: the source operand's values
  // of the part are in `source`, in the accumulators' order (source[4 * (j - j0) + r] for acc[i][4 * j + r]).
  // A quantized D has had it applied already (quantize_out).
  template <int BLOCKS, bool SOURCED = false, typename ACC>
  __device__ __forceinline__ static void apply_epilogue(const GemmArgs& args, const Problem& p,
                                                        ACC (&acc)[MMA_BLOCKS_M][ACCUM], int m0, int n0, int i,
                                                        int j0, const float* source = nullptr) {
    if constexpr (!kQuantizesOut) run_epilogue<BLOCKS, SOURCED>(args, p, acc, m0, n0, i, j0, source);
  }

  // run_epilogue's parts with an M x N operand read element by element (n8 blocks; 0: element by element).
  static constexpr int kMatrixPartBlocks = GEMMGEN_SM90_EPILOGUE_MATRIX_PART;
  static_assert(kMatrixPartBlocks == 0 || (kQuantBlock / 8) % kMatrixPartBlocks == 0, "whole parts of a block");
  template <int BLOCKS, bool SOURCED = false, typename ACC>
  __device__ __forceinline__ static void run_epilogue(const GemmArgs& args, const Problem& p,
                                                      ACC (&acc)[MMA_BLOCKS_M][ACCUM], int m0, int n0, int i, int j0,
                                                      const float* source = nullptr) {
    if constexpr (!Cfg::Epilogue::kIdentity) {
      // A part wholly inside M x N takes the loop without bounds checks: straight-line code whose elements
      // interleave (a branch per column would leave each element's chain of dependent operations exposed).
      if constexpr (SOURCED ? Cfg::Epilogue::kStraightLineSourced : Cfg::Epilogue::kStraightLine) {
        if (m0 + (i + 1) * kMmaM <= p.m && n0 + (j0 + BLOCKS) * 8 <= p.n) {
          apply_epilogue_part<BLOCKS, false, SOURCED>(args, p, acc, m0, n0, i, j0, source);
          return;
        }
        apply_epilogue_part<BLOCKS, true, SOURCED>(args, p, acc, m0, n0, i, j0, source);
      } else if constexpr (kMatrixPartBlocks > 0 && BLOCKS % kMatrixPartBlocks == 0) {
        // An M x N operand read element by element: straight-line in parts of kMatrixPartBlocks n8 blocks, so that
        // a part's loads are in flight together and not all of them at once (ptxas would spill).
#pragma unroll
        for (int j = j0; j < j0 + BLOCKS; j += kMatrixPartBlocks) {
          const float* part_source = SOURCED ? source + 4 * (j - j0) : source;
          if (m0 + (i + 1) * kMmaM <= p.m && n0 + (j + kMatrixPartBlocks) * 8 <= p.n) {
            apply_epilogue_part<kMatrixPartBlocks, false, SOURCED>(args, p, acc, m0, n0, i, j, part_source);
          } else {
            apply_epilogue_part<kMatrixPartBlocks, true, SOURCED>(args, p, acc, m0, n0, i, j, part_source);
          }
        }
      } else {
        apply_epilogue_part<BLOCKS, true, SOURCED>(args, p, acc, m0, n0, i, j0, source);
      }
    }
  }

  // One part of apply_epilogue, each element checked against M and N (CHECKED) or none.
  template <int BLOCKS, bool CHECKED, bool SOURCED, typename ACC>
  __device__ __forceinline__ static void apply_epilogue_part(const GemmArgs& args, const Problem& p,
                                                             ACC (&acc)[MMA_BLOCKS_M][ACCUM], int m0, int n0, int i,
                                                             int j0, const float* source) {
    if constexpr (!Cfg::Epilogue::kIdentity) {
      using Epi = typename Cfg::Epilogue;
      const int t = threadIdx.x % kWarpgroupThreads;
      const int warp = t / 32, lane = t % 32;
      // Per-row vectors once per row, per-column ones once per column: not once per element.
      typename Epi::Row rows[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + i * kMmaM + warp * 16 + lane / 4 + 8 * h;
        rows[h] = !CHECKED || row < p.m ? Epi::load_row(args, row) : typename Epi::Row{};
      }
#pragma unroll
      for (int j = j0; j < j0 + BLOCKS; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = n0 + j * 8 + 2 * (lane % 4) + e;
          if (CHECKED && col >= p.n) continue;
          const typename Epi::Col cols = Epi::load_col(args, Epi::kColsPerGroup ? p.group_cols + col : col);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = m0 + i * kMmaM + warp * 16 + lane / 4 + 8 * h;
            float& value = acc[i][4 * j + 2 * h + e];
            if (CHECKED && row >= p.m) continue;
            if constexpr (SOURCED) {
              value = Epi::apply_sourced(args, value, row, col, rows[h], cols, source[4 * (j - j0) + 2 * h + e]);
            } else {
              value = Epi::apply(args, value, row, col, rows[h], cols);
            }
          }
        }
      }
    }
  }

  // Quantize-on-store (kQuantizesOut): the epilogue on this warpgroup's accumulators, then each row's 128-column
  // blocks scaled into fp8 in place (acc holds the fp8 values as floats, which the stores convert exactly) and the
  // blocks' scales written. Columns past N are left out of a block's amax; the scales of rows past M and of blocks
  // past N are not written. The TMA stores take one block at a time (quantize_block: a staging subtile of fp8 is one block
  // wide), so that each block's arithmetic overlaps the previous block's store; the direct stores take the tile.
  template <typename ACC>
  __device__ __forceinline__ static void quantize_out(const GemmArgs& args, const Problem& p,
                                                      ACC (&acc)[MMA_BLOCKS_M][ACCUM], int m0, int n0) {
    if constexpr (kQuantizesOut) {
#pragma unroll
      for (int i = 0; i < MMA_BLOCKS_M; ++i)
#pragma unroll
        for (int c = 0; c < WG_N / kQuantBlock; ++c) quantize_block(args, p, acc, m0, n0, i, c);
    }
  }

  // Block c (columns c * kQuantBlock on) of m64 block i: the epilogue, bf16 rounding, the rows' amax (a quad of
  // lanes holds each row's values: two shuffles), the scales, the values divided by them (IEEE division, as
  // quantize() divides), their scales stored.
  template <typename ACC>
  __device__ __forceinline__ static void quantize_block(const GemmArgs& args, const Problem& p,
                                                        ACC (&acc)[MMA_BLOCKS_M][ACCUM], int m0, int n0, int i,
                                                        int c) {
    if constexpr (kQuantizesOut) {
      constexpr int kBlocksPerScale = kQuantBlock / 8;  // n8 blocks of the accumulator layout
      const int t = threadIdx.x % kWarpgroupThreads;
      const int warp = t / 32, lane = t % 32;
      run_epilogue<kBlocksPerScale>(args, p, acc, m0, n0, i, c * kBlocksPerScale);
      // A block crossing N: its columns past N are left out of the amax. acc holds stale values there (the loads that
      // start past N are skipped, GEMMGEN_SM90_SKIP_OOB_LOADS; nothing stores those columns); a warp-uniform branch,
      // taken by the last tile column only.
      const int col0 = n0 + c * kQuantBlock + 2 * (lane % 4);  // this thread's first column of the block
      const bool crosses_n = n0 + (c + 1) * kQuantBlock > p.n;
      float amax[2] = {0.0f, 0.0f};  // rows l/4 and l/4 + 8 (h)
#pragma unroll
      for (int jj = 0; jj < kBlocksPerScale; ++jj)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          float& v = acc[i][4 * (c * kBlocksPerScale + jj) + r];
          v = __bfloat162float(__float2bfloat16_rn(v));
          if (!crosses_n || col0 + 8 * jj + r % 2 < p.n) amax[r / 2] = fmaxf(amax[r / 2], fabsf(v));
        }
      // The quotients v / scale, as v' / scale' of both multiplied by kTinyScaleFactor where the scale is tiny
      // (exact: a power of two), so that divide_rn's steps stay within fp32's normal range.
      float scale[2], scaled[2], inverse[2], pre[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 1));
        amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 2));
        scale[h] = fmaxf(amax[h], FLT_MIN) / kFp8Max<Out>;
        pre[h] = scale[h] < kMinReciprocalScale ? kTinyScaleFactor : 1.0f;
        scaled[h] = scale[h] * pre[h];
        inverse[h] = __frcp_rn(scaled[h]);
      }
#pragma unroll
      for (int jj = 0; jj < kBlocksPerScale; ++jj)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          float& v = acc[i][4 * (c * kBlocksPerScale + jj) + r];
          v = to_float<Out>(from_float<Out>(divide_rn(v * pre[r / 2], scaled[r / 2], inverse[r / 2])));
        }
      const int col = n0 + c * kQuantBlock;
      if constexpr (Cfg::kAmax) record_amax(args, p, amax, m0 + i * kMmaM + warp * 16 + lane / 4);
      if (lane % 4 == 0 && col < p.n) {
        float* scales = static_cast<float*>(args.aux);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = m0 + i * kMmaM + warp * 16 + lane / 4 + 8 * h;
          if (row < p.m) scales[static_cast<int64_t>(row) * args.ldaux + col / kQuantBlock] = scale[h];
        }
      }
    }
  }

  // Cfg::kAmax: the amax of D over this warp's 16 rows of one block (amax[h]: row `row` + 8 h, every lane of its
  // quad holding it after quantize_block's shuffles; rows past M left out: their values are the epilogue of zeros,
  // e.g. a bias), raised into GemmArgs::amax by one atomic max per warp (raise_amax).
  __device__ __forceinline__ static void record_amax(const GemmArgs& args, const Problem& p, const float (&amax)[2],
                                                     int row) {
    float most = fmaxf(row < p.m ? amax[0] : 0.0f, row + 8 < p.m ? amax[1] : 0.0f);
#pragma unroll
    for (int lanes = 4; lanes < 32; lanes *= 2) most = fmaxf(most, __shfl_xor_sync(0xffffffffu, most, lanes));
    if (threadIdx.x % 32 == 0) raise_amax(args, most);
  }

  // GemmArgs::amax raised to `value` (>= 0) by an atomic max on the float's bits (a float >= 0 orders as its bits
  // do); zero raises nothing, the amax starts at zero.
  __device__ __forceinline__ static void raise_amax(const GemmArgs& args, float value) {
    if (value > 0.0f) atomicMax(reinterpret_cast<unsigned int*>(args.amax), __float_as_uint(value));
  }

  // x / s rounded to nearest as IEEE division rounds it, given r = RN(1 / s): q = RN(x r), then one correction,
  // q + RN(x - q s) r (the residual exact by the FMA). Markstein's theorem (Handbook of Floating-Point Arithmetic,
  // "Newton-Raphson-based division with an FMA") makes that the correctly rounded quotient when r is the correctly
  // rounded reciprocal and nothing under- or overflows: three instructions where the division's own sequence
  // recomputes the reciprocal per element (measured: benchmarks/bench_quantized_out.py, docs/epilogue.md).
  // The residual is taken negated, q s - x, and subtracted: the same bits, and a zero x keeps its sign (-0 + +0
  // would round to +0 in the other order), with no instruction more (the negations are FFMA operand modifiers).
  __device__ __forceinline__ static float divide_rn(float x, float s, float r) {
    const float q = __fmul_rn(x, r);
    return __fmaf_rn(-__fmaf_rn(q, s, -x), r, q);
  }
  // The smallest scale divided through its reciprocal as it is: below it the residual of a quotient that fp8 keeps
  // could fall under fp32's normal range (a block whose amax is under 2^-55), so the value and the scale are both
  // multiplied by kTinyScaleFactor first (scales start at FLT_MIN / 57344, about 2^-142: then about 2^-42).
  static constexpr float kMinReciprocalScale = 0x1p-64f;
  static constexpr float kTinyScaleFactor = 0x1p100f;

  // K = 0 with a quantized D: each row's 128-column block of this warpgroup's share by one thread, its values (the
  // epilogue of zero) computed once for the amax and again to store, written directly (no second set of
  // accumulators beside the first: ptxas would spill); with Cfg::kAmax each block's amax raises D's, one atomic per
  // block (K = 0 only).
  __device__ static void store_quantized_of_zero(const GemmArgs& args, const Problem& p, int m0, int n0,
                                                 int problem) {
    if constexpr (kQuantizesOut) {
      Out* d = static_cast<Out*>(args.d) + problem * args.batch_stride_d;
      float* scales = static_cast<float*>(args.aux);
      constexpr int kBlocks = WG_N / kQuantBlock;
      for (int w = threadIdx.x % kWarpgroupThreads; w < WG_M * kBlocks; w += kWarpgroupThreads) {
        const int row = m0 + w / kBlocks, col0 = n0 + (w % kBlocks) * kQuantBlock;
        if (row >= p.m || col0 >= p.n) continue;
        const int cols = min(kQuantBlock, p.n - col0);
        float amax = 0.0f;
        for (int c = 0; c < cols; ++c) amax = fmaxf(amax, fabsf(value_of_zero(args, row, col0 + c)));
        if constexpr (Cfg::kAmax) raise_amax(args, amax);
        const float scale = fmaxf(amax, FLT_MIN) / kFp8Max<Out>;
        for (int c = 0; c < cols; ++c) {
          d[static_cast<int64_t>(row) * args.ldd + col0 + c] = from_float<Out>(value_of_zero(args, row, col0 + c) / scale);
        }
        scales[static_cast<int64_t>(row) * args.ldaux + col0 / kQuantBlock] = scale;
      }
    }
  }

  // D's value at (row, col) for K = 0 before it is quantized: the epilogue of zero, rounded to bf16.
  __device__ __forceinline__ static float value_of_zero(const GemmArgs& args, int row, int col) {
    float value = 0.0f;
    if constexpr (!Cfg::Epilogue::kIdentity) value = Cfg::Epilogue::apply(args, 0.0f, row, col);
    return __bfloat162float(__float2bfloat16_rn(value));
  }

  // K = 0 under a fused epilogue: D = epilogue(0), element by element, written directly.
  __device__ __forceinline__ static void store_epilogue_of_zero(const GemmArgs& args, const Problem& p, int m0,
                                                                int n0, int problem) {
    Out* d = static_cast<Out*>(args.d) + problem * args.batch_stride_d;
    const int t = threadIdx.x % kWarpgroupThreads;
    for (int r = t / 8; r < WG_M; r += kWarpgroupThreads / 8) {
      const int row = m0 + r;
      if (row >= p.m) continue;
      for (int c = t % 8; c < WG_N && n0 + c < p.n; c += 8) {
        const int col = n0 + c;
        const float value = Cfg::Epilogue::apply(args, 0.0f, row, col);
        d[Cfg::kDRowMajor ? static_cast<int64_t>(row) * args.ldd + col : static_cast<int64_t>(col) * args.ldd + row] =
            from_float<Out>(value);
      }
    }
  }

  // The same through shared memory and TMA stores, 64 x kEpiCols subtiles at a time (a 16-byte-aligned base and
  // row pitch); TMA clips the parts outside M and N. A column-major 16-bit D is staged transposed (kEpiCols rows of
  // D's transpose, 64 elements each: stage_subtile) and goes out through a map of D's transpose: a gradient computed
  // as its transpose into column-major storage (dA.t() = B @ dD.t(), planner.backward.swaps_operands) writes the
  // user's row-major dA so. A column-major fp32 D stores directly.
  static constexpr bool kDTransposedTma = !Cfg::kDRowMajor && sizeof(Out) == 2;
  __host__ __device__ __forceinline__ static bool tma_store_possible(const GemmArgs& args) {
    return (Cfg::kDRowMajor || kDTransposedTma) &&
           batch_aligned(args, args.d, args.ldd, args.batch_stride_d, sizeof(Out));
  }

  static constexpr uint32_t kEpiBarrier = 3;  // + consumer; 1 and 2 are the pingpong turns
  static constexpr uint32_t kSlotBarrier = 5;  // kStagingInRing, cooperative: both warpgroups' main loops done
  static constexpr int kStoreChunkElems = 16 / static_cast<int>(sizeof(Out));  // TMA's store granularity

  // Whether the source operand (if any) comes by TMA: D goes out by TMA and the source's base and row pitch
  // are 16-byte aligned (the host encodes its map on the same test).
  __host__ __device__ __forceinline__ static bool source_tma_possible(const GemmArgs& args) {
    if constexpr (kSourced) {
      constexpr int slot = Cfg::Epilogue::kSourceSlot;
      // (read_source reads the staging buffers in row-major D's layout)
      return Cfg::kDRowMajor && tma_store_possible(args) &&
             fast_aligned(args.ep_ptr[slot], args.ep_ld[slot], sizeof(typename Cfg::Epilogue::Source));
    } else {
      return false;
    }
  }

  // A consumer's columns go out by TMA through the staging buffers in whole subtiles; a width that is no multiple
  // of a subtile (a 16-bit tile of 80, 144, ... columns) stores its last kTailBlocks n8 blocks directly
  // (store_direct_blocks) after its whole subtiles, and takes its source operand from global memory.
  static constexpr bool kWholeSubtiles = WG_N % kEpiCols == 0;
  static constexpr int kSubtilesPerBlock = WG_N / kEpiCols;              // whole subtiles per m64 block
  static constexpr int kTailBlock0 = kSubtilesPerBlock * kEpiCols / 8;   // the first n8 block past them
  static constexpr int kTailBlocks = WG_N / 8 - kTailBlock0;
  static constexpr int kSubtiles = MMA_BLOCKS_M * kSubtilesPerBlock;    // per consumer warpgroup and tile
  static constexpr int kSourceValues = kEpiCols / 2;                     // per thread and subtile

  struct Epilogue {
    const Smem& smem;
    const CUtensorMap* tmap_d;
    int consumer;
    int buffer;       // the staging buffer to fill next
    bool use_tma;
    const CUtensorMap* tmap_source;
    bool use_source_tma;
    uint32_t source_phase = 0;  // bit b: the parity of the next phase of source barrier b
    int problem = 0;            // of a batch: the current tile's (the third coordinate of D's map)
    bool grouped = false;       // grouped rows: the rows' bound is the group's end (consume<Walking::kRows>)
    const ListProblem* listed = nullptr;  // a list's current problem: its D (consume<Walking::kList>)
    int held_slot = -1;                   // kStagingInRing: the ring slot this tile stages D in

    // Staging buffer b: this warpgroup's own, or (kStagingInRing) its share of the held ring slot.
    __device__ __forceinline__ uint32_t staging(int b) const {
      if constexpr (kStagingInRing) {
        return smem.a(held_slot) + ((PINGPONG ? 0 : consumer) * kEpiBuffers + b) * kEpiBufferBytes;
      } else {
        return smem.epi_buffer(consumer, b);
      }
    }

    // kStagingInRing: this tile's D goes through ring slot `slot`, which mainloop held. A cooperative tile's other
    // warpgroup reads the slot (its wgmmas) until its own main loop is done: both wait for each other before either
    // writes into it.
    __device__ __forceinline__ void stage_in_slot(int slot) {
      held_slot = slot;
      if constexpr (!PINGPONG) ptx::named_barrier_sync(kSlotBarrier, kConsumerWarpgroups * kWarpgroupThreads);
    }

    // kStagingInRing: the held slot back to the producer once this warpgroup's stores have read it (the thread that
    // issued them waits for them, then arrives for the warpgroup).
    __device__ __forceinline__ void release_slot(uint32_t rank) {
      if (threadIdx.x % kWarpgroupThreads == 0) ptx::tma_store_wait_read<0>();
      release(smem, held_slot, rank);
    }

    // The tiles from here on are listed problem `at`'s: its D's map (acquired from global memory when it changes:
    // the host wrote it there) or, without one, direct stores at its base.
    __device__ __forceinline__ void take_listed(const ListProblem* at) {
      if (at == listed) return;
      listed = at;
      use_tma = __ldg(&at->d_tma) != 0;
      tmap_d = &at->d;
      if (use_tma) ptx::fence_proxy_tensormap_acquire(&at->d);
    }

    // A tile whose D goes out by TMA stores through the staging buffers (this warpgroup's rows from m0).
    __device__ __forceinline__ bool stores_by_tma(const Problem& p, int m0, int n0) const {
      // TMA clips a store to the matrix only to 16-byte granularity along the contiguous dimension (N, or M for
      // a column-major D): measured on the H100, a row's last partial chunk is written whole, zeros past N
      // included (git show 8cd3d06:gpu/debug/padding_probe.py). The tiles holding such a chunk store directly.
      const bool partial_chunk = Cfg::kDRowMajor ? n0 + WG_N > p.n && p.n % kStoreChunkElems != 0
                                                 : m0 + WG_M > p.m && p.m % kStoreChunkElems != 0;
      // A group's last rows: TMA clips at D's end, not the group's, and would write the next group's rows.
      const bool past_group_end = grouped && m0 + WG_M > p.m;
      // A column-major D's tile starting inside a 16-byte chunk of its column (a group starting at any row): a TMA
      // access whose start along the contiguous dimension is not 16-byte aligned faults (illegal instruction on the
      // H200 for a grouped tt_dcol call's group starting at row 1: h200_fuzz_dcol_tma_group_start_fault.log).
      const bool unaligned_start = !Cfg::kDRowMajor && m0 % kStoreChunkElems != 0;
      return (Cfg::kDRowMajor || kDTransposedTma) && use_tma && !partial_chunk && !past_group_end &&
             !unaligned_start;
    }

    // Before the main loop of the tile at (m0, n0) (this warpgroup's rows): start the TMA loads of the
    // source's first subtiles into the staging buffers they will be read from. Returns whether the tile
    // takes its source from there (else the epilogue reads it from global memory).
    __device__ __forceinline__ bool load_source(const Problem& p, int m0, int n0) const {
      if (!kSourced || !kWholeSubtiles || !use_source_tma || !stores_by_tma(p, m0, n0)) return false;
      if (threadIdx.x % kWarpgroupThreads == 0) {
        ptx::tma_store_wait_read<0>();  // the previous tile's last stores are done reading the buffers
#pragma unroll
        for (int s = 0; s < kEpiBuffers && s < kSubtiles; ++s) issue_source(s, (buffer + s) % kEpiBuffers, m0, n0);
      }
      return true;
    }

    // Subtile s of the tile's source into staging buffer b (one thread).
    __device__ __forceinline__ void issue_source(int s, int b, int m0, int n0) const {
      const uint32_t bar = smem.source_bar(consumer, b);
      ptx::mbarrier_arrive_expect_tx(bar, kEpiBufferBytes);  // the whole box, zeros outside M x N included
      ptx::tma_load_3d(staging(b), tmap_source, bar, n0 + (s % kSubtilesPerBlock) * kEpiCols,
                       m0 + (s / kSubtilesPerBlock) * kMmaM, /*matrix (never batched)=*/0);
    }

    // Subtile (i, sub) of a sourced tile: the source's values out of the staging buffer they came into, then
    // the epilogue. Returns false (nothing done) for a tile that is not sourced.
    template <typename ACC>
    __device__ __forceinline__ bool apply_sourced(const GemmArgs& args, const Problem& p,
                                                  ACC (&acc)[MMA_BLOCKS_M][ACCUM], int m0, int n0, int i, int sub,
                                                  bool sourced) {
      if constexpr (kSourced) {
        if (!sourced) return false;
        float source[kSourceValues];
        ptx::mbarrier_wait(smem.source_bar(consumer, buffer), (source_phase >> buffer) & 1u);
        source_phase ^= 1u << buffer;
        read_source(staging(buffer), source);
        apply_epilogue<kEpiCols / 8, true>(args, p, acc, m0, n0, i, sub * (kEpiCols / 8), source);
        return true;
      } else {
        return false;
      }
    }

    // The source's values of subtile (i, sub) from staging buffer `buf`, in the accumulators' order: the
    // inverse of stage_subtile (ldmatrix at the addresses stmatrix writes).
    __device__ __forceinline__ static void read_source(uint32_t buf, float (&source)[kSourceValues]) {
      const int t = threadIdx.x % kWarpgroupThreads;
      const int warp = t / 32, lane = t % 32;
      constexpr int kBlocksPerSubtile = kEpiCols / 8;
      if constexpr (sizeof(Out) == 2) {
        using Source = typename Cfg::Epilogue::Source;
        const int q = lane / 8, r = lane % 8;
        const uint32_t lane_addr = buf + (warp * 16 + 8 * (q % 2) + r) * kSwizzleRowBytes + (((q / 2) ^ r) * 16);
#pragma unroll
        for (int pair = 0; pair < kBlocksPerSubtile / 2; ++pair) {
          uint32_t regs[4];
          ptx::ldmatrix_x4(regs, lane_addr ^ (32u * pair));
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const float2 v = unpack<Source>(regs[k]);
            source[8 * pair + 2 * k] = v.x;
            source[8 * pair + 2 * k + 1] = v.y;
          }
        }
      } else {
#pragma unroll
        for (int jj = 0; jj < kBlocksPerSubtile; ++jj) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = warp * 16 + lane / 4 + 8 * h;
            const int byte = (8 * jj + 2 * (lane % 4)) * static_cast<int>(sizeof(Out));
            const int chunk = (byte / 16) ^ (row % 8);
            const float2 v = ptx::ld_shared_v2_f32(buf + row * kSwizzleRowBytes + chunk * 16 + byte % 16);
            source[4 * jj + 2 * h] = v.x;
            source[4 * jj + 2 * h + 1] = v.y;
          }
        }
      }
    }

    // ACC: float (non-const: the epilogue's values replace the accumulators') or const float (zeros, K = 0,
    // identity epilogue only).
    // sourced: load_source started this tile's source into the staging buffers.
    template <typename ACC>
    __device__ __forceinline__ void store(const GemmArgs& args, const Problem& p, ACC (&acc)[MMA_BLOCKS_M][ACCUM],
                                          int m0, int n0, bool sourced = false) {
      if (!stores_by_tma(p, m0, n0)) {
        store_direct(args, p, acc, m0, n0, problem, listed);
        return;
      }
      static_assert(!kQuantizesOut || kEpiCols == kQuantBlock, "a quantized D's subtile is one block wide");
      const int t = threadIdx.x % kWarpgroupThreads;
#pragma unroll
      for (int i = 0; i < MMA_BLOCKS_M; ++i) {
#pragma unroll
        for (int sub = 0; sub < kSubtilesPerBlock; ++sub) {
          const uint32_t buf = staging(buffer);
          if (!apply_sourced(args, p, acc, m0, n0, i, sub, sourced)) {
            quantize_block(args, p, acc, m0, n0, i, sub);  // (a quantized D: instead of the epilogue)
            apply_epilogue<kEpiCols / 8>(args, p, acc, m0, n0, i, sub * (kEpiCols / 8));
            // The store that last read this buffer (two subtiles ago) must be done reading it (sourced: it
            // was, before the source came in).
            if (t == 0) ptx::tma_store_wait_read<kEpiBuffers - 1>();
          }
          // Sourced: every thread has read the source out of the buffer before D overwrites it.
          ptx::named_barrier_sync(kEpiBarrier + consumer, kWarpgroupThreads);
          stage_subtile(acc, i, sub, buf);
          ptx::fence_proxy_async_smem();  // the generic-proxy writes, before TMA (async proxy) reads them
          ptx::named_barrier_sync(kEpiBarrier + consumer, kWarpgroupThreads);
          if (t == 0) {
            store_subtile(buf, i, sub, m0, n0);
            ptx::tma_store_commit();
            // The source's subtile two on goes into this buffer once the store has read it out.
            const int next = i * kSubtilesPerBlock + sub + kEpiBuffers;
            if (kSourced && sourced && next < kSubtiles) {
              ptx::tma_store_wait_read<0>();
              issue_source(next, buffer, m0, n0);
            }
          }
          buffer ^= 1;
        }
        if constexpr (kTailBlocks > 0) {  // the columns past the whole subtiles: directly
          apply_epilogue<kTailBlocks>(args, p, acc, m0, n0, i, kTailBlock0);
          store_direct_blocks<kTailBlocks>(args, p, acc, m0, n0, i, kTailBlock0, problem, listed);
        }
      }
    }

    // Subtile (i, sub) of the accumulators into the staging buffer at `buf`, in the 128-byte swizzle.
    // A warp's share is 16 rows x 128 bytes: row = warp * 16 + lane / 4 + 8 * h, its n8 block jj one
    // 16-byte chunk of the row, stored at chunk jj ^ (row % 8) (the 128-byte swizzle TMA undoes).
    // A column-major D is staged as its transpose: kEpiCols rows (the subtile's columns) of 64 elements (its rows).
    __device__ __forceinline__ static void stage_subtile(const float (&acc)[MMA_BLOCKS_M][ACCUM], int i, int sub,
                                                         uint32_t buf) {
      const int t = threadIdx.x % kWarpgroupThreads;
      const int warp = t / 32, lane = t % 32;
      constexpr int kBlocksPerSubtile = kEpiCols / 8;  // n8 blocks of the accumulator layout
      if constexpr (kDTransposedTma) {
        // stmatrix.x4.trans: matrix q = 2 * (jj % 2) + h of an n8 block pair goes to the transpose's rows
        // 8 * (2 * pair + q / 2) + r (lane l addresses r = l % 8 of matrix l / 8), whose 16-byte chunk 2 * warp + h
        // holds the matrix's eight D rows, swizzled to chunk (2 * warp + h) ^ r; each pair is 16 rows further on.
        const int q = lane / 8, r = lane % 8;
        const uint32_t lane_addr =
            buf + (8 * (q / 2) + r) * kSwizzleRowBytes + (((2 * warp + q % 2) ^ r) * 16);
#pragma unroll
        for (int pair = 0; pair < kBlocksPerSubtile / 2; ++pair) {
          const int j = sub * kBlocksPerSubtile + 2 * pair;
          const float* f = &acc[i][4 * j];
          ptx::stmatrix_x4_trans(lane_addr + 16u * kSwizzleRowBytes * pair, pack<Out>(f[0], f[1]),
                                 pack<Out>(f[2], f[3]), pack<Out>(f[4], f[5]), pack<Out>(f[6], f[7]));
        }
      } else if constexpr (sizeof(Out) == 2) {
        // stmatrix.x4: matrix q = 2 * (jj % 2) + h of an n8 block pair; lane l addresses row l % 8 of matrix
        // l / 8. Rows are 128 bytes and buf is 1024-aligned, so chunk (2 * pair + c) ^ r = 2 * pair ^ (c ^ r)
        // is an XOR of the lane's own address with 32 * pair.
        const int q = lane / 8, r = lane % 8;
        const uint32_t lane_addr = buf + (warp * 16 + 8 * (q % 2) + r) * kSwizzleRowBytes + (((q / 2) ^ r) * 16);
#pragma unroll
        for (int pair = 0; pair < kBlocksPerSubtile / 2; ++pair) {
          const int j = sub * kBlocksPerSubtile + 2 * pair;  // the pair's first n8 block in the tile
          const float* f = &acc[i][4 * j];                   // its two blocks' 8 accumulators, h-major
          ptx::stmatrix_x4(lane_addr ^ (32u * pair), pack<Out>(f[0], f[1]), pack<Out>(f[2], f[3]),
                           pack<Out>(f[4], f[5]), pack<Out>(f[6], f[7]));
        }
      } else {
#pragma unroll
        for (int jj = 0; jj < kBlocksPerSubtile; ++jj) {
          const int j = sub * kBlocksPerSubtile + jj;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = warp * 16 + lane / 4 + 8 * h;
            const int byte = (8 * jj + 2 * (lane % 4)) * static_cast<int>(sizeof(Out));
            const int chunk = (byte / 16) ^ (row % 8);
            const uint32_t at = buf + row * kSwizzleRowBytes + chunk * 16 + byte % 16;
            ptx::st_shared_pair<Out>(at, acc[i][4 * j + 2 * h], acc[i][4 * j + 2 * h + 1]);
          }
        }
      }
    }

    __device__ __forceinline__ void store_subtile(uint32_t buf, int i, int sub, int m0, int n0) const {
#if !GEMMGEN_SM90_EXPERIMENT_NO_TMA_STORE  // timing experiment only, wrong results: stage, never store
      if constexpr (Cfg::kDRowMajor) {
        ptx::tma_store_3d(tmap_d, buf, n0 + sub * kEpiCols, m0 + i * kMmaM, problem);
      } else {  // the map of D's transpose: M innermost
        ptx::tma_store_3d(tmap_d, buf, m0 + i * kMmaM, n0 + sub * kEpiCols, problem);
      }
#endif
    }

    // Before the CTA exits: every TMA store of this warpgroup performed.
    __device__ __forceinline__ void finish() {
      if (threadIdx.x % kWarpgroupThreads == 0) ptx::tma_store_wait<0>();
    }
  };
};

}  // namespace sm90
}  // namespace gemmgen
