//! `mma.sync` m16n8k16 with f32 accumulators (sm_80+).
//!
//! Fragment layout per lane `l`, `g = l / 4`, `c = l % 4`:
//! - A (16x16, row-major): `a[0]` = (row g, cols 2c..2c+1), `a[1]` = (row g+8, cols 2c..),
//!   `a[2]` = (row g, cols 2c+8..), `a[3]` = (row g+8, cols 2c+8..); two 16-bit values each.
//! - B (16x8, "col": k contiguous per column n): `b[0]` = (k 2c..2c+1, col g),
//!   `b[1]` = (k 2c+8..2c+9, col g).
//! - C/D (16x8 f32): `d[0..2]` = (row g, cols 2c, 2c+1), `d[2..4]` = (row g+8, cols 2c, 2c+1).
//!
//! The asm is not `pure`: `mma.sync` is warp-collective and must not be moved into a
//! branch that only some lanes take (see `sync::shfl_xor_f32`).

use core::arch::asm;

/// `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`, `d += a * b`.
///
/// # Safety
/// All 32 lanes converged.
#[inline(always)]
pub unsafe fn mma_m16n8k16_bf16(d: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
    // SAFETY: the caller guarantees convergence; registers only.
    unsafe {
        asm!("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{d0}, {d1}, {d2}, {d3}}};",
            d0 = inout(reg32) d[0], d1 = inout(reg32) d[1], d2 = inout(reg32) d[2], d3 = inout(reg32) d[3],
            a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
            b0 = in(reg32) b[0], b1 = in(reg32) b[1], options(nostack, nomem))
    }
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`, `d += a * b`.
///
/// # Safety
/// All 32 lanes converged.
#[inline(always)]
pub unsafe fn mma_m16n8k16_f16(d: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
    // SAFETY: the caller guarantees convergence; registers only.
    unsafe {
        asm!("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{d0}, {d1}, {d2}, {d3}}};",
            d0 = inout(reg32) d[0], d1 = inout(reg32) d[1], d2 = inout(reg32) d[2], d3 = inout(reg32) d[3],
            a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
            b0 = in(reg32) b[0], b1 = in(reg32) b[1], options(nostack, nomem))
    }
}
