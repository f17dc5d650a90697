// The small-M kernel: calls with at most 16 rows of A (a decoding step of a language model, x @ W.t()).
// D = A x B then reads all of B (the weight W, N x K, K-major) once and A hardly at all: its time is B's bytes
// over the HBM bandwidth. The fast kernels' 64- or 128-row tiles would multiply mostly zero rows, and their N / BN
// tiles leave most SMs idle; this kernel keeps every SM streaming W instead.
//
// It computes D^T = W x A^T on mma.sync m16n8k16: 16 rows of W are the MMA's M side, up to 16 rows of A its N side
// (two n8 halves), so W goes from global memory straight into A fragments with 16-byte loads, no shared memory.
// Within one MMA the order of k is free as long as both operands agree: lane (g, t) = (lane / 4, lane % 4) loads
// the 8 k values 8t .. 8t + 7 of a 32-wide k slice from W's rows g and g + 8 and from A's rows g (and g + 8); the
// first four of them stand for the fragment's k 2t, 2t + 1, 2t + 8, 2t + 9 of one k16 step, the last four for the
// same k of a second step. PTX ISA §9.7.14.5.8 "Matrix Fragments for mma.m16n8k16".
//
// A block owns 16 rows of W (16 columns of D); its warps split K in 128-wide steps and their partial sums are
// added in shared memory in warp order, so every run gives the same bits.
//
// An N-major B (layout tt: D = X @ W with W stored K x N, as dX = dY @ W in a Linear's backward, or a weight kept
// (in, out)) takes the same warp split, but a row of B now runs along the block's 32 columns: lane (g, t) loads eight
// columns (16 bytes) of one row of B, so that 8 rows x 32 columns are four 8 x 8 matrices in movmatrix's layout
// (row g, column pair t; one per 32-bit word of the load), and movmatrix.trans turns each into a quarter of an MMA's
// A fragment (8 columns of D, two k per lane). See NMajorB below.
#pragma once

#include <cstdint>
#include <type_traits>

#include "convert.cuh"
#include "gemm_args.h"
#include "ptx/sm80.cuh"

