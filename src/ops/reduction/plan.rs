//! The plan of a reduction: the input's dimensions split into kept ones (one output element
//! each) and reduced ones, each group reordered and merged where the layouts allow, and the
//! strategy of the kernel (`kernels/reduce.cuh`) chosen from the shape alone:
//!
//! - a reduced dimension of unit stride (rows, and whole contiguous arrays): a warp per output
//!   element (rows of a few thousand elements, or enough rows to fill the device with warps),
//!   else, and where fewer than 8 outputs leave a block's warps idle, a block of 256 threads,
//!   moving packs of 16 bytes where the addresses allow; rows of at most 16 elements one thread
//!   each, which read packs where the rows lie one after another from an aligned address (a
//!   pack holding whole rows, or a row whole packs);
//! - otherwise (columns): one thread per output element, neighbouring threads on neighbouring
//!   columns, or where the columns are contiguous and aligned, one thread per pack of 16 bytes
//!   of neighbouring columns (each column's elements in the same order);
//! - where that leaves the device short of work, each output's elements are split into a fixed
//!   number of chunks, a row of blocks each, whose threads take the output's packs in turn (so
//!   the whole grid reads one window of neighbouring addresses at a time), and whose partial
//!   results a second kernel reduces in order.
//!
//! Nothing in the plan depends on addresses, streams or timing but the choice of vector loads,
//! which leaves the order of every operation as it is: the same shape, dtypes and device give
//! the same bits.

use crate::error::{Error, Result};
use crate::layout::{coalesce_of, order_by_first, MAX_DIMS};
use crate::ops::plan::Operand;

/// Threads of a block of the reduction kernels (a multiple of every group).
pub const BLOCK: u32 = 256;
/// Threads that reduce one output's chunks in the second kernel: the block where the first
/// kernel gives each output a block (few outputs, each with many chunks), else a warp.
pub fn final_group(group: u32) -> u32 {
    if group == BLOCK {
        BLOCK
    } else {
        32
    }
}
/// The most chunks an output's elements are split into (rows of blocks: at most 65535).
const MAX_CHUNKS: usize = 4096;
/// Packs a thread loads before it folds them (`CBR_UNROLL` in `kernels/reduce.cuh`).
const UNROLL: usize = 4;
/// Rows of at most this many elements take one thread each (`CBR_SHORT_ROW` in
/// `kernels/reduce.cuh`, whose short rows in packs read at most this many).
const SHORT_ROW: usize = 16;
/// Resident threads per SM: the most an SM holds.
const THREADS_PER_SM: usize = 2048;
/// Threads per SM that the split into chunks aims at: half of what an SM holds, so that every
/// chunk's block runs in one wave whatever registers a kernel needs (up to 64 a thread), each
/// thread with several packs in flight. Measured on an H200 (float32 sum of 2^28 elements, all
/// of them: 0.92x torch's bandwidth aiming at 2048, 0.81x at 1536, 0.97x at 1024).
const SPLIT_THREADS_PER_SM: usize = 1024;
/// Bytes that the threads of columns in packs aim to have in flight per SM: each thread loads
/// `width` packs at a time (a pack of neighbouring columns, 16 bytes of the widest input, from
/// each of `width` rows), so narrow types aim at fewer threads (64 KiB: 1024 threads for
/// float32, 512 for bfloat16), within [`COLUMN_THREADS_PER_SM`]. Measured on an H100, sums over
/// the first axis of square arrays, time against torch.sum's: bfloat16 at 2^24 / 2^26 / 2^28
/// elements 0.71x / 0.85x / 0.93x aiming at 1024 threads, 0.95x / 1.00x / 0.99x at 512; float32
/// 0.97x-1.00x at 1024, worse at 512 (0.97x at 2^28) and at 2048 (0.79x-0.96x).
const COLUMN_BYTES_PER_SM: usize = 64 << 10;
/// The threads per SM that columns in packs aim at, whatever the width: 1-byte types (packs of
/// 16) stay at the 512 that was measured rather than the 256 the bytes would give.
const COLUMN_THREADS_PER_SM: std::ops::RangeInclusive<usize> = 512..=SPLIT_THREADS_PER_SM;

