//! Shapes, element strides and byte offsets: contiguity, broadcasting, extents, and the dimension
//! coalescing that kernels use to pick their fastest loop. All stride math lives here.

use crate::error::{Error, Result};

/// The most dimensions cubridge accepts (numpy's limit too). Foreign descriptors with more are
/// refused before their shape arrays are read.
pub const MAX_NDIM: usize = 64;

/// The most dimensions an elementwise kernel walks after merging contiguous ones (`CB_MAX_DIMS`
/// of `kernels/abi.cuh`), and the most that importers read onto the stack.
pub const MAX_DIMS: usize = 8;

/// Shape, strides (in elements, may be negative or zero) and the byte offset of the first
/// element from the start of the buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    shape: Dims<usize>,
    strides: Dims<isize>,
    byte_offset: usize,
    /// The element count and C-contiguity, worked out once: a call asks for them several
    /// times an operand.
    numel: usize,
    contiguous: bool,
}

/// Dimensions a [`Dims`] holds in place; more go to the heap.
const INLINE_DIMS: usize = 4;

/// One entry per dimension, in place for up to four dimensions (nearly every array), so that
/// making a layout or a loop plan (every import, view, result and call) allocates nothing. Reads
/// as a slice.
#[derive(Clone)]
pub enum Dims<T: Copy + Default> {
    /// The first `n` entries of the array.
    Inline(u8, [T; INLINE_DIMS]),
    /// More than fit in place.
    Heap(Vec<T>),
}

impl<T: Copy + Default> Dims<T> {
    /// A copy of `values`.
    pub fn from_slice(values: &[T]) -> Self {
        if values.len() <= INLINE_DIMS {
            let mut inline = [T::default(); INLINE_DIMS];
            inline[..values.len()].copy_from_slice(values);
            Dims::Inline(values.len() as u8, inline)
        } else {
            Dims::Heap(values.to_vec())
        }
    }

    /// `values`, moved in place when they fit.
    pub fn from_vec(values: Vec<T>) -> Self {
        if values.len() <= INLINE_DIMS {
            Self::from_slice(&values)
        } else {
            Dims::Heap(values)
        }
    }

    /// `n` entries from `f(0)`, `f(1)`, ...
    pub fn from_fn(n: usize, mut f: impl FnMut(usize) -> T) -> Self {
        if n <= INLINE_DIMS {
            let mut inline = [T::default(); INLINE_DIMS];
            for (i, v) in inline.iter_mut().take(n).enumerate() {
                *v = f(i);
            }
            Dims::Inline(n as u8, inline)
        } else {
            Dims::Heap((0..n).map(f).collect())
        }
    }
}

impl<T: Copy + Default> FromIterator<T> for Dims<T> {
    fn from_iter<I: IntoIterator<Item = T>>(values: I) -> Self {
        let mut inline = [T::default(); INLINE_DIMS];
        let mut values = values.into_iter();
        for n in 0..INLINE_DIMS {
            match values.next() {
                Some(v) => inline[n] = v,
                None => return Dims::Inline(n as u8, inline),
            }
        }
        match values.next() {
            None => Dims::Inline(INLINE_DIMS as u8, inline),
            Some(v) => Dims::Heap(inline.into_iter().chain([v]).chain(values).collect()),
        }
    }
}

impl<T: Copy + Default> std::ops::Deref for Dims<T> {
    type Target = [T];

    #[inline]
    fn deref(&self) -> &[T] {
        match self {
            // `min`: no bounds check to branch on (constructors keep n within INLINE_DIMS).
            Dims::Inline(n, values) => &values[..(*n as usize).min(INLINE_DIMS)],
            Dims::Heap(values) => values,
        }
    }
}

impl<T: Copy + Default> std::ops::DerefMut for Dims<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Dims::Inline(n, values) => &mut values[..(*n as usize).min(INLINE_DIMS)],
            Dims::Heap(values) => values,
        }
    }
}

impl<'a, T: Copy + Default> IntoIterator for &'a Dims<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<T: Copy + Default + PartialEq> PartialEq<Vec<T>> for Dims<T> {
    fn eq(&self, other: &Vec<T>) -> bool {
        **self == **other
    }
}

impl<T: Copy + Default + PartialEq> PartialEq for Dims<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Copy + Default + Eq> Eq for Dims<T> {}

impl<T: Copy + Default + std::fmt::Debug> std::fmt::Debug for Dims<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

/// `span` (the lowest and highest element offsets reached) widened by a dimension of `dim`
/// elements `stride` apart, saturating (an extent that large is refused after).
#[inline]
fn widen((lo, hi): (isize, isize), dim: usize, stride: isize) -> (isize, isize) {
    let last = isize::try_from(dim.saturating_sub(1)).unwrap_or(isize::MAX);
    let reach = stride.saturating_mul(last);
    match reach < 0 {
        true => (lo.saturating_add(reach), hi),
        false => (lo, hi.saturating_add(reach)),
    }
}

