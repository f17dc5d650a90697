// The sm80 GEMM family: a multistage cp.async pipeline into XOR-swizzled shared memory,
// ldmatrix(.trans) to registers and mma.sync m16n8k16 with fp32 accumulators. tf32 (fp32 tensors): mma.sync
// m16n8k8, K-major fragments by ldmatrix as for 16-bit types, M/N-major ones by 32-bit shared loads.
//
// A generated kernel supplies a Config struct of compile-time constants (see sm80/gemm.cu.j2)
// and calls gemm_block<Config>. Everything below is ordinary C++ over those constants.
#pragma once

#include <cstdint>
#include <cstring>  // memcpy: a chunk's 16-bit element as Out
#include <type_traits>

#include "../common/alignment.cuh"
#include "../common/convert.cuh"
#include "../common/gemm_args.h"
#include "../ptx/sm80.cuh"
#include "../ptx/smem.cuh"

namespace gemmgen {
namespace sm80 {

constexpr int kChunkBytes = 16;  // one cp.async and one ldmatrix row
constexpr int kLineBytes = 128;  // 32 banks x 4 bytes: the span a conflict-free access must cover
constexpr int kMmaM = 16, kMmaN = 8;  // the mma.sync tile of D; its k depends on the input type
// Every mma.sync shape here reads 32 bytes of k per row: k16 of 16-bit inputs, k8 of tf32. A k step therefore
// covers two 16-byte chunks of a K-major row whatever the input type.
constexpr int kMmaKBytes = 32;
// A k step of m16n8k8 (tf32) splits into two halves of four k each: a2/a3 and b1 read k + 4.
constexpr int kTf32HalfK = 4;

// The mma.sync of an input type: m16n8k16 for fp16 and bf16, m16n8k8 for tf32 (fp32 tensors), m16n8k32 for int8.
template <typename Elem>
struct MmaFor {
  using Op = ptx::MmaM16N8K16<Elem>;
};
template <>
struct MmaFor<float> {
  using Op = ptx::MmaM16N8K8Tf32;
};
template <>
struct MmaFor<int8_t> {
  using Op = ptx::MmaM16N8K32S8;
};

// An operand tile of ROWS x COLS elements of ELEM_BYTES in shared memory, COLS contiguous, stored as
// 16-byte chunks whose position within their row is XOR-ed with a function of the row's index.
//
// ldmatrix tiles (WORD_READS false): the chunk is XOR-ed with the row's index. The eight addresses of one
// ldmatrix phase (eight consecutive rows, one logical chunk) and the eight chunks a cp.async phase writes then
// fall in eight different 16-byte bank groups: no bank conflicts.
//
// Word tiles (WORD_READS, tf32 M/N-major operands, read by 32-bit loads): a warp's load reads four consecutive
// rows (k = t) at eight consecutive elements (m or n = g), i.e. two chunks of each of four rows. The chunk is
// XOR-ed with 2 * (row % 4), so the four rows' pairs of chunks land in four different pairs of bank groups: the
// 32 words hit 32 different banks. (The ldmatrix swizzle, chunk ^ row, would put rows 0 and 1 on the same two
// chunks: a 2-way conflict.) Rows span whole 128-byte lines, so the cp.async writes stay conflict-free too.
template <int ROWS, int COLS, int ELEM_BYTES = 2, bool WORD_READS = false>
struct SwizzledTile {
  static constexpr int kRows = ROWS, kCols = COLS;
  static constexpr int kChunkElems = kChunkBytes / ELEM_BYTES;
  static constexpr int kChunksPerRow = COLS / kChunkElems;
  static constexpr int kLineChunks = kLineBytes / kChunkBytes;
  static constexpr int kRowsPerLine = kChunksPerRow >= kLineChunks ? 1 : kLineChunks / kChunksPerRow;
  static constexpr int kSwizzleSpan = kChunksPerRow >= kLineChunks ? kLineChunks : kChunksPerRow;
  // Word tiles: four rows (the k = t of one half k step), each on its own pair of bank groups.
  static constexpr int kWordRows = 4;
  static constexpr int kElems = ROWS * COLS;
  static constexpr int kRowBytes = COLS * ELEM_BYTES;
  static constexpr int kBytes = ROWS * kRowBytes;
  // The XOR pattern repeats every kPeriodRows rows (8 for every ldmatrix tile here, 4 for word tiles).
  static constexpr int kPeriodRows = WORD_READS ? kWordRows : kRowsPerLine * kSwizzleSpan;
  static_assert(kRowBytes >= 64, "rows of at least 64 bytes keep the swizzle conflict-free");
  static_assert(!WORD_READS || (ELEM_BYTES == 4 && kRowBytes % kLineBytes == 0),
                "word tiles hold 32-bit elements in rows of whole 128-byte lines");

  __host__ __device__ __forceinline__ static int swizzle(int row) {
    return WORD_READS ? 2 * (row % kWordRows) : (row / kRowsPerLine) % kSwizzleSpan;
  }

  // Byte offset of chunk `chunk` of row `row`.
  __host__ __device__ __forceinline__ static uint32_t offset(int row, int chunk) {
    const int physical = chunk ^ swizzle(row);
    return static_cast<uint32_t>((row * COLS + physical * kChunkElems) * ELEM_BYTES);
  }

