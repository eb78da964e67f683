// add's operands for the flat loops of loops.cuh (after common.cuh): a, b (an array, Dense, or
// one value for every element, Splat) and out, contiguous (pointers, moved in packs of V) or at
// any strides (`sb` are b's strides when it is Dense; a Splat has none).

template <typename A, typename B, typename R, int V, typename SB> struct AddFlat {
    static constexpr int W = V;
    const A* a;
    SB b;
    R* o;
    struct Packs {
        CbPack<A, V> x;
        CbPack<B, V> y;
        CbPack<R, V> z;
    };
    template <typename I> __device__ __forceinline__ void at(I i) const {
        o[i] = add_one<A, B, R>(a[i], b.at(i));
    }
    template <typename I> __device__ __forceinline__ void load(Packs& p, I k) const {
        p.x = reinterpret_cast<const CbPack<A, V>*>(a)[k];
        p.y = b.template pack<V>(k);
    }
    __device__ __forceinline__ void apply(Packs& p, long long) const {
#pragma unroll
        for (int e = 0; e < V; ++e) p.z.v[e] = add_one<A, B, R>(p.x.v[e], p.y.v[e]);
    }
    template <typename I> __device__ __forceinline__ void store(const Packs& p, I k) const {
        reinterpret_cast<CbPack<R, V>*>(o)[k] = p.z;
    }
};

template <typename A, typename B, typename R, typename SB> struct AddStrided {
    CbStrided<A> a;
    SB b;
    const long long* sb;
    CbStrided<R> o;
    template <typename I> struct Offsets {
        I a, b, o;
    };
    template <typename I>
    __device__ __forceinline__ void step(Offsets<I>& f, int d, I idx) const {
        f.o += idx * (I)o.s[d];
        f.a += idx * (I)a.s[d];
        if constexpr (SB::dense) f.b += idx * (I)sb[d];
    }
    template <typename I> __device__ __forceinline__ void at(const Offsets<I>& f, long long) const {
        o.p[f.o] = add_one<A, B, R>(a.p[f.a], b.at(f.b));
    }
};
