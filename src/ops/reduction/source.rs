//! The CUDA C++ of a reduction for one call signature and variant: the declaration's parts as
//! device functions (`cb_identity`, `cb_map`, `cb_reduce`, `cb_post`), the signature's
//! operands as the `Ops` of `kernels/reduce.cuh`, and its two kernels (the pass, and the fold of
//! partial results), whose parameters [`super::params::list`] lays out: one per operand, inputs
//! then outputs, then the `CbRedShape`, then the partials' pointer.

use super::spec::ReductionSpec;
use crate::cuda::kernels::{c_type, Program};
use crate::ops::elementwise::source::{self as elementwise, Role, Signature};
use std::fmt::Write;

const CORE: &str = include_str!("../../../kernels/reduce.cuh");

/// The kernels of a signature: threads per output and whether they move packs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Variant {
    /// Threads that reduce one output element (1, 32 or 256).
    pub group: u32,
    /// Whether element inputs are read in packs.
    pub vector: bool,
    /// Short rows in packs: the rows a thread reads from one pack (1: a row of a multiple of
    /// the pack); 0: another kernel.
    pub rows: u32,
}

impl Variant {
    /// The kernels that carry out `plan`.
    pub fn of(plan: &super::plan::ReductionPlan) -> Variant {
        Variant {
            group: plan.group,
            vector: plan.vector,
            rows: plan.rows,
        }
    }
}

/// Elements per pack: 16 bytes of the widest element input (1 for 16-byte elements).
pub fn width(sig: &Signature, nin: usize) -> usize {
    elementwise::vector_width(&sig.dtypes[..nin], &sig.roles[..nin])
}

/// The declaration's parts as device functions: inputs (and raw outputs) for the map, outputs
/// and raw arrays for the post-map.
fn functions(r: &ReductionSpec, sig: &Signature) -> String {
    let spec = &r.spec;
    let nin = spec.inputs.len();
    let ty = |k: usize| c_type(sig.dtypes[k]);
    let params: Vec<_> = spec.params().collect();
    let [mut map, mut post_outs, mut post_raw] = <[String; 3]>::default();
    for (k, p) in params.iter().enumerate() {
        let raw = format!(", CbRaw<{}> {}", ty(k), p.name);
        match (sig.roles[k], k < nin) {
            (Role::Raw, true) => {
                map.push_str(&raw);
                post_raw.push_str(&raw);
            }
            (Role::Raw, false) => {
                map.push_str(&raw);
                post_outs.push_str(&raw);
            }
            (_, true) => {
                let _ = write!(map, ", const {} {}", ty(k), p.name);
            }
            (_, false) => {
                let _ = write!(post_outs, ", {}& {}", ty(k), p.name);
            }
        }
    }
    format!(
        "typedef {rt} _type_reduce;\n\
         static_assert(sizeof(_type_reduce) <= 32, \"a reduce_type of at most 32 bytes\");\n\
         __device__ __forceinline__ _type_reduce cb_identity() {{ return _type_reduce({id}); }}\n\
         __device__ __forceinline__ _type_reduce cb_reduce(const _type_reduce a, \
         const _type_reduce b) {{\nreturn ({reduce});\n}}\n\
         __device__ __forceinline__ _type_reduce cb_map(const long long _J{map}) {{\n\
         (void)_J;\nreturn static_cast<_type_reduce>({m});\n}}\n\
         __device__ __forceinline__ void cb_post(const _type_reduce a{post_outs}{post_raw}) {{\n\
         {post};\n}}\n",
        rt = r.reduce_type,
        id = r.identity,
        reduce = r.reduce_expr,
        m = r.map_expr,
        post = r.post_map_expr,
    )
}

