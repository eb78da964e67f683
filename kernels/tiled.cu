// The tiled kernel (after abi.cuh and access.cuh), for 2-D plans with a transposed input, over
// an operation `op` of one or two inputs: an elementwise kernel's (add's, or a user's), as the
// host writes it (`CbTileOp`, src/ops/elementwise/source.rs). It takes most of the compile time,
// so it is a program of its own, compiled only when a transposed layout first needs it. In namespace cbt, beside access.cuh's helpers.

namespace cbt {

// Two dimensions [rows, cols] where out runs along cols (stride 1) and an input runs along
// rows (it is a transposed view). Such an input is read an E x E tile at a time along its own
// unit stride into shared memory, then read back across, so that every global access of a warp
// covers whole 32-byte sectors. A block is 32 x 8 threads and takes one tile (the host launches
// one block per tile; the loop covers a capped grid; the kernels rely on blockDim.y being 8).
// Thread x adds columns x + 32 s (s < E / 32) of E / 8 rows. E is 64 for elements of up to 4
// bytes and 32 above; tile rows are padded to a word past E, which keeps the reads across
// conflict-free. The host tiles an input only where it has unit stride along rows and out unit
// stride along cols, and the kernel takes both as given (fewer registers for index arithmetic).
// Each thread issues all its loads of a tile before it stores any of them to shared memory, and
// only tiles on the last row or column of tiles check bounds; the 32-bit wrappers cap
// registers at 64 (__launch_bounds__(256, 4)) so that four blocks stay resident.
//
// The tiles live in dynamic shared memory, sized by the host for the tiled inputs only
// (kernels::tile_shared_bytes mirrors TileOf: keep the two in step).
template <typename T> struct TileOf {
    static const int edge = sizeof(T) <= 4 ? 64 : 32;
    static const int pad = sizeof(T) >= 4 ? 1 : 4 / sizeof(T);
};

// Loads the elements of a tile that a thread adds, from an input read in place (not tiled).
// With rows and cols swapped, and unit s1, it loads a tiled input along that input's unit
// stride (rows), so that a warp reads consecutive elements; store_tile then puts them in the
// shared tile. Only EDGE tiles check bounds.
template <bool EDGE, int E, typename T, typename I, typename S>
__device__ __forceinline__ void load_direct(T (*v)[E / 32], S src, I r0, I c0, I rows, I cols,
                                            I s0, I s1) {
#pragma unroll
    for (int k = 0; k < E / 8; ++k) {
        const I r = r0 + threadIdx.y + 8 * k;
#pragma unroll
        for (int e = 0; e < E / 32; ++e) {
            const I c = c0 + threadIdx.x + 32 * e;
            if (!EDGE || (r < rows && c < cols)) v[k][e] = src.at(r * s0 + c * s1);
        }
    }
}

// Stores a tiled input's elements, loaded by load_direct with rows and cols swapped, in the
// block's shared tile: column-major, PITCH elements a column.
template <bool EDGE, int E, int PITCH, typename T, typename I>
__device__ __forceinline__ void store_tile(T* tile, const T (*v)[E / 32], I r0, I c0, I rows,
                                           I cols) {
#pragma unroll
    for (int q = 0; q < E / 8; ++q) {
        const int k = threadIdx.y + 8 * q;
#pragma unroll
        for (int e = 0; e < E / 32; ++e) {
            const I r = r0 + threadIdx.x + 32 * e;
            if (!EDGE || (r < rows && c0 + k < cols)) tile[k * PITCH + threadIdx.x + 32 * e] = v[q][e];
        }
    }
}

// The shared-memory tiles of a block and the strides of the operands (elements).
template <typename A, typename B, typename I> struct TileArgs {
    A* ta;
    B* tb;
    bool tile_a, tile_b;
    I rows, cols, so0, sa0, sa1, sb0, sb1;
};

// One tile of `tiled`, with corner (r0, c0). Only the tiles that reach past the last row or
// column (EDGE) check bounds: the others load unconditionally and keep no per-element
// conditions in registers, which the 16-bit types need to keep enough loads in flight.
template <bool EDGE, int E, int PA, int PB, typename Op, typename A, typename B, typename R,
          typename I, typename SB>
__device__ __forceinline__ void one_tile(const Op& op, R* out, const A* a, SB b,
                                         const TileArgs<A, B, I>& t, I r0, I c0) {
    // One register array an input, whether tiled or not: every load of the tile is issued
    // before the first store to shared memory waits for its value. A tiled input has unit
    // stride along rows (the host's condition for tiling it).
    A va[E / 8][E / 32];
    B vb[E / 8][E / 32];
    if (t.tile_a)
        load_direct<EDGE, E, A, I>(va, Dense<A>{a}, c0, r0, t.cols, t.rows, t.sa1, (I)1);
    else
        load_direct<EDGE, E, A, I>(va, Dense<A>{a}, r0, c0, t.rows, t.cols, t.sa0, t.sa1);
    if constexpr (SB::dense) {  // a Splat is read from the parameters where it is added
        if (t.tile_b)
            load_direct<EDGE, E, B, I>(vb, b, c0, r0, t.cols, t.rows, t.sb1, (I)1);
        else
            load_direct<EDGE, E, B, I>(vb, b, r0, c0, t.rows, t.cols, t.sb0, t.sb1);
    }
    if (t.tile_a) store_tile<EDGE, E, PA, A, I>(t.ta, va, r0, c0, t.rows, t.cols);
    if (t.tile_b) store_tile<EDGE, E, PB, B, I>(t.tb, vb, r0, c0, t.rows, t.cols);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < E / 8; ++k) {
        const int i = threadIdx.y + 8 * k;
        const I r = r0 + i;
#pragma unroll
        for (int e = 0; e < E / 32; ++e) {
            const int j = threadIdx.x + 32 * e;
            const I c = c0 + j;
            if (!EDGE || (r < t.rows && c < t.cols)) {
                A x = t.tile_a ? t.ta[j * PA + i] : va[k][e];
                B y = t.tile_b ? t.tb[j * PB + i] : SB::dense ? vb[k][e] : b.at(0);
                out[r * t.so0 + c] = op(x, y);  // unit stride along cols
            }
        }
    }
}

