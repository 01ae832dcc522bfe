// Developer probe: which CUDA runtime calls leave an error the caller left pending, and which
// clear it? One call per process (first-use work happens once): make cudaSetDevice fail (error
// 101 pending), make the named call, print cudaPeekAtLastError (101 = kept, 0 = cleared).
// H200, CUDA 13.0 (twenty-eighth session, benchmarks/NOTES.md): of the calls below, only
// cudaFuncSetAttribute clears it, also when it succeeds and also on a repeated call
// ("setattr_warm"; the session ran this in an earlier form with the same calls); the driver
// path the launchers now take (entry point + cudaGetFuncBySymbol + cuFuncSetAttribute, "drv")
// keeps it, and a launch with the raised limit then runs ("drv_launch").
//
// Build and run on the GPU machine:
//   nvcc -cudart shared -gencode=arch=compute_90a,code=sm_90a -o /tmp/rtprobe tests/gpu_dev/runtime_pending_error.cu
//   for c in getdevice devattr driver getattrs launch setattr setattr_warm getfunc entry drv drv_launch; do
//     LD_LIBRARY_PATH=$CUDA_HOME/lib64 /tmp/rtprobe $c; done
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

__global__ void with_smem(float* p) {
  extern __shared__ float s[];
  if (p) p[threadIdx.x] = s[threadIdx.x];
}
__global__ void plain(float* p) {
  if (p) p[threadIdx.x] = 1.f;
}

using SetAttribute = CUresult (*)(CUfunction, CUfunction_attribute, int);

// The launchers' path (compat.h, set_max_dynamic_smem): 1000 * entry point + 100 * handle + driver status.
static int driver_set_smem(int bytes) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  cudaFunction_t handle = nullptr;
  const int e = cudaGetDriverEntryPointByVersion("cuFuncSetAttribute", &fn, 12000, cudaEnableDefault, &found);
  const int h = cudaGetFuncBySymbol(&handle, reinterpret_cast<const void*>(with_smem));
  if (e != 0 || h != 0 || found != cudaDriverEntryPointSuccess) return 1000 * e + 100 * h + 1;
  return reinterpret_cast<SetAttribute>(fn)(reinterpret_cast<CUfunction>(handle),
                                            CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes);
}

int main(int argc, char** argv) {
  const char* c = argc > 1 ? argv[1] : "none";
  const int kBytes = 100000;
  cudaFree(0);
  if (!strcmp(c, "setattr_warm")) cudaFuncSetAttribute(with_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
  const int err = cudaSetDevice(1 << 20);
  int r = -1, v = 0;
  float* p = nullptr;
  void* args[] = {&p};
  if (!strcmp(c, "getdevice")) {
    r = cudaGetDevice(&v);
  } else if (!strcmp(c, "devattr")) {
    r = cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
  } else if (!strcmp(c, "driver")) {
    r = cudaDriverGetVersion(&v);
  } else if (!strcmp(c, "getattrs")) {
    cudaFuncAttributes a;
    r = cudaFuncGetAttributes(&a, plain);
  } else if (!strcmp(c, "launch")) {
    r = cudaLaunchKernel(reinterpret_cast<const void*>(plain), dim3(1), dim3(32), args, 0, 0);
  } else if (!strncmp(c, "setattr", 7)) {
    r = cudaFuncSetAttribute(with_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
  } else if (!strcmp(c, "getfunc")) {
    cudaFunction_t f;
    r = cudaGetFuncBySymbol(&f, reinterpret_cast<const void*>(with_smem));
  } else if (!strcmp(c, "entry")) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    r = cudaGetDriverEntryPointByVersion("cuFuncSetAttribute", &fn, 12000, cudaEnableDefault, &found);
  } else if (!strncmp(c, "drv", 3)) {
    r = driver_set_smem(kBytes);
    if (!strcmp(c, "drv_launch")) {
      const int l = cudaLaunchKernel(reinterpret_cast<const void*>(with_smem), dim3(1), dim3(32), args, kBytes, 0);
      const int still = cudaPeekAtLastError();
      cudaGetLastError();
      const int s = cudaDeviceSynchronize();
      printf("%-14s: set %d, launch with %d B -> %d, sync %d, pending %d -> %d\n", c, r, kBytes, l, s, err, still);
      return 0;
    }
  }
  const int still = cudaPeekAtLastError();
  printf("%-14s: call -> %d, pending %d -> %d (%s)\n", c, r, err, still,
         still == err ? "kept" : still == 0 ? "CLEARED" : "changed");
  return 0;
}
