//! The CUDA C++ of an elementwise kernel (a user's, or a built-in op such as `add`) for one
//! call signature: the operation as a device function, and one kernel per variant of the loop
//! plan and index width, each a program of its own, so that a first call compiles only the
//! kernel it launches. Their parameters are those of every elementwise kernel, in the order of
//! [`super::params::order`] (`kernels/abi.cuh`), which [`super::params::list`] lays out.

use super::params::{order, Slot};
use super::spec::Spec;
use crate::cuda::kernels::{self, c_type, Index, Program};
use crate::dtype::DType;
use crate::ops::plan::Variant;
use std::fmt::Write;

const HEADER: &str = include_str!("../../../kernels/user.cuh");

/// How a call passes one parameter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Role {
    /// One element per index of an array (broadcast over the loop).
    #[default]
    Element,
    /// One value for every index, among the kernel parameters (a scalar).
    Value,
    /// The whole array (`raw`).
    Raw,
}

/// What a program is generated for: each parameter's dtype and role (inputs, then outputs).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Signature {
    /// Dtypes, inputs then outputs.
    pub dtypes: Vec<DType>,
    /// Roles, in the same order.
    pub roles: Vec<Role>,
}

/// Elements per 16-byte access of the widest element operand (1 for 16-byte elements).
pub fn vector_width(dtypes: &[DType], roles: &[Role]) -> usize {
    let elements = dtypes
        .iter()
        .zip(roles)
        .filter(|(_, &r)| r == Role::Element);
    let widest = elements.map(|(d, _)| d.itemsize()).max().unwrap_or(1);
    (16 / widest).max(1)
}

/// What every program of a signature starts with: the headers, the type names, the preamble and
/// the operation as a device function (`cb_op`). `CB_FLOAT16` and `CB_BFLOAT16` say which
/// half-precision headers are in (built-in ops' headers read them).
fn prelude(spec: &Spec, sig: &Signature) -> String {
    let nin = spec.inputs.len();
    let params: Vec<_> = spec.params().collect();
    let ty = |k: usize| c_type(sig.dtypes[k]);
    let mut src = types_prelude(spec, sig);

    // The operation: inputs by value, outputs by reference, raw arrays whole.
    let op_params: Vec<String> = params
        .iter()
        .enumerate()
        .map(|(k, p)| match (sig.roles[k], k < nin) {
            (Role::Raw, _) => format!(", CbRaw<{}> {}", ty(k), p.name),
            (_, true) => format!(", const {} {}", ty(k), p.name),
            (_, false) => format!(", {}& {}", ty(k), p.name),
        })
        .collect();
    let _ = write!(
        src,
        "__device__ __forceinline__ void cb_op(const long long i, const CbInd& _ind{}) {{\n\
         (void)i; (void)_ind;\n{};\n}}\n",
        op_params.concat(),
        spec.operation
    );
    src
}

/// The part of [`prelude`] that every engine's program starts with (the reduction engine's
/// too): the half-precision headers where a dtype or the code needs them, the ABI and users'
/// headers, the spec's own header, a typedef per type name, and the preamble.
pub(crate) fn types_prelude(spec: &Spec, sig: &Signature) -> String {
    let params: Vec<_> = spec.params().collect();
    let ty = |k: usize| c_type(sig.dtypes[k]);
    let mentions = |word: &str| spec.operation.contains(word) || spec.preamble.contains(word);
    let mut src = String::new();
    if sig.dtypes.contains(&DType::Float16) || mentions("half") {
        src.push_str("#define CB_FLOAT16\n#include <cuda_fp16.h>\ntypedef __half float16;\n");
    }
    if sig.dtypes.contains(&DType::BFloat16) || mentions("bfloat16") || mentions("bf16") {
        src.push_str(
            "#define CB_BFLOAT16\n#include <cuda_bf16.h>\ntypedef __nv_bfloat16 bfloat16;\n",
        );
    }
    src.push_str(kernels::ABI);
    src.push_str(HEADER);
    src.push_str(spec.header);
    for t in spec.type_names() {
        let k = params
            .iter()
            .position(|p| matches!(&p.ty, super::spec::Type::Generic(n) if n == t))
            .unwrap_or(0);
        let _ = writeln!(src, "typedef {} {t};", ty(k));
    }
    let _ = writeln!(src, "{}", spec.preamble);
    src
}

