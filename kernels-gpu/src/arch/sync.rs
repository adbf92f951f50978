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

/// `barrier.sync 0;` (not `.aligned`): a CTA-wide barrier that the threads of one warp may
/// reach at different instructions. Use it after code that branches on the thread index:
/// LLVM may copy a barrier into both arms of such a branch, and `bar.sync` (the `.aligned`
/// form) executed that way by a split warp is undefined (a hang was seen on the H200).
///
/// # Safety
/// Every thread of the CTA must reach a `barrier.sync 0` the same number of times.
#[inline(always)]
pub unsafe fn bar_sync_unaligned() {
    // SAFETY: the caller guarantees every thread arrives.
    unsafe { asm!("barrier.sync 0;", options(nostack)) }
}

/// `bar.sync ID, THREADS;`: waits on named barrier `ID` until `THREADS` threads (this
/// one included) have arrived or synced on it.
///
/// # Safety
/// Whole warps take part; `THREADS` is a multiple of 32 and exactly that many threads
/// reach barrier `ID` in each of its phases.
#[inline(always)]
pub unsafe fn bar_sync_named<const ID: u32, const THREADS: u32>() {
    // SAFETY: forwarded from the caller.
    unsafe { asm!("bar.sync {i}, {n};", i = const ID, n = const THREADS, options(nostack)) }
}

/// [`bar_sync_named`] with the barrier's number in a register (warpgroups that run the same
/// code on barriers of their own).
///
/// # Safety
/// As [`bar_sync_named`], for barrier `id < 16`.
#[inline(always)]
pub unsafe fn bar_sync_id<const THREADS: u32>(id: u32) {
    // SAFETY: forwarded from the caller.
    unsafe { asm!("bar.sync {i}, {n};", i = in(reg32) id, n = const THREADS, options(nostack)) }
}

/// `bar.arrive ID, THREADS;`: counts this thread on named barrier `ID` without waiting.
///
/// # Safety
/// As [`bar_sync_named`].
#[inline(always)]
pub unsafe fn bar_arrive_named<const ID: u32, const THREADS: u32>() {
    // SAFETY: forwarded from the caller.
    unsafe { asm!("bar.arrive {i}, {n};", i = const ID, n = const THREADS, options(nostack)) }
}

/// [`bar_arrive_named`] with the barrier's number in a register.
///
/// # Safety
/// As [`bar_sync_named`], for barrier `id < 16`.
#[inline(always)]
pub unsafe fn bar_arrive_id<const THREADS: u32>(id: u32) {
    // SAFETY: forwarded from the caller.
    unsafe { asm!("bar.arrive {i}, {n};", i = in(reg32) id, n = const THREADS, options(nostack)) }
}

/// [`bar_arrive_named`] predicated on `cond` (no branch, so that no instruction around it
/// is copied into two paths).
///
/// # Safety
/// As [`bar_sync_named`]; `cond` is the same in every thread of the warp.
#[inline(always)]
pub unsafe fn bar_arrive_named_if<const ID: u32, const THREADS: u32>(cond: bool) {
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!(
            "{{",
            ".reg .pred p;",
            "setp.ne.u32 p, {c}, 0;",
            "@p bar.arrive {i}, {n};",
            "}}",
            c = in(reg32) cond as u32,
            i = const ID,
            n = const THREADS,
            options(nostack)
        )
    }
}

