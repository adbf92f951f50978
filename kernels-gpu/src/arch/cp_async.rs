//! `cp.async` (sm_80+): asynchronous 16-byte global-to-shared copies.

use core::arch::asm;

/// `cp.async.cg.shared.global [dst], [src], 16, src_bytes;` — copies `src_bytes` (0 or 16)
/// and zero-fills the rest of the 16 bytes. With `src_bytes == 0` nothing is read, so an
/// out-of-range row can be "loaded" as zeros without touching memory.
///
/// # Safety
/// `dst` is a 16-byte aligned smem address; when `src_bytes == 16`, `src` is a 16-byte
/// aligned readable global address.
#[inline(always)]
pub unsafe fn cp_async_cg_16(dst: u32, src: *const u8, src_bytes: u32) {
    // SAFETY: the caller guarantees both addresses.
    unsafe {
        asm!("cp.async.cg.shared.global [{d}], [{s}], 16, {n};",
            d = in(reg32) dst, s = in(reg64) src, n = in(reg32) src_bytes, options(nostack))
    }
}

/// [`cp_async_cg_16`] with an L2 cache policy (from [`l2_evict_first`]).
///
/// # Safety
/// As [`cp_async_cg_16`].
#[inline(always)]
pub unsafe fn cp_async_cg_16_hint(dst: u32, src: *const u8, src_bytes: u32, policy: u64) {
    // SAFETY: the caller guarantees both addresses.
    unsafe {
        asm!("cp.async.cg.shared.global.L2::cache_hint [{d}], [{s}], 16, {n}, {p};",
            d = in(reg32) dst, s = in(reg64) src, n = in(reg32) src_bytes, p = in(reg64) policy,
            options(nostack))
    }
}

/// An L2 policy that marks every line it covers evict-first (streamed data that should
/// not push out what is reused).
#[inline(always)]
pub fn l2_evict_first() -> u64 {
    let p: u64;
    // SAFETY: creates a policy value; no memory is touched.
    unsafe {
        asm!("createpolicy.fractional.L2::evict_first.b64 {p}, 1.0;", p = out(reg64) p, options(nostack, nomem, pure))
    }
    p
}

/// `cp.async.mbarrier.arrive.noinc.shared::cta.b64 [bar];`: once every `cp.async` this
/// thread issued before has landed, `bar` gets one arrival, one of the count it was
/// initialised with (`.noinc`: the pending count is not raised for it). The copies need
/// not be committed to a group.
///
/// # Safety
/// `bar` is an initialised mbarrier whose count includes this arrival.
#[inline(always)]
pub unsafe fn cp_async_mbarrier_arrive_noinc(bar: u32) {
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [{b}];", b = in(reg32) bar, options(nostack))
    }
}

/// `cp.async.commit_group;`
#[inline(always)]
pub fn cp_async_commit_group() {
    // SAFETY: no memory is touched by committing a group.
    unsafe { asm!("cp.async.commit_group;", options(nostack)) }
}

/// `cp.async.wait_group N;` — waits until at most `N` groups of this thread are pending.
/// A barrier is still needed before other threads read the data.
#[inline(always)]
pub fn cp_async_wait_group<const N: u32>() {
    // SAFETY: waiting has no preconditions.
    unsafe { asm!("cp.async.wait_group {n};", n = const N, options(nostack)) }
}

/// `cp.async.ca.shared.global [dst], [src], 4;` — one 4-byte word (a page-table entry
/// fetched ahead without holding a register).
///
/// # Safety
/// `dst` is a 4-byte aligned smem address, `src` a 4-byte aligned readable global address.
#[inline(always)]
pub unsafe fn cp_async_ca_4(dst: u32, src: *const u8) {
    // SAFETY: the caller guarantees both addresses.
    unsafe {
        asm!("cp.async.ca.shared.global [{d}], [{s}], 4;", d = in(reg32) dst, s = in(reg64) src, options(nostack))
    }
}