/// The kernel parameters of `variant`, declared in [`order`].
fn kernel_params(sig: &Signature, variant: Variant) -> String {
    let declare = |slot: &Slot| match *slot {
        Slot::Operands { strided } => operand_list(sig, strided, false),
        Slot::Count => vec!["long long n".into()],
        Slot::Shape => vec!["CB_PARAM CbShape g".into()],
        Slot::Tile => vec!["int tile".into()],
    };
    let params: Vec<String> = order(variant).iter().flat_map(declare).collect();
    params.join(", ")
}

/// Each parameter as a declaration (`strided`: element operands as CbStrided): struct ones in
/// place (`CB_PARAM`, abi.cuh) as the kernel's parameters, or as `member`s, references to them.
fn operand_list(sig: &Signature, strided: bool, member: bool) -> Vec<String> {
    let ty = |k: usize| c_type(sig.dtypes[k]);
    let structure = |t: String, k: usize| match member {
        true => format!("const {t}& p{k}"),
        false => format!("CB_PARAM {t} p{k}"),
    };
    (0..sig.roles.len())
        .map(|k| match sig.roles[k] {
            Role::Element if strided => structure(format!("CbStrided<{}>", ty(k)), k),
            Role::Element => format!("{}* p{k}", ty(k)),
            Role::Value => format!("{} p{k}", ty(k)),
            Role::Raw => structure(format!("CbRaw<{}>", ty(k)), k),
        })
        .collect()
}

/// Each parameter as a member of an `Ops` struct.
fn members(sig: &Signature, strided: bool) -> String {
    operand_list(sig, strided, true)
        .iter()
        .map(|d| format!("{d};\n"))
        .collect()
}

/// Each parameter as the operation gets it, each after a comma: an element operand as
/// `element(k)`, any other as its kernel parameter.
fn op_args(roles: &[Role], element: impl Fn(usize) -> String) -> String {
    let arg = |k: usize| match roles[k] {
        Role::Element => format!(", {}", element(k)),
        _ => format!(", p{k}"),
    };
    (0..roles.len()).map(arg).collect()
}

/// The signature's operands and operation as the `Ops` of the contiguous and vector loops of
/// `kernels/loops.cuh` (`CbFlat`). `reads[k]` says whether output `k` is loaded before the
/// operation runs (see [`super::spec::reads_output`]).
fn flat_ops(sig: &Signature, nin: usize, reads: &[bool]) -> String {
    let width = vector_width(&sig.dtypes, &sig.roles);
    let [mut packs, mut loads, mut stores] = <[String; 3]>::default();
    for k in (0..sig.roles.len()).filter(|&k| sig.roles[k] == Role::Element) {
        let t = c_type(sig.dtypes[k]);
        let _ = write!(packs, "CbPack<{t}, {width}> v{k}; ");
        if k < nin || reads[k - nin] {
            let _ = write!(
                loads,
                "p.v{k} = reinterpret_cast<const CbPack<{t}, W>*>(p{k})[k]; "
            );
        }
        if k >= nin {
            let _ = write!(
                stores,
                "reinterpret_cast<CbPack<{t}, W>*>(p{k})[k] = p.v{k}; "
            );
        }
    }
    format!(
        "struct CbFlat {{\nstatic constexpr int W = {width};\nCbInd ind;\n{}\
         template <typename I> __device__ __forceinline__ void at(I i) const \
         {{ cb_op((long long)i, ind{}); }}\n\
         struct Packs {{ {packs}}};\n\
         template <typename I> __device__ __forceinline__ void load(Packs& p, I k) const \
         {{ (void)p; (void)k; {loads}}}\n\
         __device__ __forceinline__ void apply(Packs& p, long long first) const {{\n(void)p;\n\
         #pragma unroll\nfor (int e = 0; e < W; ++e) cb_op(first + e, ind{});\n}}\n\
         template <typename I> __device__ __forceinline__ void store(const Packs& p, I k) const \
         {{ (void)p; (void)k; {stores}}}\n}};\n",
        members(sig, false),
        op_args(&sig.roles, |k| format!("p{k}[i]")),
        op_args(&sig.roles, |k| format!("p.v{k}.v[e]")),
    )
}

