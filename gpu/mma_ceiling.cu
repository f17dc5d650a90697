// The mma.sync m16n8k16 ceiling of this GPU, per second and per clock, and a ladder of probes between
// it and the sm80 kernel's main loop. Built and driven by gpu/mma_ceiling.py, which times each probe
// over a steady stretch and samples the SM clock and power.
//
// Probes (kProbe*), each adding one ingredient of the sm80 kernel to the one before:
//   ceiling     16 warps per SM, 8 independent accumulators per warp, operands in registers.
//   regs_w8     8 warps per SM (2 per scheduler, as the kernel's 255-register warps allow), the
//               kernel's 64x64 warp tile: 4x8 accumulators, A and B fragments in registers.
//   ldsm_w8     + the fragments loaded from shared memory every k step by ldmatrix(.trans), double
//               buffered as in the kernel (8 ldmatrix.x4 per 32 mma).
//   ldsm_bar_w8 + a block barrier every 2 k steps (the kernel's k tile of BK = 32).
//   copy_w8     + the kernel's copies: each k tile, 24 KB per block (128x32 + 256x32 bf16) by 16-byte
//               cp.async from an L2-resident buffer into a 4-stage ring, waited for (wait_group 2)
//               before the barrier. The ring is not read: ldmatrix keeps reading its own region.
//   regs_w12    12 warps per SM (3 per scheduler; 168 registers each) as 3 blocks of 4 warps, the
//               64x64 warp tile, fragments in registers.
//   ldsm_w12    12 warps, fragments from shared memory, A per k step and B one n-pair at a time just
//               before its mma (no double buffer: that would not fit 168 registers).
//   ldsm_bar_w12 + a barrier of each 4-warp block every 2 k steps.
//   ldsm_bar_w8_t96 ldsm_bar_w8 with a 96x64 warp tile (6x8 mma tiles, 192 accumulators: a 192x256 block
//               tile). The fragments are reloaded in place, as the registers left allow: each A row once
//               its 8 mma are issued, each B pair during the last row.
//   copy_w8_t96 + the copies of a 192x256x32 bf16 k tile (28 KB per block) into a 4-stage ring: 22 % fewer
//               L2 bytes and 17 % fewer ldmatrix bytes per FLOP than the 128x256 tile of copy_w8.
// No global memory in any loop: what the kernel loses beyond ldsm_bar_w8 is its copies and epilogue.
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../templates/ptx/sm80.cuh"