// Two consecutive elements of a thread's tile rows (`src` unit stride along cols, even s0) or,
// with rows and cols swapped, of its tile columns (a tiled input). E is 64: a warp covers a
// row of the tile with one 4-byte access a thread.
template <int E, typename T, typename I>
__device__ __forceinline__ void load_pairs(CbPack<T, 2>* v, const T* src, I r0, I c0, I s0) {
    const T* p = src + (r0 + threadIdx.y) * s0 + c0 + 2 * threadIdx.x;
#pragma unroll
    for (int k = 0; k < E / 8; ++k) v[k] = *reinterpret_cast<const CbPack<T, 2>*>(p + 8 * k * s0);
}

// An interior tile of 2-byte elements, moved in pairs: half the memory instructions of
// one_tile, so twice the bytes in flight for the same registers. The host chooses it only
// where every pair is aligned: 4-byte aligned pointers, even strides across, and unit stride
// along cols for an input read in place. Its shared tiles use a pitch of E + 1 (which the
// host's allocation, E + 2 a column, holds) so that reads across are conflict-free.
template <int MASK, int E, typename Op, typename A, typename B, typename R, typename I,
          typename SB>
__device__ __forceinline__ void pair_tile(const Op& op, R* out, const A* a, SB b,
                                          const TileArgs<A, B, I>& t, I r0, I c0) {
    constexpr int P = E + 1;
    constexpr bool tile_a = MASK & 1, tile_b = MASK & 2;
    CbPack<A, 2> va[E / 8];
    CbPack<B, 2> vb[E / 8];
    if constexpr (tile_a)
        load_pairs<E, A, I>(va, a, c0, r0, t.sa1);
    else
        load_pairs<E, A, I>(va, a, r0, c0, t.sa0);
    if constexpr (SB::dense) {
        if constexpr (tile_b)
            load_pairs<E, B, I>(vb, b.p, c0, r0, t.sb1);
        else
            load_pairs<E, B, I>(vb, b.p, r0, c0, t.sb0);
    } else {
#pragma unroll
        for (int k = 0; k < E / 8; ++k) vb[k] = b.template pack<2>(0);
    }
#pragma unroll
    for (int q = 0; q < E / 8; ++q) {
        const int at = (threadIdx.y + 8 * q) * P + 2 * threadIdx.x;
        if constexpr (tile_a) {
            t.ta[at] = va[q].v[0];
            t.ta[at + 1] = va[q].v[1];
        }
        if constexpr (tile_b) {
            t.tb[at] = vb[q].v[0];
            t.tb[at + 1] = vb[q].v[1];
        }
    }
    __syncthreads();
    const int j = 2 * threadIdx.x;
    R* o = out + (r0 + threadIdx.y) * t.so0 + c0 + j;
#pragma unroll
    for (int k = 0; k < E / 8; ++k) {
        const int i = threadIdx.y + 8 * k;
        const A x0 = tile_a ? t.ta[j * P + i] : va[k].v[0];
        const A x1 = tile_a ? t.ta[(j + 1) * P + i] : va[k].v[1];
        const B y0 = tile_b ? t.tb[j * P + i] : vb[k].v[0];
        const B y1 = tile_b ? t.tb[(j + 1) * P + i] : vb[k].v[1];
        CbPack<R, 2> z;
        z.v[0] = op(x0, y0);
        z.v[1] = op(x1, y1);
        *reinterpret_cast<CbPack<R, 2>*>(o + 8 * k * t.so0) = z;
    }
}

