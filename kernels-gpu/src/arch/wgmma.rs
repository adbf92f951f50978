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

/// A shared-memory matrix descriptor taken at byte offsets from one base address (the
/// slabs and k-steps of one operand): [`Desc::at`] is `smem_desc(addr + offset, ..)`, and
/// [`Desc::at_k`] that plus `k` in the address field.
///
/// Kept as the descriptor's two 32-bit halves: the high one (stride offset, swizzle) a
/// constant, the low one (address and leading offset fields) computed once from the base,
/// each offset one add to it. Re-deriving the address field per descriptor (add, shift,
/// 14-bit mask, or, a 64-bit add per k-step) took about 26 uniform instructions for a
/// slab's 4 `wgmma`s of S; the halves take 19 (docs/PERF.md 3.21). Equal to [`smem_desc`]
/// for every base and offset whose sum stays below 256 KB (the address field's 14 bits of
/// 16-byte units), as every shared address does.
#[derive(Clone, Copy)]
pub struct Desc {
    lo: u32,
    hi: u32,
}

impl Desc {
    /// The descriptor of the matrix at `addr` (see [`smem_desc`]).
    #[inline(always)]
    pub const fn new(addr: u32, lbo: u32, sbo: u32, swizzle: Swizzle) -> Desc {
        Desc {
            lo: (addr >> 4) | ((lbo >> 4) << 16),
            hi: (sbo >> 4) | ((swizzle as u32) << 30),
        }
    }

    /// The descriptor of the matrix `offset` bytes (a multiple of 16) past the base.
    #[inline(always)]
    pub const fn at(self, offset: u32) -> u64 {
        self.at_k(offset, 0)
    }

    /// [`Desc::at`] with `k` more in the address field (`16 k` bytes: a k-step).
    #[inline(always)]
    pub const fn at_k(self, offset: u32, k: u32) -> u64 {
        ((self.hi as u64) << 32) | (self.lo + (offset >> 4) + k) as u64
    }
}

/// `fence.proxy.async.shared::cta`: makes this thread's generic-proxy shared-memory writes
/// visible to the async proxy (wgmma, bulk copies).
#[inline(always)]
pub fn fence_proxy_async_shared() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.proxy.async.shared::cta;", options(nostack)) }
}

/// `setmaxnreg.inc.sync.aligned.u32 N`: this warpgroup's per-thread register limit rises
/// to `N` (a multiple of 8 in 24..=256), waiting until the CTA's pool has the registers.
/// ptxas allocates the code after it against `N`; the kernel's entry needs a `.maxntid`
/// (the build adds it to every entry that uses this).
///
/// # Safety
/// All threads of the warpgroup execute it together; the warpgroups' limits never sum
/// above the registers the CTA launched with.
#[inline(always)]
pub unsafe fn setmaxnreg_inc<const N: u32>() {
    // SAFETY: forwarded from the caller.
    unsafe { asm!("setmaxnreg.inc.sync.aligned.u32 {n};", n = const N, options(nostack)) }
}

