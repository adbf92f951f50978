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

/// CTAs per (sequence, split): query rows are cut into tiles of `BLOCK_M`.
pub fn row_tiles(rows: usize) -> usize {
    rows.div_ceil(decode_tile::BLOCK_M)
}

/// Split counts per sequence so that at most about one wave of CTAs (`sm_count`, one CTA
/// per SM) covers the batch: sequence `b` gets `floor(blocks_b * sm_count / total_blocks)`
/// splits (total over all row tiles), clamped to `1..=min(max_splits, blocks_b)`. Never
/// rounds up into a second, mostly empty wave. Deterministic; lengths `<= 0` get 1 split.
pub fn split_counts(seq_lens: &[i32], rows: usize, sm_count: usize, max_splits: usize) -> Vec<i32> {
    let max_splits = max_splits.clamp(1, MAX_SPLITS as usize);
    let tiles = row_tiles(rows).max(1);
    let blocks: Vec<usize> = seq_lens
        .iter()
        .map(|&l| (l.max(0) as usize).div_ceil(BLOCK_N))
        .collect();
    let total: usize = blocks.iter().sum::<usize>() * tiles;
    blocks
        .iter()
        .map(|&nb| (nb * sm_count.max(1) / total.max(1)).clamp(1, max_splits.min(nb.max(1))) as i32)
        .collect()
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
    /// f32 elements of the partial outputs `[max_splits, batch, rows, D_V]`.
    pub fn partial_o_len(&self) -> usize {
        self.max_splits * self.batch * self.rows * D_V
    }

    /// f32 elements of the partial LSE `[max_splits, batch, rows]`.
    pub fn partial_lse_len(&self) -> usize {
        self.max_splits * self.batch * self.rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(s, vec![1, 1, 1]);
    }
}
