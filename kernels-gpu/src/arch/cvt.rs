//! Conversions between f32 and the 16-bit and 8-bit element types.

use core::arch::asm;

/// `cvt.rn.bf16x2.f32`: packs `(lo, hi)` into one register, `lo` in the low half.
#[inline(always)]
pub fn pack_bf16x2(lo: f32, hi: f32) -> u32 {
    let r: u32;
    // SAFETY: a pure conversion. PTX takes the high element first.
    unsafe {
        asm!("cvt.rn.bf16x2.f32 {r}, {h}, {l};", r = out(reg32) r, h = in(reg32) hi, l = in(reg32) lo, options(nostack, pure, nomem))
    }
    r
}

/// `cvt.rn.f16x2.f32`: packs `(lo, hi)` into one register, `lo` in the low half.
#[inline(always)]
pub fn pack_f16x2(lo: f32, hi: f32) -> u32 {
    let r: u32;
    // SAFETY: a pure conversion. PTX takes the high element first.
    unsafe {
        asm!("cvt.rn.f16x2.f32 {r}, {h}, {l};", r = out(reg32) r, h = in(reg32) hi, l = in(reg32) lo, options(nostack, pure, nomem))
    }
    r
}

/// bf16 bits to f32 (exact).
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// `cvt.f32.f16`: fp16 bits to f32 (exact).
#[inline(always)]
pub fn f16_to_f32(bits: u16) -> f32 {
    let r: f32;
    // SAFETY: a pure conversion.
    unsafe {
        asm!("cvt.f32.f16 {r}, {h};", r = out(reg32) r, h = in(reg16) bits, options(nostack, pure, nomem))
    }
    r
}

/// fp8 e4m3 ("fn": no infinities; `0x7f`/`0xff` are NaN) to f32, exactly, in integer and
/// one f32 multiply so it runs on every arch (sm_80 has no fp8 conversion instruction).
/// The 7 magnitude bits shifted into a bf16-shaped f32 give `2^-120` times the value for
/// normals and subnormals alike.
#[inline(always)]
pub fn e4m3_to_f32(byte: u32) -> f32 {
    let mag = byte & 0x7f;
    let sign = (byte & 0x80) << 24;
    if mag == 0x7f {
        return f32::NAN;
    }
    // 2^120 = 0x7b800000.
    let v = f32::from_bits(mag << 20) * f32::from_bits(0x7b80_0000);
    f32::from_bits(v.to_bits() | sign)
}

/// `cvt.rn.f16x2.e4m3x2` (sm_89+): two fp8 e4m3 values (low byte first) to two fp16 values
/// (low half first), exactly (every e4m3 value, NaN included, is an fp16 value). In the
/// images that convert in hardware, and in the sm_90a image always (its 32-row fp8 decode).
#[cfg(any(mla_hw_fp8, mla_wgmma))]
#[inline(always)]
pub fn e4m3x2_to_f16x2(pair: u16) -> u32 {
    let r: u32;
    // SAFETY: a pure conversion.
    unsafe {
        asm!("cvt.rn.f16x2.e4m3x2 {r}, {a};", r = out(reg32) r, a = in(reg16) pair, options(nostack, pure, nomem))
    }
    r
}

/// Four fp8 e4m3 values (low byte first) to two registers of two fp16 values each (bytes
/// 0-1, then bytes 2-3), exactly: two `cvt.rn.f16x2.e4m3x2`.
#[cfg(any(mla_hw_fp8, mla_wgmma))]
#[inline(always)]
pub fn e4m3x4_to_f16x2x2(quad: u32) -> [u32; 2] {
    [
        e4m3x2_to_f16x2((quad & 0xffff) as u16),
        e4m3x2_to_f16x2((quad >> 16) as u16),
    ]
}

