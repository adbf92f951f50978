//! `ldmatrix` (sm_75+): four 8x8 16-bit matrices from shared memory into mma fragments;
//! `stmatrix` (sm_90+), the store in the other direction.
//!
//! Lane `l` supplies the smem address of row `l % 8` of matrix `l / 8`. Without `.trans`,
//! register `j` of lane `l` holds row `l / 4`, columns `2 * (l % 4)` and `+ 1` of matrix `j`;
//! with `.trans` it holds rows `2 * (l % 4)` and `+ 1`, column `l / 4`.

use core::arch::asm;

/// `ldmatrix.sync.aligned.m8n8.x4.shared.b16`.
///
/// # Safety
/// All lanes converged; each lane's `addr` is a 16-byte aligned smem address of 16 bytes.
#[inline(always)]
pub unsafe fn ldmatrix_x4(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees convergence and valid addresses.
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{a}, {b}, {c}, {d}}}, [{p}];",
            p = in(reg32) addr, a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
            options(nostack, readonly))
    }
    [a, b, c, d]
}

/// `ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16`.
///
/// # Safety
/// As [`ldmatrix_x4`].
#[inline(always)]
pub unsafe fn ldmatrix_x4_trans(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees convergence and valid addresses.
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{a}, {b}, {c}, {d}}}, [{p}];",
            p = in(reg32) addr, a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
            options(nostack, readonly))
    }
    [a, b, c, d]
}

/// `stmatrix.sync.aligned.m8n8.x4.shared.b16`: register `j` of lane `l` holds row `l / 4`,
/// columns `2 * (l % 4)` and `+ 1` of matrix `j` (an accumulator fragment's layout); lane `l`
/// supplies the address of matrix `l / 8`'s row `l % 8` (16 bytes).
///
/// # Safety
/// sm_90+; all lanes converged; each lane's `addr` is a 16-byte aligned smem address of 16
/// writable bytes.
#[inline(always)]
pub unsafe fn stmatrix_x4(addr: u32, v: [u32; 4]) {
    // SAFETY: the caller guarantees convergence and valid addresses.
    unsafe {
        asm!("stmatrix.sync.aligned.m8n8.x4.shared.b16 [{p}], {{{a}, {b}, {c}, {d}}};",
            p = in(reg32) addr, a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3],
            options(nostack))
    }
}

/// `stmatrix.sync.aligned.m8n8.x4.trans.shared.b16`: register `j` of lane `l` holds row
/// `l / 4`, columns `2 * (l % 4)` and `+ 1` of matrix `j`; lane `l` supplies the address of
/// matrix `l / 8`'s stored row `l % 8`, which receives that matrix's column `l % 8`
/// (rows 0-7 in order, 16 bytes).
///
/// # Safety
/// sm_90+; all lanes converged; each lane's `addr` is a 16-byte aligned smem address of 16
/// writable bytes.
#[inline(always)]
pub unsafe fn stmatrix_x4_trans(addr: u32, v: [u32; 4]) {
    // SAFETY: the caller guarantees convergence and valid addresses.
    unsafe {
        asm!("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [{p}], {{{a}, {b}, {c}, {d}}};",
            p = in(reg32) addr, a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3],
            options(nostack))
    }
}
