// The common header of users' elementwise kernels (cubridge.ElementwiseKernel), after abi.cuh:
// the types that the generated code passes (raw arrays, the index; packs and complex numbers are
// abi.cuh's), and the dtype names as C++ types. The host mirrors CbRaw in
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