/// The signature's operands and operation as the `Ops` of the strided loop of
/// `kernels/loops.cuh` (`CbStridedOps`).
fn strided_ops(sig: &Signature) -> String {
    let [mut offsets, mut steps] = <[String; 2]>::default();
    for k in (0..sig.roles.len()).filter(|&k| sig.roles[k] == Role::Element) {
        let _ = write!(offsets, "I o{k}; ");
        let _ = write!(steps, "o.o{k} += idx * (I)p{k}.s[d]; ");
    }
    format!(
        "struct CbStridedOps {{\nCbInd ind;\n{}\
         template <typename I> struct Offsets {{ {offsets}}};\n\
         template <typename I> __device__ __forceinline__ void step(Offsets<I>& o, int d, I idx) \
         const {{ (void)o; (void)d; (void)idx; {steps}}}\n\
         template <typename I> __device__ __forceinline__ void at(const Offsets<I>& o, long long i) \
         const {{ (void)o; cb_op(i, ind{}); }}\n}};\n",
        members(sig, true),
        op_args(&sig.roles, |k| format!("p{k}.p[o.o{k}]")),
    )
}

/// The program of `spec` for `sig` that runs `variant` in the `index` width: the flat loops of
/// `kernels/loops.cuh` over `flat_ops` or `strided_ops`, or the tiled kernel
/// ([`tiled_program`]; `None` where the signature has none). Its one function is named after
/// the kernel, the variant and the width; the program after the signature too (names are
/// unique among shipped programs).
pub fn program(
    spec: &Spec,
    sig: &Signature,
    reads: &[bool],
    variant: Variant,
    index: Index,
) -> Option<Program> {
    let bits = if index == Index::I32 { 32 } else { 64 };
    let (part, lp, ops, int) = match (variant, index) {
        (Variant::Tiled { .. }, _) => return tiled_program(spec, sig, reads, index),
        (Variant::Strided, Index::I32) => ("strided", "strided", "CbStridedOps", "int"),
        (Variant::Strided, Index::I64) => ("strided", "strided", "CbStridedOps", "long long"),
        (Variant::Contiguous, _) => ("contiguous", "contiguous", "CbFlat", unsigned(index)),
        (Variant::Vector, _) => ("vector", "vector", "CbFlat", unsigned(index)),
    };
    let strided = variant == Variant::Strided;
    let mut src = prelude(spec, sig);
    src.push_str(kernels::LOOPS);
    src.push_str(&match strided {
        true => strided_ops(sig),
        false => flat_ops(sig, spec.inputs.len(), reads),
    });
    let function = format!("{}_{part}{bits}", spec.name);
    let init: String = (0..sig.roles.len()).map(|k| format!(", p{k}")).collect();
    let shape = if strided { ", g" } else { "" };
    let _ = writeln!(
        src,
        "extern \"C\" __global__ void {function}({}) \
         {{ cbt::{lp}<{ops}, {int}>({ops}{{{{n}}{init}}}, n{shape}); }}",
        kernel_params(sig, variant)
    );
    Some(finish(spec, sig, src, function))
}

/// The index type of the contiguous and vector loops in `index`'s width.
fn unsigned(index: Index) -> &'static str {
    match index {
        Index::I32 => "unsigned int",
        Index::I64 => "long long",
    }
}

/// The name of the program of `function` (which starts with `kernel_name` and `_`): the
/// kernel's name, the signature's dtypes and roles, and the rest of the function's name.
pub(crate) fn program_name(kernel_name: &str, sig: &Signature, function: &str) -> String {
    let mut name = kernel_name.to_string();
    for (d, r) in sig.dtypes.iter().zip(&sig.roles) {
        let role = match r {
            Role::Element => "",
            Role::Value => "_value",
            Role::Raw => "_raw",
        };
        let _ = write!(name, "_{d}{role}");
    }
    let rest = function.get(kernel_name.len() + 1..).unwrap_or(function);
    format!("{name}_{rest}")
}

/// `source` as the program of `function`, named for the signature.
fn finish(spec: &Spec, sig: &Signature, source: String, function: String) -> Program {
    Program {
        name: program_name(&spec.name, sig, &function),
        source,
        options: spec.options.iter().map(|o| o.to_string()).collect(),
        functions: vec![function],
    }
}

