//! The 16-bit split partial's factor (`mla_abi::partial16::factor`), which the bf16 64-row
//! TMA decodes pick per half row: every magnitude f32 holds lands in `[2^14, 2^15)` (fp16's
//! top binade but one: no overflow after rounding), or takes the smallest factor.

use mla_abi::partial16::{MIN_EXP, factor};
use mla_dev::rng::SplitMix64;

#[test]
fn factor_puts_every_magnitude_in_range() {
    let seed = SplitMix64::fresh_seed();
    eprintln!("[partial16] seed = {seed}");
    let mut rng = SplitMix64::new(seed);
    let min_factor = 2f32.powi(MIN_EXP);
    let mut checked = 0;
    // Every binade of f32, random mantissas, and its edges.
    for e in 0..255u32 {
        for i in 0..64u32 {
            let mant = match i {
                0 => 0,
                1 => 0x7f_ffff,
                _ => (rng.next_u64() as u32) & 0x7f_ffff,
            };
            let m = f32::from_bits((e << 23) | mant);
            let (f, inv_f) = factor(m);
            assert!(
                f.is_normal() && inv_f.is_normal(),
                "m {m:e}: f {f:e}, 1/f {inv_f:e}"
            );
            assert_eq!(f * inv_f, 1.0, "m {m:e}: f {f:e} and 1/f {inv_f:e}");
            assert_eq!(
                f.to_bits() & 0x7f_ffff,
                0,
                "m {m:e}: f {f:e} is a power of two"
            );
            let scaled = m * inv_f;
            if f > min_factor {
                assert!(
                    (16384.0..32768.0).contains(&scaled),
                    "m {m:e}: m / f = {scaled:e} outside [2^14, 2^15)"
                );
            } else {
                assert!(scaled < 32768.0, "m {m:e}: m / f = {scaled:e}");
            }
            // fp16's largest finite is 65504: the scaled half row never rounds past it.
            assert!(scaled <= 65504.0);
            checked += 1;
        }
    }
    for m in [f32::INFINITY, f32::NAN] {
        let (f, inv_f) = factor(m);
        assert_eq!((f, inv_f), (2f32.powi(114), 2f32.powi(-114)), "m {m}");
    }
    assert_eq!(factor(0.0).0, min_factor);
    eprintln!("[partial16] {checked} magnitudes checked");
}

/// A half row written in the 16-bit form and read back (fp16 values `o / f`, then `f`
/// times them, as the decode and the combine do) is within `2^-11` of its largest magnitude
/// everywhere, at magnitudes from `2^-120` to `2^120` (far outside fp16's own range), and
/// keeps NaN and infinities.
#[test]
fn half_rows_round_trip_within_the_bound() {
    use mla_abi::ElemType;
    use mla_dev::numeric::{from_f32, to_f32};
    let seed = SplitMix64::fresh_seed();
    eprintln!("[partial16] round trip seed = {seed}");
    let mut rng = SplitMix64::new(seed);
    let mut worst = 0.0f64;
    for e in (-120..=120).step_by(8) {
        for _ in 0..8 {
            let row: Vec<f32> = (0..256)
                .map(|_| (rng.normal() * 2f64.powi(e)) as f32)
                .collect();
            let m = row.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let (f, inv_f) = factor(m);
            let scaled: Vec<f32> = row.iter().map(|v| v * inv_f).collect();
            let back = to_f32(ElemType::Fp16, &from_f32(ElemType::Fp16, &scaled));
            for (&v, &b) in row.iter().zip(&back) {
                let err = (f64::from(b) * f64::from(f) - f64::from(v)).abs();
                let rel = err / f64::from(m);
                assert!(
                    rel <= 2f64.powi(-11),
                    "2^{e}: {v:e} came back {:e} (error {rel:e} of the max {m:e})",
                    f64::from(b) * f64::from(f)
                );
                worst = worst.max(rel);
            }
        }
    }
    for v in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let (f, inv_f) = factor(v.abs());
        let back = to_f32(ElemType::Fp16, &from_f32(ElemType::Fp16, &[v * inv_f]))[0] * f;
        assert!(
            back.is_nan() == v.is_nan() && (v.is_nan() || back == v),
            "{v} came back {back}"
        );
    }
    eprintln!("[partial16] worst round-trip error {worst:e} of a half row's max");
}
