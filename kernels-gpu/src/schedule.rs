//! On-device split-KV schedule: the split count of every sequence from the device-resident
//! `seq_lens`, so that one captured CUDA graph stays right while lengths change.
//!
//! - Grid: `(1)`. Block: `schedule_tile::THREADS` (1024); thread `t` owns sequences
//!   `t, t + 1024, ...`.
//! - Shared memory: 32 x u64 of the dynamic buffer (the per-warp partial sums).
//! - Reads [`ScheduleParams`]: `seq_lens`; writes `num_splits`. The rule is
//!   [`mla_abi::schedule_splits`], shared with the host twin `plan::schedule`, so the two
//!   agree bit for bit.

use crate::arch::{self, smem, sync};
use mla_abi::{ScheduleParams, schedule_splits, schedule_tile};

#[inline(always)]
fn blocks_of(p: &ScheduleParams, b: u32) -> u64 {
    // SAFETY: b < batch entries of seq_lens (the caller's loop bound).
    let len = unsafe { *p.seq_lens.ptr().add(b as usize) };
    p.shard.schedule_blocks(len, p.max_len)
}

/// # Safety
/// Launched with one CTA of `schedule_tile::THREADS` threads and at least 256 bytes of
/// dynamic shared memory, on params the host validated.
#[inline(always)]
pub unsafe fn schedule(p: ScheduleParams) {
    let tid = arch::thread_idx_x();
    let lane = tid % 32;
    let warp = tid / 32;
    let threads = schedule_tile::THREADS as u32;

    let mut sum = 0u64;
    let mut b = tid;
    while b < p.batch {
        sum += blocks_of(&p, b);
        b += threads;
    }
    // SAFETY: all 32 lanes of every warp run these shuffles; the barriers are reached by
    // every thread; smem slots 0..32 (u64) are inside the dynamic buffer.
    let total = unsafe {
        sum = sync::warp_sum_u64(sum);
        let base = smem::smem_base();
        if lane == 0 {
            smem::st_shared_u64(base + warp * 8, sum);
        }
        sync::bar_sync();
        let mut t = 0u64;
        for w in 0..schedule_tile::WARPS as u32 {
            t += smem::ld_shared_u64(base + w * 8);
        }
        t
    };
    let total = total * p.tiles.max(1) as u64;
    let mut b = tid;
    while b < p.batch {
        let s = schedule_splits(
            blocks_of(&p, b),
            total,
            p.target_ctas as u64,
            p.max_splits as u64,
            p.tiles.max(1) as u64,
            p.step_log2,
        );
        // SAFETY: b < batch entries of num_splits.
        unsafe { *p.num_splits.ptr().add(b as usize) = s as i32 };
        b += threads;
    }
}
