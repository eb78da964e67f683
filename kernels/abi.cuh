// The parameter structs that every kernel takes, cubridge's own (add, the casts)
// and users' alike, and the two element types they share: packs and complex numbers. It comes
// first in every program. The host mirrors the structs in src/ops/elementwise/params.rs
// (`Strided`, `Shape`): keep the two in step.
//
// A kernel's parameters are, in order: one per operand, inputs then outputs (a pointer to the
// first element for the contiguous and vector variants, a CbStrided for the strided and tiled
// ones, a value for a scalar, a CbRaw for a user's raw array), then `long long n` (the number of
// indices), then, for the strided and tiled variants, the loop's CbShape, and, for the tiled
// variant, its `int` tile mask.

#define CB_MAX_DIMS 8

// How a kernel takes a struct parameter: in place, where its arrays (indexed at run time) are
// read from the parameter space. A plain struct parameter whose address the code takes would be
// copied into every thread's local memory first (hundreds of bytes a thread, in and out of the
// caches). __grid_constant__ exists from sm_70 on.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 700
#define CB_PARAM const
#else
#define CB_PARAM const __grid_constant__
#endif

// V consecutive elements moved as one aligned access (16 bytes for the widest operand): the
// vector kernels of add and of users' kernels, and the tiled kernels, move packs.
template <typename T, int V> struct alignas(sizeof(T) * V) CbPack {
    T v[V];
};

// An operand read or written at any strides (elements), over the loop's coalesced shape.
template <typename T> struct CbStrided {
    T* p;
    long long s[CB_MAX_DIMS];
};

// The coalesced shape of the loop, innermost last.
struct CbShape {
    long long d[CB_MAX_DIMS];
    int ndim;
};

// Complex numbers, laid out as numpy's (real part, then imaginary part), with the operators and
// functions that thrust::complex and cuda::std::complex users write. The binary operators are
// friends taking both sides by value, so that a real scalar converts on either side
// (`2.0f * z`, `z / 2`, `1 - z`).
template <typename F> struct cb_complex {
    F re, im;
    __device__ cb_complex() : re(0), im(0) {}
    __device__ cb_complex(F r, F i = 0) : re(r), im(i) {}
    template <typename G>
    __device__ explicit cb_complex(const cb_complex<G>& o) : re((F)o.re), im((F)o.im) {}
    __device__ F real() const { return re; }
    __device__ F imag() const { return im; }
    __device__ cb_complex operator+() const { return *this; }
    __device__ cb_complex operator-() const { return {-re, -im}; }
    friend __device__ cb_complex operator+(cb_complex a, cb_complex b) {
        return {a.re + b.re, a.im + b.im};
    }
    friend __device__ cb_complex operator-(cb_complex a, cb_complex b) {
        return {a.re - b.re, a.im - b.im};
    }
    friend __device__ cb_complex operator*(cb_complex a, cb_complex b) {
        return {a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re};
    }
    friend __device__ cb_complex operator/(cb_complex a, cb_complex b) {
        F d = b.re * b.re + b.im * b.im;
        return {(a.re * b.re + a.im * b.im) / d, (a.im * b.re - a.re * b.im) / d};
    }
    friend __device__ bool operator==(cb_complex a, cb_complex b) {
        return a.re == b.re && a.im == b.im;
    }
    friend __device__ bool operator!=(cb_complex a, cb_complex b) { return !(a == b); }
    __device__ cb_complex& operator+=(cb_complex o) { return *this = *this + o; }
    __device__ cb_complex& operator-=(cb_complex o) { return *this = *this - o; }
    __device__ cb_complex& operator*=(cb_complex o) { return *this = *this * o; }
    __device__ cb_complex& operator/=(cb_complex o) { return *this = *this / o; }
};
template <typename F> __device__ F real(cb_complex<F> z) { return z.re; }
template <typename F> __device__ F imag(cb_complex<F> z) { return z.im; }
template <typename F> __device__ cb_complex<F> conj(cb_complex<F> z) { return {z.re, -z.im}; }
template <typename F> __device__ F norm(cb_complex<F> z) { return z.re * z.re + z.im * z.im; }
template <typename F> __device__ F abs(cb_complex<F> z) { return hypot(z.re, z.im); }
template <typename F> __device__ F arg(cb_complex<F> z) { return atan2(z.im, z.re); }
