//! `out = a + b` on host memory: one generic kernel over (input, input, output) element types,
//! instantiated for exactly the dtype pairs that promotion allows.

use super::element::{AddElem, Complex, Element, Widen};
use super::{for_each_run, parallel_ranges, SendPtr};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::Coalesced;
use half::{bf16, f16};
use std::any::TypeId;

/// The inner loop over one run of `len` elements with element strides `so`, `sa`, `sb`.
///
/// # Safety
/// Every `o + i*so`, `a + i*sa`, `b + i*sb` for `i < len` is valid (writable for `o`) and
/// aligned; `o`'s elements are not written by anyone else meanwhile; `o` overlaps `a` or `b` only
/// element for element (same address for the same `i`).
#[inline(always)]
unsafe fn run<A, B, R>(
    o: *mut R,
    a: *const A,
    b: *const B,
    len: usize,
    so: isize,
    sa: isize,
    sb: isize,
) where
    A: Element + Widen<R>,
    B: Element + Widen<R>,
    R: AddElem,
{
    // SAFETY: (whole body) the offsets stay within the run described by the caller's contract.
    unsafe {
        if so == 1 && sa == 1 && sb == 1 {
            if TypeId::of::<A>() == TypeId::of::<R>() && std::ptr::addr_eq(o, a) {
                // In place (`out` is `a`): one pointer, so the compiler vectorises without an
                // overlap check that would fail.
                for i in 0..len {
                    let p = o.add(i);
                    *p = R::add(*p, (*b.add(i)).widen());
                }
            } else {
                for i in 0..len {
                    *o.add(i) = R::add((*a.add(i)).widen(), (*b.add(i)).widen());
                }
            }
        } else if so == 1 && sa == 1 && sb == 0 {
            let y: R = (*b).widen();
            for i in 0..len {
                *o.add(i) = R::add((*a.add(i)).widen(), y);
            }
        } else if so == 1 && sa == 0 && sb == 1 {
            let x: R = (*a).widen();
            for i in 0..len {
                *o.add(i) = R::add(x, (*b.add(i)).widen());
            }
        } else {
            for i in 0..len as isize {
                *o.offset(i * so) =
                    R::add((*a.offset(i * sa)).widen(), (*b.offset(i * sb)).widen());
            }
        }
    }
}

/// Runs the typed kernel over the whole plan, splitting it across cores when large.
///
/// # Safety
/// `plan.strides` are `[out, a, b]`; every element each operand's strides address from its
/// pointer is valid and aligned for its type; `out` is writable and overlaps an input only
/// element for element.
unsafe fn add_typed<A, B, R>(out: SendPtr, a: SendPtr, b: SendPtr, plan: &Coalesced<3>)
where
    A: Element + Widen<R>,
    B: Element + Widen<R>,
    R: AddElem,
{
    let total: usize = plan.shape.iter().product();
    let last = plan.shape.len() - 1;
    let (so, sa, sb) = (
        plan.strides[0][last],
        plan.strides[1][last],
        plan.strides[2][last],
    );
    let wide = wide_vectors();
    parallel_ranges(total, |start, end| {
        for_each_run(plan, start, end, |[oo, oa, ob], len| {
            let (o, x, y) = (
                // SAFETY: the walker yields offsets inside the plan; the caller vouched for
                // the pointers over the whole plan.
                unsafe { (out.get() as *mut R).offset(oo) },
                // SAFETY: as above.
                unsafe { (a.get() as *const A).offset(oa) },
                // SAFETY: as above.
                unsafe { (b.get() as *const B).offset(ob) },
            );
            // SAFETY: the run lies inside the plan, whose pointers the caller vouched for, and
            // parallel ranges write disjoint elements; run_wide only where the CPU has AVX2.
            unsafe {
                if wide {
                    run_wide::<A, B, R>(o, x, y, len, so, sa, sb)
                } else {
                    run::<A, B, R>(o, x, y, len, so, sa, sb)
                }
            }
        });
    });
}