// `tile` says which inputs are read through tiles: bit 0 for a, bit 1 for b (never a Splat).
// With PAIRS (2-byte elements only), bit 2 says that every pair is aligned, and the interior
// tiles then move pairs (pair_tile). `out` is op(a, b) at every [row, col].
template <typename Op, typename A, typename B, typename R, typename I, typename SB,
          bool PAIRS = false>
__device__ void tiled(const Op& op, R* out, const A* a, SB b, I rows, I cols, I so0, I sa0, I sa1,
                      I sb0, I sb1, int tile) {
    static_assert(!PAIRS || (sizeof(A) == 2 && sizeof(B) == 2 && sizeof(R) == 2),
                  "pairs are of 2-byte elements");
    constexpr int E = TileOf<A>::edge < TileOf<B>::edge ? TileOf<A>::edge : TileOf<B>::edge;
    constexpr int PA = E + TileOf<A>::pad, PB = E + TileOf<B>::pad;
    extern __shared__ __align__(16) unsigned char cb_tiles[];
    const bool tile_a = tile & 1;
    constexpr int bytes_a = (E * PA * (int)sizeof(A) + 15) / 16 * 16;
    const TileArgs<A, B, I> args{
        reinterpret_cast<A*>(cb_tiles),
        reinterpret_cast<B*>(cb_tiles + (tile_a ? bytes_a : 0)),
        tile_a,
        SB::dense && (tile & 2),
        rows,
        cols,
        so0,
        sa0,
        sa1,
        sb0,
        sb1,
    };
    const I tiles_c = (cols + E - 1) / E;
    const I tiles = ((rows + E - 1) / E) * tiles_c;
    for (I t = blockIdx.x; t < tiles; t += gridDim.x) {
        const I r0 = (t / tiles_c) * E, c0 = (t % tiles_c) * E;
        const bool interior = r0 + E <= rows && c0 + E <= cols;
        if constexpr (PAIRS) {
            // The mask as a constant: each variant keeps only its own loads in registers. Tiles
            // that cannot move pairs take the checked path: one interior path less to keep in
            // registers, which would otherwise spill.
            const bool paired = interior && (tile & 4);
            if (paired && args.tile_a && args.tile_b)
                pair_tile<3, E>(op, out, a, b, args, r0, c0);
            else if (paired && args.tile_a)
                pair_tile<1, E>(op, out, a, b, args, r0, c0);
            else if (paired)
                pair_tile<2, E>(op, out, a, b, args, r0, c0);
            else
                one_tile<true, E, PA, PB>(op, out, a, b, args, r0, c0);
        } else {
            if (interior)
                one_tile<false, E, PA, PB>(op, out, a, b, args, r0, c0);
            else
                one_tile<true, E, PA, PB>(op, out, a, b, args, r0, c0);
        }
        if (t + gridDim.x < tiles) __syncthreads();  // the tiles are refilled next round
    }
}

}  // namespace cbt
