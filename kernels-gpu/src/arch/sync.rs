//! Barriers and warp shuffles.

use core::arch::asm;

/// `bar.sync 0;` — CTA-wide barrier; orders ordinary shared-memory accesses.
///
/// # Safety
/// Every thread of the CTA must reach it (no divergent call sites).
#[inline(always)]
pub unsafe fn bar_sync() {
    // SAFETY: the caller guarantees CTA-uniform control flow.
    unsafe { asm!("bar.sync 0;", options(nostack)) }
}

/// `shfl.sync.bfly.b32` with the full mask: the value of lane `lane ^ xor_mask`.
///
/// Not `pure`: a pure asm may be sunk into the branch that uses its result, where only
/// some lanes would execute a full-mask shuffle (a hang). Warp-collective asm stays
/// volatile so the compiler keeps it where it is written.
///
/// # Safety
/// All 32 lanes of the warp must execute it together.
#[inline(always)]
pub unsafe fn shfl_xor_f32(v: f32, xor_mask: u32) -> f32 {
    let r: f32;
    // SAFETY: the caller guarantees the whole warp is converged here.
    unsafe {
        asm!("shfl.sync.bfly.b32 {r}, {v}, {m}, 0x1f, 0xffffffff;",
            r = out(reg32) r, v = in(reg32) v, m = in(reg32) xor_mask, options(nostack, nomem))
    }
    r
}

/// `ex2.approx.ftz.f32`: 2^x (`-inf` gives 0).
#[inline(always)]
pub fn ex2(x: f32) -> f32 {
    let r: f32;
    // SAFETY: a pure arithmetic instruction.
    unsafe { asm!("ex2.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(nostack, pure, nomem)) }
    r
}

/// `lg2.approx.ftz.f32`: log2(x).
#[inline(always)]
pub fn lg2(x: f32) -> f32 {
    let r: f32;
    // SAFETY: a pure arithmetic instruction.
    unsafe { asm!("lg2.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(nostack, pure, nomem)) }
    r
}

/// `rcp.approx.ftz.f32`: 1/x.
#[inline(always)]
pub fn rcp(x: f32) -> f32 {
    let r: f32;
    // SAFETY: a pure arithmetic instruction.
    unsafe { asm!("rcp.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(nostack, pure, nomem)) }
    r
}

/// `max.f32` (NaN-propagating is not required: inputs are finite or `-inf`).
#[inline(always)]
pub fn fmax(a: f32, b: f32) -> f32 {
    let r: f32;
    // SAFETY: a pure arithmetic instruction.
    unsafe { asm!("max.f32 {r}, {a}, {b};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, options(nostack, pure, nomem)) }
    r
}