/// `bar.warp.sync 0xffffffff;`: the warp's lanes meet here, and their shared-memory
/// accesses before it are ordered before those after it (a lane reads what another lane's
/// completed `cp.async` wrote).
///
/// # Safety
/// All 32 lanes of the warp reach it.
#[inline(always)]
pub unsafe fn syncwarp() {
    // SAFETY: forwarded from the caller.
    unsafe { asm!("bar.warp.sync 0xffffffff;", options(nostack)) }
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

/// `shfl.sync.idx.b32` with the full mask: the value of lane `src` (`0..32`). Volatile like
/// [`shfl_xor_f32`].
///
/// # Safety
/// All 32 lanes of the warp must execute it together.
#[inline(always)]
pub unsafe fn shfl_idx_f32(v: f32, src: u32) -> f32 {
    let r: f32;
    // SAFETY: the caller guarantees the whole warp is converged here.
    unsafe {
        asm!("shfl.sync.idx.b32 {r}, {v}, {s}, 0x1f, 0xffffffff;",
            r = out(reg32) r, v = in(reg32) v, s = in(reg32) src, options(nostack, nomem))
    }
    r
}

/// `vote.sync.ballot.b32` with the full mask: bit `i` set where lane `i`'s `pred` holds.
/// Volatile like [`shfl_xor_f32`].
///
/// # Safety
/// All 32 lanes of the warp must execute it together.
#[inline(always)]
pub unsafe fn ballot(pred: bool) -> u32 {
    let r: u32;
    // SAFETY: the caller guarantees the whole warp is converged here.
    unsafe {
        asm!("{{", ".reg .pred p;", "setp.ne.u32 p, {x}, 0;", "vote.sync.ballot.b32 {r}, p, 0xffffffff;", "}}",
            r = out(reg32) r, x = in(reg32) pred as u32, options(nostack, nomem))
    }
    r
}

/// A 64-bit butterfly shuffle as two `shfl.sync.bfly.b32` (see [`shfl_xor_f32`]).
///
/// # Safety
/// All 32 lanes of the warp must execute it together.
#[inline(always)]
pub unsafe fn shfl_xor_u64(v: u64, xor_mask: u32) -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: the caller guarantees the whole warp is converged here. Not pure (see above).
    unsafe {
        asm!("shfl.sync.bfly.b32 {lo}, {vlo}, {m}, 0x1f, 0xffffffff;",
             "shfl.sync.bfly.b32 {hi}, {vhi}, {m}, 0x1f, 0xffffffff;",
            lo = out(reg32) lo, hi = out(reg32) hi, vlo = in(reg32) v as u32, vhi = in(reg32) (v >> 32) as u32,
            m = in(reg32) xor_mask, options(nostack, nomem))
    }
    ((hi as u64) << 32) | lo as u64
}

/// The sum of `v` over the warp's 32 lanes, in every lane (butterfly of
/// [`shfl_xor_u64`]).
///
/// # Safety
/// All 32 lanes of the warp must execute it together.
#[inline(always)]
pub unsafe fn warp_sum_u64(mut v: u64) -> u64 {
    let mut off = 16;
    while off > 0 {
        // SAFETY: forwarded from the caller.
        v += unsafe { shfl_xor_u64(v, off) };
        off /= 2;
    }
    v
}

/// The sum of `v` over the warp's 32 lanes, in every lane ([`warp_sum_u64`] for values
/// whose sum fits 32 bits: one shuffle a step, not two).
///
/// # Safety
/// All 32 lanes of the warp must execute it together.
#[inline(always)]
pub unsafe fn warp_sum_u32(mut v: u32) -> u32 {
    let mut off = 16;
    while off > 0 {
        // SAFETY: forwarded from the caller.
        v += unsafe { shfl_xor_f32(f32::from_bits(v), off) }.to_bits();
        off /= 2;
    }
    v
}

/// `ex2.approx.ftz.f32`: 2^x (`-inf` gives 0).
#[inline(always)]
pub fn ex2(x: f32) -> f32 {
    let r: f32;
    // SAFETY: a pure arithmetic instruction.
    unsafe {
        asm!("ex2.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(nostack, pure, nomem))
    }
    r
}

/// `lg2.approx.ftz.f32`: log2(x).
#[inline(always)]
pub fn lg2(x: f32) -> f32 {
    let r: f32;
    // SAFETY: a pure arithmetic instruction.
    unsafe {
        asm!("lg2.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(nostack, pure, nomem))
    }
    r
}

/// `rcp.approx.ftz.f32`: 1/x.
#[inline(always)]
pub fn rcp(x: f32) -> f32 {
    let r: f32;
    // SAFETY: a pure arithmetic instruction.
    unsafe {
        asm!("rcp.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(nostack, pure, nomem))
    }
    r
}

/// `fma.rn.f32`: `a * b + c` rounded once.
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    let r: f32;
    // SAFETY: a pure arithmetic instruction.
    unsafe {
        asm!("fma.rn.f32 {r}, {a}, {b}, {c};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, c = in(reg32) c, options(nostack, pure, nomem))
    }
    r
}

/// `max.f32` (NaN-propagating is not required: inputs are finite or `-inf`).
#[inline(always)]
pub fn fmax(a: f32, b: f32) -> f32 {
    let r: f32;
    // SAFETY: a pure arithmetic instruction.
    unsafe {
        asm!("max.f32 {r}, {a}, {b};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, options(nostack, pure, nomem))
    }
    r
}