/// Whether this CPU runs the loops compiled for AVX2 (x86-64 only; numpy dispatches the same
/// way at run time). Decided once.
fn wide_vectors() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static WIDE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *WIDE.get_or_init(|| std::arch::is_x86_feature_detected!("avx2"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// [`run`] compiled for AVX2 (twice the lanes of the baseline's SSE2).
///
/// # Safety
/// As [`run`], and the CPU supports AVX2 ([`wide_vectors`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn run_wide<A, B, R>(
    o: *mut R,
    a: *const A,
    b: *const B,
    len: usize,
    so: isize,
    sa: isize,
    sb: isize,
) where
    A: Element + Widen<R>,
    B: Element + Widen<R>,
    R: AddElem,
{
    // SAFETY: the caller's contract.
    unsafe { run::<A, B, R>(o, a, b, len, so, sa, sb) }
}

// Other architectures have one loop: the baseline's.
#[cfg(not(target_arch = "x86_64"))]
use run as run_wide;

type C64 = Complex<f32>;
type C128 = Complex<f64>;

/// Adds with the element types that `(a, b, out)` dtypes name.
///
/// # Safety
/// As `add_typed`, with the pointers holding elements of the named dtypes, and `out` being
/// `DType::promote(a, b)`.
pub unsafe fn add(
    dtypes: [DType; 3],
    out: SendPtr,
    a: SendPtr,
    b: SendPtr,
    plan: &Coalesced<3>,
) -> Result<()> {
    let [da, db, dr] = dtypes;
    macro_rules! try_pair {
        ($A:ty, $B:ty, $R:ty) => {
            if da == <$A>::DTYPE && db == <$B>::DTYPE && dr == <$R>::DTYPE {
                // SAFETY: the dtypes match the element types; the rest is the caller's contract.
                unsafe { add_typed::<$A, $B, $R>(out, a, b, plan) };
                return Ok(());
            }
        };
    }
    // Every pair with the result type on one side: (R, X) and (X, R).
    macro_rules! with_result {
        ($($R:ty: $($X:ty),*);* $(;)?) => {$(
            try_pair!($R, $R, $R);
            $( try_pair!($R, $X, $R); try_pair!($X, $R, $R); )*
        )*};
    }
    with_result!(
        bool: ;
        i8: ;
        i16: i8, u8;
        i32: i8, i16, u8, u16;
        i64: i8, i16, i32, u8, u16, u32;
        u8: ;
        u16: u8;
        u32: u8, u16;
        u64: u8, u16, u32;
        f16: ;
        bf16: ;
        f32: f16, bf16;
        f64: f16, bf16, f32;
        C64: f16, bf16, f32;
        C128: f16, bf16, f32, f64, C64;
    );
    // Pairs whose result is wider than both inputs.
    macro_rules! both_ways {
        ($($A:ty, $B:ty => $R:ty);* $(;)?) => {$(
            try_pair!($A, $B, $R);
            try_pair!($B, $A, $R);
        )*};
    }
    both_ways!(
        u8, i8 => i16;
        u16, i8 => i32;
        u16, i16 => i32;
        u32, i8 => i64;
        u32, i16 => i64;
        u32, i32 => i64;
        f16, bf16 => f32;
        f64, C64 => C128;
    );
    Err(Error::invalid(format!(
        "internal: no CPU add kernel for {da} + {db} -> {dr}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_promotable_pair_has_a_kernel() {
        // Zero-element plans run no loop but exercise the dispatch table.
        let plan = Coalesced::contiguous(0);
        let p = SendPtr(std::ptr::NonNull::<u64>::dangling().as_ptr() as *mut u8);
        for a in DType::ALL {
            for b in DType::ALL {
                if let Ok(r) = DType::promote(a, b, "add") {
                    // SAFETY: the plan has no elements, so no pointer is dereferenced.
                    let res = unsafe { add([a, b, r], p, p, p, &plan) };
                    assert!(res.is_ok(), "{a} + {b} -> {r}: {res:?}");
                }
            }
        }
    }

    #[test]
    fn strided_broadcast_and_mixed_dtypes() {
        // out[i][j] = a[j] (int8, broadcast over rows) + b[i][j] (int32, transposed)
        let a: [i8; 3] = [1, -2, 3];
        let b: [i32; 6] = [10, 40, 20, 50, 30, 60]; // b^T of [[10,20,30],[40,50,60]]
        let mut out = [0i32; 6];
        let plan = crate::layout::coalesce(&[2, 3], [&[3, 1], &[0, 1], &[1, 2]]);
        // SAFETY: all three arrays outlive the call and the strides stay in bounds.
        unsafe {
            add(
                [DType::Int8, DType::Int32, DType::Int32],
                SendPtr(out.as_mut_ptr().cast()),
                SendPtr(a.as_ptr() as *mut u8),
                SendPtr(b.as_ptr() as *mut u8),
                &plan,
            )
            .unwrap()
        };
        assert_eq!(out, [11, 18, 33, 41, 48, 63]);
    }
}
