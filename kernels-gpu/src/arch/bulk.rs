//! `cp.async.bulk` global-to-shared copies completed on an `mbarrier` (sm_90+): the copy
//! engine path a producer warp uses to feed shared-memory stages without every thread
//! issuing 16-byte `cp.async`s.

use core::arch::asm;

/// `mbarrier.init.shared::cta.b64 [bar], count;`
///
/// # Safety
/// `bar` is an 8-byte aligned shared address that no other thread uses until a barrier
/// orders the initialisation before them.
#[inline(always)]
pub unsafe fn mbarrier_init(bar: u32, count: u32) {
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!("mbarrier.init.shared::cta.b64 [{b}], {c};", b = in(reg32) bar, c = in(reg32) count, options(nostack))
    }
}

/// `fence.mbarrier_init.release.cluster;`: makes this thread's mbarrier initialisations
/// visible to the async proxy (the bulk-copy engine) before a CTA barrier publishes them.
#[inline(always)]
pub fn fence_mbarrier_init() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.mbarrier_init.release.cluster;", options(nostack)) }
}

/// `mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], bytes;`: one arrival that also
/// raises the transaction count the phase waits for by `bytes`.
///
/// # Safety
/// `bar` is an initialised mbarrier.
#[inline(always)]
pub unsafe fn mbarrier_arrive_expect_tx(bar: u32, bytes: u32) {
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!("mbarrier.arrive.expect_tx.shared::cta.b64 _, [{b}], {n};",
            b = in(reg32) bar, n = in(reg32) bytes, options(nostack))
    }
}

/// [`mbarrier_arrive_expect_tx`] once for a converged warp (`elect.sync` picks the lane).
///
/// # Safety
/// `bar` is an initialised mbarrier; all 32 lanes of the warp, converged.
#[inline(always)]
pub unsafe fn mbarrier_arrive_expect_tx_elect(bar: u32, bytes: u32) {
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!(
            "{{",
            ".reg .pred e;",
            "elect.sync _|e, 0xffffffff;",
            "@e mbarrier.arrive.expect_tx.shared::cta.b64 _, [{b}], {n};",
            "}}",
            b = in(reg32) bar, n = in(reg32) bytes, options(nostack))
    }
}

/// `mbarrier.arrive.shared::cta.b64 _, [bar];`: one arrival (a consumer saying a buffer is
/// free again).
///
/// # Safety
/// `bar` is an initialised mbarrier.
#[inline(always)]
pub unsafe fn mbarrier_arrive(bar: u32) {
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!("mbarrier.arrive.shared::cta.b64 _, [{b}];", b = in(reg32) bar, options(nostack))
    }
}

/// [`mbarrier_arrive`] where `pred` is non-zero, predicated inside the asm: a thread-0
/// arrival that leaves no branch on the thread index in front of the next `.aligned`
/// instruction.
///
/// # Safety
/// `bar` is an initialised mbarrier.
#[inline(always)]
pub unsafe fn mbarrier_arrive_if(bar: u32, pred: u32) {
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!(
            "{{",
            ".reg .pred p;",
            "setp.ne.b32 p, {c}, 0;",
            "@p mbarrier.arrive.shared::cta.b64 _, [{b}];",
            "}}",
            b = in(reg32) bar, c = in(reg32) pred, options(nostack)
        )
    }
}

/// `mbarrier.try_wait.parity.shared::cta.b64`: whether the phase with `parity` has
/// completed (the hardware may suspend the thread a while before answering false).
///
/// # Safety
/// `bar` is an initialised mbarrier.
#[inline(always)]
pub unsafe fn mbarrier_try_wait_parity(bar: u32, parity: u32) -> bool {
    let done: u32;
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!(
            "{{",
            ".reg .pred p;",
            "mbarrier.try_wait.parity.shared::cta.b64 p, [{b}], {ph};",
            "selp.u32 {d}, 1, 0, p;",
            "}}",
            b = in(reg32) bar, ph = in(reg32) parity, d = out(reg32) done, options(nostack)
        )
    }
    done != 0
}

/// Polls [`mbarrier_try_wait_parity`] up to `max_polls` times; false if the phase never
/// completed (a test kernel turns a barrier that never completes into an error instead of a
/// hang).
///
/// # Safety
/// `bar` is an initialised mbarrier.
#[inline(always)]
pub unsafe fn mbarrier_wait_parity_bounded(bar: u32, parity: u32, max_polls: u32) -> bool {
    // SAFETY: forwarded from the caller.
    (0..max_polls).any(|_| unsafe { mbarrier_try_wait_parity(bar, parity) })
}