  // Byte offset of chunk `chunk` of row `row + shift`, where `shift` is a multiple of kPeriodRows: the
  // swizzle sees only `row`, so `shift` adds to the address. Warp-uniform and compile-time shifts then
  // fold into one base register and immediate offsets instead of one register per address.
  __host__ __device__ __forceinline__ static uint32_t offset(int row, int chunk, int shift) {
    return offset(row, chunk) + static_cast<uint32_t>(shift * kRowBytes);
  }

  // Word tiles: byte offset of element `elem` of row `row + shift` (shift as above), moved along the row by
  // `line_shift` elements, a multiple of kLineElems: the swizzle permutes the chunks of a 128-byte line only, so
  // whole lines add to the address as whole periods of rows do.
  static constexpr int kLineElems = kLineBytes / ELEM_BYTES;
  __host__ __device__ __forceinline__ static uint32_t element_offset(int row, int elem, int shift, int line_shift = 0) {
    return offset(row, elem / kChunkElems, shift) +
           static_cast<uint32_t>((elem % kChunkElems + line_shift) * ELEM_BYTES);
  }

  // Word tiles: the word lane (g, t) of an mma fragment reads, element mn + g of row k0 + t, where mn (the
  // fragment's first m or n) and k0 (a multiple of kPeriodRows) are the same for the whole warp. Only mn's place
  // in its line meets the swizzle; its whole lines, like k0's rows, add to the address: a warp tile aligned to
  // lines then reads through a few base registers and immediate offsets.
  __host__ __device__ __forceinline__ static uint32_t fragment_word(int mn, int k0, int g, int t) {
    const int inside = mn & (kLineElems - 1);
    return element_offset(t, inside + g, k0, mn - inside);
  }
};

// Copies one operand's slice of a block tile from global to shared memory, one k tile at a time.
// The shared tile (Tile) is OUTER x INNER with INNER contiguous in both memories. K_INNER: K is the inner
// dimension (a K-major operand: rows are M or N); otherwise K is the outer one (an M/N-major operand).
// Every thread owns the chunks tid, tid + THREADS, ...: they share one inner position and step
// through rows, so one base pointer and one validity value per thread describe them all.
template <typename Elem, class Tile, bool K_INNER, int THREADS>
struct TileLoader {
  static constexpr int OUTER = Tile::kRows, INNER = Tile::kCols;
  static constexpr int kElemBytes = static_cast<int>(sizeof(Elem));
  static constexpr int kChunkElems = Tile::kChunkElems;
  static constexpr int kChunks = OUTER * INNER / kChunkElems;
  static constexpr int kPerThread = kChunks / THREADS;
  static constexpr int kRowStep = THREADS / Tile::kChunksPerRow;  // rows between a thread's chunks
  static constexpr int kBlockK = K_INNER ? INNER : OUTER;
  static_assert(kChunks % THREADS == 0, "each thread copies a whole number of chunks");
  static_assert(THREADS % Tile::kChunksPerRow == 0, "a thread's chunks share one inner position");

  const Elem* base;       // the operand itself: a safe address for copies that read nothing
  const Elem* next;       // this thread's first chunk in the next k tile
  int64_t row_stride;     // elements between this thread's consecutive chunks
  int64_t k_tile_stride;  // elements from one k tile to the next
  int row0, chunk;        // this thread's first row and its chunk within the row
  int inner_bytes;        // K_INNER: unused; else bytes of the chunk inside M (or N)
  uint32_t row_valid;     // K_INNER: bit i set when chunk i's row lies inside M (or N)

  // mn0: the block's first row (A) or column (B); mn_extent: M or N; ld: leading dimension.
  __device__ __forceinline__ void init(const Elem* operand, int64_t ld, int mn0, int mn_extent, int tid) {
    base = operand;
    row0 = tid / Tile::kChunksPerRow;
    chunk = tid % Tile::kChunksPerRow;
    row_stride = kRowStep * ld;
    if (K_INNER) {
      k_tile_stride = kBlockK;
      row_valid = 0;
#pragma unroll
      for (int i = 0; i < kPerThread; ++i)
        row_valid |= (mn0 + row0 + i * kRowStep < mn_extent ? 1u : 0u) << i;
      // Rows past the edge read nothing; point them at row 0 so no address leaves the operand.
      const int first_row = mn0 + row0 < mn_extent ? mn0 + row0 : 0;
      next = operand + first_row * ld + chunk * kChunkElems;
      inner_bytes = kChunkBytes;
    } else {
      k_tile_stride = kBlockK * ld;
      const int mn = mn0 + chunk * kChunkElems;
      const int left = mn_extent - mn;
      inner_bytes = left <= 0 ? 0 : (left >= kChunkElems ? kChunkBytes : left * kElemBytes);
      row_valid = ~0u;
      next = operand + row0 * ld + (inner_bytes ? mn : 0);
    }
  }

  // Issue the copies of one whole k tile (no clipping along K) into the stage at `stage_smem`.
  // This is the main loop's path, so it does the least work per chunk: one address, one select.
  // EDGE: the block's tile crosses the end of M or N, so some of this thread's rows may lie outside
  // the operand. Interior blocks (all but the last row and column of tiles) skip those selects.
  template <bool EDGE>
  __device__ __forceinline__ void load_full(uint32_t stage_smem) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const bool valid = !(K_INNER && EDGE) || ((row_valid >> i) & 1u);
      ptx::cp_async_16_zfill(stage_smem + smem_offset(i), valid ? next + i * row_stride : base,
                             valid ? inner_bytes : 0);
    }
    next += k_tile_stride;
  }