/// The operation as the tiled kernel takes it (`CbTileOp`): a functor of the element inputs
/// `a` and `b` (none: one input) that returns `out`, with the scalars among its members; and
/// the members' initializers after its `CbInd`.
fn tile_op(
    sig: &Signature,
    nin: usize,
    (a, b, out): (usize, Option<usize>, usize),
) -> (String, String) {
    let ty = |k: usize| c_type(sig.dtypes[k]);
    let (ta, tb, tr) = (ty(a), b.map_or(ty(a), ty), ty(out));
    let values: Vec<usize> = (0..nin).filter(|&k| sig.roles[k] == Role::Value).collect();
    let members: String = values
        .iter()
        .map(|&k| format!("{} p{k};\n", ty(k)))
        .collect();
    let args: Vec<String> = (0..sig.roles.len())
        .map(|k| match k {
            _ if k == a => "x".to_string(),
            _ if Some(k) == b => "y".to_string(),
            _ if k == out => "z".to_string(),
            _ => format!("p{k}"),
        })
        .collect();
    let op = format!(
        "struct CbTileOp {{\nCbInd ind;\n{members}\
         __device__ __forceinline__ {tr} operator()({ta} x, {tb} y) const {{\n\
         (void)y;\n{tr} z;\ncb_op(0, ind, {});\nreturn z;\n}}\n}};\n",
        args.join(", ")
    );
    (op, values.iter().map(|k| format!(", p{k}")).collect())
}

/// The element operands a tiled kernel of a signature with `roles` takes, when it can take one:
/// its one or two element inputs (first `a`, then `b`) and its one element output, which the
/// operation only assigns (`reads`, per output, as for [`program`]); no raw arrays. Scalars may
/// come anywhere among the inputs. The caller also makes sure the operation does not read its
/// index: the tiles walk the loop in no particular order.
pub fn tile_operands(
    roles: &[Role],
    nin: usize,
    reads: &[bool],
) -> Option<(usize, Option<usize>, usize)> {
    if roles.contains(&Role::Raw) {
        return None;
    }
    let mut inputs = (0..nin).filter(|&k| roles[k] == Role::Element);
    let (a, b) = (inputs.next()?, inputs.next());
    let one_output = roles.len() == nin + 1 && roles[nin] == Role::Element;
    (inputs.next().is_none() && one_output && !reads[0]).then_some((a, b, nin))
}

