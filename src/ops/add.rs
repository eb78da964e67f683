//! `add(a, b, out)`: an instance of the elementwise engine ([`crate::ops::elementwise`]), with
//! its operation (`add_one` of `kernels/common.cuh`), its promotion rule and its scalar rule,
//! and a CPU loop for host memory. Inputs and `out` are used in place, never copied.

use crate::array::Array;
use crate::cpu::copy::ElementBytes;
use crate::cpu::element::Scalar;
use crate::cpu::{self, SendPtr};
use crate::cuda::kernels::{Index, Program};
use crate::cuda::stream::Stream;
use crate::cuda::{nvrtc, stream as cuda_stream};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::elementwise::source::{self, Role, Signature};
use crate::ops::elementwise::spec::{Rule, Spec};
use crate::ops::elementwise::{Call, ElementwiseKernel};
use crate::ops::plan::{Operand, Plan, Variant};
use crate::ops::Arg;
use crate::phases::phase;
use std::borrow::Cow;
use std::sync::OnceLock;

/// The arithmetic of the built-in elementwise kernels (add's, and the casts of copies).
pub(crate) const HEADER: &str = include_str!("../../kernels/common.cuh");

/// add's declaration: two inputs of their own dtypes, and a result of their promotion.
fn spec() -> Spec {
    let spec = Spec::new(
        "A a, B b",
        "R out",
        "out = add_one<A, B, R>(a, b)",
        "add",
        "",
    );
    // A fixed declaration, which the tests parse.
    let spec = spec.expect("add's declaration parses");
    spec.built_in(Rule::Promote("add"), HEADER, &[nvrtc::MINIMAL])
}

/// add as an elementwise kernel, made once per process.
fn kernel() -> &'static ElementwiseKernel {
    static ADD: OnceLock<ElementwiseKernel> = OnceLock::new();
    ADD.get_or_init(|| ElementwiseKernel::new(spec()))
}

/// `a + b` with numpy broadcasting and Array API promotion, written into `out` when given (which
/// must have the broadcast shape and the promoted dtype, and may be `a` or `b` itself) or into a
/// new array on the inputs' device. Returns the array written.
///
/// On CUDA the kernel runs on `stream` (DLPack numbering; the legacy default stream when
/// `None`), after the pending work of every operand's recorded stream, and the result records
/// that stream.
pub fn add(a: &Array, b: &Array, out: Option<&Array>, stream: Option<Stream>) -> Result<Array> {
    let inputs = [Arg::Array(a.clone()), Arg::Array(b.clone())];
    run(inputs, out.cloned(), stream)
}

/// `a + value`, where `value` (a Python scalar) takes `a`'s dtype as the Array API asks: a
/// float value needs a floating or complex `a`, a complex value a complex `a`. Like [`add`]
/// otherwise. On CUDA the kernel takes the value by value among its parameters, so nothing is
/// allocated or uploaded and the host never waits for the device; on the CPU the value is read
/// from a one-element array.
pub fn add_scalar(
    a: &Array,
    value: Scalar,
    out: Option<&Array>,
    stream: Option<Stream>,
) -> Result<Array> {
    let inputs = [Arg::Array(a.clone()), Arg::Value(value, None)];
    run(inputs, out.cloned(), stream)
}

/// [`add`] of two arguments (the first an array; the second an array, or a value as in
/// [`add_scalar`]) into `out`: the engine's launch on CUDA, the CPU loop on host memory.
pub fn run(inputs: [Arg; 2], out: Option<Array>, stream: Option<Stream>) -> Result<Array> {
    let kernel = kernel();
    let outputs = [out];
    let call = kernel.bind(&inputs, &outputs)?;
    let shape = call.loop_shape(None)?;
    let device = common_device((0..3).filter_map(|k| call.array(k)))?;
    let Device::Cuda(_) = device else {
        return on_host(&call, &shape);
    };
    let stream = stream.unwrap_or(cuda_stream::LEGACY);
    // SAFETY: add's operation reads its two elements and writes its one, nothing else.
    let outs = unsafe { kernel.launch(&call, device, &shape, stream)? };
    outs.into_iter()
        .next()
        .ok_or_else(|| Error::invalid("internal: add made no result"))
}

