//! The parameters of every elementwise kernel, `add`'s and users' alike: the structs of
//! `kernels/abi.cuh` (and users' `CbRaw`, of `kernels/user.cuh`; keep each pair in step), and
//! the one place that lays out a kernel's parameter list from its loop plan and launches it.

use crate::array::Array;
use crate::cpu::copy::ElementBytes;
use crate::cuda::launch::{self as cuda_launch, KernelParam, Params, BLOCK};
use crate::cuda::{kernels, sys};
use crate::error::{Error, Result};
use crate::layout::MAX_DIMS;
use crate::ops::launch::Launch;
use crate::ops::plan::{Plan, Variant};

/// `CbStrided<T>` (`kernels/abi.cuh`): an operand's pointer and element strides over the loop's
/// shape.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Strided {
    /// The operand's first element.
    pub p: *mut u8,
    /// Element strides, innermost last.
    pub s: [i64; MAX_DIMS],
}

/// `CbShape` (`kernels/abi.cuh`): the loop's coalesced shape.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Shape {
    /// Extents, innermost last.
    pub d: [i64; MAX_DIMS],
    /// Dimensions in use.
    pub ndim: i32,
    /// The C struct's tail padding, made a field so that every byte is set.
    pub pad: i32,
}

/// `CbRaw<T>` (`kernels/user.cuh`): a whole array, indexed by a user's operation.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Raw {
    /// The first element.
    pub p: *mut u8,
    /// Extents of its coalesced shape, innermost last.
    pub shape: [i64; MAX_DIMS],
    /// Element strides.
    pub stride: [i64; MAX_DIMS],
    /// Dimensions in use.
    pub ndim: i32,
    /// The C struct's padding before `n`, made a field so that every byte is set.
    pub pad: i32,
    /// Elements in all.
    pub n: i64,
}

// SAFETY: `Strided`, `Shape` and `Raw` are `#[repr(C)]` structs of pointers and 8-byte
// integers, with explicit fields where the C structs pad (`layouts_match_the_header` checks
// their sizes against the sum of their fields): no byte is padding.
unsafe impl KernelParam for Strided {}
// SAFETY: as above.
unsafe impl KernelParam for Shape {}
// SAFETY: as above.
unsafe impl KernelParam for Raw {}

fn too_many(what: &str, ndim: usize) -> Error {
    Error::invalid(format!(
        "{what} needs {ndim} dimensions after merging contiguous ones; elementwise kernels take \
         at most {MAX_DIMS}"
    ))
}

/// The first [`MAX_DIMS`] of `values` as a kernel's array holds them, zero after them.
fn fixed<T: Copy + TryInto<i64>>(values: &[T]) -> [i64; MAX_DIMS] {
    let mut out = [0; MAX_DIMS];
    for (to, &v) in out.iter_mut().zip(values) {
        *to = v.try_into().unwrap_or(i64::MAX);
    }
    out
}

impl Shape {
    /// The loop's shape, checked against [`MAX_DIMS`].
    pub fn new(shape: &[usize]) -> Result<Shape> {
        if shape.len() > MAX_DIMS {
            return Err(too_many("the loop", shape.len()));
        }
        let (d, ndim) = (fixed(shape), shape.len() as i32);
        Ok(Shape { d, ndim, pad: 0 })
    }
}

impl Strided {
    /// `p` with strides `s` over a shape already checked by [`Shape::new`].
    pub fn new(p: *mut u8, s: &[isize]) -> Strided {
        Strided { p, s: fixed(s) }
    }
}

impl Raw {
    /// `x` seen whole, its dimensions merged where contiguous.
    pub fn new(x: &Array) -> Result<Raw> {
        let (shape, strides) = crate::layout::coalesce_of(x.shape(), &[x.strides()]);
        if shape.len() > MAX_DIMS {
            return Err(too_many("a raw array", shape.len()));
        }
        Ok(Raw {
            p: x.data_ptr(),
            shape: fixed(&shape),
            stride: fixed(&strides[0]),
            ndim: shape.len() as i32,
            pad: 0,
            n: x.numel() as i64,
        })
    }
}

