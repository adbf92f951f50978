//! Host-side element conversions: the storage formats of `q`, the KV cache and the output
//! (bf16, fp16, OCP fp8 e4m3fn, f32), used to build test data and to read kernel results.
//!
//! Every encoder rounds to nearest, ties to even. The fp8 encoder saturates: the format
//! has no infinities, and the serving stacks clamp out-of-range values to +-448.

use mla_abi::ElemType;

/// f32 -> bf16 bits, round to nearest even (NaN stays NaN).
pub fn bf16_from_f32(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

/// bf16 bits -> f32 (exact).
pub fn bf16_to_f32(bits: u16) -> f32 {
    half::bf16::from_bits(bits).to_f32()
}

/// f32 -> IEEE binary16 bits, round to nearest even; overflow gives +-inf.
pub fn f16_from_f32(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// IEEE binary16 bits -> f32 (exact).
pub fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// Exponent bias of e4m3.
const E4M3_BIAS: i32 = 7;
/// Mantissa bits of e4m3.
const E4M3_MANT_BITS: u32 = 3;
/// Largest finite e4m3 magnitude (code `0x7e`).
pub const E4M3_MAX: f32 = 448.0;
/// Code of +448; `| 0x80` gives -448.
const E4M3_MAX_CODE: u8 = 0x7e;
/// Code of +NaN; `| 0x80` gives the negative NaN.
const E4M3_NAN_CODE: u8 = 0x7f;
const E4M3_SIGN: u8 = 0x80;

/// OCP fp8 e4m3fn code -> f32 (exact).
///
/// Layout `s eeee mmm`, bias 7. Exponent field 0 is subnormal (`m * 2^-9`); `0x7f` and
/// `0xff` are NaN; there are no infinities, so `0x78..=0x7e` are ordinary normals up to 448.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let magnitude_bits = b & !E4M3_SIGN;
    let negative = b & E4M3_SIGN != 0;
    if magnitude_bits == E4M3_NAN_CODE {
        return if negative { -f32::NAN } else { f32::NAN };
    }
    let exp_field = i32::from(magnitude_bits >> E4M3_MANT_BITS);
    let mant = f32::from(magnitude_bits & 0x7);
    let magnitude = if exp_field == 0 {
        mant * exp2i(1 - E4M3_BIAS - E4M3_MANT_BITS as i32)
    } else {
        (1.0 + mant / 8.0) * exp2i(exp_field - E4M3_BIAS)
    };
    if negative { -magnitude } else { magnitude }
}

/// f32 -> OCP fp8 e4m3fn code: round to nearest, ties to even, saturating.
///
/// - NaN -> `0x7f` (`0xff` if the NaN's sign bit is set).
/// - `|x| > 448` (including infinities) -> +-448 (`0x7e` / `0xfe`). Below 464 that is
///   what rounding gives anyway; from 464 up it is the saturation.
/// - Tiny values round to subnormals or to a zero of the input's sign (`-0.0` -> `0x80`).
pub fn e4m3_from_f32(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { E4M3_SIGN } else { 0 };
    if x.is_nan() {
        return sign | E4M3_NAN_CODE;
    }
    let a = f64::from(x.abs());
    if a >= f64::from(E4M3_MAX) {
        return sign | E4M3_MAX_CODE;
    }
    // The spacing of e4m3 values around `a`: 2^(e-3) in the binade [2^e, 2^(e+1)) of a
    // normal, and the subnormal step 2^-9 below the smallest normal 2^-6.
    let min_normal_exp = 1 - E4M3_BIAS;
    let exp = if a == 0.0 {
        min_normal_exp
    } else {
        floor_log2(a).max(min_normal_exp)
    };
    let quantum = exp2i_f64(exp - E4M3_MANT_BITS as i32);
    // `a / quantum` is exact (power-of-two scaling); it lies in [0, 16).
    let steps = (a / quantum).round_ties_even();
    // Codes are contiguous across the subnormal/normal border and across binades: the
    // step count within the binade plus the binade's first code. A round-up to 16 steps
    // lands exactly on the next binade's first code.
    let code = if exp == min_normal_exp {
        // Subnormals 0..=7 and the first normal binade 8..=15 share the quantum 2^-9.
        steps as u32
    } else {
        let binade_start = ((exp + E4M3_BIAS) as u32) << E4M3_MANT_BITS;
        binade_start + (steps as u32 - 8)
    };
    // `a < 448` rounds to at most 448, so the code stays <= 0x7e.
    sign | code.min(u32::from(E4M3_MAX_CODE)) as u8
}

/// Round `x` to a value representable in `dtype` (the encoders' rules: ties to even, fp8
/// saturating), returned as f64. The value goes through f32 first, as it does in the
/// kernels, which compute in f32 and then convert.
pub fn round_to(dtype: ElemType, x: f64) -> f64 {
    let x32 = x as f32;
    let r = match dtype {
        ElemType::Bf16 => bf16_to_f32(bf16_from_f32(x32)),
        ElemType::Fp16 => f16_to_f32(f16_from_f32(x32)),
        ElemType::Fp8E4m3 => e4m3_to_f32(e4m3_from_f32(x32)),
        ElemType::F32 => x32,
        // Integers round to the nearest i32 (saturating), as an index tensor stores them.
        ElemType::I32 => (x32.round() as i32) as f32,
    };
    f64::from(r)
}

/// Decode a little-endian buffer of `dtype` elements into f32.
///
/// # Panics
/// If `bytes.len()` is not a multiple of `dtype.size()`.
pub fn to_f32(dtype: ElemType, bytes: &[u8]) -> Vec<f32> {
    let size = dtype.size();
    assert!(
        bytes.len().is_multiple_of(size),
        "to_f32: {} bytes is not a whole number of {} elements",
        bytes.len(),
        dtype.name()
    );
    match dtype {
        ElemType::Bf16 => bytes
            .chunks_exact(2)
            .map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        ElemType::Fp16 => bytes
            .chunks_exact(2)
            .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        ElemType::Fp8E4m3 => bytes.iter().map(|&b| e4m3_to_f32(b)).collect(),
        ElemType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        ElemType::I32 => bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32)
            .collect(),
    }
}

