//! The one error type of cubridge. Each variant carries the values that explain it; the Python
//! layer maps every variant to one exception class in one place (`python/errors.rs`).

use cudarc::driver::sys::CUresult;
use cudarc::nvrtc::sys::nvrtcResult;
use std::fmt;

/// Everything that can go wrong in cubridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A dtype that cubridge does not support, described as it was given.
    UnsupportedDType(String),
    /// An operation that is not defined for these dtypes (for example int + float).
    DTypeMismatch {
        /// What was being attempted.
        op: &'static str,
        /// The left dtype's name.
        left: String,
        /// The right dtype's name.
        right: String,
    },
    /// A device that cubridge does not support, described as it was given.
    UnsupportedDevice(String),
    /// Arrays that must share a device do not.
    DeviceMismatch {
        /// The first device.
        left: String,
        /// The second device.
        right: String,
    },
    /// Shapes that cannot be broadcast together.
    Broadcast {
        /// The first shape.
        left: Vec<usize>,
        /// The second shape.
        right: Vec<usize>,
    },
    /// A byte stride of a foreign descriptor that is not a whole number of elements.
    Stride {
        /// The stride in bytes.
        bytes: i64,
        /// The element size in bytes.
        itemsize: usize,
    },
    /// A number of dimensions outside the 0 to `max` cubridge supports (`layout::MAX_NDIM`).
    Dims { ndim: i64, max: usize },
    /// A kernel declaration refused: the part (`in_params`, `name`, ...), the text, and why.
    Declaration {
        /// The part of the declaration.
        part: &'static str,
        /// The text refused.
        text: String,
        /// What is wrong with it.
        why: String,
    },
    /// A launch configuration that CUDA refuses, and the limit it breaks.
    Launch {
        /// Blocks along x, y, z.
        grid: [u32; 3],
        /// Threads a block along x, y, z.
        block: [u32; 3],
        /// CUDA's limit.
        limit: &'static str,
    },
    /// Any other invalid argument or descriptor field, with a message naming the value.
    Invalid(String),
    /// A value outside the range of the type it must be stored as (maps to `OverflowError`, as
    /// numpy 2 and Python do).
    Overflow(String),
    /// A write into memory that its producer marked read-only.
    ReadOnly(String),
    /// A DLPack export request that the producer refuses, or a buffer-protocol request cubridge
    /// refuses (maps to `BufferError`).
    Export(String),
    /// An argument of a type that cubridge cannot read or take where it was given (maps to
    /// `TypeError`).
    WrongType(String),
    /// An attribute that this array does not have (maps to `AttributeError`): the CUDA array
    /// interface of host memory, say.
    NoAttribute(String),
    /// A host or device allocation failed.
    OutOfMemory {
        /// The requested size in bytes.
        bytes: usize,
        /// Where the allocation was attempted.
        device: String,
    },
    /// CUDA was asked for on a machine without a usable driver.
    CudaUnavailable(String),
    /// A CUDA driver call failed.
    Cuda {
        /// The driver's result code; [`crate::cuda::is_capture_refusal`] and
        /// [`crate::cuda::is_image_refusal`] classify it.
        code: CUresult,
        /// What cubridge was doing.
        context: String,
    },
    /// NVRTC failed to compile a kernel.
    Compile {
        /// The kernel that failed.
        kernel: String,
        /// NVRTC's result code, where an NVRTC call failed (none where NVRTC could not be loaded
        /// or run-time compilation is off).
        code: Option<nvrtcResult>,
        /// The NVRTC program log.
        log: String,
    },
    /// A cubridge runtime this build cannot use: the `cubridge` module's runtime table has
    /// another layout (maps to `ImportError`; see [`crate::cuda::shared`]).
    Incompatible(String),
    /// An error of the process's runtime (the `cubridge` module's), relayed to an extension
    /// crate's copy of cubridge: its kind, its driver or NVRTC result code, and its message.
    Relayed {
        /// What kind of error it was.
        kind: ErrorKind,
        /// The driver's `CUresult` or NVRTC's `nvrtcResult`, as a number.
        code: Option<i64>,
        /// The runtime's message.
        message: String,
    },
}

/// The kinds of [`Error`], one per exception class that Python raises for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ErrorKind {
    /// A value of a wrong type or dtype (`TypeError`).
    Type = 0,
    /// An invalid value (`ValueError`).
    Value = 1,
    /// An attribute the array lacks (`AttributeError`).
    Attribute = 2,
    /// A value out of range (`OverflowError`).
    Overflow = 3,
    /// A refused export (`BufferError`).
    Buffer = 4,
    /// An allocation failed (`MemoryError`).
    Memory = 5,
    /// No usable CUDA (`CudaUnavailableError`).
    CudaUnavailable = 6,
    /// A driver call failed (`CudaError`).
    Cuda = 7,
    /// NVRTC failed (`CompileError`).
    Compile = 8,
    /// An incompatible runtime (`ImportError`).
    Incompatible = 9,
}

impl ErrorKind {
    /// The kind numbered `raw`; an unknown number (from a newer runtime) is a `ValueError`.
    pub fn from_raw(raw: u32) -> ErrorKind {
        use ErrorKind::*;
        [
            Type,
            Value,
            Attribute,
            Overflow,
            Buffer,
            Memory,
            CudaUnavailable,
            Cuda,
            Compile,
            Incompatible,
        ]
        .into_iter()
        .find(|k| *k as u32 == raw)
        .unwrap_or(Value)
    }
}

