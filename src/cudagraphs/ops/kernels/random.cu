// cudagraphs random numbers: Philox4x32-10, counter-based, with its state on the device.
//
// The generator's state is two words in device memory, state[0] = seed (the
// 64-bit Philox key) and state[1] = offset (the first unused counter). A draw
// reads both when it runs, so a graph that replays it draws from wherever the
// generator is then; cg_philox_advance, queued right after, moves the offset
// past the counters the draw used.
//
// Element i of a draw (C order of the output's shape, whatever its strides)
// takes the Philox block of counter offset + i / K, where K elements share one
// counter (four 32-bit words): nothing depends on the grid, so the numpy
// reference of cudagraphs/_random.py and any launch agree element for element.
//
// Compiled once per output type, given as macros:
//   CG_T      the C type of an element as stored (unsigned short for float16
//             and bfloat16, whose bits are produced here: NVRTC has no
//             cuda_fp16.h without the toolkit's headers);
//   CG_ACC    float or double: the arithmetic of the affine step;
//   CG_STORE  0: CG_T is CG_ACC (or an integer); 1: float16; 2: bfloat16;
//   CG_RANDINT  defined for integer outputs (int or long long).
//
// Bit-exactness with the reference: Philox is integer arithmetic; uniform
// values are exact fractions of 2^24 or 2^53; the affine steps use
// __fmul_rn/__fadd_rn (never contracted into an FMA, which numpy would not
// do); conversions round to nearest even, as numpy's astype. Normal values go
// through log and sincospi in double, where the GPU's functions may differ from
// the host's in the last bits of a double: after rounding to float32 they
// nearly always agree, and float64 results agree to ~1e-15.

#ifndef CG_T
#define CG_T float
#endif
#ifndef CG_ACC
#define CG_ACC float
#endif
#ifndef CG_STORE
#define CG_STORE 0
#endif
typedef CG_T T;
typedef CG_ACC A;
typedef unsigned int u32;
typedef unsigned long long u64;

#define CG_MAX_NDIM 8

struct Layout {  // as in elementwise.cu: the shape and byte strides, by value
    long long ndim;
    long long shape[CG_MAX_NDIM];
    long long strides[3][CG_MAX_NDIM];
};

__device__ __forceinline__ long long cg_offset(const Layout& L, long long i) {
    long long off = 0;
    for (int d = (int)L.ndim - 1; d >= 0; --d) {
        long long n = L.shape[d];
        long long q = i / n;
        off += (i - q * n) * L.strides[0][d];
        i = q;
    }
    return off;
}

// Philox4x32-10 (Salmon et al., SC'11; Random123's philox4x32_R with R = 10)
struct cg_block {
    u32 v[4];
};

__device__ __forceinline__ cg_block cg_philox(u32 c0, u32 c1, u32 c2, u32 c3, u32 k0, u32 k1) {
    const u32 M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r) {
            k0 += W0;
            k1 += W1;
        }
        u32 hi0 = __umulhi(M0, c0), lo0 = M0 * c0;
        u32 hi1 = __umulhi(M1, c2), lo1 = M1 * c2;
        u32 n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
    }
    cg_block b = {{c0, c1, c2, c3}};
    return b;
}

// the four words of counter number c (64 bits; the counter's upper words are 0)
__device__ __forceinline__ cg_block cg_words(u64 seed, u64 c) {
    return cg_philox((u32)c, (u32)(c >> 32), 0u, 0u, (u32)seed, (u32)(seed >> 32));
}

__device__ __forceinline__ u64 cg_u64(u32 lo, u32 hi) { return ((u64)hi << 32) | lo; }

#define CG_FOR_EACH_COUNTER(j, nc)                                          \
    for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; \
         j < (nc); j += (long long)blockDim.x * gridDim.x)

#ifndef CG_RANDINT  // floating-point outputs ------------------------------------------

__device__ __forceinline__ float cg_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float cg_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double cg_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ double cg_add(double a, double b) { return __dadd_rn(a, b); }

