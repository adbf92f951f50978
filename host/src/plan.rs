//! Pure planning functions: chunking, split counts and workspace sizes. No CUDA types, so
//! everything here is tested on the CPU. The chunk rule itself is
//! [`mla_abi::chunk_blocks`], which the decode kernel calls too.

use mla_abi::{D_V, MAX_SPLITS, decode_tile};

/// KV tokens per decode pipeline step (chunks are whole blocks).
pub const BLOCK_N: usize = decode_tile::BLOCK_N;

/// Token range of chunk `i` of `splits` for a sequence of `len` tokens
/// ([`mla_abi::chunk_blocks`] in tokens, clipped to `len`). Later chunks may be empty.
pub fn chunk_range(len: usize, splits: usize, i: usize) -> std::ops::Range<usize> {
    let blocks = len.div_ceil(BLOCK_N) as u32;
    let (first, end) = mla_abi::chunk_blocks(
        blocks,
        splits.min(u32::MAX as usize) as u32,
        i.min(u32::MAX as usize) as u32,
    );
    (first as usize * BLOCK_N).min(len)..(end as usize * BLOCK_N).min(len)
}

/// CTAs per (sequence, split) with the default 64-row tile (`tactic::Tile::row_tiles` for
/// any tile).
pub fn row_tiles(rows: usize) -> usize {
    rows.div_ceil(decode_tile::BLOCK_M)
}

/// The on-device schedule's inputs (the fields of `ScheduleParams` that are not pointers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduleConfig {
    /// Row tiles per sequence ([`row_tiles`]).
    pub tiles: usize,
    /// CTAs to aim at: waves x SMs.
    pub target_ctas: usize,
    /// Upper bound of any split count.
    pub max_splits: usize,
    /// Lengths are clamped to `0..=max_len` (`max_pages * page_size`).
    pub max_len: usize,
    /// log2 of the KV blocks the decode computes per step (`tactic::Tile::step_log2`).
    pub step_log2: u32,
}

/// How many times its even share of the CTA target one sequence may take in a planned
/// decode (see [`split_cap`]).
pub const SPLIT_HEADROOM: usize = 4;

/// The largest split count a plan for `max_batch` sequences allows:
/// `ceil(SPLIT_HEADROOM * target_ctas / (tiles * max_batch))`, within `1..=MAX_SPLITS`.
///
/// Why: a plan's decode grid is fixed (CUDA-graph safe) at this many CTAs per (sequence,
/// row tile), and every CTA past its sequence's split count exits at once; but each such
/// CTA still holds a whole SM (the decode's shared memory) while it starts and reads the
/// split count. Sized by the worst case (`target_ctas / tiles`, up to 64) a 128-sequence
/// plan launched 8064 empty CTAs, measured on the H200 as 21-56 us per step at B = 64-128
/// (docs/PERF.md). The cap keeps full split freedom for small batches (up to `MAX_SPLITS`
/// while `max_batch <= SPLIT_HEADROOM * target / (MAX_SPLITS * tiles)`)
/// and still lets a sequence take 4x its even share in a large bucket that is a quarter
/// full.
pub fn split_cap(target_ctas: usize, tiles: usize, max_batch: usize) -> usize {
    (SPLIT_HEADROOM * target_ctas)
        .div_ceil(tiles.max(1) * max_batch.max(1))
        .clamp(1, MAX_SPLITS as usize)
}

/// The plan's split cap when [`balanced_target`] raised its target from `base` to `target`:
/// [`split_cap`] of the base target (headroom for uneven batches), or the uniform batch's
/// raised split count where that is more. Not `split_cap(target)`: four times the raised
/// count would size the grid and the partials' workspace for splits that no batch of the
/// plan gets from the raise (B=100 H=128 L=131072: 52 splits' partials instead of 13).
pub fn balanced_split_cap(base: usize, target: usize, tiles: usize, max_batch: usize) -> usize {
    split_cap(base, tiles, max_batch)
        .max(target / (tiles.max(1) * max_batch.max(1)))
        .clamp(1, MAX_SPLITS as usize)
}

/// Fixed cost of one decode cell (prologue, pipeline fill, epilogue) in KV blocks' time, and
/// the combine's cost once a sequence splits, for [`balanced_target`]'s model. About 7 us and
/// 3-4 us against 1.8-2.0 us per block at H=128 on the H200 (docs/PERF.md 3.5).
const CELL_FIXED_BLOCKS: usize = 4;
const COMBINE_BLOCKS: usize = 2;
/// [`balanced_target`] raises no plan past this many split cells (row tiles x sequences x
/// splits): 1 GiB of f32 partials in 64-row tiles. Past it the model only chases the last
/// round's rounding with partials for every split of the whole bucket: without it a long
/// hint over a large bucket would size them at 16.5 GiB (H=64 S_q=7 `max_batch`=151,
/// 2^31-2 tokens).
const RAISE_MAX_SPLIT_CELLS: usize = 8192;