/// The byte range `[start, end)` from the buffer start that the element offsets `span`
/// reach, for elements of `itemsize` bytes from `byte_offset`, checked against overflow.
#[inline]
fn extent_bytes(
    (lo, hi): (isize, isize),
    itemsize: usize,
    byte_offset: usize,
) -> Result<(isize, isize)> {
    let item = isize::try_from(itemsize).ok();
    let offset = isize::try_from(byte_offset).ok();
    let reach = item.zip(offset).and_then(|(item, offset)| {
        let start = lo.checked_mul(item)?.checked_add(offset)?;
        let end = hi.checked_add(1)?.checked_mul(item)?.checked_add(offset)?;
        Some((start, end))
    });
    reach.ok_or_else(|| Error::invalid("array extent overflows the address space"))
}

/// Whether two shapes are equal, compared in place (a slice comparison calls `memcmp`, which
/// costs more than the few dimensions of a shape).
#[inline]
pub fn same_shape(a: &[usize], b: &[usize]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

/// Whether `strides` are row-major for `shape`, ignoring the strides of size-1 dimensions.
fn c_contiguous(shape: &[usize], strides: &[isize]) -> bool {
    let mut expected: isize = 1;
    for (&dim, &stride) in shape.iter().zip(strides).rev() {
        if dim == 1 {
            continue;
        }
        if stride != expected {
            return false;
        }
        expected = expected.wrapping_mul(dim as isize);
    }
    true
}

/// Row-major strides for `shape`, in place.
fn c_strides_dims(shape: &[usize]) -> Dims<isize> {
    let mut strides = Dims::from_fn(shape.len(), |_| 0isize);
    let mut acc: isize = 1;
    for (stride, &dim) in strides.iter_mut().zip(shape).rev() {
        *stride = acc;
        acc = acc.saturating_mul(dim.max(1) as isize);
    }
    strides
}

/// Row-major (C order) strides for `shape`, in elements.
pub fn c_strides(shape: &[usize]) -> Vec<isize> {
    c_strides_dims(shape).to_vec()
}

/// A byte stride as a stride in elements of `itemsize` bytes, for descriptors that count bytes
/// (the CUDA array interface, the buffer protocol, numpy's arrays).
pub fn element_stride(bytes: i64, itemsize: usize) -> Result<i64> {
    // Every itemsize is a power of two: a mask and a shift, not two divisions (this runs for
    // every dimension of every import).
    if itemsize.is_power_of_two() {
        let mask = itemsize as i64 - 1;
        if bytes & mask == 0 {
            return Ok(bytes >> itemsize.trailing_zeros());
        }
        return Err(Error::Stride { bytes, itemsize });
    }
    match bytes.checked_rem(itemsize as i64) {
        Some(0) => Ok(bytes / itemsize as i64),
        _ => Err(Error::Stride { bytes, itemsize }),
    }
}

/// `ndim` as a number of dimensions, refused where negative or more than [`MAX_NDIM`] (what
/// DLPack consumers and cubridge take).
pub fn check_ndim(ndim: i64) -> Result<usize> {
    match usize::try_from(ndim) {
        Ok(n) if n <= MAX_NDIM => Ok(n),
        _ => Err(Error::Dims {
            ndim,
            max: MAX_NDIM,
        }),
    }
}

/// Refuses strides that are not one per dimension of the shape.
fn check_strides_len(ndim: usize, strides: usize) -> Result<()> {
    match ndim == strides {
        true => Ok(()),
        false => Err(Error::invalid(format!(
            "shape has {ndim} dimensions but strides has {strides}"
        ))),
    }
}

/// Number of elements of `shape`, or an error if it overflows.
pub fn checked_numel(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| {
            Error::invalid(format!(
                "shape {shape:?} has more elements than fit in memory"
            ))
        })
}

/// Numpy broadcasting: align from the right; each pair of dimensions must be equal or one of
/// them 1.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i < n - a.len() {
            1
        } else {
            a[i - (n - a.len())]
        };
        let db = if i < n - b.len() {
            1
        } else {
            b[i - (n - b.len())]
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::Broadcast {
                    left: a.to_vec(),
                    right: b.to_vec(),
                })
            }
        };
    }
    Ok(out)
}

impl Layout {
    /// A C-contiguous layout for `shape` starting at byte 0.
    pub fn contiguous(shape: &[usize]) -> Result<Layout> {
        check_ndim(shape.len() as i64)?;
        let numel = checked_numel(shape)?;
        Ok(Layout::of_parts(
            Dims::from_slice(shape),
            c_strides_dims(shape),
            0,
            numel,
        ))
    }

    /// A layout from trusted parts (shape and strides of equal length).
    pub fn new(shape: Vec<usize>, strides: Vec<isize>, byte_offset: usize) -> Result<Layout> {
        check_strides_len(shape.len(), strides.len())?;
        check_ndim(shape.len() as i64)?;
        let numel = checked_numel(&shape)?;
        Ok(Layout::of_parts(
            Dims::from_vec(shape),
            Dims::from_vec(strides),
            byte_offset,
            numel,
        ))
    }

