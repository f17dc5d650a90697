// Host side of an sm90 kernel library: encode the TMA tensor maps, size the grid (persistent
// schedules: as many clusters as fit on the GPU at once), launch with the cluster shape.
//
// The tensor-map encoder is a driver function. It is looked up at run time through the runtime's
// cudaGetDriverEntryPointByVersion, so the library never links libcuda and loads (and its Python
// side imports) on a machine without a GPU driver.
#pragma once

#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <utility>
#include <vector>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "../common/gemm_args.h"
#include "../common/launch.cuh"
#include "block_order.cuh"
#include "gemm_kernel.cuh"
#include "k_groups.cuh"
#include "list_table.cuh"

namespace gemmgen {
namespace sm90 {

// A driver function by name and the CUDA version of its signature, or nullptr when the driver lacks it.
template <class Fn>
inline Fn driver_entry_point(const char* name, unsigned version) {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err = cudaGetDriverEntryPointByVersion(name, &ptr, version, cudaEnableDefault, &status);
  return err == cudaSuccess && status == cudaDriverEntryPointSuccess ? reinterpret_cast<Fn>(ptr) : nullptr;
}

// cuTensorMapEncodeTiled, or nullptr when the driver does not have it (looked up once per process).
using EncodeTiledFn = PFN_cuTensorMapEncodeTiled_v12000;
inline EncodeTiledFn encode_tiled() {
  static const EncodeTiledFn fn = driver_entry_point<EncodeTiledFn>("cuTensorMapEncodeTiled", 12000);
  return fn;
}

// Launch codes from kTensorMapEncodeError on are a failed cuTensorMapEncodeTiled: the code minus this
// base is its CUresult, which error_string() names. Below it they are cudaError_t values.
constexpr int kTensorMapEncodeError = 1 << 16;

// The driver's name of a CUresult ("CUDA_ERROR_INVALID_VALUE"), looked up like the encoder; "?" without
// a driver.
inline const char* cu_result_name(int res) {
  using GetErrorNameFn = PFN_cuGetErrorName_v6000;
  static const GetErrorNameFn fn = driver_entry_point<GetErrorNameFn>("cuGetErrorName", 6000);
  const char* name = nullptr;
  if (fn == nullptr || fn(static_cast<CUresult>(res), &name) != CUDA_SUCCESS || name == nullptr) return "?";
  return name;
}

// What a launch code means, for the op's error message.
inline const char* error_string(int code) {
  if (code < kTensorMapEncodeError) return cuda_error_text(code);
  thread_local char text[192];
  const int res = code - kTensorMapEncodeError;
  std::snprintf(text, sizeof text, "cuTensorMapEncodeTiled refused an operand's tensor map: CUresult %d (%s)", res,
                cu_result_name(res));
  return text;
}

template <typename T>
struct TensorMapType;
template <>
struct TensorMapType<__half> {
  static constexpr CUtensorMapDataType kValue = CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
};
template <>
struct TensorMapType<__nv_bfloat16> {
  static constexpr CUtensorMapDataType kValue = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
};
template <>
struct TensorMapType<float> {
  static constexpr CUtensorMapDataType kValue = CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
};
// TMA copies bytes: 8-bit types travel as UINT8 (the tensor map has no fp8 type, and needs none).
template <>
struct TensorMapType<__nv_fp8_e4m3> {
  static constexpr CUtensorMapDataType kValue = CU_TENSOR_MAP_DATA_TYPE_UINT8;
};
template <>
struct TensorMapType<__nv_fp8_e5m2> {
  static constexpr CUtensorMapDataType kValue = CU_TENSOR_MAP_DATA_TYPE_UINT8;
};
template <>
struct TensorMapType<int8_t> {
  static constexpr CUtensorMapDataType kValue = CU_TENSOR_MAP_DATA_TYPE_UINT8;
};
template <>
struct TensorMapType<int32_t> {
  static constexpr CUtensorMapDataType kValue = CU_TENSOR_MAP_DATA_TYPE_INT32;
};

using KernelFn = void (*)(CUtensorMap, CUtensorMap, CUtensorMap, CUtensorMap, CUtensorMap, GemmArgs,
                          LaunchWorkspace);

// What a tensor map encodes; equal keys give equal maps, so a launch with the same operand as the
// last one (the common case: a layer's weight) skips the encoding.
struct OperandKey {
  const void* base = nullptr;
  uint64_t inner = 0, outer = 0, ld = 0, matrices = 0, matrix_stride = 0;
  bool operator==(const OperandKey& o) const {
    return base == o.base && inner == o.inner && outer == o.outer && ld == o.ld && matrices == o.matrices &&
           matrix_stride == o.matrix_stride;
  }
};

struct CachedMap {
  OperandKey key;
  CUtensorMap map;
  bool valid = false;
};

// A 3-D map over `matrices` matrices `matrix_stride` elements apart, each with a contiguous `inner` dimension and
// rows (the `outer` dimension) `ld` elements apart; boxes of box_inner x box_outer x 1, 128-byte swizzle, zeros
// outside the matrix. A stride of 0 (an operand every problem of a batch shares, or grouped rows' one A and D) is
// one matrix, which the kernel reads at matrix 0. Sizes of 0 (K = 0) are encoded as 1: no box is ever loaded then.
// Returns 0, cudaErrorInsufficientDriver, or kTensorMapEncodeError + the encoder's CUresult.
template <typename Elem, int BOX_INNER, int BOX_OUTER>
inline int tensor_map(CachedMap& cache, const void* base, int64_t inner, int64_t outer, int64_t ld,
                      int64_t matrices = 1, int64_t matrix_stride = 0) {
  const auto at_least_1 = [](int64_t v) { return static_cast<uint64_t>(v > 0 ? v : 1); };
  if (matrix_stride == 0) matrices = 1;
  // One matrix: the stride of a matrix past its end, which the encoder takes (it is never stepped over).
  const int64_t stride = matrices > 1 ? matrix_stride : static_cast<int64_t>(at_least_1(outer) * at_least_1(ld));
  const OperandKey key{base, at_least_1(inner), at_least_1(outer), at_least_1(ld), at_least_1(matrices),
                       static_cast<uint64_t>(stride)};
  if (cache.valid && cache.key == key) return 0;
  const EncodeTiledFn encode = encode_tiled();
  if (encode == nullptr) return static_cast<int>(cudaErrorInsufficientDriver);
  const cuuint64_t dims[3] = {key.inner, key.outer, key.matrices};
  // Bytes between rows and between matrices; dimension 0 is contiguous.
  const cuuint64_t strides[2] = {key.ld * sizeof(Elem), key.matrix_stride * sizeof(Elem)};
  const cuuint32_t box[3] = {BOX_INNER, BOX_OUTER, 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const auto encode_map = [&] {
    return encode(&cache.map, TensorMapType<Elem>::kValue, 3, const_cast<void*>(base), dims, strides, box,
                  element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  };
  CUresult res = encode_map();
  if (res == CUDA_ERROR_INVALID_CONTEXT) {
    // The encoder is a driver call and wants a current context, which a thread that has made only runtime
    // calls may lack: torch's autograd worker threads, or any new thread, set the device without binding
    // its context (c10 skips cudaSetDevice when the device is already the current one). cudaSetDevice
    // binds the device's primary context to this thread; the retry happens once per such thread.
    int device = 0;
    if (cudaGetDevice(&device) == cudaSuccess && cudaSetDevice(device) == cudaSuccess) res = encode_map();
  }
  cache.valid = res == CUDA_SUCCESS;
  if (cache.valid) cache.key = key;
  return cache.valid ? 0 : kTensorMapEncodeError + static_cast<int>(res);
}

// The map of operand tile TILE's matrices, `rows` (M or N) x `k` elements: K-major keeps k innermost. A batch's
// operand with a batch stride of 0 is one matrix, which every problem reads (the kernel's Problem::a_batched).
template <typename Elem, class TILE, bool K_MAJOR>
inline int operand_map(CachedMap& cache, const void* base, int64_t rows, int64_t k, int64_t ld, int64_t batch,
                       int64_t batch_stride) {
  return K_MAJOR ? tensor_map<Elem, TILE::kBoxInner, TILE::kBoxOuter>(cache, base, k, rows, ld, batch, batch_stride)
                 : tensor_map<Elem, TILE::kBoxInner, TILE::kBoxOuter>(cache, base, rows, k, ld, batch, batch_stride);
}

// Whether GEMM launches let the stream's previous kernel still run while their blocks start (programmatic dependent
// launch): a block sets up its barriers, then waits for that kernel (ptx::grid_dependency_wait) before it touches
// memory, so that the launch and the set-up overlap the previous kernel's last blocks; and each block, once its
// loads are issued, lets the next kernel start so (ptx::launch_dependents). Measured: 0.7-1.1 us less per call in a
// chain of GEMMs (docs/sm90.md, "Launched while the previous kernel runs"). 0 launches in stream order (for A/B
// runs: -DGEMMGEN_SM90_PDL=0).
#ifndef GEMMGEN_SM90_PDL
#define GEMMGEN_SM90_PDL 1
#endif

// The launch configuration of `blocks` blocks of kernel K, in clusters of K::CLUSTER blocks along x, launched early
// (GEMMGEN_SM90_PDL) where `early`. Not copyable: config.attrs points at attrs, beside it.
template <class K>
struct ClusterLaunchConfig {
  cudaLaunchAttribute attrs[2] = {};
  cudaLaunchConfig_t config = {};

  ClusterLaunchConfig(unsigned blocks, cudaStream_t stream, bool early) {
    config.gridDim = dim3(blocks, 1, 1);
    config.blockDim = dim3(kThreads, 1, 1);
    config.dynamicSmemBytes = K::SMEM_BYTES;
    config.stream = stream;
    attrs[0].id = cudaLaunchAttributeClusterDimension;
    attrs[0].val.clusterDim.x = K::CLUSTER;
    attrs[0].val.clusterDim.y = 1;
    attrs[0].val.clusterDim.z = 1;
    attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[1].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attrs;
    config.numAttrs = GEMMGEN_SM90_PDL && early ? 2 : 1;
  }
  ClusterLaunchConfig(const ClusterLaunchConfig&) = delete;
  ClusterLaunchConfig& operator=(const ClusterLaunchConfig&) = delete;
};

// How many clusters of this kernel can be resident at once (the persistent grid), per device: GPUs of one machine
// may differ in SMs. Atomic, as raise_smem_limit's flags: threads on several GPUs launch at once.
template <class K>
inline cudaError_t resident_clusters(KernelFn kernel, int device, int* clusters) {
  static std::atomic<int> known[kMaxDevices] = {};
  const int cached = device < kMaxDevices ? known[device].load(std::memory_order_relaxed) : 0;
  if (cached > 0) {
    *clusters = cached;
    return cudaSuccess;
  }
  const ClusterLaunchConfig<K> cluster_launch(K::CLUSTER, nullptr, false);
  int n = 0;
  const cudaError_t err =
      cudaOccupancyMaxActiveClusters(&n, reinterpret_cast<const void*>(kernel), &cluster_launch.config);
  if (err != cudaSuccess) return err;
  if (n < 1) n = 1;
  if (device < kMaxDevices) known[device].store(n, std::memory_order_relaxed);
  *clusters = n;
  return cudaSuccess;
}

// The k parts of each of a split launch's tiles, where `fit` parts of each tile fit the resident clusters: parts of
// kSplitPartKTiles k tiles, but at least kSplitMinParts of them, and never more than fit or than the k tiles (none
// empty). Each part past the first adds its partial tile to the exchange (2.4 us after the last part at 4 parts,
// 3.6 us at 8); four parts already take three quarters of a whole tile's k walk off the critical path. Measured
// (H200, bf16, 64x64 pingpong): 4 parts of 8 k tiles ran 1.13-1.14x as fast as 8-16 parts of 2-4 at K = 2048, 3-4
// parts of 16 1.11x as fast as 8 of 6-8 at K = 3072-4096 (docs/sm90.md, "How many parts"). The planner's split_parts
// is the same rule.
constexpr int64_t kSplitPartKTiles = 16;
constexpr int64_t kSplitMinParts = 4;
inline int64_t split_k_parts(int64_t fit, int64_t k_tiles) {
  const int64_t by_length = k_tiles / kSplitPartKTiles;
  int64_t parts = by_length > kSplitMinParts ? by_length : kSplitMinParts;
  if (parts > fit) parts = fit;
  if (parts > k_tiles) parts = k_tiles;
  return parts;
}

// The work units of all problems (tiles x batch) are indexed by int: more is refused rather than wrapped.
constexpr int64_t kMaxWorkUnits = 2147483647;

// The list kernel over `count` problems of `units` work units in all, whose table `fill(table)` writes into
// stream-ordered device memory (freed after the launch) before the kernel runs; `extra_bytes` more follow the table
// there, for what fill builds it from.
template <class Cfg, class Fill>
inline int launch_listed(KernelFn fast, size_t count, int64_t units, cudaStream_t stream, Fill&& fill,
                         size_t extra_bytes = 0) {
  using K = Kernel<Cfg>;
  static DeviceFlags smem_raised = {};
  int device = 0;
  cudaError_t err = raise_smem_limit(reinterpret_cast<const void*>(fast), K::SMEM_BYTES, smem_raised, &device);
  if (err != cudaSuccess) return static_cast<int>(err);
  int resident = 0;
  err = resident_clusters<K>(fast, device, &resident);
  if (err != cudaSuccess) return static_cast<int>(err);
  const int64_t clusters = units < resident ? units : resident;

  void* on_device = nullptr;
  err = workspace_alloc(device, count * sizeof(ListProblem) + extra_bytes, stream, &on_device);
  if (err != cudaSuccess) return static_cast<int>(err);
  err = fill(on_device);
  if (err == cudaSuccess) {
    GemmArgs args{};
    args.batch = static_cast<int64_t>(count);
    args.list_device = on_device;
    const CUtensorMap unused{};  // every map is the listed problems' own
    const ClusterLaunchConfig<K> cluster_launch(static_cast<unsigned>(clusters * K::CLUSTER), stream, true);
    err = cudaLaunchKernelEx(&cluster_launch.config, fast, unused, unused, unused, unused, unused, args,
                             LaunchWorkspace{});
  }
  const cudaError_t freed = cudaFreeAsync(on_device, stream);
  if (err == cudaSuccess) err = freed;
  if (err != cudaSuccess) return static_cast<int>(err);
  return static_cast<int>(cudaGetLastError());
}

// A list of problems (GemmArgs::list) in one persistent launch, its table built on the device (build_list,
// list_table.cuh): the host counts each problem's work units, encodes a template map per operand (from the first
// problem that uses it) and copies the problems' seeds after the table (from pageable memory: the copy has taken them
// when it returns, so the caller's list may go at once; a CUDA graph cannot capture it); build_list writes the table,
// and the kernel walks all problems' units in order (ProblemList).
template <class Cfg>
inline int launch_list(KernelFn fast, const GemmArgs* call, cudaStream_t stream) {
  using K = Kernel<Cfg>;
  using Out = typename Cfg::Out;
  if (choose_list_path<Cfg>(*call) == GEMM_PATH_NONE) return static_cast<int>(cudaErrorNotSupported);
  const size_t count = static_cast<size_t>(call->batch);
  std::vector<ListSeed> seeds(count);
  int64_t units = 0;
  const GemmListProblem* loads = nullptr;  // the first problem with loads, and with D stored by TMA
  const GemmListProblem* d_tma = nullptr;
  for (size_t i = 0; i < count; ++i) {
    const GemmListProblem& q = call->list[i];
    seeds[i] = ListSeed{q, units};
    if (q.m <= 0 || q.n <= 0) continue;
    GemmArgs one{};
    one.m = q.m;
    one.n = q.n;
    one.k = q.k;
    const auto sizes = K::problem(one);
    units += static_cast<int64_t>(sizes.units_m) * sizes.units_n;
    if (units > kMaxWorkUnits) return static_cast<int>(cudaErrorInvalidValue);
    if (loads == nullptr && q.k > 0) loads = &q;
    if (d_tma == nullptr && Cfg::kDRowMajor && fast_aligned(q.d, q.ldd, sizeof(Out))) d_tma = &q;
  }
  if (units == 0) return 0;
  CachedMap a{}, b{}, d{};  // (zeros where no problem uses them)
  int code = 0;
  if (loads != nullptr) {
    code = operand_map<typename Cfg::Elem, typename K::TileA, Cfg::kAKMajor>(a, loads->a, loads->m, loads->k,
                                                                            loads->lda, 1, 0);
    if (code == 0) {
      code = operand_map<typename Cfg::ElemB, typename K::TileB, Cfg::kBKMajor>(b, loads->b, loads->n, loads->k,
                                                                               loads->ldb, 1, 0);
    }
  }
  if (code == 0 && d_tma != nullptr) {
    code = tensor_map<Out, K::kEpiCols, K::kEpiRows>(d, d_tma->d, d_tma->n, d_tma->m, d_tma->ldd);
  }
  if (code != 0) return code;
  const size_t seed_bytes = count * sizeof(ListSeed);
  return launch_listed<Cfg>(fast, count, units, stream, [&](void* on_device) {
    ListBuild build{};
    build.table = static_cast<ListProblem*>(on_device);
    build.seeds = reinterpret_cast<const ListSeed*>(static_cast<char*>(on_device) + count * sizeof(ListProblem));
    build.count = static_cast<int>(count);
    cudaError_t err = cudaMemcpyAsync(const_cast<ListSeed*>(build.seeds), seeds.data(), seed_bytes,
                                      cudaMemcpyHostToDevice, stream);
    if (err != cudaSuccess) return err;
    const unsigned blocks = static_cast<unsigned>((count + kListBuildWarps - 1) / kListBuildWarps);
    build_list<Cfg><<<blocks, kListBuildWarps * 32, 0, stream>>>(a.map, b.map, d.map, build);
    return cudaGetLastError();
  }, seed_bytes);
}

// Groups along K (GemmArgs::groups_along_k) in two launches and no read on the host: build_k_groups makes the table
// of a list of problems, one per group, from three maps over the whole A, B and D[0]; the list kernel walks it.
// Every group has the units of one m x n problem (an empty group's store zeros).
template <class Cfg>
inline int launch_k_groups(KernelFn fast, const GemmArgs* call, cudaStream_t stream) {
  using K = Kernel<Cfg>;
  using Out = typename Cfg::Out;
  if (choose_k_grouped_path<Cfg>(*call) == GEMM_PATH_NONE) return static_cast<int>(cudaErrorNotSupported);
  if (call->m <= 0 || call->n <= 0) return 0;
  const auto sizes = K::problem(*call);
  const int64_t units = static_cast<int64_t>(sizes.units_m) * sizes.units_n * call->batch;
  if (units > kMaxWorkUnits || call->k > INT32_MAX) return static_cast<int>(cudaErrorInvalidValue);
  KGroups groups{};
  groups.ends = call->group_ends;
  groups.groups = static_cast<int>(call->batch);
  groups.k = static_cast<int>(call->k);
  groups.m = sizes.m;
  groups.n = sizes.n;
  groups.units_m = sizes.units_m;
  groups.units_n = sizes.units_n;
  groups.d = static_cast<char*>(call->d);
  groups.d_stride_bytes = call->batch_stride_d * static_cast<int64_t>(sizeof(Out));
  groups.ldd = call->ldd;
  CachedMap a, b, d{};  // (d zeros where D goes out by direct stores)
  int code = operand_map<typename Cfg::Elem, typename K::TileA, Cfg::kAKMajor>(a, call->a, call->m, call->k,
                                                                              call->lda, 1, 0);
  if (code == 0) {
    code = operand_map<typename Cfg::ElemB, typename K::TileB, Cfg::kBKMajor>(b, call->b, call->n, call->k,
                                                                             call->ldb, 1, 0);
  }
  if (code != 0) return code;
  const bool d_aligned = fast_aligned(call->d, call->ldd, sizeof(Out)) && groups.d_stride_bytes % kFastAlignBytes == 0;
  if (Cfg::kDRowMajor && d_aligned) {
    code = tensor_map<Out, K::kEpiCols, K::kEpiRows>(d, call->d, call->n, call->m, call->ldd);
    if (code != 0) return code;
    groups.d_tma = 1;
  }
  return launch_listed<Cfg>(fast, static_cast<size_t>(call->batch), units, stream, [&](void* on_device) {
    groups.table = static_cast<ListProblem*>(on_device);
    const unsigned blocks = static_cast<unsigned>((call->batch + kKGroupWarps - 1) / kKGroupWarps);
    build_k_groups<Cfg><<<blocks, kKGroupWarps * 32, 0, stream>>>(a.map, b.map, d.map, groups);
    return cudaGetLastError();
  });
}

// `slots` flags of `stream` on `device` and the epoch the launch raises them to. `hold` keeps the registry locked
// until the caller has queued that launch: another thread that replaced the flags in between would free them
// (stream-ordered) before the launch that reads them.
inline cudaError_t stream_k_flags(int device, cudaStream_t stream, size_t slots, int** flags, int* epoch,
                                  std::unique_lock<std::mutex>* hold) {
  static std::mutex mutex;
  static std::map<std::pair<int, unsigned long long>, StreamKFlags> kept;
  unsigned long long id = 0;
  cudaError_t err = cudaStreamGetId(stream, &id);
  if (err != cudaSuccess) return err;
  std::unique_lock<std::mutex> lock(mutex);
  StreamKFlags& entry = kept[{device, id}];
  if (entry.needs_zeroing(slots)) {
    if (const size_t grown = entry.replacement(slots); grown > 0) {
      if (entry.flags != nullptr) {
        err = cudaFreeAsync(entry.flags, stream);  // after every launch queued on the stream that reads them
        entry.flags = nullptr;
        entry.slots = 0;
        if (err != cudaSuccess) return err;
      }
      err = workspace_alloc(device, grown * sizeof(int), stream, reinterpret_cast<void**>(&entry.flags));
      if (err != cudaSuccess) {
        entry.flags = nullptr;
        return err;
      }
      entry.slots = grown;
    }
    err = cudaMemsetAsync(entry.flags, 0, entry.slots * sizeof(int), stream);
    entry.epoch = err == cudaSuccess ? 0 : INT_MAX;  // (not zeroed: zero them at the next launch)
    if (err != cudaSuccess) return err;
  }
  *flags = entry.flags;
  *epoch = ++entry.epoch;
  *hold = std::move(lock);
  return cudaSuccess;
}

// Experiment switch for A/B runs (gpu/ab_variants.py), off by default: 1 zeroes fresh stream-K flags before every
// launch (a memset queued ahead of the kernel), as a graph's capture does, instead of using the stream's kept flags.
#ifndef GEMMGEN_SM90_EXPERIMENT_SK_ZEROED_FLAGS
#define GEMMGEN_SM90_EXPERIMENT_SK_ZEROED_FLAGS 0
#endif

// Stream-K's workspace for a grid of `ctas` (LaunchWorkspace): the partial sums stream-ordered, allocated in the
// launch's stream (*allocated, for the caller to free there once the launch is queued), so that launches on other
// streams never share them; the flags its stream keeps (stream_k_flags, locked in *flags_held until the launch is
// queued), or, under a graph's capture, flags of its own, zeroed in the graph before the kernel.
template <class K>
inline cudaError_t stream_k_workspace(int device, int ctas, cudaStream_t stream, LaunchWorkspace* workspace,
                                      void** allocated, std::unique_lock<std::mutex>* flags_held) {
  const size_t partials = K::workspace_partials_bytes(ctas), slots = K::workspace_slots(ctas);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaError_t err = cudaStreamIsCapturing(stream, &capture);
  if (err != cudaSuccess) return err;
  const bool zeroed_flags = capture != cudaStreamCaptureStatusNone || GEMMGEN_SM90_EXPERIMENT_SK_ZEROED_FLAGS;
  err = workspace_alloc(device, partials + (zeroed_flags ? slots * sizeof(int) : 0), stream, allocated);
  if (err != cudaSuccess) return err;
  workspace->partials = static_cast<float*>(*allocated);
  if (!zeroed_flags) return stream_k_flags(device, stream, slots, &workspace->flags, &workspace->epoch, flags_held);
  workspace->flags = reinterpret_cast<int*>(static_cast<char*>(*allocated) + partials);
  workspace->epoch = 1;
  return cudaMemsetAsync(workspace->flags, 0, slots * sizeof(int), stream);
}

template <class Cfg>
inline int launch(KernelFn fast, void (*slow)(GemmArgs), void (*small)(GemmArgs), void (*repack)(RepackArgs),
                  const GemmArgs* call, cudaStream_t stream) {
  using K = Kernel<Cfg>;
  using Elem = typename Cfg::Elem;
  if (batch_invalid(*call)) return static_cast<int>(cudaErrorInvalidValue);
  if (is_list(*call)) return launch_list<Cfg>(fast, call, stream);
  if (is_k_grouped(*call)) return launch_k_groups<Cfg>(fast, call, stream);
  if (call->m <= 0 || call->n <= 0) return 0;
  const bool grouped = is_grouped(*call);
  if (grouped && choose_grouped_path<Cfg>(*call) == GEMM_PATH_NONE) return static_cast<int>(cudaErrorNotSupported);
  const GemmArgs folded = fold_batch<Cfg>(*call);
  const GemmArgs* args = &folded;
  const GemmPath path = grouped ? GEMM_PATH_FAST : choose_folded_path<Cfg>(*args);
  if (path == GEMM_PATH_REPACKED) {
    return launch_repacked<Cfg>(repack, args, stream, [&](const GemmArgs* packed) -> int {
      return launch<Cfg>(fast, slow, small, repack, packed, stream);
    });
  }
  if (path != GEMM_PATH_FAST) return launch_other_path<Cfg>(path, slow, small, args, stream);
  const int64_t batch = batch_count(*args);
  const auto problem = K::problem(*args);
  // All problems' work units, in 64 bits (Problem::units is an int, which this bound keeps from wrapping). Grouped
  // rows: each group's last block of rows may be partial, so at most one block more per group.
  const int64_t units_n = problem.units_n;
  const int64_t units = grouped ? (problem.units_m + batch) * units_n : problem.units_m * units_n * batch;
  if (units > kMaxWorkUnits) return static_cast<int>(cudaErrorInvalidValue);

  static DeviceFlags smem_raised = {};
  int device = 0;
  cudaError_t err = raise_smem_limit(reinterpret_cast<const void*>(fast), K::SMEM_BYTES, smem_raised, &device);
  if (err != cudaSuccess) return static_cast<int>(err);

  // A (M x K): K-major = row-major (inner K); M-major = column-major (inner M). B (K x N) likewise. K = 0 loads
  // nothing (the kernel stores the epilogue of zero), so A's and B's maps are left as they were: an empty operand
  // may have no address to encode (a quantized D takes this kernel then: choose_folded_path).
  thread_local CachedMap map_a, map_b;
  const bool loads = args->k > 0;
  int code = loads ? operand_map<Elem, typename K::TileA, Cfg::kAKMajor>(map_a, args->a, args->m, args->k, args->lda,
                                                                         batch, args->batch_stride_a)
                   : 0;
  if (code != 0) return code;
  // A again in the edge tiles' smaller boxes, where some tile crosses A's last row (a ragged M, or any group's end):
  // the kernel takes it for exactly those tiles (Kernel::load_k_tiles) and never reads it otherwise.
  thread_local CachedMap map_a_edge;
  if (loads && K::uses_a_edge_map(problem)) {
    code = operand_map<Elem, typename K::TileAEdge, Cfg::kAKMajor>(map_a_edge, args->a, args->m, args->k, args->lda,
                                                                   batch, args->batch_stride_a);
    if (code != 0) return code;
  }
  if (loads) {
    code = operand_map<typename Cfg::ElemB, typename K::TileB, Cfg::kBKMajor>(map_b, args->b, args->n, args->k,
                                                                            args->ldb, batch, args->batch_stride_b);
    if (code != 0) return code;
  }
  // D through TMA stores when its base and row pitch allow (the kernel makes the same test); an
  // unused map stays zero.
  thread_local CachedMap map_d;
  if (K::tma_store_possible(*args)) {
    // A column-major D: the map of its transpose (M innermost), which the kernel stages (Kernel::stage_subtile)
    code = Cfg::kDRowMajor
               ? tensor_map<typename Cfg::Out, K::kEpiCols, K::kEpiRows>(map_d, args->d, args->n, args->m, args->ldd,
                                                                         batch, args->batch_stride_d)
               : tensor_map<typename Cfg::Out, K::kEpiRows, K::kEpiCols>(map_d, args->d, args->m, args->n, args->ldd,
                                                                         batch, args->batch_stride_d);
    if (code != 0) return code;
  } else {
    map_d = CachedMap{};
  }
  // The epilogue's source (C of alpha * acc + beta * C) through TMA loads on the kernel's own test.
  thread_local CachedMap map_source;
  if constexpr (K::kSourced) {
    constexpr int slot = Cfg::Epilogue::kSourceSlot;
    if (K::source_tma_possible(*args)) {
      code = tensor_map<typename Cfg::Epilogue::Source, K::kEpiCols, K::kEpiRows>(
          map_source, args->ep_ptr[slot], args->n, args->m, args->ep_ld[slot]);
      if (code != 0) return code;
    }
  }

  const bool stream_k = K::STREAM_K && problem.k_tiles > 0;
  // Stream-K cuts the last, partial wave of units; with fewer units than resident clusters, all of their k tiles
  // (StreamK: no share may be empty, hence at most units x k_tiles clusters).
  // (grouped: the groups' units are counted on the device; the bound sizes the grid, which is persistent)
  const int64_t work = stream_k ? units * problem.k_tiles : units;
  int64_t clusters = work;
  LaunchWorkspace workspace{};
  if (K::PERSISTENT) {
    int resident = 0;
    err = resident_clusters<K>(fast, device, &resident);
    if (err != cudaSuccess) return static_cast<int>(err);
    // One cluster per unit up to what fits: also for pingpong, whose two consumers of a block take
    // alternate tiles. Halving its grid to give both consumers a tile leaves SMs idle whenever there
    // are fewer units than twice the SMs (512x4096 with 128x128 tiles ran on 64 of 132 SMs), and the
    // consumers of one SM share its tensor cores anyway.
    clusters = work < resident ? work : resident;
    // Fewer units than resident clusters (a small M): every unit in the same number of equal parts (split-K),
    // one cluster each, so that the clusters sharing an operand tile (the M tiles of one N column share B's)
    // read the same k range at the same time and L2 serves the second read. A split by the iteration count
    // alone (units x k tiles over all resident clusters) starts each cluster at its own k: measured 0.49-0.62x
    // cuBLAS at 512x4096x14336 against 0.77x data-parallel (gpu/midm_tiles.py, docs/sm90.md).
    if (stream_k && units < resident) {
      const int64_t parts = split_k_parts(resident / units, problem.k_tiles);
      clusters = units * parts;
    }
    // A 1x1 grid of more units than half the SMs (measured there; smaller ones keep the launch order) takes its units
    // in the order of the SMs its blocks land on: then every SM holds a block (the ranks cover the units), those past
    // the units idle.
    const BlockOrder* order = K::CLUSTER == 1 && !stream_k && 2 * work > resident ? block_order(device, stream)
                                                                                   : nullptr;
    if (order != nullptr && resident == order->blocks) {
      clusters = resident;
      workspace.ordered = order->blocks;
      std::copy(order->order, order->order + order->blocks, workspace.order);
    }
  }
  const unsigned ctas = static_cast<unsigned>(clusters * K::CLUSTER);

  void* allocated = nullptr;                  // (the partial sums, freed once the launch is queued)
  std::unique_lock<std::mutex> flags_held;    // (the stream's flags, until the launch is queued)
  if (stream_k) {
    err = stream_k_workspace<K>(device, static_cast<int>(ctas), stream, &workspace, &allocated, &flags_held);
  }
  if (err == cudaSuccess) {
    // (An ordered grid is launched in stream order: blocks that start while the previous kernel holds SMs land
    // elsewhere than the recorded order says.)
    const ClusterLaunchConfig<K> cluster_launch(ctas, stream, workspace.ordered == 0);
    err = cudaLaunchKernelEx(&cluster_launch.config, fast, map_a.map, map_a_edge.map, map_b.map, map_d.map,
                             map_source.map, *args, workspace);
  }
  if (flags_held.owns_lock()) flags_held.unlock();
  if (allocated != nullptr) {
    const cudaError_t freed = cudaFreeAsync(allocated, stream);
    if (err == cudaSuccess) err = freed;
  }
  if (err != cudaSuccess) return static_cast<int>(err);
  return static_cast<int>(cudaGetLastError());
}

// tf32 with a K-major A and an N-major B (layout tt): wgmma reads tf32 from shared memory K-major only, so the plain
// kernel would transpose B's tiles there (0.76-0.94x cuBLAS at 4096³-8192³ on the H200, docs/dtypes.md), while the
// kernel whose M-major A it reads into registers runs at the tn kernel's speed. A library of such a plan (an identity
// epilogue: spec/config.py transposed_product) also builds that kernel for the transposed product, D^T = B^T A^T, and
// launches it instead (0.95-1.14x): B^T (N x K) is M-major with B's leading dimension, A^T (K x M) K-major with A's,
// D^T (N x M) column-major with D's, the same bytes as D row-major. GEMMGEN_SM90_TF32_TT_SWAPPED=0 keeps the plain
// kernel (an A/B switch).
#ifndef GEMMGEN_SM90_TF32_TT_SWAPPED
#define GEMMGEN_SM90_TF32_TT_SWAPPED 1
#endif

// ``args`` as the transposed product's: A and B exchanged with their leading dimensions and batch strides, M and N
// exchanged; D, its leading dimension and everything else as they are.
inline GemmArgs swapped_operands(const GemmArgs& args) {
  GemmArgs swapped = args;
  swapped.a = args.b;
  swapped.b = args.a;
  swapped.m = args.n;
  swapped.n = args.m;
  swapped.lda = args.ldb;
  swapped.ldb = args.lda;
  swapped.batch_stride_a = args.batch_stride_b;
  swapped.batch_stride_b = args.batch_stride_a;
  return swapped;
}

// Whether a call takes the transposed product's kernel (Swapped: Cfg with M and N, A's and B's orders and D's order
// exchanged): a problem or a batch, not grouped, listed or grouped along K, that both configs take on their fast
// paths; the unaligned, small-M and repacked paths stay Cfg's.
template <class Cfg, class Swapped>
inline bool takes_swapped(const GemmArgs& args) {
  static_assert(Cfg::Epilogue::kIdentity && !Cfg::kAmax, "the swapped product has no epilogue operands to swap");
  static_assert(Swapped::kBlockM == Cfg::kBlockN && Swapped::kBlockN == Cfg::kBlockM &&
                    Swapped::kAKMajor == Cfg::kBKMajor && Swapped::kBKMajor == Cfg::kAKMajor &&
                    Swapped::kDRowMajor == !Cfg::kDRowMajor,
                "Swapped is Cfg's transpose");
  if (is_grouped(args) || is_list(args) || is_k_grouped(args) || args.m <= 0 || args.n <= 0) return false;
  return choose_path<Cfg>(args) == GEMM_PATH_FAST && choose_path<Swapped>(swapped_operands(args)) == GEMM_PATH_FAST;
}

}  // namespace sm90
}  // namespace gemmgen
