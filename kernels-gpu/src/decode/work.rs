//! A decode CTA's work: its grid coordinates, the causal visibility of a row, the sequence
//! length, split count and blocks it takes (running the folded schedule where the params
//! ask for it), and the checked mode's page-table and length checks.

use super::BLOCK_N;
use crate::arch::{self, sync};
use mla_abi::{DecodeParams, chunk_blocks};

/// Causal visibility of query row `gr` (`t * heads + h`) over a KV length `len`: the keys
/// `0..visible` it attends to (query token `t` sits at position `len - s_q + t`). Rows past
/// the last take the last token's count (their outputs are never stored). Sharded
/// ([`mla_abi::Shard`]): `len` is the local length and `glen` the global one, and the keys
/// are this rank's first `visible` (local positions ascend with global ones).
#[inline(always)]
pub(crate) fn visible(p: &DecodeParams, len: u32, glen: u32, gr: u32) -> u32 {
    let t = if gr < p.s_q * p.heads {
        gr / p.heads
    } else {
        p.s_q - 1
    };
    if p.shard.is_on() {
        p.shard.visible(glen, len, t, p.s_q)
    } else {
        (len + t + 1).saturating_sub(p.s_q)
    }
}

/// This CTA's `(row tile, sequence, split)` in a decode grid launched cell for cell (every
/// decode kernel but the persistent TMA one), and its work ([`cta_work`]), or `None` when
/// it has none. The grid is `(row tiles, batch, splits)`: split-major, so every split-0 CTA
/// (all of the work at large batch) launches before any CTA of a split a sequence may not
/// have.
///
/// # Safety
/// Every thread of the CTA, converged, first ([`fold_total`]).
#[inline(always)]
pub(crate) unsafe fn grid_cell_work(p: &DecodeParams) -> Option<(u32, u32, u32, CtaWork)> {
    let (tile, b, split) = (
        arch::block_idx_x(),
        arch::block_idx_y(),
        arch::block_idx_z(),
    );
    // SAFETY: forwarded from the caller.
    let fold = unsafe { fold_total(p) };
    cta_work(p, tile, split, b, fold).map(|w| (tile, b, split, w))
}

/// What CTA `(_, b, split)` of a decode grid (64- or 16-row tile, `mma.sync` or `wgmma`)
/// works on.
pub(crate) struct CtaWork {
    /// The sequence's KV length in this cache (this rank's share when sharded), cut to
    /// what its page table can address.
    pub len: u32,
    /// The global length (sharded: what the causal rule counts from; else `len`).
    pub glen: u32,
    /// Its split count, `1..=max_splits`.
    pub nsplit: u32,
    /// This split's 64-token blocks `kb0..kb1` ([`chunk_blocks`]).
    pub kb0: u32,
    pub kb1: u32,
}

/// The folded schedule's batch total ([`SchedFold`](mla_abi::SchedFold)), `None` when
/// the split counts are read from `num_splits`.
///
/// # Safety
/// All 32 lanes of the warp call it together (converged).
#[inline(always)]
pub(crate) unsafe fn fold_total(p: &DecodeParams) -> Option<u64> {
    if p.fold.tiles != 0 {
        // SAFETY: forwarded from the caller.
        Some(unsafe { warp_batch_blocks(p) })
    } else {
        None
    }
}

/// Sequence `b`'s raw length and raw split count (`<= 0`: skipped): computed by the folded
/// schedule from `batch_blocks` ([`fold_total`]), else read from `num_splits`.
///
/// # Safety
/// `b < batch`.
#[inline(always)]
pub(crate) unsafe fn split_count(
    p: &DecodeParams,
    b: u32,
    batch_blocks: Option<u64>,
) -> (i32, i32) {
    // SAFETY: b < batch entries of seq_lens and num_splits.
    let glen_raw = unsafe { *p.seq_lens.ptr().add(b as usize) };
    let nsplit_raw = match batch_blocks {
        Some(total) => mla_abi::schedule_splits(
            p.shard.schedule_blocks(glen_raw, p.fold.max_len),
            total * p.fold.tiles as u64,
            p.fold.target_ctas as u64,
            p.max_splits as u64,
            p.fold.tiles as u64,
            p.fold.step_log2,
        ) as i32,
        // SAFETY: as above.
        None => unsafe { *p.num_splits.ptr().add(b as usize) },
    };
    (glen_raw, nsplit_raw)
}