    /// Validates a layout read from an untrusted descriptor (DLPack, CAI, buffer protocol):
    /// non-negative shape, element count and byte extent that fit the address space. Missing
    /// strides mean C-contiguous, as older producers signal.
    pub fn from_untrusted(
        shape: &[i64],
        strides: Option<&[i64]>,
        byte_offset: u64,
        itemsize: usize,
    ) -> Result<Layout> {
        let ndim = check_ndim(shape.len() as i64)?;
        if let Some(s) = strides {
            check_strides_len(ndim, s.len())?;
        }
        let byte_offset = usize::try_from(byte_offset)
            .map_err(|_| Error::invalid(format!("byte_offset {byte_offset} is too large")))?;
        let mut dims = Dims::from_fn(ndim, |_| 0usize);
        let mut steps = Dims::from_fn(ndim, |_| 0isize);
        // One pass, last dimension first (every import passes here): each value checked as it
        // is converted, with C-contiguity and the elements' span.
        let (mut contiguous, mut span) = (true, (0isize, 0isize));
        let mut c_stride: isize = 1;
        for k in (0..ndim).rev() {
            let d = usize::try_from(shape[k]).map_err(|_| {
                Error::invalid(format!("shape[{k}] is negative or too large: {}", shape[k]))
            })?;
            let stride = match strides {
                None => c_stride,
                Some(s) => isize::try_from(s[k]).map_err(|_| {
                    Error::invalid(format!("stride {} does not fit in isize", s[k]))
                })?,
            };
            (dims[k], steps[k]) = (d, stride);
            contiguous &= d == 1 || stride == c_stride;
            span = widen(span, d, stride);
            c_stride = c_stride.saturating_mul(d.max(1) as isize);
        }
        // Counted first dimension first, as every other constructor counts.
        let numel = checked_numel(&dims)?;
        // The farthest byte reachable must be addressable.
        if numel > 0 {
            extent_bytes(span, itemsize, byte_offset)?;
        }
        Ok(Layout {
            shape: dims,
            strides: steps,
            byte_offset,
            numel,
            contiguous: contiguous || numel == 0,
        })
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The strides, in elements.
    pub fn strides(&self) -> &[isize] {
        &self.strides
    }

    /// Bytes from the buffer start to the first element.
    pub fn byte_offset(&self) -> usize {
        self.byte_offset
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// The layout of `shape` and `strides` (of equal lengths) from `byte_offset`, whose
    /// element count is `numel`, with its contiguity worked out (every constructor ends here).
    fn of_parts(
        shape: Dims<usize>,
        strides: Dims<isize>,
        byte_offset: usize,
        numel: usize,
    ) -> Layout {
        let contiguous = numel == 0 || c_contiguous(&shape, &strides);
        Layout {
            shape,
            strides,
            byte_offset,
            numel,
            contiguous,
        }
    }

    /// Number of elements (validated not to overflow at construction).
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// C-contiguous, ignoring the strides of size-1 dimensions; every empty array is contiguous.
    pub fn is_contiguous(&self) -> bool {
        self.contiguous
    }

    /// The lowest and highest element offsets (relative to the first element) that the layout
    /// touches, or `None` when it has no elements.
    /// One pass: a dimension of 0 ends it (every import and every output's overlap check asks).
    #[inline]
    pub fn element_span(&self) -> Option<(isize, isize)> {
        let mut span = (0isize, 0isize);
        for (&dim, &stride) in self.shape.iter().zip(&self.strides) {
            if dim == 0 {
                return None;
            }
            span = widen(span, dim, stride);
        }
        Some(span)
    }

    /// The byte range `[start, end)` relative to the buffer start that the layout touches, checked
    /// against overflow; `None` when empty.
    #[inline]
    pub fn byte_extent(&self, itemsize: usize) -> Result<Option<(isize, isize)>> {
        // A contiguous layout's elements are the `numel` from the first (every output's
        // overlap check asks, of every operand).
        let span = match (self.numel, self.contiguous) {
            (n @ 1.., true) if n <= isize::MAX as usize => (0, n as isize - 1),
            _ => match self.element_span() {
                Some(span) => span,
                None => return Ok(None),
            },
        };
        extent_bytes(span, itemsize, self.byte_offset).map(Some)
    }

    /// Bytes that `numel` elements of `itemsize` take, refused when the count does not fit the
    /// address space (a view with zero or repeated strides can name more elements than memory
    /// holds, and every size derived from it would wrap).
    pub fn checked_nbytes(&self, itemsize: usize) -> Result<usize> {
        self.numel()
            .checked_mul(itemsize)
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "shape {:?} of {itemsize}-byte elements needs more bytes than the address \
                     space has",
                    self.shape
                ))
            })
    }

    /// Whether two distinct elements may share memory. Exact for zero strides; otherwise a
    /// sufficient test: with the dimensions sorted by stride, each stride must step past
    /// everything the smaller ones reach. Layouts that interleave dimensions without sharing
    /// (rare, and never produced by slicing or transposing) are also reported.
    pub fn may_overlap_itself(&self) -> bool {
        if self.numel() <= 1 || self.is_contiguous() {
            return false;
        }
        let mut dims: Vec<(usize, usize)> = self
            .shape
            .iter()
            .zip(&self.strides)
            .filter(|(&d, _)| d > 1)
            .map(|(&d, &s)| (s.unsigned_abs(), d))
            .collect();
        dims.sort_unstable();
        // Everything the smaller strides reach, in elements from the first (a zero stride
        // reaches nothing new, so it fails the test at once).
        let mut reach: usize = 0;
        for (stride, extent) in dims {
            if stride <= reach {
                return true;
            }
            reach = match stride
                .checked_mul(extent - 1)
                .and_then(|r| r.checked_add(reach))
            {
                Some(r) => r,
                None => return true,
            };
        }
        false
    }

    /// The same elements with the dimensions in reverse order.
    pub fn transposed(&self) -> Layout {
        let n = self.ndim();
        Layout::of_parts(
            Dims::from_fn(n, |i| self.shape[n - 1 - i]),
            Dims::from_fn(n, |i| self.strides[n - 1 - i]),
            self.byte_offset,
            self.numel,
        )
    }

    /// This layout broadcast to `shape` (numpy rules): new leading dimensions and stretched
    /// size-1 dimensions get stride 0.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Layout> {
        let err = || Error::Broadcast {
            left: self.shape.to_vec(),
            right: shape.to_vec(),
        };
        if shape.len() < self.ndim() {
            return Err(err());
        }
        let lead = shape.len() - self.ndim();
        let mut strides = Dims::from_fn(shape.len(), |_| 0isize);
        for (i, &target) in shape.iter().enumerate().skip(lead) {
            let (dim, stride) = (self.shape[i - lead], self.strides[i - lead]);
            strides[i] = match dim {
                d if d == target => stride,
                1 => 0,
                _ => return Err(err()),
            };
        }
        // Wrapping, as a product does in a release build: an element count that does not fit
        // is refused where the broadcast shape is made, not here.
        let numel = shape.iter().fold(1usize, |n, &d| n.wrapping_mul(d));
        Ok(Layout::of_parts(
            Dims::from_slice(shape),
            strides,
            self.byte_offset,
            numel,
        ))
    }
}

