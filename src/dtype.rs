//! Element types: the one table that maps cubridge dtypes to DLPack codes, CUDA array interface
//! typestrs, buffer-protocol formats and canonical names, and the promotion rules of `add`.

use crate::error::{Error, Result};
use dlpark::ffi::{DLDataType, DLDataTypeCode};

/// The kind of a dtype, which decides what it may be combined with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `bool`.
    Bool,
    /// Signed integers.
    Int,
    /// Unsigned integers.
    UInt,
    /// Real floating point (including float16 and bfloat16).
    Float,
    /// Complex floating point.
    Complex,
}

/// An element type that cubridge can hold, exchange and compute on. The default is float32,
/// the Array API's default floating dtype.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum DType {
    /// 8-bit boolean (0 or 1).
    Bool,
    /// Signed 8-bit integer.
    Int8,
    /// Signed 16-bit integer.
    Int16,
    /// Signed 32-bit integer.
    Int32,
    /// Signed 64-bit integer.
    Int64,
    /// Unsigned 8-bit integer.
    UInt8,
    /// Unsigned 16-bit integer.
    UInt16,
    /// Unsigned 32-bit integer.
    UInt32,
    /// Unsigned 64-bit integer.
    UInt64,
    /// IEEE 754 half precision.
    Float16,
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    BFloat16,
    /// IEEE 754 single precision.
    #[default]
    Float32,
    /// IEEE 754 double precision.
    Float64,
    /// Two float32 (real, imaginary).
    Complex64,
    /// Two float64 (real, imaginary).
    Complex128,
}

/// One row of the dtype table.
struct Row {
    dtype: DType,
    name: &'static str,
    kind: Kind,
    bits: u8,
    /// `__cuda_array_interface__` / numpy array-interface typestr; `None` where there is none.
    typestr: Option<&'static str>,
    /// PEP 3118 struct format character(s); `None` where there is none.
    format: Option<&'static str>,
}

const fn row(
    dtype: DType,
    name: &'static str,
    kind: Kind,
    bits: u8,
    typestr: Option<&'static str>,
    format: Option<&'static str>,
) -> Row {
    Row {
        dtype,
        name,
        kind,
        bits,
        typestr,
        format,
    }
}

// bfloat16 has no typestr and no buffer format that other libraries agree on, so cubridge offers
// none rather than one that a reader would misinterpret.
const TABLE: [Row; 15] = [
    row(DType::Bool, "bool", Kind::Bool, 8, Some("|b1"), Some("?")),
    row(DType::Int8, "int8", Kind::Int, 8, Some("|i1"), Some("b")),
    row(DType::Int16, "int16", Kind::Int, 16, Some("<i2"), Some("h")),
    row(DType::Int32, "int32", Kind::Int, 32, Some("<i4"), Some("i")),
    row(DType::Int64, "int64", Kind::Int, 64, Some("<i8"), Some("q")),
    row(DType::UInt8, "uint8", Kind::UInt, 8, Some("|u1"), Some("B")),
    row(
        DType::UInt16,
        "uint16",
        Kind::UInt,
        16,
        Some("<u2"),
        Some("H"),
    ),
    row(
        DType::UInt32,
        "uint32",
        Kind::UInt,
        32,
        Some("<u4"),
        Some("I"),
    ),
    row(
        DType::UInt64,
        "uint64",
        Kind::UInt,
        64,
        Some("<u8"),
        Some("Q"),
    ),
    row(
        DType::Float16,
        "float16",
        Kind::Float,
        16,
        Some("<f2"),
        Some("e"),
    ),
    row(DType::BFloat16, "bfloat16", Kind::Float, 16, None, None),
    row(
        DType::Float32,
        "float32",
        Kind::Float,
        32,
        Some("<f4"),
        Some("f"),
    ),
    row(
        DType::Float64,
        "float64",
        Kind::Float,
        64,
        Some("<f8"),
        Some("d"),
    ),
    row(
        DType::Complex64,
        "complex64",
        Kind::Complex,
        64,
        Some("<c8"),
        Some("Zf"),
    ),
    row(
        DType::Complex128,
        "complex128",
        Kind::Complex,
        128,
        Some("<c16"),
        Some("Zd"),
    ),
];

impl DType {
    /// Every supported dtype, in table order.
    pub const ALL: [DType; 15] = [
        DType::Bool,
        DType::Int8,
        DType::Int16,
        DType::Int32,
        DType::Int64,
        DType::UInt8,
        DType::UInt16,
        DType::UInt32,
        DType::UInt64,
        DType::Float16,
        DType::BFloat16,
        DType::Float32,
        DType::Float64,
        DType::Complex64,
        DType::Complex128,
    ];

