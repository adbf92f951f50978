//! The split-KV combine kernel alone against the CPU log-sum-exp merge: random partials,
//! variable splits per sequence (sequences with one split are left for the decode), chunks
//! with `lse = -inf` (and NaN garbage in their O, which must not leak), rows whose chunks
//! are all empty.

// Index loops mirror the [split, batch, row, dim] layout the kernel reads.
#![allow(clippy::needless_range_loop)]

mod common;

use mla::abi::{D_V, ElemType, MAX_SPLITS};
use mla_dev::numeric;
use mla_dev::oracle;
use mla_dev::rng::SplitMix64;

#[test]
fn combine_matches_cpu_merge() {
    let test = "combine";
    let seed = common::seed(test);
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let mut rng = SplitMix64::new(seed);
    let mut failures = Vec::new();
    // Both builds (names::combine): narrow for the first two and the last (at most 8
    // chunks), wide for the others. The third (1536 rows, wide) and the last (narrow) have
    // grids the host cuts to one wave: each CTA strides over several of its sequence's
    // row groups.
    for &(batch, s_q, heads, max_splits, out_t) in &[
        (1usize, 1usize, 1usize, 2usize, ElemType::Bf16),
        (5, 2, 16, 8, ElemType::Bf16),
        (3, 4, 128, MAX_SPLITS as usize, ElemType::Fp16),
        (64, 1, 3, 17, ElemType::Bf16),
        (2, 1, 16, MAX_SPLITS as usize, ElemType::Fp16),
        (160, 1, 128, 3, ElemType::Bf16),
    ] {
        let rows = s_q * heads;
        let splits: Vec<i32> = (0..batch)
            .map(|_| rng.range(1, max_splits) as i32)
            .collect();
        let mut po = vec![f32::NAN; max_splits * batch * rows * D_V];
        let mut pl = vec![f32::NAN; max_splits * batch * rows];
        for b in 0..batch {
            for r in 0..rows {
                // Row 0 of every sequence: all chunks empty.
                let all_empty = r == 0 && b % 2 == 1;
                for i in 0..splits[b] as usize {
                    let idx = (i * batch + b) * rows + r;
                    let empty = all_empty || rng.next_f64() < 0.25;
                    pl[idx] = if empty {
                        f32::NEG_INFINITY
                    } else {
                        rng.uniform(-20.0, 20.0) as f32
                    };
                    for d in 0..D_V {
                        po[idx * D_V + d] = if empty { f32::NAN } else { rng.normal() as f32 };
                    }
                }
            }
        }
        let output_scale = 0.5f32;
        let d_po = stream.clone_htod(&po).unwrap();
        let d_pl = stream.clone_htod(&pl).unwrap();
        let d_ns = stream.clone_htod(&splits).unwrap();
        let mut d_out = stream
            .clone_htod(&vec![0xffffu16; batch * rows * D_V])
            .unwrap();
        let mut d_lse = stream.clone_htod(&vec![f32::NAN; batch * rows]).unwrap();
        rt.combine(
            &stream,
            &d_po,
            &d_pl,
            &d_ns,
            &mut d_out,
            out_t,
            &mut d_lse,
            (batch, s_q, heads, max_splits),
            output_scale,
        )
        .unwrap();
        let out: Vec<u16> = stream.clone_dtoh(&d_out).unwrap();
        let lse: Vec<f32> = stream.clone_dtoh(&d_lse).unwrap();
        let out = numeric::to_f32(
            out_t,
            &out.iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        );
        for b in 0..batch {
            for r in 0..rows {
                let row = b * rows + r;
                let got_o = &out[row * D_V..][..D_V];
                if splits[b] == 1 {
                    // Left alone: still the poison.
                    if !got_o.iter().all(|v| v.is_nan()) || !lse[row].is_nan() {
                        failures.push(format!("b{b} r{r}: one-split row was written"));
                    }
                    continue;
                }
                let parts: Vec<(Vec<f64>, Vec<f64>)> = (0..splits[b] as usize)
                    .map(|i| {
                        let idx = (i * batch + b) * rows + r;
                        (
                            po[idx * D_V..][..D_V].iter().map(|&v| v as f64).collect(),
                            vec![pl[idx] as f64],
                        )
                    })
                    .collect();
                let (ro, rl) = oracle::combine(&parts);
                let ro: Vec<f64> = ro.iter().map(|v| v * output_scale as f64).collect();
                let emu: Vec<f64> = ro.iter().map(|&v| numeric::round_to(out_t, v)).collect();
                let c = oracle::compare(got_o, &ro, &emu, 1e-6);
                let l = oracle::compare(&lse[row..row + 1], &rl, &rl, 1e-6);
                if !c.ok || !l.ok {
                    failures.push(format!("b{b} r{r} splits {}: out {c} | lse {l}", splits[b]));
                }
            }
        }
    }
    eprintln!("[{test}] {} failures (seed {seed})", failures.len());
    for f in failures.iter().take(20) {
        eprintln!("  FAIL {f}");
    }
    assert!(failures.is_empty());
}