/// The signature's operands as the `Ops` of `kernels/reduce.cuh`.
fn ops(sig: &Signature, nin: usize, width: usize) -> String {
    let ty = |k: usize| c_type(sig.dtypes[k]);
    let n = sig.roles.len();
    let element = |k: usize| sig.roles[k] == Role::Element;
    let [mut members, mut offsets, mut items, mut packs, mut loads] = <[String; 5]>::default();
    for k in 0..n {
        let t = ty(k);
        let _ = match (sig.roles[k], k < nin) {
            (Role::Element, true) => writeln!(members, "const CbRedIn<{t}>& p{k};"),
            (Role::Element, false) => writeln!(members, "const CbStrided<{t}>& p{k};"),
            (Role::Value, _) => writeln!(members, "{t} p{k};"),
            (Role::Raw, _) => writeln!(members, "const CbRaw<{t}>& p{k};"),
        };
        if element(k) {
            let strides = if k < nin { "ks" } else { "s" };
            let _ = write!(offsets, "long long o{k}; ");
            let _ = write!(
                items,
                "it.o{k} = cbr::offset(o, g.kept, p{k}.{strides}, g.kept_ndim); "
            );
        }
        if element(k) && k < nin {
            let _ = write!(packs, "CbPack<{t}, V> v{k}; ");
            let _ = write!(
                loads,
                "p.v{k} = *reinterpret_cast<const CbPack<{t}, V>*>(p{k}.p + it.o{k} + \
                 (ROW ? j * p{k}.rs[0] : j)); "
            );
        }
    }
    let input = |k: usize, element: &dyn Fn(usize) -> String| match sig.roles[k] {
        Role::Element => format!(", {}", element(k)),
        _ => format!(", p{k}"),
    };
    let raw_outputs: String = (nin..n)
        .filter(|&k| sig.roles[k] == Role::Raw)
        .map(|k| format!(", p{k}"))
        .collect();
    let map_args = |element: &dyn Fn(usize) -> String| -> String {
        (0..nin).map(|k| input(k, element)).collect::<String>() + &raw_outputs
    };
    let at_one = map_args(&|k| format!("p{k}.p[it.o{k} + j * p{k}.rs[0]]"));
    let at =
        map_args(&|k| format!("p{k}.p[it.o{k} + cbr::offset_nd(j, g.red, p{k}.rs, g.red_ndim)]"));
    let lane = map_args(&|k| format!("p.v{k}.v[e]"));
    let post: String = (nin..n)
        .map(|k| match sig.roles[k] {
            Role::Element => format!(", p{k}.p[it.o{k}]"),
            _ => format!(", p{k}"),
        })
        .chain(
            (0..nin)
                .filter(|&k| sig.roles[k] == Role::Raw)
                .map(|k| format!(", p{k}")),
        )
        .collect();
    format!(
        "struct CbRedOps {{\ntypedef _type_reduce R;\nstatic constexpr int V = {width};\n\
         {members}const CbRedShape& g;\nstruct Item {{ {offsets}}};\n\
         __device__ __forceinline__ Item item(long long o) const {{\n\
         Item it; (void)o; {items}return it;\n}}\n\
         template <bool ONE> __device__ __forceinline__ R at(const Item& it, long long j) const {{\n\
         (void)it;\nif constexpr (ONE) return cb_map(j{at_one});\nelse return cb_map(j{at});\n}}\n\
         struct Packs {{ {packs}}};\n\
         template <bool ROW> __device__ __forceinline__ void load(Packs& p, const Item& it, \
         long long j) const {{ (void)p; (void)it; (void)j; {loads}}}\n\
         __device__ __forceinline__ R lane(const Packs& p, int e, long long j) const {{\n\
         (void)p; (void)e;\nreturn cb_map(j{lane});\n}}\n\
         __device__ __forceinline__ void post(const Item& it, const R& a) const \
         {{ (void)it; cb_post(a{post}); }}\n}};\n"
    )
}

