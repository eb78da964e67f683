// What every kernel of cubridge's own shares, compiled at run time by NVRTC: the element types,
// the exact widening conversions and the addition of each dtype, and add's operation as a
// functor. Each module is abi.cuh (the parameter structs), access.cuh (packs, and the two ways
// a kernel takes its second input), this header, one kernel source (elementwise.cu, tiled.cu,
// gather.cu) and the `extern "C"` wrappers the host appends per dtype (src/cuda/kernels.rs).
// The host defines CB_HALF where a float16 or bfloat16 operand needs their headers, which take
// a fifth of a small module's compile time otherwise.

#ifdef CB_HALF
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif

// complex64 and complex128 are abi.cuh's cb_complex, as in users' kernels.
typedef cb_complex<float> c64;
typedef cb_complex<double> c128;

// Exact widening conversions that promotion asks for (inputs into the result type).
template <typename R, typename T> struct Cvt {
    __device__ static R run(T x) { return static_cast<R>(x); }
};
#ifdef CB_HALF
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
#endif
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
#ifdef CB_HALF
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
#endif
template <> struct Add<c64> {
    __device__ static c64 run(c64 a, c64 b) { return c64{a.re + b.re, a.im + b.im}; }
};
template <> struct Add<c128> {
    __device__ static c128 run(c128 a, c128 b) { return c128{a.re + b.re, a.im + b.im}; }
};

template <typename A, typename B, typename R>
__device__ __forceinline__ R add_one(A x, B y) {
    return Add<R>::run(Cvt<R, A>::run(x), Cvt<R, B>::run(y));
}

// add's operation, for the kernels that take one as a functor (tiled.cu).
template <typename A, typename B, typename R> struct AddOp {
    __device__ __forceinline__ R operator()(A x, B y) const { return add_one<A, B, R>(x, y); }
};

// The access helpers of access.cuh, unqualified in add's kernels.
using namespace cbt;
