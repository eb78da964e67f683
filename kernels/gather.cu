// Device-side copies (after common.cuh).

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
