// Elementwise kernels of cubridge, compiled at run time by NVRTC. One template per operation,
// instantiated per dtype triple by the host (see src/cuda/kernels.rs), which appends
// `extern "C"` wrappers named after the dtypes.
//
// Indexing: a contiguous variant (all operands unit-stride over n elements) and a strided
// variant over up to CB_MAX_DIMS coalesced dimensions; both are grid-stride loops.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define CB_MAX_DIMS 8

struct c64 { float re, im; };
struct c128 { double re, im; };

// Exact widening conversions that promotion asks for (inputs into the result type).
template <typename R, typename T> struct Cvt {
    __device__ static R run(T x) { return static_cast<R>(x); }
};
template <> struct Cvt<float, __half> {
    __device__ static float run(__half x) { return __half2float(x); }
};
template <> struct Cvt<double, __half> {
    __device__ static double run(__half x) { return (double)__half2float(x); }
};
template <> struct Cvt<float, __nv_bfloat16> {
    __device__ static float run(__nv_bfloat16 x) { return __bfloat162float(x); }
};
template <> struct Cvt<double, __nv_bfloat16> {
    __device__ static double run(__nv_bfloat16 x) { return (double)__bfloat162float(x); }
};
template <> struct Cvt<__half, __half> {
    __device__ static __half run(__half x) { return x; }
};
template <> struct Cvt<__nv_bfloat16, __nv_bfloat16> {
    __device__ static __nv_bfloat16 run(__nv_bfloat16 x) { return x; }
};
template <typename T> struct Cvt<c64, T> {
    __device__ static c64 run(T x) { return c64{Cvt<float, T>::run(x), 0.0f}; }
};
template <> struct Cvt<c64, c64> {
    __device__ static c64 run(c64 x) { return x; }
};
template <typename T> struct Cvt<c128, T> {
    __device__ static c128 run(T x) { return c128{Cvt<double, T>::run(x), 0.0}; }
};
template <> struct Cvt<c128, c64> {
    __device__ static c128 run(c64 x) { return c128{(double)x.re, (double)x.im}; }
};
template <> struct Cvt<c128, c128> {
    __device__ static c128 run(c128 x) { return x; }
};

// Addition in the result type: logical or for bool, wrapping for integers (through the unsigned
// type, which C++ defines), IEEE for floats; float16 and bfloat16 add in float32 and round once.
template <typename R> struct Add {
    __device__ static R run(R a, R b) { return a + b; }
};
template <> struct Add<bool> {
    __device__ static bool run(bool a, bool b) { return a || b; }
};
#define CB_WRAPPING_ADD(T, U) \
    template <> struct Add<T> { \
        __device__ static T run(T a, T b) { return (T)((U)a + (U)b); } \
    };
CB_WRAPPING_ADD(signed char, unsigned char)
CB_WRAPPING_ADD(short, unsigned short)
CB_WRAPPING_ADD(int, unsigned int)
CB_WRAPPING_ADD(long long, unsigned long long)
template <> struct Add<__half> {
    __device__ static __half run(__half a, __half b) {
        return __float2half_rn(__half2float(a) + __half2float(b));
    }
};
template <> struct Add<__nv_bfloat16> {
    __device__ static __nv_bfloat16 run(__nv_bfloat16 a, __nv_bfloat16 b) {
        return __float2bfloat16_rn(__bfloat162float(a) + __bfloat162float(b));
    }
};
template <> struct Add<c64> {
    __device__ static c64 run(c64 a, c64 b) { return c64{a.re + b.re, a.im + b.im}; }
};
template <> struct Add<c128> {
    __device__ static c128 run(c128 a, c128 b) { return c128{a.re + b.re, a.im + b.im}; }
};

// Shape and element strides of the coalesced loop nest, innermost last; stride[k] is operand k's.
struct Geometry {
    long long shape[CB_MAX_DIMS];
    long long stride[3][CB_MAX_DIMS];
    int ndim;
};

template <typename A, typename B, typename R>
__device__ void add_contiguous(R* out, const A* a, const B* b, long long n) {
    long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        out[i] = Add<R>::run(Cvt<R, A>::run(a[i]), Cvt<R, B>::run(b[i]));
    }
}

template <typename A, typename B, typename R>
__device__ void add_strided(R* out, const A* a, const B* b, long long n, const Geometry& g) {
    long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        long long rem = i, oo = 0, oa = 0, ob = 0;
        for (int d = g.ndim - 1; d >= 0; --d) {
            long long idx = rem % g.shape[d];
            rem /= g.shape[d];
            oo += idx * g.stride[0][d];
            oa += idx * g.stride[1][d];
            ob += idx * g.stride[2][d];
        }
        out[oo] = Add<R>::run(Cvt<R, A>::run(a[oa]), Cvt<R, B>::run(b[ob]));
    }
}

// A strided gather into a contiguous array of the same type (device-side copies).
template <typename T>
__device__ void gather(T* out, const T* src, long long n, const Geometry& g) {
    long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        long long rem = i, os = 0;
        for (int d = g.ndim - 1; d >= 0; --d) {
            long long idx = rem % g.shape[d];
            rem /= g.shape[d];
            os += idx * g.stride[1][d];
        }
        out[i] = src[os];
    }
}
