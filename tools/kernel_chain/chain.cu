// The cost of one dependent small kernel in a CUDA graph, with and without programmatic
// dependent launch (docs/PERF.md, "What a batch-1 step's kernels cost inside the graph").
// Build and run on the GPU machine: nvcc -arch=sm_90a -O3 -std=c++17 tools/kernel_chain/chain.cu -o chain && ./chain
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <algorithm>
#include <cstdio>
#include <vector>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__device__ __forceinline__ void wait_() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void trig_() { asm volatile("griddepcontrol.launch_dependents;"); }

__global__ void k_empty(float* a, float* b) { wait_(); trig_(); }
// one block, 256 threads, 8 floats each: read a, write b
__global__ void k_rw(float* a, float* b) {
  wait_(); trig_();
  float v[8];
  for (int j = 0; j < 8; ++j) v[j] = a[threadIdx.x + 256 * j];
  for (int j = 0; j < 8; ++j) b[threadIdx.x + 256 * j] = v[j] * 1.0001f;
}
// same with two block reductions (a norm's shape)
__global__ void k_norm(float* a, float* b) {
  wait_(); trig_();
  __shared__ float part[8];
  float v[8], s = 0;
  for (int j = 0; j < 8; ++j) v[j] = a[threadIdx.x + 256 * j], s += v[j] * v[j];
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(~0u, s, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = s;
  __syncthreads();
  float t = 0; for (int k = 0; k < 8; ++k) t += part[k];
  const float inv = rsqrtf(t / 2048 + 1e-6f);
  for (int j = 0; j < 8; ++j) b[threadIdx.x + 256 * j] = v[j] * inv;
}
// 512 blocks of 256 threads: each thread reads 16 bytes of a 2 MB weight, a GEMV's shape
__global__ void k_wide(float* a, float* b) {
  wait_(); trig_();
  const int i = blockIdx.x * 256 + threadIdx.x;
  float4 w = reinterpret_cast<const float4*>(a + 4096)[i];
  float x = a[threadIdx.x];
  float r = (w.x + w.y + w.z + w.w) * x;
  for (int o = 16; o; o >>= 1) r += __shfl_xor_sync(~0u, r, o);
  if (threadIdx.x % 32 == 0) b[blockIdx.x * 8 + threadIdx.x / 32] = r;
}

template <class K>
float run(K kernel, int grid, int n, bool pdl, float* a, float* b, cudaStream_t s) {
  cudaGraph_t g; cudaGraphExec_t ge;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  for (int i = 0; i < n; ++i) {
    cudaLaunchAttribute attr{}; attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t c{}; c.gridDim = grid; c.blockDim = 256; c.stream = s;
    c.attrs = pdl ? &attr : nullptr; c.numAttrs = pdl ? 1 : 0;
    float* x = i % 2 ? b : a; float* y = i % 2 ? a : b;
    cudaLaunchKernelEx(&c, kernel, x, y);
  }
  cudaStreamEndCapture(s, &g);
  cudaGraphInstantiate(&ge, g, 0);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  for (int w = 0; w < 3; ++w) cudaGraphLaunch(ge, s);
  std::vector<float> ts;
  for (int r = 0; r < 10; ++r) {
    cudaEventRecord(e0, s); cudaGraphLaunch(ge, s); cudaEventRecord(e1, s); cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1); ts.push_back(ms);
  }
  std::sort(ts.begin(), ts.end());
  cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
  return ts[ts.size() / 2] * 1000.0f / n;
}

int main() {
  float *a, *b; CK(cudaMalloc(&a, 64 << 20)); CK(cudaMalloc(&b, 64 << 20));
  CK(cudaMemset(a, 0, 64 << 20)); CK(cudaMemset(b, 0, 64 << 20));
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int n = 480;
  struct K { const char* name; void (*k)(float*, float*); int grid; } ks[] = {
      {"empty 1 block", k_empty, 1}, {"read+write 8 KB, 1 block", k_rw, 1}, {"norm 2048 f32, 1 block", k_norm, 1},
      {"gemv-like 2 MB over 512 blocks", k_wide, 512}};
  for (auto& k : ks)
    printf("%-34s us per kernel: plain %.2f  PDL %.2f\n", k.name, run(k.k, k.grid, n, false, a, b, s), run(k.k, k.grid, n, true, a, b, s));
  CK(cudaGetLastError());
  return 0;
}
