// The reduction engine's kernels (users' ReductionKernels and the built-in sum, max, ...),
// written once over an `Ops` that the host generates per signature
// (src/ops/reduction/source.rs), after abi.cuh, user.cuh and the signature's cb_identity,
// cb_reduce, cb_map and cb_post. The host mirrors CbRedShape and CbRedIn in
// src/ops/reduction/params.rs: keep them in step.
//
// A reduction has n_out outputs of n_red elements each, split into `chunks` chunks. A group of
// G threads (1, 32, or the block) reduces one (output, chunk) item: the threads of every chunk
// of an output take packs of V elements in turn, each thread folding its elements in order from
// the identity, then the group folds its threads' results in a fixed tree of warp shuffles (and
// shared memory across warps). With one chunk the group writes the outputs; with more it writes
// a partial result, and a second kernel folds each output's partials in order. No atomics: the
// order of every operation depends on the shape, the dtypes and the device's size alone.
//
// Ops gives: R (the reduce type), V, Item and item(o) (an output's offsets), at<ONE>(it, j) (the
// mapped value of element j; ONE: of one reduced dimension), Packs, load<ROW>(p, it, j) (V
// elements from unit strides; ROW: the elements of row j of V neighbouring outputs), lane(p, e,
// j) (element e of the packs mapped as element j of its output), and post(it, a) (the post-map
// into the outputs).

// The loop's kept and reduced extents, innermost last, and the split.
struct CbRedShape {
    long long kept[CB_MAX_DIMS];
    long long red[CB_MAX_DIMS];
    int kept_ndim;
    int red_ndim;
    long long n_out;
    long long n_red;
    long long chunks;
};

// An element input: its strides over the kept and over the reduced dimensions.
template <typename T> struct CbRedIn {
    T* p;
    long long ks[CB_MAX_DIMS];
    long long rs[CB_MAX_DIMS];
};

namespace cbr {

// The offset of element i of a walk over `ext` (C order) with strides `s`. The loop is kept
// rolled: its 64-bit divisions, unrolled or copied into every unrolled load, would take most of
// a program's compile time. Walks of one dimension (nearly all, once merged) never come here.
__device__ __forceinline__ long long offset_nd(long long i, const long long* ext,
                                               const long long* s, int ndim) {
    long long off = 0;
#pragma unroll 1
    for (int d = ndim - 1; d > 0; --d) {
        off += (i % ext[d]) * s[d];
        i /= ext[d];
    }
    return off + i * s[0];
}
__device__ __forceinline__ long long offset(long long i, const long long* ext, const long long* s,
                                            int ndim) {
    return ndim == 1 ? i * s[0] : offset_nd(i, ext, s, ndim);
}

// x moved down `delta` lanes, word by word, whatever its type.
template <typename T> __device__ __forceinline__ T shfl_down(const T& x, int delta) {
    constexpr int W = (sizeof(T) + 3) / 4;
    int w[W];
    memcpy(w, &x, sizeof(T));
#pragma unroll
    for (int k = 0; k < W; ++k) w[k] = __shfl_down_sync(0xffffffffu, w[k], delta);
    T r;
    memcpy(&r, w, sizeof(T));
    return r;
}

// The fold of a group's G values (the result in its first thread): a fixed tree.
template <int G, typename R>
__device__ __forceinline__ R group_fold(R s, unsigned char* shared) {
    if (G == 1) return s;
#pragma unroll
    for (int d = (G < 32 ? G : 32) / 2; d > 0; d /= 2) s = cb_reduce(s, shfl_down(s, d));
    if (G <= 32) return s;
    R* parts = reinterpret_cast<R*>(shared);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // the previous item's reads are done
    if (lane == 0) parts[warp] = s;
    __syncthreads();
    if (warp == 0) {
        s = parts[lane < G / 32 ? lane : 0];
#pragma unroll
        for (int d = G / 64; d > 0; d /= 2) s = cb_reduce(s, shfl_down(s, d));
    }
    return s;
}

// Packs each thread loads before it folds them (one reduced dimension): more bytes in flight.
#define CBR_UNROLL 4

// Folds the V elements of packs p, elements j, j + 1, ... of one output, into s in order.
template <typename Ops>
__device__ __forceinline__ void apply(const Ops& ops, typename Ops::R& s,
                                      const typename Ops::Packs& p, long long j) {
#pragma unroll
    for (int e = 0; e < Ops::V; ++e) s = cb_reduce(s, ops.lane(p, e, j + e));
}

// Folds element e of packs p, element j of V neighbouring outputs, into each one's s[e].
template <typename Ops>
__device__ __forceinline__ void apply_each(const Ops& ops, typename Ops::R* s,
                                           const typename Ops::Packs& p, long long j) {
#pragma unroll
    for (int e = 0; e < Ops::V; ++e) s[e] = cb_reduce(s[e], ops.lane(p, e, j));
}

// Folds thread t's share of an output's n elements into s. The T threads of the output (its
// group's in every chunk: t = chunk * G + lane) take packs of V in turn, thread t packs t,
// t + T, ..., so that at any moment the device reads one window of neighbouring packs (no
// stream of its own per chunk, whose like addresses would crowd the same memory channels);
// each thread folds its elements in order, then the tail (fewer than V elements) one at a
// time. VEC: packs loaded whole (unit strides, aligned); ONE: one reduced dimension, whose
// offsets are multiplications, the loads unrolled; neither changes the order.
template <typename Ops, bool VEC, bool ONE>
__device__ __forceinline__ typename Ops::R fold(const Ops& ops, const typename Ops::Item& it,
                                                long long t, long long T, long long n,
                                                typename Ops::R s) {
    constexpr int V = Ops::V;
    // Elements in flight: CBR_UNROLL packs, or one at a time about 16 (fewer unrolled loads of
    // narrow types compile faster and keep as many bytes in flight).
    constexpr int U = !ONE ? 1 : VEC || V <= 4 ? CBR_UNROLL : (V < 16 ? 16 / V : 1);
    const long long packs = n / V;
    for (long long q0 = t; q0 < packs; q0 += T * U) {
        if constexpr (VEC) {
            typename Ops::Packs p[U];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (q0 + u * T < packs) ops.template load<false>(p[u], it, (q0 + u * T) * V);
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (q0 + u * T < packs) apply(ops, s, p[u], (q0 + u * T) * V);
        } else if constexpr (ONE) {
            // The loads do not depend on s: the compiler issues them ahead of the folds.
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const long long q = q0 + u * T;
#pragma unroll
                for (int e = 0; e < V; ++e)
                    if (q < packs) s = cb_reduce(s, ops.template at<true>(it, q * V + e));
            }
        } else {
#pragma unroll 1
            for (int e = 0; e < V; ++e) s = cb_reduce(s, ops.template at<false>(it, q0 * V + e));
        }
    }
    // The tail: elements packs * V + t + k * T; unrolled where offsets are multiplications
    // (rows of 2 elements have nothing but a tail).
    const long long tail = packs * V + t;
    if constexpr (ONE) {
#pragma unroll
        for (int k = 0; k < V; ++k)
            if (tail + k * T < n) s = cb_reduce(s, ops.template at<true>(it, tail + k * T));
    } else {
#pragma unroll 1
        for (long long j = tail; j < n; j += T) s = cb_reduce(s, ops.template at<false>(it, j));
    }
    return s;
}