  // The last, ragged k tile: clip along K as well. k_left = K - (first k of the tile) < kBlockK.
  __device__ __forceinline__ void load_partial(uint32_t stage_smem, int k_left) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int row = row0 + i * kRowStep;
      int bytes = (row_valid >> i) & 1u ? inner_bytes : 0;
      if (K_INNER) {
        const int k_elems = k_left - chunk * kChunkElems;
        bytes = k_elems <= 0 ? 0 : (k_elems >= kChunkElems ? bytes : (bytes ? k_elems * kElemBytes : 0));
      } else if (row >= k_left) {
        bytes = 0;
      }
      if (bytes > 0 && bytes < kChunkBytes) {
        copy_part(stage_smem + smem_offset(i), next + i * row_stride, bytes);
        continue;
      }
      // A copy that reads nothing still needs an address inside the operand.
      ptx::cp_async_16_zfill(stage_smem + smem_offset(i), bytes ? next + i * row_stride : base, bytes);
    }
    next += k_tile_stride;
  }

  // A chunk of the last k tile that ends inside the operand (at the edge of M or N, or of K) is read element by
  // element and stored with its zeros: a 16-byte cp.async given fewer source bytes is still a 16-byte access to
  // compute-sanitizer, which at the operand's last column or row lies past its allocation (fuzz case
  // sm80:bf16:82687473190367, docs/fuzzing.md). Synchronous, into the stage the cp.async of this k tile fill: the
  // same __syncthreads that makes theirs visible makes it visible.
  __device__ __forceinline__ void copy_part(uint32_t dst, const Elem* src, int bytes) const {
    ptx::st_shared_16(dst, chunk_head(src, bytes / kElemBytes));
  }

  // Shared-memory byte offset of chunk i; a compile-time stride from chunk 0 when the rows between a
  // thread's chunks span whole swizzle periods (the usual case), so the copies use immediate offsets.
  __device__ __forceinline__ uint32_t smem_offset(int i) const {
    if (kRowStep % Tile::kPeriodRows == 0) return Tile::offset(row0, chunk, i * kRowStep);
    return Tile::offset(row0 + i * kRowStep, chunk);
  }
};

// The staged epilogue's slab: rows of ROW_BYTES (a power of two, at least two 16-byte chunks) in which
// chunk c of row r lies at chunk c ^ f(r), so that both of its accesses are free of bank conflicts:
// the fragment writes (8 consecutive rows, the chunk or two of one n8 column) and the 16-byte reads
// (consecutive chunks, row by row) touch each 16-byte bank group equally often.
template <int ROW_BYTES>
struct EpilogueSlab {
  static constexpr int kChunks = ROW_BYTES / kChunkBytes;
  static_assert(kChunks >= 2 && (kChunks & (kChunks - 1)) == 0, "slab rows are a power of two of chunks");
  static constexpr int kRowsPerLine = kChunks >= 8 ? 1 : 8 / kChunks;  // rows sharing one 128-byte line
  static constexpr int kSwizzle = kChunks >= 8 ? 8 : kChunks;

  __host__ __device__ __forceinline__ static uint32_t offset(int row, int chunk) {
    return row * ROW_BYTES + (chunk ^ ((row / kRowsPerLine) % kSwizzle)) * kChunkBytes;
  }
};

// Which output tile this block computes: blocks walk GROUP_M tile rows together, column by column,
// so that consecutive blocks share A rows and B columns in L2 (Triton's grouped ordering).
template <int GROUP_M>
__device__ __forceinline__ void raster_tile(int block, int tiles_m, int tiles_n, int& tile_m, int& tile_n) {
  const int per_group = GROUP_M * tiles_n;
  const int group = block / per_group;
  const int first_m = group * GROUP_M;
  const int rows = min(tiles_m - first_m, GROUP_M);
  const int in_group = block - group * per_group;
  tile_m = first_m + in_group % rows;
  tile_n = in_group / rows;
}

template <class Cfg>
struct Kernel {
  using Elem = typename Cfg::Elem;
  using Out = typename Cfg::Out;
  static constexpr int BM = Cfg::kBlockM, BN = Cfg::kBlockN, BK = Cfg::kBlockK;
  static constexpr int WARPS_M = Cfg::kWarpsM, WARPS_N = Cfg::kWarpsN;
  static constexpr int STAGES = Cfg::kStages;
  static constexpr int THREADS = WARPS_M * WARPS_N * 32;
  static constexpr int WARP_M = BM / WARPS_M, WARP_N = BN / WARPS_N;
  static constexpr int MMA_TILES_M = WARP_M / kMmaM, MMA_TILES_N = WARP_N / kMmaN;
  static constexpr int ELEM_BYTES = static_cast<int>(sizeof(Elem));
  static constexpr int MMA_K = kMmaKBytes / ELEM_BYTES;  // 16 for 16-bit inputs, 8 for tf32
  static constexpr int K_STEPS = BK / MMA_K;
  static constexpr bool A_K_MAJOR = Cfg::kAKMajor, B_K_MAJOR = Cfg::kBKMajor, D_ROW_MAJOR = Cfg::kDRowMajor;
  // tf32: fp32 tensors, rounded to tf32 in registers. ldmatrix.trans moves 16-bit elements only, so M/N-major
  // tf32 operands are read by 32-bit loads from word tiles (see SwizzledTile).
  static constexpr bool TF32 = std::is_same_v<Elem, float>;
  static constexpr bool A_WORDS = TF32 && !A_K_MAJOR, B_WORDS = TF32 && !B_K_MAJOR;
  using Mma = typename MmaFor<Elem>::Op;
  static_assert(std::is_same_v<typename Cfg::ElemB, Elem>, "the sm80 family takes A and B of one type");
  // float, or int32_t for int8: after the main loop its sums become fp32 values in place, or stay bits for an
  // int32 D (see int_sums_for_epilogue).
  using Accum = typename Mma::Accum;
  static constexpr bool INT_ACCUM = std::is_same_v<Accum, int32_t>;
  static_assert(!INT_ACCUM || (A_K_MAJOR && B_K_MAJOR), "8-bit operands are read K-major (ldmatrix of bytes)");