/// One operand of an elementwise kernel, as its parameter list takes it.
pub enum Param<'a> {
    /// An array walked over the loop: a pointer to its first element for the contiguous and
    /// vector variants, a [`Strided`] with its plan strides for the strided and tiled ones.
    /// These come in the plan's operand order.
    Element(&'a Array),
    /// One value for every index, as its dtype's bytes.
    Value(ElementBytes),
    /// A user's `raw` array: a [`Raw`].
    Raw(&'a Array),
}

/// The kernel of a plan, and how it is launched.
#[derive(Clone, Copy)]
pub struct Kernel {
    /// The function of the plan's variant and index width.
    pub function: sys::CUfunction,
    /// Blocks (see [`Plan::blocks`]).
    pub grid: u32,
    /// Threads of a block, (x, y).
    pub block: (u32, u32),
    /// Bytes of dynamic shared memory.
    pub shared: u32,
    /// The tiled variant's mask (its last parameter); `None` for the other variants.
    pub tile: Option<i32>,
}

/// The tiled kernel's operands: a, b (none for a value, given with its dtype), out.
pub type Tiles<'a> = (&'a Array, Option<&'a Array>, crate::DType, &'a Array);

/// How `function`, the kernel of `plan`'s variant and index width on device `ordinal`, is
/// launched: the flat and strided variants in [`Plan::blocks`] blocks of [`BLOCK`] threads
/// (the vector kernel moving packs of `width`), the tiled one as `tiled_kernel` says, over
/// `tiles`, its operands.
pub fn kernel(
    function: sys::CUfunction,
    plan: &Plan,
    ordinal: u32,
    width: usize,
    tiles: Option<Tiles<'_>>,
) -> Result<Kernel> {
    if let (Variant::Tiled { mask }, Some((a, b, b_dtype, out))) = (plan.variant, tiles) {
        let pairs = kernels::pairs([a.dtype(), b_dtype, out.dtype()]);
        return Ok(tiled_kernel(
            (function, pairs),
            plan,
            mask,
            (a, b, b_dtype),
            out,
        ));
    }
    Ok(Kernel {
        function,
        grid: plan.blocks(ordinal, width, BLOCK)?,
        block: (BLOCK, 1),
        shared: 0,
        tile: None,
    })
}

/// One entry of an elementwise kernel's parameter list (`kernels/abi.cuh`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// One parameter per operand, inputs then outputs: an element operand's first element (a
    /// [`Strided`] where `strided`), a value, or a [`Raw`].
    Operands {
        /// Whether element operands come with their strides.
        strided: bool,
    },
    /// `long long n`, the number of indices.
    Count,
    /// The loop's [`Shape`].
    Shape,
    /// The tiled variant's `int` mask.
    Tile,
}

/// The parameters of every elementwise kernel of `variant`, in order: the one description that
/// the generator (`source.rs`) writes and [`list`] lays out.
pub fn order(variant: Variant) -> &'static [Slot] {
    use Slot::*;
    match variant {
        Variant::Contiguous | Variant::Vector => &[Operands { strided: false }, Count],
        Variant::Strided => &[Operands { strided: true }, Count, Shape],
        Variant::Tiled { .. } => &[Operands { strided: true }, Count, Shape, Tile],
    }
}

/// The parameter list of an elementwise kernel for `plan` over `operands` (inputs, then
/// outputs) in the [`order`] of its variant; `tile` is the tiled variant's mask.
pub fn list<'a>(
    plan: &Plan,
    mut operands: impl ExactSizeIterator<Item = Param<'a>>,
    tile: Option<i32>,
) -> Result<Params> {
    let mut p = Params::with_capacity(
        operands.len() + 3,
        operands.len() * size_of::<Raw>() + size_of::<Shape>() + 16,
    );
    let mut strides = plan.strides.iter();
    for slot in order(plan.variant) {
        match *slot {
            Slot::Operands { strided } => {
                for operand in operands.by_ref() {
                    push_operand(&mut p, operand, strided.then_some(&mut strides))?;
                }
            }
            Slot::Count => p.push(plan.n as i64),
            Slot::Shape => p.push(Shape::new(&plan.shape)?),
            Slot::Tile => p.push(tile.ok_or_else(|| Error::invalid("internal: no tile mask"))?),
        }
    }
    Ok(p)
}