// Folds thread t's share of n rows into the V neighbouring outputs of `it` (one thread each,
// G == 1; unit strides along the outputs, aligned): the rows of the one-thread fold in its
// order (packs of V rows t, t + T, ..., then the tail), each row loaded as one pack of V
// outputs' elements, so a warp's loads are 32 packs side by side.
template <typename Ops>
__device__ __forceinline__ void fold_columns(const Ops& ops, const typename Ops::Item& it,
                                             long long t, long long T, long long n,
                                             typename Ops::R* s) {
    constexpr int V = Ops::V;
    const long long packs = n / V;
    for (long long q = t; q < packs; q += T) {
        typename Ops::Packs p[V];
#pragma unroll
        for (int e = 0; e < V; ++e) ops.template load<true>(p[e], it, q * V + e);
#pragma unroll
        for (int e = 0; e < V; ++e) apply_each(ops, s, p[e], q * V + e);
    }
    const long long tail = packs * V + t;
#pragma unroll 1
    for (long long j = tail; j < n; j += T) {
        typename Ops::Packs p;
        ops.template load<true>(p, it, j);
        apply_each(ops, s, p, j);
    }
}

// The first kernel for columns in packs (G == 1, VEC): V neighbouring outputs a thread. A
// block's X threads along the outputs are the fewest powers of two that cover them (up to the
// block); its Y = blockDim.x / X rows of threads take Y chunks (the host launches
// ceil(chunks / Y) rows of blocks), so that few columns still fill the blocks.
template <typename Ops>
__device__ __forceinline__ void pass_columns(const Ops& ops, const CbRedShape& g, void* partial) {
    typedef typename Ops::R R;
    constexpr int V = Ops::V;
    int X = 1;
    while (X < (int)blockDim.x && X < g.n_out / V) X *= 2;
    const long long c = blockIdx.y * (long long)(blockDim.x / X) + threadIdx.x / X;
    if (c >= g.chunks) return;
    for (long long o = (blockIdx.x * (long long)X + threadIdx.x % X) * V; o < g.n_out;
         o += (long long)gridDim.x * X * V) {
        R s[V];
#pragma unroll
        for (int e = 0; e < V; ++e) s[e] = cb_identity();
        fold_columns<Ops>(ops, ops.item(o), c, g.chunks, g.n_red, s);
        // Unrolled: s[e] stays in registers (indexed at run time, it would go to local memory).
#pragma unroll
        for (int e = 0; e < V; ++e) {
            if (g.chunks == 1) ops.post(ops.item(o + e), s[e]);
            else static_cast<R*>(partial)[(o + e) * g.chunks + c] = s[e];
        }
    }
}

