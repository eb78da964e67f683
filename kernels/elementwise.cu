// The flat kernels of add (after common.cuh): contiguous operands, vectorized when aligned, and
// any strides over up to CB_MAX_DIMS coalesced dimensions; each with 32-bit indexing where it
// fits, each a grid-stride loop taking its second input as an array or as one value.

// Contiguous operands. I is the index type: unsigned int when n < 2^31 (cheaper arithmetic),
// else long long. With V > 1 every pointer is aligned to its CbPack (the host checks); a block
// takes chunks of CB_UNROLL * blockDim.x packs, each thread loading CB_UNROLL packs of each input
// before it computes (more bytes in flight per thread), and the first threads finish the n % V
// tail. `b` is a Dense or a Splat of B.
#define CB_UNROLL 4

template <typename A, typename B, typename R, int V, typename I, typename SB>
__device__ void add_contiguous(R* out, const A* a, SB b, I n) {
    if (V == 1) {
        I step = (I)gridDim.x * blockDim.x;
        for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
            out[i] = add_one<A, B, R>(a[i], b.at(i));
        return;
    }
    const I packs = n / V;
    const CbPack<A, V>* pa = reinterpret_cast<const CbPack<A, V>*>(a);
    CbPack<R, V>* po = reinterpret_cast<CbPack<R, V>*>(out);
    const I chunk = (I)blockDim.x * CB_UNROLL;
    for (I base = (I)blockIdx.x * chunk; base < packs; base += (I)gridDim.x * chunk) {
        CbPack<A, V> x[CB_UNROLL];
        CbPack<B, V> y[CB_UNROLL];
#pragma unroll
        for (int u = 0; u < CB_UNROLL; ++u) {
            I i = base + u * blockDim.x + threadIdx.x;
            if (i < packs) {
                x[u] = pa[i];
                y[u] = b.template pack<V>(i);
            }
        }
#pragma unroll
        for (int u = 0; u < CB_UNROLL; ++u) {
            I i = base + u * blockDim.x + threadIdx.x;
            if (i < packs) {
                CbPack<R, V> z;
#pragma unroll
                for (int k = 0; k < V; ++k) z.v[k] = add_one<A, B, R>(x[u].v[k], y[u].v[k]);
                po[i] = z;
            }
        }
    }
    if (blockIdx.x == 0) {
        I tail = packs * V + threadIdx.x;
        if (tail < n) out[tail] = add_one<A, B, R>(a[tail], b.at(tail));
    }
}

// Any strides over up to CB_MAX_DIMS coalesced dimensions. I is the index and offset type: int
// when every index and offset fits in 31 bits (32-bit division is far cheaper), else long long.
// `sb` are b's strides when it is Dense (a Splat has none).
template <typename A, typename B, typename R, typename I, typename SB>
__device__ void add_strided(const CbStrided<R>& out, const CbStrided<A>& a, SB b,
                            const long long* sb, I n, const CbShape& g) {
    I step = (I)gridDim.x * blockDim.x;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        I rem = i, oo = 0, oa = 0, ob = 0;
        for (int d = g.ndim - 1; d >= 0; --d) {
            I extent = (I)g.d[d];
            I idx = rem % extent;
            rem /= extent;
            oo += idx * (I)out.s[d];
            oa += idx * (I)a.s[d];
            if constexpr (SB::dense) ob += idx * (I)sb[d];
        }
        out.p[oo] = add_one<A, B, R>(a.p[oa], b.at(ob));
    }
}
