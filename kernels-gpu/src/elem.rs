//! Element types of the kernels, as zero-sized markers selecting the conversions and
//! the tensor-core instruction at compile time.

use crate::arch::{cvt, mma};

/// A 16-bit type that the tensor cores multiply (operands of `mma.sync` and outputs).
pub trait Half16 {
    /// The bits of +infinity; a value whose bits without the sign exceed them is a NaN.
    const INF_BITS: u32;
    /// Packs two f32 into one register of two 16-bit values, `lo` in the low half.
    fn pack2(lo: f32, hi: f32) -> u32;
    /// The 16-bit value's f32 (exact).
    fn to_f32(bits: u16) -> f32;
    /// `d += a * b` on m16n8k16.
    ///
    /// # Safety
    /// All 32 lanes converged.
    unsafe fn mma(d: &mut [f32; 4], a: [u32; 4], b: [u32; 2]);
}

pub struct Bf16;
pub struct Fp16;

impl Half16 for Bf16 {
    const INF_BITS: u32 = 0x7f80;
    #[inline(always)]
    fn pack2(lo: f32, hi: f32) -> u32 {
        cvt::pack_bf16x2(lo, hi)
    }
    #[inline(always)]
    fn to_f32(bits: u16) -> f32 {
        cvt::bf16_to_f32(bits)
    }
    #[inline(always)]
    unsafe fn mma(d: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
        // SAFETY: forwarded from the caller.
        unsafe { mma::mma_m16n8k16_bf16(d, a, b) }
    }
}

impl Half16 for Fp16 {
    const INF_BITS: u32 = 0x7c00;
    #[inline(always)]
    fn pack2(lo: f32, hi: f32) -> u32 {
        cvt::pack_f16x2(lo, hi)
    }
    #[inline(always)]
    fn to_f32(bits: u16) -> f32 {
        cvt::f16_to_f32(bits)
    }
    #[inline(always)]
    unsafe fn mma(d: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
        // SAFETY: forwarded from the caller.
        unsafe { mma::mma_m16n8k16_f16(d, a, b) }
    }
}