/// Encode f32 values as a little-endian buffer of `dtype` (round to nearest even; fp8
/// saturating as in [`e4m3_from_f32`]).
pub fn from_f32(dtype: ElemType, vals: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(vals.len() * dtype.size());
    match dtype {
        ElemType::Bf16 => {
            for &v in vals {
                out.extend_from_slice(&bf16_from_f32(v).to_le_bytes());
            }
        }
        ElemType::Fp16 => {
            for &v in vals {
                out.extend_from_slice(&f16_from_f32(v).to_le_bytes());
            }
        }
        ElemType::Fp8E4m3 => out.extend(vals.iter().map(|&v| e4m3_from_f32(v))),
        ElemType::F32 => {
            for &v in vals {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        ElemType::I32 => {
            for &v in vals {
                out.extend_from_slice(&(v.round() as i32).to_le_bytes());
            }
        }
    }
    out
}

/// `2^e` as f32 for the small exponents of e4m3 (exact).
fn exp2i(e: i32) -> f32 {
    exp2i_f64(e) as f32
}

/// `2^e` as f64, exact for `-1022 <= e <= 1023`.
fn exp2i_f64(e: i32) -> f64 {
    f64::from_bits(((e + 1023) as u64) << 52)
}

/// `floor(log2(a))` of a positive normal f64, read from its exponent field (exact, unlike
/// `a.log2().floor()` near powers of two). Every nonzero f32 is a normal f64.
fn floor_log2(a: f64) -> i32 {
    ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023
}

#[cfg(test)]
mod tests {
    use super::*;

    /// All non-NaN non-negative codes in increasing order, with their values.
    fn positive_table() -> Vec<(u8, f64)> {
        (0u8..=E4M3_MAX_CODE)
            .map(|c| (c, f64::from(e4m3_to_f32(c))))
            .collect()
    }

    /// The nearest non-negative code to `a` by brute force over the table, ties to the
    /// even code, saturating above 448. Independent of the arithmetic in the encoder.
    fn nearest_code(table: &[(u8, f64)], a: f64) -> u8 {
        let mut best = table[0];
        for &(c, v) in table {
            let d = (v - a).abs();
            let db = (best.1 - a).abs();
            if d < db || (d == db && c % 2 == 0 && best.0 % 2 == 1) {
                best = (c, v);
            }
        }
        best.0
    }

    #[test]
    fn e4m3_known_values() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert!(e4m3_to_f32(0x80).is_sign_negative() && e4m3_to_f32(0x80) == 0.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x07), 7.0 * 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0x3c), 1.5);
        assert_eq!(e4m3_to_f32(0x40), 2.0);
        assert_eq!(e4m3_to_f32(0x78), 256.0);
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0xfe), -448.0);
        assert_eq!(e4m3_to_f32(0xb8), -1.0);
        assert!(e4m3_to_f32(0x7f).is_nan());
        assert!(e4m3_to_f32(0xff).is_nan());
    }

    #[test]
    fn e4m3_round_trip_all_codes() {
        for code in 0u8..=255 {
            let v = e4m3_to_f32(code);
            if code & 0x7f == 0x7f {
                assert!(v.is_nan(), "code {code:#04x} should be NaN, got {v}");
                assert_eq!(e4m3_from_f32(v), code, "NaN sign for {code:#04x}");
                continue;
            }
            assert!(v.is_finite(), "code {code:#04x} decoded to {v}");
            assert_eq!(
                e4m3_from_f32(v),
                code,
                "code {code:#04x} -> {v} did not re-encode to itself"
            );
        }
        // The two zeros are distinct codes of equal value.
        assert_eq!(e4m3_from_f32(0.0), 0x00);
        assert_eq!(e4m3_from_f32(-0.0), 0x80);
        assert_eq!(e4m3_to_f32(0x00), e4m3_to_f32(0x80));
    }

    #[test]
    fn e4m3_values_strictly_increase() {
        let table = positive_table();
        for w in table.windows(2) {
            assert!(w[0].1 < w[1].1, "{:?} !< {:?}", w[0], w[1]);
        }
    }

    #[test]
    fn e4m3_nearest_even_at_midpoints() {
        let table = positive_table();
        for w in table.windows(2) {
            let (lo, hi) = (w[0], w[1]);
            let mid = (lo.1 + hi.1) / 2.0;
            // Midpoints of e4m3 neighbours are exact in f32 (4 significant bits).
            let mid32 = mid as f32;
            assert_eq!(f64::from(mid32), mid);
            let even = if lo.0 % 2 == 0 { lo.0 } else { hi.0 };
            assert_eq!(e4m3_from_f32(mid32), even, "tie between {lo:?} and {hi:?}");
            assert_eq!(e4m3_from_f32(-mid32), even | 0x80, "negative tie {mid}");
            let below = f32::from_bits(mid32.to_bits() - 1);
            let above = f32::from_bits(mid32.to_bits() + 1);
            assert_eq!(e4m3_from_f32(below), lo.0, "just below {mid}");
            assert_eq!(e4m3_from_f32(above), hi.0, "just above {mid}");
        }
    }

    #[test]
    fn e4m3_nearest_over_dense_sweep() {
        let table = positive_table();
        // Every f32 bit pattern from 0 to just past 500 with a prime stride, which lands
        // on every residue of the mantissa bits near each code. Plus a uniform sweep
        // through the subnormal range where the stride is coarse relative to the values.
        let end = 500f32.to_bits();
        let mut bits = 0u32;
        let mut checked = 0usize;
        while bits <= end {
            let x = f32::from_bits(bits);
            let want = nearest_code(&table, f64::from(x));
            assert_eq!(e4m3_from_f32(x), want, "x = {x:e} ({bits:#010x})");
            assert_eq!(e4m3_from_f32(-x), want | 0x80, "x = -{x:e}");
            bits += 4099;
            checked += 1;
        }
        for i in 0..20_000 {
            let x = (i as f32) * (2f32.powi(-5) / 20_000.0);
            let want = nearest_code(&table, f64::from(x));
            assert_eq!(e4m3_from_f32(x), want, "x = {x:e}");
        }
        assert!(checked > 200_000);
    }

    #[test]
    fn e4m3_saturates() {
        assert_eq!(e4m3_from_f32(448.0), 0x7e);
        assert_eq!(e4m3_from_f32(450.0), 0x7e);
        assert_eq!(e4m3_from_f32(463.99), 0x7e);
        assert_eq!(e4m3_from_f32(464.0), 0x7e);
        assert_eq!(e4m3_from_f32(480.0), 0x7e);
        assert_eq!(e4m3_from_f32(1.0e30), 0x7e);
        assert_eq!(e4m3_from_f32(f32::MAX), 0x7e);
        assert_eq!(e4m3_from_f32(f32::INFINITY), 0x7e);
        assert_eq!(e4m3_from_f32(-464.0), 0xfe);
        assert_eq!(e4m3_from_f32(f32::NEG_INFINITY), 0xfe);
        assert_eq!(e4m3_from_f32(f32::NAN), 0x7f);
        assert_eq!(e4m3_from_f32(-f32::NAN), 0xff);
    }

    #[test]
    fn e4m3_tiny_values() {
        let step = 2f32.powi(-9);
        assert_eq!(e4m3_from_f32(step * 0.5), 0x00, "half a step ties to zero");
        assert_eq!(e4m3_from_f32(-step * 0.5), 0x80);
        assert_eq!(e4m3_from_f32(step * 0.51), 0x01);
        assert_eq!(
            e4m3_from_f32(step * 1.5),
            0x02,
            "tie 1.5 steps goes to even 2"
        );
        assert_eq!(
            e4m3_from_f32(step * 2.5),
            0x02,
            "tie 2.5 steps goes to even 2"
        );
        assert_eq!(e4m3_from_f32(-step * 3.0), 0x83);
        assert_eq!(e4m3_from_f32(1e-30), 0x00);
        assert_eq!(e4m3_from_f32(-1e-30), 0x80);
        assert_eq!(e4m3_from_f32(f32::from_bits(1)), 0x00);
        // 7.5 steps is the tie between the largest subnormal and the smallest normal.
        assert_eq!(e4m3_from_f32(step * 7.5), 0x08);
    }

    #[test]
    fn bf16_rounding() {
        assert_eq!(bf16_from_f32(1.0), 0x3f80);
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
        // 1 + 2^-8 is the tie between 1 and 1 + 2^-7: goes to the even 1.0.
        assert_eq!(bf16_from_f32(1.0 + 2f32.powi(-8)), 0x3f80);
        // 1 + 3 * 2^-8 ties between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
        assert_eq!(bf16_from_f32(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
        // Just above the tie rounds up.
        assert_eq!(bf16_from_f32(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(bf16_from_f32(-2.0), 0xc000);
        assert!(bf16_to_f32(bf16_from_f32(f32::NAN)).is_nan());
        assert_eq!(bf16_to_f32(bf16_from_f32(f32::INFINITY)), f32::INFINITY);
    }

    #[test]
    fn f16_rounding() {
        assert_eq!(f16_from_f32(1.0), 0x3c00);
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        // Ties at 1 + 2^-11 go to 1.0, at 1 + 3 * 2^-11 to 1 + 2^-9.
        assert_eq!(f16_from_f32(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(f16_from_f32(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
        assert_eq!(f16_from_f32(65504.0), 0x7bff);
        assert_eq!(
            f16_from_f32(65520.0),
            0x7c00,
            "the tie past max overflows to inf"
        );
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert!(f16_to_f32(f16_from_f32(f32::NAN)).is_nan());
    }

    #[test]
    fn buffers_round_trip() {
        let vals = [0.0f32, -0.0, 1.0, -1.5, 3.25, 104.0, -0.015625];
        for dtype in [
            ElemType::Bf16,
            ElemType::Fp16,
            ElemType::Fp8E4m3,
            ElemType::F32,
        ] {
            let bytes = from_f32(dtype, &vals);
            assert_eq!(bytes.len(), vals.len() * dtype.size());
            let back = to_f32(dtype, &bytes);
            assert_eq!(back.len(), vals.len());
            for (a, b) in vals.iter().zip(&back) {
                assert_eq!(a.to_bits(), b.to_bits(), "{}: {a} -> {b}", dtype.name());
            }
        }
        // Little-endian layout.
        assert_eq!(from_f32(ElemType::Bf16, &[1.0]), vec![0x80, 0x3f]);
        assert_eq!(from_f32(ElemType::Fp16, &[1.0]), vec![0x00, 0x3c]);
        assert_eq!(
            from_f32(ElemType::Fp8E4m3, &[1.0, 1000.0]),
            vec![0x38, 0x7e]
        );
        assert_eq!(to_f32(ElemType::F32, &1.5f32.to_le_bytes()), vec![1.5]);
    }

    #[test]
    fn round_to_matches_encoders() {
        assert_eq!(round_to(ElemType::Bf16, 1.0 + 2f64.powi(-9)), 1.0);
        assert_eq!(round_to(ElemType::Fp16, 1.0 + 2f64.powi(-12)), 1.0);
        assert_eq!(round_to(ElemType::Fp8E4m3, 1000.0), 448.0);
        assert_eq!(round_to(ElemType::F32, 0.1), f64::from(0.1f32));
    }
}