/// The plan of one reduction; see the module documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReductionPlan {
    /// Kept extents, merged, innermost last.
    pub kept: Vec<usize>,
    /// Reduced extents, merged, innermost last.
    pub red: Vec<usize>,
    /// Each element input's strides over `kept`.
    pub in_kept: Vec<Vec<isize>>,
    /// Each element input's strides over `red`.
    pub in_red: Vec<Vec<isize>>,
    /// Each element output's strides over `kept`.
    pub out_kept: Vec<Vec<isize>>,
    /// Output elements.
    pub n_out: usize,
    /// Elements reduced into each.
    pub n_red: usize,
    /// Threads that reduce one output element (1, 32 or 256).
    pub group: u32,
    /// Chunks each output's elements are split into (1: no second kernel), their threads
    /// taking the output's packs in turn.
    pub chunks: usize,
    /// Whether the kernel moves packs of `width` elements (same order of operations).
    pub vector: bool,
    /// Outputs a thread reduces: 1, or with one thread an output (`group` 1) and packs, the
    /// elements' width (columns in packs) or the rows a pack holds (short rows in packs), in
    /// the same order as one at a time.
    pub per_thread: usize,
    /// Short rows in packs: the rows each thread reads from one pack (1: a row of whole
    /// packs); 0: another kernel.
    pub rows: u32,
}

/// What a reduction reads and writes, over the input's broadcast `shape`.
pub struct Walk<'a> {
    /// The broadcast shape of the element inputs.
    pub shape: &'a [usize],
    /// The reduced axes, sorted, each once.
    pub axes: &'a [usize],
    /// The element inputs over `shape`.
    pub inputs: &'a [Operand<'a>],
    /// The element outputs' strides over the kept axes, in order.
    pub outputs: &'a [&'a [isize]],
}

impl ReductionPlan {
    /// Plans `walk`. `c_order`: the reduced dimensions keep C order (the map expression reads
    /// `_J`, their C-order index); `merge`: dimensions are merged (CuPy's `reduce_dims`);
    /// `width`: elements per pack; `sms`: the device's multiprocessors.
    pub fn new(
        walk: &Walk<'_>,
        c_order: bool,
        merge: bool,
        width: usize,
        sms: usize,
    ) -> Result<ReductionPlan> {
        let kept_axes: Vec<usize> = (0..walk.shape.len())
            .filter(|d| !walk.axes.contains(d))
            .collect();
        let pick = |s: &[isize], axes: &[usize]| axes.iter().map(|&d| s[d]).collect::<Vec<_>>();
        let extents = |axes: &[usize]| axes.iter().map(|&d| walk.shape[d]).collect::<Vec<_>>();
        // Kept: every operand walks them, inputs first, ordered by the first input's strides.
        let mut kept_strides: Vec<Vec<isize>> = (walk.inputs.iter())
            .map(|o| pick(o.strides, &kept_axes))
            .collect();
        kept_strides.extend(walk.outputs.iter().map(|s| s.to_vec()));
        let (kept, kept_strides) = group(&extents(&kept_axes), kept_strides, merge, true)?;
        let red_strides = (walk.inputs.iter())
            .map(|o| pick(o.strides, walk.axes))
            .collect();
        let (red, in_red) = group(&extents(walk.axes), red_strides, merge, !c_order)?;
        let nin = walk.inputs.len();
        let (n_out, n_red) = (kept.iter().product(), red.iter().product());
        let unit_red = red.len() == 1 && in_red.iter().all(|s| s[0] == 1);
        let unit_kept = kept_strides.first().is_none_or(|s| s[s.len() - 1] == 1);
        let (group, mut chunks) = strategy(n_out, n_red, (unit_red, unit_kept), width, sms);
        // Packs start at aligned addresses: the first elements' are, and the kept strides are
        // multiples of the pack (but the innermost for columns, whose threads take packs of it;
        // and but those of extent 1, never stepped: a whole array's one output).
        let aligned = |inner: usize| {
            walk.inputs.iter().zip(&kept_strides).all(|(o, s)| {
                let outer = s[..s.len() - inner].iter().zip(&kept);
                at_pack(o, width)
                    && outer
                        .filter(|&(_, &e)| e > 1)
                        .all(|(&k, _)| k % width as isize == 0)
            })
        };
        // Columns in packs: every element input has unit strides along the outputs, whose
        // innermost extent the pack divides, and its rows at aligned addresses. The split
        // is that of the packs whatever the addresses, so that the order stays theirs.
        let columns = width > 1
            && group == 1
            && red.len() == 1
            && kept.last().is_some_and(|&k| k % width == 0)
            && (kept_strides[..nin].iter()).all(|s| s.last() == Some(&1))
            && in_red.iter().all(|s| s[0] % width as isize == 0);
        if columns {
            let work = n_out.saturating_mul(n_red);
            let (fewest, most) = COLUMN_THREADS_PER_SM.into_inner();
            let per_sm = (COLUMN_BYTES_PER_SM / (width * 16)).clamp(fewest, most);
            chunks = split((n_out / width, work), n_red / (2 * width), (sms, per_sm));
        }
        // Short rows in packs: one thread a row in one chunk (rows split into chunks keep the
        // order of their split, with or without packs), every element input's rows one after
        // another from an aligned address, a pack holding whole rows (or a row whole packs),
        // and no pack across the innermost kept extent.
        let per_pack = rows_per_pack(n_red, width);
        let short_rows = !columns
            && group == 1
            && chunks == 1
            && unit_red
            && n_red <= SHORT_ROW
            && per_pack > 0
            && aligned(1)
            && kept.last().is_some_and(|&k| k % per_pack == 0)
            && (kept_strides[..nin].iter()).all(|s| s.last() == Some(&(n_red as isize)));
        let rows = if short_rows { per_pack } else { 0 };
        let per_thread = match () {
            _ if columns && aligned(1) => width,
            _ if rows > 0 => rows,
            _ => 1,
        };
        Ok(ReductionPlan {
            vector: width > 1
                && (group > 1 && unit_red && aligned(0) || per_thread > 1 || rows > 0),
            per_thread,
            rows: rows as u32,
            out_kept: kept_strides[nin..].to_vec(),
            in_kept: kept_strides[..nin].to_vec(),
            kept,
            red,
            in_red,
            n_out,
            n_red,
            group,
            chunks,
        })
    }
}