/// A loop nest that several same-shaped operands walk together, with dimensions of size 1
/// removed and neighbouring dimensions merged wherever every operand allows it. Innermost last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coalesced<const N: usize> {
    /// The merged shape (at least one dimension; `[0]` when empty).
    pub shape: Dims<usize>,
    /// Each operand's strides over `shape`, in elements.
    pub strides: [Dims<isize>; N],
}

impl<const N: usize> Coalesced<N> {
    /// The plan of `n` elements that every operand holds contiguously: one run.
    pub fn contiguous(n: usize) -> Self {
        Coalesced {
            shape: Dims::from_slice(&[n]),
            strides: std::array::from_fn(|_| Dims::from_slice(&[1])),
        }
    }
}

/// Orders the dimensions of operands that share `shape` so that the first operand's strides
/// fall from outermost to innermost (by magnitude; ties keep their order). For an elementwise
/// operation the order of dimensions is free, and this one lets [`coalesce_of`] merge what the
/// first operand (the output) has contiguous and puts its unit stride innermost.
pub fn order_by_first(shape: &[usize], strides: &[&[isize]]) -> (Vec<usize>, Vec<Vec<isize>>) {
    let mut order: Vec<usize> = (0..shape.len()).collect();
    if let Some(first) = strides.first() {
        order.sort_by_key(|&d| std::cmp::Reverse(first[d].unsigned_abs()));
    }
    (
        order.iter().map(|&d| shape[d]).collect(),
        strides
            .iter()
            .map(|s| order.iter().map(|&d| s[d]).collect())
            .collect(),
    )
}

/// Coalesces operands that share `shape` (see [`Coalesced`]).
pub fn coalesce<const N: usize>(shape: &[usize], strides: [&[isize]; N]) -> Coalesced<N> {
    let (shape, strides) = coalesce_of(shape, &strides);
    Coalesced {
        shape: Dims::from_vec(shape),
        strides: to_array(strides).map(Dims::from_vec),
    }
}

fn to_array<const N: usize>(v: Vec<Vec<isize>>) -> [Vec<isize>; N] {
    let mut it = v.into_iter();
    std::array::from_fn(|_| it.next().unwrap_or_default())
}

/// [`coalesce`] for any number of operands: the merged shape and each operand's strides.
pub fn coalesce_of(shape: &[usize], strides: &[&[isize]]) -> (Vec<usize>, Vec<Vec<isize>>) {
    let n = strides.len();
    if shape.contains(&0) {
        return (vec![0], vec![vec![1]; n]);
    }
    let keep: Vec<usize> = (0..shape.len()).filter(|&i| shape[i] != 1).collect();
    let mut out_shape: Vec<usize> = Vec::with_capacity(keep.len());
    let mut out_strides: Vec<Vec<isize>> = vec![Vec::new(); n];
    for &i in &keep {
        let mergeable = !out_shape.is_empty()
            && (0..n).all(|k| out_strides[k].last() == Some(&(strides[k][i] * shape[i] as isize)));
        if mergeable {
            let last = out_shape.len() - 1;
            out_shape[last] *= shape[i];
            for k in 0..n {
                out_strides[k][last] = strides[k][i];
            }
        } else {
            out_shape.push(shape[i]);
            for k in 0..n {
                out_strides[k].push(strides[k][i]);
            }
        }
    }
    if out_shape.is_empty() {
        out_shape.push(1);
        for s in &mut out_strides {
            s.push(1);
        }
    }
    (out_shape, out_strides)
}

/// The elements of a strided array in memory, for [`may_share_memory`]: the address of its
/// first element, the bytes per element, and its shape and element strides.
#[derive(Clone, Copy, Debug)]
pub struct Footprint<'a> {
    /// Address of the first element.
    pub first: usize,
    /// Bytes per element.
    pub itemsize: usize,
    /// Extent of each dimension.
    pub shape: &'a [usize],
    /// Stride of each dimension, in elements (any sign).
    pub strides: &'a [isize],
}