namespace gemmgen {
namespace small_m {

// Experiment switches (gpu/ab_variants.py; docs/small_m.md has what they measured). The most rows of A, a multiple
// of 8 (each 8 rows are one n8 MMA per k16 step and 16 more registers of A per step):
#ifndef GEMMGEN_SMALL_M_MAX_ROWS
#define GEMMGEN_SMALL_M_MAX_ROWS 16
#endif
constexpr int kMaxRows = GEMMGEN_SMALL_M_MAX_ROWS; // the most rows of A (M) a call may have to take this kernel
// (32 measured slower everywhere, docs/small_m.md "Beyond 16 rows")
constexpr int kRowGroups = kMaxRows / 8;           // n8 MMAs per k16 step at M = kMaxRows
static_assert(kMaxRows % 8 == 0 && kRowGroups >= 1, "GEMMGEN_SMALL_M_MAX_ROWS: a positive multiple of 8");
constexpr int kRowsW = 16;                         // rows of W (columns of D) per block: one MMA's M side
// Warps per block:
#ifndef GEMMGEN_SMALL_M_WARPS
#define GEMMGEN_SMALL_M_WARPS 8
#endif
// 0 leaves calls with an N-major B to the tiled kernels (the A/B baseline of NMajorB).
#ifndef GEMMGEN_SMALL_M_N_MAJOR
#define GEMMGEN_SMALL_M_N_MAJOR 1
#endif
// 32-wide k chunks of an N-major B per warp and step (NMajorB), and the blocks each SM keeps resident (the kernel's
// launch bounds). 4 chunks and one block (176 registers) beat 2 chunks at two blocks (at most 128) on 12 of 17
// shapes measured (docs/small_m.md); both are switches for A/B runs.
#ifndef GEMMGEN_SMALL_M_N_MAJOR_CHUNKS
#define GEMMGEN_SMALL_M_N_MAJOR_CHUNKS 4
#endif
#ifndef GEMMGEN_SMALL_M_MIN_BLOCKS
#define GEMMGEN_SMALL_M_MIN_BLOCKS 1
#endif
constexpr int kMinBlocksPerSm = GEMMGEN_SMALL_M_MIN_BLOCKS;
// 1 issues a warp's next k step of W before the current step's MMAs.
#ifndef GEMMGEN_SMALL_M_PREFETCH
#define GEMMGEN_SMALL_M_PREFETCH 0
#endif
constexpr int kWarps = GEMMGEN_SMALL_M_WARPS;      // per block, splitting K
constexpr int kThreads = kWarps * 32;
constexpr int kChunk = 8;                          // 16-bit elements per 16-byte load
constexpr int kLanesK = 4;                         // lanes side by side along k (t = lane % 4)
constexpr int kChunksPerStep = 4;                  // chunks per lane and row in one step
constexpr int kStepK = kChunksPerStep * kLanesK * kChunk;  // 128 k per warp and step: 256 bytes of each W row

// Which configs have this kernel: 16-bit A and B, A K-major (B either), no per-block scales (their K blocks would
// need the promotion of the fast kernels) and a 16- or 32-bit floating-point D (a quantized fp8 D is scaled by the
// fast kernel's epilogue). spec/config.py has_small_m_kernel says the same in Python.
template <class Cfg>
constexpr bool kAvailable = (std::is_same_v<typename Cfg::Elem, __half> ||
                             std::is_same_v<typename Cfg::Elem, __nv_bfloat16>) &&
                            std::is_same_v<typename Cfg::Elem, typename Cfg::ElemB> && Cfg::kAKMajor &&
                            (Cfg::kBKMajor || GEMMGEN_SMALL_M_N_MAJOR) && Cfg::Epilogue::kRowBlocksSlot < 0 &&
                            !std::is_same_v<typename Cfg::Out, int32_t> && !kIsFp8<typename Cfg::Out>;

// Chunk k .. k + 7 of a row. Guarded (the last, partial k step): a chunk that crosses K is read element by element
// and the rest is zero, since the row may end there and the elements past K must not reach the sums; a chunk past
// K is zero.
template <bool kGuarded, bool kStream, typename Elem>
__device__ __forceinline__ uint4 load_chunk(const Elem* row, int64_t k, int64_t K) {
  if constexpr (kGuarded) {
    if (k >= K) return make_uint4(0, 0, 0, 0);
    if (k + kChunk > K) return chunk_head(row + k, static_cast<int>(K - k));
  }
  if constexpr (!kStream) return ptx::ld_global_shared_16(row + k);
  return ptx::ld_global_stream_16(row + k);
}

// One warp's k step of W: kChunksPerStep chunks of each of its lanes' two rows.
struct WStep {
  uint4 lo[kChunksPerStep], hi[kChunksPerStep];
};

template <bool kGuarded, typename Elem>
__device__ __forceinline__ WStep load_w(const Elem* w_lo, const Elem* w_hi, int64_t k0, int64_t K, int t) {
  WStep w;
#pragma unroll
  for (int c = 0; c < kChunksPerStep; ++c) {
    const int64_t k = k0 + (c * kLanesK + t) * kChunk;
    w.lo[c] = load_chunk<kGuarded, true>(w_lo, k, K);
    w.hi[c] = load_chunk<kGuarded, true>(w_hi, k, K);
  }
  return w;
}

// A's chunks of one step, issued before any of its MMAs: chunk c of each group of 8 rows of A that the call has
// (``groups``; the rest of the array is never touched) at k_of(c), the first k of the caller's B chunk c.
template <bool kGuarded, typename Elem, class KOf>
__device__ __forceinline__ void load_a_step(const Elem* const (&a_rows)[kRowGroups], int groups, int64_t K, KOf k_of,
                                            uint4 (&a)[kRowGroups][kChunksPerStep]) {
#pragma unroll
  for (int r = 0; r < kRowGroups; ++r) {
    if (r < groups) {
#pragma unroll
      for (int c = 0; c < kChunksPerStep; ++c) a[r][c] = load_chunk<kGuarded, false>(a_rows[r], k_of(c), K);
    }
  }
}

// The step's chunks of A's rows (issued first), then its MMAs into the accumulators: one n8 MMA per k16 step for
// each group of 8 rows of A that the call has (``groups``; the rest of the arrays is never touched).
template <bool kGuarded, typename Elem>
__device__ __forceinline__ void multiply(const WStep& w, const Elem* const (&a_rows)[kRowGroups], int groups,
                                         int64_t k0, int64_t K, int t, float (&acc)[kRowGroups][4]) {
  using Mma = ptx::MmaM16N8K16<Elem>;
  uint4 a[kRowGroups][kChunksPerStep];
  load_a_step<kGuarded>(a_rows, groups, K, [=](int c) { return k0 + (c * kLanesK + t) * kChunk; }, a);
#pragma unroll
  for (int c = 0; c < kChunksPerStep; ++c) {
    const uint32_t first[4] = {w.lo[c].x, w.hi[c].x, w.lo[c].y, w.hi[c].y};
    const uint32_t second[4] = {w.lo[c].z, w.hi[c].z, w.lo[c].w, w.hi[c].w};
#pragma unroll
    for (int r = 0; r < kRowGroups; ++r) {
      if (r < groups) {
        Mma::run(acc[r], first, {a[r][c].x, a[r][c].y});
        Mma::run(acc[r], second, {a[r][c].z, a[r][c].w});
      }
    }
  }
}

// The rows of A (8 per n8 MMA), rows past M reading the last row instead: each element of D^T depends on one row
// of A, and those elements are never stored, so no load needs a guard for them.
template <typename Elem>
__device__ __forceinline__ const Elem* row_of(const Elem* base, int64_t row, int64_t rows, int64_t ld) {
  return base + (row < rows ? row : rows - 1) * ld;
}

// K-major B: this warp's share of K for the block's 16 rows of W, into acc (D^T rows g and g + 8 x columns 8r + 2t,
// 8r + 2t + 1 of group r).
template <typename Elem>
__device__ __forceinline__ void accumulate_k_major(const GemmArgs& args, const Elem* const (&a_rows)[kRowGroups],
                                                   int groups, int64_t n0, int warp, int g, int t,
                                                   float (&acc)[kRowGroups][4]) {
  const Elem* w = static_cast<const Elem*>(args.b);   // B (K x N) K-major: row n of W is column n of B
  const int64_t N = args.n, K = args.k;
  // Rows of W past N read the last row instead, as A's rows past M (row_of).
  const Elem* w_lo = row_of(w, n0 + g, N, args.ldb);
  const Elem* w_hi = row_of(w, n0 + g + 8, N, args.ldb);
  int64_t k0 = static_cast<int64_t>(warp) * kStepK;
#if GEMMGEN_SMALL_M_PREFETCH
  if (k0 + kStepK <= K) {
    WStep current = load_w<false>(w_lo, w_hi, k0, K, t);
    for (;;) {
      const int64_t next = k0 + kWarps * kStepK;
      const bool more = next + kStepK <= K;
      WStep ahead{};
      if (more) ahead = load_w<false>(w_lo, w_hi, next, K, t);
      multiply<false>(current, a_rows, groups, k0, K, t, acc);
      k0 = next;
      if (!more) break;
      current = ahead;
    }
  }
#else
  for (; k0 + kStepK <= K; k0 += kWarps * kStepK) {
    multiply<false>(load_w<false>(w_lo, w_hi, k0, K, t), a_rows, groups, k0, K, t, acc);
  }
#endif
  if (k0 < K) {   // the one partial step
    multiply<true>(load_w<true>(w_lo, w_hi, k0, K, t), a_rows, groups, k0, K, t, acc);
  }
}

// N-major B: a block owns 32 columns of D. Per 32-wide k chunk at kc, lane (g, t) loads four rows of B, row v
// (0..3) being k = kc + 8 (g / 2) + g % 2 + 2v, each at the block's columns n0 + 8t .. n0 + 8t + 7 (16 bytes; the
// warp reads 64 contiguous bytes of each row, the block's next load the next rows). Word i of a load holds columns
// 8t + 2i and 8t + 2i + 1, so over the warp it is an 8 x 8 matrix (rows g, column pairs t) of the columns
// c(j, i) = 8 (j / 2) + 2i + j % 2, j = 0..7; transposed (movmatrix), lane (g, t) holds column c(g, i) at
// k = kc + 8t + 2v and kc + 8t + 2v + 1. A's 16-byte chunk of lane (g, t), k = kc + 8t .. kc + 8t + 7, holds the same
// k pairs in its words v = 0..3: so the MMA of the chunk's first (second) 16 k takes words v = 0, 1 (2, 3). The
// block's columns make two MMAs' 16 rows of D^T: rows 0-7 of MMA b are the columns c(g, 2b), rows 8-15 c(g, 2b + 1).
struct NMajorB {
  static constexpr int kBlockColumns = 32;                // columns of D per block
  static constexpr int kMmas = kBlockColumns / 16;        // m16 MMAs along the block's columns
  static constexpr int kChunkK = 32;                      // k per chunk: two k16 MMAs
  static constexpr int kRowsPerChunk = 4;                 // rows of B each lane loads per chunk
  static constexpr int kChunksPerStep = GEMMGEN_SMALL_M_N_MAJOR_CHUNKS;
  static constexpr int kStepK = kChunksPerStep * kChunkK;  // k per warp and step

