// How the tiled kernel (tiled.cu) takes its second input: an array read an element or a pack
// (abi.cuh's CbPack) at a time, or a value for every element. In a namespace of its own, so that a user's preamble may use any name. Comes after
// abi.cuh.

namespace cbt {

// The second input of a kernel: an array in memory (Dense), or one value for every element
// (Splat: a kernel with one array input, such as add of a scalar, whose value is a member of
// the operation, has a Splat its operation never reads).
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
