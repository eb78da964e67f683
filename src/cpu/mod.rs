//! CPU backend: generic loops over host-accessible memory. One strided walker
//! ([`for_each_run`]) drives every kernel; large jobs are split across cores.

pub mod add;
pub mod copy;
pub mod element;
pub mod reduce;
pub mod round;

use crate::layout::Coalesced;

/// Below this many elements a job runs on the calling thread: starting threads would cost more
/// than they save.
pub const PARALLEL_MIN_ELEMENTS: usize = 1 << 20;

/// A raw pointer that may cross threads. The kernels that use it write disjoint elements.
#[derive(Clone, Copy)]
pub struct SendPtr(pub *mut u8);
// SAFETY: SendPtr is an address; the kernels guarantee that threads touch disjoint elements of
// the output and only read the inputs.
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// The address. (A method, so closures capture the whole `SendPtr`, not its raw field.)
    #[inline(always)]
    pub fn get(self) -> *mut u8 {
        self.0
    }
}

/// Calls `f(offsets, len)` for each innermost run of the linear element range `[start, end)` of
/// `plan`; `offsets[k]` is operand k's element offset of the run's first element. Runs follow
/// C order.
pub fn for_each_run<const N: usize>(
    plan: &Coalesced<N>,
    start: usize,
    end: usize,
    mut f: impl FnMut([isize; N], usize),
) {
    let ndim = plan.shape.len();
    let inner = plan.shape[ndim - 1];
    if inner == 0 || start >= end {
        return;
    }
    if ndim == 1 {
        // One run (the common case: operands that coalesce to one dimension).
        f(
            std::array::from_fn(|k| start as isize * plan.strides[k][0]),
            end - start,
        );
        return;
    }
    // Multi-index of `start`.
    let mut index = vec![0usize; ndim];
    let mut rem = start;
    for d in (0..ndim).rev() {
        index[d] = rem % plan.shape[d];
        rem /= plan.shape[d];
    }
    let mut offsets: [isize; N] = std::array::from_fn(|k| {
        index
            .iter()
            .zip(&plan.strides[k])
            .map(|(&i, &s)| i as isize * s)
            .sum()
    });
    let mut pos = start;
    while pos < end {
        let len = (inner - index[ndim - 1]).min(end - pos);
        f(offsets, len);
        pos += len;
        // Advance the odometer by `len` in the innermost dimension, carrying outwards.
        index[ndim - 1] += len;
        for (k, o) in offsets.iter_mut().enumerate() {
            *o += len as isize * plan.strides[k][ndim - 1];
        }
        let mut d = ndim - 1;
        while index[d] == plan.shape[d] && d > 0 {
            for (k, o) in offsets.iter_mut().enumerate() {
                *o -= plan.shape[d] as isize * plan.strides[k][d];
                *o += plan.strides[k][d - 1];
            }
            index[d] = 0;
            index[d - 1] += 1;
            d -= 1;
        }
    }
}

/// CPUs this process may use, read once: the standard library reads the cgroup files on every
/// call, which costs more than a small add.
fn cpu_count() -> usize {
    static COUNT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *COUNT.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Splits `[0, total)` into one contiguous range per worker and runs `job(start, end)` on each,
/// in parallel when the job is large enough to gain from it.
pub fn parallel_ranges(total: usize, job: impl Fn(usize, usize) + Sync) {
    let workers = if total < 2 * PARALLEL_MIN_ELEMENTS {
        1
    } else {
        cpu_count().min(total / PARALLEL_MIN_ELEMENTS)
    };
    if workers == 1 {
        job(0, total);
        return;
    }
    // Chunk edges on 64-element boundaries keep workers off each other's cache lines.
    let chunk = total.div_ceil(workers).next_multiple_of(64);
    std::thread::scope(|scope| {
        let job = &job;
        for w in 1..workers {
            let (s, e) = ((w * chunk).min(total), ((w + 1) * chunk).min(total));
            if s < e {
                scope.spawn(move || job(s, e));
            }
        }
        job(0, chunk.min(total));
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::coalesce;

    fn collect(plan: &Coalesced<1>, start: usize, end: usize) -> Vec<isize> {
        let mut seen = vec![];
        for_each_run(plan, start, end, |[o], len| {
            for i in 0..len {
                seen.push(o + i as isize * plan.strides[0][plan.shape.len() - 1]);
            }
        });
        seen
    }

    #[test]
    fn walker_visits_every_element_in_c_order() {
        // A transposed 3x4 view of a 4x3 buffer.
        let plan = coalesce(&[3, 4], [&[1, 3]]);
        let all = collect(&plan, 0, 12);
        let expected: Vec<isize> = (0..3)
            .flat_map(|i| (0..4).map(move |j| i + 3 * j))
            .collect();
        assert_eq!(all, expected);
        // Any split gives the same sequence.
        for cut in 0..=12 {
            let mut parts = collect(&plan, 0, cut);
            parts.extend(collect(&plan, cut, 12));
            assert_eq!(parts, expected, "cut at {cut}");
        }
    }

    #[test]
    fn walker_handles_negative_strides_and_three_dims() {
        let plan = coalesce(&[2, 2, 3], [&[-6, 3, -1]]);
        let all = collect(&plan, 0, 12);
        let mut expected = vec![];
        for i in 0..2isize {
            for j in 0..2isize {
                for k in 0..3isize {
                    expected.push(-6 * i + 3 * j - k);
                }
            }
        }
        assert_eq!(all, expected);
    }

    #[test]
    fn parallel_ranges_cover_everything_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let total = PARALLEL_MIN_ELEMENTS * 3 + 17;
        let covered = AtomicUsize::new(0);
        parallel_ranges(total, |s, e| {
            covered.fetch_add(e - s, Ordering::SeqCst);
        });
        assert_eq!(covered.load(Ordering::SeqCst), total);
    }
}