/// `setmaxnreg.dec.sync.aligned.u32 N`: this warpgroup returns registers to the CTA's
/// pool, down to `N` per thread.
///
/// # Safety
/// As [`setmaxnreg_inc`]; the code after it needs at most `N` registers.
#[inline(always)]
pub unsafe fn setmaxnreg_dec<const N: u32>() {
    // SAFETY: forwarded from the caller.
    unsafe { asm!("setmaxnreg.dec.sync.aligned.u32 {n};", n = const N, options(nostack)) }
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

/// Defines `$name`: `wgmma.mma_async.sync.aligned.m64n64k16.f32.$ty.$ty` (see the
/// instances below).
macro_rules! wgmma_m64n64k16_fn {
    ($(#[$doc:meta])* $name:ident, $ty:literal) => {
        wgmma_m64n64_fn!(
            $(#[$doc])* $name,
            concat!("m64n64k16.f32.", $ty, ".", $ty),
            desc_a: u64,
            "{desc_a}",
            "1, 1, 0, 0",
            [desc_a = in(reg64) desc_a,]
        );
    };
}

/// Defines `$name`: `wgmma.mma_async.sync.aligned.$instr` with N = 64 (32 accumulators), A
/// as `$a: $at` (a descriptor or four registers) written `$a_text`, and the immediates
/// `$tail` after the predicate.
macro_rules! wgmma_m64n64_fn {
    ($(#[$doc:meta])* $name:ident, $instr:expr, $a:ident: $at:ty, $a_text:literal,
     $tail:literal, [$($a_ops:tt)*]) => {
        $(#[$doc])*
        #[inline(always)]
        pub unsafe fn $name(d: &mut [f32; 32], $a: $at, desc_b: u64, accumulate: bool) {
            let scale_d: u32 = accumulate as u32;
            // SAFETY: the caller guarantees convergence and valid operands.
            unsafe {
                asm!(
                    "{{",
                    ".reg .pred p;",
                    "setp.ne.b32 p, {scale_d}, 0;",
                    concat!("wgmma.mma_async.sync.aligned.", $instr, " {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}}}, ", $a_text, ", {desc_b}, p, ", $tail, ";"),
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
                    $($a_ops)*
                    desc_b = in(reg64) desc_b,
                    scale_d = in(reg32) scale_d,
                    options(nostack)
                )
            }
        }
    };
}

wgmma_m64n64k16_fn!(
    /// `wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 d, desc_a, desc_b, p, 1, 1, 0, 0`:
    /// `d = A * B^T + (accumulate ? d : 0)` with A `64 x 16` and B `64 x 16`, both K-major in
    /// shared memory. Asynchronous: fence before, commit and wait after.
    ///
    /// # Safety
    /// All 128 threads of the warpgroup converged; the descriptors describe valid shared memory.
    wgmma_m64n64k16_bf16,
    "bf16"
);

wgmma_m64n64_fn!(
    /// `wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 d, desc_a, desc_b, p, 1, 1`:
    /// `d = A * B^T + (accumulate ? d : 0)` with A `64 x 32` and B `64 x 32` fp8 e4m3, both
    /// K-major in shared memory (8-bit operands have no transposed form).
    ///
    /// # Safety
    /// As [`wgmma_m64n64k16_bf16`].
    wgmma_m64n64k32_e4m3,
    "m64n64k32.f32.e4m3.e4m3",
    desc_a: u64,
    "{desc_a}",
    "1, 1",
    [desc_a = in(reg64) desc_a,]
);

wgmma_m64n64_fn!(
    /// As [`wgmma_m64n64k32_e4m3`] with A from registers: thread `t` of warp `w` holds rows
    /// `16 w + g` (words 0 and 2) and `16 w + g + 8` (words 1 and 3), k `4 c .. 4 c + 4`
    /// (words 0 and 1) and `16 + 4 c ..` (words 2 and 3), lowest k in the lowest byte
    /// (`g = lane / 4`, `c = lane % 4`).
    ///
    /// # Safety
    /// As [`wgmma_m64n64k16_bf16`].
    wgmma_m64n64k32_rs_e4m3,
    "m64n64k32.f32.e4m3.e4m3",
    a: [u32; 4],
    "{{{a0}, {a1}, {a2}, {a3}}}",
    "1, 1",
    [a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],]
);

/// The `m64n128k16` bf16 `wgmma` with its 64 accumulator operands (`$d`, `[f32; 64]`)
/// written once: `$a` is the A operand's text (a descriptor or four registers), `$tail` the
/// immediates after the predicate, then the other operands.
macro_rules! wgmma_m64n128k16_asm {
    ($d:ident, $a:literal, $tail:literal, $($operands:tt)*) => {
        asm!(
            "{{",
            ".reg .pred p;",
            "setp.ne.b32 p, {scale_d}, 0;",
            concat!(
                "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}, {d32}, {d33}, {d34}, {d35}, {d36}, {d37}, {d38}, {d39}, {d40}, {d41}, {d42}, {d43}, {d44}, {d45}, {d46}, {d47}, {d48}, {d49}, {d50}, {d51}, {d52}, {d53}, {d54}, {d55}, {d56}, {d57}, {d58}, {d59}, {d60}, {d61}, {d62}, {d63}}}, ",
                $a,
                ", {desc_b}, p, ",
                $tail,
                ";"
            ),
            "}}",
            d0 = inout(reg32) $d[0],
            d1 = inout(reg32) $d[1],
            d2 = inout(reg32) $d[2],
            d3 = inout(reg32) $d[3],
            d4 = inout(reg32) $d[4],
            d5 = inout(reg32) $d[5],
            d6 = inout(reg32) $d[6],
            d7 = inout(reg32) $d[7],
            d8 = inout(reg32) $d[8],
            d9 = inout(reg32) $d[9],
            d10 = inout(reg32) $d[10],
            d11 = inout(reg32) $d[11],
            d12 = inout(reg32) $d[12],
            d13 = inout(reg32) $d[13],
            d14 = inout(reg32) $d[14],
            d15 = inout(reg32) $d[15],
            d16 = inout(reg32) $d[16],
            d17 = inout(reg32) $d[17],
            d18 = inout(reg32) $d[18],
            d19 = inout(reg32) $d[19],
            d20 = inout(reg32) $d[20],
            d21 = inout(reg32) $d[21],
            d22 = inout(reg32) $d[22],
            d23 = inout(reg32) $d[23],
            d24 = inout(reg32) $d[24],
            d25 = inout(reg32) $d[25],
            d26 = inout(reg32) $d[26],
            d27 = inout(reg32) $d[27],
            d28 = inout(reg32) $d[28],
            d29 = inout(reg32) $d[29],
            d30 = inout(reg32) $d[30],
            d31 = inout(reg32) $d[31],
            d32 = inout(reg32) $d[32],
            d33 = inout(reg32) $d[33],
            d34 = inout(reg32) $d[34],
            d35 = inout(reg32) $d[35],
            d36 = inout(reg32) $d[36],
            d37 = inout(reg32) $d[37],
            d38 = inout(reg32) $d[38],
            d39 = inout(reg32) $d[39],
            d40 = inout(reg32) $d[40],
            d41 = inout(reg32) $d[41],
            d42 = inout(reg32) $d[42],
            d43 = inout(reg32) $d[43],
            d44 = inout(reg32) $d[44],
            d45 = inout(reg32) $d[45],
            d46 = inout(reg32) $d[46],
            d47 = inout(reg32) $d[47],
            d48 = inout(reg32) $d[48],
            d49 = inout(reg32) $d[49],
            d50 = inout(reg32) $d[50],
            d51 = inout(reg32) $d[51],
            d52 = inout(reg32) $d[52],
            d53 = inout(reg32) $d[53],
            d54 = inout(reg32) $d[54],
            d55 = inout(reg32) $d[55],
            d56 = inout(reg32) $d[56],
            d57 = inout(reg32) $d[57],
            d58 = inout(reg32) $d[58],
            d59 = inout(reg32) $d[59],
            d60 = inout(reg32) $d[60],
            d61 = inout(reg32) $d[61],
            d62 = inout(reg32) $d[62],
            d63 = inout(reg32) $d[63],
            $($operands)*
        )
    };
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
        wgmma_m64n128k16_asm!(
            d,
            "{desc_a}",
            "1, 1, 0, {tb}",
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
        wgmma_m64n128k16_asm!(
            d,
            "{{{a0}, {a1}, {a2}, {a3}}}",
            "1, 1, {tb}",
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

/// The `m64n256k16` bf16 `wgmma` with its 128 accumulator operands (`$d`, `[[f32; 4]; 32]`)
/// written once: `$a` is the A operand's text (a descriptor or four registers), `$tail` the
/// immediates after the predicate, then the other operands.
macro_rules! wgmma_m64n256_asm {
    ($instr:expr, $d:ident, $a:literal, $tail:literal, $($operands:tt)*) => {
        asm!(
            "{{",
            ".reg .pred p;",
            "setp.ne.b32 p, {scale_d}, 0;",
            concat!(
                "wgmma.mma_async.sync.aligned.",
                $instr,
                " {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}, {d32}, {d33}, {d34}, {d35}, {d36}, {d37}, {d38}, {d39}, {d40}, {d41}, {d42}, {d43}, {d44}, {d45}, {d46}, {d47}, {d48}, {d49}, {d50}, {d51}, {d52}, {d53}, {d54}, {d55}, {d56}, {d57}, {d58}, {d59}, {d60}, {d61}, {d62}, {d63}, {d64}, {d65}, {d66}, {d67}, {d68}, {d69}, {d70}, {d71}, {d72}, {d73}, {d74}, {d75}, {d76}, {d77}, {d78}, {d79}, {d80}, {d81}, {d82}, {d83}, {d84}, {d85}, {d86}, {d87}, {d88}, {d89}, {d90}, {d91}, {d92}, {d93}, {d94}, {d95}, {d96}, {d97}, {d98}, {d99}, {d100}, {d101}, {d102}, {d103}, {d104}, {d105}, {d106}, {d107}, {d108}, {d109}, {d110}, {d111}, {d112}, {d113}, {d114}, {d115}, {d116}, {d117}, {d118}, {d119}, {d120}, {d121}, {d122}, {d123}, {d124}, {d125}, {d126}, {d127}}}, ",
                $a,
                ", {desc_b}, p, ",
                $tail,
                ";"
            ),
            "}}",
            d0 = inout(reg32) $d[0][0],
            d1 = inout(reg32) $d[0][1],
            d2 = inout(reg32) $d[0][2],
            d3 = inout(reg32) $d[0][3],
            d4 = inout(reg32) $d[1][0],
            d5 = inout(reg32) $d[1][1],
            d6 = inout(reg32) $d[1][2],
            d7 = inout(reg32) $d[1][3],
            d8 = inout(reg32) $d[2][0],
            d9 = inout(reg32) $d[2][1],
            d10 = inout(reg32) $d[2][2],
            d11 = inout(reg32) $d[2][3],
            d12 = inout(reg32) $d[3][0],
            d13 = inout(reg32) $d[3][1],
            d14 = inout(reg32) $d[3][2],
            d15 = inout(reg32) $d[3][3],
            d16 = inout(reg32) $d[4][0],
            d17 = inout(reg32) $d[4][1],
            d18 = inout(reg32) $d[4][2],
            d19 = inout(reg32) $d[4][3],
            d20 = inout(reg32) $d[5][0],
            d21 = inout(reg32) $d[5][1],
            d22 = inout(reg32) $d[5][2],
            d23 = inout(reg32) $d[5][3],
            d24 = inout(reg32) $d[6][0],
            d25 = inout(reg32) $d[6][1],
            d26 = inout(reg32) $d[6][2],
            d27 = inout(reg32) $d[6][3],
            d28 = inout(reg32) $d[7][0],
            d29 = inout(reg32) $d[7][1],
            d30 = inout(reg32) $d[7][2],
            d31 = inout(reg32) $d[7][3],
            d32 = inout(reg32) $d[8][0],
            d33 = inout(reg32) $d[8][1],
            d34 = inout(reg32) $d[8][2],
            d35 = inout(reg32) $d[8][3],
            d36 = inout(reg32) $d[9][0],
            d37 = inout(reg32) $d[9][1],
            d38 = inout(reg32) $d[9][2],
            d39 = inout(reg32) $d[9][3],
            d40 = inout(reg32) $d[10][0],
            d41 = inout(reg32) $d[10][1],
            d42 = inout(reg32) $d[10][2],
            d43 = inout(reg32) $d[10][3],
            d44 = inout(reg32) $d[11][0],
            d45 = inout(reg32) $d[11][1],
            d46 = inout(reg32) $d[11][2],
            d47 = inout(reg32) $d[11][3],
            d48 = inout(reg32) $d[12][0],
            d49 = inout(reg32) $d[12][1],
            d50 = inout(reg32) $d[12][2],
            d51 = inout(reg32) $d[12][3],
            d52 = inout(reg32) $d[13][0],
            d53 = inout(reg32) $d[13][1],
            d54 = inout(reg32) $d[13][2],
            d55 = inout(reg32) $d[13][3],
            d56 = inout(reg32) $d[14][0],
            d57 = inout(reg32) $d[14][1],
            d58 = inout(reg32) $d[14][2],
            d59 = inout(reg32) $d[14][3],
            d60 = inout(reg32) $d[15][0],
            d61 = inout(reg32) $d[15][1],
            d62 = inout(reg32) $d[15][2],
            d63 = inout(reg32) $d[15][3],
            d64 = inout(reg32) $d[16][0],
            d65 = inout(reg32) $d[16][1],
            d66 = inout(reg32) $d[16][2],
            d67 = inout(reg32) $d[16][3],
            d68 = inout(reg32) $d[17][0],
            d69 = inout(reg32) $d[17][1],
            d70 = inout(reg32) $d[17][2],
            d71 = inout(reg32) $d[17][3],
            d72 = inout(reg32) $d[18][0],
            d73 = inout(reg32) $d[18][1],
            d74 = inout(reg32) $d[18][2],
            d75 = inout(reg32) $d[18][3],
            d76 = inout(reg32) $d[19][0],
            d77 = inout(reg32) $d[19][1],
            d78 = inout(reg32) $d[19][2],
            d79 = inout(reg32) $d[19][3],
            d80 = inout(reg32) $d[20][0],
            d81 = inout(reg32) $d[20][1],
            d82 = inout(reg32) $d[20][2],
            d83 = inout(reg32) $d[20][3],
            d84 = inout(reg32) $d[21][0],
            d85 = inout(reg32) $d[21][1],
            d86 = inout(reg32) $d[21][2],
            d87 = inout(reg32) $d[21][3],
            d88 = inout(reg32) $d[22][0],
            d89 = inout(reg32) $d[22][1],
            d90 = inout(reg32) $d[22][2],
            d91 = inout(reg32) $d[22][3],
            d92 = inout(reg32) $d[23][0],
            d93 = inout(reg32) $d[23][1],
            d94 = inout(reg32) $d[23][2],
            d95 = inout(reg32) $d[23][3],
            d96 = inout(reg32) $d[24][0],
            d97 = inout(reg32) $d[24][1],
            d98 = inout(reg32) $d[24][2],
            d99 = inout(reg32) $d[24][3],
            d100 = inout(reg32) $d[25][0],
            d101 = inout(reg32) $d[25][1],
            d102 = inout(reg32) $d[25][2],
            d103 = inout(reg32) $d[25][3],
            d104 = inout(reg32) $d[26][0],
            d105 = inout(reg32) $d[26][1],
            d106 = inout(reg32) $d[26][2],
            d107 = inout(reg32) $d[26][3],
            d108 = inout(reg32) $d[27][0],
            d109 = inout(reg32) $d[27][1],
            d110 = inout(reg32) $d[27][2],
            d111 = inout(reg32) $d[27][3],
            d112 = inout(reg32) $d[28][0],
            d113 = inout(reg32) $d[28][1],
            d114 = inout(reg32) $d[28][2],
            d115 = inout(reg32) $d[28][3],
            d116 = inout(reg32) $d[29][0],
            d117 = inout(reg32) $d[29][1],
            d118 = inout(reg32) $d[29][2],
            d119 = inout(reg32) $d[29][3],
            d120 = inout(reg32) $d[30][0],
            d121 = inout(reg32) $d[30][1],
            d122 = inout(reg32) $d[30][2],
            d123 = inout(reg32) $d[30][3],
            d124 = inout(reg32) $d[31][0],
            d125 = inout(reg32) $d[31][1],
            d126 = inout(reg32) $d[31][2],
            d127 = inout(reg32) $d[31][3],
            $($operands)*
        )
    };
}

/// Defines `$name`: the m64n256k16 `wgmma` with `$ty` operands and A as `$a: $at` (four
/// registers, or a shared-memory descriptor), `$a_text` its operand text, `$tail` the
/// immediates after the predicate.
macro_rules! wgmma_m64n256k16_fn {
    ($(#[$doc:meta])* $name:ident, $ty:literal, $a:ident: $at:ty, $a_text:literal,
     $tail:literal, [$($a_ops:tt)*]) => {
        $(#[$doc])*
        #[inline(always)]
        pub unsafe fn $name<const TB: u32>(
            d: &mut [[f32; 4]; 32],
            $a: $at,
            desc_b: u64,
            accumulate: bool,
        ) {
            let scale_d: u32 = accumulate as u32;
            // SAFETY: the caller guarantees convergence and valid operands.
            unsafe {
                wgmma_m64n256_asm!(
                    concat!("m64n256k16.f32.", $ty, ".", $ty),
                    d,
                    $a_text,
                    $tail,
                    $($a_ops)*
                    desc_b = in(reg64) desc_b,
                    scale_d = in(reg32) scale_d,
                    tb = const TB,
                    options(nostack)
                )
            }
        }
    };
}

wgmma_m64n256k16_fn!(
    /// `wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 d, {a0, a1, a2, a3}, desc_b, p, 1,
    /// 1, TB`: as [`wgmma_m64n128k16_rs_bf16`] with 256 columns (128 accumulators per thread,
    /// `d[j]` = the four values of 8-column group `j`; 32 small arrays rather than one of 128,
    /// which LLVM would leave in local memory).
    ///
    /// # Safety
    /// As [`wgmma_m64n64k16_bf16`].
    wgmma_m64n256k16_rs_bf16,
    "bf16",
    a: [u32; 4],
    "{{{a0}, {a1}, {a2}, {a3}}}",
    "1, 1, {tb}",
    [a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],]
);

/// The N = 32 `wgmma` (16 accumulators, `$d`: `[f32; 16]`) with both operands from shared
/// memory: `$instr` the shape and types, `$tail` the immediates after the predicate, then the
/// other operands (`desc_a`, `desc_b`, `scale_d`, any immediates).
macro_rules! wgmma_m64n32_asm {
    ($d:ident, $instr:literal, $tail:literal, $($operands:tt)*) => {
        asm!(
            "{{",
            ".reg .pred p;",
            "setp.ne.b32 p, {scale_d}, 0;",
            concat!(
                "wgmma.mma_async.sync.aligned.",
                $instr,
                " {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}}}, {desc_a}, {desc_b}, p, ",
                $tail,
                ";"
            ),
            "}}",
            d0 = inout(reg32) $d[0],
            d1 = inout(reg32) $d[1],
            d2 = inout(reg32) $d[2],
            d3 = inout(reg32) $d[3],
            d4 = inout(reg32) $d[4],
            d5 = inout(reg32) $d[5],
            d6 = inout(reg32) $d[6],
            d7 = inout(reg32) $d[7],
            d8 = inout(reg32) $d[8],
            d9 = inout(reg32) $d[9],
            d10 = inout(reg32) $d[10],
            d11 = inout(reg32) $d[11],
            d12 = inout(reg32) $d[12],
            d13 = inout(reg32) $d[13],
            d14 = inout(reg32) $d[14],
            d15 = inout(reg32) $d[15],
            $($operands)*
        )
    };
}

/// `wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 d, desc_a, desc_b, p, 1, 1, TA, 0`:
/// as [`wgmma_m64n64k16_bf16`] with 32 columns (B `32 x 16`, K-major), 16 accumulators; A
/// K-major (`TA = 0`) or MN-major (`TA = 1`, the transpose bit).
///
/// # Safety
/// As [`wgmma_m64n64k16_bf16`]; `TA` is 0 or 1.
#[inline(always)]
pub unsafe fn wgmma_m64n32k16_bf16<const TA: u32>(
    d: &mut [f32; 16],
    desc_a: u64,
    desc_b: u64,
    accumulate: bool,
) {
    let scale_d: u32 = accumulate as u32;
    // SAFETY: the caller guarantees convergence and valid descriptors.
    unsafe {
        wgmma_m64n32_asm!(
            d,
            "m64n32k16.f32.bf16.bf16",
            "1, 1, {ta}, 0",
            desc_a = in(reg64) desc_a,
            desc_b = in(reg64) desc_b,
            scale_d = in(reg32) scale_d,
            ta = const TA,
            options(nostack)
        )
    }
}

/// `wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 d, desc_a, desc_b, p, 1, 1`: as
/// [`wgmma_m64n32k16_bf16`] with fp8 e4m3 operands, A `64 x 32` and B `32 x 32`, both
/// K-major (8-bit operands have no transposed form).
///
/// # Safety
/// As [`wgmma_m64n64k16_bf16`].
#[inline(always)]
pub unsafe fn wgmma_m64n32k32_e4m3(d: &mut [f32; 16], desc_a: u64, desc_b: u64, accumulate: bool) {
    let scale_d: u32 = accumulate as u32;
    // SAFETY: the caller guarantees convergence and valid descriptors.
    unsafe {
        wgmma_m64n32_asm!(
            d,
            "m64n32k32.f32.e4m3.e4m3",
            "1, 1",
            desc_a = in(reg64) desc_a,
            desc_b = in(reg64) desc_b,
            scale_d = in(reg32) scale_d,
            options(nostack)
        )
    }
}

wgmma_m64n256k16_fn!(
    /// `wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 d, desc_a, desc_b, p, 1, 1, 0, TB`:
    /// as [`wgmma_m64n256k16_rs_bf16`] with A (`64 x 16`, K-major) from shared memory.
    ///
    /// # Safety
    /// As [`wgmma_m64n64k16_bf16`].
    wgmma_m64n256k16_ss_bf16,
    "bf16",
    desc_a: u64,
    "{desc_a}",
    "1, 1, 0, {tb}",
    [desc_a = in(reg64) desc_a,]
);

/// Defines `$name`: the m64n256k32 e4m3 `wgmma` (8-bit operands: both K-major, no transpose
/// immediates) with A as `$a: $at`, written `$a_text`.
macro_rules! wgmma_m64n256k32_e4m3_fn {
    ($(#[$doc:meta])* $name:ident, $a:ident: $at:ty, $a_text:literal, [$($a_ops:tt)*]) => {
        $(#[$doc])*
        #[inline(always)]
        pub unsafe fn $name(d: &mut [[f32; 4]; 32], $a: $at, desc_b: u64, accumulate: bool) {
            let scale_d: u32 = accumulate as u32;
            // SAFETY: the caller guarantees convergence and valid operands.
            unsafe {
                wgmma_m64n256_asm!(
                    "m64n256k32.f32.e4m3.e4m3",
                    d,
                    $a_text,
                    "1, 1",
                    $($a_ops)*
                    desc_b = in(reg64) desc_b,
                    scale_d = in(reg32) scale_d,
                    options(nostack)
                )
            }
        }
    };
}

wgmma_m64n256k32_e4m3_fn!(
    /// `wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 d, {a0, a1, a2, a3}, desc_b, p,
    /// 1, 1`: `d = A * B^T (+ d)` with A `64 x 32` e4m3 from registers (the fragment of
    /// [`wgmma_m64n64k32_rs_e4m3`]) and B `256 x 32` e4m3, K-major in shared memory; the
    /// accumulators as [`wgmma_m64n256k16_rs_bf16`]'s.
    ///
    /// # Safety
    /// As [`wgmma_m64n64k16_bf16`].
    wgmma_m64n256k32_rs_e4m3,
    a: [u32; 4],
    "{{{a0}, {a1}, {a2}, {a3}}}",
    [a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],]
);

wgmma_m64n256k32_e4m3_fn!(
    /// As [`wgmma_m64n256k32_rs_e4m3`] with A (`64 x 32`, K-major) from shared memory.
    ///
    /// # Safety
    /// As [`wgmma_m64n64k16_bf16`].
    wgmma_m64n256k32_ss_e4m3,
    desc_a: u64,
    "{desc_a}",
    [desc_a = in(reg64) desc_a,]
);
