//! Rust element types behind each dtype, the exact widening conversions that promotion needs, and
//! a dynamically typed [`Scalar`] for creation and casting.

use super::round;
use crate::dtype::DType;
use half::{bf16, f16};

/// A complex number laid out as DLPack, numpy and C expect: real part, then imaginary part.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Complex<T> {
    /// Real part.
    pub re: T,
    /// Imaginary part.
    pub im: T,
}

/// A value of any dtype, used where speed does not matter (fill values, casts, tests).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// A boolean.
    Bool(bool),
    /// Any integer (wide enough for int64 and uint64).
    Int(i128),
    /// A real number.
    Float(f64),
    /// A complex number.
    Complex(f64, f64),
    /// An integer beyond `i128` (a Python int), as precisely as a floating dtype needs it.
    Wide(WideInt),
}

/// An integer too wide for `i128`, kept to the precision that rounding it into any floating
/// dtype needs: `±top · 2^shift`, where the lowest bit of `top` is also set when any bit of the
/// integer below `top` is. (Rounded to 62 bits or fewer, such a `top` rounds as the integer
/// itself would.)
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WideInt {
    /// Whether the integer is negative.
    pub negative: bool,
    /// The magnitude's leading 64 bits, the lowest one sticky.
    pub top: u64,
    /// How far `top` is shifted left.
    pub shift: u32,
}

impl WideInt {
    /// The nearest float64 (ties to even), infinite past float64's range.
    pub fn to_f64(self) -> f64 {
        self.scale(self.top as f64)
    }

    /// `rounded_top` (the top rounded to a float) times `±2^shift`: exact, or infinite.
    fn scale(self, rounded_top: f64) -> f64 {
        // 2^shift is infinite past 2^1023, and so is the product (the top is not zero).
        let magnitude = rounded_top * 2f64.powi(self.shift.min(4096) as i32);
        if self.negative {
            -magnitude
        } else {
            magnitude
        }
    }
}

/// A Rust type that stores one element of a cubridge dtype.
pub trait Element: Copy + Send + Sync + 'static {
    /// The dtype this type stores.
    const DTYPE: DType;
    /// Converts to a [`Scalar`] exactly.
    fn to_scalar(self) -> Scalar;
    /// Converts from a [`Scalar`] as numpy's unsafe cast does: floats truncate towards zero into
    /// integers, integers wrap, the imaginary part is dropped into real types, non-zero is true.
    fn from_scalar(value: Scalar) -> Self;
}

/// Elementwise addition, in the dtype's own arithmetic.
pub trait AddElem: Element {
    /// `a + b`: logical or for bool, wrapping for integers, IEEE for floats. float16 and bfloat16
    /// add in float32 and round once, as numpy and PyTorch do.
    fn add(a: Self, b: Self) -> Self;
}

/// An exact conversion into a promoted dtype.
pub trait Widen<R> {
    /// Converts without loss.
    fn widen(self) -> R;
}

impl Scalar {
    /// The dtype a Python value of this kind takes by default: bool, int64, and the Array
    /// API's float32 and complex64.
    pub fn default_dtype(self) -> DType {
        match self {
            Scalar::Bool(_) => DType::Bool,
            Scalar::Int(_) | Scalar::Wide(_) => DType::Int64,
            Scalar::Float(_) => DType::Float32,
            Scalar::Complex(..) => DType::Complex64,
        }
    }