/// add on host memory: the CPU loop over the bound call's operands.
fn on_host(call: &Call<'_>, shape: &[usize]) -> Result<Array> {
    call.check_outputs(shape)?;
    let [da, db, dr] = [call.dtypes[0], call.dtypes[1], call.dtypes[2]];
    let a = call
        .array(0)
        .ok_or_else(|| Error::invalid("internal: add's first input"))?;
    phase!(Alloc);
    let out = match call.array(2) {
        Some(out) => out.clone(),
        None => Array::empty(shape, dr, Device::Cpu)?,
    };
    phase!(Plan);
    if out.numel() == 0 {
        return Ok(out);
    }
    let a_b = broadcast(a, shape)?;
    let b_b;
    // A value is one element on the stack, read through zero strides (nothing is allocated).
    let mut value;
    let zeros = [0isize; crate::layout::MAX_DIMS];
    let b = match (call.array(1), call.value(1)) {
        (Some(b), _) => {
            b_b = broadcast(b, shape)?;
            Operand::of(&b_b)
        }
        (None, Some(v)) => {
            value = ElementBytes::new(db, v);
            Operand {
                strides: zeros
                    .get(..shape.len())
                    .ok_or_else(|| Error::invalid("internal: add's loop has too many dims"))?,
                contiguous: out.numel() <= 1,
                address: value.as_mut_ptr() as usize,
                itemsize: db.itemsize(),
            }
        }
        (None, None) => return Err(Error::invalid("internal: add's second input")),
    };
    let b_ptr = b.address as *mut u8;
    let operands = [Operand::of(&out), Operand::of(&a_b), b];
    let plan = Plan::new(shape, out.numel(), &operands, Some(0), 1, false).coalesced::<3>();
    phase!(HostLoop);
    // SAFETY: all three operands are host-accessible (the value lives on this stack until the
    // loop returns) and the arrays' layouts were validated against their buffers when they were
    // made; `out` is writable (checked) and overlaps an input only exactly (checked); dtypes are
    // the promoted triple.
    unsafe {
        cpu::add::add(
            [da, db, dr],
            SendPtr(out.data_ptr()),
            SendPtr(a_b.data_ptr()),
            SendPtr(b_ptr),
            &plan,
        )?
    };
    Ok(out)
}

/// `x` seen with `shape` (borrowed when it has that shape already).
fn broadcast<'a>(x: &'a Array, shape: &[usize]) -> Result<Cow<'a, Array>> {
    Ok(if crate::layout::same_shape(x.shape(), shape) {
        Cow::Borrowed(x)
    } else {
        Cow::Owned(x.broadcast_to(shape)?)
    })
}

/// The device the operation runs on. Host-accessible memory (cpu, pinned, managed) mixes on the
/// CPU; CUDA device memory must all be on one device.
fn common_device<'a>(mut arrays: impl Iterator<Item = &'a Array> + Clone) -> Result<Device> {
    let first = match arrays.clone().next() {
        Some(x) => x.device(),
        None => return Err(Error::invalid("internal: add without an array")),
    };
    if arrays.clone().all(|x| x.device().is_host_accessible()) {
        return Ok(Device::Cpu);
    }
    match arrays.find(|x| x.device() != first) {
        Some(x) => Err(Error::DeviceMismatch {
            left: first.to_string(),
            right: x.device().to_string(),
        }),
        None => Ok(first),
    }
}

/// The mixed-dtype adds that ship: float16 and bfloat16 with float32 and with float64, either
/// way round (the promotions that need the half-precision headers, whose compile takes
/// longest).
const SHIPPED_PAIRS: [(DType, DType); 8] = [
    (DType::Float16, DType::Float32),
    (DType::Float32, DType::Float16),
    (DType::BFloat16, DType::Float32),
    (DType::Float32, DType::BFloat16),
    (DType::Float16, DType::Float64),
    (DType::Float64, DType::Float16),
    (DType::BFloat16, DType::Float64),
    (DType::Float64, DType::BFloat16),
];