/// The program of `r` for `sig` in `variant`: its pass kernel (named for the kernel and the
/// variant) and its fold of partial results (the same name, `_final`), with the same
/// parameters. The program is named after the signature too.
pub fn program(r: &ReductionSpec, sig: &Signature, variant: Variant) -> Program {
    let spec = &r.spec;
    let nin = spec.inputs.len();
    let w = width(sig, nin);
    let mut src = elementwise::types_prelude(spec, sig);
    src.push_str(&functions(r, sig));
    src.push_str(CORE);
    src.push_str(&ops(sig, nin, w));
    let params: Vec<String> = (0..sig.roles.len())
        .map(|k| {
            let t = c_type(sig.dtypes[k]);
            match (sig.roles[k], k < nin) {
                (Role::Element, true) => format!("CB_PARAM CbRedIn<{t}> p{k}"),
                (Role::Element, false) => format!("CB_PARAM CbStrided<{t}> p{k}"),
                (Role::Value, _) => format!("{t} p{k}"),
                (Role::Raw, _) => format!("CB_PARAM CbRaw<{t}> p{k}"),
            }
        })
        .chain(["CB_PARAM CbRedShape g".into(), "void* partial".into()])
        .collect();
    let init: String = (0..sig.roles.len()).map(|k| format!("p{k}, ")).collect();
    let v = if variant.vector { "v" } else { "" };
    let rows = match variant.rows {
        0 => String::new(),
        k => format!("r{k}"),
    };
    let function = format!("{}_g{}{v}{rows}", spec.name, variant.group);
    let _ = write!(
        src,
        "extern \"C\" __global__ void __launch_bounds__(256) {function}({params}) {{\n\
         cbr::pass<CbRedOps, {g}, {vec}, {k}>(CbRedOps{{{init}g}}, g, partial);\n}}\n\
         extern \"C\" __global__ void __launch_bounds__(256) {function}_final({params}) {{\n\
         cbr::finish<CbRedOps, {fg}>(CbRedOps{{{init}g}}, g, partial);\n}}\n",
        params = params.join(", "),
        g = variant.group,
        vec = variant.vector,
        k = variant.rows,
        fg = super::plan::final_group(variant.group),
    );
    Program {
        name: elementwise::program_name(&spec.name, sig, &function),
        source: src,
        options: with_split(&r.options),
        functions: vec![function.clone(), format!("{function}_final")],
    }
}

/// `options` asking NVRTC to compile the two kernels side by side (how long NVRTC takes, not
/// what the kernels compute), unless they already say how to split.
fn with_split(options: &[String]) -> Vec<String> {
    let mut options = options.to_vec();
    let split = |o: &String| o.starts_with("-split-compile") || o.starts_with("--split-compile");
    if !options.iter().any(split) {
        options.push(crate::cuda::nvrtc::SPLIT.into());
    }
    options
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::ops::reduction::spec::Code;

    /// A weighted sum of squares with a raw input and a scalar, two outputs.
    pub(crate) fn weighted() -> (ReductionSpec, Signature) {
        let code = Code {
            map_expr: "(float)x * (float)x * s + (float)w[0] * (_J > 0)",
            reduce_expr: "a + b",
            post_map_expr: "y = a; z = (int)a",
            identity: Some("0"),
            reduce_type: Some("float"),
        };
        let r = ReductionSpec::new(
            "T x, raw T w, float32 s",
            "T y, int32 z",
            code,
            "wss",
            "",
            (true, vec![]),
        )
        .unwrap();
        let sig = Signature {
            dtypes: vec![DType::BFloat16, DType::BFloat16, DType::Float32]
                .into_iter()
                .chain([DType::BFloat16, DType::Int32])
                .collect(),
            roles: vec![
                Role::Element,
                Role::Raw,
                Role::Value,
                Role::Element,
                Role::Element,
            ],
        };
        (r, sig)
    }

    #[test]
    fn generates_the_parts_and_two_kernels() {
        let (r, sig) = weighted();
        let p = program(
            &r,
            &sig,
            Variant {
                group: 32,
                vector: true,
                rows: 0,
            },
        );
        assert_eq!(p.functions, ["wss_g32v", "wss_g32v_final"]);
        assert_eq!(p.options, [crate::cuda::nvrtc::SPLIT]);
        assert_eq!(
            with_split(&["--split-compile=2".into()]),
            ["--split-compile=2"]
        );
        assert_eq!(
            p.name,
            "wss_bfloat16_bfloat16_raw_float32_value_bfloat16_int32_g32v"
        );
        let s = &p.source;
        assert!(s.contains("typedef float _type_reduce;"));
        assert!(s.contains(
            "cb_map(const long long _J, const __nv_bfloat16 x, CbRaw<__nv_bfloat16> w, \
             const float s)"
        ));
        assert!(s.contains(
            "cb_post(const _type_reduce a, __nv_bfloat16& y, int& z, CbRaw<__nv_bfloat16> w)"
        ));
        assert!(s.contains("return cb_map(j, p0.p[it.o0 + j * p0.rs[0]], p1, p2);"));
        assert!(s.contains(
            "return cb_map(j, p0.p[it.o0 + cbr::offset_nd(j, g.red, p0.rs, g.red_ndim)], p1, p2);"
        ));
        assert!(s.contains("cb_post(a, p3.p[it.o3], p4.p[it.o4], p1);"));
        assert!(s.contains("static constexpr int V = 8;"));
        assert!(s.contains("return cb_map(j, p.v0.v[e], p1, p2);"));
        assert!(s.contains("cbr::pass<CbRedOps, 32, true, 0>(CbRedOps{p0, p1, p2, p3, p4, g}"));
        let rows = Variant {
            group: 1,
            vector: true,
            rows: 4,
        };
        assert_eq!(program(&r, &sig, rows).functions[0], "wss_g1vr4");
    }
}