    /// What the value came in as, for messages: "a Python int", say.
    pub fn kind_name(self) -> &'static str {
        match self {
            Scalar::Bool(_) => "a Python bool",
            Scalar::Int(_) | Scalar::Wide(_) => "a Python int",
            Scalar::Float(_) => "a Python float",
            Scalar::Complex(..) => "a Python complex",
        }
    }

    fn as_i128(self) -> i128 {
        match self {
            Scalar::Bool(b) => b as i128,
            Scalar::Int(i) => i,
            // `as` saturates and maps NaN to 0: the defined behaviour we want for bad input.
            Scalar::Float(f) | Scalar::Complex(f, _) => f as i128,
            Scalar::Wide(w) if w.negative => i128::MIN,
            Scalar::Wide(_) => i128::MAX,
        }
    }

    /// As f32, rounded once: an int goes straight to f32 (through f64 it would round twice,
    /// 2^60 + 2^36 + 1 becoming 2^60 instead of numpy's 2^60 + 2^37).
    fn as_f32(self) -> f32 {
        match self {
            Scalar::Int(i) => i as f32,
            // The top rounds to float32 in one step; scaling it is exact (or overflows).
            Scalar::Wide(w) => w.scale(f64::from(w.top as f32)) as f32,
            other => other.as_f64() as f32,
        }
    }

    fn as_f64(self) -> f64 {
        match self {
            Scalar::Bool(b) => b as u8 as f64,
            Scalar::Int(i) => i as f64,
            Scalar::Float(f) | Scalar::Complex(f, _) => f,
            Scalar::Wide(w) => w.to_f64(),
        }
    }

    /// The value as `(negative, m, e)`, exactly `±m · 2^e`, for a conversion that rounds once
    /// (the real part of a complex value); `None` for NaN and the infinities.
    fn parts(self) -> Option<(bool, u128, i32)> {
        match self {
            Scalar::Bool(b) => Some((false, u128::from(b), 0)),
            Scalar::Int(i) => Some((i < 0, i.unsigned_abs(), 0)),
            Scalar::Float(f) | Scalar::Complex(f, _) => round::parts_of_f64(f),
            Scalar::Wide(w) => Some((w.negative, u128::from(w.top), w.shift.min(4096) as i32)),
        }
    }

    fn as_bool(self) -> bool {
        match self {
            Scalar::Bool(b) => b,
            Scalar::Int(i) => i != 0,
            Scalar::Float(f) => f != 0.0,
            Scalar::Complex(re, im) => re != 0.0 || im != 0.0,
            Scalar::Wide(_) => true,
        }
    }
}

macro_rules! int_element {
    ($($t:ty => $d:ident),*) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn to_scalar(self) -> Scalar { Scalar::Int(self as i128) }
            fn from_scalar(value: Scalar) -> Self { value.as_i128() as $t }
        }
        impl AddElem for $t {
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self { a.wrapping_add(b) }
        }
    )*};
}
int_element!(i8 => Int8, i16 => Int16, i32 => Int32, i64 => Int64,
             u8 => UInt8, u16 => UInt16, u32 => UInt32, u64 => UInt64);

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn to_scalar(self) -> Scalar {
        Scalar::Bool(self)
    }
    fn from_scalar(value: Scalar) -> Self {
        value.as_bool()
    }
}
impl AddElem for bool {
    #[inline(always)]
    fn add(a: Self, b: Self) -> Self {
        a | b
    }
}

macro_rules! float_element {
    ($($t:ty => $d:ident, $from:expr, $to:expr);*) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn to_scalar(self) -> Scalar { Scalar::Float(($to)(self)) }
            fn from_scalar(value: Scalar) -> Self { ($from)(value) }
        }
    )*};
}
/// `value` rounded once into float16 or bfloat16 (`format`); NaN and the infinities as `half`
/// converts them.
fn half_bits(value: Scalar, format: round::Format, special: fn(f64) -> u16) -> u16 {
    match value.parts() {
        Some((negative, m, e)) => round::round(negative, m, e, format),
        None => special(value.as_f64()),
    }
}

float_element!(
    f16 => Float16,
        |v: Scalar| f16::from_bits(half_bits(v, round::FLOAT16, |x| f16::from_f64(x).to_bits())),
        f16::to_f64;
    bf16 => BFloat16,
        |v: Scalar| bf16::from_bits(half_bits(v, round::BFLOAT16, |x| bf16::from_f64(x).to_bits())),
        bf16::to_f64;
    f32 => Float32, |v: Scalar| v.as_f32(), |v: f32| v as f64;
    f64 => Float64, |v: Scalar| v.as_f64(), |v: f64| v
);

impl AddElem for f32 {
    #[inline(always)]
    fn add(a: Self, b: Self) -> Self {
        a + b
    }
}
impl AddElem for f64 {
    #[inline(always)]
    fn add(a: Self, b: Self) -> Self {
        a + b
    }
}
impl AddElem for f16 {
    #[inline(always)]
    fn add(a: Self, b: Self) -> Self {
        f16::from_f32(a.to_f32() + b.to_f32())
    }
}
impl AddElem for bf16 {
    #[inline(always)]
    fn add(a: Self, b: Self) -> Self {
        bf16::from_f32(a.to_f32() + b.to_f32())
    }
}

macro_rules! complex_element {
    ($($t:ty => $d:ident),*) => {$(
        impl Element for Complex<$t> {
            const DTYPE: DType = DType::$d;
            fn to_scalar(self) -> Scalar { Scalar::Complex(self.re as f64, self.im as f64) }
            fn from_scalar(value: Scalar) -> Self {
                match value {
                    // Real values round once, straight to the part's type.
                    Scalar::Complex(re, im) => Complex { re: re as $t, im: im as $t },
                    real => Complex { re: <$t>::from_scalar(real), im: 0.0 },
                }
            }
        }
        impl AddElem for Complex<$t> {
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self { Complex { re: a.re + b.re, im: a.im + b.im } }
        }
    )*};
}
complex_element!(f32 => Complex64, f64 => Complex128);