/// add's programs for inputs `a` and `b` (an array, or a value: `second`) in each of `variants`
/// in the `index` width.
fn programs(
    a: DType,
    b: DType,
    second: Role,
    variants: &[Variant],
    index: Index,
) -> Result<Vec<Program>> {
    let kernel = kernel();
    let r = DType::promote(a, b, "add")?;
    let sig = Signature {
        dtypes: vec![a, b, r],
        roles: vec![Role::Element, second, Role::Element],
    };
    let spec = kernel.spec();
    let program = |&v: &Variant| source::program(spec, &sig, &[false], v, index);
    Ok(variants.iter().filter_map(program).collect())
}

/// The variants of add's kernels that ship: all four for two arrays, the flat ones for a value
/// (a transposed input beside a scalar is rare).
pub(crate) const ALL: [Variant; 4] = [
    Variant::Contiguous,
    Variant::Vector,
    Variant::Strided,
    Variant::Tiled { mask: 0 },
];

/// The programs compiled ahead of time and shipped in the build (see
/// [`crate::cuda::shipped`]): for every dtype with itself (so that no same-dtype first call
/// compiles) and float16 and bfloat16 with float32 and float64, add's kernels of every
/// variant with 32-bit indices (64-bit ones serve only arrays past 2^31 elements), with a
/// scalar second input. (With the casts of copies they make [`super::shipped_programs`].)
pub fn shipped_programs() -> Result<Vec<Program>> {
    let mut all = Vec::new();
    let pairs = DType::ALL.iter().map(|&d| (d, d)).chain(SHIPPED_PAIRS);
    for (a, b) in pairs {
        all.extend(programs(a, b, Role::Element, &ALL, Index::I32)?);
        if a == b {
            all.extend(programs(a, a, Role::Value, &ALL[..3], Index::I32)?);
        }
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::cpu::copy::read_scalar;
    use crate::cpu::element::Scalar;
    use crate::ops::{arange, full};

    /// `[0, 1, ..., n - 1]` on the host.
    fn range(n: i128, dtype: DType) -> Array {
        arange(
            Scalar::Int(0),
            Scalar::Int(n),
            Scalar::Int(1),
            dtype,
            Device::Cpu,
        )
        .unwrap()
    }

    fn values(a: &Array) -> Vec<Scalar> {
        (0..a.numel() as isize)
            // SAFETY: contiguous results; i < numel.
            .map(|i| unsafe { read_scalar(a.dtype(), a.data_ptr(), i) })
            .collect()
    }

    #[test]
    fn broadcast_add_with_promotion() {
        let a = range(6, DType::Int8);
        let a = unsafe_reshape(&a, &[2, 3]);
        let b = full(&[3], Scalar::Int(100), DType::Int32, Device::Cpu).unwrap();
        let r = add(&a, &b, None, None).unwrap();
        assert_eq!(r.dtype(), DType::Int32);
        assert_eq!(r.shape(), &[2, 3]);
        let want: Vec<Scalar> = (100..106).map(Scalar::Int).collect();
        assert_eq!(values(&r), want);
    }

    #[test]
    fn interleaved_views_do_not_overlap() {
        let x = range(8, DType::Float32);
        let even = x.as_strided(&[4], &[2], 0).unwrap();
        let odd = x.as_strided(&[4], &[2], 1).unwrap();
        // out = odd elements, inputs = even ones: runs as numpy does.
        add(&even, &even, Some(&odd), None).unwrap();
        let want: Vec<Scalar> = [0, 0, 2, 4, 4, 8, 6, 12]
            .into_iter()
            .map(|v| Scalar::Float(v as f64))
            .collect();
        assert_eq!(values(&x), want);
    }

    #[test]
    fn in_place_is_allowed_and_partial_overlap_is_not() {
        let a = range(4, DType::Float32);
        let one = full(&[], Scalar::Float(1.0), DType::Float32, Device::Cpu).unwrap();
        add(&a, &one, Some(&a), None).unwrap();
        assert_eq!(
            values(&a),
            (1..5).map(|v| Scalar::Float(v as f64)).collect::<Vec<_>>()
        );
        // out = a shifted by one element.
        let a6 = range(6, DType::Float32);
        let shifted = crate::layout::Layout::new(vec![4], vec![1], 4).unwrap();
        // SAFETY: elements 1..5 of a 6-element buffer.
        let view = unsafe {
            Array::from_parts(
                a6.buffer().clone(),
                shifted,
                DType::Float32,
                Device::Cpu,
                false,
            )
        };
        let first4 = crate::layout::Layout::new(vec![4], vec![1], 0).unwrap();
        // SAFETY: elements 0..4 of the same buffer.
        let head = unsafe {
            Array::from_parts(
                a6.buffer().clone(),
                first4,
                DType::Float32,
                Device::Cpu,
                false,
            )
        };
        assert!(add(&head, &one, Some(&view), None).is_err());
    }

    #[test]
    fn errors_name_what_is_wrong() {
        let f = Array::zeros(&[3], DType::Float32, Device::Cpu).unwrap();
        let i = Array::zeros(&[3], DType::Int32, Device::Cpu).unwrap();
        let e = add(&f, &i, None, None).unwrap_err().to_string();
        assert!(e.contains("float32") && e.contains("int32"), "{e}");
        let g = Array::zeros(&[4], DType::Float32, Device::Cpu).unwrap();
        assert!(matches!(
            add(&f, &g, None, None),
            Err(Error::Broadcast { .. })
        ));
        assert!(add(&f, &f, Some(&g), None)
            .unwrap_err()
            .to_string()
            .contains("shape"));
        // out has the inputs' broadcast shape, not one they broadcast to (a user's kernel
        // broadcasts over its outputs too).
        let wide = Array::zeros(&[2, 3], DType::Float32, Device::Cpu).unwrap();
        let e = add(&f, &f, Some(&wide), None).unwrap_err().to_string();
        assert!(
            e.contains("out has shape (2, 3) but the result has shape (3,)"),
            "{e}"
        );
        let ro = f.with_readonly(true);
        assert!(matches!(
            add(&f, &f, Some(&ro), None),
            Err(Error::ReadOnly(_))
        ));
    }

    #[test]
    fn a_typed_value_promotes_with_its_own_dtype() {
        let a = full(&[3], Scalar::Float(0.1), DType::Float32, Device::Cpu).unwrap();
        let typed = |v, d| [Arg::Array(a.clone()), Arg::Value(v, Some(d))];
        // numpy: float32 array + float64(0.1) is float64, from the float32 value widened.
        let r = run(typed(Scalar::Float(0.1), DType::Float64), None, None).unwrap();
        assert_eq!(r.dtype(), DType::Float64);
        let want = f64::from(0.1f32) + 0.1;
        assert!(values(&r).iter().all(|&v| v == Scalar::Float(want)));
        // The same dtype as the array's keeps it; a Python value always takes the array's.
        let r = run(typed(Scalar::Float(0.1), DType::Float32), None, None).unwrap();
        assert_eq!(r.dtype(), DType::Float32);
        assert_eq!(
            add_scalar(&a, Scalar::Float(0.1), None, None)
                .unwrap()
                .dtype(),
            DType::Float32
        );
        let i = full(&[2], Scalar::Int(100), DType::Int8, Device::Cpu).unwrap();
        let inputs = [
            Arg::Array(i.clone()),
            Arg::Value(Scalar::Int(100), Some(DType::Int64)),
        ];
        let r = run(inputs, None, None).unwrap();
        assert_eq!(r.dtype(), DType::Int64);
        assert_eq!(values(&r), vec![Scalar::Int(200); 2]);
        // Kinds mix as arrays' do: not at all.
        let inputs = [
            Arg::Array(i),
            Arg::Value(Scalar::Float(1.0), Some(DType::Float64)),
        ];
        assert!(matches!(
            run(inputs, None, None),
            Err(Error::DTypeMismatch { .. })
        ));
    }

    fn unsafe_reshape(a: &Array, shape: &[usize]) -> Array {
        let l = crate::layout::Layout::contiguous(shape).unwrap();
        assert_eq!(l.numel(), a.numel());
        // SAFETY: same element count over a contiguous buffer.
        unsafe { Array::from_parts(a.buffer().clone(), l, a.dtype(), a.device(), false) }
    }
}

/// Compiles add's programs and the casts with NVRTC when `CUBRIDGE_TEST_NVRTC_DIR` names a
/// folder holding libnvrtc (no GPU needed): every variant for every dtype with itself and some
/// promotions, in both index widths and with a scalar second input, the shipped casts and every
/// conversion between two dtypes. Skipped (with a note) otherwise.
#[cfg(test)]
mod compile_tests {
    use super::*;

    #[test]
    fn shipped_programs_have_distinct_names_and_keys() {
        let programs = crate::ops::shipped_programs().unwrap();
        // Every same-dtype add in four variants and with a value in three, eight promotions in
        // four, the copy of every dtype in two, four casts in four, and sum, max and min of five
        // dtypes in four reduction variants and in short rows read in packs (rows a pack:
        // float32 and int32 1 or 2, float16 and bfloat16 1, 2 or 4, int64 1).
        let short_rows = 2 + 3 + 3 + 2 + 1;
        assert_eq!(
            programs.len(),
            15 * 7 + 8 * 4 + 15 * 2 + 4 * 4 + 3 * 5 * 4 + 3 * short_rows
        );
        let mut names: Vec<&str> = programs.iter().map(|p| p.name.as_str()).collect();
        let mut keys: Vec<String> = programs
            .iter()
            .map(|p| nvrtc::key(&p.source, &p.options))
            .collect();
        names.sort();
        names.dedup();
        keys.sort();
        keys.dedup();
        assert_eq!(names.len(), programs.len());
        assert_eq!(keys.len(), programs.len());
        // Build files are named NAME-KEY.smARCH.cubin: a name must not hide the separators.
        assert!(names.iter().all(|n| !n.contains('-') && !n.contains(".sm")));
    }

    /// A kernel that copied its operands' structs (strides, extents: hundreds of bytes) into
    /// each thread's local memory would move them through the caches before its first load:
    /// measured on an H200, two thirds of a 2^22-element sum's time. The float32 programs of
    /// every engine (add in each variant, copies, casts, reductions) read them in place and keep
    /// their values in registers.
    #[test]
    fn float32_programs_use_no_local_memory() {
        if !nvrtc::test_dir("cubridge's kernels") {
            return;
        }
        let programs = crate::ops::shipped_programs().unwrap();
        let f32: Vec<_> = (programs.iter())
            .filter(|p| p.name.contains("float32_float32"))
            .collect();
        assert!(f32.len() >= 12, "{}", f32.len());
        for p in f32 {
            let image = nvrtc::compile_for(&p.source, &p.name, nvrtc::Target::Ptx(90), &p.options)
                .unwrap_or_else(|e| panic!("{}: {e}", p.name));
            let ptx = String::from_utf8_lossy(&image);
            assert!(!ptx.contains(".local"), "{} uses local memory", p.name);
        }
    }

    #[test]
    fn own_programs_compile() {
        if !nvrtc::test_dir("cubridge's kernels") {
            return;
        }
        let mut pairs: Vec<(DType, DType)> = DType::ALL.iter().map(|&d| (d, d)).collect();
        pairs.extend([
            (DType::Float16, DType::Float32),
            (DType::BFloat16, DType::Float32),
            (DType::Float16, DType::BFloat16),
            (DType::Int8, DType::Int64),
            (DType::Complex64, DType::Float64),
            (DType::Float16, DType::Complex64),
        ]);
        let mut all = Vec::new();
        for (a, b) in pairs {
            for index in [Index::I32, Index::I64] {
                all.extend(programs(a, b, Role::Element, &ALL, index).unwrap());
                if a == b {
                    all.extend(programs(a, a, Role::Value, &ALL, index).unwrap());
                }
            }
        }
        // A typed value (a numpy scalar) of a wider dtype than the array's.
        for (a, b) in [
            (DType::Float32, DType::Float64),
            (DType::Int8, DType::Int64),
        ] {
            all.extend(programs(a, b, Role::Value, &ALL[..3], Index::I32).unwrap());
        }
        all.extend(crate::ops::copy::shipped_programs());
        all.push(crate::ops::copy::every_conversion());
        for p in all {
            let name = format!("test_{}_{}", p.name, std::process::id());
            if let Err(e) = nvrtc::compile(&p.source, &name, 80, &p.options) {
                panic!("{}: {e}", p.name);
            }
        }
    }
}