/// `cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], bytes,
/// [bar];`: an asynchronous copy of `bytes` whose completion counts `bytes` transactions
/// on `bar`.
///
/// # Safety
/// `dst` and `src` are 16-byte aligned, `bytes` a multiple of 16, `src .. src + bytes`
/// readable, `dst .. dst + bytes` inside this CTA's shared memory, `bar` an initialised
/// mbarrier that expects the bytes.
#[inline(always)]
pub unsafe fn bulk_copy_g2s(dst: u32, src: *const u8, bytes: u32, bar: u32) {
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [{s}], {n}, [{b}];",
            d = in(reg32) dst, s = in(reg64) src, n = in(reg32) bytes, b = in(reg32) bar, options(nostack))
    }
}

/// `cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes`: the
/// tensor map's box at coordinates `(c0, c1, c2)` (innermost first, in elements) into shared
/// memory at `dst`, laid out (and swizzled) as the map says, completed on `bar`.
///
/// # Safety
/// `tmap` is the generic address of a valid 64-byte aligned tensor map in global (or const
/// / param) memory that no one writes during the kernel; `dst` is aligned as the map's
/// swizzle needs (1024 bytes for the 128-byte swizzle) with the box's bytes inside this
/// CTA's shared memory; `bar` an initialised mbarrier that expects the bytes.
#[inline(always)]
pub unsafe fn tma_load_3d(dst: u32, tmap: *const u8, c: [i32; 3], bar: u32) {
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [{d}], [{m}, {{{c0}, {c1}, {c2}}}], [{b}];",
            d = in(reg32) dst, m = in(reg64) tmap, c0 = in(reg32) c[0], c1 = in(reg32) c[1],
            c2 = in(reg32) c[2], b = in(reg32) bar, options(nostack))
    }
}

/// [`tma_load_3d`] with an L2 cache policy (`createpolicy`'s value, e.g.
/// [`cp_async::l2_evict_first`](super::cp_async::l2_evict_first)) on the lines it brings in.
///
/// # Safety
/// As [`tma_load_3d`].
#[inline(always)]
pub unsafe fn tma_load_3d_hint(dst: u32, tmap: *const u8, c: [i32; 3], bar: u32, policy: u64) {
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [{d}], [{m}, {{{c0}, {c1}, {c2}}}], [{b}], {p};",
            d = in(reg32) dst, m = in(reg64) tmap, c0 = in(reg32) c[0], c1 = in(reg32) c[1],
            c2 = in(reg32) c[2], b = in(reg32) bar, p = in(reg64) policy, options(nostack))
    }
}

/// [`tma_load_3d_hint`] issued once by a converged warp: every lane passes the same
/// operands and `elect.sync` picks the lane that issues. Warp-uniform operands stay in
/// uniform registers; issued from one thread's branch instead, ptxas wraps each copy in a
/// loop over the lanes' distinct coordinates.
///
/// # Safety
/// As [`tma_load_3d`]; all 32 lanes of the warp, converged, with the same operands.
#[inline(always)]
pub unsafe fn tma_load_3d_hint_elect(
    dst: u32,
    tmap: *const u8,
    c: [i32; 3],
    bar: u32,
    policy: u64,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        asm!(
            "{{",
            ".reg .pred e;",
            "elect.sync _|e, 0xffffffff;",
            "@e cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [{d}], [{m}, {{{c0}, {c1}, {c2}}}], [{b}], {p};",
            "}}",
            d = in(reg32) dst, m = in(reg64) tmap, c0 = in(reg32) c[0], c1 = in(reg32) c[1],
            c2 = in(reg32) c[2], b = in(reg32) bar, p = in(reg64) policy, options(nostack))
    }
}

/// `prefetch.tensormap [tmap];`: brings the tensor map into the TMA unit's descriptor
/// cache ahead of the first copy that names it.
///
/// # Safety
/// `tmap` is the generic address of a tensor map in param, const or global memory.
#[inline(always)]
pub unsafe fn prefetch_tensormap(tmap: *const u8) {
    // SAFETY: forwarded from the caller (a prefetch has no other effect).
    unsafe { asm!("prefetch.tensormap [{m}];", m = in(reg64) tmap, options(nostack)) }
}

/// Waits for the phase with `parity` of `bar` to complete (unbounded), for code between
/// `wgmma`s: the warp polls together and leaves the loop together (`vote.sync.all`, then
/// `bra.uni`), so ptxas sees no divergent path and does not serialize the `wgmma`s around
/// it.
///
/// # Safety
/// `bar` is an initialised mbarrier whose phase `parity` will complete; the warp is
/// converged.
#[inline(always)]
#[allow(named_asm_labels)]
pub unsafe fn mbarrier_wait_parity_warp(bar: u32, parity: u32) {
    // SAFETY: forwarded from the caller. The label is local to the braces' scope.
    unsafe {
        asm!(
            "{{",
            ".reg .pred p;",
            ".reg .pred q;",
            "MLA_MBAR_WAIT:",
            "mbarrier.try_wait.parity.shared::cta.b64 p, [{b}], {ph};",
            "vote.sync.all.pred q, p, 0xffffffff;",
            "@!q bra.uni MLA_MBAR_WAIT;",
            "}}",
            b = in(reg32) bar, ph = in(reg32) parity, options(nostack)
        )
    }
}