/// `prmt.b32 d, a, b, sel`: byte `i` of the result is byte `sel[4i..4i+4]` of `b:a` (0-3
/// from `a`, 4-7 from `b`).
#[inline(always)]
pub fn prmt(a: u32, b: u32, sel: u32) -> u32 {
    let r: u32;
    // SAFETY: a pure byte permutation.
    unsafe {
        asm!("prmt.b32 {r}, {a}, {b}, {s};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, s = in(reg32) sel, options(nostack, pure, nomem))
    }
    r
}

/// Two fp8 e4m3 values (low byte first) as two f32 values, exactly: through the hardware
/// conversion where the arch has one and the build asked for it (`mla_hw_fp8`: build.rs with
/// sm_90a / sm_100a unless `MLA_HW_FP8=0`), else [`e4m3_to_f32`] twice.
#[inline(always)]
pub fn e4m3x2_to_f32x2(pair: u32) -> (f32, f32) {
    #[cfg(mla_hw_fp8)]
    {
        e4m3x2_to_f32x2_hw(pair)
    }
    #[cfg(not(mla_hw_fp8))]
    {
        (e4m3_to_f32(pair & 0xff), e4m3_to_f32((pair >> 8) & 0xff))
    }
}

/// [`e4m3x2_to_f32x2`] through the hardware conversion whatever `mla_hw_fp8` says: for the
/// e4m3 `wgmma` paths (sm_90a only), where the software form's registers would spill.
#[cfg(any(mla_hw_fp8, mla_wgmma))]
#[inline(always)]
pub fn e4m3x2_to_f32x2_hw(pair: u32) -> (f32, f32) {
    let h = e4m3x2_to_f16x2((pair & 0xffff) as u16);
    (f16_to_f32(h as u16), f16_to_f32((h >> 16) as u16))
}

/// Two f32 to two fp8 e4m3 (`lo` in bits 0-7, `hi` in bits 8-15), round to nearest even,
/// saturating to +-448 (`cvt.rn.satfinite.e4m3x2.f32`, sm_89 and later).
#[inline(always)]
pub fn pack_e4m3x2(lo: f32, hi: f32) -> u32 {
    let r: u16;
    // SAFETY: a pure conversion.
    unsafe {
        asm!("cvt.rn.satfinite.e4m3x2.f32 {r}, {h}, {l};", r = out(reg16) r, h = in(reg32) hi, l = in(reg32) lo, options(nostack, pure, nomem))
    }
    r as u32
}

/// Four f32 to four fp8 e4m3 in one word (`v[i]` in byte `i`), as [`pack_e4m3x2`].
#[inline(always)]
pub fn pack_e4m3x4(v: [f32; 4]) -> u32 {
    pack_e4m3x2(v[0], v[1]) | (pack_e4m3x2(v[2], v[3]) << 16)
}

/// f32 to fp8 e4m3, round to nearest even, saturating to +-448; NaN stays NaN.
#[inline(always)]
pub fn f32_to_e4m3_sat(x: f32) -> u32 {
    let bits = x.to_bits();
    let sign = (bits >> 24) & 0x80;
    let a = f32::from_bits(bits & 0x7fff_ffff);
    if a.is_nan() {
        return 0x7f | sign;
    }
    if a >= 464.0 {
        // 448 is the largest finite value; halfway to the next binade step (480) rounds down.
        return 0x7e | sign;
    }
    // Subnormal range: multiples of 2^-9 below 2^-6.
    if a < f32::from_bits(0x3c80_0000) {
        // a * 2^9, rounded to nearest even, is the mantissa count 0..=8 (8 = smallest normal).
        let m = rne_to_int(a * 512.0);
        return m | sign;
    }
    // Normal: keep 3 mantissa bits with round-to-nearest-even on the f32 bits.
    let ab = a.to_bits();
    let lsb = (ab >> 20) & 1;
    let rounded = ab + 0x7ffff + lsb;
    let exp = (rounded >> 23) as i32 - 127 + 7;
    let man = (rounded >> 20) & 0x7;
    let code = ((exp as u32) << 3) | man;
    let code = if code > 0x7e { 0x7e } else { code };
    code | sign
}

/// Round a non-negative f32 below 2^22 to the nearest integer, ties to even.
#[inline(always)]
fn rne_to_int(x: f32) -> u32 {
    let r: u32;
    // SAFETY: a pure conversion.
    unsafe {
        asm!("cvt.rni.u32.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(nostack, pure, nomem))
    }
    r
}