/// The rows of `n_red` elements that a pack of `width` holds whole (1: a row holds whole
/// packs), or 0 where neither holds the other whole.
fn rows_per_pack(n_red: usize, width: usize) -> usize {
    match () {
        _ if width < 2 || n_red < 2 => 0,
        _ if width.is_multiple_of(n_red) => width / n_red,
        _ if n_red.is_multiple_of(width) => 1,
        _ => 0,
    }
}

/// Whether `o`'s first element starts a pack of `width` elements.
fn at_pack(o: &Operand<'_>, width: usize) -> bool {
    o.address.is_multiple_of(width * o.itemsize)
}

/// Everything of a [`Walk`] and its pack width that [`ReductionPlan::new`] reads, owned: a
/// later call whose walk [`Walked::matches`] it (a repeated call: the same shapes, strides and
/// alignments) has the same plan.
#[derive(Debug)]
pub struct Walked {
    shape: Vec<usize>,
    axes: Vec<usize>,
    /// Per element input: its strides, bytes per element, and whether it starts at a pack.
    inputs: Vec<(Vec<isize>, usize, bool)>,
    outputs: Vec<Vec<isize>>,
    width: usize,
}

impl Walked {
    /// The record of `walk` with packs of `width`.
    pub fn of(walk: &Walk<'_>, width: usize) -> Walked {
        Walked {
            shape: walk.shape.to_vec(),
            axes: walk.axes.to_vec(),
            inputs: (walk.inputs.iter())
                .map(|o| (o.strides.to_vec(), o.itemsize, at_pack(o, width)))
                .collect(),
            outputs: walk.outputs.iter().map(|s| s.to_vec()).collect(),
            width,
        }
    }

    /// Whether `walk` with packs of `width` is what this record holds.
    pub fn matches(&self, walk: &Walk<'_>, width: usize) -> bool {
        let input = |((s, itemsize, packed), o): (&(Vec<isize>, usize, bool), &Operand<'_>)| {
            s[..] == *o.strides && *itemsize == o.itemsize && *packed == at_pack(o, width)
        };
        self.width == width
            && self.shape[..] == *walk.shape
            && self.axes[..] == *walk.axes
            && self.inputs.len() == walk.inputs.len()
            && self.inputs.iter().zip(walk.inputs).all(input)
            && self.outputs.len() == walk.outputs.len()
            && (self.outputs.iter().zip(walk.outputs)).all(|(a, b)| a[..] == **b)
    }
}

