// The common header of users' elementwise kernels (cubridge.ElementwiseKernel), after abi.cuh:
// the types that the generated code passes (raw arrays, the index; packs are abi.cuh's), complex numbers with
// arithmetic, and the dtype names as C++ types. The host mirrors CbRaw in
// src/ops/elementwise/params.rs: keep the two in step.

// A `raw` parameter: the whole array, indexed by a C-order linear index over its own shape.
template <typename T> struct CbRaw {
    T* p;
    long long shape[CB_MAX_DIMS];
    long long stride[CB_MAX_DIMS];
    int ndim;
    long long n;
    __device__ __forceinline__ long long size() const { return n; }
    __device__ __forceinline__ T& operator[](long long i) const {
        if (ndim == 1) return p[i * stride[0]];
        long long off = 0;
        for (int d = ndim - 1; d >= 0; --d) {
            off += (i % shape[d]) * stride[d];
            i /= shape[d];
        }
        return p[off];
    }
};

// `_ind` in an operation: `_ind.size()` is the number of indices the kernel runs.
struct CbInd {
    long long n;
    __device__ __forceinline__ long long size() const { return n; }
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

typedef signed char int8;
typedef short int16;
typedef int int32;
typedef long long int64;
typedef unsigned char uint8;
typedef unsigned short uint16;
typedef unsigned int uint32;
typedef unsigned long long uint64;
typedef float float32;
typedef double float64;
typedef cb_complex<float> complex64;
typedef cb_complex<double> complex128;