  // The block's column (0..31) that D^T row `row` (0..15) of MMA `mma` stands for.
  __device__ __forceinline__ static int column(int mma, int row) {
    const int j = row % 8, i = 2 * mma + row / 8;
    return 8 * (j / 2) + 2 * i + j % 2;
  }

  // Row v's k of a chunk at kc for lane group g.
  __device__ __forceinline__ static int64_t row_k(int64_t kc, int g, int v) {
    return kc + 8 * (g / 2) + g % 2 + 2 * v;
  }

  // Eight columns of row k of B from column n (the lane's). Guarded: rows past K and columns past N read as zero (the
  // last, partial chunk; the block at N's edge).
  template <bool kGuardK, bool kGuardN, typename Elem>
  __device__ __forceinline__ static uint4 load(const Elem* b, int64_t ldb, int64_t k, int64_t n, int64_t K, int64_t N) {
    if constexpr (kGuardK) {
      if (k >= K) return make_uint4(0, 0, 0, 0);
    }
    const Elem* at = b + k * ldb + n;
    if constexpr (kGuardN) {
      if (n + kChunk > N) return n < N ? chunk_head(at, static_cast<int>(N - n)) : make_uint4(0, 0, 0, 0);
    }
    return ptx::ld_global_stream_16(at);
  }

