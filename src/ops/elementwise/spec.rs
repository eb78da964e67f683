//! The declaration of an elementwise kernel (a user's, or a built-in op such as `add`), in
//! CuPy's `ElementwiseKernel` syntax:
//! parameter lists such as `"T x, raw float32 w, float32 a"` and `"T z"`, parsed and checked
//! once when the kernel is made, and the dtypes a call binds its type names to.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::Dims;

/// A parameter's type: one dtype, or a name (`T`) that each call binds to the dtype of the
/// arrays passed for it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Type {
    /// A dtype by its canonical name (`float32`, `bfloat16`, ...).
    Fixed(DType),
    /// A type name bound per call.
    Generic(String),
}

/// One declared parameter.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Declared {
    /// Its name in the operation.
    pub name: String,
    /// Its type.
    pub ty: Type,
    /// `raw`: the whole array, indexed by the operation (`w[i]`, `w.size()`), not broadcast and
    /// not one element per index.
    pub raw: bool,
}

/// How a call binds its parameters' dtypes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rule {
    /// Users' kernels (CuPy's rule): arrays bind type names and must have their parameter's
    /// dtype exactly; a type name that only Python scalars meet takes their default dtype.
    Exact,
    /// Array API promotion, as the built-in op it names binds (`add`): each input array (or
    /// typed scalar, such as `numpy.float64(2)`) binds its own type name; every other parameter
    /// (an output, a Python scalar) has the promotion of the inputs' dtypes. An output passed
    /// must have it (checked with its shape).
    Promote(&'static str),
}

/// A parsed elementwise kernel: inputs, outputs, the operation (a C++ statement run once per
/// index, with each input's element as a value and each output's as a reference), a kernel
/// name, and a preamble of device code put before it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Spec {
    /// Input parameters, in call order.
    pub inputs: Vec<Declared>,
    /// Output parameters, after the inputs.
    pub outputs: Vec<Declared>,
    /// The per-index statement(s).
    pub operation: String,
    /// A C identifier naming the kernel.
    pub name: String,
    /// Device code put before the operation (helper functions).
    pub preamble: String,
    /// How a call binds dtypes: [`Rule::Exact`] for users' kernels.
    pub rule: Rule,
    /// Device code of cubridge's own put before the preamble (a built-in op's arithmetic, such
    /// as add's `add_one` of `kernels/common.cuh`); empty for users' kernels.
    pub header: &'static str,
    /// NVRTC options beyond the architecture (none for users' kernels).
    pub options: &'static [&'static str],
}

/// Names the generated code itself uses: a parameter or type may not take them.
const RESERVED: &[&str] = &["i", "_ind", "n", "CbRaw", "CbInd", "CbPack", "CbStrided"];

/// C and C++ type keywords, refused as type names: they look like dtypes but are not (numpy's
/// `float` is float64, C's is float32).
const C_TYPES: &[&str] = &[
    "float", "double", "int", "long", "short", "char", "unsigned", "signed", "half", "bool_",
    "complex", "void", "auto",
];

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Parses a parameter list: comma-separated `[raw] TYPE NAME` items, or an empty string.
pub fn parse_params(text: &str, what: &'static str) -> Result<Vec<Declared>> {
    let mut params = Vec::new();
    for item in text.split(',') {
        let words: Vec<&str> = item.split_whitespace().collect();
        if words.is_empty() {
            if text.trim().is_empty() {
                break;
            }
            return Err(Error::declaration(what, text, "has an empty parameter"));
        }
        let (raw, rest) = match words.as_slice() {
            ["raw", rest @ ..] => (true, rest),
            rest => (false, rest),
        };
        let [ty, name] = rest else {
            let why = "is not `[raw] TYPE NAME` (for example `float32 x`, `raw T w`)";
            return Err(Error::declaration(what, item.trim(), why));
        };
        if !is_identifier(name) || RESERVED.contains(name) {
            let why = format!(
                "cannot name a parameter (a C identifier other than {})",
                RESERVED.join(", ")
            );
            return Err(Error::declaration(what, name, why));
        }
        let ty = parse_type(ty, what)?;
        params.push(Declared {
            name: name.to_string(),
            ty,
            raw,
        });
    }
    Ok(params)
}

