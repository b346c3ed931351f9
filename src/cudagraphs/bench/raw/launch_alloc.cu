// Raw CUDA C baselines for benchmarks/run.py: eager launches of a one-thread
// kernel, cached stream-ordered alloc+free pairs and 1 KiB device-to-device
// copies, timed on the host.
// Prints one JSON object: {"eager_us": ..., "alloc_free_us": ..., "copy_us": ...}.
#include <chrono>
#include <cstdio>
#include <cuda_runtime.h>

__global__ void inc(float* p) { p[0] += 1.0f; }

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
    fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

static double now_us() {
    return std::chrono::duration<double, std::micro>(
        std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
    int n = argc > 1 ? atoi(argv[1]) : 20000;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float* p;
    CHECK(cudaMalloc(&p, 4));
    for (int i = 0; i < 1000; ++i) inc<<<1, 1, 0, s>>>(p);
    CHECK(cudaStreamSynchronize(s));
    double t0 = now_us();
    for (int i = 0; i < n; ++i) inc<<<1, 1, 0, s>>>(p);
    CHECK(cudaStreamSynchronize(s));
    double eager = (now_us() - t0) / n;
    CHECK(cudaGetLastError());

    cudaMemPool_t pool;
    CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    unsigned long long threshold = 512ull << 20;
    CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    void* q;
    for (int i = 0; i < 1000; ++i) { CHECK(cudaMallocAsync(&q, 512, s)); CHECK(cudaFreeAsync(q, s)); }
    CHECK(cudaStreamSynchronize(s));
    t0 = now_us();
    for (int i = 0; i < n; ++i) { cudaMallocAsync(&q, 512, s); cudaFreeAsync(q, s); }
    double alloc = (now_us() - t0) / n;
    CHECK(cudaStreamSynchronize(s));

    void *src, *dst;
    CHECK(cudaMalloc(&src, 1024));
    CHECK(cudaMalloc(&dst, 1024));
    for (int i = 0; i < 1000; ++i) CHECK(cudaMemcpyAsync(dst, src, 1024, cudaMemcpyDeviceToDevice, s));
    CHECK(cudaStreamSynchronize(s));
    t0 = now_us();
    for (int i = 0; i < n; ++i) cudaMemcpyAsync(dst, src, 1024, cudaMemcpyDeviceToDevice, s);
    double copy = (now_us() - t0) / n;
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaGetLastError());
    printf("{\"eager_us\": %.4f, \"alloc_free_us\": %.4f, \"copy_us\": %.4f}\n", eager, alloc, copy);
    return 0;
}