/// The splits that run of a sequence of raw length `glen_raw` whose raw split count
/// ([`split_count`]) is `nsplit_raw`: at most `max_splits`; none when the sequence is
/// padding (`glen_raw <= 0`: skipped, whatever a stale count says). A count of `<= 0` beside a
/// live length is one the schedule did not write for these lengths (a step slot whose
/// `schedule_step` was captured and not yet replayed holds zeros): the sequence then runs
/// in one split, which writes its rows directly (the combine leaves counts `<= 1` alone),
/// rather than leaving them unwritten.
#[inline(always)]
fn live_splits(p: &DecodeParams, glen_raw: i32, nsplit_raw: i32) -> u32 {
    if glen_raw <= 0 {
        // Padding: never computed or written, whatever a stale count says.
        0
    } else if nsplit_raw > 0 {
        (nsplit_raw as u32).min(p.max_splits)
    } else {
        1
    }
}

/// Whether cell `(tile, b, split)` of a decode grid has work for [`cta_work`] to do: a
/// split below its sequence's count, or (folded schedule) the cell of row tile 0, split 0
/// that writes the count.
///
/// # Safety
/// As [`split_count`]'s, for `b < batch`.
#[inline(always)]
pub(crate) unsafe fn cell_busy(
    p: &DecodeParams,
    tile: u32,
    b: u32,
    split: u32,
    batch_blocks: Option<u64>,
) -> bool {
    if b >= p.batch {
        return false;
    }
    if batch_blocks.is_some() && tile == 0 && split == 0 {
        return true;
    }
    // SAFETY: b < batch.
    let (glen_raw, nsplit_raw) = unsafe { split_count(p, b, batch_blocks) };
    split < live_splits(p, glen_raw, nsplit_raw)
}

/// The work of cell `(tile, b, split)` of a decode grid, or `None` when it has none: `b`
/// past the batch, a sequence the schedule skipped (0 splits: nothing is computed or
/// written), or a split past the sequence's count. `batch_blocks`: [`fold_total`].
#[inline(always)]
pub(crate) fn cta_work(
    p: &DecodeParams,
    tile: u32,
    split: u32,
    b: u32,
    batch_blocks: Option<u64>,
) -> Option<CtaWork> {
    if b >= p.batch {
        return None;
    }
    // SAFETY: b < batch.
    let (glen_raw, nsplit_raw) = unsafe { split_count(p, b, batch_blocks) };
    if batch_blocks.is_some() && split == 0 && tile == 0 && arch::thread_idx_x() == 0 {
        // SAFETY: b < batch entries; one writer per sequence, read by the combine after
        // this grid completes.
        unsafe { *p.num_splits.ptr().add(b as usize) = nsplit_raw };
    }
    let len_raw = p.shard.local_len(glen_raw);
    let nsplit = live_splits(p, glen_raw, nsplit_raw);
    if split >= nsplit {
        return None;
    }
    let len = mla_abi::clamp_len(len_raw, p.max_pages.saturating_mul(p.page_size));
    let (glen, blocks) = if p.shard.is_on() {
        // A rank with none of a live sequence's keys still runs one (empty) block, so
        // that its rows are written: zeros with LSE -inf, which the rank merge skips.
        (
            mla_abi::clamp_len(glen_raw, u32::MAX),
            len.div_ceil(BLOCK_N).max(1),
        )
    } else {
        (len, len.div_ceil(BLOCK_N))
    };
    let (kb0, kb1) = chunk_blocks(blocks, nsplit, split);
    if !p.fault.is_null() && tile == 0 {
        // SAFETY: b < batch; the tokens are this split's, below the clamped length.
        unsafe {
            check_faults(
                p,
                b,
                len_raw,
                split == 0,
                kb0 * BLOCK_N,
                (kb1 * BLOCK_N).min(len),
            )
        };
    }
    Some(CtaWork {
        len,
        glen,
        nsplit,
        kb0,
        kb1,
    })
}

/// The work list's price of a sequence of raw length `glen_raw`
/// ([`DecodeParams::list_fixed`]): its KV blocks and its cost (blocks plus the fixed
/// cost; 0 for padding, which the list skips).
#[inline(always)]
pub(crate) fn list_cost(p: &DecodeParams, glen_raw: i32) -> (u32, u32) {
    if glen_raw <= 0 {
        return (0, 0);
    }
    let blocks = seq_extent(p, glen_raw).3;
    (blocks, blocks + p.list_fixed)
}

