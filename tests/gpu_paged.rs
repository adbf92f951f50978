//! Paged-KV append and gather on the GPU, bit-exact against the host: appended rows land at
//! `L - S_q .. L - 1` (quantised with saturation for fp8), nothing else in the cache
//! changes; gathered rows equal the cache rows (dequantised on request), rows past each
//! length stay untouched.

mod common;

use mla::abi::{D_QK, ElemType};
use mla::{AppendRequest, DecodeDtypes, GatherRequest, HostMirror, TensorView};
use mla_dev::harness::{CaseSpec, HostCase};
use mla_dev::numeric;
use mla_dev::rng::SplitMix64;

const INDEX: ElemType = ElemType::I32;

use mla_dev::harness::device_addr as ptr;

/// The cache bytes an append of `n` new rows a sequence (`new_bytes`, `[batch, n, D_QK]` of
/// `src_t`) leaves: `h`'s bytes with rows `L - n .. L - 1` of each sequence of length
/// `L >= n` written (for an fp8 cache `x / kv_scale`, one IEEE division, then e4m3 rounded
/// to nearest even), nothing else changed.
fn appended(h: &HostCase, src_t: ElemType, new_bytes: &[u8], n: usize) -> Vec<u8> {
    let cache_t = h.spec.dtypes.kv();
    let page = h.spec.page_size;
    let mut want = h.kv_bytes.clone();
    let es = cache_t.size();
    let src_dec = numeric::to_f32(src_t, new_bytes);
    for (s, &len) in h.seq_lens.iter().enumerate() {
        let len = len.max(0) as usize;
        if len < n {
            continue;
        }
        for t in 0..n {
            let pos = len - n + t;
            let pg = h.page_table[s * h.max_pages + pos / page] as usize;
            let row = (pg * page + pos % page) * D_QK;
            let vals = &src_dec[(s * n + t) * D_QK..][..D_QK];
            let enc: Vec<u8> = if cache_t == ElemType::Fp8E4m3 {
                vals.iter()
                    .map(|v| numeric::e4m3_from_f32(v / h.scales.kv_scale))
                    .collect()
            } else {
                numeric::from_f32(cache_t, vals)
            };
            want[row * es..(row + D_QK) * es].copy_from_slice(&enc);
        }
    }
    want
}

/// A prefill chunk through the append: 300 new rows a sequence on pages of 16 (bf16 and an
/// fp8 cache under kv_scale 3), a sequence shorter than the chunk (nothing written for it),
/// every other byte of the cache unchanged.
#[test]
fn append_a_prefill_chunk() {
    let test = "paged_prefill";
    let seed = common::seed(test);
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let mut rng = SplitMix64::new(seed);
    let mut failures = Vec::new();
    let (page, n) = (16usize, 300usize);
    let lens = vec![300usize, 1000, 120, 4096];
    for d in [DecodeDtypes::Bf16, DecodeDtypes::Fp8KvBf16Q] {
        let mut h = HostCase::random(&CaseSpec::new(d, page, 1, 1, lens.clone()), &mut rng);
        let cache_t = d.kv();
        let src_t = cache_t.append_rows();
        if cache_t == ElemType::Fp8E4m3 {
            h.scales.kv_scale = 3.0;
        }
        let b = lens.len();
        let new_vals: Vec<f32> = (0..b * n * D_QK).map(|_| rng.normal() as f32).collect();
        let new_bytes = numeric::from_f32(src_t, &new_vals);
        let d_cache = stream.clone_htod(&h.kv_bytes).unwrap();
        let d_new = stream.clone_htod(&new_bytes).unwrap();
        let d_table = stream.clone_htod(&h.page_table).unwrap();
        let d_lens = stream.clone_htod(&h.seq_lens).unwrap();
        rt.append_kv(
            &stream,
            &AppendRequest {
                new_kv: TensorView::contiguous(ptr(&d_new, &stream), src_t, [b, n, D_QK]),
                kv_cache: TensorView::contiguous(
                    ptr(&d_cache, &stream),
                    cache_t,
                    [h.num_pages, page, D_QK],
                ),
                page_table: TensorView::contiguous(ptr(&d_table, &stream), INDEX, [b, h.max_pages]),
                seq_lens: TensorView::contiguous(ptr(&d_lens, &stream), INDEX, [b]),
                kv_scale: h.scales.kv_scale,
                // No host copies: with them a length below the chunk is an error.
                host: HostMirror::default(),
            },
        )
        .unwrap();
        let got: Vec<u8> = stream.clone_dtoh(&d_cache).unwrap();
        let want = appended(&h, src_t, &new_bytes, n);
        assert!(want != h.kv_bytes, "the expected cache has no new rows");
        if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
            failures.push(format!("{}: first differing byte {i}", d.name()));
        }
    }
    eprintln!(
        "[{test}] 2 caches, {n} rows a sequence: {} failed",
        failures.len()
    );
    common::assert_no_failures(test, seed, &failures);
}

