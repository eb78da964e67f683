//! The declaration of a reduction (a user's `ReductionKernel`, or a built-in such as `sum`), in
//! CuPy's syntax: the parameter lists of the elementwise engine ([`Spec`], parsed by the same
//! parser), a map expression of the inputs (and `_J`, the index along the reduced elements),
//! a reduce expression of `a` and `b`, a post-map statement that writes the outputs from `a`,
//! an identity, and the type the reduction runs in.

use crate::error::{Error, Result};
use crate::ops::elementwise::spec::{Rule, Spec};

/// Names the generated reduction code gives a meaning of its own: no parameter may take them
/// (`a` and `b` only where the post-map statement would see them: outputs and raw arrays).
const RESERVED: &[&str] = &["_J", "_type_reduce", "cb_map", "cb_reduce", "cb_post"];

/// A parsed reduction; see the module documentation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ReductionSpec {
    /// The parameters, name, preamble and (for built-ins) header and binding rule. Its
    /// `operation` holds every expression, so that the generator sees which headers they use.
    pub spec: Spec,
    /// The value each element contributes, of the inputs and `_J`.
    pub map_expr: String,
    /// Two partial results `a` and `b` combined into one.
    pub reduce_expr: String,
    /// Statements that write the outputs from the reduced value `a`.
    pub post_map_expr: String,
    /// The C++ expression that starts every partial result (`_type_reduce(identity)`); empty
    /// for none (as CuPy, the partial then starts value-initialized).
    pub identity: String,
    /// Whether a reduction over no elements is allowed (it gives the identity).
    pub empty_ok: bool,
    /// The C++ type of partial results.
    pub reduce_type: String,
    /// Whether dimensions are merged where the layouts allow (CuPy's `reduce_dims`).
    pub reduce_dims: bool,
    /// NVRTC options beyond the architecture.
    pub options: Vec<String>,
}

/// The code of one part of a reduction, as a user writes it.
pub struct Code<'a> {
    /// The map expression.
    pub map_expr: &'a str,
    /// The reduce expression.
    pub reduce_expr: &'a str,
    /// The post-map statements.
    pub post_map_expr: &'a str,
    /// The identity, if any.
    pub identity: Option<&'a str>,
    /// The reduce type; `None`: the first output's type, as CuPy takes it.
    pub reduce_type: Option<&'a str>,
}

/// Whether `text` may stand as a C++ type in a typedef: names, `::`, template brackets,
/// commas, spaces and pointers; nothing that ends a declaration or opens a block.
fn is_type_text(text: &str) -> bool {
    !text.trim().is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || " _:<>,*&".contains(c))
}

impl ReductionSpec {
    /// Parses and checks a reduction's declaration; every refusal names the part refused.
    pub fn new(
        in_params: &str,
        out_params: &str,
        code: Code<'_>,
        name: &str,
        preamble: &str,
        (reduce_dims, options): (bool, Vec<String>),
    ) -> Result<ReductionSpec> {
        let all_code = [
            code.map_expr,
            code.reduce_expr,
            code.post_map_expr,
            code.identity.unwrap_or(""),
            code.reduce_type.unwrap_or(""),
        ]
        .join("\n");
        let spec = Spec::new(in_params, out_params, &all_code, name, preamble)?;
        let Some(first) = spec.outputs.first() else {
            return Err(Error::declaration(
                "out_params",
                out_params,
                "declares no output: a reduction writes at least one",
            ));
        };
        let first_type = match &first.ty {
            crate::ops::elementwise::spec::Type::Fixed(d) => d.name().to_string(),
            crate::ops::elementwise::spec::Type::Generic(t) => t.clone(),
        };
        for (k, p) in spec.params().enumerate() {
            let seen_by_post = k >= spec.inputs.len() || p.raw;
            if RESERVED.contains(&p.name.as_str())
                || (seen_by_post && (p.name == "a" || p.name == "b"))
            {
                let part = if k < spec.inputs.len() {
                    "in_params"
                } else {
                    "out_params"
                };
                let why = "cannot name a parameter of a reduction (`a` and `b` are the reduced \
                           values in post_map_expr; `_J` and `_type_reduce` are the generated \
                           code's)";
                return Err(Error::declaration(part, &p.name, why));
            }
        }
        for (part, text) in [
            ("map_expr", code.map_expr),
            ("reduce_expr", code.reduce_expr),
        ] {
            if text.trim().is_empty() {
                return Err(Error::declaration(
                    part,
                    text,
                    "is empty: give an expression",
                ));
            }
        }
        let reduce_type = code.reduce_type.map_or(first_type, str::to_string);
        if !is_type_text(&reduce_type) {
            let why = "is not a C++ type (a dtype name, a type name such as T, or a C++ type \
                       such as float or my_pair)";
            return Err(Error::declaration("reduce_type", &reduce_type, why));
        }
        let identity = code.identity.unwrap_or("").trim().to_string();
        if identity.contains(';') {
            let why = "is not an expression";
            return Err(Error::declaration("identity", &identity, why));
        }
        Ok(ReductionSpec {
            spec,
            map_expr: code.map_expr.to_string(),
            reduce_expr: code.reduce_expr.to_string(),
            post_map_expr: code.post_map_expr.to_string(),
            empty_ok: !identity.is_empty(),
            identity,
            reduce_type: reduce_type.trim().to_string(),
            reduce_dims,
            options,
        })
    }