namespace {

enum Probe : int { kCeiling = 0, kRegsW8, kLdsmW8, kLdsmBarW8, kRegsW12, kLdsmW12, kLdsmBarW12, kCopyW8,
             kLdsmBarW8T96, kCopyW8T96, kProbeCount };

constexpr int kCeilingWarps = 8, kCeilingBlocksPerSm = 2, kCeilingChains = 8;
constexpr int kTileM = 4, kTileN = 8;      // m16 x n8 mma tiles of a 64x64 warp tile
constexpr int kTileM96 = 6;                // m16 tiles of a 96x64 warp tile
constexpr int kMatrixBytes = 512;          // one ldmatrix.x4: four 8x8 b16 matrices
constexpr int kKStepBytes = 16 * 1024;     // shared-memory footprint of one k step's fragments
constexpr int kSmemBytes = 2 * kKStepBytes;  // two k steps, alternated, so no load is loop-invariant
constexpr int kSeedWords = kSmemBytes / 4;
// copy_w8: the sm80 kernel's k tile of 128x256x32 bf16, its stage count, and a source that stays in L2.
constexpr int kCopyTileBytes = (128 + 256) * 32 * 2, kCopyStages = 4;
constexpr int kCopyTileBytes96 = (192 + 256) * 32 * 2;  // copy_w8_t96: a 192x256x32 k tile
constexpr int kCopySourceBytes = 16 << 20;

__host__ __device__ constexpr bool twelve_warps(int probe) { return probe >= kRegsW12 && probe <= kLdsmBarW12; }
__host__ __device__ constexpr int warps_of(int probe) {
  return probe == kCeiling ? kCeilingWarps : twelve_warps(probe) ? 4 : 8;
}
__host__ __device__ constexpr int blocks_per_sm(int probe) {
  return probe == kCeiling ? kCeilingBlocksPerSm : twelve_warps(probe) ? 3 : 1;
}
__host__ __device__ constexpr bool warp_tile_96(int probe) { return probe == kLdsmBarW8T96 || probe == kCopyW8T96; }
__host__ __device__ constexpr int tile_m_of(int probe) { return warp_tile_96(probe) ? kTileM96 : kTileM; }
__host__ __device__ constexpr bool copies(int probe) { return probe == kCopyW8 || probe == kCopyW8T96; }
__host__ __device__ constexpr int copy_tile_bytes(int probe) {
  return probe == kCopyW8 ? kCopyTileBytes : kCopyTileBytes96;
}
__host__ __device__ constexpr int mma_per_iter(int probe) {
  return probe == kCeiling ? kCeilingChains : tile_m_of(probe) * kTileN;
}

// Each lane supplies one 16-byte row of a 512-byte run: conflict-free, like the kernel's swizzled reads.
__device__ __forceinline__ uint32_t a_matrix(uint32_t step, int mt, int lane) {
  return step + mt * kMatrixBytes + lane * 16;
}
__device__ __forceinline__ uint32_t b_matrix(uint32_t step, int np, int lane) {
  return step + (kTileM96 + np) * kMatrixBytes + lane * 16;
}

// The k step's shared-memory offset, alternating between two footprints. k_step_bytes is a kernel
// argument (always kKStepBytes) so that ptxas cannot prove two loads equal and fold them: the smem
// is never written in the loop.
__device__ __forceinline__ uint32_t step_offset(int k_step, uint32_t k_step_bytes) {
  return (static_cast<uint32_t>(k_step) * k_step_bytes) & (kSmemBytes - 1);
}

template <int TM = kTileM>
struct Fragments {
  uint32_t a[TM][4];
  uint32_t b[kTileN][2];
};

__device__ __forceinline__ void load_b_pair(uint32_t (&b)[kTileN][2], int np, uint32_t step, int lane) {
  uint32_t r[4];
  gemmgen::ptx::ldmatrix_x4_trans(r, b_matrix(step, np, lane));
  b[2 * np][0] = r[0], b[2 * np][1] = r[1], b[2 * np + 1][0] = r[2], b[2 * np + 1][1] = r[3];
}

template <int TM>
__device__ __forceinline__ void load_fragments(Fragments<TM>& f, uint32_t step, int lane) {
#pragma unroll
  for (int mt = 0; mt < TM; ++mt) gemmgen::ptx::ldmatrix_x4(f.a[mt], a_matrix(step, mt, lane));
#pragma unroll
  for (int np = 0; np < kTileN / 2; ++np) load_b_pair(f.b, np, step, lane);
}

template <class T>
__device__ __forceinline__ void mma_tile(float (&acc)[kTileM][kTileN][4], const Fragments<>& f) {
#pragma unroll
  for (int mt = 0; mt < kTileM; ++mt)
#pragma unroll
    for (int nt = 0; nt < kTileN; ++nt) {
      const int n = (mt % 2) ? kTileN - 1 - nt : nt;  // serpentine, as the kernel
      gemmgen::ptx::MmaM16N8K16<T>::run(acc[mt][n], f.a[mt], f.b[n]);
    }
}

// One k step of the 96x64 warp tile with the next step's fragments loaded into the same registers:
// A row mt right after its 8 mma, B pair np right after its last use in the last row. The rows go
// serpentine except the last, which runs forwards like the first, so that the pair reloaded first is
// the one the next step needs first.
template <class T>
__device__ __forceinline__ void mma_tile_reload(float (&acc)[kTileM96][kTileN][4], Fragments<kTileM96>& f,
                                                uint32_t next_step, int lane) {
#pragma unroll
  for (int mt = 0; mt < kTileM96; ++mt) {
    const bool last = mt == kTileM96 - 1;
#pragma unroll
    for (int nt = 0; nt < kTileN; ++nt) {
      const int n = (mt % 2 && !last) ? kTileN - 1 - nt : nt;
      gemmgen::ptx::MmaM16N8K16<T>::run(acc[mt][n], f.a[mt], f.b[n]);
      if (last && n % 2) load_b_pair(f.b, n / 2, next_step, lane);
    }
    gemmgen::ptx::ldmatrix_x4(f.a[mt], a_matrix(next_step, mt, lane));
  }
}

template <int N>
__device__ __forceinline__ float sum_of(const float (&acc)[N][4]) {
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < N; ++i) s += acc[i][0] + acc[i][1] + acc[i][2] + acc[i][3];
  return s;
}

