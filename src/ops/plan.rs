//! The loop plan of an elementwise kernel: which kernel variant walks the operands, over which
//! merged dimensions, in which index width. Every elementwise kernel plans here (`add` on CUDA
//! and on the CPU, users' `ElementwiseKernel`s): the step is pure, so it is tested without a GPU,
//! and the engine loads the chosen [`Variant`]'s kernel for the call's signature.
//!
//! The rules, in order:
//! - every operand C-contiguous over the loop's shape: one flat run;
//! - otherwise the dimensions are ordered by the lead operand's strides (an output, whose writes
//!   then run along its unit stride), unless the kernel sees its index (a user's operation that
//!   reads `i`, which is the C-order index of the loop's shape), and merged wherever every
//!   operand allows; a single merged dimension of unit stride everywhere (all operands
//!   Fortran-ordered alike, say) is a flat run too;
//! - a flat run takes the vector variant when every operand's address is aligned to a pack of
//!   `width` elements, and the plain contiguous one otherwise;
//! - where the signature has a tiled kernel, two merged dimensions with the lead running along columns
//!   and some other operand along rows (a transposed input) take the tiled variant;
//! - anything else is the strided variant;
//! - indices are 32-bit where every index and element offset fits ([`kernels::fits_32_bits`]).

use crate::cuda::kernels::{self, Index};
use crate::layout::{coalesce_of, order_by_first, Coalesced, Dims};

/// What the plan needs of one operand that is walked per element (values passed among the
/// kernel parameters and raw arrays are not operands of the loop).
#[derive(Clone, Copy, Debug, Default)]
pub struct Operand<'a> {
    /// Element strides over the loop's shape (broadcast dimensions have stride 0).
    pub strides: &'a [isize],
    /// Whether the operand is C-contiguous over the loop's shape.
    pub contiguous: bool,
    /// The address of its first element.
    pub address: usize,
    /// Bytes per element.
    pub itemsize: usize,
}

impl<'a> Operand<'a> {
    /// `x` as the loop sees it.
    pub fn of(x: &'a crate::array::Array) -> Operand<'a> {
        Operand {
            strides: x.strides(),
            contiguous: x.layout().is_contiguous(),
            address: x.data_ptr() as usize,
            itemsize: x.dtype().itemsize(),
        }
    }
}

/// The kernel variant that walks the loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// Every operand one contiguous run of the loop's elements, aligned to `width`-element packs.
    Vector,
    /// Every operand one contiguous run, not all aligned (or packs of one element).
    Contiguous,
    /// Any strides over the merged dimensions.
    Strided,
    /// Two merged dimensions, rows and columns, with the lead operand unit-strided along columns;
    /// `mask` has bit `k` set for each operand `k` that runs along rows instead (transposed).
    Tiled {
        /// The transposed operands.
        mask: u32,
    },
}

/// The plan of one call; see the module documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The variant chosen.
    pub variant: Variant,
    /// The index width every index and offset fits.
    pub index: Index,
    /// Elements in the loop.
    pub n: usize,
    /// The merged shape, innermost last (empty for the flat variants).
    pub shape: Vec<usize>,
    /// Each operand's element strides over `shape` (empty for the flat variants).
    pub strides: Vec<Vec<isize>>,
}