/// Pushes `operand` as [`Slot::Operands`] takes it: an element operand with the next of the
/// plan's `strides` where the variant walks strides.
fn push_operand(p: &mut Params, operand: Param<'_>, strides: Option<&mut Iter<'_>>) -> Result<()> {
    match (operand, strides) {
        (Param::Element(a), Some(strides)) => {
            let s = strides.next().ok_or_else(|| {
                Error::invalid("internal: more element operands than the plan walks")
            })?;
            p.push(Strided::new(a.data_ptr(), s));
        }
        (Param::Element(a), None) => p.push(a.data_ptr()),
        (Param::Value(bytes), _) => p.push_bytes(bytes.as_bytes()),
        (Param::Raw(a), _) => p.push(Raw::new(a)?),
    }
    Ok(())
}

/// The plan's strides of its element operands, in turn.
type Iter<'p> = std::slice::Iter<'p, Vec<isize>>;

/// Launches `kernel` for `plan` over `operands` on `launch`'s stream, with the parameter list
/// of [`list`]: the one launch of every elementwise kernel, `add`'s and users'.
///
/// # Safety
/// 1. `kernel.function` takes the parameters that [`list`] lays out for `plan.variant` and
///    these operands (its source follows `kernels/abi.cuh`), and belongs to the context of the
///    launch's device, which is current ([`Launch::order`] made it so).
/// 2. Every element operand spans the plan's loop within its validated layout on that device;
///    the outputs are writable and overlap no input but exactly; raw arrays and values are
///    used by the kernel only as their types allow.
/// 3. The variant and index width are what [`Plan::new`] chose for these operands (the vector
///    variant only for aligned pointers, the 32-bit one only where every offset fits), and a
///    tiled kernel gets the shared memory its tiles need.
/// 4. Every operand stays valid until the kernel has run ([`Launch::finish`]).
pub unsafe fn launch<'a>(
    launch: &Launch,
    plan: &Plan,
    operands: impl ExactSizeIterator<Item = Param<'a>>,
    kernel: &Kernel,
) -> Result<()> {
    let mut params = list(plan, operands, kernel.tile)?;
    // SAFETY: this function's contract; the pointers address `params`, alive for the call.
    unsafe {
        cuda_launch::launch(
            kernel.function,
            (kernel.grid, 1, 1),
            (kernel.block.0, kernel.block.1, 1),
            kernel.shared,
            launch.stream().handle(),
            params.pointers(),
        )
    }
}

/// Whether the tiled kernel of 2-byte elements may move pairs: every pair it reads or writes
/// is 4-byte aligned. That needs aligned pointers (a null one is a value, read from the kernel
/// parameters), even strides across for out and the tiled inputs (whose stride along rows is 1),
/// and unit stride along cols with an even stride across for an input read in place. `strides`
/// are the merged plan's (out, a, and b unless it is a value); `tile` the mask of tiled inputs
/// (bit 0: a, bit 1: b).
fn pairs_fit(strides: &[&[isize]], tile: i32, pointers: [*mut u8; 3]) -> bool {
    let even = |s: isize| s % 2 == 0;
    pointers.iter().all(|&p| (p as usize).is_multiple_of(4))
        && even(strides[0][0])
        && [1, 2].into_iter().all(|k| match strides.get(k) {
            None => pointers[k].is_null(),
            Some(_) if pointers[k].is_null() => true,
            Some(s) if tile & k as i32 != 0 => even(s[1]),
            Some(s) => s[1] == 1 && even(s[0]),
        })
}

