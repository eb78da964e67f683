// Device-side copies (after abi.cuh and common.cuh).

// A strided gather into a contiguous array of the same type (device-side copies): element i of
// `out` is `src` at the C-order index i of the loop's shape.
template <typename T>
__device__ void gather(T* out, const CbStrided<T>& src, long long n, const CbShape& g) {
    long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        long long rem = i, os = 0;
        for (int d = g.ndim - 1; d >= 0; --d) {
            long long idx = rem % g.d[d];
            rem /= g.d[d];
            os += idx * src.s[d];
        }
        out[i] = src.p[os];
    }
}