/// Dimensions of `extents` that `strides` (one list per operand) walk together: ordered by the
/// first operand's strides where `reorder`, merged where `merge`, at most [`MAX_DIMS`].
fn group(
    extents: &[usize],
    strides: Vec<Vec<isize>>,
    merge: bool,
    reorder: bool,
) -> Result<(Vec<usize>, Vec<Vec<isize>>)> {
    let refs: Vec<&[isize]> = strides.iter().map(|s| &s[..]).collect();
    let (extents, strides) = match (reorder && !refs.is_empty(), merge) {
        (true, true) => {
            let (e, s) = order_by_first(extents, &refs);
            let refs: Vec<&[isize]> = s.iter().map(|s| &s[..]).collect();
            coalesce_of(&e, &refs)
        }
        (false, true) => coalesce_of(extents, &refs),
        (_, false) if extents.is_empty() => (vec![1], vec![vec![1]; strides.len()]),
        (_, false) => (extents.to_vec(), strides),
    };
    if extents.len() > MAX_DIMS {
        return Err(Error::invalid(format!(
            "a reduction walks at most {MAX_DIMS} kept and {MAX_DIMS} reduced dimensions after \
             merging contiguous ones; this one needs {}",
            extents.len()
        )));
    }
    Ok((extents, strides))
}

/// The threads per output (`group`) and the chunks for `n_out` outputs of `n_red` elements
/// each, where the reduced dimension has unit stride (`unit_red`) or the innermost kept one has
/// (`unit_kept`); `width` elements per pack, `sms` multiprocessors.
pub fn strategy(
    n_out: usize,
    n_red: usize,
    (unit_red, unit_kept): (bool, bool),
    width: usize,
    sms: usize,
) -> (u32, usize) {
    // A warp an output where it has a few thousand elements or there are enough outputs to
    // fill the device with warps (each streams its row, with no block-wide step between rows);
    // else the block.
    let resident = sms.max(1) * THREADS_PER_SM;
    // Outputs too few to fill a block with their warps take a block each where every thread
    // gets a pack (a small array summed whole: one round of loads, not several a lane; H100,
    // 4096 float32 elements: 1.88 us in the kernel against 3.03 us with a warp).
    let few_outputs = n_out.saturating_mul(32) < BLOCK as usize;
    let wide = |n: usize| {
        let rows = n <= 4096 || n_out.saturating_mul(32) >= resident;
        match rows && !(few_outputs && n >= BLOCK as usize * width) {
            true => 32,
            false => BLOCK,
        }
    };
    // Columns take a thread each, neighbours on neighbouring columns, where there are enough of
    // them to fill a warp; fewer columns take a group each (the rows they share come from the
    // cache).
    let group: u32 = match () {
        _ if n_red <= SHORT_ROW => 1,
        _ if unit_red => wide(n_red),
        _ if unit_kept && n_out >= 32 => 1,
        _ => wide(n_red),
    };
    // Split where the outputs alone would leave most of the device idle, or, for work large
    // enough that a second kernel's launch costs little beside it, three quarters of it (a
    // quarter of its threads, each with CBR_UNROLL packs in flight, keep the memory busy);
    // then fill the device. Every thread of a chunk takes CBR_UNROLL packs at least; small
    // work (a few blocks' worth) takes one launch whatever it leaves idle.
    let busy = n_out.saturating_mul(group as usize);
    let most = n_red / (group as usize * width * UNROLL);
    let work = n_out.saturating_mul(n_red);
    (
        group,
        split((busy, work), most, (sms, SPLIT_THREADS_PER_SM)),
    )
}