  struct Step {
    uint4 rows[kChunksPerStep][kRowsPerChunk];
  };

  template <bool kGuardK, bool kGuardN, typename Elem>
  __device__ __forceinline__ static Step load_step(const Elem* b, int64_t ldb, int64_t k0, int64_t n, int64_t K,
                                                   int64_t N, int g) {
    Step step;
#pragma unroll
    for (int c = 0; c < kChunksPerStep; ++c)
#pragma unroll
      for (int v = 0; v < kRowsPerChunk; ++v)
        step.rows[c][v] = load<kGuardK, kGuardN>(b, ldb, row_k(k0 + c * kChunkK, g, v), n, K, N);
    return step;
  }

  // The step's chunks of A's rows (issued first), then per chunk the transposes and, per MMA along the columns and
  // group of A's rows, its two k16 MMAs.
  template <bool kGuardK, typename Elem>
  __device__ __forceinline__ static void multiply(const Step& step, const Elem* const (&a_rows)[kRowGroups], int groups,
                                                  int64_t k0, int64_t K, int t,
                                                  float (&acc)[kMmas][kRowGroups][4]) {
    using Mma = ptx::MmaM16N8K16<Elem>;
    uint4 a[kRowGroups][kChunksPerStep];
    load_a_step<kGuardK>(a_rows, groups, K, [=](int c) { return k0 + c * kChunkK + t * kChunk; }, a);
#pragma unroll
    for (int c = 0; c < kChunksPerStep; ++c) {
      uint32_t w[kRowsPerChunk][4];   // [v][i]: column c(g, i) at k = kc + 8t + 2v, + 1
#pragma unroll
      for (int v = 0; v < kRowsPerChunk; ++v) {
        w[v][0] = ptx::movmatrix_trans(step.rows[c][v].x);
        w[v][1] = ptx::movmatrix_trans(step.rows[c][v].y);
        w[v][2] = ptx::movmatrix_trans(step.rows[c][v].z);
        w[v][3] = ptx::movmatrix_trans(step.rows[c][v].w);
      }
#pragma unroll
      for (int mma = 0; mma < kMmas; ++mma) {
        const int lo = 2 * mma, hi = 2 * mma + 1;
        const uint32_t first[4] = {w[0][lo], w[0][hi], w[1][lo], w[1][hi]};
        const uint32_t second[4] = {w[2][lo], w[2][hi], w[3][lo], w[3][hi]};
#pragma unroll
        for (int r = 0; r < kRowGroups; ++r) {
          if (r < groups) {
            Mma::run(acc[mma][r], first, {a[r][c].x, a[r][c].y});
            Mma::run(acc[mma][r], second, {a[r][c].z, a[r][c].w});
          }
        }
      }
    }
  }