/// A parameter's type: a dtype name, or a type name of one letter (`T`), as CuPy takes them.
/// Anything else (a misspelt dtype such as `flaot32`, an alias such as `f4` or `single`, a C
/// type such as `float` or `size_t`) is refused here, when the kernel is made, rather than
/// compiling into something else or failing later.
fn parse_type(ty: &str, what: &'static str) -> Result<Type> {
    if let Ok(dtype) = DType::from_name(ty) {
        return Ok(Type::Fixed(dtype));
    }
    let placeholder =
        ty.len() == 1 && ty.as_bytes()[0].is_ascii_alphabetic() && !RESERVED.contains(&ty);
    if placeholder {
        return Ok(Type::Generic(ty.to_string()));
    }
    let hint = if C_TYPES.contains(&ty) {
        " (C type names are refused: numpy's `float` is float64, C's is float32)"
    } else {
        ""
    };
    let dtypes = DType::ALL.map(|d| d.name()).join(", ");
    let why = format!(
        "is not a type{hint}: give a dtype name ({dtypes}) or a type name of one letter such as T"
    );
    Err(Error::declaration(what, ty, why))
}

impl Spec {
    /// Parses and checks a kernel's declaration.
    pub fn new(
        in_params: &str,
        out_params: &str,
        operation: &str,
        name: &str,
        preamble: &str,
    ) -> Result<Spec> {
        let inputs = parse_params(in_params, "in_params")?;
        // No outputs is allowed, as in CuPy: the operation writes through raw parameters.
        let outputs = parse_params(out_params, "out_params")?;
        if !is_identifier(name) {
            return Err(Error::declaration("name", name, "is not a C identifier"));
        }
        let all: Vec<&Declared> = inputs.iter().chain(&outputs).collect();
        for (k, p) in all.iter().enumerate() {
            if all[..k].iter().any(|q| q.name == p.name) {
                let twice = "is declared twice";
                return Err(Error::declaration("parameter", &p.name, twice));
            }
            if let Type::Generic(t) = &p.ty {
                if all.iter().any(|q| &q.name == t) {
                    let why = "is also a parameter's name";
                    return Err(Error::declaration("type name", t, why));
                }
            }
        }
        // A generic output type must be bound by an input, or by the output array itself.
        Ok(Spec {
            inputs,
            outputs,
            operation: operation.to_string(),
            name: name.to_string(),
            preamble: preamble.to_string(),
            rule: Rule::Exact,
            header: "",
            options: &[],
        })
    }

