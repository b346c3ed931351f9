// cudagraphs built-in kernels that set a graph condition from device data.
//
// Compiled once per element type T (-DCG_T=<C type>) of the flag array.
// cudaGraphSetConditional is a device-runtime builtin: declaring it is all
// NVRTC needs (no device-runtime library to link).

typedef __device_builtin__ unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(
    cudaGraphConditionalHandle handle, unsigned int value);

#ifndef CG_T
#define CG_T int
#endif
typedef CG_T T;

// float and bool flags: the condition is whether the flag is non-zero
extern "C" __global__ void cg_set_condition(cudaGraphConditionalHandle handle, const T* flag) {
    cudaGraphSetConditional(handle, flag[0] != (T)0 ? 1u : 0u);
}

// integer flags: the value itself, so one flag drives if/while (non-zero is
// true) and switch (the branch index); negative or above 32 bits: all ones,
// which is true for if/while and selects no branch of a switch
extern "C" __global__ void cg_set_condition_index(cudaGraphConditionalHandle handle, const T* flag) {
    T v = flag[0];
    bool wide = v < (T)0 || (unsigned long long)v > 0xFFFFFFFFull;
    cudaGraphSetConditional(handle, wide ? 0xFFFFFFFFu : (unsigned int)v);
}

// the iteration cap of a while loop: runs last in the body, counts the body's
// runs in count[0] (zeroed before the loop at every launch) and ends the loop
// once the count reaches cap
extern "C" __global__ void cg_loop_guard(cudaGraphConditionalHandle handle, long long* count,
                                         long long cap) {
    long long c = count[0] + 1;
    count[0] = c;
    if (c >= cap) cudaGraphSetConditional(handle, 0u);
}
