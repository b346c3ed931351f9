// cudagraphs built-in element-wise kernels.
//
// Compiled once per element type T, given as -DCG_T=<C type>: an arithmetic
// type for add/axpy/scale, or, with -DCG_BITS_ONLY, an unsigned type of the
// element's size for fill/copy (they move bits). Every kernel is a grid-stride loop, so any
// grid size covers any n. The *_strided variants take the shape and byte
// strides by value in a Layout, which keeps them graph-safe: nothing they
// read lives in host memory or in a buffer that could be freed.

#ifndef CG_T
#define CG_T float
#endif
typedef CG_T T;

#define CG_MAX_NDIM 8

struct Layout {
    long long ndim;
    long long shape[CG_MAX_NDIM];
    long long strides[3][CG_MAX_NDIM];  // byte strides of up to three operands
};

#define CG_FOR_EACH(i, n)                                              \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; \
         i < (n); i += (long long)blockDim.x * gridDim.x)

// Byte offsets of element i (C order) in each of the three operands.
__device__ __forceinline__ void cg_offsets(const Layout& L, long long i, long long* off) {
    off[0] = off[1] = off[2] = 0;
    for (int d = (int)L.ndim - 1; d >= 0; --d) {
        long long n = L.shape[d];
        long long q = i / n;
        long long r = i - q * n;
        off[0] += r * L.strides[0][d];
        off[1] += r * L.strides[1][d];
        off[2] += r * L.strides[2][d];
        i = q;
    }
}

#define CG_AT(base, k) (*(T*)((base) + off[k]))

#ifdef CG_BITS_ONLY  // fill and copy move raw bits of the element's size

extern "C" __global__ void cg_fill(T* out, T value, long long n) {
    CG_FOR_EACH(i, n) out[i] = value;
}

extern "C" __global__ void cg_fill_strided(char* out, T value, long long n, Layout L) {
    long long off[3];
    CG_FOR_EACH(i, n) { cg_offsets(L, i, off); CG_AT(out, 0) = value; }
}

extern "C" __global__ void cg_copy_strided(char* dst, const char* src, long long n, Layout L) {
    long long off[3];
    CG_FOR_EACH(i, n) { cg_offsets(L, i, off); CG_AT(dst, 0) = CG_AT(src, 1); }
}

#else  // arithmetic kernels

extern "C" __global__ void cg_add(T* out, const T* a, const T* b, long long n) {
    CG_FOR_EACH(i, n) out[i] = a[i] + b[i];
}

extern "C" __global__ void cg_add_strided(char* out, const char* a, const char* b,
                                          long long n, Layout L) {
    long long off[3];
    CG_FOR_EACH(i, n) { cg_offsets(L, i, off); CG_AT(out, 0) = CG_AT(a, 1) + CG_AT(b, 2); }
}

extern "C" __global__ void cg_axpy(T* y, const T* x, T alpha, long long n) {
    CG_FOR_EACH(i, n) y[i] = alpha * x[i] + y[i];
}

extern "C" __global__ void cg_axpy_ptr(T* y, const T* x, const T* alpha, long long n) {
    T a = *alpha;
    CG_FOR_EACH(i, n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void cg_axpy_strided(char* y, const char* x, T alpha, long long n, Layout L) {
    long long off[3];
    CG_FOR_EACH(i, n) { cg_offsets(L, i, off); CG_AT(y, 0) = alpha * CG_AT(x, 1) + CG_AT(y, 0); }
}

extern "C" __global__ void cg_axpy_ptr_strided(char* y, const char* x, const T* alpha,
                                               long long n, Layout L) {
    T a = *alpha;
    long long off[3];
    CG_FOR_EACH(i, n) { cg_offsets(L, i, off); CG_AT(y, 0) = a * CG_AT(x, 1) + CG_AT(y, 0); }
}

extern "C" __global__ void cg_scale(T* out, const T* x, T alpha, long long n) {
    CG_FOR_EACH(i, n) out[i] = alpha * x[i];
}

extern "C" __global__ void cg_scale_ptr(T* out, const T* x, const T* alpha, long long n) {
    T a = *alpha;
    CG_FOR_EACH(i, n) out[i] = a * x[i];
}

extern "C" __global__ void cg_scale_strided(char* out, const char* x, T alpha, long long n, Layout L) {
    long long off[3];
    CG_FOR_EACH(i, n) { cg_offsets(L, i, off); CG_AT(out, 0) = alpha * CG_AT(x, 1); }
}

extern "C" __global__ void cg_scale_ptr_strided(char* out, const char* x, const T* alpha,
                                                long long n, Layout L) {
    T a = *alpha;
    long long off[3];
    CG_FOR_EACH(i, n) { cg_offsets(L, i, off); CG_AT(out, 0) = a * CG_AT(x, 1); }
}

#endif  // CG_BITS_ONLY