/// The chunks for `busy` threads (before the split) over `work` elements, at most `most`,
/// aiming at `per_sm` threads on each of `sms` multiprocessors.
fn split((busy, work): (usize, usize), most: usize, (sms, per_sm): (usize, usize)) -> usize {
    let resident = sms.max(1) * per_sm;
    let short = busy < resident / 16 || (work >= 1 << 22 && busy < resident / 4);
    let wanted = match short && work >= 1 << 16 {
        true => resident.div_ceil(busy.max(1)),
        false => 1,
    };
    wanted.min(most).clamp(1, MAX_CHUNKS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(strides: &[isize], address: usize) -> Operand<'_> {
        Operand {
            strides,
            contiguous: false,
            address,
            itemsize: 4,
        }
    }

    #[test]
    fn rows_columns_and_whole_arrays() {
        // (1000, 4096) float32 over its rows: a warp a row, packs, no chunks.
        let x = [4096, 1];
        let out: [&[isize]; 1] = [&[1]];
        let inputs = [op(&x, 256)];
        let walk = |axes: &'static [usize], outputs| Walk {
            shape: &[1000, 4096],
            axes,
            inputs: &inputs,
            outputs,
        };
        let p = ReductionPlan::new(&walk(&[1], &out), false, true, 4, 132).unwrap();
        assert_eq!((p.n_out, p.n_red, p.group, p.chunks), (1000, 4096, 32, 1));
        assert!(p.vector);
        // Over its columns: a thread a pack of 4 columns, split into chunks for 132 SMs; a
        // misaligned view takes a column a thread, in the same chunks.
        let p = ReductionPlan::new(&walk(&[0], &[&[1]]), false, true, 4, 132).unwrap();
        assert_eq!((p.n_out, p.n_red, p.group), (4096, 1000, 1));
        assert_eq!(
            (p.in_kept[0].clone(), p.in_red[0].clone()),
            (vec![1], vec![4096])
        );
        assert!(p.vector && p.per_thread == 4 && p.chunks > 1 && p.chunks * 4 * 2 <= 1000);
        let shifted = [op(&x, 260)];
        let w = Walk {
            inputs: &shifted,
            ..walk(&[0], &[&[1]])
        };
        let q = ReductionPlan::new(&w, false, true, 4, 132).unwrap();
        assert_eq!((q.vector, q.per_thread, q.chunks), (false, 1, p.chunks));
        // Everything: one output, merged into one run of blocks, split across the device.
        let p = ReductionPlan::new(&walk(&[0, 1], &[]), false, true, 4, 132).unwrap();
        assert_eq!(
            (p.kept.clone(), p.red.clone()),
            (vec![1], vec![4096 * 1000])
        );
        assert_eq!(p.group, BLOCK);
        assert!(p.vector, "a whole aligned array moves packs");
        assert!(p.chunks > 100 && p.chunks * 256 * 4 * UNROLL <= 4096 * 1000);
        // A misaligned view keeps the order of operations, without packs.
        let shifted = [op(&x, 260)];
        let w = Walk {
            inputs: &shifted,
            ..walk(&[0, 1], &[])
        };
        let q = ReductionPlan::new(&w, false, true, 4, 132).unwrap();
        assert!(!q.vector);
        assert_eq!((q.group, q.chunks), (p.group, p.chunks));
    }

    #[test]
    fn tiny_rows_take_one_thread_each() {
        let x = [2, 1];
        let inputs = [op(&x, 0)];
        let w = Walk {
            shape: &[1_000_000, 2],
            axes: &[1],
            inputs: &inputs,
            outputs: &[&[1]],
        };
        let p = ReductionPlan::new(&w, false, true, 4, 132).unwrap();
        assert_eq!((p.group, p.chunks, p.n_out), (1, 1, 1_000_000));
    }

    #[test]
    fn short_rows_one_after_another_are_read_in_packs() {
        // (rows, n) of `itemsize` bytes (packs of 16 bytes) at `address` with row stride `row`
        // elements, summed over n, 132 SMs: (rows a pack holds or 0, chunks).
        let plan = |shape: [usize; 2], row: isize, address: usize, itemsize: usize| {
            let x = [row, 1];
            let inputs = [Operand {
                itemsize,
                ..op(&x, address)
            }];
            let w = Walk {
                shape: &shape,
                axes: &[1],
                inputs: &inputs,
                outputs: &[&[1]],
            };
            let p = ReductionPlan::new(&w, false, true, 16 / itemsize, 132).unwrap();
            assert_eq!(p.group, 1);
            assert_eq!(p.vector, p.rows > 0);
            assert_eq!(p.per_thread, p.rows.max(1) as usize);
            (p.rows, p.chunks)
        };
        let rows = |shape, row, address, itemsize| plan(shape, row, address, itemsize).0;
        assert_eq!(rows([1_000_000, 2], 2, 0, 4), 2);
        assert_eq!(rows([1_000_000, 4], 4, 16, 4), 1);
        assert_eq!(
            rows([1_000, 16], 16, 0, 8),
            1,
            "float64: rows of 8 packs of 2"
        );
        assert_eq!(rows([1_000_000, 2], 2, 0, 2), 4, "bfloat16: 4 rows a pack");
        assert_eq!(rows([1_000_000, 2], 2, 0, 1), 8, "int8: 8 rows a pack");
        assert_eq!(rows([1_000, 8], 8, 0, 4), 1);
        // Rows that a pack neither holds whole nor splits whole, rows apart, a pack across the
        // last row, a misaligned first row, a row of one: one thread a row, one at a time.
        assert_eq!(rows([1_000, 3], 3, 0, 4), 0);
        assert_eq!(rows([1_000, 6], 6, 0, 4), 0);
        assert_eq!(rows([1_000, 2], 4, 0, 4), 0);
        assert_eq!(rows([999, 2], 2, 0, 4), 0);
        assert_eq!(rows([1_000, 2], 2, 8, 4), 0);
        assert_eq!(rows([1_000, 1], 1, 0, 4), 0);
        assert_eq!(rows([1_000, 2], 2, 0, 16), 0, "complex128 has no packs");
        // Rows split into chunks (float64 rows of 16, too few to fill the device) keep the
        // split whatever the address, without packs: the same order, the same bits.
        let (aligned, shifted) = (plan([5_000, 16], 16, 0, 8), plan([5_000, 16], 16, 8, 8));
        assert!(aligned.1 > 1, "{aligned:?}");
        assert_eq!(aligned, shifted);
        assert_eq!(aligned.0, 0);
    }

    #[test]
    fn index_order_and_merging() {
        // A transposed input reduced everywhere: reordered by its strides into one run, unless
        // the map reads _J (C order), or merging is off.
        let t = [1, 3];
        let inputs = [op(&t, 0)];
        let w = Walk {
            shape: &[3, 5],
            axes: &[0, 1],
            inputs: &inputs,
            outputs: &[],
        };
        let p = ReductionPlan::new(&w, false, true, 4, 1).unwrap();
        assert_eq!((p.red, p.in_red), (vec![15], vec![vec![1]]));
        let p = ReductionPlan::new(&w, true, true, 4, 1).unwrap();
        assert_eq!((p.red, p.in_red), (vec![3, 5], vec![vec![1, 3]]));
        let p = ReductionPlan::new(&w, false, false, 4, 1).unwrap();
        assert_eq!(p.red, vec![3, 5]);
    }

    #[test]
    fn large_columns_fill_the_device_and_small_work_takes_one_launch() {
        // 2^15 columns of 2^15: one thread each would keep a quarter of the threads the split aims
        // at on 132 SMs busy.
        let (group, chunks) = strategy(1 << 15, 1 << 15, (false, true), 4, 132);
        assert_eq!(group, 1);
        assert!(chunks * (1 << 15) >= 132 * SPLIT_THREADS_PER_SM);
        // Four columns of 2^18: a group each, split into chunks.
        let (group, chunks) = strategy(4, 1 << 18, (false, true), 4, 132);
        assert!(group > 1 && chunks > 1);
        // 1024 rows of 1024: a warp each, one launch; a small array summed whole takes a
        // block (a pack a thread), one smaller than a block's packs a warp.
        assert_eq!(strategy(1024, 1024, (true, true), 4, 132), (32, 1));
        assert_eq!(strategy(1, 1024, (true, true), 4, 132), (BLOCK, 1));
        assert_eq!(strategy(1, 1000, (true, true), 4, 132), (32, 1));
        assert_eq!(strategy(8, 4096, (true, true), 4, 132), (32, 1));
    }

    #[test]
    fn columns_in_packs_aim_at_the_same_bytes_in_flight_whatever_the_width() {
        // (8192, 8192) summed over its columns, 132 SMs: float32 (packs of 4) aims at 1024
        // threads an SM, bfloat16 (packs of 8) at 512, each thread loading twice the bytes.
        let plan = |width: usize, address| {
            let x = [8192, 1];
            let inputs = [Operand {
                itemsize: 16 / width,
                ..op(&x, address)
            }];
            let walk = Walk {
                shape: &[8192, 8192],
                axes: &[0],
                inputs: &inputs,
                outputs: &[&[1]],
            };
            ReductionPlan::new(&walk, false, true, width, 132).unwrap()
        };
        let (f32, bf16) = (plan(4, 256), plan(8, 256));
        assert_eq!((f32.per_thread, bf16.per_thread), (4, 8));
        assert_eq!(f32.chunks, (132 * 1024usize).div_ceil(8192 / 4));
        assert_eq!(bf16.chunks, (132 * 512usize).div_ceil(8192 / 8));
        // float64 stays at 1024 threads (not 2048), 1-byte types at 512 (not 256).
        assert_eq!(plan(2, 256).chunks, (132 * 1024usize).div_ceil(8192 / 2));
        assert_eq!(plan(16, 256).chunks, (132 * 512usize).div_ceil(8192 / 16));
    }

    #[test]
    fn columns_and_rows_keep_the_device_busy_in_as_few_launches_as_needed() {
        // 1024 columns of 1024: 4 blocks of a thread a column; chunks give every SM a block.
        let (group, chunks) = strategy(1024, 1024, (false, true), 4, 132);
        assert_eq!(group, 1);
        assert!(1024 / BLOCK as usize * chunks >= 132, "{chunks}");
        // 4096 rows of 4096 elements: a warp a row holds a quarter of the device, each lane with
        // several packs in flight: one launch.
        assert_eq!(strategy(4096, 4096, (true, true), 4, 132), (32, 1));
        // 16384 rows of 16384: enough warps to fill the device, a warp a row.
        assert_eq!(strategy(16384, 16384, (true, true), 4, 132), (32, 1));
        // 1024 rows of 2^18: a block a row.
        assert_eq!(strategy(1024, 1 << 18, (true, true), 4, 132).0, BLOCK);
    }

    #[test]
    fn a_record_matches_only_the_walk_it_was_made_from() {
        let (x, t, out) = ([64, 1], [1, 64], [1]);
        let outs: [&[isize]; 1] = [&out];
        let inputs = [op(&x, 256)];
        let walk = Walk {
            shape: &[64, 64],
            axes: &[1],
            inputs: &inputs,
            outputs: &outs,
        };
        let record = Walked::of(&walk, 4);
        assert!(record.matches(&walk, 4));
        assert!(!record.matches(&walk, 2));
        let (shifted, transposed) = ([op(&x, 260)], [op(&t, 256)]);
        let mut wide = op(&x, 256);
        wide.itemsize = 8;
        let wide = [wide];
        for inputs in [&shifted[..], &transposed, &wide, &[]] {
            assert!(!record.matches(&Walk { inputs, ..walk }, 4));
        }
        // Another address on the same packs plans the same.
        assert!(record.matches(
            &Walk {
                inputs: &[op(&x, 512)],
                ..walk
            },
            4
        ));
        let strided: [&[isize]; 1] = [&[2]];
        for other in [
            Walk {
                shape: &[64, 32],
                ..walk
            },
            Walk { axes: &[0], ..walk },
            Walk {
                outputs: &strided,
                ..walk
            },
            Walk {
                outputs: &[],
                ..walk
            },
        ] {
            assert!(!record.matches(&other, 4));
        }
    }

    #[test]
    fn the_split_depends_on_the_shape_and_the_device_only() {
        for sms in [1, 80, 132] {
            for (n_out, n_red) in [(1, 1 << 30), (16, 1 << 26), (1 << 20, 2), (7, 0)] {
                let (g, chunks) = strategy(n_out, n_red, (true, true), 4, sms);
                assert!((1..=MAX_CHUNKS).contains(&chunks), "{g}");
                assert!(chunks == 1 || chunks * g as usize * 4 * UNROLL <= n_red);
            }
        }
    }
}