/// The schedule's CTA target for a plan on `sm_count` SMs: `base` (waves x SMs), or
/// `s * tiles * max_batch` where a batch of `max_batch` sequences of `max_len` tokens would
/// finish at least 10% sooner cut into `s` splits each. The on-device rule gives a uniform
/// batch `floor(target / (tiles * batch))` splits; the persistent decode runs its cells in
/// rounds of `sm_count`, so `tiles * batch` just past a multiple of the SMs (H=128 S_q=3 at
/// B=32: 192 cells on 132 SMs) leaves most SMs idle in the last round, as does an even share
/// that does not divide the SMs (B=8: 48 cells, 2 splits each). Model: a split count `s`
/// costs `ceil(cells * s / sm_count)` rounds of `CELL_FIXED_BLOCKS + ceil(blocks / s)`
/// blocks, plus `COMBINE_BLOCKS` once `s > 1`. Plans of one row tile keep `base`: their
/// 16- and 32-row decodes run several CTAs per SM, or are memory-bound, and the model does
/// not hold for them. So do plans whose hint is "unknown" (`max_len >= i32::MAX`, the
/// clamp of `u32::MAX`): a raise priced for sequences of 2^31 tokens gives every batch of
/// real lengths that many splits per sequence, and sized the partials for 128 splits of
/// the whole bucket (16.5 GiB at H=64 S_q=8 `max_batch`=151). Any raise stops at
/// `RAISE_MAX_SPLIT_CELLS` split cells, which no plan of hints up to 163840 tokens reached
/// in a probe of tiles 2-16 and batches 1-512 (docs/PERF.md 3.30).
pub fn balanced_target(
    base: usize,
    sm_count: usize,
    tiles: usize,
    max_batch: usize,
    max_len: usize,
) -> usize {
    if tiles < 2 || max_len >= i32::MAX as usize {
        return base;
    }
    let sms = sm_count.max(1);
    let cells = tiles.max(1) * max_batch.max(1);
    let blocks = max_len.div_ceil(BLOCK_N).max(1);
    let cost = |s: usize| {
        (cells * s).div_ceil(sms) * (CELL_FIXED_BLOCKS + blocks.div_ceil(s))
            + if s > 1 { COMBINE_BLOCKS } else { 0 }
    };
    let s0 = (base / cells).clamp(1, blocks);
    let most = blocks
        .min(MAX_SPLITS as usize)
        .min((RAISE_MAX_SPLIT_CELLS / cells).max(1));
    let best = (1..=most).min_by_key(|&s| (cost(s), s)).unwrap_or(s0);
    if 10 * cost(best) < 9 * cost(s0) {
        best * cells
    } else {
        base
    }
}

/// Plans of fewer cells (row tiles x sequences) keep their one-block splits: measured on
/// the H200 at H=128, two-block splits ran 0.90-1.00x the one-block splits' time from 8
/// cells and 0.94-1.13x in 2-4 cells (docs/PERF.md 3.29).
pub const TWO_BLOCK_MIN_CELLS: usize = 8;

/// `target` for a bf16 plan of the 64-row TMA decode whose even share would cut each of
/// `max_batch` sequences of `max_len` tokens into one-block splits (which run its
/// `cp.async` form, [`crate::tmap::tma_pays`]): lowered so that each split holds two
/// blocks and runs the TMA decode, in plans of at least [`TWO_BLOCK_MIN_CELLS`] cells.
/// Plans of one row tile keep `target`.
pub fn two_block_target(target: usize, tiles: usize, max_batch: usize, max_len: usize) -> usize {
    let blocks = max_len.div_ceil(BLOCK_N);
    let cells = tiles.max(1) * max_batch.max(1);
    if tiles < 2
        || blocks < 2
        || cells < TWO_BLOCK_MIN_CELLS
        || max_len >= i32::MAX as usize
        || target / cells < blocks
    {
        return target;
    }
    cells * (blocks / 2)
}

/// The workspace's split capacity for a plan whose grid has `grid_splits` splits: with
/// the work list on (`list_fixed > 0`) and a grid that splits at all, enough that a batch
/// of `max_batch` even sequences can take its share of every part (`max(1, sm_count /
/// tiles)` parts: `ceil(parts / max_batch) + 1` pieces a sequence), within `MAX_SPLITS`;
/// else `grid_splits`. A plan of one split keeps its workspace and walks the cells.
pub fn list_capacity(
    grid_splits: usize,
    list_fixed: u32,
    sm_count: usize,
    tiles: usize,
    max_batch: usize,
) -> usize {
    if list_fixed == 0 || grid_splits < 2 {
        return grid_splits;
    }
    let parts = (sm_count / tiles.max(1)).max(1);
    grid_splits.max((parts.div_ceil(max_batch.max(1)) + 1).min(MAX_SPLITS as usize))
}

/// One piece of the work list ([`mla_abi::DecodeParams::list_fixed`]): part `part` runs
/// blocks `kb0..kb1` of sequence `seq` as split `split` of its `nsplit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListPiece {
    pub part: u32,
    pub seq: u32,
    pub kb0: u32,
    pub kb1: u32,
    pub split: u32,
    pub nsplit: u32,
}