    /// The declaration of a built-in op: bound by `rule`, with cubridge's `header` and NVRTC
    /// `options`.
    pub(crate) fn built_in(
        self,
        rule: Rule,
        header: &'static str,
        options: &'static [&'static str],
    ) -> Spec {
        Spec {
            rule,
            header,
            options,
            ..self
        }
    }

    /// The op a dtype error names.
    pub fn op(&self) -> &'static str {
        match self.rule {
            Rule::Exact => "an elementwise kernel",
            Rule::Promote(op) => op,
        }
    }

    /// Every parameter, inputs first.
    pub fn params(&self) -> impl Iterator<Item = &Declared> {
        self.inputs.iter().chain(&self.outputs)
    }

    /// The type names, in order of first appearance.
    pub fn type_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for p in self.params() {
            if let Type::Generic(t) = &p.ty {
                if !names.contains(&t.as_str()) {
                    names.push(t);
                }
            }
        }
        names
    }

    /// Binds each parameter to a dtype for one call. `given[k]` is the dtype of the array (or
    /// typed scalar, such as `numpy.float32(2)`) passed for parameter `k` (inputs then outputs),
    /// or `None` for a Python scalar or an output to allocate; `python[k]` is the default dtype
    /// of a Python scalar passed there. Arrays bind type names; a type name that only Python
    /// scalars meet takes their default; an array must have its parameter's dtype exactly (no
    /// silent casts).
    pub fn bind(&self, given: &[Option<DType>], python: &[Option<DType>]) -> Result<Dims<DType>> {
        self.bind_slots(&self.type_slots(), given, python)
    }

    /// Per parameter (inputs, then outputs) of a type name, the first parameter of that name
    /// (where a call's binding of the name is kept); `None` for a fixed dtype.
    pub fn type_slots(&self) -> Vec<Option<usize>> {
        let first_of = |t: &String| {
            self.params()
                .position(|q| matches!(&q.ty, Type::Generic(n) if n == t))
        };
        self.params()
            .map(|p| match &p.ty {
                Type::Generic(t) => first_of(t),
                Type::Fixed(_) => None,
            })
            .collect()
    }

    /// [`Spec::bind`] with this declaration's [`Spec::type_slots`], found once by the caller
    /// (a kernel binds on every call): no type names compared, and nothing allocated for the few
    /// parameters of nearly every kernel.
    pub(crate) fn bind_slots(
        &self,
        slots: &[Option<usize>],
        given: &[Option<DType>],
        python: &[Option<DType>],
    ) -> Result<Dims<DType>> {
        if let Rule::Promote(op) = self.rule {
            return self.promote(op, given);
        }
        let n = given.len();
        let slot = |k: usize| slots.get(k).copied().flatten().filter(|&s| s < n);
        let mut bound: Dims<Option<DType>> = Dims::from_fn(n, |_| None);
        for (k, p) in self.params().enumerate() {
            let (Some(s), Some(d)) = (slot(k), given.get(k).copied().flatten()) else {
                continue;
            };
            match bound[s] {
                Some(b) if b != d => {
                    return Err(Error::DTypeMismatch {
                        op: "an elementwise kernel (one type name, two dtypes)",
                        left: format!("{} = {b}", type_name(p)),
                        right: format!("{} ({d})", p.name),
                    })
                }
                Some(_) => {}
                None => bound[s] = Some(d),
            }
        }
        for k in 0..n {
            if let (Some(s), Some(d)) = (slot(k), python.get(k).copied().flatten()) {
                bound[s].get_or_insert(d);
            }
        }
        let mut dtypes: Dims<DType> = Dims::from_fn(n, |_| DType::default());
        for ((k, p), d) in self.params().enumerate().zip(given) {
            let want = match (&p.ty, slot(k).and_then(|s| bound[s])) {
                (Type::Fixed(f), _) => *f,
                (Type::Generic(_), Some(b)) => b,
                (Type::Generic(t), None) => {
                    return Err(Error::invalid(format!(
                        "cannot tell which dtype {t} is for {}: no array passed binds it; \
                         pass an array for an input of type {t}, or the output",
                        p.name
                    )))
                }
            };
            if let Some(d) = d {
                if *d != want {
                    return Err(Error::DTypeMismatch {
                        op: "an elementwise kernel (an array must have its parameter's dtype)",
                        left: format!("{} declared {want}", p.name),
                        right: format!("given {d}"),
                    });
                }
            }
            dtypes[k] = want;
        }
        Ok(dtypes)
    }

    /// [`Rule::Promote`]: each input array's own dtype, and the promotion of them all for every
    /// other parameter.
    fn promote(&self, op: &'static str, given: &[Option<DType>]) -> Result<Dims<DType>> {
        let nin = self.inputs.len();
        let mut arrays = given[..nin].iter().flatten();
        let first = arrays
            .next()
            .ok_or_else(|| Error::invalid(format!("{op} takes at least one array")))?;
        let promoted = arrays.try_fold(*first, |p, &d| DType::promote(p, d, op))?;
        let own = |k: usize| given[k].filter(|_| k < nin).unwrap_or(promoted);
        Ok(Dims::from_fn(given.len(), own))
    }
}

/// The type name of a parameter declared with one (empty for a fixed dtype).
fn type_name(p: &Declared) -> &str {
    match &p.ty {
        Type::Generic(t) => t,
        Type::Fixed(_) => "",
    }
}