  using ATile = std::conditional_t<A_K_MAJOR, SwizzledTile<BM, BK, ELEM_BYTES>,
                                   SwizzledTile<BK, BM, ELEM_BYTES, A_WORDS>>;
  using BTile = std::conditional_t<B_K_MAJOR, SwizzledTile<BN, BK, ELEM_BYTES>,
                                   SwizzledTile<BK, BN, ELEM_BYTES, B_WORDS>>;
  using ALoader = TileLoader<Elem, ATile, A_K_MAJOR, THREADS>;
  using BLoader = TileLoader<Elem, BTile, B_K_MAJOR, THREADS>;
  static constexpr uint32_t A_STAGE_BYTES = ATile::kBytes, B_STAGE_BYTES = BTile::kBytes;
  static constexpr uint32_t STAGE_BYTES = A_STAGE_BYTES + B_STAGE_BYTES;
  static constexpr int SMEM_BYTES = STAGES * STAGE_BYTES;
  static_assert(SMEM_BYTES <= Cfg::kMaxSmemBytes, "the planner keeps the stages within the arch's shared memory");
  static_assert(K_STEPS >= 2, "the fragment double buffer assumes at least two k steps per tile");
  static_assert(MMA_TILES_N % 2 == 0, "B fragments are loaded two n8 tiles at a time");

  // Registers holding one k step's operands for the warp's whole tile.
  struct Fragments {
    uint32_t a[MMA_TILES_M][4];
    uint32_t b[MMA_TILES_N][2];
  };

  // The shifts below (warp_m0, warp_n0, mma tiles, k steps) are multiples of the swizzle period.
  static_assert(kMmaM % ATile::kPeriodRows == 0 && MMA_K % ATile::kPeriodRows == 0 &&
                    2 * kMmaN % BTile::kPeriodRows == 0 && MMA_K % BTile::kPeriodRows == 0,
                "fragment addresses move by whole swizzle periods");
  static_assert(!TF32 || kTf32HalfK % ATile::kPeriodRows == 0 || A_K_MAJOR, "a2/a3 rows are whole periods away");
  static_assert(!TF32 || kTf32HalfK % BTile::kPeriodRows == 0 || B_K_MAJOR, "b1 rows are whole periods away");