/// Host twin of the 64-row TMA decodes' work list: the pieces of `parts` parts, part by
/// part in order, for sequences of (global) lengths `seq_lens` whose caches address at
/// most `cap_tokens` tokens each (`max_pages * page_size`), this rank's share under
/// `shard`, each priced at its blocks plus `fixed` (`>= 1`), with partials for
/// `max_splits` splits. Bit for bit the decode's cut ([`mla_abi::list_share`],
/// [`mla_abi::list_piece`]); `None` where the batch's cost does not fit the decode's
/// 32-bit sums.
pub fn work_list(
    seq_lens: &[i32],
    cap_tokens: u32,
    shard: &mla_abi::Shard,
    fixed: u32,
    parts: u32,
    max_splits: u32,
) -> Option<Vec<ListPiece>> {
    let blocks: Vec<Option<u32>> = seq_lens
        .iter()
        .map(|&g| (g > 0).then(|| shard.schedule_blocks(g, cap_tokens) as u32))
        .collect();
    let cost = |b: &Option<u32>| b.map_or(0u64, |b| b as u64 + fixed as u64);
    let total = blocks.iter().map(cost).sum::<u64>();
    if total >= 1 << 31 {
        return None;
    }
    let total = total as u32;
    let most = blocks.iter().map(|b| b.unwrap_or(0)).max().unwrap_or(0);
    let share = mla_abi::list_share(total, most, parts, max_splits);
    let mut pieces = Vec::new();
    // The first sequence not wholly before the current part, and its cost position.
    let (mut first, mut c_first) = (0usize, 0u32);
    for part in 0..parts.max(1) {
        let ps = part.saturating_mul(share);
        if ps >= total {
            break;
        }
        let pe = ps.saturating_add(share).min(total);
        while first < blocks.len() && c_first + cost(&blocks[first]) as u32 <= ps {
            c_first += cost(&blocks[first]) as u32;
            first += 1;
        }
        let (mut b, mut c) = (first, c_first);
        while b < blocks.len() && c < pe {
            if let Some(nb) = blocks[b]
                && let Some((kb0, kb1, split, nsplit)) =
                    mla_abi::list_piece(c, nb, fixed, part, (share, ps, pe))
            {
                pieces.push(ListPiece {
                    part,
                    seq: b as u32,
                    kb0,
                    kb1,
                    split,
                    nsplit,
                });
            }
            c += cost(&blocks[b]) as u32;
            b += 1;
        }
    }
    Some(pieces)
}

/// The split counts a work-list launch writes: each live sequence's piece count, 0 for
/// padding (whose entries the decode leaves as they were).
pub fn list_counts(batch: usize, pieces: &[ListPiece]) -> Vec<i32> {
    let mut n = vec![0i32; batch];
    for p in pieces {
        if p.split == 0 {
            n[p.seq as usize] = p.nsplit as i32;
        }
    }
    n
}

/// Fixed costs of the launch model [`list_pays`] in KV blocks: a split piece's partial
/// write and the combine's pass once any sequence splits (a piece's prologue and epilogue
/// is the list's own fixed cost).
const LIST_SPLIT_BLOCKS: u64 = 3;
const LIST_COMBINE_BLOCKS: u64 = 2;
/// The launch model takes no parts under this many KV blocks: where a part is a few
/// blocks (one long sequence over every SM), the pieces' fixed costs are more than the
/// model's 4 blocks (B=1 L=16384 H=128 measured 5% slower than the cells on the H100).
const LIST_MIN_PART_BLOCKS: u32 = 16;
/// Where the e4m3 decodes' margin applies ([`list_margin_pct`]): sequences of at least
/// `LIST_E4M3_MIN_BLOCKS` KV blocks, and of `LIST_E4M3_LONG_BLOCKS` or more unless the
/// plan has at most `LIST_E4M3_MAX_SHORT_CELLS` cells of one split (two rounds on 132 SMs).
const LIST_E4M3_MIN_BLOCKS: u64 = 32;
const LIST_E4M3_LONG_BLOCKS: u64 = 128;
const LIST_E4M3_MAX_SHORT_CELLS: usize = 256;

/// Whether the work list beats the cell walk for `batch` even sequences of
/// `blocks` KV blocks, `tiles` row tiles, on `ctas` persistent CTAs: the busiest CTA's
/// blocks plus fixed costs (each piece or cell `fixed`, each split one
/// `LIST_SPLIT_BLOCKS` more, the combine `LIST_COMBINE_BLOCKS`), the cells with the
/// split count `cfg`'s schedule gives such a batch (capped at `grid_splits`), the list
/// with [`work_list`]'s cut into `max(1, ctas / tiles)` parts and partials for
/// `max_splits` splits. Measured on the H100 (docs/PERF.md): the list wins where the
/// cells' rounds leave SMs idle or cut each sequence into several short cells (H=128
/// S_q=3), and loses where it splits sequences that whole cells balance (large batches).
/// The list takes the launch where its cost is under [`list_margin_pct`] percent of the
/// cells'; `e4m3_map`: the cells would run an e4m3 decode's tensor-map form.
pub fn list_pays(
    cfg: &ScheduleConfig,
    grid_splits: usize,
    (batch, blocks): (usize, usize),
    ctas: usize,
    fixed: u32,
    max_splits: usize,
    e4m3_map: bool,
) -> bool {
    if batch == 0 || fixed == 0 {
        return false;
    }
    let f = fixed as u64;
    let tiles = cfg.tiles.max(1);
    let nb = blocks as u64;
    let parts = (ctas / tiles).max(1) as u32;
    let total = (batch as u64 * (nb + f)).min(u32::MAX as u64) as u32;
    let most = nb.min(u32::MAX as u64) as u32;
    let max_splits = max_splits.min(u32::MAX as usize) as u32;
    if mla_abi::list_share(total, most, parts, max_splits) < LIST_MIN_PART_BLOCKS {
        return false;
    }
    let s = mla_abi::schedule_splits(
        nb,
        nb * batch as u64 * tiles as u64,
        cfg.target_ctas as u64,
        grid_splits.max(1) as u64,
        tiles as u64,
        cfg.step_log2,
    )
    .max(1) as u64;
    let cells = (tiles * batch) as u64 * s;
    let per_cta = cells.div_ceil(cells.min(ctas.max(1) as u64));
    let split = |n: u64| if n > 1 { LIST_SPLIT_BLOCKS } else { 0 };
    let cell_cost =
        per_cta * (nb.div_ceil(s) + f + split(s)) + if s > 1 { LIST_COMBINE_BLOCKS } else { 0 };
    let lens = vec![(blocks * BLOCK_N).min(i32::MAX as usize) as i32; batch];
    let Some(pieces) = work_list(
        &lens,
        u32::MAX,
        &mla_abi::Shard::OFF,
        fixed,
        parts,
        max_splits,
    ) else {
        return false;
    };
    let mut busiest = 0u64;
    let mut part_cost = 0u64;
    let mut part = 0u32;
    let mut any_split = false;
    for p in &pieces {
        if p.part != part {
            busiest = busiest.max(part_cost);
            part_cost = 0;
            part = p.part;
        }
        part_cost += (p.kb1 - p.kb0) as u64 + f + split(p.nsplit as u64);
        any_split |= p.nsplit > 1;
    }
    let list_cost = busiest.max(part_cost) + if any_split { LIST_COMBINE_BLOCKS } else { 0 };
    100 * list_cost < list_margin_pct(e4m3_map, tiles, batch, nb) * cell_cost
}

