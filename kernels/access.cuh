// How the elementwise kernels of both families (add's, and users' tiled ones) move elements:
// packs for aligned accesses, and the two ways a kernel takes its second input. In a namespace
// of its own, so that a user's preamble may use any name. Comes after abi.cuh.

namespace cbt {

// V consecutive elements moved as one aligned access (16 bytes for the widest operand).
template <typename T, int V> struct alignas(sizeof(T) * V) Pack {
    T v[V];
};

// The second input of a kernel: an array in memory (Dense), or one value for every element
// (Splat: add's Python scalar, passed by value among the kernel parameters, so nothing is
// uploaded; a user's kernel with one array input has a Splat its operation never reads).
template <typename T> struct Dense {
    static constexpr bool dense = true;
    const T* p;
    template <typename I> __device__ __forceinline__ T at(I i) const { return p[i]; }
    template <int V, typename I> __device__ __forceinline__ Pack<T, V> pack(I i) const {
        return reinterpret_cast<const Pack<T, V>*>(p)[i];
    }
};
template <typename T> struct Splat {
    static constexpr bool dense = false;
    T v;
    template <typename I> __device__ __forceinline__ T at(I) const { return v; }
    template <int V, typename I> __device__ __forceinline__ Pack<T, V> pack(I) const {
        Pack<T, V> r;
#pragma unroll
        for (int k = 0; k < V; ++k) r.v[k] = v;
        return r;
    }
};

}  // namespace cbt