/// The tiled program of `spec` for `sig` (which [`tile_operands`] accepts) in the `index`
/// width: the operation as a functor of its one or two element inputs (the scalars kept in
/// it), run by `cbt::tiled` (`kernels/tiled.cu`). It keeps four blocks an SM in 32-bit indexing
/// (at most 64 registers a thread: its loads in flight, not its arithmetic, set its speed),
/// three in 64-bit (whose addresses need more registers).
pub fn tiled_program(
    spec: &Spec,
    sig: &Signature,
    reads: &[bool],
    index: Index,
) -> Option<Program> {
    let nin = spec.inputs.len();
    let (a, b, out) = tile_operands(&sig.roles, nin, reads)?;
    let ty = |k: usize| c_type(sig.dtypes[k]);
    let (ta, tr) = (ty(a), ty(out));
    // One input: the second is a value of a's type that the operation never reads.
    let tb = b.map_or(ta, ty);
    let pairs = kernels::pairs([sig.dtypes[a], sig.dtypes[b.unwrap_or(a)], sig.dtypes[out]]);
    let mut src = prelude(spec, sig);
    src.push_str(kernels::ACCESS);
    src.push_str(kernels::TILED);
    let (op, init) = tile_op(sig, nin, (a, b, out));
    src.push_str(&op);
    let (bits, int, blocks) = match index {
        Index::I32 => (32, "int", 4),
        Index::I64 => (64, "long long", 3),
    };
    // b as the kernel reads it: an array, or a value the operation never reads.
    let (sb, second, sb0, sb1) = match b {
        Some(b) => (
            format!("cbt::Dense<{tb}>"),
            format!("cbt::Dense<{tb}>{{p{b}.p}}"),
            format!("({int})p{b}.s[0]"),
            format!("({int})p{b}.s[1]"),
        ),
        None => (
            format!("cbt::Splat<{tb}>"),
            format!("cbt::Splat<{tb}>{{}}"),
            format!("({int})0"),
            format!("({int})0"),
        ),
    };
    let function = format!("{}_tiled{bits}", spec.name);
    let _ = write!(
        src,
        "extern \"C\" __global__ void __launch_bounds__(256, {blocks}) \
         {function}({}) {{\n\
         const CbTileOp op{{CbInd{{n}}{init}}};\n\
         cbt::tiled<CbTileOp, {ta}, {tb}, {tr}, {int}, {sb}, {pairs}>(op, p{out}.p, p{a}.p, \
         {second}, ({int})g.d[0], ({int})g.d[1], ({int})p{out}.s[0], ({int})p{a}.s[0], \
         ({int})p{a}.s[1], {sb0}, {sb1}, tile);\n}}\n",
        kernel_params(sig, Variant::Tiled { mask: 0 })
    );
    Some(finish(spec, sig, src, function))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiled_kernels_take_one_or_two_element_inputs_and_one_assigned_output() {
        use Role::*;
        assert_eq!(
            tile_operands(&[Element, Value, Element, Element], 3, &[false]),
            Some((0, Some(2), 3))
        );
        assert_eq!(
            tile_operands(&[Value, Element, Element], 2, &[false]),
            Some((1, None, 2))
        );
        // An output the operation reads, two outputs, three inputs, a raw array: no tiles.
        assert_eq!(
            tile_operands(&[Element, Element, Element], 2, &[true]),
            None
        );
        assert_eq!(
            tile_operands(&[Element, Element, Element], 1, &[false, false]),
            None
        );
        assert_eq!(tile_operands(&[Element; 4], 3, &[false]), None);
        assert_eq!(tile_operands(&[Element, Raw, Element], 2, &[false]), None);
        assert_eq!(tile_operands(&[Value, Element], 1, &[false]), None);
    }

    /// `z = a * x + w[i]` over bfloat16 with a raw array and a float32 value.
    fn axpy() -> (Spec, Signature) {
        let spec = Spec::new(
            "T x, raw T w, float32 a",
            "T z",
            "z = a * x + w[i]",
            "axpy",
            "",
        )
        .unwrap();
        let sig = Signature {
            dtypes: vec![DType::BFloat16; 2]
                .into_iter()
                .chain([DType::Float32, DType::BFloat16])
                .collect(),
            roles: vec![Role::Element, Role::Raw, Role::Value, Role::Element],
        };
        (spec, sig)
    }

    #[test]
    fn generates_the_operation_and_one_kernel_per_variant() {
        let (spec, sig) = axpy();
        assert_eq!(vector_width(&sig.dtypes, &sig.roles), 8);
        let part = |v, index| program(&spec, &sig, &[false], v, index).unwrap();
        let (flat, strided) = (
            part(Variant::Vector, Index::I32),
            part(Variant::Strided, Index::I64),
        );
        for p in [&flat, &strided] {
            assert!(p.source.contains("#include <cuda_bf16.h>"));
            assert!(!p.source.contains("#include <cuda_fp16.h>"));
            assert!(p.source.contains("typedef __nv_bfloat16 T;"));
            assert!(p.source.contains(
                "void cb_op(const long long i, const CbInd& _ind, const __nv_bfloat16 x, \
                 CbRaw<__nv_bfloat16> w, const float a, __nv_bfloat16& z)"
            ));
            assert!(p.options.is_empty());
        }
        // The operation on contiguous and on strided operands (raw arrays and values whole),
        // each in its own program.
        let contiguous = "cb_op((long long)i, ind, p0[i], p1, p2, p3[i]);";
        let at_offsets = "cb_op(i, ind, p0.p[o.o0], p1, p2, p3.p[o.o3]);";
        assert!(flat.source.contains(contiguous) && !flat.source.contains(at_offsets));
        assert!(strided.source.contains(at_offsets) && !strided.source.contains(contiguous));
        // z is only assigned: stored, never loaded.
        assert!(!flat.source.contains("p.v3 = reinterpret_cast"));
        assert!(flat.source.contains("p.v0 = reinterpret_cast"));
        assert!(flat
            .source
            .contains("reinterpret_cast<CbPack<__nv_bfloat16, W>*>(p3)[k] = p.v3;"));
        assert!(flat
            .source
            .contains("cbt::vector<CbFlat, unsigned int>(CbFlat{{n}, p0, p1, p2, p3}, n); }"));
    }

    #[test]
    fn names_each_program_by_signature_and_variant() {
        let (spec, sig) = axpy();
        let part = |v, index| program(&spec, &sig, &[false], v, index);
        let (flat, strided) = (
            part(Variant::Vector, Index::I32).unwrap(),
            part(Variant::Strided, Index::I64).unwrap(),
        );
        assert_eq!(flat.functions, ["axpy_vector32"]);
        assert_eq!(strided.functions, ["axpy_strided64"]);
        assert_eq!(
            flat.name,
            "axpy_bfloat16_bfloat16_raw_float32_value_bfloat16_vector32"
        );
        // A raw array: no tiled kernel.
        assert!(part(Variant::Tiled { mask: 1 }, Index::I32).is_none());
    }
}

/// Compiles generated programs with NVRTC when `CUBRIDGE_TEST_NVRTC_DIR` names a folder holding
/// libnvrtc (no GPU needed; the `nvidia-cuda-nvrtc` pip package has one): every role, and every
/// dtype in the vector and strided kernels, must compile. Skipped (with a note) otherwise.
#[cfg(test)]
mod compile_tests {
    use super::*;

