// The flat loops of every elementwise kernel (add's and users'), written once (after abi.cuh):
// contiguous operands, vectorized when aligned, and any strides over up to CB_MAX_DIMS
// coalesced dimensions, each a grid-stride loop in index type I (32-bit where the host found
// that every index and offset fits: cheaper arithmetic). A kernel instantiates them with `Ops`,
// its operands and its operation, which the host writes per signature
// (src/ops/elementwise/source.rs):
//
//   at(i)                       the operation at element i of contiguous operands;
//   W, Packs, load(p, k),       W-element packs: load the packs k that the operation reads,
//   apply(p, first), store(p, k)  run it on each lane (element first + lane), store the results;
//   Offsets<I>, step(o, d, idx),  strided: each operand's offset, advanced by index idx along
//   at(o, i)                    dimension d, and the operation at those offsets (element i).
//
// In namespace cbt, so that a user's preamble may use any name.

namespace cbt {

// Packs each thread of the vector loop moves per operand and step: more bytes in flight.
#define CB_UNROLL 4

template <typename Ops, typename I>
__device__ __forceinline__ void contiguous(const Ops& ops, long long n) {
    const I m = (I)n, step = (I)gridDim.x * blockDim.x;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < m; i += step) ops.at(i);
}

// Every operand aligned to its pack (the host checks). A block takes chunks of CB_UNROLL *
// blockDim.x packs, each thread loading all its packs before it computes; the first threads of
// block 0 finish the n % W tail.
template <typename Ops, typename I>
__device__ __forceinline__ void vector(const Ops& ops, long long n) {
    const I packs = (I)(n / Ops::W);
    const I chunk = (I)blockDim.x * CB_UNROLL;
    for (I base = (I)blockIdx.x * chunk; base < packs; base += (I)gridDim.x * chunk) {
        typename Ops::Packs v[CB_UNROLL];
#pragma unroll
        for (int u = 0; u < CB_UNROLL; ++u) {
            const I k = base + u * (I)blockDim.x + threadIdx.x;
            if (k < packs) ops.load(v[u], k);
        }
#pragma unroll
        for (int u = 0; u < CB_UNROLL; ++u) {
            const I k = base + u * (I)blockDim.x + threadIdx.x;
            if (k < packs) {
                ops.apply(v[u], (long long)k * Ops::W);
                ops.store(v[u], k);
            }
        }
    }
    if (blockIdx.x == 0) {
        const long long tail = (long long)packs * Ops::W + threadIdx.x;
        if (tail < n) ops.at(tail);
    }
}

template <typename Ops, typename I>
__device__ __forceinline__ void strided(const Ops& ops, long long n, const CbShape& g) {
    const I m = (I)n, step = (I)gridDim.x * blockDim.x;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < m; i += step) {
        typename Ops::template Offsets<I> o{};
        I rem = i;
        for (int d = g.ndim - 1; d >= 0; --d) {
            const I extent = (I)g.d[d];
            const I idx = rem % extent;
            rem /= extent;
            ops.step(o, d, idx);
        }
        ops.at(o, (long long)i);
    }
}

}  // namespace cbt