    /// The declaration of a built-in reduction: bound by the caller (its `rule` names the op),
    /// with cubridge's `header`; `empty_ok` says whether it reduces no elements (sum) or
    /// refuses to (max).
    pub(crate) fn built_in(
        mut self,
        rule: Rule,
        header: &'static str,
        options: &'static [&'static str],
        empty_ok: bool,
    ) -> ReductionSpec {
        self.spec = self.spec.built_in(rule, header, options);
        self.options = options.iter().map(|o| o.to_string()).collect();
        self.empty_ok = empty_ok;
        self
    }

    /// Whether the map expression reads `_J` (the reduced dimensions then keep C order).
    pub fn uses_index(&self) -> bool {
        let bytes = self.map_expr.as_bytes();
        let is_ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
        self.map_expr.match_indices("_J").any(|(k, _)| {
            (k == 0 || !is_ident(bytes[k - 1])) && bytes.get(k + 2).is_none_or(|&c| !is_ident(c))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code<'a>(map: &'a str, reduce: &'a str, post: &'a str) -> Code<'a> {
        Code {
            map_expr: map,
            reduce_expr: reduce,
            post_map_expr: post,
            identity: Some("0"),
            reduce_type: None,
        }
    }

    fn make(ins: &str, outs: &str, c: Code<'_>) -> Result<ReductionSpec> {
        ReductionSpec::new(ins, outs, c, "k", "", (true, vec![]))
    }

    #[test]
    fn parses_cupys_declarations() {
        let s = make("T x", "T y", code("x * x", "a + b", "y = a")).unwrap();
        assert_eq!(s.reduce_type, "T");
        assert!(s.empty_ok && !s.uses_index());
        let c = Code {
            identity: None,
            reduce_type: Some("float"),
            ..code("make_pair(x, _J)", "a", "y = a")
        };
        let s = make("T x, raw T w, float32 s", "int64 y, T z", c).unwrap();
        assert_eq!(s.reduce_type, "float");
        assert!(!s.empty_ok && s.uses_index());
        // An input may be called a (CuPy's examples do); the map sees it, post-map does not.
        assert!(make("T a", "T y", code("a", "a + b", "y = a")).is_ok());
    }

    #[test]
    fn every_malformed_part_is_named() {
        let ok = || code("x", "a + b", "y = a");
        let cases: Vec<(&str, &str, Code<'_>, (&str, &str))> = vec![
            ("float x", "T y", ok(), ("in_params", "float")),
            ("T x", "", ok(), ("out_params", "")),
            ("T x", "T a", ok(), ("out_params", "a")),
            ("T x, raw T b", "T y", ok(), ("in_params", "b")),
            ("T _J", "T y", ok(), ("in_params", "_J")),
            ("T x", "T y", code(" ", "a", "y = a"), ("map_expr", " ")),
            ("T x", "T y", code("x", "", "y = a"), ("reduce_expr", "")),
            (
                "T x",
                "T y",
                Code {
                    reduce_type: Some("float; int"),
                    ..ok()
                },
                ("reduce_type", "float; int"),
            ),
            (
                "T x",
                "T y",
                Code {
                    identity: Some("0; x"),
                    ..ok()
                },
                ("identity", "0; x"),
            ),
        ];
        for (ins, outs, c, refused) in cases {
            match make(ins, outs, c).err() {
                Some(Error::Declaration { part, text, .. }) => {
                    assert_eq!((part, &*text), refused)
                }
                other => panic!("{refused:?}: {other:?}"),
            }
        }
    }
}