/// This thread's share of the batch in the work list's sums: sequences `lo..hi` (a
/// contiguous run of `ceil(batch / threads)`), their summed cost and the most blocks of one.
///
/// # Safety
/// `p` as the decode's.
#[inline(always)]
pub(crate) unsafe fn list_sums(p: &DecodeParams, tid: u32, threads: u32) -> (u32, u32, u32, u32) {
    let k = p.batch.div_ceil(threads);
    let lo = (tid * k).min(p.batch);
    let hi = (lo + k).min(p.batch);
    let (mut sum, mut most) = (0u32, 0u32);
    let mut b = lo;
    while b < hi {
        // SAFETY: b < batch entries of seq_lens.
        let (blocks, cost) = list_cost(p, unsafe { *p.seq_lens.ptr().add(b as usize) });
        sum += cost;
        most = most.max(blocks);
        b += 1;
    }
    (lo, hi, sum, most)
}

/// The work list's part size ([`mla_abi::list_share`]) for this launch's workspace.
#[inline(always)]
pub(crate) fn list_share(p: &DecodeParams, total: u32, most: u32, parts: u32) -> u32 {
    mla_abi::list_share(total, most, parts, p.max_splits)
}

/// The first sequence at or after `lo` (up to `hi`) whose cost runs past position `ps`, with
/// the cost before it, starting from cost `c` at `lo`; `(hi, c)` when none does.
///
/// # Safety
/// `hi <= batch`.
#[inline(always)]
pub(crate) unsafe fn list_find(
    p: &DecodeParams,
    lo: u32,
    hi: u32,
    mut c: u32,
    ps: u32,
) -> (u32, u32) {
    let mut b = lo;
    while b < hi {
        // SAFETY: b < batch entries of seq_lens.
        let cost = list_cost(p, unsafe { *p.seq_lens.ptr().add(b as usize) }).1;
        if ps < c + cost {
            return (b, c);
        }
        c += cost;
        b += 1;
    }
    (hi, c)
}

/// The piece of part `part` (cost positions `ps..pe`, parts of `share`) in sequence `b`
/// (raw length `glen_raw`), whose cost starts at `c` ([`mla_abi::list_piece`]): its split
/// index and count and its blocks, or `None` when the part holds none of its blocks. Row
/// tile 0's piece of split 0 writes the sequence's split count for the combine.
///
/// # Safety
/// `b < batch`.
#[inline(always)]
pub(crate) unsafe fn list_piece(
    p: &DecodeParams,
    tile: u32,
    part: u32,
    b: u32,
    glen_raw: i32,
    c: u32,
    (share, ps, pe): (u32, u32, u32),
) -> Option<(u32, u32, u32, u32)> {
    let (blocks, _) = list_cost(p, glen_raw);
    if glen_raw <= 0 {
        return None;
    }
    let (kb0, kb1, split, nsplit) =
        mla_abi::list_piece(c, blocks, p.list_fixed, part, (share, ps, pe))?;
    if split == 0 && tile == 0 && arch::thread_idx_x() == 0 {
        // SAFETY: b < batch entries; one writer per sequence (its first piece, row tile
        // 0), read by the combine after this grid completes.
        unsafe { *p.num_splits.ptr().add(b as usize) = nsplit as i32 };
    }
    Some((split, nsplit, kb0, kb1))
}

/// The work list's piece of sequence `b` (raw length `glen_raw`, live) for row tile `tile`:
/// blocks `kb0..kb1` as split `split` of `nsplit`, after the checked mode's look at the
/// tokens it reads (row tile 0 only). [`cta_work`]'s rule for the lengths, kept apart so
/// that the cell kernels' code is not the list's.
#[inline(always)]
pub(crate) fn list_work(
    p: &DecodeParams,
    tile: u32,
    b: u32,
    glen_raw: i32,
    (split, nsplit): (u32, u32),
    (kb0, kb1): (u32, u32),
) -> CtaWork {
    let (len_raw, len, glen, _) = seq_extent(p, glen_raw);
    if !p.fault.is_null() && tile == 0 {
        // SAFETY: b < batch; the tokens are this piece's, below the clamped length.
        unsafe {
            check_faults(
                p,
                b,
                len_raw,
                split == 0,
                kb0 * BLOCK_N,
                (kb1 * BLOCK_N).min(len),
            )
        };
    }
    CtaWork {
        len,
        glen,
        nsplit,
        kb0,
        kb1,
    }
}