    fn row(self) -> &'static Row {
        // The table is in declaration order, so the discriminant indexes it.
        &TABLE[self as usize]
    }

    /// The canonical name (`"float32"`, `"bfloat16"`, ...), as numpy and the Array API spell it.
    pub fn name(self) -> &'static str {
        self.row().name
    }

    /// Parses a canonical name.
    pub fn from_name(name: &str) -> Result<DType> {
        TABLE
            .iter()
            .find(|r| r.name == name)
            .map(|r| r.dtype)
            .ok_or_else(|| DType::unknown(&format!("{name:?}")))
    }

    /// The error for a dtype, described as `what`, that cubridge does not have; it lists the
    /// names cubridge accepts.
    pub fn unknown(what: &str) -> Error {
        let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
        Error::UnsupportedDType(format!(
            "{what}; cubridge's dtypes are {}",
            names.join(", ")
        ))
    }

    /// The kind (bool, int, uint, float, complex).
    pub fn kind(self) -> Kind {
        self.row().kind
    }

    /// Size of one element in bytes.
    pub fn itemsize(self) -> usize {
        self.row().bits as usize / 8
    }

    /// The DLPack data type (one lane).
    pub fn to_dlpack(self) -> DLDataType {
        let code = match self.kind() {
            Kind::Bool => DLDataTypeCode::BOOL,
            Kind::Int => DLDataTypeCode::INT,
            Kind::UInt => DLDataTypeCode::UINT,
            Kind::Float if self == DType::BFloat16 => DLDataTypeCode::BFLOAT,
            Kind::Float => DLDataTypeCode::FLOAT,
            Kind::Complex => DLDataTypeCode::COMPLEX,
        };
        DLDataType::scalar(code, self.row().bits)
    }

    /// Reads a DLPack data type from an untrusted descriptor.
    pub fn from_dlpack(dt: DLDataType) -> Result<DType> {
        let unsupported = || {
            Error::UnsupportedDType(format!(
                "DLPack type code {} with {} bits and {} lanes",
                dt.code.0, dt.bits, dt.lanes
            ))
        };
        if dt.lanes != 1 {
            return Err(unsupported());
        }
        let kind = match dt.code {
            DLDataTypeCode::BOOL => Kind::Bool,
            DLDataTypeCode::INT => Kind::Int,
            DLDataTypeCode::UINT => Kind::UInt,
            DLDataTypeCode::FLOAT => Kind::Float,
            DLDataTypeCode::BFLOAT if dt.bits == 16 => return Ok(DType::BFloat16),
            DLDataTypeCode::COMPLEX => Kind::Complex,
            _ => return Err(unsupported()),
        };
        TABLE
            .iter()
            .find(|r| r.kind == kind && r.bits == dt.bits && r.dtype != DType::BFloat16)
            .map(|r| r.dtype)
            .ok_or_else(unsupported)
    }

    /// The CUDA array interface typestr (little-endian), if the dtype has one.
    pub fn typestr(self) -> Option<&'static str> {
        self.row().typestr
    }

    /// Parses a CUDA array interface / array interface typestr such as `"<f4"` or `"|u1"`.
    pub fn from_typestr(typestr: &str) -> Result<DType> {
        let unsupported = || Error::UnsupportedDType(format!("typestr {typestr:?}"));
        let mut chars = typestr.chars();
        let order = chars.next().ok_or_else(unsupported)?;
        let rest = chars.as_str();
        if order == '>' {
            return Err(Error::UnsupportedDType(format!(
                "typestr {typestr:?} is big-endian; cubridge reads native little-endian data only"
            )));
        }
        if !matches!(order, '<' | '|' | '=') {
            return Err(unsupported());
        }
        TABLE
            .iter()
            .find(|r| r.typestr.is_some_and(|t| &t[1..] == rest))
            .map(|r| r.dtype)
            .ok_or_else(unsupported)
    }

    /// The PEP 3118 buffer format, if the dtype has one.
    pub fn buffer_format(self) -> Option<&'static str> {
        self.row().format
    }

    /// Parses a PEP 3118 format string as the buffer protocol hands it over. `itemsize` settles
    /// the native C types whose width varies (`l`, `L`, `n`, `N`).
    pub fn from_buffer_format(format: &str, itemsize: usize) -> Result<DType> {
        let unsupported = || Error::UnsupportedDType(format!("buffer format {format:?}"));
        let body = match format.as_bytes().first() {
            Some(b'>' | b'!') => {
                return Err(Error::UnsupportedDType(format!(
                    "buffer format {format:?} is big-endian; cubridge reads native data only"
                )))
            }
            Some(b'@' | b'=' | b'<') => &format[1..],
            _ => format,
        };
        let dtype = match body {
            "l" | "q" | "n" | "i" | "h" | "b" => int_of_size(Kind::Int, itemsize),
            "L" | "Q" | "N" | "I" | "H" | "B" => int_of_size(Kind::UInt, itemsize),
            "?" => Some(DType::Bool),
            "e" => Some(DType::Float16),
            "f" => Some(DType::Float32),
            "d" => Some(DType::Float64),
            "Zf" => Some(DType::Complex64),
            "Zd" => Some(DType::Complex128),
            _ => None,
        }
        .ok_or_else(unsupported)?;
        if dtype.itemsize() != itemsize {
            return Err(Error::invalid(format!(
                "buffer format {format:?} has itemsize {itemsize}, expected {}",
                dtype.itemsize()
            )));
        }
        Ok(dtype)
    }

    /// The dtype of `a + b` under the Array API standard's promotion rules, restricted to one
    /// kind: bool with bool, integers with integers (signed with unsigned when a wider signed type
    /// holds both), floating with floating or complex. Everything else is an error naming both.
    pub fn promote(a: DType, b: DType, op: &'static str) -> Result<DType> {
        use Kind::*;
        let mismatch = || Error::DTypeMismatch {
            op,
            left: a.name().into(),
            right: b.name().into(),
        };
        if a == b {
            return Ok(a);
        }
        let (ka, kb) = (a.kind(), b.kind());
        match (ka, kb) {
            (Int, Int) | (UInt, UInt) => Ok(if a.itemsize() >= b.itemsize() { a } else { b }),
            (Int, UInt) | (UInt, Int) => {
                let (signed, unsigned) = if ka == Int { (a, b) } else { (b, a) };
                if signed.itemsize() > unsigned.itemsize() {
                    Ok(signed)
                } else {
                    // The smallest signed type wider than the unsigned one; none above int64.
                    int_of_size(Int, unsigned.itemsize() * 2).ok_or_else(mismatch)
                }
            }
            (Float, Float) => Ok(match (a, b) {
                // float16 and bfloat16 share no 16-bit supertype: both fit exactly in float32.
                (DType::Float16, DType::BFloat16) | (DType::BFloat16, DType::Float16) => {
                    DType::Float32
                }
                _ if a.itemsize() >= b.itemsize() => a,
                _ => b,
            }),
            (Complex, Complex) => Ok(if a.itemsize() >= b.itemsize() { a } else { b }),
            (Float, Complex) | (Complex, Float) => {
                let (real, complex) = if ka == Float { (a, b) } else { (b, a) };
                Ok(if real == DType::Float64 {
                    DType::Complex128
                } else {
                    complex
                })
            }
            _ => Err(mismatch()),
        }
    }
}

