// How many thread-block clusters of 1, 2, 4 and 8 blocks can be resident at once when each block takes
// a whole SM's shared memory (as the sm90 GEMM's blocks do): cudaOccupancyMaxActiveClusters. A cluster
// must sit inside one GPC, so on a 132-SM H100 clusters of 4 may fill fewer than 132 SMs; the persistent
// grid and the planner's wave count follow this number.
//   nvcc -arch=sm_90a -o /tmp/cluster_occupancy gpu/debug/cluster_occupancy.cu && /tmp/cluster_occupancy
#include <cstdio>
#include <cuda_runtime.h>

__global__ void one_block_per_sm() {
  extern __shared__ char smem[];
  smem[threadIdx.x] = 0;
}

int main() {
  int device = 0, sms = 0, smem_optin = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  const int smem = smem_optin - 1024;  // more than half: one block per SM
  cudaFuncSetAttribute(one_block_per_sm, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(one_block_per_sm, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  std::printf("SMs %d, dynamic shared memory per block %d bytes\n", sms, smem);
  for (int size : {1, 2, 4, 8}) {
    cudaLaunchConfig_t config = {};
    cudaLaunchAttribute attr = {};
    config.gridDim = dim3(size * 64);
    config.blockDim = dim3(384);
    config.dynamicSmemBytes = smem;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = size;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    config.attrs = &attr;
    config.numAttrs = 1;
    int clusters = 0;
    const cudaError_t err = cudaOccupancyMaxActiveClusters(&clusters, one_block_per_sm, &config);
    std::printf("cluster size %d: %d resident clusters = %d SMs busy (%s)\n", size, clusters, clusters * size,
                cudaGetErrorString(err));
  }
  return 0;
}
