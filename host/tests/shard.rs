//! The shard rule of decode context parallelism, CPU only: `Shard`'s local counts, local
//! lengths, causal limits and schedule blocks against a token-by-token restatement, over
//! random shards and lengths; and the validator's shard checks (fields, global lengths
//! whose share overflows the rank's page table, page ids of the share only).

use mla_abi::{D_QK, D_V, ElemType, MAX_MERGE_RANKS, Shard};
use mla_dev::rng::SplitMix64;
use mla_host::MlaError;
use mla_host::request::*;
use mla_host::tensor::TensorView;
use mla_host::validate::*;

fn shard(rank: u32, ranks: u32, interleave: u32) -> Shard {
    Shard {
        rank,
        ranks,
        interleave,
        _pad: 0,
    }
}

/// The rank that holds global token `t`.
fn owner(s: &Shard, t: u32) -> u32 {
    (t / s.interleave) % s.ranks
}

#[test]
fn shard_counts_match_the_token_rule() {
    let mut rng = SplitMix64::new(SplitMix64::fresh_seed());
    for _ in 0..400 {
        let ranks = rng.range(2, 9) as u32;
        let interleave = [1, 2, 7, 16, 64, 1000][rng.range(0, 5)];
        let s_q = rng.range(1, 9) as u32;
        let len = rng.range(0, 5000) as u32;
        // Every token lives on exactly one rank, and the local counts add up.
        let total: u32 = (0..ranks)
            .map(|r| shard(r, ranks, interleave).local_count(len))
            .sum();
        assert_eq!(
            total, len,
            "ranks {ranks} interleave {interleave} len {len}"
        );
        for r in 0..ranks {
            let s = shard(r, ranks, interleave);
            let mine: Vec<u32> = (0..len).filter(|&t| owner(&s, t) == r).collect();
            assert_eq!(s.local_count(len) as usize, mine.len());
            assert_eq!(s.local_len(len as i32), mine.len() as i32);
            // Local position j holds the j-th of the rank's tokens in global order.
            for (j, &t) in mine.iter().enumerate() {
                let run = t / (interleave * ranks);
                assert_eq!(run * interleave + t % interleave, j as u32);
            }
            // Query token q sees global keys < len - s_q + q + 1: a prefix of the local ones.
            for q in 0..s_q {
                let end = (len + q + 1).saturating_sub(s_q);
                let want = mine.iter().filter(|&&t| t < end).count() as u32;
                assert_eq!(s.visible(len, mine.len() as u32, q, s_q), want);
            }
            // A live sequence always gets a block on every rank (its rows are written).
            let blocks = s.schedule_blocks(len as i32, u32::MAX);
            let want = (mine.len() as u64).div_ceil(64).max(u64::from(len > 0));
            assert_eq!(blocks, want);
        }
    }
    // Padding stays padding; off is the identity.
    let s = shard(1, 4, 16);
    assert_eq!(s.local_len(0), 0);
    assert_eq!(s.local_len(-3), -3);
    assert_eq!(s.schedule_blocks(-3, 100), 0);
    assert_eq!(Shard::OFF.local_count(12345), 12345);
    assert_eq!(Shard::default().local_count(77), 77);
    assert_eq!(Shard::OFF.schedule_blocks(65, 1000), 2);
}

#[test]
fn shard_fields_are_checked() {
    assert!(shard_fields(&Shard::OFF).is_ok());
    assert!(shard_fields(&Shard::default()).is_ok());
    assert!(shard_fields(&shard(63, MAX_MERGE_RANKS, 1)).is_ok());
    for (s, field) in [
        (shard(2, 2, 1), "shard.rank"),
        (shard(0, MAX_MERGE_RANKS + 1, 1), "shard.ranks"),
        (shard(0, 3, 0), "shard.interleave"),
    ] {
        match shard_fields(&s) {
            Err(MlaError::InvalidShape { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{s:?}: {other:?}"),
        }
    }
}

#[test]
fn sharded_requests_check_the_share() {
    const GIB: u64 = 1 << 30;
    let region = |i: u64| 0x1000_0000 + i * GIB;
    let (b, s_q, h, p, pages, max_pages) = (2usize, 2usize, 16usize, 16usize, 8usize, 2usize);
    // Global lengths 100 and 40 over 4 ranks in whole pages: rank 0 holds tokens 0-15
    // and 64-79 of the first (32 tokens, two pages) and 0-15 of the second (one page).
    let lens = [100i32, 40];
    let table = [3i32, 5, 1, -1];
    let req = |lens: &'static [i32], table: &'static [i32]| DecodeRequest {
        q: TensorView::contiguous(region(0), ElemType::Bf16, [b, s_q, h, D_QK]),
        kv_cache: TensorView::contiguous(region(1), ElemType::Bf16, [pages, p, D_QK]),
        page_table: TensorView::contiguous(region(2), ElemType::I32, [b, max_pages]),
        seq_lens: TensorView::contiguous(region(3), ElemType::I32, [b]),
        out: TensorView::contiguous(region(4), ElemType::Bf16, [b, s_q, h, D_V]),
        lse: TensorView::contiguous(region(5), ElemType::F32, [b, s_q, h]),
        scales: Scales::default_for_mla(),
        host: HostMirror {
            seq_lens: Some(lens),
            page_table: Some(table),
        },
    };
    let leak = |v: Vec<i32>| -> &'static [i32] { Box::leak(v.into_boxed_slice()) };
    let s0 = shard(0, 4, 16);
    // Global lengths beyond this table's 32 tokens pass: the share is what is checked.
    assert!(validate_decode_shard(&req(leak(lens.to_vec()), leak(table.to_vec())), &s0).is_ok());
    // Unsharded, the same request overflows the table.
    assert!(validate_decode(&req(leak(lens.to_vec()), leak(table.to_vec()))).is_err());
    // A length whose share needs a third page.
    match validate_decode_shard(&req(leak(vec![140, 40]), leak(table.to_vec())), &s0) {
        Err(MlaError::OutOfRange {
            field, index, got, ..
        }) => {
            assert_eq!((field, index, got), ("seq_lens", 0, 140));
        }
        other => panic!("{other:?}"),
    }
    // The second sequence's unused entry may hold anything; its used one must be valid.
    match validate_decode_shard(&req(leak(lens.to_vec()), leak(vec![3, 5, 99, -1])), &s0) {
        Err(MlaError::OutOfRange { field, index, .. }) => {
            assert_eq!((field, index), ("page_table", 2))
        }
        other => panic!("{other:?}"),
    }
    // Global lengths below s_q (short sequences) and <= 0 (padding) are valid, as for
    // unsharded requests.
    for lens in [vec![1, 40], vec![0, 40], vec![-3, 40]] {
        validate_decode_shard(&req(leak(lens), leak(table.to_vec())), &s0).unwrap();
    }
}