impl Footprint<'_> {
    /// The lowest address the elements' bytes take, and the terms `(coefficient, bound)` of
    /// every byte's address above it: `lowest + sum(c * x)` for `0 <= x <= bound` (a term per
    /// dimension that moves, with its stride in bytes, and one for the bytes of an element).
    /// `None` for an array without elements.
    fn terms(&self) -> Option<(i128, Vec<(i128, i128)>)> {
        if self.shape.contains(&0) {
            return None;
        }
        let item = self.itemsize as i128;
        let mut lowest = self.first as i128;
        let mut terms = Vec::with_capacity(self.shape.len() + 1);
        for (&n, &s) in self.shape.iter().zip(self.strides) {
            let (c, bound) = (s as i128 * item, n as i128 - 1);
            if c < 0 {
                // Counted from the other end, the dimension steps up.
                lowest += c * bound;
            }
            terms.push((c.abs(), bound));
        }
        terms.push((1, item - 1));
        Some((lowest, terms))
    }
}

/// Search steps that [`may_share_memory`] takes before it stops deciding.
pub const SHARE_WORK: usize = 1 << 12;

/// Whether an element of `a` and an element of `b` may share a byte: `false` only where none
/// does. An address both take solves one linear equation in the arrays' indices, each bounded
/// by its extent (numpy's `shares_memory` solves the same); a depth-first search with range and
/// divisibility pruning decides it exactly for disjoint row or column blocks, interleaved
/// strides and whatever slicing makes, within `max_work` steps. Beyond them it answers `true`
/// without deciding, as numpy's `may_share_memory` does.
pub fn may_share_memory(a: &Footprint<'_>, b: &Footprint<'_>, max_work: usize) -> bool {
    let (Some((lowest_a, mut terms)), Some((lowest_b, terms_b))) = (a.terms(), b.terms()) else {
        return false;
    };
    // lowest_a + sum(c x) = lowest_b + sum(c y); with b's indices counted from their ends
    // (y = bound - y'), every coefficient is positive and the sum a constant.
    let span_b: i128 = terms_b.iter().map(|&(c, bound)| c * bound).sum();
    terms.extend(terms_b);
    Share::new(terms, max_work).solve(0, lowest_b - lowest_a + span_b) != Some(false)
}

/// The search of [`may_share_memory`]: is `target = sum(c_k x_k)` with `0 <= x_k <= bound_k`?
struct Share {
    /// `(c, bound)`, one per coefficient (equal ones merged), largest first.
    terms: Vec<(i128, i128)>,
    /// `reach[k]`: the largest sum of the terms from `k` on (one more entry: 0).
    reach: Vec<i128>,
    /// `gcds[k]`: the gcd of the coefficients from `k` on (one more entry: 0).
    gcds: Vec<i128>,
    /// Steps left.
    work: usize,
}

impl Share {
    fn new(mut terms: Vec<(i128, i128)>, work: usize) -> Share {
        terms.retain(|&(c, bound)| c > 0 && bound > 0);
        terms.sort_unstable_by_key(|&(c, _)| std::cmp::Reverse(c));
        // Two terms of one coefficient reach exactly the sums of one with both bounds.
        terms.dedup_by(|next, kept| {
            let same = next.0 == kept.0;
            if same {
                kept.1 += next.1;
            }
            same
        });
        let n = terms.len();
        let (mut reach, mut gcds) = (vec![0; n + 1], vec![0; n + 1]);
        for k in (0..n).rev() {
            reach[k] = reach[k + 1] + terms[k].0 * terms[k].1;
            gcds[k] = gcd(gcds[k + 1], terms[k].0);
        }
        Share {
            terms,
            reach,
            gcds,
            work,
        }
    }

    /// Whether the terms from `k` on sum to `target`; `None` once the steps run out.
    fn solve(&mut self, k: usize, target: i128) -> Option<bool> {
        if target < 0 || target > self.reach[k] {
            return Some(false);
        }
        if k == self.terms.len() {
            return Some(target == 0);
        }
        if target % self.gcds[k] != 0 {
            return Some(false);
        }
        self.work = self.work.checked_sub(1)?;
        let (c, bound) = self.terms[k];
        // The rest reaches at most reach[k + 1]: x may not leave more than that.
        let low = (target - self.reach[k + 1] + c - 1).div_euclid(c).max(0);
        for x in (low..=bound.min(target / c)).rev() {
            if self.solve(k + 1, target - x * c)? {
                return Some(true);
            }
        }
        Some(false)
    }
}