// float -> float16 bits, round to nearest even (subnormals, overflow to inf)
__device__ __forceinline__ unsigned short cg_f16_bits(float f) {
    u32 x = __float_as_uint(f);
    u32 sign = (x >> 16) & 0x8000u;
    u32 ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) return (unsigned short)(sign | 0x7E00u);  // NaN
    if (ax >= 0x477FF000u) return (unsigned short)(sign | 0x7C00u);  // rounds to 65536 or more: inf
    if (ax >= 0x38800000u) {  // a normal float16
        u32 m = ax - 0x38000000u;  // rebias the exponent (127 -> 15)
        u32 q = m >> 13, rest = m & 0x1FFFu;
        q += (rest > 0x1000u || (rest == 0x1000u && (q & 1u))) ? 1u : 0u;
        return (unsigned short)(sign | q);
    }
    if (ax < 0x33000000u) return (unsigned short)sign;  // below 2^-25: rounds to 0
    u32 e = ax >> 23, m = (ax & 0x7FFFFFu) | 0x800000u;  // a float16 subnormal: units of 2^-24
    u32 shift = 126u - e;  // 14..24
    u32 q = m >> shift, rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    q += (rest > half || (rest == half && (q & 1u))) ? 1u : 0u;
    return (unsigned short)(sign | q);
}

__device__ __forceinline__ float cg_f16_value(unsigned short h) {
    u32 sign = (u32)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0) {
        float v = (float)m * 0x1p-24f;
        return sign ? -v : v;
    }
    if (e == 31) return __uint_as_float(sign | 0x7F800000u | (m << 13));
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

// float -> bfloat16 bits, round to nearest even
__device__ __forceinline__ unsigned short cg_bf16_bits(float f) {
    u32 x = __float_as_uint(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (unsigned short)((x >> 16) | 0x40u);  // NaN
    return (unsigned short)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ T cg_store(A v) {
#if CG_STORE == 1
    return cg_f16_bits(v);
#elif CG_STORE == 2
    return cg_bf16_bits(v);
#else
    return v;
#endif
}

__device__ __forceinline__ A cg_value(T t) {
#if CG_STORE == 1
    return cg_f16_value(t);
#elif CG_STORE == 2
    return __uint_as_float((u32)t << 16);
#else
    return t;
#endif
}

// K values of type A per counter: 24-bit fractions for float, 53-bit for double
#define CG_K (sizeof(A) == 8 ? 2 : 4)

// Uniform on [low, high): u in [0, 1) exact, then low + u * (high - low)
// rounded to the output type; a value that rounds up to high becomes top, the
// largest value of the output type below high (so high is never drawn, and
// the mass moved is the half-ulp next to top). low, top: exact values of the
// output type; scale = high - low in A (computed by the host).
template <class Put>
__device__ __forceinline__ void cg_uniform(const u64* state, long long n, A low, A scale, A top,
                                           Put put) {
    const u64 seed = state[0], offset = state[1];
    const long long nc = (n + CG_K - 1) / CG_K;
    CG_FOR_EACH_COUNTER(j, nc) {
        cg_block w = cg_words(seed, offset + (u64)j);
#pragma unroll
        for (int k = 0; k < CG_K; ++k) {
            long long i = j * CG_K + k;
            if (i >= n) break;
            A u;
            if constexpr (sizeof(A) == 8) {
                u = (double)(cg_u64(w.v[2 * k], w.v[2 * k + 1]) >> 11) * 0x1p-53;
            } else {
                u = (float)(w.v[k] >> 8) * 0x1p-24f;
            }
            T t = cg_store(cg_add(cg_mul(u, scale), low));
            if (cg_value(t) > top) t = cg_store(top);
            put(i, t);
        }
    }
}

// Normal by Box-Muller, in double: u1 in (0, 1], u2 in [0, 1) give
// sqrt(-2 log u1) * (cos, sin)(2 pi u2). float outputs take each from one
// 32-bit word (two pairs, four values per counter), double outputs from 53
// bits (one pair per counter). Then mean + std * z, rounded to the output.
template <class Put>
__device__ __forceinline__ void cg_normal(const u64* state, long long n, A mean, A std, Put put) {
    const u64 seed = state[0], offset = state[1];
    const long long nc = (n + CG_K - 1) / CG_K;
    CG_FOR_EACH_COUNTER(j, nc) {
        cg_block w = cg_words(seed, offset + (u64)j);
        double z[4];
#pragma unroll
        for (int p = 0; p < CG_K / 2; ++p) {
            double u1, u2;
            if constexpr (sizeof(A) == 8) {
                u1 = (double)((cg_u64(w.v[0], w.v[1]) >> 11) + 1ull) * 0x1p-53;
                u2 = (double)(cg_u64(w.v[2], w.v[3]) >> 11) * 0x1p-53;
            } else {
                u1 = ((double)w.v[2 * p] + 1.0) * 0x1p-32;
                u2 = (double)w.v[2 * p + 1] * 0x1p-32;
            }
            double r = sqrt(-2.0 * log(u1)), s, c;
            sincospi(2.0 * u2, &s, &c);  // no argument reduction: 2 u2 is exact
            z[2 * p] = r * c;
            z[2 * p + 1] = r * s;
        }
#pragma unroll
        for (int k = 0; k < CG_K; ++k) {
            long long i = j * CG_K + k;
            if (i >= n) break;
            put(i, cg_store(cg_add(cg_mul((A)z[k], std), mean)));
        }
    }
}

extern "C" __global__ void cg_rand_uniform(T* out, const u64* state, long long n, A low, A scale,
                                           A top) {
    cg_uniform(state, n, low, scale, top, [&](long long i, T v) { out[i] = v; });
}

extern "C" __global__ void cg_rand_uniform_strided(char* out, const u64* state, long long n, A low,
                                                   A scale, A top, Layout L) {
    cg_uniform(state, n, low, scale, top, [&](long long i, T v) { *(T*)(out + cg_offset(L, i)) = v; });
}

extern "C" __global__ void cg_rand_normal(T* out, const u64* state, long long n, A mean, A std) {
    cg_normal(state, n, mean, std, [&](long long i, T v) { out[i] = v; });
}

extern "C" __global__ void cg_rand_normal_strided(char* out, const u64* state, long long n, A mean,
                                                  A std, Layout L) {
    cg_normal(state, n, mean, std, [&](long long i, T v) { *(T*)(out + cg_offset(L, i)) = v; });
}

// The generator's state. A draw is two kernels, this one second: every block
// of the draw reads the offset, and no block can tell that all the others
// have read it without a grid-wide barrier (a last-block-done counter would
// need another word, reset on every launch, and a fence per block), so a
// write in the draw kernel itself would race with the reads. Stream order
// runs this one-thread kernel after every read, for about 1 us per draw.
extern "C" __global__ void cg_philox_advance(u64* state, u64 counters) {
    if (blockIdx.x == 0 && threadIdx.x == 0) state[1] += counters;
}

extern "C" __global__ void cg_philox_set(u64* state, u64 seed, u64 offset) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        state[0] = seed;
        state[1] = offset;
    }
}