/// A sequence of raw global length `glen_raw` as [`cta_work`] reads it: its raw local
/// length, the KV length the decode works with (cut to what the page table addresses), the
/// global length the causal rule counts from, and its 64-token blocks.
#[inline(always)]
fn seq_extent(p: &DecodeParams, glen_raw: i32) -> (i32, u32, u32, u32) {
    let len_raw = p.shard.local_len(glen_raw);
    let len = mla_abi::clamp_len(len_raw, p.max_pages.saturating_mul(p.page_size));
    if p.shard.is_on() {
        // As in cta_work: a rank with none of a live sequence's keys runs one empty block.
        (
            len_raw,
            len,
            mla_abi::clamp_len(glen_raw, u32::MAX),
            len.div_ceil(BLOCK_N).max(1),
        )
    } else {
        (len_raw, len, len, len.div_ceil(BLOCK_N))
    }
}

/// Checked mode (`p.fault` non-null): the CTA's threads look at the page-table entries of
/// sequence `b`'s tokens `t0..t1` (the ones this CTA's decode reads) and, with
/// `check_len`, at its length; the first fault the grid meets claims the record.
///
/// # Safety
/// `p.fault` is the workspace's record, `b < batch`, and `t1 <= max_pages * page_size`.
#[inline(always)]
pub(crate) unsafe fn check_faults(
    p: &DecodeParams,
    b: u32,
    len_raw: i32,
    check_len: bool,
    t0: u32,
    t1: u32,
) {
    let tid = arch::thread_idx_x();
    if check_len
        && tid == 0
        && len_raw > 0
        && len_raw as u32 > p.max_pages.saturating_mul(p.page_size)
    {
        // SAFETY: forwarded from the caller.
        unsafe { record_fault(p, mla_abi::fault::SEQ_LEN, b, -1, len_raw) };
    }
    if t0 >= t1 {
        return;
    }
    let mut col = (t0 >> p.page_shift) + tid;
    let end = ((t1 - 1) >> p.page_shift) + 1;
    while col < end {
        let slot = b as usize * p.page_table_stride as usize + col as usize;
        // SAFETY: col < max_pages columns of row b (t1 <= max_pages * page_size).
        let entry = unsafe { *p.page_table.ptr().add(slot) };
        if entry < 0 || entry as u32 >= p.num_pages {
            // SAFETY: forwarded from the caller.
            unsafe { record_fault(p, mla_abi::fault::PAGE_ID, b, col as i32, entry) };
        }
        col += arch::block_dim_x();
    }
}

/// Claims the fault record for this fault if no fault holds it yet.
///
/// # Safety
/// `p.fault` is the workspace's record (`mla_abi::fault::WORDS` i32).
#[inline(always)]
unsafe fn record_fault(p: &DecodeParams, kind: i32, b: u32, column: i32, value: i32) {
    use mla_abi::fault;
    let rec = p.fault.ptr();
    // SAFETY: forwarded from the caller; the claiming thread alone writes the other words,
    // read by the host after the grid completes.
    unsafe {
        if arch::atomic_cas_global_i32(rec.add(fault::KIND), fault::NONE, kind) == fault::NONE {
            *rec.add(fault::SEQUENCE) = b as i32;
            *rec.add(fault::COLUMN) = column;
            *rec.add(fault::VALUE) = value;
        }
    }
}

// The fold's 32-bit sum holds SCHED_FOLD_MAX_BATCH sequences of up to 2^25 blocks each.
const _: () = assert!((mla_abi::SCHED_FOLD_MAX_BATCH as u64) << 25 <= u32::MAX as u64);

/// The batch's KV blocks (the folded schedule's total before the row tiles), summed by
/// each warp over all of `seq_lens`: every lane returns the total.
///
/// # Safety
/// All 32 lanes of the warp call it together.
#[inline(always)]
unsafe fn warp_batch_blocks(p: &DecodeParams) -> u64 {
    let lane = arch::thread_idx_x() % 32;
    // 32-bit sums: the fold runs for at most SCHED_FOLD_MAX_BATCH (8) sequences of at
    // most 2^25 blocks each, and a total known to fit one register keeps the e4m3 TMA
    // decodes (255 registers) from spilling half of it.
    let mut sum = 0u32;
    let mut i = lane;
    while i < p.batch {
        // SAFETY: i < batch entries of seq_lens.
        sum += p
            .shard
            .schedule_blocks(unsafe { *p.seq_lens.ptr().add(i as usize) }, p.fold.max_len)
            as u32;
        i += 32;
    }
    // SAFETY: forwarded from the caller.
    unsafe { sync::warp_sum_u32(sum) as u64 }
}