/// The share of the cells' modelled cost (percent) under which [`list_pays`] takes the
/// work list, by the decode's family, for `batch` sequences of `blocks` KV blocks over
/// `tiles` row tiles. The 64-row bf16 decode: 97. The model underprices cells that split
/// every sequence over three rounds (at H=128 S_q=3 B=32 L=16384 it puts the list 4%
/// ahead, and the list took 0.90x / 0.87x / 0.83x the cells' time: bf16 / fp8 cache / fp8
/// Q; docs/PERF.md 3.27), while where it calls the two level the bf16 list runs 1-7%
/// slower. The same 97 for the e4m3 decodes whose cells run their `cp.async` form
/// (`e4m3_map` false: fp8 caches on 16-token pages or strided; there the list, a map form,
/// was measured at S_q=3 only). Cells in the e4m3 tensor-map forms (`e4m3_map`): 105, for
/// two or more row tiles and sequences of `LIST_E4M3_MIN_BLOCKS` blocks, if they are
/// `LIST_E4M3_LONG_BLOCKS` long or the cells are at most `LIST_E4M3_MAX_SHORT_CELLS`. Where the model calls the two level or the
/// list up to 5% behind, their list ran 0.87-1.03x the cells' time from 8192 tokens and
/// 0.88-0.98x on shorter sequences in at most 256 cells (H=128 S_q 1-4, B 1-256, H100); it
/// ran up to 1.34x slower at 1024 tokens and below, 1.02-1.06x at L=4096 in 384-512 cells
/// (the cells balance there and the list only cuts), and from 5.9% behind in the model
/// 4-15% slower (docs/PERF.md 3.28). Plans of one row tile were not measured.
pub fn list_margin_pct(e4m3_map: bool, tiles: usize, batch: usize, blocks: u64) -> u64 {
    let fits =
        blocks >= LIST_E4M3_LONG_BLOCKS || tiles.saturating_mul(batch) <= LIST_E4M3_MAX_SHORT_CELLS;
    if e4m3_map && tiles >= 2 && blocks >= LIST_E4M3_MIN_BLOCKS && fits {
        105
    } else {
        97
    }
}

/// `MLA_SPLIT_TARGET=N` (read per plan, for A/Bs of the split rule): the schedule's CTA
/// target in place of [`balanced_target`]'s, within `1..=MAX_SPLITS * 1024`; unset or
/// unparsable, `None`.
pub fn target_from_env() -> Option<usize> {
    std::env::var("MLA_SPLIT_TARGET")
        .ok()?
        .parse::<usize>()
        .ok()
        .filter(|&n| (1..=MAX_SPLITS as usize * 1024).contains(&n))
}

impl ScheduleConfig {
    /// The most splits any sequence can get: the decode grid's split dimension. A
    /// sequence's share `blocks_b * target / (total * tiles)` never exceeds
    /// `target / tiles`, and its bound ([`mla_abi::split_bound`]) never exceeds that of the
    /// longest sequence the plan admits (`max_len`).
    pub fn grid_splits(&self) -> usize {
        let max_blocks = self.max_len.div_ceil(BLOCK_N) as u64;
        let bound = mla_abi::split_bound(
            max_blocks,
            self.tiles.max(1) as u64,
            self.max_splits.max(1) as u64,
        ) as usize;
        (self.target_ctas / self.tiles.max(1)).clamp(1, bound.max(1))
    }
}

/// Host twin of the `mla_schedule` kernel, bit for bit: sequence `b` gets
/// [`mla_abi::schedule_splits`] of its KV blocks.
pub fn schedule(seq_lens: &[i32], cfg: &ScheduleConfig) -> Vec<i32> {
    schedule_shard(seq_lens, cfg, &mla_abi::Shard::OFF)
}

