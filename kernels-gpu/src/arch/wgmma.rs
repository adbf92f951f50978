//! `wgmma` (sm_90a only): warpgroup-wide asynchronous MMA with operands in shared memory.
//!
//! A warpgroup is 4 consecutive warps starting at a warp index divisible by 4. For
//! `m64nNk16` with f32 accumulators, thread `t` of the warpgroup holds `N / 2` values:
//! warp `w = t / 32` owns rows `16 w .. 16 w + 16`, and for each 8-column group `j`, registers
//! `4 j .. 4 j + 4` hold (row `16 w + g`, cols `8 j + 2 c`, `+ 1`) and (row `16 w + g + 8`,
//! same cols) with `g = lane / 4`, `c = lane % 4`: the `mma.sync` C layout per 8 columns.
//!
//! Shared-memory operands are described by a 64-bit descriptor ([`smem_desc`]). Stores to
//! shared memory by ordinary instructions must be followed by
//! [`fence_proxy_async_shared`] in each writing thread (before the barrier) for the tensor
//! cores to see them.

use core::arch::asm;

/// Swizzle mode of a shared-memory matrix descriptor (bits 62-63).
#[derive(Clone, Copy)]
pub enum Swizzle {
    None = 0,
    B128 = 1,
    B64 = 2,
    B32 = 3,
}

/// A wgmma shared-memory matrix descriptor: start address, leading-dimension byte offset
/// (between core matrices adjacent in K), stride-dimension byte offset (between core
/// matrices adjacent in M or N), all in bytes (multiples of 16), and the swizzle mode.
#[inline(always)]
pub const fn smem_desc(addr: u32, lbo: u32, sbo: u32, swizzle: Swizzle) -> u64 {
    ((addr as u64 >> 4) & 0x3fff)
        | (((lbo as u64 >> 4) & 0x3fff) << 16)
        | (((sbo as u64 >> 4) & 0x3fff) << 32)
        | ((swizzle as u64) << 62)
}

/// `fence.proxy.async.shared::cta`: makes this thread's generic-proxy shared-memory writes
/// visible to the async proxy (wgmma, bulk copies).
#[inline(always)]
pub fn fence_proxy_async_shared() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.proxy.async.shared::cta;", options(nostack)) }
}

/// `wgmma.fence.sync.aligned`: orders register accesses to the accumulators before the
/// next `wgmma.mma_async`.
///
/// # Safety
/// All threads of the warpgroup execute it together.
#[inline(always)]
pub unsafe fn wgmma_fence() {
    // SAFETY: the caller guarantees warpgroup convergence.
    unsafe { asm!("wgmma.fence.sync.aligned;", options(nostack)) }
}

/// `wgmma.commit_group.sync.aligned`.
///
/// # Safety
/// All threads of the warpgroup execute it together.
#[inline(always)]
pub unsafe fn wgmma_commit_group() {
    // SAFETY: the caller guarantees warpgroup convergence.
    unsafe { asm!("wgmma.commit_group.sync.aligned;", options(nostack)) }
}

/// `wgmma.wait_group.sync.aligned N`: waits until at most `N` groups are pending.
///
/// # Safety
/// All threads of the warpgroup execute it together.
#[inline(always)]
pub unsafe fn wgmma_wait_group<const N: u32>() {
    // SAFETY: the caller guarantees warpgroup convergence.
    unsafe { asm!("wgmma.wait_group.sync.aligned {n};", n = const N, options(nostack)) }
}

/// `wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 d, desc_a, desc_b, p, 1, 1, 0, 0`:
/// `d = A * B^T + (accumulate ? d : 0)` with A `64 x 16` and B `64 x 16`, both K-major in
/// shared memory. Asynchronous: fence before, commit and wait after.
///
/// # Safety
/// All 128 threads of the warpgroup converged; the descriptors describe valid shared memory.
#[inline(always)]
pub unsafe fn wgmma_m64n64k16_bf16(d: &mut [f32; 32], desc_a: u64, desc_b: u64, accumulate: bool) {
    let scale_d: u32 = accumulate as u32;
    // SAFETY: the caller guarantees convergence and valid descriptors.
    unsafe {
        asm!(
            "{{",
            ".reg .pred p;",
            "setp.ne.b32 p, {scale_d}, 0;",
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}}}, {desc_a}, {desc_b}, p, 1, 1, 0, 0;",
            "}}",
            d0 = inout(reg32) d[0],
            d1 = inout(reg32) d[1],
            d2 = inout(reg32) d[2],
            d3 = inout(reg32) d[3],
            d4 = inout(reg32) d[4],
            d5 = inout(reg32) d[5],
            d6 = inout(reg32) d[6],
            d7 = inout(reg32) d[7],
            d8 = inout(reg32) d[8],
            d9 = inout(reg32) d[9],
            d10 = inout(reg32) d[10],
            d11 = inout(reg32) d[11],
            d12 = inout(reg32) d[12],
            d13 = inout(reg32) d[13],
            d14 = inout(reg32) d[14],
            d15 = inout(reg32) d[15],
            d16 = inout(reg32) d[16],
            d17 = inout(reg32) d[17],
            d18 = inout(reg32) d[18],
            d19 = inout(reg32) d[19],
            d20 = inout(reg32) d[20],
            d21 = inout(reg32) d[21],
            d22 = inout(reg32) d[22],
            d23 = inout(reg32) d[23],
            d24 = inout(reg32) d[24],
            d25 = inout(reg32) d[25],
            d26 = inout(reg32) d[26],
            d27 = inout(reg32) d[27],
            d28 = inout(reg32) d[28],
            d29 = inout(reg32) d[29],
            d30 = inout(reg32) d[30],
            d31 = inout(reg32) d[31],
            desc_a = in(reg64) desc_a,
            desc_b = in(reg64) desc_b,
            scale_d = in(reg32) scale_d,
            options(nostack)
        )
    }
}
