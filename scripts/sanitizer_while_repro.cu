// A compute-sanitizer limitation, in raw CUDA C (no cudagraphs): a while loop (a
// conditional node) of 1000 iterations, three kernels in its body, on plain cudaMalloc
// memory (argument "p": stream-ordered pool memory instead).
//
// Measured on an H100 (driver 580, compute-sanitizer 2025.3.1), 2026-11-25: run alone under
// `compute-sanitizer --tool memcheck`, 4 of 4 runs report no error; 8 sanitized runs at
// once, 8 of 8 report "Warp illegal address" in the loop's body (5 of 8 with pool memory);
// without the sanitizer every run prints the right count. scripts/gpu-check therefore runs
// again, alone, the test files of a sanitized shard that failed.
//
//   nvcc -arch=sm_90 -o /tmp/while scripts/sanitizer_while_repro.cu
//   for i in 1 2 3 4 5 6 7 8; do compute-sanitizer /tmp/while & done; wait
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#define CK(x) do { cudaError_t err_ = (x); if (err_) { printf("%s: %s\n", #x, cudaGetErrorString(err_)); return 1; } } while (0)
__global__ void add_f(float* o, const float* a) { o[0] = o[0] + a[0]; }
__global__ void add_i(int* o, const int* a) { o[0] = o[0] + a[0]; }
__global__ void setc(cudaGraphConditionalHandle h, const int* r) { cudaGraphSetConditional(h, r[0] != 0); }
static cudaGraphNode_t kernel(cudaGraph_t g, cudaGraphNode_t* dep, int ndep, void* fn, void** args) {
  cudaKernelNodeParams p = {}; p.func = fn; p.gridDim = dim3(1); p.blockDim = dim3(1); p.kernelParams = args;
  cudaGraphNode_t n; if (cudaGraphAddKernelNode(&n, g, dep, ndep, &p)) { printf("add kernel failed\n"); exit(1); } return n;
}
int main(int argc, char** argv) {
  bool pool = argc > 1 && argv[1][0] == 'p';
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int *rem, *minus; float *cnt, *one;
  if (pool) { CK(cudaMallocAsync(&rem, 4, s)); CK(cudaMallocAsync(&minus, 4, s)); CK(cudaMallocAsync(&cnt, 4, s)); CK(cudaMallocAsync(&one, 4, s)); }
  else { CK(cudaMalloc(&rem, 4)); CK(cudaMalloc(&minus, 4)); CK(cudaMalloc(&cnt, 4)); CK(cudaMalloc(&one, 4)); }
  int n = 1000, m = -1; float z = 0, o1 = 1;
  CK(cudaMemcpyAsync(rem, &n, 4, cudaMemcpyHostToDevice, s)); CK(cudaMemcpyAsync(minus, &m, 4, cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(cnt, &z, 4, cudaMemcpyHostToDevice, s)); CK(cudaMemcpyAsync(one, &o1, 4, cudaMemcpyHostToDevice, s));
  CK(cudaStreamSynchronize(s));
  cudaGraph_t g; CK(cudaGraphCreate(&g, 0));
  cudaGraphConditionalHandle h; CK(cudaGraphConditionalHandleCreate(&h, g, 0, 0));
  void* a0[] = {&h, &rem}; cudaGraphNode_t n0 = kernel(g, nullptr, 0, (void*)setc, a0);
  cudaGraphNodeParams cp = {}; cp.type = cudaGraphNodeTypeConditional;
  cp.conditional.handle = h; cp.conditional.type = cudaGraphCondTypeWhile; cp.conditional.size = 1;
  cudaGraphNode_t nc;
#if CUDART_VERSION >= 13000
  CK(cudaGraphAddNode(&nc, g, &n0, nullptr, 1, &cp));
#else
  CK(cudaGraphAddNode(&nc, g, &n0, 1, &cp));
#endif
  cudaGraph_t body = cp.conditional.phGraph_out[0];
  void* a1[] = {&cnt, &one}; cudaGraphNode_t b1 = kernel(body, nullptr, 0, (void*)add_f, a1);
  void* a2[] = {&rem, &minus}; cudaGraphNode_t b2 = kernel(body, &b1, 1, (void*)add_i, a2);
  void* a3[] = {&h, &rem}; kernel(body, &b2, 1, (void*)setc, a3);
  cudaGraphExec_t e; CK(cudaGraphInstantiate(&e, g, 0));
  for (int rep = 1; rep <= 2; ++rep) {
    CK(cudaMemcpyAsync(rem, &n, 4, cudaMemcpyHostToDevice, s));
    CK(cudaGraphLaunch(e, s)); CK(cudaStreamSynchronize(s));
    float c; CK(cudaMemcpy(&c, cnt, 4, cudaMemcpyDeviceToHost));
    if (c != 1000.0f * rep) { printf("wrong count %f\n", c); return 1; }
  }
  printf("ok %s\n", pool ? "pool" : "malloc");
  return 0;
}