/// Whether output `name` must be loaded before `operation` runs: true unless the operation
/// certainly assigns every element before anything reads it. That holds only for a plain,
/// unconditional assignment `name = ...;` at the top level of the operation, whose right side
/// does not mention `name`, with no earlier statement that mentions it or may leave the
/// operation early (`return`, `goto`, `throw`). Anything else (`if (x > 0) z = x`, `z += x`, a
/// write inside braces or a loop) loads the output, so that the elements it leaves alone keep
/// their values. An output only assigned is stored without being read (no extra traffic).
pub fn reads_output(operation: &str, name: &str) -> bool {
    let code = strip_comments(operation);
    for statement in top_level_statements(&code) {
        let text = statement.trim_start();
        let Some(end) = uses(text, name).next() else {
            if ["return", "goto", "throw"]
                .iter()
                .any(|word| uses(text, word).next().is_some())
            {
                return true;
            }
            continue;
        };
        // The first statement that mentions the output decides.
        let rest = text[end..].trim_start();
        let assigned = end == name.len() && rest.starts_with('=') && !rest.starts_with("==");
        return !(assigned && uses(&rest[1..], name).next().is_none());
    }
    true
}

/// `code` with its `//` and `/* */` comments replaced by spaces.
fn strip_comments(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(k) = rest.find('/') {
        let (before, from) = rest.split_at(k);
        out.push_str(before);
        let end = if from.starts_with("//") {
            from.find('\n').unwrap_or(from.len())
        } else if let Some(body) = from.strip_prefix("/*") {
            body.find("*/").map_or(from.len(), |e| e + 4)
        } else {
            1
        };
        if end == 1 {
            out.push('/');
        } else {
            out.push(' ');
        }
        rest = &from[end..];
    }
    out.push_str(rest);
    out
}