  // This warp's share of K for the block's columns, into acc (MMA b's D^T rows column(b, g) and column(b, g + 8)).
  template <bool kGuardN, typename Elem>
  __device__ __forceinline__ static void accumulate(const GemmArgs& args, const Elem* const (&a_rows)[kRowGroups],
                                                    int groups, int64_t n0, int warp, int g, int t,
                                                    float (&acc)[kMmas][kRowGroups][4]) {
    const Elem* b = static_cast<const Elem*>(args.b);
    const int64_t N = args.n, K = args.k, n = n0 + kChunk * t;
    int64_t k0 = static_cast<int64_t>(warp) * kStepK;
    for (; k0 + kStepK <= K; k0 += kWarps * kStepK) {
      multiply<false>(load_step<false, kGuardN>(b, args.ldb, k0, n, K, N, g), a_rows, groups, k0, K, t, acc);
    }
    if (k0 < K) {   // the one partial step
      multiply<true>(load_step<true, kGuardN>(b, args.ldb, k0, n, K, N, g), a_rows, groups, k0, K, t, acc);
    }
  }
};

// An N-major B takes this kernel while its strips of 32 columns fit one per SM (a second wave of whole-K strips costs
// as much as the first), B is at most kNMajorMaxBytes (each block walks its strip's whole K, which on the H200 read
// B at 3.1-3.4 TB/s against the tiled kernels' 3.8 on larger problems) and, with more than 8 rows (two n8 MMAs per
// k16), K is at least kNMajorTwoGroupsMinK (below, 16 rows lost 2-14 % to the tiled kernels: each warp's one or two
// k steps do not repay the block's fixed costs). Measured on the corpus' dX (docs/small_m.md). launch.cuh's
// takes_small_m applies it; spec/config.py takes_small_m says the same in Python.
constexpr int64_t kNMajorMaxBytes = int64_t(192) << 20;
constexpr int64_t kNMajorTwoGroupsMinK = 2560;

// Whether a call of at most kMaxRows rows with an N-major B (after fold_batch) is within those bounds on a GPU of
// `sms` SMs.
template <class Cfg>
inline bool n_major_fits(const GemmArgs& args, int sms) {
  const int64_t strips = (args.n + NMajorB::kBlockColumns - 1) / NMajorB::kBlockColumns;
  return strips <= sms && args.n * args.k * static_cast<int64_t>(sizeof(typename Cfg::ElemB)) <= kNMajorMaxBytes &&
         (args.m <= 8 || args.k >= kNMajorTwoGroupsMinK);
}

// Columns of D per block: 16 rows of a K-major W, 32 columns of an N-major B (NMajorB).
template <class Cfg>
constexpr int kBlockColumns = Cfg::kBKMajor ? kRowsW : NMajorB::kBlockColumns;

// One MMA's C fragment into this warp's partial sums (columns x rows of D): c0, c1 at (row g, columns 2t, 2t + 1),
// c2, c3 at row g + 8 (§9.7.14.5.8), the rows being the block's columns lo and hi. Groups past the call's rows
// hold zeros and are never stored.
template <int kColumns>
__device__ __forceinline__ void keep_partial(float (&partial)[kColumns][kMaxRows], const float (&acc)[kRowGroups][4],
                                             int lo, int hi, int t) {
#pragma unroll
  for (int r = 0; r < kRowGroups; ++r) {
    partial[lo][8 * r + 2 * t] = acc[r][0];
    partial[lo][8 * r + 2 * t + 1] = acc[r][1];
    partial[hi][8 * r + 2 * t] = acc[r][2];
    partial[hi][8 * r + 2 * t + 1] = acc[r][3];
  }
}

template <class Cfg>
__device__ __forceinline__ void run(const GemmArgs& args) {
  using Elem = typename Cfg::Elem;
  using Out = typename Cfg::Out;
  constexpr int kColumns = kBlockColumns<Cfg>;
  __shared__ float partial[kWarps][kColumns][kMaxRows];

  const Elem* a = static_cast<const Elem*>(args.a);
  const int64_t M = args.m, N = args.n;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / kLanesK, t = lane % kLanesK;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kColumns;
  const int groups = static_cast<int>((M + 7) / 8);   // groups of 8 rows of A: n8 MMAs per k16 step
  const Elem* a_rows[kRowGroups];
#pragma unroll
  for (int r = 0; r < kRowGroups; ++r) a_rows[r] = row_of(a, 8 * r + g, M, args.lda);

  if constexpr (Cfg::kBKMajor) {
    float acc[kRowGroups][4] = {};   // D^T rows g, g + 8 x columns 8r + 2t, 8r + 2t + 1 of group r
    accumulate_k_major(args, a_rows, groups, n0, warp, g, t, acc);
    keep_partial(partial[warp], acc, g, g + 8, t);
  } else {
    float acc[NMajorB::kMmas][kRowGroups][4] = {};
    if (n0 + kColumns <= N) {
      NMajorB::accumulate<false>(args, a_rows, groups, n0, warp, g, t, acc);
    } else {
      NMajorB::accumulate<true>(args, a_rows, groups, n0, warp, g, t, acc);
    }
#pragma unroll
    for (int mma = 0; mma < NMajorB::kMmas; ++mma)
      keep_partial(partial[warp], acc[mma], NMajorB::column(mma, g), NMajorB::column(mma, g + 8), t);
  }
  __syncthreads();

  // The elements of D's kMaxRows x kColumns block, neighbouring threads on neighbouring columns n.
  for (int e = threadIdx.x; e < kColumns * kMaxRows; e += kThreads) {
    const int col = e % kColumns, row = e / kColumns;
    const int64_t m = row, n = n0 + col;
    if (m >= M || n >= N) continue;
    float value = 0.0f;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) value += partial[i][col][row];
    if constexpr (!Cfg::Epilogue::kIdentity) value = Cfg::Epilogue::apply(args, value, m, n);
    Out* d = static_cast<Out*>(args.d);
    d[Cfg::kDRowMajor ? m * args.ldd + n : n * args.ldd + m] = from_float<Out>(value);
  }
}

}  // namespace small_m
}  // namespace gemmgen