/// The result type used throughout cubridge.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Shorthand for [`Error::Invalid`].
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::Invalid(message.into())
    }

    /// Shorthand for [`Error::Declaration`].
    pub fn declaration(part: &'static str, text: &str, why: impl Into<String>) -> Self {
        let (text, why) = (text.to_string(), why.into());
        Error::Declaration { part, text, why }
    }

    /// Shorthand for [`Error::Export`].
    pub fn export(message: impl Into<String>) -> Self {
        Error::Export(message.into())
    }

    /// Shorthand for [`Error::WrongType`].
    pub fn wrong_type(message: impl Into<String>) -> Self {
        Error::WrongType(message.into())
    }

    /// Shorthand for [`Error::NoAttribute`].
    pub fn no_attribute(message: impl Into<String>) -> Self {
        Error::NoAttribute(message.into())
    }

    /// The CUDA driver's result code of a failed driver call.
    pub fn cuda_code(&self) -> Option<CUresult> {
        match self {
            Error::Cuda { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The kind of error: which exception Python raises for it.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::UnsupportedDType(_) | Error::DTypeMismatch { .. } | Error::WrongType(_) => {
                ErrorKind::Type
            }
            Error::NoAttribute(_) => ErrorKind::Attribute,
            Error::UnsupportedDevice(_)
            | Error::DeviceMismatch { .. }
            | Error::Broadcast { .. }
            | Error::Stride { .. }
            | Error::Dims { .. }
            | Error::Declaration { .. }
            | Error::Launch { .. }
            | Error::Invalid(_)
            | Error::ReadOnly(_) => ErrorKind::Value,
            Error::Overflow(_) => ErrorKind::Overflow,
            Error::Export(_) => ErrorKind::Buffer,
            Error::OutOfMemory { .. } => ErrorKind::Memory,
            Error::CudaUnavailable(_) => ErrorKind::CudaUnavailable,
            // Outside an allocation (a launch, a module load), where no size was asked for.
            Error::Cuda { code, .. } if *code == CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                ErrorKind::Memory
            }
            Error::Cuda { .. } => ErrorKind::Cuda,
            Error::Compile { .. } => ErrorKind::Compile,
            Error::Incompatible(_) => ErrorKind::Incompatible,
            Error::Relayed { kind, .. } => *kind,
        }
    }

    /// The driver's or NVRTC's result code, as a number, where a call of theirs failed.
    pub fn code(&self) -> Option<i64> {
        match self {
            Error::Cuda { code, .. } => Some(*code as i64),
            Error::Compile { code, .. } => code.map(|c| c as i64),
            Error::Relayed { code, .. } => *code,
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::UnsupportedDType(what) => write!(f, "unsupported dtype: {what}"),
            Error::DTypeMismatch { op, left, right } => write!(
                f,
                "{op} is not defined for {left} and {right}: cubridge promotes only within a \
                 kind (bool, signed/unsigned integer, floating/complex); cast one operand first"
            ),
            Error::UnsupportedDevice(what) => write!(f, "unsupported device: {what}"),
            Error::DeviceMismatch { left, right } => {
                write!(f, "arrays are on different devices: {left} and {right}")
            }
            Error::Broadcast { left, right } => write!(
                f,
                "shapes {} and {} cannot be broadcast together",
                shape_str(left),
                shape_str(right)
            ),
            Error::Stride { bytes, itemsize } => {
                write!(f, "stride {bytes} is not a multiple of itemsize {itemsize}")
            }
            Error::Dims { ndim, max } => {
                write!(f, "{ndim} dimensions: cubridge supports 0 to {max}")
            }
            Error::Declaration { part, text, why } => write!(f, "{part}: {text:?} {why}"),
            Error::Launch { grid, block, limit } => {
                write!(f, "grid {grid:?} and block {block:?}: {limit}")
            }
            Error::Invalid(message)
            | Error::Overflow(message)
            | Error::ReadOnly(message)
            | Error::Export(message)
            | Error::WrongType(message)
            | Error::NoAttribute(message)
            | Error::Incompatible(message)
            | Error::Relayed { message, .. } => f.write_str(message),
            Error::OutOfMemory { bytes, device } => {
                write!(f, "could not allocate {bytes} bytes on {device}")
            }
            Error::CudaUnavailable(why) => write!(f, "CUDA is not available: {why}"),
            // The code's name is the driver's (`CUDA_ERROR_INVALID_VALUE`).
            Error::Cuda { code, context } => write!(f, "{code:?} while {context}"),
            Error::Compile { kernel, log, .. } => {
                write!(f, "NVRTC could not compile {kernel}:\n{log}")
            }
        }
    }
}

impl std::error::Error for Error {}

/// Formats a shape the way Python prints a tuple: `(2, 3)`, `(4,)`, `()`.
pub fn shape_str(shape: &[usize]) -> String {
    match shape {
        [] => "()".to_string(),
        [one] => format!("({one},)"),
        _ => {
            let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
            format!("({})", parts.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_print_like_python_tuples() {
        assert_eq!(shape_str(&[]), "()");
        assert_eq!(shape_str(&[4]), "(4,)");
        assert_eq!(shape_str(&[2, 3]), "(2, 3)");
    }

    #[test]
    fn cuda_errors_keep_and_name_their_code() {
        let e = Error::Cuda {
            code: CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
            context: "recording an event".into(),
        };
        assert_eq!(
            e.to_string(),
            "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED while recording an event"
        );
        assert_eq!(
            e.cuda_code(),
            Some(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
        );
        assert_eq!(Error::invalid("x").cuda_code(), None);
    }

    #[test]
    fn dtype_mismatch_names_both_dtypes() {
        let e = Error::DTypeMismatch {
            op: "add",
            left: "int32".into(),
            right: "float32".into(),
        };
        let text = e.to_string();
        assert!(text.contains("int32") && text.contains("float32"), "{text}");
    }
}
