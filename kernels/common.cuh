// add's arithmetic (`add_one`), the header of add's programs: add is an elementwise kernel whose
// operation is `out = add_one<A, B, R>(a, b)` (src/ops/add.rs), generated per signature and
// variant as users' kernels are (src/ops/elementwise/source.rs), after abi.cuh and user.cuh.
// The generator includes the float16 and bfloat16 headers, and defines CB_FLOAT16 and
// CB_BFLOAT16, only where an operand has that dtype: they take a fifth of a small module's
// compile time otherwise.

// complex64 and complex128 are abi.cuh's cb_complex, as in users' kernels.
typedef cb_complex<float> c64;
typedef cb_complex<double> c128;

// Exact widening conversions that promotion asks for (inputs into the result type).
template <typename R, typename T> struct Cvt {
    __device__ static R run(T x) { return static_cast<R>(x); }
};
#ifdef CB_FLOAT16
template <> struct Cvt<float, __half> {
    __device__ static float run(__half x) { return __half2float(x); }
};
template <> struct Cvt<double, __half> {
    __device__ static double run(__half x) { return (double)__half2float(x); }
};
template <> struct Cvt<__half, __half> {
    __device__ static __half run(__half x) { return x; }
};
#endif
#ifdef CB_BFLOAT16
template <> struct Cvt<float, __nv_bfloat16> {
    __device__ static float run(__nv_bfloat16 x) { return __bfloat162float(x); }
};
template <> struct Cvt<double, __nv_bfloat16> {
    __device__ static double run(__nv_bfloat16 x) { return (double)__bfloat162float(x); }
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
#ifdef CB_FLOAT16
template <> struct Add<__half> {
    __device__ static __half run(__half a, __half b) {
        return __float2half_rn(__half2float(a) + __half2float(b));
    }
};
#endif
#ifdef CB_BFLOAT16
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