impl DType {
    /// numpy's promotion of two dtypes across kinds as well (`numpy.result_type` of two arrays):
    /// within a kind as [`DType::promote`]; bool yields to any other; an integer meets a floating
    /// or complex dtype in one that holds it (8-bit integers in float16, 16-bit in float32,
    /// wider in float64); int64 and uint64 meet in float64. For dtypes given by numpy values, as
    /// the elements of a list (`asarray([numpy.int32(1), numpy.float32(2)])` is float64).
    pub fn result_type(a: DType, b: DType) -> DType {
        use Kind::*;
        if let Ok(d) = DType::promote(a, b, "result_type") {
            return d;
        }
        let holding = |int: DType| match int.itemsize() {
            1 => DType::Float16,
            2 => DType::Float32,
            _ => DType::Float64,
        };
        let within = |x: DType, y: DType| DType::promote(x, y, "result_type").unwrap_or(x);
        match (a.kind(), b.kind()) {
            (Bool, _) => b,
            (_, Bool) => a,
            (Int | UInt, Float | Complex) => within(b, holding(a)),
            (Float | Complex, Int | UInt) => within(a, holding(b)),
            // int64 and uint64: no integer holds both.
            _ => DType::Float64,
        }
    }
}

fn int_of_size(kind: Kind, bytes: usize) -> Option<DType> {
    TABLE
        .iter()
        .find(|r| r.kind == kind && r.bits as usize == bytes * 8)
        .map(|r| r.dtype)
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_in_declaration_order() {
        for (i, d) in DType::ALL.iter().enumerate() {
            assert_eq!(TABLE[i].dtype, *d);
            assert_eq!(*d as usize, i);
        }
    }

    #[test]
    fn result_type_crosses_kinds_as_numpy() {
        use DType::*;
        for (a, b, want) in [
            (Int32, Float32, Float64),
            (Int8, Float32, Float32),
            (UInt8, Float16, Float16),
            (Int16, Float16, Float32),
            (Int64, Complex64, Complex128),
            (Bool, Int8, Int8),
            (Float64, Bool, Float64),
            (Int64, UInt64, Float64),
            (Int8, UInt8, Int16),
            (Float32, Complex64, Complex64),
        ] {
            assert_eq!(DType::result_type(a, b), want, "{a} {b}");
            assert_eq!(DType::result_type(b, a), want, "{b} {a}");
        }
    }

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()).unwrap(), d);
        }
        assert!(DType::from_name("float8").is_err());
    }

    #[test]
    fn dlpack_round_trip_and_known_codes() {
        for d in DType::ALL {
            assert_eq!(DType::from_dlpack(d.to_dlpack()).unwrap(), d);
        }
        assert_eq!(DType::Float32.to_dlpack(), DLDataType::F32);
        assert_eq!(DType::BFloat16.to_dlpack(), DLDataType::BF16);
        assert_eq!(DType::Complex64.to_dlpack(), DLDataType::C64);
        assert_eq!(DType::Bool.to_dlpack(), DLDataType::BOOL);
    }

    #[test]
    fn dlpack_rejects_lanes_and_unknown_codes() {
        let mut vec4 = DLDataType::F32;
        vec4.lanes = 4;
        assert!(DType::from_dlpack(vec4).is_err());
        assert!(DType::from_dlpack(DLDataType::F8E4M3FN).is_err());
        assert!(DType::from_dlpack(DLDataType::scalar(DLDataTypeCode::FLOAT, 80)).is_err());
        assert!(DType::from_dlpack(DLDataType::scalar(DLDataTypeCode::BFLOAT, 32)).is_err());
        assert!(DType::from_dlpack(DLDataType::scalar(DLDataTypeCode(200), 8)).is_err());
    }

    #[test]
    fn typestrs_round_trip() {
        for d in DType::ALL {
            match d.typestr() {
                Some(t) => assert_eq!(DType::from_typestr(t).unwrap(), d),
                None => assert_eq!(d, DType::BFloat16),
            }
        }
        assert_eq!(DType::from_typestr("=f4").unwrap(), DType::Float32);
        assert!(DType::from_typestr(">f4").is_err());
        assert!(DType::from_typestr("<f3").is_err());
        assert!(DType::from_typestr("").is_err());
    }

    #[test]
    fn buffer_formats() {
        for d in DType::ALL {
            if let Some(f) = d.buffer_format() {
                assert_eq!(DType::from_buffer_format(f, d.itemsize()).unwrap(), d);
            }
        }
        assert_eq!(DType::from_buffer_format("l", 8).unwrap(), DType::Int64);
        assert_eq!(DType::from_buffer_format("<L", 4).unwrap(), DType::UInt32);
        assert!(DType::from_buffer_format(">i", 4).is_err());
        assert!(DType::from_buffer_format("f", 8).is_err());
        assert!(DType::from_buffer_format("T{i:x:}", 4).is_err());
    }

    #[test]
    fn promotion_follows_the_array_api_within_a_kind() {
        use DType::*;
        let p = |a, b| DType::promote(a, b, "add");
        assert_eq!(p(Float16, Float32).unwrap(), Float32);
        assert_eq!(p(Int8, Int32).unwrap(), Int32);
        assert_eq!(p(UInt8, Int16).unwrap(), Int16);
        assert_eq!(p(UInt8, Int8).unwrap(), Int16);
        assert_eq!(p(UInt32, Int32).unwrap(), Int64);
        assert_eq!(p(UInt16, UInt64).unwrap(), UInt64);
        assert_eq!(p(BFloat16, Float16).unwrap(), Float32);
        assert_eq!(p(BFloat16, Float64).unwrap(), Float64);
        assert_eq!(p(Float32, Complex64).unwrap(), Complex64);
        assert_eq!(p(Float64, Complex64).unwrap(), Complex128);
        assert_eq!(p(Bool, Bool).unwrap(), Bool);
        for (a, b) in [
            (Int32, Float32),
            (Bool, Int8),
            (UInt64, Int64),
            (UInt8, Complex64),
        ] {
            let e = p(a, b).unwrap_err();
            assert!(matches!(e, Error::DTypeMismatch { .. }), "{a} {b}");
            assert_eq!(
                p(b, a).unwrap_err(),
                Error::DTypeMismatch {
                    op: "add",
                    left: b.name().into(),
                    right: a.name().into()
                }
            );
        }
        // Symmetric wherever defined.
        for a in DType::ALL {
            for b in DType::ALL {
                assert_eq!(p(a, b).ok(), p(b, a).ok(), "{a} {b}");
            }
        }
    }
}