/// The launch of a tiled kernel for a plan of [`Variant::Tiled`] with `mask`: `function`, which
/// moves interior tiles in pairs of 2-byte elements when its second member says so, one block
/// per tile, the shared memory of the tiled inputs, and the mask the kernel takes (bit 0: a
/// tiled, bit 1: b tiled, bit 2: pairs, set only where every pair is aligned). `inputs` are a,
/// b (`None` for a value, or for a kernel of one input) and b's dtype (the value's, or a's); the
/// plan walks a, b when it is an array, then `out`, so its mask has a's bit 0 and b's bit 1.
fn tiled_kernel(
    (function, pairs): (sys::CUfunction, bool),
    plan: &Plan,
    mask: u32,
    (a, b, b_dtype): (&Array, Option<&Array>, crate::DType),
    out: &Array,
) -> Kernel {
    let mut tile = mask as i32;
    let (rows, cols) = (plan.shape[0], plan.shape[1]);
    let edge = kernels::tile_edge(a.dtype(), b_dtype);
    let tiles = rows.div_ceil(edge) * cols.div_ceil(edge);
    let lead = plan.strides.len() - 1;
    let strides: Vec<&[isize]> = [Some(lead), Some(0), b.map(|_| 1)]
        .into_iter()
        .flatten()
        .map(|k| &plan.strides[k][..])
        .collect();
    let pb = b.map_or(std::ptr::null_mut(), |b| b.data_ptr());
    if pairs && pairs_fit(&strides, tile, [out.data_ptr(), a.data_ptr(), pb]) {
        tile |= 4;
    }
    // One block per tile: short-lived blocks stream better than a resident grid.
    Kernel {
        function,
        grid: tiles.clamp(1, i32::MAX as usize) as u32,
        block: kernels::TILE_BLOCK,
        shared: kernels::tile_shared_bytes(a.dtype(), b_dtype, tile),
        tile: Some(tile),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_header() {
        // Sizes as the C structs of kernels/abi.cuh and kernels/user.cuh have them (64-bit), and
        // as the sums of the Rust fields: no padding byte (KernelParam's contract).
        assert_eq!(size_of::<Strided>(), 8 + 8 * 8);
        assert_eq!(size_of::<Shape>(), 8 * 8 + 4 + 4);
        assert_eq!(size_of::<Raw>(), 8 + 64 + 64 + 4 + 4 + 8);
        assert_eq!(std::mem::offset_of!(Raw, n), 8 + 64 + 64 + 8);
        assert_eq!(std::mem::offset_of!(Shape, pad), 8 * 8 + 4);
        assert!(kernels::ABI.contains(&format!("\n#define CB_MAX_DIMS {MAX_DIMS}\n")));
    }

    /// Reads parameter `k` of a list as a `T`.
    fn read<T: Copy>(pointers: &[*mut std::ffi::c_void], k: usize) -> T {
        // SAFETY: the tests read each parameter as the type that was pushed for it.
        unsafe { *(pointers[k] as *const T) }
    }

    #[test]
    fn tiles_fit_and_pairs_need_alignment() {
        use crate::DType;
        // The tiles of every dtype triple fit the 48 KiB a block gets without opting in.
        for a in DType::ALL {
            for b in DType::ALL {
                for mask in 1..=3 {
                    let bytes = kernels::tile_shared_bytes(a, b, mask);
                    assert!(bytes <= 48 << 10, "{a} {b} {mask}: {bytes}");
                }
            }
        }
        assert_eq!(
            kernels::tile_shared_bytes(DType::Float16, DType::Float32, 3),
            64 * 66 * 2 + 64 * 65 * 4
        );

        // Pairs of 2-byte elements: aligned pointers, even strides across. Each row: cols,
        // strides of out, a, b, the tile mask, b's pointer (0: a value), whether pairs fit.
        type Case = (usize, [[isize; 2]; 3], i32, usize, bool, &'static str);
        #[rustfmt::skip]
        let cases: [Case; 7] = [
            (194, [[194, 1], [1, 130], [194, 1]], 1, 256, true, "all even"),
            (194, [[194, 1], [1, 130], [194, 1]], 1, 258, false, "b misaligned"),
            (194, [[194, 1], [1, 130], [0, 0]], 1, 0, true, "b a value"),
            (194, [[194, 1], [1, 131], [194, 1]], 1, 256, false, "a's stride across odd"),
            (193, [[194, 1], [1, 130], [193, 1]], 1, 256, false, "b's stride across odd"),
            (194, [[194, 1], [1, 130], [1, 0]], 1, 256, false, "b not unit along cols"),
            (194, [[194, 1], [1, 130], [1, 130]], 3, 256, true, "both tiled"),
        ];
        for (cols, [so, sa, sb], mask, b, fits, why) in cases {
            let (_, strides) = crate::layout::coalesce_of(&[130, cols], &[&so, &sa, &sb]);
            // A value is no operand of the plan.
            let strides: Vec<&[isize]> = strides.iter().map(|s| &s[..]).collect();
            let strides = if b == 0 { &strides[..2] } else { &strides[..] };
            let pointers = [64, 128, b].map(|x| x as *mut u8);
            assert_eq!(pairs_fit(strides, mask, pointers), fits, "{why}");
        }
    }

    #[test]
    fn kernels_declare_as_many_parameters_as_their_list_has() {
        use super::super::{source, spec::Spec};
        use crate::{cuda::kernels::Index, ops::plan::Operand, DType, Device};
        let spec = Spec::new("T x, T y", "T z", "z = x + y", "k", "").unwrap();
        let (dtypes, roles) = (vec![DType::Float32; 3], vec![source::Role::Element; 3]);
        let sig = source::Signature { dtypes, roles };
        let x = Array::zeros(&[4, 6], DType::Float32, Device::Cpu)
            .unwrap()
            .transposed();
        let walked = [Operand::of(&x); 3];
        use Variant::*;
        for variant in [Contiguous, Vector, Strided, Tiled { mask: 1 }] {
            let program = source::program(&spec, &sig, &[false], variant, Index::I64).unwrap();
            let head = format!("{}(", program.functions[0]);
            let (_, after) = program.source.split_once(&head).unwrap();
            let (declared, _) = after.split_once(')').unwrap();
            let mut plan = Plan::new(&[6, 4], 24, &walked, None, 1, false);
            plan.variant = variant;
            let operands = [&x; 3].map(Param::Element).into_iter();
            let listed = list(&plan, operands, Some(1)).unwrap().len();
            assert_eq!(declared.split(", ").count(), listed, "{variant:?}");
        }
    }

    #[test]
    fn a_list_follows_the_abi_for_each_variant() {
        use crate::cpu::element::Scalar;
        use crate::ops::plan::Operand;
        use crate::{DType, Device};
        let x = Array::zeros(&[4, 6], DType::Float32, Device::Cpu).unwrap();
        let out = Array::zeros(&[4, 6], DType::Float32, Device::Cpu).unwrap();
        let value = ElementBytes::new(DType::Float32, Scalar::Float(2.5));
        let operands = [
            Param::Element(&x),
            Param::Value(value),
            Param::Element(&out),
        ];

        // Contiguous operands: a pointer each, the value, then n.
        let walked = [Operand::of(&x), Operand::of(&out)];
        let plan = Plan::new(&[4, 6], 24, &walked, Some(1), 1, false);
        assert!(matches!(plan.variant, Variant::Contiguous));
        let mut p = list(&plan, operands.into_iter(), None).unwrap();
        let q = p.pointers();
        assert_eq!(q.len(), 4);
        assert_eq!(read::<*mut u8>(q, 0), x.data_ptr());
        assert_eq!(read::<f32>(q, 1), 2.5);
        assert_eq!(read::<*mut u8>(q, 2), out.data_ptr());
        assert_eq!(read::<i64>(q, 3), 24);

        // x transposed: CbStrided per walked operand (the plan's strides, led by out), n, the
        // shape, and the tile mask when one is given.
        let xt = x.transposed();
        let out_t = Array::zeros(&[6, 4], DType::Float32, Device::Cpu).unwrap();
        let walked = [Operand::of(&xt), Operand::of(&out_t)];
        let plan = Plan::new(&[6, 4], 24, &walked, Some(1), 1, true);
        assert!(matches!(plan.variant, Variant::Tiled { mask: 1 }));
        let operands = [
            Param::Element(&xt),
            Param::Value(value),
            Param::Element(&out_t),
        ];
        let mut p = list(&plan, operands.into_iter(), Some(5)).unwrap();
        let q = p.pointers();
        assert_eq!(q.len(), 6);
        let a = read::<Strided>(q, 0);
        assert_eq!((a.p, &a.s[..2]), (xt.data_ptr(), &[1i64, 6][..]));
        assert_eq!(read::<f32>(q, 1), 2.5);
        let o = read::<Strided>(q, 2);
        assert_eq!((o.p, &o.s[..2]), (out_t.data_ptr(), &[4i64, 1][..]));
        assert_eq!(read::<i64>(q, 3), 24);
        let shape = read::<Shape>(q, 4);
        assert_eq!((shape.ndim, &shape.d[..2]), (2, &[6i64, 4][..]));
        assert_eq!(read::<i32>(q, 5), 5);
    }
}
