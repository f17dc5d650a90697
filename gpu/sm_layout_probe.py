"""Where the hardware puts a persistent kernel's blocks, and which SMs share a GPC (docs/corpus.md, "Where the
blocks of a one-wave grid land").

A one-wave grid's tiles all run at once, so the raster only decides which SM takes which tile; the ratio of bytes
the SMs receive to bytes read from L2 moved by up to 10 % with the raster alone. This probe records, for a grid of
one block per SM (shared memory forces it), the SM (%smid) of each block over several launches (is the placement
repeatable?), and for clusters of 8 and 16 blocks (a cluster never spans GPCs) which SMs ran together: the GPCs.

    python3 gpu/sm_layout_probe.py [--json $OUT/sm_layout.json]
"""
from __future__ import annotations

import argparse
import json

import torch
from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void where_am_i(int* out) {
  extern __shared__ char smem[];
  if (threadIdx.x == 0) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    smem[0] = 0;
    out[blockIdx.x] = static_cast<int>(smid);
  }
}

// A launch of `blocks` blocks of 128 threads with `smem_bytes` of dynamic shared memory (one block per SM), in clusters
// of `cluster` blocks (1: no cluster attribute); `attr` holds the attribute the config points to.
cudaLaunchConfig_t launch_config(int64_t blocks, int64_t cluster, int64_t smem_bytes, cudaLaunchAttribute* attr) {
  auto fn = reinterpret_cast<const void*>(where_am_i);
  TORCH_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes) == cudaSuccess);
  if (cluster > 8)
    TORCH_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(128);
  config.dynamicSmemBytes = smem_bytes;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = cluster;
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = cluster > 1 ? 1 : 0;
  return config;
}

torch::Tensor placement(int64_t blocks, int64_t cluster, int64_t smem_bytes) {
  auto out = torch::full({blocks}, -1, torch::dtype(torch::kInt32).device(torch::kCUDA));
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t config = launch_config(blocks, cluster, smem_bytes, &attr);
  cudaError_t err = cudaLaunchKernelEx(&config, where_am_i, out.data_ptr<int>());
  TORCH_CHECK(err == cudaSuccess, cudaGetErrorString(err));
  TORCH_CHECK(cudaDeviceSynchronize() == cudaSuccess);
  return out;
}

int64_t max_clusters(int64_t cluster, int64_t smem_bytes) {
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t config = launch_config(cluster, cluster, smem_bytes, &attr);
  int n = 0;
  TORCH_CHECK(cudaOccupancyMaxActiveClusters(&n, where_am_i, &config) == cudaSuccess);
  return n;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("placement", &placement);
  m.def("max_clusters", &max_clusters);
}
"""

SMEM_BYTES = 200 * 1024   # one block per SM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    args = ap.parse_args()
    probe = load_inline("sm_layout_probe", cpp_sources="", cuda_sources=SOURCE, verbose=False,
                        extra_cuda_cflags=["-gencode=arch=compute_90a,code=sm_90a"])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    result: dict[str, object] = {"device": torch.cuda.get_device_name(0), "sms": sms}
    launches = [probe.placement(sms, 1, SMEM_BYTES).tolist() for _ in range(5)]
    result["block_to_sm"] = launches
    print("block -> SM, first launch:", launches[0])
    print("repeatable over 5 launches:", all(run == launches[0] for run in launches))
    for cluster in (2, 8, 16):
        try:
            n = probe.max_clusters(cluster, SMEM_BYTES)
            groups = [probe.placement(n * cluster, cluster, SMEM_BYTES).view(n, cluster).tolist() for _ in range(3)]
        except RuntimeError as refused:
            print(f"clusters of {cluster}: {refused}")
            continue
        result[f"clusters_of_{cluster}"] = groups
        print(f"clusters of {cluster}: {n} resident; SMs per cluster (first launch):")
        for g in groups[0]:
            print("   ", sorted(g))
        print("    repeatable:", all(run == groups[0] for run in groups))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
