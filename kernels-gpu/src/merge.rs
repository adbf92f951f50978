//! Rank merge, for context-parallel decode: `R` ranks each decoded the same query rows over
//! their own share of the KV; their results `(out_r, lse_r)` (`out_r` 16-bit, normalised
//! over that rank's keys, `lse_r` natural log) merge exactly by
//! `lse = ln(sum_r exp(lse_r))`, `out = sum_r exp(lse_r - lse) * out_r`.
//!
//! - Grid: `ceil(rows / ROWS_NARROW)` CTAs of `combine_tile::ROWS_NARROW` rows,
//!   `combine_tile::THREADS` (128) threads per row; thread `t` owns dims `4t .. 4t + 4`.
//! - Each warp loads every rank's `lse` of its row at once (lane `j`: ranks `j`, `j + 32`)
//!   and reduces them with the split-KV combine's `warp_lse_weights`.
//! - With `seq_lens` (the context-parallel decode), the rows of a sequence of length `<= 0`
//!   are skipped: no rank wrote them, and the caller's `out` and `lse` keep what they held.
//! - A rank with `lse_r = -inf` (no key of the row in its share) weighs exactly 0 and its
//!   `out_r` is never read, whatever it holds; a row no rank saw gets `out = 0` and
//!   `lse = -inf`, never NaN; a rank whose `lse_r` is NaN (or `+inf`) makes the row NaN.

use crate::arch::{self, sync};
use crate::combine::{merged_norm, warp_lse_weights};
use crate::elem::Half16;
use mla_abi::{D_V, MAX_MERGE_RANKS, MergeParams, combine_tile};

/// # Safety
/// Launched with the grid and block above on params that the host validated.
#[inline(always)]
pub unsafe fn merge<O: Half16>(p: MergeParams) {
    let per_cta = combine_tile::ROWS_NARROW;
    let row = arch::block_idx_x() * per_cta + arch::thread_idx_x() / combine_tile::THREADS as u32;
    if row >= p.rows {
        return;
    }
    // A padding sequence's rows keep what they held (a row's warps leave together: no CTA
    // barrier below).
    // SAFETY: row / rows_per_seq < rows / rows_per_seq entries of a non-null seq_lens.
    if !p.seq_lens.is_null()
        && unsafe { *p.seq_lens.ptr().add((row / p.rows_per_seq) as usize) } <= 0
    {
        return;
    }
    const _: () = assert!(MAX_MERGE_RANKS <= 64);
    let ranks = p.ranks.min(MAX_MERGE_RANKS);
    let lane = arch::thread_idx_x() % 32;
    // SAFETY (the loads below): r < ranks and row < rows index what the host validated.
    let lse_at = |r: u32| {
        if r < ranks {
            unsafe {
                *p.lses
                    .ptr()
                    .add(r as usize * p.lse_rank_stride as usize + row as usize)
            }
        } else {
            f32::NEG_INFINITY
        }
    };
    // SAFETY: every lane of the warp runs it (row is warp-uniform).
    let (m, w, sum) = unsafe { warp_lse_weights([lse_at(lane), lse_at(lane + 32)]) };
    let t = (arch::thread_idx_x() % combine_tile::THREADS as u32) as usize;
    let dim0 = t * combine_tile::DIMS_PER_THREAD;
    let mut acc = [0.0f32; combine_tile::DIMS_PER_THREAD];
    for r in 0..ranks {
        let src_w = if r < 32 { w[0] } else { w[1] };
        // SAFETY: a warp-uniform source lane.
        let wr = unsafe { sync::shfl_idx_f32(src_w, r % 32) };
        if wr != 0.0 {
            let src = r as usize * p.out_rank_stride as usize + row as usize * D_V + dim0;
            // SAFETY: 8-byte aligned (host: base and rank stride; dim0 a multiple of 4), in
            // bounds (validated shapes).
            let v = unsafe { *((p.outs.ptr() as *const u16).add(src) as *const [u32; 2]) };
            let vals = [
                v[0] as u16,
                (v[0] >> 16) as u16,
                v[1] as u16,
                (v[1] >> 16) as u16,
            ];
            for d in 0..combine_tile::DIMS_PER_THREAD {
                acc[d] += wr * O::to_f32(vals[d]);
            }
        }
    }
    let (scale, lse) = merged_norm(m, sum, 1.0);
    let packed = [
        O::pack2(acc[0] * scale, acc[1] * scale),
        O::pack2(acc[2] * scale, acc[3] * scale),
    ];
    // SAFETY: the row's four dims of `out` (`[rows, D_V]`, 8-byte aligned: host).
    unsafe {
        let o = (p.out.ptr() as *mut u16).add(row as usize * D_V + dim0) as *mut [u32; 2];
        *o = packed;
        if t == 0 {
            *p.lse.ptr().add(row as usize) = lse;
        }
    }
}