template <class T, int PROBE>
__global__ void __launch_bounds__(warps_of(PROBE) * 32, blocks_per_sm(PROBE))
    mma_probe_kernel(const uint32_t* seed, const uint4* copy_source, float* out, int iters, uint32_t k_step_bytes) {
  extern __shared__ __align__(128) uint32_t smem[];
  const int lane = threadIdx.x % 32;
  float result = 0.f;
  if constexpr (PROBE == kCeiling) {
    uint32_t a[4], b[kCeilingChains][2];
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = seed[lane * 4 + i];
#pragma unroll
    for (int c = 0; c < kCeilingChains; ++c)
      b[c][0] = seed[128 + (lane + c) % 32], b[c][1] = seed[160 + (lane + 3 * c) % 32];
    float acc[kCeilingChains][4] = {};
    for (int it = 0; it < iters; ++it)
#pragma unroll
      for (int c = 0; c < kCeilingChains; ++c) gemmgen::ptx::MmaM16N8K16<T>::run(acc[c], a, b[c]);
    result = sum_of(acc);
  } else {
    for (int i = threadIdx.x; i < kSeedWords; i += blockDim.x) smem[i] = seed[i];
    __syncthreads();
    const uint32_t base = gemmgen::ptx::smem_addr(smem);
    float acc[tile_m_of(PROBE)][kTileN][4] = {};
    if constexpr (PROBE == kRegsW8 || PROBE == kRegsW12) {
      Fragments<> f;
      load_fragments(f, base, lane);
      for (int it = 0; it < iters; ++it) mma_tile<T>(acc, f);
    } else if constexpr (PROBE == kCopyW8 || PROBE == kLdsmBarW8T96 || PROBE == kCopyW8T96) {
      constexpr bool kCopies = copies(PROBE);
      constexpr int kTileBytes = copy_tile_bytes(PROBE);
      constexpr int kChunks = kTileBytes / 16;  // 16-byte copies per k tile
      constexpr int kThreads = warps_of(PROBE) * 32;
      const uint32_t ring = base + kSmemBytes;
      const char* source = reinterpret_cast<const char*>(copy_source);
      auto copy_tile = [&](int tile) {
        const size_t from =
            (static_cast<size_t>(blockIdx.x) * 977 + tile) * kTileBytes % (kCopySourceBytes - kTileBytes);
        const uint32_t to = ring + (tile % kCopyStages) * kTileBytes;
#pragma unroll
        for (int c = 0; c < (kChunks + kThreads - 1) / kThreads; ++c) {
          const int chunk = c * blockDim.x + threadIdx.x;  // blockDim.x == kThreads; kept as the measured build had it
          if (kChunks % kThreads == 0 || chunk < kChunks)
            gemmgen::ptx::cp_async_16_zfill(to + chunk * 16, source + from + chunk * 16, 16);
        }
        gemmgen::ptx::cp_async_commit();
      };
      if constexpr (kCopies)
        for (int t = 0; t < kCopyStages - 1; ++t) copy_tile(t);
      constexpr int TM = tile_m_of(PROBE);
      if constexpr (TM == kTileM) {
        Fragments<> f[2];
        load_fragments(f[0], base, lane);
        for (int it = 0; it < iters; it += 2) {
#pragma unroll
          for (int ks = 0; ks < 2; ++ks) {
            if (ks == 1) {
              gemmgen::ptx::cp_async_wait<kCopyStages - 2>();
              __syncthreads();
            }
            load_fragments(f[(ks + 1) % 2], base + step_offset(it + ks + 1, k_step_bytes), lane);
            if (ks == 0) copy_tile(it / 2 + kCopyStages - 1);
            mma_tile<T>(acc, f[ks]);
          }
        }
      } else {
        Fragments<TM> f;
        load_fragments(f, base, lane);
        for (int it = 0; it < iters; it += 2) {
#pragma unroll
          for (int ks = 0; ks < 2; ++ks) {
            if (ks == 1) {
              if constexpr (kCopies) gemmgen::ptx::cp_async_wait<kCopyStages - 2>();
              __syncthreads();
            }
            if (kCopies && ks == 0) copy_tile(it / 2 + kCopyStages - 1);
            mma_tile_reload<T>(acc, f, base + step_offset(it + ks + 1, k_step_bytes), lane);
          }
        }
      }
      gemmgen::ptx::cp_async_wait<0>();
    } else if constexpr (PROBE == kLdsmW8 || PROBE == kLdsmBarW8) {
      Fragments<> f[2];
      load_fragments(f[0], base, lane);
      for (int it = 0; it < iters; it += 2) {
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
          if (PROBE == kLdsmBarW8 && ks == 1) __syncthreads();
          load_fragments(f[(ks + 1) % 2], base + step_offset(it + ks + 1, k_step_bytes), lane);
          mma_tile<T>(acc, f[ks]);
        }
      }
    } else {  // kLdsmW12, kLdsmBarW12: A for the k step, then B one n-pair at a time, just before its 8 mma
#pragma unroll 1
      for (int it = 0; it < iters; ++it) {
        if (PROBE == kLdsmBarW12 && it % 2) __syncthreads();
        const uint32_t step = base + step_offset(it, k_step_bytes);
        uint32_t a[kTileM][4];
#pragma unroll
        for (int mt = 0; mt < kTileM; ++mt) gemmgen::ptx::ldmatrix_x4(a[mt], a_matrix(step, mt, lane));
#pragma unroll
        for (int np = 0; np < kTileN / 2; ++np) {
          uint32_t r[4];
          gemmgen::ptx::ldmatrix_x4_trans(r, b_matrix(step, np, lane));
          const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
#pragma unroll
          for (int mt = 0; mt < kTileM; ++mt) {
            gemmgen::ptx::MmaM16N8K16<T>::run(acc[mt][2 * np], a[mt], b0);
            gemmgen::ptx::MmaM16N8K16<T>::run(acc[mt][2 * np + 1], a[mt], b1);
          }
        }
      }
    }
#pragma unroll
    for (int mt = 0; mt < tile_m_of(PROBE); ++mt) result += sum_of(acc[mt]);
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = result;  // keeps every accumulator live
}

