// How the elementwise kernels of both families (add's, and users' tiled ones) take their second
// input: an array read an element or a pack (abi.cuh's CbPack) at a time, or one value for every
// element. In a namespace of its own, so that a user's preamble may use any name. Comes after
// abi.cuh.

namespace cbt {

// The second input of a kernel: an array in memory (Dense), or one value for every element
// (Splat: add's Python scalar, passed by value among the kernel parameters, so nothing is
// uploaded; a user's kernel with one array input has a Splat its operation never reads).
template <typename T> struct Dense {
    static constexpr bool dense = true;
    const T* p;
    template <typename I> __device__ __forceinline__ T at(I i) const { return p[i]; }
    template <int V, typename I> __device__ __forceinline__ CbPack<T, V> pack(I i) const {
        return reinterpret_cast<const CbPack<T, V>*>(p)[i];
    }
};
template <typename T> struct Splat {
    static constexpr bool dense = false;
    T v;
    template <typename I> __device__ __forceinline__ T at(I) const { return v; }
    template <int V, typename I> __device__ __forceinline__ CbPack<T, V> pack(I) const {
        CbPack<T, V> r;
#pragma unroll
        for (int k = 0; k < V; ++k) r.v[k] = v;
        return r;
    }
};

}  // namespace cbt
