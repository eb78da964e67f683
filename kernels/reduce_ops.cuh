// The arithmetic of the built-in reductions (sum, prod, max, min, argmax, argmin), after
// common.cuh (src/ops/reduction/builtin.rs): the type they accumulate in, products that wrap, and comparisons where NaN wins
// (as numpy's maximum and argmax: the first NaN).

// The accumulator of a dtype: float16 and bfloat16 accumulate in float32, the rest in their own.
template <typename T> struct CbAcc {
    typedef T type;
};
#ifdef CB_FLOAT16
template <> struct CbAcc<__half> {
    typedef float type;
};
#endif
#ifdef CB_BFLOAT16
template <> struct CbAcc<__nv_bfloat16> {
    typedef float type;
};
#endif

// Multiplication: and for bool, wrapping for integers (through the unsigned type).
template <typename R> struct Mul {
    __device__ static R run(R a, R b) { return a * b; }
};
template <> struct Mul<bool> {
    __device__ static bool run(bool a, bool b) { return a && b; }
};
#define CB_WRAPPING_MUL(T, U) \
    template <> struct Mul<T> { \
        __device__ static T run(T a, T b) { return (T)((U)a * (U)b); } \
    };
CB_WRAPPING_MUL(signed char, unsigned int)
CB_WRAPPING_MUL(short, unsigned int)
CB_WRAPPING_MUL(unsigned char, unsigned int)
CB_WRAPPING_MUL(unsigned short, unsigned int)
CB_WRAPPING_MUL(int, unsigned int)
CB_WRAPPING_MUL(long long, unsigned long long)

// Whether x is NaN (never, for integers and bool).
template <typename T> __device__ __forceinline__ bool cb_isnan(T x) { return x != x; }
template <typename F> __device__ __forceinline__ bool cb_isnan(cb_complex<F> x) {
    return x.re != x.re || x.im != x.im;
}
// x > y (complex: lexicographic, as numpy orders them).
template <typename T> __device__ __forceinline__ bool cb_gt(T x, T y) { return x > y; }
template <typename F> __device__ __forceinline__ bool cb_gt(cb_complex<F> x, cb_complex<F> y) {
    return x.re > y.re || (x.re == y.re && x.im > y.im);
}

// The larger (more: true) or smaller of a and b, NaN first.
template <bool More, typename T> __device__ __forceinline__ T cb_pick(T a, T b) {
    if (cb_isnan(a)) return a;
    if (cb_isnan(b)) return b;
    return (More ? cb_gt(b, a) : cb_gt(a, b)) ? b : a;
}

// A value and its index along the reduced elements; index -1 is the empty fold (max and min
// fold these too, every index 0, so that they need no smallest value as identity).
template <typename T> struct cbr_arg {
    T v;
    long long i;
};
// The one of a and b with the larger (More) or smaller value: the first NaN, then the first of
// equal values.
template <bool More, typename T>
__device__ __forceinline__ cbr_arg<T> cb_pick_arg(cbr_arg<T> a, cbr_arg<T> b) {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    const bool na = cb_isnan(a.v), nb = cb_isnan(b.v);
    bool take_b;
    if (na || nb) take_b = nb && (!na || b.i < a.i);
    else if (More ? cb_gt(b.v, a.v) : cb_gt(a.v, b.v)) take_b = true;
    else if (More ? cb_gt(a.v, b.v) : cb_gt(b.v, a.v)) take_b = false;
    else take_b = b.i < a.i;
    return take_b ? b : a;
}