template <class T, int PROBE>
cudaError_t launch(int sms, int iters, const uint32_t* seed, const uint4* copy_source, float* out,
                   cudaStream_t stream) {
  auto kernel = mma_probe_kernel<T, PROBE>;
  const int smem = PROBE == kCeiling ? 0 : kSmemBytes + (copies(PROBE) ? kCopyStages * copy_tile_bytes(PROBE) : 0);
  if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem))
    return e;
  const int blocks = sms * blocks_per_sm(PROBE);
  kernel<<<blocks, warps_of(PROBE) * 32, smem, stream>>>(seed, copy_source, out, iters, kKStepBytes);
  return cudaGetLastError();
}

template <class T>
cudaError_t launch_probe(int probe, int sms, int iters, const uint32_t* seed, const uint4* copy_source, float* out,
                         cudaStream_t stream) {
  switch (probe) {
    case kCeiling: return launch<T, kCeiling>(sms, iters, seed, copy_source, out, stream);
    case kRegsW8: return launch<T, kRegsW8>(sms, iters, seed, copy_source, out, stream);
    case kLdsmW8: return launch<T, kLdsmW8>(sms, iters, seed, copy_source, out, stream);
    case kLdsmBarW8: return launch<T, kLdsmBarW8>(sms, iters, seed, copy_source, out, stream);
    case kRegsW12: return launch<T, kRegsW12>(sms, iters, seed, copy_source, out, stream);
    case kLdsmW12: return launch<T, kLdsmW12>(sms, iters, seed, copy_source, out, stream);
    case kLdsmBarW12: return launch<T, kLdsmBarW12>(sms, iters, seed, copy_source, out, stream);
    case kCopyW8: return launch<T, kCopyW8>(sms, iters, seed, copy_source, out, stream);
    case kLdsmBarW8T96: return launch<T, kLdsmBarW8T96>(sms, iters, seed, copy_source, out, stream);
    case kCopyW8T96: return launch<T, kCopyW8T96>(sms, iters, seed, copy_source, out, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

extern "C" int mma_probe_count() { return kProbeCount; }
extern "C" int mma_probe_seed_words() { return kSeedWords; }
extern "C" int mma_probe_copy_source_bytes() { return kCopySourceBytes; }
// Threads of one launch (the length of `out`).
extern "C" int mma_probe_threads(int probe, int sms) { return sms * blocks_per_sm(probe) * warps_of(probe) * 32; }

// seed: mma_probe_seed_words() words of random 16-bit pairs; copy_source: mma_probe_copy_source_bytes()
// bytes, 16-byte aligned; iters must be even. Returns a cudaError_t.
extern "C" int mma_probe_launch(int probe, int bf16, int sms, int iters, const uint32_t* seed,
                                const void* copy_source, float* out, cudaStream_t stream) {
  if (probe < 0 || probe >= kProbeCount || iters % 2) return static_cast<int>(cudaErrorInvalidValue);
  const auto* source = static_cast<const uint4*>(copy_source);
  const cudaError_t e = bf16 ? launch_probe<__nv_bfloat16>(probe, sms, iters, seed, source, out, stream)
                             : launch_probe<__half>(probe, sms, iters, seed, source, out, stream);
  return static_cast<int>(e);
}

// FLOP of one launch: 2 * 16 * 8 * 16 per mma.
extern "C" double mma_probe_flop(int probe, int sms, int iters) {
  return 2.0 * 16 * 8 * 16 * mma_per_iter(probe) * warps_of(probe) * blocks_per_sm(probe) * static_cast<double>(sms) *
         iters;
}
