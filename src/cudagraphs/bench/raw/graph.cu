// Raw CUDA C baseline for benchmarks/graphs.py: a graph of N one-thread
// kernels, captured from a stream. For each N prints one JSON line:
// {"nodes": N, "capture_ms": ..., "per_node_us": ..., "call_us": ...}
// capture_ms: capture + instantiate; per_node_us: GPU time per node over
// back-to-back replays; call_us: median host time of one cudaGraphLaunch.
// For N = 1000 also {"update_nodes": N, "update_ms": ..., "set_params_us": ...}:
// a whole-graph update, and setting one kernel node's parameters (per node).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>

__global__ void inc(float* p) { p[0] += 1.0f; }

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
    fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

static double now_us() {
    return std::chrono::duration<double, std::micro>(
        std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main() {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float* p;
    CHECK(cudaMalloc(&p, 4));
    inc<<<1, 1, 0, s>>>(p);
    CHECK(cudaStreamSynchronize(s));
    for (int n : {10, 100, 1000}) {
        std::vector<double> caps;
        cudaGraphExec_t exec = nullptr;
        for (int rep = 0; rep < 3; ++rep) {
            if (exec) CHECK(cudaGraphExecDestroy(exec));
            double t0 = now_us();
            cudaGraph_t g;
            CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            for (int i = 0; i < n; ++i) inc<<<1, 1, 0, s>>>(p);
            CHECK(cudaStreamEndCapture(s, &g));
            CHECK(cudaGraphInstantiate(&exec, g, 0));
            caps.push_back((now_us() - t0) / 1000.0);
            CHECK(cudaGraphDestroy(g));
        }
        std::sort(caps.begin(), caps.end());
        CHECK(cudaGraphUpload(exec, s));
        for (int i = 0; i < 3; ++i) CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
        int reps = std::max(20, 20000 / n);
        double t0 = now_us();
        for (int i = 0; i < reps; ++i) cudaGraphLaunch(exec, s);
        CHECK(cudaStreamSynchronize(s));
        double per_node = (now_us() - t0) / reps / n;
        std::vector<double> calls;
        for (int round = 0; round < 10; ++round) {
            for (int i = 0; i < 30; ++i) {
                double c0 = now_us();
                cudaGraphLaunch(exec, s);
                calls.push_back(now_us() - c0);
            }
            CHECK(cudaStreamSynchronize(s));
        }
        std::sort(calls.begin(), calls.end());
        printf("{\"nodes\": %d, \"capture_ms\": %.4f, \"per_node_us\": %.4f, \"call_us\": %.4f}\n",
               n, caps[1], per_node, calls[calls.size() / 2]);
        if (n == 1000) {  // whole-graph update from a fresh, topology-identical capture
            std::vector<double> ups;
            for (int rep = 0; rep < 5; ++rep) {
                cudaGraph_t g2;
                CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
                for (int i = 0; i < n; ++i) inc<<<1, 1, 0, s>>>(p);
                CHECK(cudaStreamEndCapture(s, &g2));
                cudaGraphExecUpdateResultInfo info;
                double u0 = now_us();
                CHECK(cudaGraphExecUpdate(exec, g2, &info));
                ups.push_back((now_us() - u0) / 1000.0);
                CHECK(cudaGraphDestroy(g2));
            }
            std::sort(ups.begin(), ups.end());
            // node by node: every kernel node's parameters set again (what a rebind does)
            cudaGraph_t g3;
            cudaGraphExec_t exec3;
            CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            for (int i = 0; i < n; ++i) inc<<<1, 1, 0, s>>>(p);
            CHECK(cudaStreamEndCapture(s, &g3));
            CHECK(cudaGraphInstantiate(&exec3, g3, 0));
            std::vector<cudaGraphNode_t> nodes(n);
            size_t count = n;
            CHECK(cudaGraphGetNodes(g3, nodes.data(), &count));
            cudaKernelNodeParams kp;
            CHECK(cudaGraphKernelNodeGetParams(nodes[0], &kp));
            void* args[1] = {&p};
            kp.kernelParams = args;
            std::vector<double> sets;
            for (int rep = 0; rep < 5; ++rep) {
                double s0 = now_us();
                for (size_t i = 0; i < count; ++i) cudaGraphExecKernelNodeSetParams(exec3, nodes[i], &kp);
                sets.push_back((now_us() - s0) / count);
            }
            CHECK(cudaGetLastError());
            std::sort(sets.begin(), sets.end());
            CHECK(cudaGraphExecDestroy(exec3));
            CHECK(cudaGraphDestroy(g3));
            printf("{\"update_nodes\": %d, \"update_ms\": %.4f, \"set_params_us\": %.4f}\n", n, ups[2],
                   sets[2]);
        }
        CHECK(cudaGraphExecDestroy(exec));
    }
    CHECK(cudaGetLastError());
    return 0;
}