// The first kernel for groups: each output of the group's turn, its share of the chunk of the
// block's row.
template <typename Ops, int G, bool VEC>
__device__ __forceinline__ void pass_groups(const Ops& ops, const CbRedShape& g, void* partial) {
    typedef typename Ops::R R;
    __shared__ __align__(16) unsigned char shared[(G > 32 ? G / 32 : 1) * sizeof(R)];
    const int lane = threadIdx.x % G;
    const long long per_block = blockDim.x / G;
    const long long c = blockIdx.y;  // the chunk: one row of blocks each
    const long long t = c * G + lane, T = g.chunks * G;
    for (long long o = blockIdx.x * per_block + threadIdx.x / G; o < g.n_out;
         o += gridDim.x * per_block) {
        const typename Ops::Item it = ops.item(o);
        R s = cb_identity();
        if constexpr (VEC) s = fold<Ops, true, true>(ops, it, t, T, g.n_red, s);
        else if (g.red_ndim == 1) s = fold<Ops, false, true>(ops, it, t, T, g.n_red, s);
        else s = fold<Ops, false, false>(ops, it, t, T, g.n_red, s);
        s = group_fold<G>(s, shared);
        if (lane == 0) {
            if (g.chunks == 1) ops.post(it, s);
            else static_cast<R*>(partial)[o * g.chunks + c] = s;
        }
    }
}

// Rows of at most this many elements take one thread each (the host's SHORT_ROW).
#define CBR_SHORT_ROW 16

// The first kernel for short rows in packs (G == 1, one chunk; the rows contiguous and
// aligned): with K > 1, each thread K neighbouring rows of V / K elements, one pack of each
// input; with K == 1, one row of a multiple of V elements, pack by pack. Each row is folded in
// order from the identity, as one thread a row folds it.
template <typename Ops, int K>
__device__ __forceinline__ void pass_rows(const Ops& ops, const CbRedShape& g) {
    typedef typename Ops::R R;
    constexpr int V = Ops::V, N = V / K, P = K > 1 ? 1 : CBR_SHORT_ROW / V;
    const long long step = (long long)gridDim.x * blockDim.x * K;
    for (long long o = (blockIdx.x * (long long)blockDim.x + threadIdx.x) * K; o < g.n_out;
         o += step) {
        const typename Ops::Item it = ops.item(o);
        typename Ops::Packs p[P];
#pragma unroll
        for (int q = 0; q < P; ++q)
            if (q * V < g.n_red) ops.template load<false>(p[q], it, q * V);
        R s[K];
#pragma unroll
        for (int k = 0; k < K; ++k) s[k] = cb_identity();
        if constexpr (K == 1) {
#pragma unroll
            for (int q = 0; q < P; ++q)
                if (q * V < g.n_red) apply(ops, s[0], p[q], q * V);
        } else {
#pragma unroll
            for (int e = 0; e < V; ++e) s[e / N] = cb_reduce(s[e / N], ops.lane(p[0], e, e % N));
        }
        ops.post(it, s[0]);
#pragma unroll
        for (int k = 1; k < K; ++k) ops.post(ops.item(o + k), s[k]);
    }
}

// The first kernel: short rows in packs where K is set, columns in packs where G is 1 and the
// loads are packs, else groups.
template <typename Ops, int G, bool VEC, int K>
__device__ __forceinline__ void pass(const Ops& ops, const CbRedShape& g, void* partial) {
    if constexpr (K > 0) pass_rows<Ops, K>(ops, g);
    else if constexpr (G == 1 && VEC) pass_columns<Ops>(ops, g, partial);
    else pass_groups<Ops, G, VEC>(ops, g, partial);
}

// The second kernel: each output's partials folded by a group of G threads, in order.
template <typename Ops, int G>
__device__ __forceinline__ void finish(const Ops& ops, const CbRedShape& g, const void* partial) {
    typedef typename Ops::R R;
    __shared__ __align__(16) unsigned char shared[(G > 32 ? G / 32 : 1) * sizeof(R)];
    const R* parts = static_cast<const R*>(partial);
    const int lane = threadIdx.x % G;
    const long long per_block = blockDim.x / G;
    for (long long o = blockIdx.x * per_block + threadIdx.x / G; o < g.n_out;
         o += gridDim.x * per_block) {
        R s = cb_identity();
        for (long long c = lane; c < g.chunks; c += G) s = cb_reduce(s, parts[o * g.chunks + c]);
        s = group_fold<G>(s, shared);
        if (lane == 0) ops.post(ops.item(o), s);
    }
}

}  // namespace cbr