/// [`schedule`] of one rank's share ([`mla_abi::Shard`]) of sequences whose global lengths
/// are `seq_lens`, as the schedule kernel computes it for a sharded plan.
pub fn schedule_shard(seq_lens: &[i32], cfg: &ScheduleConfig, shard: &mla_abi::Shard) -> Vec<i32> {
    let max_len = cfg.max_len.min(u32::MAX as usize) as u32;
    let blocks: Vec<u64> = seq_lens
        .iter()
        .map(|&l| shard.schedule_blocks(l, max_len))
        .collect();
    let total = blocks.iter().sum::<u64>() * cfg.tiles.max(1) as u64;
    blocks
        .iter()
        .map(|&nb| {
            mla_abi::schedule_splits(
                nb,
                total,
                cfg.target_ctas as u64,
                cfg.max_splits as u64,
                cfg.tiles.max(1) as u64,
                cfg.step_log2,
            ) as i32
        })
        .collect()
}

/// Split counts for about one wave of `sm_count` CTAs (one CTA per SM): [`schedule`] with
/// one wave and no length clamp. Deterministic; lengths `<= 0` get 0 splits (skipped).
pub fn split_counts(seq_lens: &[i32], rows: usize, sm_count: usize, max_splits: usize) -> Vec<i32> {
    let cfg = ScheduleConfig {
        tiles: row_tiles(rows).max(1),
        target_ctas: sm_count.max(1),
        max_splits: max_splits.clamp(1, MAX_SPLITS as usize),
        max_len: u32::MAX as usize,
        step_log2: 0,
    };
    schedule(seq_lens, &cfg)
}

/// What a decode workspace must hold: partials for `max_splits` chunks of every query row
/// of up to `batch` sequences with `rows = s_q * heads` rows each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkspaceCapacity {
    pub batch: usize,
    pub rows: usize,
    pub max_splits: usize,
}

impl WorkspaceCapacity {
    /// f32 elements of the partial outputs `[max_splits, batch, rows, D_V]`; none with one
    /// split per sequence (each decode CTA writes its rows to `out`; the kernels clamp a
    /// sequence's splits to `max_splits`, so no partial is written or read). A plan of
    /// 65535 sequences of 1024 rows needs no 128 GiB it would never touch.
    pub fn partial_o_len(&self) -> usize {
        self.partial_lse_len() * D_V
    }