fn gcd(a: i128, b: i128) -> i128 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte address of a footprint, counted one by one.
    fn bytes_of(f: &Footprint<'_>) -> std::collections::BTreeSet<i128> {
        let mut all = std::collections::BTreeSet::new();
        let n: usize = f.shape.iter().product();
        for flat in 0..n {
            let (mut rest, mut at) = (flat, f.first as i128);
            for (&d, &s) in f.shape.iter().zip(f.strides).rev() {
                at += (rest % d) as i128 * s as i128 * f.itemsize as i128;
                rest /= d;
            }
            all.extend((0..f.itemsize as i128).map(|b| at + b));
        }
        all
    }

    #[test]
    fn shared_memory_is_decided_for_blocks_and_interleaved_strides() {
        let fp = |first, itemsize, shape, strides| Footprint {
            first,
            itemsize,
            shape,
            strides,
        };
        // Columns 0..3 and 3..6 of a 4 x 6 float32 array (byte 1000 on), rows 0..2 and 2..4.
        let left = fp(1000, 4, &[4, 3], &[6, 1]);
        let right = fp(1012, 4, &[4, 3], &[6, 1]);
        let (top, bottom) = (fp(1000, 4, &[2, 6], &[6, 1]), fp(1048, 4, &[2, 6], &[6, 1]));
        let (even, odd) = (fp(1000, 4, &[4], &[2]), fp(1004, 4, &[4], &[2]));
        for (a, b) in [(left, right), (top, bottom), (even, odd)] {
            assert!(!may_share_memory(&a, &b, SHARE_WORK), "{a:?} {b:?}");
            assert!(!may_share_memory(&b, &a, SHARE_WORK), "{b:?} {a:?}");
        }
        // Undecided for want of steps, interleaved blocks may share; apart, bounds decide.
        assert!(may_share_memory(&left, &right, 0) && may_share_memory(&even, &odd, 0));
        assert!(!may_share_memory(&top, &bottom, 0));
        let shifted = fp(1008, 4, &[3], &[2]);
        let reversed = fp(1000 + 4 * 7, 4, &[8], &[-1]);
        let all = fp(1000, 4, &[8], &[1]);
        for (a, b) in [(even, shifted), (left, left), (all, reversed), (all, odd)] {
            assert!(may_share_memory(&a, &b, SHARE_WORK), "{a:?} {b:?}");
        }
        // Bytes of an element: a uint8 view at byte 3 of every int32 meets them; at byte 16 on,
        // past them, it does not.
        let ints = fp(1000, 4, &[4], &[1]);
        assert!(may_share_memory(
            &ints,
            &fp(1003, 1, &[4], &[4]),
            SHARE_WORK
        ));
        assert!(!may_share_memory(
            &ints,
            &fp(1016, 1, &[4], &[4]),
            SHARE_WORK
        ));
        // Nothing is shared with an empty array.
        assert!(!may_share_memory(
            &ints,
            &fp(1000, 4, &[0, 3], &[3, 1]),
            SHARE_WORK
        ));
    }

    #[test]
    fn shared_memory_agrees_with_counting_every_byte() {
        // A fixed pseudo-random walk over small layouts (strides of any sign, zero included).
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = |m: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % m
        };
        for _ in 0..3000 {
            let mut make = || {
                let ndim = 1 + next(3) as usize;
                let shape: Vec<usize> = (0..ndim).map(|_| next(4) as usize).collect();
                let strides: Vec<isize> = (0..ndim).map(|_| next(9) as isize - 4).collect();
                let itemsize = [1, 2, 4, 8][next(4) as usize];
                (100 + next(40) as usize, itemsize, shape, strides)
            };
            let (a, b) = (make(), make());
            let fa = Footprint {
                first: a.0,
                itemsize: a.1,
                shape: &a.2,
                strides: &a.3,
            };
            let fb = Footprint {
                first: b.0,
                itemsize: b.1,
                shape: &b.2,
                strides: &b.3,
            };
            let shared = !bytes_of(&fa).is_disjoint(&bytes_of(&fb));
            assert_eq!(
                may_share_memory(&fa, &fb, SHARE_WORK),
                shared,
                "{fa:?} {fb:?}"
            );
        }
    }

    #[test]
    fn dims_collect_in_place_up_to_four_and_on_the_heap_beyond() {
        for n in 0..=6usize {
            let d: Dims<usize> = (10..10 + n).collect();
            assert_eq!(&d[..], &(10..10 + n).collect::<Vec<_>>()[..]);
            assert_eq!(matches!(d, Dims::Inline(..)), n <= INLINE_DIMS, "{n}");
        }
    }

    #[test]
    fn layouts_of_few_and_many_dimensions_behave_alike() {
        // Four dimensions are held in place, six on the heap; both answer the same way.
        for shape in [vec![2usize, 3, 4, 5], vec![2, 1, 3, 1, 4, 2]] {
            let n = shape.len();
            let c = Layout::contiguous(&shape).unwrap();
            assert_eq!(c.shape(), &shape[..]);
            assert_eq!(c.strides(), &c_strides(&shape)[..]);
            assert!(c.is_contiguous());
            let as_i64: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
            let strides: Vec<i64> = c.strides().iter().map(|&s| s as i64).collect();
            let untrusted = Layout::from_untrusted(&as_i64, Some(&strides), 0, 4).unwrap();
            assert_eq!(untrusted, c);
            assert_eq!(Layout::from_untrusted(&as_i64, None, 0, 4).unwrap(), c);
            let t = c.transposed();
            let reversed: Vec<usize> = shape.iter().rev().copied().collect();
            assert_eq!(t.shape(), &reversed[..]);
            assert_eq!(t.strides()[0], 1);
            assert_eq!(t.strides()[n - 1], c.strides()[0]);
            assert!(!t.is_contiguous());
            assert_eq!(t.transposed(), c);
            let mut wide = vec![7usize];
            wide.extend(&shape);
            let b = c.broadcast_to(&wide).unwrap();
            assert_eq!(b.shape(), &wide[..]);
            assert_eq!(b.strides()[0], 0);
            assert_eq!(&b.strides()[1..], c.strides());
        }
        // Negative extents are refused whatever the rank.
        assert!(Layout::from_untrusted(&[2, -1], None, 0, 4).is_err());
        assert!(Layout::from_untrusted(&[1, 1, 1, 1, 2, -1], None, 0, 4).is_err());
    }

    #[test]
    fn order_by_first_puts_the_outputs_unit_stride_last() {
        // out transposed (strides 1, 3), input contiguous (strides 2, 1).
        let (shape, strides) = order_by_first(&[3, 2], &[&[1, 3], &[2, 1]]);
        assert_eq!(shape, vec![2, 3]);
        assert_eq!(strides, [vec![3, 1], vec![1, 2]]);
        // Once ordered, a transposed out and a transposed input merge into one dimension.
        let (shape, strides) = order_by_first(&[3, 2], &[&[1, 3], &[1, 3]]);
        let plan = coalesce(&shape, [&strides[0], &strides[1]]);
        assert_eq!(plan.shape, vec![6]);
        // Negative strides count by magnitude; ties keep their order.
        let (_, strides) = order_by_first(&[2, 2, 2], &[&[-1, 4, -2], &[1, 2, 3]]);
        assert_eq!(strides, [vec![4, -2, -1], vec![2, 3, 1]]);
    }

    #[test]
    fn c_strides_and_contiguity() {
        assert_eq!(c_strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(c_strides(&[]), Vec::<isize>::new());
        let l = Layout::contiguous(&[2, 3]).unwrap();
        assert!(l.is_contiguous());
        // Transposed is not contiguous.
        let t = Layout::new(vec![3, 2], vec![1, 3], 0).unwrap();
        assert!(!t.is_contiguous());
        // Size-1 dimensions may carry any stride.
        let s = Layout::new(vec![2, 1, 3], vec![3, 999, 1], 0).unwrap();
        assert!(s.is_contiguous());
        // Empty arrays are contiguous whatever their strides.
        let e = Layout::new(vec![0, 3], vec![-7, 5], 0).unwrap();
        assert!(e.is_contiguous());
        // 0-d is contiguous.
        assert!(Layout::contiguous(&[]).unwrap().is_contiguous());
    }

    #[test]
    fn broadcasting() {
        assert_eq!(broadcast_shapes(&[3, 1], &[4]).unwrap(), vec![3, 4]);
        assert_eq!(broadcast_shapes(&[], &[2, 3]).unwrap(), vec![2, 3]);
        assert_eq!(broadcast_shapes(&[0], &[1]).unwrap(), vec![0]);
        assert_eq!(
            broadcast_shapes(&[5, 1, 4], &[3, 1]).unwrap(),
            vec![5, 3, 4]
        );
        assert!(matches!(
            broadcast_shapes(&[3], &[4]),
            Err(Error::Broadcast { .. })
        ));
        assert!(broadcast_shapes(&[2, 0], &[3]).is_err());
        let l = Layout::contiguous(&[3, 1])
            .unwrap()
            .broadcast_to(&[2, 3, 4])
            .unwrap();
        assert_eq!(l.strides(), &[0, 1, 0]);
        assert!(Layout::contiguous(&[3])
            .unwrap()
            .broadcast_to(&[4])
            .is_err());
        assert!(Layout::contiguous(&[2, 3])
            .unwrap()
            .broadcast_to(&[3])
            .is_err());
    }

    #[test]
    fn spans_and_extents() {
        let l = Layout::new(vec![2, 3], vec![-3, 1], 24).unwrap();
        assert_eq!(l.element_span(), Some((-3, 2)));
        assert_eq!(l.byte_extent(4).unwrap(), Some((12, 36)));
        assert_eq!(
            Layout::contiguous(&[0]).unwrap().byte_extent(4).unwrap(),
            None
        );
        let huge = Layout::new(vec![2], vec![isize::MAX / 2], 0).unwrap();
        assert!(huge.byte_extent(8).is_err());
    }

    #[test]
    fn counts_and_contiguity_are_worked_out_as_the_layout_reads() {
        // Every constructor's cached element count and contiguity against the definitions.
        let shapes: [&[usize]; 7] = [&[], &[0], &[5], &[2, 3], &[3, 1, 4], &[2, 0, 3], &[1, 1]];
        for shape in shapes {
            let c = c_strides(shape);
            let mut variants = vec![c.clone()];
            variants.push(c.iter().map(|s| -s).collect());
            variants.push(c.iter().map(|s| s * 2).collect());
            variants.push(vec![0; shape.len()]);
            variants.push(c.iter().rev().copied().collect());
            for strides in variants {
                let as_i64: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
                let s64: Vec<i64> = strides.iter().map(|&s| s as i64).collect();
                let new = Layout::new(shape.to_vec(), strides.clone(), 0).unwrap();
                let read = Layout::from_untrusted(&as_i64, Some(&s64), 0, 4).unwrap();
                let numel: usize = shape.iter().product();
                let contiguous = numel == 0 || c_contiguous(shape, &strides);
                for l in [&new, &read, &read.broadcast_to(shape).unwrap()] {
                    assert_eq!((l.numel(), l.is_contiguous()), (numel, contiguous));
                    assert_eq!(l.element_span(), new.element_span());
                    let spanned = l.element_span().map(|s| extent_bytes(s, 4, 0).unwrap());
                    assert_eq!(l.byte_extent(4).unwrap(), spanned);
                }
                let t = read.transposed();
                let rev: Vec<usize> = shape.iter().rev().copied().collect();
                let rev_strides: Vec<isize> = strides.iter().rev().copied().collect();
                assert_eq!(
                    t.is_contiguous(),
                    numel == 0 || c_contiguous(&rev, &rev_strides)
                );
            }
            let implied = Layout::from_untrusted(
                &shape.iter().map(|&d| d as i64).collect::<Vec<_>>(),
                None,
                0,
                4,
            )
            .unwrap();
            assert_eq!(implied, Layout::contiguous(shape).unwrap());
            assert!(implied.is_contiguous());
        }
        // Counted first dimension first, as `checked_numel` counts, whatever the order of zeros.
        let big = 1i64 << 62;
        assert!(Layout::from_untrusted(&[0, big, 4], None, 0, 1).is_ok());
        assert!(Layout::from_untrusted(&[big, 4, 0], None, 0, 1).is_err());
        // A dimension past isize::MAX reaches past the address space.
        assert!(Layout::contiguous(&[1 << 63])
            .unwrap()
            .byte_extent(1)
            .is_err());
    }

    #[test]
    fn untrusted_descriptors_are_checked() {
        let ok = Layout::from_untrusted(&[2, 3], None, 0, 4).unwrap();
        assert_eq!(ok.strides(), &[3, 1]);
        assert!(Layout::from_untrusted(&[-1], None, 0, 4).is_err());
        assert!(Layout::from_untrusted(&[2, 3], Some(&[1]), 0, 4).is_err());
        assert!(Layout::from_untrusted(&[i64::MAX, 4], None, 0, 4).is_err());
        assert!(Layout::from_untrusted(&[2], Some(&[i64::MAX]), 0, 4).is_err());
        assert_eq!(
            Layout::from_untrusted(&[1; 65], None, 0, 4),
            Err(Error::Dims {
                ndim: 65,
                max: MAX_NDIM
            })
        );
        assert_eq!(
            check_ndim(-1),
            Err(Error::Dims {
                ndim: -1,
                max: MAX_NDIM
            })
        );
        assert!(Layout::from_untrusted(&[1; 64], None, 0, 4).is_ok());
    }

    #[test]
    fn byte_strides_become_element_strides() {
        assert_eq!(
            [(12, 4), (-8, 8), (0, 2)].map(|(b, i)| element_stride(b, i)),
            [Ok(3), Ok(-1), Ok(0)]
        );
        for (bytes, itemsize) in [(6, 4), (-6, 4), (4, 0), (8, 3)] {
            assert_eq!(
                element_stride(bytes, itemsize),
                Err(Error::Stride { bytes, itemsize })
            );
        }
    }

    #[test]
    fn self_overlap() {
        // Each row: shape, strides, whether two elements may share memory.
        #[rustfmt::skip]
        let cases: [(&[usize], &[isize], bool); 11] = [
            (&[3], &[0], true),
            (&[1], &[0], false),
            (&[3], &[1], false),
            (&[3, 4], &[4, 1], false),
            (&[4, 3], &[1, 4], false),       // a transpose
            (&[3, 4], &[-4, -1], false),     // reversed
            (&[3, 4], &[8, 2], false),       // every other element
            (&[4, 4], &[1, 1], true),        // a sliding window
            (&[3, 3], &[2, 1], true),
            (&[2, 1 << 62], &[1 << 62, 2], true), // reach overflows: refused
            (&[0, 5], &[0, 0], false),       // empty
        ];
        for (shape, strides, overlaps) in cases {
            let l = Layout::new(shape.to_vec(), strides.to_vec(), 0).unwrap();
            assert_eq!(l.may_overlap_itself(), overlaps, "{shape:?} {strides:?}");
        }
        assert!(Layout::contiguous(&[1; 65]).is_err());
        let huge = Layout::new(vec![1 << 62], vec![0], 0).unwrap();
        assert!(huge.checked_nbytes(1).is_ok() && huge.checked_nbytes(2).is_err());
    }

    #[test]
    fn coalescing_merges_contiguous_runs() {
        let c = coalesce(&[2, 3, 4], [&[12, 4, 1], &[12, 4, 1]]);
        assert_eq!(c.shape, vec![24]);
        assert_eq!(c.strides, [vec![1], vec![1]]);
        // A broadcast operand stops merging where its strides break the run.
        let c = coalesce(&[2, 3, 4], [&[12, 4, 1], &[0, 4, 1]]);
        assert_eq!(c.shape, vec![2, 12]);
        assert_eq!(c.strides, [vec![12, 1], vec![0, 1]]);
        // Size-1 dimensions vanish; 0-d becomes one element.
        let c = coalesce(&[1, 5, 1], [&[5, 1, 1]]);
        assert_eq!(c.shape, vec![5]);
        let c = coalesce::<1>(&[], [&[]]);
        assert_eq!(c.shape, vec![1]);
        let c = coalesce(&[3, 0], [&[1, 1]]);
        assert_eq!(c.shape, vec![0]);
        // Transposed stays 2-d.
        let c = coalesce(&[3, 2], [&[1, 3], &[2, 1]]);
        assert_eq!(c.shape, vec![3, 2]);
    }
}