/// Compiles generated reductions with NVRTC when `CUBRIDGE_TEST_NVRTC_DIR` names a folder
/// holding libnvrtc (no GPU needed). Skipped (with a note) otherwise.
#[cfg(test)]
mod compile_tests {
    use super::*;

    pub(crate) fn compiles(p: &Program) {
        for arch in [80, 90] {
            let key = format!("test_{}_{arch}_{}", p.name, std::process::id());
            if let Err(e) = crate::cuda::nvrtc::compile(&p.source, &key, arch, &p.options) {
                panic!("{} (sm_{arch}): {e}\n{}", p.name, p.source);
            }
        }
    }

    #[test]
    fn users_reductions_compile_in_every_variant() {
        if !crate::cuda::nvrtc::test_dir("generated reductions") {
            return;
        }
        let (r, sig) = tests::weighted();
        let groups = [1, 32, 256]
            .into_iter()
            .flat_map(|g| [(g, false, 0), (g, true, 0)]);
        // Short rows in packs: bfloat16's packs of 8 hold 1, 2 or 4 rows.
        let rows = [1, 2, 4].into_iter().map(|k| (1, true, k));
        for (group, vector, rows) in groups.chain(rows) {
            compiles(&program(
                &r,
                &sig,
                Variant {
                    group,
                    vector,
                    rows,
                },
            ));
        }
    }

    /// argmax as CuPy users write it: a pair type and its fold in the preamble, `_J` as the
    /// index, the pair as the reduce type (the interop tests' kernel).
    #[test]
    fn a_preamble_type_reduces() {
        if !crate::cuda::nvrtc::test_dir("generated reductions") {
            return;
        }
        let preamble = "struct vi { float v; long long i; };\n\
            __device__ vi pick(vi a, vi b) { if (a.i < 0) return b; if (b.i < 0) return a; \
            return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a; }";
        let code = Code {
            map_expr: "vi{(float)x, _J}",
            reduce_expr: "pick(a, b)",
            post_map_expr: "y = a.i",
            identity: Some("vi{0, -1}"),
            reduce_type: Some("vi"),
        };
        let r = ReductionSpec::new(
            "T x",
            "int64 y",
            code,
            "my_argmax",
            preamble,
            (true, vec![]),
        )
        .unwrap();
        for d in [DType::Float16, DType::Float64] {
            let sig = Signature {
                dtypes: vec![d, DType::Int64],
                roles: vec![Role::Element; 2],
            };
            compiles(&program(
                &r,
                &sig,
                Variant {
                    group: 256,
                    vector: true,
                    rows: 0,
                },
            ));
        }
    }

    use super::tests;
    use crate::dtype::DType;
    use crate::ops::reduction::spec::Code;
}