    /// The flat variants in both index widths.
    const VARIANTS: [(Variant, Index); 5] = [
        (Variant::Contiguous, Index::I64),
        (Variant::Vector, Index::I32),
        (Variant::Vector, Index::I64),
        (Variant::Strided, Index::I32),
        (Variant::Strided, Index::I64),
    ];

    /// Compiles `p` for sm_80, panicking with the source where NVRTC refuses it.
    fn compiles(p: &Program, what: impl std::fmt::Display) {
        let key = format!("test_{}_{}", p.name, std::process::id());
        if let Err(e) = crate::cuda::nvrtc::compile(&p.source, &key, 80, &[]) {
            panic!("{what}: {e}\n{}", p.source);
        }
    }

    #[test]
    fn generated_programs_compile() {
        if !crate::cuda::nvrtc::test_dir("generated kernels") {
            return;
        }
        let spec = Spec::new(
            "T x, raw T w, T a",
            "T z, T acc",
            "z = x + w[i % w.size()] + a; acc += z",
            "gen",
            "",
        )
        .unwrap();
        for d in DType::ALL {
            let sig = Signature {
                dtypes: vec![d; 5],
                roles: vec![
                    Role::Element,
                    Role::Raw,
                    Role::Value,
                    Role::Element,
                    Role::Element,
                ],
            };
            for (v, index) in VARIANTS {
                compiles(&program(&spec, &sig, &[false, true], v, index).unwrap(), d);
            }
        }
    }

    /// Kernels without outputs (writing through a raw input) and without any parameter.
    #[test]
    fn programs_without_outputs_or_parameters_compile() {
        if !crate::cuda::nvrtc::test_dir("generated kernels") {
            return;
        }
        let scatter = Spec::new("T x, raw T y", "", "y[i] = x", "no_outputs", "").unwrap();
        let sig = Signature {
            dtypes: vec![DType::Float32; 2],
            roles: vec![Role::Element, Role::Raw],
        };
        let nothing = Spec::new("", "", "", "no_parameters", "").unwrap();
        let empty = Signature {
            dtypes: vec![],
            roles: vec![],
        };
        for (v, index) in VARIANTS {
            compiles(
                &program(&scatter, &sig, &[], v, index).unwrap(),
                "no outputs",
            );
            compiles(
                &program(&nothing, &empty, &[], v, index).unwrap(),
                "no parameters",
            );
        }
    }

    /// Complex operands take the operators and functions users write.
    #[test]
    fn complex_operations_compile() {
        if !crate::cuda::nvrtc::test_dir("generated kernels") {
            return;
        }
        let complex = Spec::new(
            "T x, T y",
            "T z",
            "z = -x + 2.0f * y - 1 / x; z *= +conj(y); z = (z == x) ? z : T(norm(x), abs(y) + \
             arg(y) + real(x) + imag(x))",
            "complex_ops",
            "",
        )
        .unwrap();
        for d in [DType::Complex64, DType::Complex128] {
            let sig = Signature {
                dtypes: vec![d; 3],
                roles: vec![Role::Element; 3],
            };
            compiles(
                &program(&complex, &sig, &[false], Variant::Vector, Index::I32).unwrap(),
                d,
            );
        }
    }

    /// The tiled kernels: two inputs with a scalar between them, and one input.
    #[test]
    fn tiled_programs_compile() {
        if !crate::cuda::nvrtc::test_dir("generated kernels") {
            return;
        }
        let two = Spec::new("T x, T a, T y", "T z", "z = x * a + y", "two", "").unwrap();
        let one = Spec::new("T x", "T z", "z = x + x", "one", "").unwrap();
        for d in DType::ALL {
            let roles = vec![Role::Element, Role::Value, Role::Element, Role::Element];
            let sig = Signature {
                dtypes: vec![d; 4],
                roles,
            };
            let one_sig = Signature {
                dtypes: vec![d; 2],
                roles: vec![Role::Element; 2],
            };
            for (spec, sig) in [(&two, &sig), (&one, &one_sig)] {
                if d == DType::Bool && spec.name == "two" {
                    continue; // bool has no `*`
                }
                for index in [Index::I32, Index::I64] {
                    let p = tiled_program(spec, sig, &[false], index).expect("a tiled signature");
                    compiles(&p, d);
                }
            }
        }
    }
}