// Widening, exactly the conversions that `DType::promote` can ask for.
impl<T: Element> Widen<T> for T {
    #[inline(always)]
    fn widen(self) -> T {
        self
    }
}
macro_rules! widen_from {
    ($($from:ty => $($to:ty),+);* $(;)?) => {$($(
        impl Widen<$to> for $from {
            #[inline(always)]
            fn widen(self) -> $to { <$to>::from(self) }
        }
    )+)*};
}
widen_from!(
    i8 => i16, i32, i64;
    i16 => i32, i64;
    i32 => i64;
    u8 => i16, i32, i64, u16, u32, u64;
    u16 => i32, i64, u32, u64;
    u32 => i64, u64;
    f16 => f32, f64;
    bf16 => f32, f64;
    f32 => f64;
);
macro_rules! widen_to_complex {
    ($($from:ty => $to:ty),* $(,)?) => {$(
        impl Widen<Complex<$to>> for $from {
            #[inline(always)]
            fn widen(self) -> Complex<$to> {
                Complex { re: <$to>::from(self), im: 0.0 }
            }
        }
    )*};
}
widen_to_complex!(f16 => f32, bf16 => f32, f32 => f32, f16 => f64, bf16 => f64, f32 => f64,
                  f64 => f64);
impl Widen<Complex<f64>> for Complex<f32> {
    #[inline(always)]
    fn widen(self) -> Complex<f64> {
        Complex {
            re: self.re as f64,
            im: self.im as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_precision_adds_in_f32_and_rounds_once() {
        // 2048 + 1 is not representable in float16: round-to-nearest-even gives 2048.
        let r = f16::add(f16::from_f32(2048.0), f16::from_f32(1.0));
        assert_eq!(r.to_f32(), 2048.0);
        let r = f16::add(f16::from_f32(2048.0), f16::from_f32(3.0));
        assert_eq!(r.to_f32(), 2052.0);
        let r = bf16::add(bf16::from_f32(256.0), bf16::from_f32(1.0));
        assert_eq!(r.to_f32(), 256.0);
    }

    #[test]
    fn integer_add_wraps_and_bool_is_or() {
        assert_eq!(i8::add(127, 1), -128);
        assert_eq!(u8::add(255, 2), 1);
        assert!(bool::add(true, true));
        assert!(!bool::add(false, false));
    }

    #[test]
    fn wide_integers_round_once_into_floats() {
        // 2^127 + 2^103 + 1: past a float32 tie by a bit that only the sticky bit keeps.
        let w = Scalar::Wide(WideInt {
            negative: false,
            top: (1 << 63) + (1 << 39) + 1,
            shift: 64,
        });
        assert_eq!(f32::from_scalar(w), 2f32.powi(127) + 2f32.powi(104));
        assert_eq!(f64::from_scalar(w), 2f64.powi(127) + 2f64.powi(103));
        assert_eq!(bf16::from_scalar(w).to_f64(), 2f64.powi(127));
        assert!(f16::from_scalar(w).is_infinite());
        let huge = WideInt {
            negative: true,
            top: u64::MAX,
            shift: 1000,
        };
        assert_eq!(f64::from_scalar(Scalar::Wide(huge)), f64::NEG_INFINITY);
        assert_eq!(i64::from_scalar(Scalar::Wide(huge)), 0); // i128::MIN, wrapped
        assert!(bool::from_scalar(Scalar::Wide(huge)));
    }

    #[test]
    fn scalar_conversions() {
        assert_eq!(i32::from_scalar(Scalar::Float(-2.7)), -2);
        assert_eq!(u8::from_scalar(Scalar::Int(257)), 1);
        assert!(bool::from_scalar(Scalar::Float(0.5)));
        assert_eq!(f16::from_scalar(Scalar::Int(3)).to_f32(), 3.0);
        let c = Complex::<f32>::from_scalar(Scalar::Float(1.5));
        assert_eq!(c, Complex { re: 1.5, im: 0.0 });
        assert_eq!(f64::from_scalar(Scalar::Complex(2.0, 9.0)), 2.0);
        assert_eq!(u64::MAX.to_scalar(), Scalar::Int(u64::MAX as i128));
    }
}