/// The statements of `code` separated by `;` outside any parentheses, brackets or braces (a
/// braced block stays inside the statement it belongs to).
fn top_level_statements(code: &str) -> impl Iterator<Item = &str> {
    let mut depth = 0i32;
    let mut start = 0;
    let mut cuts = Vec::new();
    for (k, c) in code.char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ';' if depth == 0 => {
                cuts.push(&code[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    cuts.push(&code[start..]);
    cuts.into_iter()
}

/// Whether `operation` reads its index `i` (then the loop must run in the C order that `i`
/// counts, see `ops::plan`).
pub fn uses_index(operation: &str) -> bool {
    uses(operation, "i").next().is_some()
}

/// Where `name` occurs in `text` as a name of its own (not part of another identifier, nor a
/// member after `.`): the byte offset just past each occurrence.
fn uses<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = usize> + 'a {
    let bytes = text.as_bytes();
    let is_ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    text.match_indices(name).filter_map(move |(start, _)| {
        let end = start + name.len();
        let inside = (start > 0 && (is_ident(bytes[start - 1]) || bytes[start - 1] == b'.'))
            || (end < bytes.len() && is_ident(bytes[end]));
        (!inside).then_some(end)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotion_binds_each_input_its_own_dtype_and_the_rest_their_promotion() {
        let spec = Spec::new("A a, B b", "R out", "out = a + b", "plus", "").unwrap();
        let spec = spec.built_in(Rule::Promote("plus"), "", &[]);
        let (f16, f32, i32) = (DType::Float16, DType::Float32, DType::Int32);
        let bind = |given: &[Option<DType>]| spec.bind(given, &[None; 3]);
        assert_eq!(
            bind(&[Some(f16), Some(f32), None]).unwrap()[..],
            [f16, f32, f32]
        );
        // A scalar (no dtype given) takes the array's; an output passed is checked later, with
        // its shape.
        assert_eq!(
            bind(&[Some(f16), None, Some(i32)]).unwrap()[..],
            [f16, f16, f16]
        );
        let e = bind(&[Some(i32), Some(f32), None]).unwrap_err().to_string();
        assert!(
            e.contains("plus") && e.contains("int32") && e.contains("float32"),
            "{e}"
        );
        assert!(bind(&[None, None, None]).is_err());
        assert_eq!(spec.op(), "plus");
    }

    #[test]
    fn parses_cupy_parameter_lists() {
        let s = Spec::new("T x, raw float32 w, float32 a", "T z", "z = x", "k", "").unwrap();
        assert_eq!(s.inputs.len(), 3);
        assert_eq!(s.inputs[0].ty, Type::Generic("T".into()));
        assert!(s.inputs[1].raw && s.inputs[1].ty == Type::Fixed(DType::Float32));
        assert_eq!(s.type_names(), vec!["T"]);
        assert!(Spec::new("", "float32 z", "z = 1", "k", "").is_ok());
        // No outputs, as in CuPy: the operation writes through raw parameters.
        assert!(Spec::new("raw float32 x", "", "x[i] = 1", "k", "").is_ok());
        assert!(Spec::new("", "", "", "k", "").is_ok());
        // Each refusal names the part of the declaration and the text refused.
        for (ins, outs, name, refused) in [
            ("float x", "float32 z", "k", ("in_params", "float")),
            ("float32", "float32 z", "k", ("in_params", "float32")),
            (
                "float32 x y z",
                "float32 z",
                "k",
                ("in_params", "float32 x y z"),
            ),
            ("float32 i", "float32 z", "k", ("in_params", "i")),
            ("float32 x,", "float32 z", "k", ("in_params", "float32 x,")),
            ("float32 x", "float32 x", "k", ("parameter", "x")),
            ("T x", "float32 T", "k", ("type name", "T")),
            ("float32 x", "float32 z", "not an id", ("name", "not an id")),
        ] {
            match Spec::new(ins, outs, "", name, "").err() {
                Some(Error::Declaration { part, text, .. }) => assert_eq!((part, &*text), refused),
                other => panic!("{refused:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn binds_type_names_from_arrays_then_scalars() {
        let s = Spec::new("T x, T y, U a", "T z", "", "k", "").unwrap();
        let f32 = Some(DType::Float32);
        // x binds T; a Python float binds U to its default.
        let d = s
            .bind(
                &[f32, None, None, None],
                &[None, f32, Some(DType::Float64), None],
            )
            .unwrap();
        assert_eq!(
            d,
            vec![
                DType::Float32,
                DType::Float32,
                DType::Float64,
                DType::Float32
            ]
        );
        // Two arrays disagree on T.
        assert!(s
            .bind(&[f32, Some(DType::Int32), f32, None], &[None; 4])
            .is_err());
        // Nothing binds T.
        let s = Spec::new("float32 a", "T z", "", "k", "").unwrap();
        assert!(s.bind(&[f32, None], &[None, None]).is_err());
        // A fixed parameter takes no other dtype.
        assert!(s.bind(&[Some(DType::Float64), f32], &[None, None]).is_err());
    }

    #[test]
    fn outputs_are_loaded_unless_certainly_assigned() {
        // Certainly assigned: a plain top-level assignment before any other mention.
        for op in [
            "z = a * x + y",
            "z = x; zz = z2 + p.z",
            "z = x; z += 1",
            "float t = x * 2; z = t",
            "z = x; // z = z + 1",
            "/* set */ z = x;",
            "z = (x > 0) ? x : -x;",
            "z=x",
        ] {
            assert!(!reads_output(op, "z"), "{op}");
        }
        // Read, conditional, nested or possibly skipped: loaded.
        for op in [
            "z += x",
            "z = z + 1",
            "f(z)",
            "z == 1",
            "if (x > 0) z = x",
            "if (x == 0) z = 1; else z = 2;",
            "if (x > 0) { z = x; }",
            "{ z = x; }",
            "for (int k = 0; k < 1; ++k) z = x;",
            "x > 0 && (z = x)",
            "if (x < 0) return; z = x",
            "w = x",
            "",
        ] {
            assert!(reads_output(op, "z"), "{op}");
        }
    }

    #[test]
    fn type_names_are_one_letter_or_a_dtype() {
        for bad in [
            "flaot32", "single", "f4", "int32_t", "size_t", "float", "TT", "_",
        ] {
            let e = Spec::new(&format!("{bad} x"), "float32 z", "z = x", "k", "").unwrap_err();
            let text = e.to_string();
            assert!(text.contains(bad) && text.contains("bfloat16"), "{text}");
        }
        assert!(Spec::new("U x, bfloat16 y", "U z", "z = x", "k", "").is_ok());
    }

    #[test]
    fn the_index_is_used_only_where_named() {
        assert!(uses_index("z = w[i]"));
        assert!(uses_index("z = x * i"));
        assert!(!uses_index("z = x + pi + idx + w.i + _ind.size()"));
        assert!(!uses_index("if (x) z = 1;"));
    }
}
