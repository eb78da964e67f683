// The parameter structs that every elementwise kernel takes, cubridge's own (add, the gather)
// and users' alike. It comes first in every program. The host mirrors them in
// src/ops/elementwise/params.rs (`Strided`, `Shape`): keep the two in step.
//
// A kernel's parameters are, in order: one per operand, inputs then outputs (a pointer to the
// first element for the contiguous and vector variants, a CbStrided for the strided and tiled
// ones, a value for a scalar, a CbRaw for a user's raw array), then `long long n` (the number of
// indices), then, for the strided and tiled variants, the loop's CbShape, and, for the tiled
// variant of add, its `int` tile mask.

#define CB_MAX_DIMS 8

// V consecutive elements moved as one aligned access (16 bytes for the widest operand): the
// vector kernels of add and of users' kernels, and the tiled kernels, move packs.
template <typename T, int V> struct alignas(sizeof(T) * V) CbPack {
    T v[V];
};

// An operand read or written at any strides (elements), over the loop's coalesced shape.
template <typename T> struct CbStrided {
    T* p;
    long long s[CB_MAX_DIMS];
};

// The coalesced shape of the loop, innermost last.
struct CbShape {
    long long d[CB_MAX_DIMS];
    int ndim;
};
