//! Conversions into float16 and bfloat16 that round once, to nearest with ties to even, from the
//! exact source value, as numpy's casts from float64 do. (`half`'s `from_f64` drops the low 32
//! bits of a float64 before it rounds, and on x86 goes through float32: two roundings.)

/// A binary floating format: its fraction bits and exponent bits.
#[derive(Debug, Clone, Copy)]
pub struct Format {
    fraction: u32,
    exponent: u32,
}

/// IEEE binary16.
pub const FLOAT16: Format = Format {
    fraction: 10,
    exponent: 5,
};

/// bfloat16: float32's exponent, 7 fraction bits.
pub const BFLOAT16: Format = Format {
    fraction: 7,
    exponent: 8,
};

/// The bits of the value of `format` nearest to `±m · 2^e` (ties to even), infinity past its
/// largest finite value, zero (of the sign) below half its smallest subnormal.
pub fn round(negative: bool, m: u128, e: i32, format: Format) -> u16 {
    let Format { fraction, exponent } = format;
    let sign = u128::from(negative) << (fraction + exponent);
    if m == 0 {
        return sign as u16;
    }
    // Exponent of the smallest normal number, and of m's leading bit.
    let emin = 2 - (1i32 << (exponent - 1));
    let lead = e + 127 - m.leading_zeros() as i32;
    // Exponent of the result's last fraction bit (subnormals keep emin's).
    let last = lead.max(emin) - fraction as i32;
    let significand = match u32::try_from(last - e) {
        Ok(dropped) if dropped > 0 => shift_right_to_even(m, dropped),
        // Nothing to drop: the value fits, exactly (m has at most fraction + 1 bits here).
        _ => m << (e - last),
    };
    // Biased exponent above the subnormals' times 2^fraction, plus the significand (whose
    // leading bit, when set, adds the one that makes a normal number's exponent field, and a
    // carry out of rounding moves to the next binade).
    let field = (last - emin + fraction as i32) as u128;
    let magnitude = (field << fraction) + significand;
    let infinity = ((1u128 << exponent) - 1) << fraction;
    (sign | magnitude.min(infinity)) as u16
}

/// `m / 2^s` rounded to the nearest integer, ties to even (`s >= 1`).
fn shift_right_to_even(m: u128, s: u32) -> u128 {
    let kept = m.checked_shr(s).unwrap_or(0);
    let rest = m - kept.checked_shl(s).unwrap_or(0);
    let Some(half) = 1u128.checked_shl(s - 1) else {
        return kept; // half is 2^128 or more: past any rest
    };
    kept + u128::from(rest > half || (rest == half && kept & 1 == 1))
}

/// A finite float64 as `(negative, m, e)` with value `±m · 2^e`, exactly; `None` for NaN and
/// the infinities.
pub fn parts_of_f64(x: f64) -> Option<(bool, u128, i32)> {
    if !x.is_finite() {
        return None;
    }
    let bits = x.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    let fraction = u128::from(bits & ((1 << 52) - 1));
    let (m, e) = if biased == 0 {
        (fraction, -1074)
    } else {
        (fraction | 1 << 52, biased - 1075)
    };
    Some((bits >> 63 == 1, m, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    fn f16_of(x: f64) -> f64 {
        let (n, m, e) = parts_of_f64(x).unwrap();
        f16::from_bits(round(n, m, e, FLOAT16)).to_f64()
    }

    fn bf16_of(x: f64) -> f64 {
        let (n, m, e) = parts_of_f64(x).unwrap();
        bf16::from_bits(round(n, m, e, BFLOAT16)).to_f64()
    }

    #[test]
    fn float16_rounds_once_from_every_bit() {
        let p = |k: i32| 2f64.powi(k);
        // Just past a tie: the bit that decides is far below float32's precision.
        assert_eq!(f16_of(1.0 + p(-11) + p(-40)), 1.0 + p(-10));
        assert_eq!(f16_of(1.0 + p(-11)), 1.0); // the tie itself: to even
        assert_eq!(f16_of(1.0 + 3.0 * p(-11)), 1.0 + p(-9));
        assert_eq!(f16_of(65520.0 - p(-20)), 65504.0);
        assert_eq!(f16_of(65520.0), f64::INFINITY);
        assert_eq!(f16_of(-1e300), f64::NEG_INFINITY);
        // Subnormals: the smallest is 2^-24; half of it is a tie to zero, a hair more is not.
        assert_eq!(f16_of(p(-25)), 0.0);
        assert_eq!(f16_of(p(-25) + p(-70)), p(-24));
        assert_eq!(f16_of(3.0 * p(-25)), 2.0 * p(-24));
        assert_eq!(f16_of(-5e-324), 0.0);
        assert!(f16_of(-5e-324).is_sign_negative());
        // A subnormal that rounds up into the normals.
        assert_eq!(f16_of(p(-14) - p(-26)), p(-14));
    }

    #[test]
    fn bfloat16_rounds_once_from_every_bit() {
        let p = |k: i32| 2f64.powi(k);
        assert_eq!(bf16_of(1.0 + p(-8) + p(-40)), 1.0 + p(-7));
        assert_eq!(bf16_of(1.0 + p(-8)), 1.0);
        assert_eq!(
            bf16_of(p(127) * (2.0 - p(-8)) - p(90)),
            p(127) * (2.0 - p(-7))
        );
        assert_eq!(bf16_of(p(127) * (2.0 - p(-8))), f64::INFINITY);
        assert_eq!(bf16_of(p(-134) + p(-160)), p(-133));
        assert_eq!(bf16_of(-p(-134)), 0.0);
    }

    #[test]
    fn integers_round_from_all_their_bits() {
        // 2^60 + 2^52 + 1 lies just past a bfloat16 tie that float64 cannot see.
        let m = (1u128 << 60) + (1 << 52) + 1;
        let got = bf16::from_bits(round(true, m, 0, BFLOAT16)).to_f64();
        assert_eq!(got, -(2f64.powi(60) + 2f64.powi(53)));
        assert_eq!(
            f16::from_bits(round(false, 2049, 0, FLOAT16)).to_f64(),
            2048.0
        );
        assert_eq!(
            f16::from_bits(round(false, 2051, 0, FLOAT16)).to_f64(),
            2052.0
        );
        assert!(f16::from_bits(round(false, u128::MAX, 0, FLOAT16)).is_infinite());
        assert!(bf16::from_bits(round(false, u128::MAX, 0, BFLOAT16)).is_infinite());
        // Scaled far up or down, still without overflow inside the computation.
        assert!(f16::from_bits(round(false, 3, 2000, FLOAT16)).is_infinite());
        assert_eq!(round(false, u128::MAX, -3000, FLOAT16), 0);
    }

    #[test]
    fn float16_agrees_with_half_where_half_rounds_once() {
        // From float32 values, half's conversion sees every bit (hardware or not).
        let mut x = 1.0e-9f32;
        while x < 7.0e4 {
            for v in [x, -x, x * 1.000_123] {
                let want = f16::from_f32(v).to_bits();
                let (n, m, e) = parts_of_f64(f64::from(v)).unwrap();
                assert_eq!(round(n, m, e, FLOAT16), want, "{v}");
                let want = bf16::from_f32(v).to_bits();
                assert_eq!(round(n, m, e, BFLOAT16), want, "{v}");
            }
            x *= 1.0173;
        }
    }
}