  // One k step's fragments. Each address is a per-lane swizzled offset plus a shift along whole swizzle
  // periods: K-major operands shift by the warp's and the mma tile's rows (a register per k step,
  // immediates across mma tiles), M/N-major ones by the k step's rows (a register per mma tile).
  //
  // K-major rows hold 32 bytes of k per k step in two chunks, so one ldmatrix.x4 gives the A fragment of
  // m16n8k16 (16-bit) and of m16n8k8 (tf32) alike: an 8x8 b16 matrix is 8 rows x 4 fp32, and lane (g, t)
  // receives the word at row g, column t: a0..a3 = (g, t) (g+8, t) (g, t+4) (g+8, t+4) for tf32.
  __device__ __forceinline__ static void load_fragments(Fragments& f, uint32_t stage, int ks, int warp_m0,
                                                        int warp_n0, int lane) {
    const uint32_t a_smem = stage, b_smem = stage + A_STAGE_BYTES;
    const int g = lane / 4, t = lane % 4;  // word reads: the lane's row (m or n) and k in the mma fragment
#pragma unroll
    for (int mt = 0; mt < MMA_TILES_M; ++mt) {
      const int m = warp_m0 + mt * kMmaM;
      if constexpr (A_K_MAJOR) {  // rows are m: matrices (m0-7,k0-7) (m8-15,k0-7) (m0-7,k8-15) (m8-15,k8-15)
        const int row = (lane % 8) + 8 * ((lane / 8) % 2);
        ptx::ldmatrix_x4(f.a[mt], a_smem + ATile::offset(row, ks * 2 + lane / 16, m));
      } else if constexpr (A_WORDS) {  // tf32, rows are k: a0..a3 = (m g, k t) (g+8, t) (g, t+4) (g+8, t+4)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          f.a[mt][i] = ptx::ld_shared_b32(
              a_smem + ATile::fragment_word(m + (i % 2) * kMmaN, ks * MMA_K + (i / 2) * kTf32HalfK, g, t));
      } else {  // rows are k: the same four matrices, read transposed
        const int row = (lane % 8) + 8 * (lane / 16);
        ptx::ldmatrix_x4_trans(f.a[mt], a_smem + ATile::offset(row, m / 8 + (lane / 8) % 2, ks * MMA_K));
      }
    }
    if constexpr (B_WORDS) {  // tf32, rows are k: b0, b1 = (k t, n g) (k t+4, n g)
#pragma unroll
      for (int nt = 0; nt < MMA_TILES_N; ++nt)
#pragma unroll
        for (int i = 0; i < 2; ++i)
          f.b[nt][i] = ptx::ld_shared_b32(
              b_smem + BTile::fragment_word(warp_n0 + nt * kMmaN, ks * MMA_K + i * kTf32HalfK, g, t));
    } else {
#pragma unroll
      for (int np = 0; np < MMA_TILES_N / 2; ++np) {
        const int n = warp_n0 + np * 2 * kMmaN;
        uint32_t r[4];
        if constexpr (B_K_MAJOR) {  // rows are n: matrices (n0-7,k0-7) (n0-7,k8-15) (n8-15,k0-7) (n8-15,k8-15)
          const int row = (lane % 8) + 8 * (lane / 16);
          ptx::ldmatrix_x4(r, b_smem + BTile::offset(row, ks * 2 + (lane / 8) % 2, n));
        } else {  // rows are k: the same four matrices, read transposed
          const int row = (lane % 8) + 8 * ((lane / 8) % 2);
          ptx::ldmatrix_x4_trans(r, b_smem + BTile::offset(row, n / 8 + lane / 16, ks * MMA_K));
        }
        f.b[2 * np][0] = r[0];
        f.b[2 * np][1] = r[1];
        f.b[2 * np + 1][0] = r[2];
        f.b[2 * np + 1][1] = r[3];
      }
    }
    if constexpr (TF32) round_to_tf32(f);
  }

  // tf32: the fragments' fp32 bits rounded to tf32 in place, once per k step (mma.sync would truncate them).
  __device__ __forceinline__ static void round_to_tf32(Fragments& f) {
#pragma unroll
    for (int mt = 0; mt < MMA_TILES_M; ++mt)
#pragma unroll
      for (int i = 0; i < 4; ++i) f.a[mt][i] = ptx::cvt_tf32(f.a[mt][i]);
#pragma unroll
    for (int nt = 0; nt < MMA_TILES_N; ++nt)
#pragma unroll
      for (int i = 0; i < 2; ++i) f.b[nt][i] = ptx::cvt_tf32(f.b[nt][i]);
  }

  __device__ __forceinline__ static void mma_all(Accum (&acc)[MMA_TILES_M][MMA_TILES_N][4], const Fragments& f) {
#pragma unroll
    for (int mt = 0; mt < MMA_TILES_M; ++mt)
#pragma unroll
      for (int nt = 0; nt < MMA_TILES_N; ++nt) {
        // Serpentine order along n reuses the last B fragment between rows.
        const int n = (mt % 2) ? MMA_TILES_N - 1 - nt : nt;
        Mma::run(acc[mt][n], f.a[mt], f.b[n]);
      }
  }

  // Where a lane's accumulator pair `half` (elements 2*half and 2*half + 1, neighbouring columns) sits
  // in its m16n8 tile: PTX ISA §9.7.14.5.14 "Multiply-and-Accumulate Instruction: mma", the m16n8k16
  // fragment layout of C/D (m16n8k8's is the same).
  struct AccumPair {
    int row, col;
  };
  __device__ __forceinline__ static AccumPair accum_pair(int lane, int half) {
    return {lane / 4 + half * 8, (lane % 4) * 2};
  }

  // The fused epilogue (Cfg::Epilogue, rendered from the plan) on the accumulators in registers, element by
  // element inside M x N; the stores below then write its values. Elements outside are left alone: the
  // stores skip them, and the epilogue's operands have no element there to read. The source operand (if any)
  // is read in pairs of neighbouring columns, one load per accumulator pair, when its base and row pitch keep
  // the pairs aligned.
  __device__ __forceinline__ static void apply_epilogue(const GemmArgs& args, float (&acc)[MMA_TILES_M][MMA_TILES_N][4],
                                                        int row_base, int col_base, int lane) {
    if constexpr (Cfg::Epilogue::kSourceSlot >= 0) {
      constexpr int slot = Cfg::Epilogue::kSourceSlot;
      constexpr int kPairBytes = 2 * sizeof(typename Cfg::Epilogue::Source);
      if (reinterpret_cast<uintptr_t>(args.ep_ptr[slot]) % kPairBytes == 0 && args.ep_ld[slot] % 2 == 0) {
        apply_epilogue_tile<true>(args, acc, row_base, col_base, lane);
        return;
      }
    }
    apply_epilogue_tile<false>(args, acc, row_base, col_base, lane);
  }

  // A warp tile wholly inside M x N takes the loop without bounds checks: straight-line code whose elements
  // interleave.
  template <bool SOURCED>
  __device__ __forceinline__ static void apply_epilogue_tile(const GemmArgs& args,
                                                             float (&acc)[MMA_TILES_M][MMA_TILES_N][4], int row_base,
                                                             int col_base, int lane) {
    if constexpr (SOURCED ? Cfg::Epilogue::kStraightLineSourced : Cfg::Epilogue::kStraightLine) {
      if (row_base + WARP_M <= args.m && col_base + WARP_N <= args.n) {
        apply_epilogue_part<false, SOURCED>(args, acc, row_base, col_base, lane);
        return;
      }
    }
    apply_epilogue_part<true, SOURCED>(args, acc, row_base, col_base, lane);
  }

  template <bool CHECKED, bool SOURCED>
  __device__ __forceinline__ static void apply_epilogue_part(const GemmArgs& args,
                                                             float (&acc)[MMA_TILES_M][MMA_TILES_N][4], int row_base,
                                                             int col_base, int lane) {
    using Epi = typename Cfg::Epilogue;
    const int M = static_cast<int>(args.m), N = static_cast<int>(args.n);
    // Per-row vectors once per row, per-column ones once per column: not once per element.
    typename Epi::Row rows[MMA_TILES_M][2];
#pragma unroll
    for (int mt = 0; mt < MMA_TILES_M; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = row_base + mt * kMmaM + accum_pair(lane, half).row;
        rows[mt][half] = !CHECKED || row < M ? Epi::load_row(args, row) : typename Epi::Row{};
      }
#pragma unroll
    for (int nt = 0; nt < MMA_TILES_N; ++nt) {
      const int col0 = col_base + nt * kMmaN + accum_pair(lane, 0).col;  // even: the pair's first column
      float2 source[MMA_TILES_M][2];
      if constexpr (SOURCED) load_source_pairs<CHECKED>(args, source, row_base, col0, lane);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = col0 + e;
        if (CHECKED && col >= N) continue;
        const typename Epi::Col cols = Epi::load_col(args, col);
#pragma unroll
        for (int mt = 0; mt < MMA_TILES_M; ++mt)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int row = row_base + mt * kMmaM + accum_pair(lane, half).row;
            float& value = acc[mt][nt][2 * half + e];
            if (CHECKED && row >= M) continue;
            if constexpr (SOURCED) {
              const float2 pair = source[mt][half];
              value = Epi::apply_sourced(args, value, row, col, rows[mt][half], cols, e == 0 ? pair.x : pair.y);
            } else {
              value = Epi::apply(args, value, row, col, rows[mt][half], cols);
            }
          }
      }
    }
  }

  // The source's values at columns (col0, col0 + 1) of this lane's accumulator rows: one aligned pair load
  // each, a single element at a ragged last column, nothing outside M x N.
  template <bool CHECKED>
  __device__ __forceinline__ static void load_source_pairs(const GemmArgs& args, float2 (&source)[MMA_TILES_M][2],
                                                           int row_base, int col0, int lane) {
    using Epi = typename Cfg::Epilogue;
    const int M = static_cast<int>(args.m), N = static_cast<int>(args.n);
#pragma unroll
    for (int mt = 0; mt < MMA_TILES_M; ++mt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = row_base + mt * kMmaM + accum_pair(lane, half).row;
        const int64_t at = static_cast<int64_t>(row) * args.ep_ld[Epi::kSourceSlot] + col0;
        if (!CHECKED || (row < M && col0 + 1 < N)) {
          source[mt][half] = Epi::load_source_pair(args, at);
        } else if (row < M && col0 < N) {
          source[mt][half] = make_float2(Epi::load_source(args, at), 0.f);
        } else {
          source[mt][half] = make_float2(0.f, 0.f);
        }
      }
  }

  // fp32 accumulators -> D, clipped to M x N. Row-major D stores neighbouring columns in pairs.
  __device__ __forceinline__ static void store(const GemmArgs& args, const float (&acc)[MMA_TILES_M][MMA_TILES_N][4],
                                               int row_base, int col_base, int lane) {
    Out* d = static_cast<Out*>(args.d);
    const int M = static_cast<int>(args.m), N = static_cast<int>(args.n);
    const int64_t ldd = args.ldd;
    using Pair = gemmgen::Pair<Out>;
    const bool pairs_aligned =
        reinterpret_cast<uintptr_t>(d) % sizeof(typename Pair::type) == 0 && ldd % 2 == 0;
#pragma unroll
    for (int mt = 0; mt < MMA_TILES_M; ++mt)
#pragma unroll
      for (int nt = 0; nt < MMA_TILES_N; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const AccumPair at = accum_pair(lane, half);
          const int row = row_base + mt * kMmaM + at.row;
          const int col = col_base + nt * kMmaN + at.col;
          const float v0 = acc[mt][nt][2 * half], v1 = acc[mt][nt][2 * half + 1];
          if (row >= M) continue;
          if (D_ROW_MAJOR) {
            Out* p = d + row * ldd + col;
            if (pairs_aligned && col + 1 < N) {
              *reinterpret_cast<typename Pair::type*>(p) = Pair::make(v0, v1);
            } else {
              if (col < N) p[0] = from_accumulator<Out>(v0);
              if (col + 1 < N) p[1] = from_accumulator<Out>(v1);
            }
          } else {
            if (col < N) d[col * ldd + row] = from_accumulator<Out>(v0);
            if (col + 1 < N) d[(col + 1) * ldd + row] = from_accumulator<Out>(v1);
          }
        }
  }

  // The staged epilogue: each warp passes its tile through its own shared-memory slab of one mma row
  // (16 rows x WARP_N), written from the fragments and read back as 16-byte chunks, so that 8 (fp32: 16)
  // lanes store one whole 128-byte (256-byte) row segment instead of 4-byte pieces of 8 rows. The slabs
  // reuse the operand ring, free once the main loop is done. Measured on the H100 against the 4-byte
  // stores: +4-7 % at 4096^3, +1-3 % at 8192^3 (docs/sm80.md, "Staged epilogue"). Column-major or unaligned D
  // keeps the direct stores.
  static constexpr int kSlabRowBytes = WARP_N * static_cast<int>(sizeof(Out));
  static constexpr int kSlabBytes = kMmaM * kSlabRowBytes;
  static constexpr int kChunkElems = kChunkBytes / static_cast<int>(sizeof(Out));
  using Slab = EpilogueSlab<kSlabRowBytes>;
  static constexpr bool STAGED_EPILOGUE = D_ROW_MAJOR && WARPS_M * WARPS_N * kSlabBytes <= SMEM_BYTES;

  // Element j (a constant once unrolled) of a 16-byte chunk held as four words.
  __device__ __forceinline__ static Out chunk_element(const uint32_t (&words)[4], int j) {
    if constexpr (sizeof(Out) == 4) {  // fp32, or int32 (int8's sums as bits)
      Out x;
      memcpy(&x, &words[j], sizeof(x));
      return x;
    } else {
      const unsigned short bits = static_cast<unsigned short>(words[j / 2] >> (16 * (j % 2)));
      Out x;
      memcpy(&x, &bits, sizeof(x));
      return x;
    }
  }

  __device__ __forceinline__ static void store_staged(const GemmArgs& args,
                                                      const float (&acc)[MMA_TILES_M][MMA_TILES_N][4], int row_base,
                                                      int col_base, int lane, uint32_t slab) {
    Out* d = static_cast<Out*>(args.d);
    const int M = static_cast<int>(args.m), N = static_cast<int>(args.n);
    const int64_t ldd = args.ldd;
#pragma unroll
    for (int mt = 0; mt < MMA_TILES_M; ++mt) {
#pragma unroll
      for (int nt = 0; nt < MMA_TILES_N; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const AccumPair at = accum_pair(lane, half);
          const int byte = (nt * kMmaN + at.col) * static_cast<int>(sizeof(Out));
          ptx::st_shared_pair<Out>(slab + Slab::offset(at.row, byte / kChunkBytes) + byte % kChunkBytes,
                                   acc[mt][nt][2 * half], acc[mt][nt][2 * half + 1]);
        }
      __syncwarp();
#pragma unroll
      for (int step = 0; step < kMmaM * Slab::kChunks / 32; ++step) {
        const int row = (step * 32 + lane) / Slab::kChunks, chunk = (step * 32 + lane) % Slab::kChunks;
        const uint4 v = ptx::ld_shared_v4_b32(slab + Slab::offset(row, chunk));
        const int grow = row_base + mt * kMmaM + row, gcol = col_base + chunk * kChunkElems;
        if (grow >= M) continue;
        Out* p = d + grow * ldd + gcol;
        if (gcol + kChunkElems <= N) {
          *reinterpret_cast<uint4*>(p) = v;
        } else {  // the chunk crosses N: element by element
          const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int j = 0; j < kChunkElems; ++j)
            if (gcol + j < N) p[j] = chunk_element(words, j);
        }
      }
      __syncwarp();  // the slab is read before the next mma row overwrites it
    }
  }

  // Start the copies of k tile `tile` into one stage: whole tiles take the cheap path.
  template <bool EDGE>
  __device__ __forceinline__ static void load_stage(ALoader& a, BLoader& b, uint32_t stage, int tile, int full_tiles,
                                                    int k_tiles, int K) {
    if (tile < full_tiles) {
      a.template load_full<EDGE>(stage);
      b.template load_full<EDGE>(stage + A_STAGE_BYTES);
    } else if (tile < k_tiles) {
      a.load_partial(stage, K - tile * BK);
      b.load_partial(stage + A_STAGE_BYTES, K - tile * BK);
    }
  }

  // Where the k loop stands: the fragment double buffer, the stage read next, the stage and k tile
  // loaded next.
  struct Pipeline {
    Fragments frag[2];
    int read_stage, write_stage, load_tile;
  };

  // One k tile of the pipelined loop: the fragments of the next k step are loaded while this one's HMMAs
  // run, and the stage that every warp finished reading before the last barrier is refilled. (A variant
  // whose whole-tile refills skipped the branch, v6 in docs/sm80.md, was 8 % slower on the H100.)
  template <bool EDGE>
  __device__ __forceinline__ static void k_tile(Pipeline& p, ALoader& a_loader, BLoader& b_loader, uint32_t smem_base,
                                                int full_tiles, int k_tiles, int K, int warp_m0, int warp_n0,
                                                int lane, Accum (&acc)[MMA_TILES_M][MMA_TILES_N][4]) {
#pragma unroll
    for (int ks = 0; ks < K_STEPS; ++ks) {
      if (ks == K_STEPS - 1) {
        // The next tile must have landed, and every warp must be done with the stage the
        // next load overwrites, before we read on.
        ptx::cp_async_wait<STAGES - 2>();
        __syncthreads();
        p.read_stage = p.read_stage + 1 == STAGES ? 0 : p.read_stage + 1;
      }
      load_fragments(p.frag[(ks + 1) % 2], smem_base + p.read_stage * STAGE_BYTES, (ks + 1) % K_STEPS, warp_m0,
                     warp_n0, lane);
      if (ks == 0) {
        load_stage<EDGE>(a_loader, b_loader, smem_base + p.write_stage * STAGE_BYTES, p.load_tile, full_tiles,
                         k_tiles, K);
        ptx::cp_async_commit();
        ++p.load_tile;
        p.write_stage = p.write_stage + 1 == STAGES ? 0 : p.write_stage + 1;
      }
      mma_all(acc, p.frag[ks % 2]);
    }
  }

  // The pipelined k loop for one block tile. Instantiated twice: interior blocks (EDGE = false) and
  // blocks on the last row or column of tiles, so that the common case carries no edge predicates.
  template <bool EDGE>
  __device__ __forceinline__ static void mainloop(ALoader& a_loader, BLoader& b_loader, uint32_t smem_base, int K,
                                                  int warp_m0, int warp_n0, int lane,
                                                  Accum (&acc)[MMA_TILES_M][MMA_TILES_N][4]) {
    const int k_tiles = (K + BK - 1) / BK;
    // Tiles that need no clipping along K. An edge block takes its last k tile through load_partial even when it
    // is whole: a chunk that crosses M or N there may end at the operand's allocation (copy_part).
    const int full_tiles = EDGE ? (K - 1) / BK : K / BK;
    // Prologue: STAGES-1 tiles in flight, one commit group each (empty groups keep the count right).
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      load_stage<EDGE>(a_loader, b_loader, smem_base + s * STAGE_BYTES, s, full_tiles, k_tiles, K);
      ptx::cp_async_commit();
    }
    ptx::cp_async_wait<STAGES - 2>();
    __syncthreads();

    Pipeline p;
    p.read_stage = 0;
    p.write_stage = STAGES - 1;
    p.load_tile = STAGES - 1;
    load_fragments(p.frag[0], smem_base, 0, warp_m0, warp_n0, lane);

    for (int kt = 0; kt < k_tiles; ++kt)
      k_tile<EDGE>(p, a_loader, b_loader, smem_base, full_tiles, k_tiles, K, warp_m0, warp_n0, lane, acc);
    ptx::cp_async_wait<0>();
  }

  // int8: each int32 sum becomes the bits of its fp32 value (exact up to 2^24), or, for an int32 D, stays as it is
  // (from_accumulator stores it unchanged).
  __device__ __forceinline__ static void int_sums_for_epilogue(int32_t (&sums)[MMA_TILES_M][MMA_TILES_N][4]) {
    if constexpr (!std::is_same_v<Out, int32_t>) {
#pragma unroll
      for (int mt = 0; mt < MMA_TILES_M; ++mt)
#pragma unroll
        for (int nt = 0; nt < MMA_TILES_N; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) sums[mt][nt][i] = __float_as_int(static_cast<float>(sums[mt][nt][i]));
    }
  }

  // Where a thread's work lies: its block's first row and column of D, its warp's offsets in the block.
  struct Coords {
    int block_m0, block_n0, warp_m0, warp_n0, lane;

    __device__ __forceinline__ Coords(int block, int tid, int M, int N) {
      int tile_m, tile_n;
      raster_tile<Cfg::kRasterGroup>(block, (M + BM - 1) / BM, (N + BN - 1) / BN, tile_m, tile_n);
      block_m0 = tile_m * BM;
      block_n0 = tile_n * BN;
      const int warp = tid / 32;
      warp_m0 = (warp / WARPS_N) * WARP_M;
      warp_n0 = (warp % WARPS_N) * WARP_N;
      lane = tid % 32;
    }
  };

  __device__ __forceinline__ static void run(const GemmArgs& args, char* smem) {
    const int M = static_cast<int>(args.m), N = static_cast<int>(args.n), K = static_cast<int>(args.k);
    Accum sums[MMA_TILES_M][MMA_TILES_N][4];
#pragma unroll
    for (int mt = 0; mt < MMA_TILES_M; ++mt)
#pragma unroll
      for (int nt = 0; nt < MMA_TILES_N; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) sums[mt][nt][i] = Accum(0);
    {
      const int tid = threadIdx.x;
      const Coords at(blockIdx.x, tid, M, N);
      ALoader a_loader;
      BLoader b_loader;
      if constexpr (!Cfg::Epilogue::kIdentity) {
        Cfg::Epilogue::prefetch(args, at.block_m0, BM, at.block_n0, BN, tid, Cfg::kThreads);
      }
      a_loader.init(static_cast<const Elem*>(args.a), args.lda, at.block_m0, M, tid);
      b_loader.init(static_cast<const Elem*>(args.b), args.ldb, at.block_n0, N, tid);
      const uint32_t smem_base = ptx::smem_addr(smem);
      if (at.block_m0 + BM <= M && at.block_n0 + BN <= N) {
        mainloop<false>(a_loader, b_loader, smem_base, K, at.warp_m0, at.warp_n0, at.lane, sums);
      } else {
        mainloop<true>(a_loader, b_loader, smem_base, K, at.warp_m0, at.warp_n0, at.lane, sums);
      }
    }
    // The epilogue takes fp32 registers: int8's sums are converted in place (one array, not a second one beside
    // them), after which the same registers are read as floats.
    if constexpr (INT_ACCUM) int_sums_for_epilogue(sums);
    float (&acc)[MMA_TILES_M][MMA_TILES_N][4] = reinterpret_cast<float(&)[MMA_TILES_M][MMA_TILES_N][4]>(sums);
    // The epilogue's coordinates, derived again: every register the main loop can have is one
    // fewer it spills (a few integer operations once per block).
    const Coords at(ptx::ctaid_x_fresh(), ptx::tid_x_fresh(), M, N);
    if constexpr (!Cfg::Epilogue::kIdentity) {
      apply_epilogue(args, acc, at.block_m0 + at.warp_m0, at.block_n0 + at.warp_n0, at.lane);
    }
    if constexpr (STAGED_EPILOGUE) {
      if (fast_aligned(args.d, args.ldd, sizeof(Out))) {
        __syncthreads();  // every warp is done reading the ring the slabs overwrite
        const uint32_t slab = ptx::smem_addr(smem) + (threadIdx.x / 32) * kSlabBytes;
        store_staged(args, acc, at.block_m0 + at.warp_m0, at.block_n0 + at.warp_n0, at.lane, slab);
        return;
      }
    }
    store(args, acc, at.block_m0 + at.warp_m0, at.block_n0 + at.warp_n0, at.lane);
  }
};

}  // namespace sm80
}  // namespace gemmgen
