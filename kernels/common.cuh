// The arithmetic of cubridge's built-in elementwise kernels, the header of their programs: add
// (`out = add_one<A, B, R>(a, b)`, src/ops/add.rs) and the casts of device-side copies
// (`y = Cvt<B, A>::run(x)`, src/ops/copy.rs), generated per signature and variant as users'
// kernels are (src/ops/elementwise/source.rs), after abi.cuh and user.cuh. The generator
// includes the float16 and bfloat16 headers, and defines CB_FLOAT16 and CB_BFLOAT16, only where
// an operand has that dtype: they take a fifth of a small module's compile time otherwise.

// complex64 and complex128 are abi.cuh's cb_complex, as in users' kernels.
typedef cb_complex<float> c64;
typedef cb_complex<double> c128;

// Conversions, with the host's values (src/cpu/element.rs, `Element::from_scalar`): integers
// wrap, floats truncate toward zero into integers, nonzero is true, a complex number keeps its
// real part in a real type, and every floating result rounds once, to nearest even, from the
// exact value. Promotion's exact widenings are among them.

// A real value widened exactly into one of four types: long long, unsigned long long, float,
// double.
template <typename T> __device__ __forceinline__ long long cb_wide(T x) { return (long long)x; }
__device__ __forceinline__ unsigned long long cb_wide(unsigned long long x) { return x; }
__device__ __forceinline__ float cb_wide(float x) { return x; }
__device__ __forceinline__ double cb_wide(double x) { return x; }
#ifdef CB_FLOAT16
__device__ __forceinline__ float cb_wide(__half x) { return __half2float(x); }
#endif
#ifdef CB_BFLOAT16
__device__ __forceinline__ float cb_wide(__nv_bfloat16 x) { return __bfloat162float(x); }
#endif

// x (a float of magnitude 2^63 or more, or NaN) truncated into 128 bits, saturating (NaN: 0),
// then wrapped into T: the low 64 bits of x, 2^64 times the fraction of x / 2^64 (exact).
template <typename T> __device__ T cb_wrap(double x) {
    if (!(x > -0x1p127)) return (T)0;  // -inf, NaN, and the saturated minimum
    if (x >= 0x1p127) return (T)~0ull;
    const double q = x * 0x1p-64;
    return (T)(unsigned long long)((q - floor(q)) * 0x1p64);
}
// A float into integer type T as the host converts it: C's truncation where the value fits 64
// bits.
template <typename T, typename F> __device__ __forceinline__ T cb_to_int(F x) {
    if (x >= (F)-0x1p63 && x < (F)0x1p63) return (T)(long long)x;
    return cb_wrap<T>((double)x);
}

// A widened value (cb_wide's) into R: here an integer type, then the others.
template <typename R> struct To {
    __device__ static R run(long long w) { return (R)w; }
    __device__ static R run(unsigned long long w) { return (R)w; }
    __device__ static R run(float w) { return cb_to_int<R>(w); }
    __device__ static R run(double w) { return cb_to_int<R>(w); }
};
template <> struct To<bool> {
    template <typename W> __device__ static bool run(W w) { return w != 0; }
};
template <> struct To<float> {
    template <typename W> __device__ static float run(W w) { return (float)w; }
};
template <> struct To<double> {
    template <typename W> __device__ static double run(W w) { return (double)w; }
};
// An integer rounds once through float: exact below 2^24, and beyond float16's range above.
#ifdef CB_FLOAT16
template <> struct To<__half> {
    __device__ static __half run(long long w) { return __float2half_rn((float)w); }
    __device__ static __half run(unsigned long long w) { return __float2half_rn((float)w); }
    __device__ static __half run(float w) { return __float2half_rn(w); }
    __device__ static __half run(double w) { return __double2half(w); }
};
#endif
#ifdef CB_BFLOAT16
template <> struct To<__nv_bfloat16> {
    __device__ static __nv_bfloat16 run(long long w) { return __ll2bfloat16_rn(w); }
    __device__ static __nv_bfloat16 run(unsigned long long w) { return __ull2bfloat16_rn(w); }
    __device__ static __nv_bfloat16 run(float w) { return __float2bfloat16_rn(w); }
    __device__ static __nv_bfloat16 run(double w) { return __double2bfloat16(w); }
};
#endif
template <typename F> struct To<cb_complex<F>> {
    template <typename W> __device__ static cb_complex<F> run(W w) {
        return cb_complex<F>(To<F>::run(w));
    }
};

// T into R: a real value through cb_wide and To; a complex one part by part, or its real part
// (bool: either part nonzero); the same type unchanged (bit for bit, NaNs too).
template <typename R, typename T> struct Cvt {
    __device__ static R run(T x) { return To<R>::run(cb_wide(x)); }
};
template <typename T> struct Cvt<T, T> {
    __device__ static T run(T x) { return x; }
};
template <typename R, typename F> struct Cvt<R, cb_complex<F>> {
    __device__ static R run(cb_complex<F> x) { return Cvt<R, F>::run(x.re); }
};
template <typename F> struct Cvt<bool, cb_complex<F>> {
    __device__ static bool run(cb_complex<F> x) { return x.re != 0 || x.im != 0; }
};
template <typename G, typename F> struct Cvt<cb_complex<G>, cb_complex<F>> {
    __device__ static cb_complex<G> run(cb_complex<F> x) {
        return cb_complex<G>(Cvt<G, F>::run(x.re), Cvt<G, F>::run(x.im));
    }
};
template <> struct Cvt<c64, c64> {
    __device__ static c64 run(c64 x) { return x; }
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
