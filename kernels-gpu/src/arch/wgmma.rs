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

/// `wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 d, desc_a, desc_b, p, 1, 1, 0, TB`:
/// `d = A * B (+ d)` with A `64 x 16` K-major in shared memory and B `16 x 128`, K-major
/// (`TB = 0`) or MN-major (`TB = 1`, the transposed form bf16 allows: each row of K holds
/// 128 contiguous N values, as V tiles do).
///
/// # Safety
/// As [`wgmma_m64n64k16_bf16`].
#[inline(always)]
pub unsafe fn wgmma_m64n128k16_ss_bf16<const TB: u32>(
    d: &mut [f32; 64],
    desc_a: u64,
    desc_b: u64,
    accumulate: bool,
) {
    let scale_d: u32 = accumulate as u32;
    // SAFETY: the caller guarantees convergence and valid descriptors.
    unsafe {
        asm!(
            "{{",
            ".reg .pred p;",
            "setp.ne.b32 p, {scale_d}, 0;",
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}, {d32}, {d33}, {d34}, {d35}, {d36}, {d37}, {d38}, {d39}, {d40}, {d41}, {d42}, {d43}, {d44}, {d45}, {d46}, {d47}, {d48}, {d49}, {d50}, {d51}, {d52}, {d53}, {d54}, {d55}, {d56}, {d57}, {d58}, {d59}, {d60}, {d61}, {d62}, {d63}}}, {desc_a}, {desc_b}, p, 1, 1, 0, {tb};",
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
            d32 = inout(reg32) d[32],
            d33 = inout(reg32) d[33],
            d34 = inout(reg32) d[34],
            d35 = inout(reg32) d[35],
            d36 = inout(reg32) d[36],
            d37 = inout(reg32) d[37],
            d38 = inout(reg32) d[38],
            d39 = inout(reg32) d[39],
            d40 = inout(reg32) d[40],
            d41 = inout(reg32) d[41],
            d42 = inout(reg32) d[42],
            d43 = inout(reg32) d[43],
            d44 = inout(reg32) d[44],
            d45 = inout(reg32) d[45],
            d46 = inout(reg32) d[46],
            d47 = inout(reg32) d[47],
            d48 = inout(reg32) d[48],
            d49 = inout(reg32) d[49],
            d50 = inout(reg32) d[50],
            d51 = inout(reg32) d[51],
            d52 = inout(reg32) d[52],
            d53 = inout(reg32) d[53],
            d54 = inout(reg32) d[54],
            d55 = inout(reg32) d[55],
            d56 = inout(reg32) d[56],
            d57 = inout(reg32) d[57],
            d58 = inout(reg32) d[58],
            d59 = inout(reg32) d[59],
            d60 = inout(reg32) d[60],
            d61 = inout(reg32) d[61],
            d62 = inout(reg32) d[62],
            d63 = inout(reg32) d[63],
            desc_a = in(reg64) desc_a,
            desc_b = in(reg64) desc_b,
            scale_d = in(reg32) scale_d,
            tb = const TB,
            options(nostack)
        )
    }
}

/// `wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 d, {a0, a1, a2, a3}, desc_b, p, 1,
/// 1, TB`: as [`wgmma_m64n128k16_ss_bf16`] with A from registers. Warp `w` of the warpgroup
/// holds rows `16 w .. 16 w + 16` in the `mma.sync` m16n8k16 A-fragment layout: `a0` = (row
/// `g`, k `2c`, `2c + 1`), `a1` = (row `g + 8`, same k), `a2` / `a3` = the same rows at k + 8,
/// with `g = lane / 4`, `c = lane % 4` (so P can stay in registers between QK^T and PV).
///
/// # Safety
/// As [`wgmma_m64n64k16_bf16`].
#[inline(always)]
pub unsafe fn wgmma_m64n128k16_rs_bf16<const TB: u32>(
    d: &mut [f32; 64],
    a: [u32; 4],
    desc_b: u64,
    accumulate: bool,
) {
    let scale_d: u32 = accumulate as u32;
    // SAFETY: the caller guarantees convergence and a valid descriptor.
    unsafe {
        asm!(
            "{{",
            ".reg .pred p;",
            "setp.ne.b32 p, {scale_d}, 0;",
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}, {d32}, {d33}, {d34}, {d35}, {d36}, {d37}, {d38}, {d39}, {d40}, {d41}, {d42}, {d43}, {d44}, {d45}, {d46}, {d47}, {d48}, {d49}, {d50}, {d51}, {d52}, {d53}, {d54}, {d55}, {d56}, {d57}, {d58}, {d59}, {d60}, {d61}, {d62}, {d63}}}, {{{a0}, {a1}, {a2}, {a3}}}, {desc_b}, p, 1, 1, {tb};",
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
            d32 = inout(reg32) d[32],
            d33 = inout(reg32) d[33],
            d34 = inout(reg32) d[34],
            d35 = inout(reg32) d[35],
            d36 = inout(reg32) d[36],
            d37 = inout(reg32) d[37],
            d38 = inout(reg32) d[38],
            d39 = inout(reg32) d[39],
            d40 = inout(reg32) d[40],
            d41 = inout(reg32) d[41],
            d42 = inout(reg32) d[42],
            d43 = inout(reg32) d[43],
            d44 = inout(reg32) d[44],
            d45 = inout(reg32) d[45],
            d46 = inout(reg32) d[46],
            d47 = inout(reg32) d[47],
            d48 = inout(reg32) d[48],
            d49 = inout(reg32) d[49],
            d50 = inout(reg32) d[50],
            d51 = inout(reg32) d[51],
            d52 = inout(reg32) d[52],
            d53 = inout(reg32) d[53],
            d54 = inout(reg32) d[54],
            d55 = inout(reg32) d[55],
            d56 = inout(reg32) d[56],
            d57 = inout(reg32) d[57],
            d58 = inout(reg32) d[58],
            d59 = inout(reg32) d[59],
            d60 = inout(reg32) d[60],
            d61 = inout(reg32) d[61],
            d62 = inout(reg32) d[62],
            d63 = inout(reg32) d[63],
            a0 = in(reg32) a[0],
            a1 = in(reg32) a[1],
            a2 = in(reg32) a[2],
            a3 = in(reg32) a[3],
            desc_b = in(reg64) desc_b,
            scale_d = in(reg32) scale_d,
            tb = const TB,
            options(nostack)
        )
    }
}