#else  // integer outputs -----------------------------------------------------------------

// Integers in [low, low + range): a 64-bit random r (two words, the first the
// low half) maps to low + floor(r * range / 2^64), the multiply-shift of
// Lemire without its rejection step (range 0 stands for 2^64: r itself). Each
// value is hit floor(2^64 / range) or one more times out of 2^64, a relative
// bias below range / 2^64 (< 2.4e-10 for any range of int32), spread evenly
// over the range, where r % range would favour its lowest values.
template <class Put>
__device__ __forceinline__ void cg_randint(const u64* state, long long n, long long low, u64 range,
                                           Put put) {
    const u64 seed = state[0], offset = state[1];
    const long long nc = (n + 1) / 2;
    CG_FOR_EACH_COUNTER(j, nc) {
        cg_block w = cg_words(seed, offset + (u64)j);
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            long long i = j * 2 + k;
            if (i >= n) break;
            u64 r = cg_u64(w.v[2 * k], w.v[2 * k + 1]);
            u64 v = (u64)low + (range ? __umul64hi(r, range) : r);
            put(i, (T)(long long)v);
        }
    }
}

extern "C" __global__ void cg_rand_randint(T* out, const u64* state, long long n, long long low,
                                           u64 range) {
    cg_randint(state, n, low, range, [&](long long i, T v) { out[i] = v; });
}

extern "C" __global__ void cg_rand_randint_strided(char* out, const u64* state, long long n,
                                                   long long low, u64 range, Layout L) {
    cg_randint(state, n, low, range, [&](long long i, T v) { *(T*)(out + cg_offset(L, i)) = v; });
}

#endif  // CG_RANDINT