impl Plan {
    /// Plans a loop over `n` elements of `shape` (n > 0) walking `operands`, with dimensions
    /// ordered by the strides of `operands[lead]` (kept in C order when `None`). `width` is the
    /// vector variant's pack (1: no vector variant); `tiles` says whether the signature has the
    /// tiled variant.
    pub fn new(
        shape: &[usize],
        n: usize,
        operands: &[Operand<'_>],
        lead: Option<usize>,
        width: usize,
        tiles: bool,
    ) -> Plan {
        if operands.iter().all(|o| o.contiguous) {
            return Plan::flat(n, operands, width);
        }
        let strides: Vec<&[isize]> = operands.iter().map(|o| o.strides).collect();
        let (shape, strides) = match lead {
            Some(lead) => {
                let mut led: Vec<&[isize]> = Vec::with_capacity(operands.len() + 1);
                led.push(operands[lead].strides);
                led.extend(&strides);
                let (ordered, ordered_strides) = order_by_first(shape, &led);
                let refs: Vec<&[isize]> = ordered_strides[1..].iter().map(|s| &s[..]).collect();
                coalesce_of(&ordered, &refs)
            }
            None => coalesce_of(shape, &strides),
        };
        if shape.len() == 1 && strides.iter().all(|s| s[0] == 1) {
            return Plan::flat(n, operands, width);
        }
        let index = {
            let refs: Vec<&[isize]> = strides.iter().map(|s| &s[..]).collect();
            if kernels::fits_32_bits(n, &shape, &refs) {
                Index::I32
            } else {
                Index::I64
            }
        };
        let mask = match lead {
            Some(lead) if tiles => transposed(&shape, &strides, lead),
            _ => 0,
        };
        Plan {
            variant: if mask != 0 {
                Variant::Tiled { mask }
            } else {
                Variant::Strided
            },
            index,
            n,
            shape,
            strides,
        }
    }

    fn flat(n: usize, operands: &[Operand<'_>], width: usize) -> Plan {
        let aligned = width > 1
            && operands
                .iter()
                .all(|o| o.address % (width * o.itemsize) == 0);
        Plan {
            variant: if aligned {
                Variant::Vector
            } else {
                Variant::Contiguous
            },
            index: if n <= kernels::I32_LIMIT {
                Index::I32
            } else {
                Index::I64
            },
            n,
            shape: Vec::new(),
            strides: Vec::new(),
        }
    }

    /// The plan as a fixed number of operands' loop nest (the CPU loops'): one run of `n` for
    /// the flat variants. `N` must be the number of operands planned.
    pub fn coalesced<const N: usize>(&self) -> Coalesced<N> {
        if self.shape.is_empty() {
            return Coalesced::contiguous(self.n);
        }
        Coalesced {
            shape: Dims::from_slice(&self.shape),
            strides: std::array::from_fn(|k| Dims::from_slice(&self.strides[k])),
        }
    }

    /// Blocks of `block` threads for the flat and strided variants on device `ordinal`: one
    /// chunk a block for the vector kernel ([`Plan::vector_blocks`]), else one element a thread
    /// capped at what the device keeps resident (the grid-stride loops do the rest). The tiled
    /// variant's grid is one block a tile (see `params::kernel`).
    pub fn blocks(&self, ordinal: u32, width: usize, block: u32) -> crate::Result<u32> {
        match self.variant {
            Variant::Vector => Ok(self.vector_blocks(width, block)),
            _ => kernels::grid(ordinal, self.n.div_ceil(block as usize), block),
        }
    }

    /// Blocks of the vector variant: one chunk of `block` threads, each moving
    /// [`kernels::UNROLL`] packs of `width` elements, per block (short-lived blocks stream better
    /// than a resident grid; the kernel still loops should the grid be capped).
    pub fn vector_blocks(&self, width: usize, block: u32) -> u32 {
        (self.n / width)
            .div_ceil(block as usize * kernels::UNROLL)
            .clamp(1, i32::MAX as usize) as u32
    }
}

/// The tiled variant's mask of a merged plan (0 when it does not apply): two dimensions of at
/// least two, the lead operand unit-strided along columns, and each operand with unit stride
/// along rows and a real stride across them marked.
fn transposed(shape: &[usize], strides: &[Vec<isize>], lead: usize) -> u32 {
    if shape.len() != 2 || strides[lead][1] != 1 || shape.iter().any(|&e| e < 2) {
        return 0;
    }
    strides
        .iter()
        .enumerate()
        .filter(|&(k, s)| k != lead && s[0] == 1 && s[1].unsigned_abs() > 1)
        .fold(0, |mask, (k, _)| mask | (1 << k))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(strides: &[isize], contiguous: bool, address: usize) -> Operand<'_> {
        Operand {
            strides,
            contiguous,
            address,
            itemsize: 4,
        }
    }

    #[test]
    fn contiguous_operands_run_flat_and_vectorize_when_aligned() {
        let c = [4, 1];
        let p = Plan::new(
            &[3, 4],
            12,
            &[op(&c, true, 64), op(&c, true, 128)],
            Some(0),
            4,
            true,
        );
        assert_eq!((p.variant, p.index), (Variant::Vector, Index::I32));
        assert_eq!(p.vector_blocks(4, 256), 1);
        // One operand off its 16-byte pack.
        let p = Plan::new(
            &[3, 4],
            12,
            &[op(&c, true, 64), op(&c, true, 132)],
            Some(0),
            4,
            true,
        );
        assert_eq!(p.variant, Variant::Contiguous);
        // Packs of one element: never the vector variant.
        let p = Plan::new(&[3, 4], 12, &[op(&c, true, 64)], Some(0), 1, true);
        assert_eq!(p.variant, Variant::Contiguous);
        // Past 32-bit indices.
        let big = 1usize << 31;
        let p = Plan::new(&[big], big, &[op(&[1], true, 0)], Some(0), 4, false);
        assert_eq!((p.variant, p.index), (Variant::Vector, Index::I64));
        assert_eq!(p.vector_blocks(4, 256), (big / 4 / 1024) as u32);
    }

    #[test]
    fn operands_ordered_alike_merge_into_one_flat_run() {
        // Fortran-ordered operands: reordered by the lead's strides, one unit-stride run.
        let f = [1, 3];
        let p = Plan::new(
            &[3, 4],
            12,
            &[op(&f, false, 0), op(&f, false, 0)],
            Some(0),
            4,
            true,
        );
        assert_eq!(p.variant, Variant::Vector);
        // A reversed operand stays strided.
        let r = [-1];
        let p = Plan::new(
            &[5],
            5,
            &[op(&[1], true, 0), op(&r, false, 16)],
            Some(0),
            4,
            true,
        );
        assert_eq!(p.variant, Variant::Strided);
        assert_eq!((p.shape, p.strides), (vec![5], vec![vec![1], vec![-1]]));
    }

    #[test]
    fn a_kernel_that_sees_its_index_keeps_c_order() {
        // out a transposed view: ordered by it, the loop is one run in memory order; a kernel
        // that reads its index walks the C order of the shape instead.
        let t = [1, 4];
        let c = [8, 1];
        let ops = [op(&c, true, 0), op(&t, false, 0)];
        let led = Plan::new(&[4, 8], 32, &[op(&t, false, 0)], Some(0), 4, false);
        assert_eq!(led.variant, Variant::Vector);
        let kept = Plan::new(&[4, 8], 32, &[op(&t, false, 0)], None, 4, false);
        assert_eq!(kept.variant, Variant::Strided);
        assert_eq!((kept.shape, kept.strides), (vec![4, 8], vec![vec![1, 4]]));
        // Never tiled without a lead.
        assert_eq!(
            Plan::new(&[4, 8], 32, &ops, None, 4, true).variant,
            Variant::Strided
        );
    }

    #[test]
    fn a_broadcast_row_is_strided_over_merged_dimensions() {
        // out (2, 3, 4) contiguous; the other operand a row broadcast over the first two.
        let (o, b) = ([12, 4, 1], [0, 0, 1]);
        let p = Plan::new(
            &[2, 3, 4],
            24,
            &[op(&o, true, 0), op(&b, false, 0)],
            Some(0),
            4,
            true,
        );
        assert_eq!(p.variant, Variant::Strided);
        assert_eq!(p.shape, vec![6, 4]);
        assert_eq!(p.strides, vec![vec![4, 1], vec![0, 1]]);
    }

    #[test]
    fn transposed_operands_take_tiles_where_the_signature_has_them() {
        let (o, t) = ([8, 1], [1, 4]);
        let ops = [op(&o, true, 0), op(&t, false, 0), op(&o, true, 0)];
        let p = Plan::new(&[4, 8], 32, &ops, Some(0), 4, true);
        assert_eq!(p.variant, Variant::Tiled { mask: 0b010 });
        let both = [op(&o, true, 0), op(&t, false, 0), op(&t, false, 0)];
        let p = Plan::new(&[4, 8], 32, &both, Some(0), 4, true);
        assert_eq!(p.variant, Variant::Tiled { mask: 0b110 });
        // Without a tiled kernel: strided.
        assert_eq!(
            Plan::new(&[4, 8], 32, &ops, Some(0), 4, false).variant,
            Variant::Strided
        );
        // A column broadcast along columns reads one value per row: no tile.
        let col = [1, 0];
        let ops = [op(&o, true, 0), op(&col, false, 0)];
        assert_eq!(
            Plan::new(&[4, 8], 32, &ops, Some(0), 4, true).variant,
            Variant::Strided
        );
        // Three dimensions are left to the strided variant.
        let (o3, t3) = ([32, 8, 1], [1, 2, 8]);
        let ops = [op(&o3, true, 0), op(&t3, false, 0)];
        assert_eq!(
            Plan::new(&[2, 4, 8], 64, &ops, Some(0), 4, true).variant,
            Variant::Strided
        );
        // The lead need not come first: the loop follows operand 1 (out of a user's kernel whose
        // inputs come first).
        let ops = [op(&t, false, 0), op(&o, true, 0)];
        assert_eq!(
            Plan::new(&[4, 8], 32, &ops, Some(1), 4, true).variant,
            Variant::Tiled { mask: 0b01 }
        );
    }

    #[test]
    fn index_width_covers_every_offset() {
        // Few elements, but a stride that reaches past 2^31.
        let (o, far) = ([2, 1], [1 << 31, 1]);
        let p = Plan::new(
            &[2, 2],
            4,
            &[op(&o, true, 0), op(&far, false, 0)],
            Some(0),
            4,
            false,
        );
        assert_eq!((p.variant, p.index), (Variant::Strided, Index::I64));
        let near = [4, 1];
        let p = Plan::new(
            &[2, 2],
            4,
            &[op(&o, true, 0), op(&near, false, 0)],
            Some(0),
            4,
            false,
        );
        assert_eq!(p.index, Index::I32);
    }
}