#[test]
fn append_then_gather_round_trip() {
    let test = "paged";
    let seed = common::seed(test);
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let mut rng = SplitMix64::new(seed);
    let mut failures = Vec::new();
    for d in [
        DecodeDtypes::Bf16,
        DecodeDtypes::Fp16,
        DecodeDtypes::Fp8KvBf16Q,
    ] {
        for &(page, s_q) in &[(1usize, 1usize), (16, 4), (64, 2), (256, 8)] {
            let lens: Vec<usize> = vec![s_q, 3 * page + 1, page.max(s_q), 700];
            let spec = CaseSpec::new(d, page, 1, s_q, lens.clone());
            let mut h = HostCase::random(&spec, &mut rng);
            let cache_t = d.kv();
            // One fp8 case appends a sweep of bf16 values under kv_scale 7, where x * (1 / 7)
            // and x / 7 round to different e4m3 values for some x (1.3671875: 0x25 against
            // the nearest-even 0x24).
            let sweep = cache_t == ElemType::Fp8E4m3 && page == 16;
            if sweep {
                h.scales.kv_scale = 7.0;
            }
            // A subnormal kv_scale (valid: the kernel divides, subnormals kept) saturates
            // every nonzero new value, and the gather's products are subnormal too.
            if cache_t == ElemType::Fp8E4m3 && page == 256 {
                h.scales.kv_scale = 1e-40;
            }
            let src_t = if cache_t == ElemType::Fp8E4m3 {
                ElemType::Bf16
            } else {
                cache_t
            };
            let b = lens.len();
            // New rows, with a few values past fp8's range to exercise saturation.
            let new_vals: Vec<f32> = (0..b * s_q * D_QK)
                .map(|i| {
                    if sweep {
                        // Every bf16 from 0.5 to 8 (and its negative), in turn.
                        let bits = (0x3f00 + (i % 0x200) as u32) << 16;
                        let v = f32::from_bits(bits);
                        if (i / 0x200) % 2 == 0 { v } else { -v }
                    } else if i % 97 == 0 {
                        1e6 * h.scales.kv_scale
                    } else {
                        rng.normal() as f32
                    }
                })
                .collect();
            let new_bytes = numeric::from_f32(src_t, &new_vals);
            let d_cache = stream.clone_htod(&h.kv_bytes).unwrap();
            let d_new = stream.clone_htod(&new_bytes).unwrap();
            let d_table = stream.clone_htod(&h.page_table).unwrap();
            let d_lens = stream.clone_htod(&h.seq_lens).unwrap();
            let cache_view =
                TensorView::contiguous(ptr(&d_cache, &stream), cache_t, [h.num_pages, page, D_QK]);
            let table_view =
                TensorView::contiguous(ptr(&d_table, &stream), INDEX, [b, h.max_pages]);
            let lens_view = TensorView::contiguous(ptr(&d_lens, &stream), INDEX, [b]);
            let host = HostMirror {
                seq_lens: Some(&h.seq_lens),
                page_table: Some(&h.page_table),
            };
            rt.append_kv(
                &stream,
                &AppendRequest {
                    new_kv: TensorView::contiguous(ptr(&d_new, &stream), src_t, [b, s_q, D_QK]),
                    kv_cache: cache_view,
                    page_table: table_view,
                    seq_lens: lens_view,
                    kv_scale: h.scales.kv_scale,
                    host,
                },
            )
            .unwrap();
            let got: Vec<u8> = stream.clone_dtoh(&d_cache).unwrap();
            let want = appended(&h, src_t, &new_bytes, s_q);
            let es = cache_t.size();
            if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
                failures.push(format!(
                    "append {} P={page} S_q={s_q}: first differing byte {i}",
                    d.name()
                ));
            }

            // Gather, raw and (for fp8) dequantised to bf16.
            let max_len = lens.iter().max().unwrap() + 5;
            let outs: Vec<ElemType> = if cache_t == ElemType::Fp8E4m3 {
                vec![ElemType::Fp8E4m3, ElemType::Bf16]
            } else {
                vec![cache_t]
            };
            for out_t in outs {
                let n = b * max_len * D_QK * out_t.size();
                let d_out = stream.clone_htod(&vec![0xa5u8; n]).unwrap();
                rt.gather_kv(
                    &stream,
                    &GatherRequest {
                        kv_cache: cache_view,
                        page_table: table_view,
                        seq_lens: lens_view,
                        out: TensorView::contiguous(
                            ptr(&d_out, &stream),
                            out_t,
                            [b, max_len, D_QK],
                        ),
                        kv_scale: h.scales.kv_scale,
                        host,
                    },
                )
                .unwrap();
                let g: Vec<u8> = stream.clone_dtoh(&d_out).unwrap();
                let os = out_t.size();
                let mut bad = None;
                'outer: for s in 0..b {
                    for j in 0..max_len {
                        let dst = &g[(s * max_len + j) * D_QK * os..][..D_QK * os];
                        let expect: Vec<u8> = if j >= lens[s] {
                            vec![0xa5; D_QK * os]
                        } else {
                            let pg = h.page_table[s * h.max_pages + j / page] as usize;
                            let row = &want[(pg * page + j % page) * D_QK * es..][..D_QK * es];
                            if out_t == cache_t {
                                row.to_vec()
                            } else {
                                let v: Vec<f32> = row
                                    .iter()
                                    .map(|&c| numeric::e4m3_to_f32(c) * h.scales.kv_scale)
                                    .collect();
                                numeric::from_f32(ElemType::Bf16, &v)
                            }
                        };
                        if dst != expect.as_slice() {
                            bad = Some((s, j));
                            break 'outer;
                        }
                    }
                }
                if let Some((s, j)) = bad {
                    failures.push(format!(
                        "gather {} -> {} P={page}: sequence {s} row {j} differs",
                        d.name(),
                        out_t.name()
                    ));
                }
            }
        }
    }
    common::assert_no_failures(test, seed, &failures);
}