    /// f32 elements of the partial LSE `[max_splits, batch, rows]`; none with one split.
    pub fn partial_lse_len(&self) -> usize {
        if self.max_splits <= 1 {
            0
        } else {
            self.max_splits * self.batch * self.rows
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balanced_target_bounds_the_partials() {
        // A long hint over a large bucket: the raise stops at the split-cell bound
        // (unbounded, H=64 S_q=7 at 151 sequences would take 128 splits, 16.5 GiB of
        // partials).
        for (tiles, batch, len) in [
            (7, 151, i32::MAX as usize - 1),
            (7, 151, 1 << 20),
            (8, 100, 1 << 24),
            (2, 151, 1 << 24),
            (14, 32, 1 << 30),
        ] {
            let target = balanced_target(132, 132, tiles, batch, len);
            let splits = (target / (tiles * batch)).max(1);
            assert!(
                target == 132 || splits * tiles * batch <= RAISE_MAX_SPLIT_CELLS,
                "{tiles} {batch} {len}: target {target}"
            );
        }
        assert_eq!(
            balanced_target(132, 132, 7, 151, i32::MAX as usize - 1),
            132
        );
        // Serving hints keep the measured raise: H=128 S_q=1 at 100 sequences of 128K
        // tokens, 13 splits; S_q=4 at 163840 tokens, 10.
        assert_eq!(balanced_target(132, 132, 2, 100, 131072), 2600);
        assert_eq!(balanced_target(132, 132, 8, 100, 163840), 8000);
    }

    #[test]
    fn balanced_target_fills_the_last_round() {
        // H=128 S_q=3 (6 row tiles) at B=32 L=4096 on 132 SMs: 192 one-split cells take two
        // rounds; two splits each (384 cells, three rounds of 32 blocks) finish sooner.
        assert_eq!(balanced_target(132, 132, 6, 32, 4096), 384);
        // B=8 L=16384: 48 cells of 2 splits use 96 SMs; 8 splits run three full rounds.
        assert_eq!(balanced_target(132, 132, 6, 8, 16384), 384);
        // Batches that already fill the rounds keep one wave.
        for (tiles, batch, len) in [
            (2, 64, 4096),
            (2, 64, 1024),
            (2, 128, 16384),
            (2, 8, 4096),
            (1, 64, 4096),
            (8, 8, 16384),
            (2, 1, 131072),
            (6, 64, 4096),
            (2, 100, 4096),
            (7, 151, i32::MAX as usize),
            (2, 1, usize::MAX),
        ] {
            assert_eq!(
                balanced_target(132, 132, tiles, batch, len),
                132,
                "{tiles} {batch} {len}"
            );
        }
        // Whatever it picks, a uniform batch gets the raised count under the plan's cap,
        // every count stays inside the grid bound (uneven batches too), and the cap is the
        // base plan's unless the raised count is more.
        for (tiles, batch, len) in [
            (6, 32, 4096),
            (6, 8, 16384),
            (6, 16, 16384),
            (2, 48, 16384),
            (4, 48, 4096),
            (2, 100, 131072),
            (3, 16, 65536),
            (1, 3, 100),
        ] {
            let target = balanced_target(132, 132, tiles, batch, len);
            let cap = balanced_split_cap(132, target, tiles, batch);
            assert_eq!(
                cap,
                split_cap(132, tiles, batch).max(target / (tiles * batch))
            );
            let cfg = ScheduleConfig {
                tiles,
                target_ctas: target,
                max_splits: cap,
                max_len: len,
                step_log2: 0,
            };
            let uniform = schedule(&vec![len as i32; batch], &cfg);
            let raised = (target / (tiles * batch)).clamp(1, len.div_ceil(BLOCK_N)) as i32;
            assert!(
                uniform
                    .iter()
                    .all(|&c| c == raised.min(cfg.grid_splits() as i32)),
                "{tiles} {batch} {len}: {uniform:?}"
            );
            let mut uneven = vec![len as i32; batch];
            uneven[0] = 1;
            let counts = schedule(&uneven, &cfg);
            assert!(
                counts
                    .iter()
                    .all(|&c| c >= 1 && c as usize <= cfg.grid_splits())
            );
        }
        // The cap of a plan the rule leaves alone is the base plan's.
        assert_eq!(balanced_split_cap(132, 132, 2, 64), split_cap(132, 2, 64));
    }

    #[test]
    fn one_split_plans_hold_no_partials() {
        // The largest plan the config allows with one split per sequence.
        let one = WorkspaceCapacity {
            batch: 65535,
            rows: 1024,
            max_splits: 1,
        };
        assert_eq!((one.partial_o_len(), one.partial_lse_len()), (0, 0));
        let two = WorkspaceCapacity {
            max_splits: 2,
            ..one
        };
        assert_eq!(two.partial_lse_len(), 2 * 65535 * 1024);
        assert_eq!(two.partial_o_len(), 2 * 65535 * 1024 * D_V);
    }

    #[test]
    fn chunks_tile_the_sequence() {
        for len in [1usize, 63, 64, 65, 1000, 4096, 131072] {
            for splits in [1usize, 2, 3, 7, 64] {
                let mut next = 0;
                for i in 0..splits {
                    let r = chunk_range(len, splits, i);
                    assert_eq!(
                        r.start,
                        next.min(len),
                        "len {len} splits {splits} chunk {i}"
                    );
                    assert!(r.start <= r.end);
                    if r.start < r.end {
                        assert_eq!(r.start % BLOCK_N, 0);
                    }
                    next = r.end;
                }
                assert_eq!(next, len, "len {len} splits {splits}");
            }
        }
    }

    #[test]
    fn split_counts_fill_the_machine_and_stay_in_range() {
        let s = split_counts(&[4096], 16, 132, 64);
        assert_eq!(s, vec![64]);
        let s = split_counts(&[4096; 128], 16, 132, 64);
        assert!(s.iter().all(|&x| x == 1), "{s:?}");
        let s = split_counts(&[1, 1, 131072, 1], 128, 132, 64);
        assert_eq!(s[0], 1);
        assert!(s[2] > 1 && s[2] <= 64);
        let s = split_counts(&[0, -5, 64], 1, 132, 64);
        assert_eq!(s, vec![0, 0, 1]);
    }

    /// A seeded SplitMix64 drawing uniform integers in `lo..=hi` (the draws of `mla-dev`'s
    /// `SplitMix64::range`).
    struct SplitMix64(u64);

    impl SplitMix64 {
        fn range(&mut self, lo: usize, hi: usize) -> usize {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            lo + ((z ^ (z >> 31)) % ((hi - lo) as u64 + 1)) as usize
        }
    }

    #[test]
    fn schedule_stays_under_its_grid_bound() {
        let mut rng = SplitMix64(7);
        for _ in 0..500 {
            let b = rng.range(1, 300);
            let lens: Vec<i32> = (0..b).map(|_| rng.range(0, 200_000) as i32 - 10).collect();
            let cfg = ScheduleConfig {
                tiles: rng.range(1, 16),
                target_ctas: rng.range(1, 528),
                max_splits: rng.range(1, MAX_SPLITS as usize),
                max_len: rng.range(1, 300_000),
                step_log2: rng.range(0, 2) as u32,
            };
            let s = schedule(&lens, &cfg);
            let bound = cfg.grid_splits() as i32;
            for (i, (&x, &l)) in s.iter().zip(&lens).enumerate() {
                let blocks = (l.max(0) as usize).min(cfg.max_len).div_ceil(BLOCK_N) as i32;
                let steps = (blocks as usize).div_ceil(1 << cfg.step_log2) as i32;
                if blocks == 0 {
                    assert_eq!(x, 0, "seq {i}: a sequence with no KV must be skipped");
                } else {
                    assert!(
                        x >= 1 && x <= bound && x <= steps,
                        "seq {i}: {x} (bound {bound}, blocks {blocks}) {cfg:?}"
                    );
                }
            }
            let ctas: usize = s.iter().map(|&x| x as usize).sum::<usize>() * cfg.tiles;
            // One wave at most, except the floor of one split per sequence.
            assert!(
                ctas <= cfg.target_ctas.max(b * cfg.tiles) + b * cfg.tiles,
                "{ctas} CTAs for {cfg:?}"
            );
        }
    }

    #[test]
    fn long_sequences_fill_the_machine_short_ones_keep_their_cap() {
        // One sequence on 132 SMs: the short caps (64 for one row tile, 32 for two), then
        // more splits once each keeps LONG_SPLIT_BLOCKS blocks.
        let one = |len: i32, tiles: usize| {
            let cfg = ScheduleConfig {
                tiles,
                target_ctas: 132,
                max_splits: MAX_SPLITS as usize,
                max_len: 1 << 20,
                step_log2: 0,
            };
            schedule(&[len], &cfg)[0]
        };
        assert_eq!(one(16384, 1), 64);
        assert_eq!(one(65536, 1), 128);
        assert_eq!(one(131072, 1), 128);
        assert_eq!(one(4096, 2), 32);
        assert_eq!(one(16384, 2), 32);
        assert_eq!(one(32768, 2), 64);
        assert_eq!(one(131072, 2), 66);
        // A cap below the short one still holds, and 1 turns splitting off.
        let cfg = ScheduleConfig {
            tiles: 2,
            target_ctas: 132,
            max_splits: 16,
            max_len: 1 << 20,
            step_log2: 0,
        };
        assert_eq!(schedule(&[131072], &cfg), vec![16]);
        let cfg = ScheduleConfig {
            max_splits: 1,
            ..cfg
        };
        assert_eq!(schedule(&[131072], &cfg), vec![1]);
        // The grid follows the longest sequence the plan admits.
        let grid = |max_len: usize, tiles: usize| {
            ScheduleConfig {
                tiles,
                target_ctas: 132,
                max_splits: MAX_SPLITS as usize,
                max_len,
                step_log2: 0,
            }
            .grid_splits()
        };
        assert_eq!(grid(4096, 2), 32);
        assert_eq!(grid(16384, 1), 64);
        assert_eq!(grid(131072, 2), 66);
        assert_eq!(grid(131072, 1), 128);
        // Decodes that compute blocks in pairs take splits of two blocks at least: 32 for
        // 64 blocks, 3 for 5; a long sequence is cut by its long bound as before.
        let paired = |len: i32| {
            let cfg = ScheduleConfig {
                tiles: 1,
                target_ctas: 132,
                max_splits: MAX_SPLITS as usize,
                max_len: 1 << 20,
                step_log2: 1,
            };
            schedule(&[len], &cfg)[0]
        };
        assert_eq!(paired(4096), 32);
        assert_eq!(paired(5 * 64), 3);
        assert_eq!(paired(64), 1);
        assert_eq!(paired(131072), 128);
    }

    #[test]
    fn split_cap_sizes_the_grid_by_the_batch() {
        // 132 SMs, one wave, 16-row tile (1 row tile) or 128 heads x 2 (4 row tiles).
        assert_eq!(split_cap(132, 1, 1), 128);
        assert_eq!(split_cap(132, 1, 8), 66);
        assert_eq!(split_cap(132, 1, 64), 9);
        assert_eq!(split_cap(132, 1, 128), 5);
        assert_eq!(split_cap(132, 4, 128), 2);
        assert_eq!(split_cap(132, 4, 65535), 1);
        assert_eq!(split_cap(0, 0, 0), 1);
        // Empty CTAs of a 128-sequence plan: (cap - 1) * B instead of 63 * B.
        let cfg = ScheduleConfig {
            tiles: 1,
            target_ctas: 132,
            max_splits: split_cap(132, 1, 128),
            max_len: 1 << 20,
            step_log2: 0,
        };
        assert_eq!(cfg.grid_splits(), 5);
        // Uniform lengths at a quarter-full bucket still get their even share.
        let s = schedule(&[4096; 32], &cfg);
        assert!(s.iter().all(|&x| x == 4), "{s:?}");
        // Within the cap the rule is unchanged: a full bucket gets one split each.
        let s = schedule(&[4096; 128], &cfg);
        assert!(s.iter().all(|&x| x == 1), "{s:?}");
    }

    #[test]
    fn work_list_covers_every_block_once_within_the_split_bound() {
        let mut rng = SplitMix64(11);
        for round in 0..400 {
            let b = rng.range(1, 200);
            let lens: Vec<i32> = (0..b)
                .map(|_| match rng.range(0, 9) {
                    0 => rng.range(0, 12) as i32 - 8,
                    1 => rng.range(1, 64) as i32,
                    2 => rng.range(50_000, 300_000) as i32,
                    _ => rng.range(1, 20_000) as i32,
                })
                .collect();
            let cap = [1usize << 20, 16_384, 4096][round % 3] as u32;
            let parts = [1, 2, 16, 22, 66, 132][rng.range(0, 5)];
            let max_splits = [1, 2, 3, 5, 33, 128][rng.range(0, 5)];
            let fixed = rng.range(1, 8) as u32;
            let shard = mla_abi::Shard::OFF;
            let pieces = work_list(&lens, cap, &shard, fixed, parts, max_splits).unwrap();
            let what =
                format!("round {round}: parts {parts} max_splits {max_splits} fixed {fixed}");
            // Parts in order, each part's sequences ascending, each part's blocks within
            // its share.
            let blocks = |l: i32| mla_abi::clamp_len(l, cap).div_ceil(BLOCK_N as u32);
            let total: u32 = lens
                .iter()
                .filter(|&&l| l > 0)
                .map(|&l| blocks(l) + fixed)
                .sum();
            let most = lens
                .iter()
                .map(|&l| if l > 0 { blocks(l) } else { 0 })
                .max()
                .unwrap_or(0);
            let share = mla_abi::list_share(total, most, parts, max_splits);
            for w in pieces.windows(2) {
                assert!(
                    (w[0].part, w[0].seq) < (w[1].part, w[1].seq),
                    "{what}: out of order {w:?}"
                );
            }
            for part in 0..parts {
                let n: u32 = pieces
                    .iter()
                    .filter(|p| p.part == part)
                    .map(|p| p.kb1 - p.kb0)
                    .sum();
                assert!(
                    n <= share,
                    "{what}: part {part} holds {n} blocks, share {share}"
                );
            }
            // Each live sequence's pieces tile its blocks, split 0 up, all with its count.
            for (i, &l) in lens.iter().enumerate() {
                let mine: Vec<&ListPiece> = pieces.iter().filter(|p| p.seq == i as u32).collect();
                if l <= 0 {
                    assert!(mine.is_empty(), "{what}: padding {i} has pieces {mine:?}");
                    continue;
                }
                let n = mine.len() as u32;
                assert!(
                    n >= 1 && n <= max_splits.max(1),
                    "{what}: seq {i} in {n} pieces"
                );
                let mut at = 0;
                for (k, p) in mine.iter().enumerate() {
                    assert_eq!(
                        (p.split, p.nsplit, p.kb0),
                        (k as u32, n, at),
                        "{what}: seq {i}"
                    );
                    assert!(
                        p.kb1 > p.kb0 || blocks(l) == 0,
                        "{what}: seq {i} empty piece"
                    );
                    at = p.kb1;
                }
                assert_eq!(at, blocks(l), "{what}: seq {i} covered to {at}");
            }
            let counts = list_counts(b, &pieces);
            for (i, &l) in lens.iter().enumerate() {
                assert_eq!(counts[i] > 0, l > 0, "{what}: count of seq {i}");
            }
        }
    }

    #[test]
    fn bf16_plans_keep_two_blocks_a_split() {
        // H=128 S_q=1 (two row tiles) on 132 SMs: one-block splits become two-block ones.
        assert_eq!(two_block_target(132, 2, 4, 1024), 64);
        assert_eq!(two_block_target(132, 2, 8, 512), 64);
        assert_eq!(two_block_target(132, 4, 2, 1024), 64);
        // Fewer than 8 cells keep their one-block splits.
        assert_eq!(two_block_target(132, 2, 1, 4096), 132);
        assert_eq!(two_block_target(132, 2, 2, 1024), 132);
        assert_eq!(two_block_target(132, 4, 1, 1024), 132);
        // Splits of two blocks or more, one row tile, one block: unchanged.
        assert_eq!(two_block_target(132, 2, 8, 1024), 132);
        assert_eq!(two_block_target(132, 1, 4, 1024), 132);
        assert_eq!(two_block_target(132, 2, 4, 64), 132);
        assert_eq!(two_block_target(132, 2, 1, usize::MAX), 132);
    }

    #[test]
    fn work_list_pays_where_cells_round_badly() {
        // H=128 (two row tiles a query token) on 132 SMs, the plan's schedule for a
        // batch of `b`; the measured wins and losses (docs/PERF.md).
        let pays_for = |e4m3_map: bool, b: usize, len: usize, s_q: usize| {
            let tiles = 2 * s_q;
            let target = balanced_target(132, 132, tiles, b, len);
            let cfg = ScheduleConfig {
                tiles,
                target_ctas: target,
                max_splits: balanced_split_cap(132, target, tiles, b),
                max_len: len,
                step_log2: 0,
            };
            let gs = cfg.grid_splits();
            let cap = list_capacity(gs, 4, 132, tiles, b);
            list_pays(&cfg, gs, (b, len / BLOCK_N), 132, 4, cap, e4m3_map)
        };
        let pays = |b, len, s_q| pays_for(false, b, len, s_q);
        assert!(pays(32, 4096, 3) && pays(8, 16384, 3) && pays(8, 4096, 3));
        // Cells that split every sequence over three rounds (the model: the list 4% ahead).
        assert!(pays(32, 16384, 3) && pays(16, 32768, 3));
        // One split a cell, two rounds: level in the model, kept on the cells.
        assert!(!pays(64, 16384, 3) && !pays(32, 16384, 4) && !pays(64, 16384, 2));
        assert!(!pays(128, 1024, 1) && !pays(64, 4096, 1) && !pays(64, 1024, 2));
        // One long sequence: parts of 4 blocks, below LIST_MIN_PART_BLOCKS.
        assert!(!pays(1, 16384, 1));
        // The e4m3 decodes take the list up to 5% behind in the model: long sequences
        // from B=8, S_q=2 B=8 L=4096, S_q=4 (all measured faster on the list); not where
        // it splits sequences that whole cells balance at L=4096 (measured slower).
        {
            let pays = |b, len, s_q| pays_for(true, b, len, s_q);
            assert!(pays(32, 4096, 3) && pays(32, 16384, 3));
            assert!(pays(16, 16384, 1) && pays(32, 16384, 1) && pays(64, 16384, 1));
            assert!(pays(8, 4096, 2) && pays(32, 16384, 2) && pays(64, 16384, 2));
            assert!(pays(8, 4096, 4) && pays(32, 4096, 4) && pays(64, 16384, 4));
            assert!(!pays(32, 4096, 1) && !pays(64, 4096, 1) && !pays(128, 4096, 1));
            assert!(!pays(32, 4096, 2) && !pays(64, 4096, 2) && !pays(1, 16384, 1));
            // Short sequences keep the bf16 margin (the list measured up to 1.34x slower).
            assert!(!pays(64, 1024, 1) && !pays(48, 1024, 2) && !pays(32, 1024, 3));
            assert!(pays(16, 2048, 4) && pays(32, 65536, 1) && pays(8, 65536, 2));
            // Short sequences in many cells stay on the cells (measured 2-5% slower).
            assert!(!pays(256, 4096, 1) && !pays(96, 4096, 2) && !pays(128, 4096, 2));
            assert!(pays(256, 8192, 1) && pays(128, 16384, 2) && pays(64, 8192, 4));
        }
    }
}
