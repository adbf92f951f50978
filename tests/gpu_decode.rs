//! The decode kernels against the f64 oracle on the GPU: the case matrix (as data), corner
//! cases, split and page-permutation invariance, and the fp8 accuracy report.
//!
//! Every run draws fresh data (seed printed; `MLA_SEED` reproduces), poisons the outputs
//! before each launch, fills unused cache slots with NaN and unused table entries with
//! invalid page ids, and checks every element of `out` and `lse`.
//! `MLA_GPU_MATRIX=quick` (about 1 case in 6) or `sparse` (1 in 24) thins the matrix for
//! compute-sanitizer; `MLA_GPU_MATRIX_DTYPES=bf16,fp8` keeps only the named dtypes and
//! `MLA_GPU_MATRIX_MAX=N` the first N kept cases; `MLA_GPU_TILES=wg64n64,m16n64` runs only
//! the named tiles (in every test that runs cases), to aim a sanitizer at one kernel family.

mod common;

use mla::abi::ElemType;
use mla::tactic::Tile;
use mla::{
    DecodeDtypes, DecodeWorkspace, MlaError,
    abi::{D_QK, D_V, MAX_SPLITS},
};
use mla_dev::harness::{self, CaseSpec, DeviceCase, HostCase, Splits, Values};
use mla_dev::numeric;
use mla_dev::oracle::OracleOutput;
use mla_dev::rng::SplitMix64;

const PAGE_SIZES: [usize; 5] = [1, 16, 64, 128, 256];
const HEADS: [usize; 7] = [1, 3, 16, 32, 64, 100, 128];
const S_QS: [usize; 4] = [1, 2, 4, 8];
const SPLITS: [Splits; 3] = [
    Splits::Fixed(1),
    Splits::Fixed(3),
    Splits::Fixed(MAX_SPLITS as usize),
];

#[derive(Clone, Copy, Debug)]
enum LenMix {
    /// Every sequence holds only this step's tokens (length 1 at S_q = 1).
    AllMin,
    AllEqual,
    OneLongAmongShort,
    /// Lengths at page boundaries: P - 1, P, P + 1, 2P + 1 (at least S_q).
    PageEdges,
}

const MIXES: [LenMix; 4] = [
    LenMix::AllMin,
    LenMix::AllEqual,
    LenMix::OneLongAmongShort,
    LenMix::PageEdges,
];

fn lens(mix: LenMix, s_q: usize, page: usize) -> Vec<usize> {
    let v = match mix {
        LenMix::AllMin => vec![s_q; 3],
        LenMix::AllEqual => vec![197; 3],
        LenMix::OneLongAmongShort => vec![s_q + 3, 1031, s_q, s_q + 17],
        LenMix::PageEdges => vec![page.saturating_sub(1), page, page + 1, 2 * page + 1],
    };
    v.into_iter().map(|l| l.max(s_q)).collect()
}

fn matrix() -> Vec<CaseSpec> {
    // quick: about 1 case in 6 (memcheck); sparse: 1 in 24 (racecheck, ~100x slower).
    let every = match std::env::var("MLA_GPU_MATRIX").as_deref() {
        Ok("quick") => 6u32,
        Ok("sparse") => 24,
        _ => 1,
    };
    // MLA_GPU_MATRIX_DTYPES=fp8kv_bf16q,fp8: only those dtypes (to re-check one kernel family).
    let only = std::env::var("MLA_GPU_MATRIX_DTYPES").ok();
    let mut out = Vec::new();
    // Cases counted in matrix order (after the dtype filter) and kept by a hash of the count
    // (about one in `every`), so a thinned matrix spreads over every dtype, page size, head
    // count, S_q and length mix (a stride would lock onto the nested loops' periods).
    let mut n = 0u32;
    for &d in DecodeDtypes::ALL.iter() {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|n| n == d.name()))
        {
            continue;
        }
        for &p in PAGE_SIZES.iter() {
            for (hi, &h) in HEADS.iter().enumerate() {
                for (si, &s) in S_QS.iter().enumerate() {
                    for &m in MIXES.iter() {
                        n += 1;
                        if !(n.wrapping_mul(0x9e37_79b9) >> 16).is_multiple_of(every) {
                            continue;
                        }
                        let mut c = CaseSpec::new(d, p, h, s, lens(m, s, p));
                        // Exercise output_scale on part of the matrix.
                        if (hi + si) % 3 == 0 {
                            c.output_scale = 0.75;
                        }
                        out.push(c);
                    }
                }
            }
        }
    }
    if let Some(max) = std::env::var("MLA_GPU_MATRIX_MAX")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        out.truncate(max);
    }
    out
}

/// Whether `MLA_GPU_TILES` (a comma-separated list of tile names; unset: every tile) keeps
/// `tile`.
fn tile_wanted(tile: Tile) -> bool {
    std::env::var("MLA_GPU_TILES")
        .map(|v| v.split(',').any(|n| n == tile.name()))
        .unwrap_or(true)
}

/// Every tile this image runs for `h`'s dtypes (the wgmma tile: sm_90a; bf16 Q, bf16 or
/// fp8 cache) that `MLA_GPU_TILES` keeps.
fn tiles_for(rt: &mla::Runtime, h: &HostCase) -> Vec<Tile> {
    Tile::ALL
        .into_iter()
        .filter(|&t| t.check(rt.backend(), h.spec.dtypes).is_ok() && tile_wanted(t))
        .collect()
}

/// One decode of `h` as failure and trace lines name it.
fn case_label(h: &HostCase, sp: Splits, tile: Tile) -> String {
    format!(
        "{} P={} H={} S_q={} lens={:?} splits={sp:?} tile={tile}",
        h.spec.dtypes.name(),
        h.spec.page_size,
        h.spec.heads,
        h.spec.s_q,
        h.spec.lens
    )
}

/// Runs `specs` with every split mode of `splits` and returns the failures.
fn run_cases(test: &str, specs: &[CaseSpec], splits: &[Splits], seed: u64) -> (usize, Vec<String>) {
    run_cases_with(test, specs, splits, seed, None, &|_| {})
}

/// [`run_cases`] with the cache uploaded strided: `pad` = (row, page) padding in elements
/// ([`DeviceCase::upload_padded`]), and `edit` applied to each case's inputs before its
/// references are computed.
fn run_cases_with(
    test: &str,
    specs: &[CaseSpec],
    splits: &[Splits],
    seed: u64,
    pad: Option<(usize, usize)>,
    edit: &(dyn Fn(&mut HostCase) + Sync),
) -> (usize, Vec<String>) {
    let Some((rt, stream)) = common::gpu(test) else {
        return (0, Vec::new());
    };
    let sms = rt.device().sm_count as usize;
    let mut failures = Vec::new();
    let mut runs = 0;
    let trace = std::env::var("MLA_TRACE").is_ok();
    let chunks = specs.len().div_ceil(64);
    for (ci, chunk) in specs.chunks(64).enumerate() {
        let t0 = std::time::Instant::now();
        let prepared = common::prepare_with(chunk, seed ^ (ci as u64) << 40, edit);
        let t1 = t0.elapsed().as_secs_f64();
        let first = &chunk[0];
        eprintln!(
            "[{test}] chunk {}/{chunks} ({} P={} H={} ..): references {t1:.1} s",
            ci + 1,
            first.dtypes.name(),
            first.page_size,
            first.heads
        );
        for (h, refs) in &prepared {
            let mut d = match pad {
                Some((row, page)) => DeviceCase::upload_padded(&stream, h, row, page),
                None => DeviceCase::upload(&stream, h),
            }
            .expect("upload");
            let mut ws = harness::workspace_for(&stream, h).expect("workspace");
            let tiles = tiles_for(&rt, h);
            for (&sp, tile) in splits
                .iter()
                .flat_map(|sp| tiles.iter().map(move |&t| (sp, t)))
            {
                let counts = sp.counts(&h.spec.lens, h.spec.s_q * h.spec.heads, sms);
                if trace {
                    eprintln!("[{test}] run {}", case_label(h, sp, tile));
                }
                let got =
                    harness::run_decode_tiled(&rt, &stream, h, &mut d, &mut ws, &counts, tile)
                        .expect("decode");
                let chk = harness::check(&got, refs);
                runs += 1;
                if !chk.ok() {
                    failures.push(format!(
                        "{}: out {} | lse {}",
                        case_label(h, sp, tile),
                        chk.out,
                        chk.lse
                    ));
                }
            }
        }
        eprintln!(
            "[{test}]   GPU runs {:.1} s, failures so far {}",
            t0.elapsed().as_secs_f64() - t1,
            failures.len()
        );
    }
    (runs, failures)
}

fn report(test: &str, seed: u64, runs: usize, failures: &[String]) {
    eprintln!(
        "[{test}] {runs} decodes checked, {} failed (seed {seed})",
        failures.len()
    );
    for f in failures.iter().take(30) {
        eprintln!("  FAIL {f}");
    }
    assert!(
        failures.is_empty(),
        "[{test}] {} of {runs} decodes failed (seed {seed})",
        failures.len()
    );
}

#[test]
fn case_matrix_against_oracle() {
    let test = "case_matrix";
    let seed = common::seed(test);
    let specs = matrix();
    let (runs, failures) = run_cases(test, &specs, &SPLITS, seed);
    report(test, seed, runs, &failures);
}

#[test]
fn corner_cases() {
    let test = "corner_cases";
    let seed = common::seed(test);
    let mut rng = SplitMix64::new(seed);
    let mut specs = vec![
        CaseSpec::new(DecodeDtypes::Bf16, 64, 128, 1, vec![4096]),
        CaseSpec::new(
            DecodeDtypes::Bf16,
            16,
            16,
            2,
            (0..256).map(|_| rng.range(2, 300)).collect(),
        ),
        CaseSpec::new(
            DecodeDtypes::Fp8KvBf16Q,
            64,
            16,
            1,
            (0..256).map(|_| rng.range(1, 200)).collect(),
        ),
        CaseSpec::new(DecodeDtypes::Bf16, 64, 16, 1, vec![131072]),
        CaseSpec::new(DecodeDtypes::Fp8KvBf16Q, 128, 16, 2, vec![131072]),
        // Long splits on the e4m3 path (fp8 caches at one split): O promoted to the f32
        // scratch every 32 pairs, once or many times, under either Q.
        CaseSpec::new(DecodeDtypes::Fp8, 128, 16, 2, vec![131072]),
        CaseSpec::new(DecodeDtypes::Fp8KvBf16Q, 64, 128, 1, vec![20000, 4200]),
        CaseSpec::new(DecodeDtypes::Fp8, 64, 128, 2, vec![9000, 4100]),
        // Pages of 32 tokens: the TMA decodes' two boxes per slab (pages of 16 take four, of
        // 64 or more one), with a partial last box and block.
        CaseSpec::new(DecodeDtypes::Bf16, 32, 128, 1, vec![1, 31, 33, 1000, 2049]),
        CaseSpec::new(DecodeDtypes::Fp8KvBf16Q, 32, 32, 2, vec![32, 65, 777, 3000]),
        // fp8 Q on the fp8-cache TMA and `wgmma` decodes: partial boxes, and one-block
        // splits beside long ones.
        CaseSpec::new(DecodeDtypes::Fp8, 32, 128, 1, vec![1, 31, 200, 3000]),
        CaseSpec::new(DecodeDtypes::Fp8, 256, 64, 2, vec![5000, 700, 64]),
        // The TMA decodes' `cp.async` forms (bf16, pages of fewer than 16 tokens): the
        // small-row decode's (at most 32 rows) with a row per page over many blocks and
        // around the ring, ends mid-block and mid-page, one-token sequences beside long
        // ones; the 64-row decode's (its producer warpgroup) at 128, 192 and 40 rows, odd
        // block counts (a last pair without its second block), a sequence of one block.
        CaseSpec::new(DecodeDtypes::Bf16, 1, 16, 2, vec![4096, 1, 63, 65, 1000]),
        CaseSpec::new(DecodeDtypes::Bf16, 4, 32, 1, vec![2000, 3001, 129]),
        CaseSpec::new(DecodeDtypes::Bf16, 8, 3, 5, vec![4500, 191]),
        CaseSpec::new(DecodeDtypes::Bf16, 1, 128, 1, vec![4096, 65, 1000]),
        CaseSpec::new(DecodeDtypes::Bf16, 2, 64, 3, vec![3000, 1, 64, 129, 2111]),
        CaseSpec::new(DecodeDtypes::Bf16, 8, 40, 1, vec![5000, 192, 63]),
        // The small-row decode's `cp.async` form where its map also serves (bf16 from
        // `TMA32_CP_MIN_BATCH` sequences): 16, 15 and 32 rows on pages of 64, 128 and 256,
        // one-token sequences beside long ones, ends mid-block and on page edges.
        CaseSpec::new(
            DecodeDtypes::Bf16,
            64,
            16,
            1,
            vec![1, 63, 64, 65, 1000, 4097, 2, 129, 7000],
        ),
        CaseSpec::new(
            DecodeDtypes::Bf16,
            128,
            3,
            5,
            vec![5, 130, 260, 1000, 6, 77, 64, 4000, 9],
        ),
        CaseSpec::new(
            DecodeDtypes::Bf16,
            256,
            32,
            1,
            (0..12).map(|_| rng.range(1, 3000)).collect(),
        ),
        // The e4m3 decode's `cp.async` form (fp8 caches on pages under 16 tokens, each
        // warpgroup copying its own block of a pair): a row per page with odd block counts
        // and one-block sequences, 192 and 40 rows, and single splits long enough to promote
        // O to the scratch (every 32 pairs) once and many times, under either Q.
        CaseSpec::new(
            DecodeDtypes::Fp8KvBf16Q,
            1,
            128,
            1,
            vec![4096, 1, 63, 65, 1000],
        ),
        CaseSpec::new(DecodeDtypes::Fp8, 2, 64, 3, vec![3000, 1, 129, 2111]),
        CaseSpec::new(DecodeDtypes::Fp8KvBf16Q, 4, 40, 1, vec![5000, 192, 63]),
        CaseSpec::new(DecodeDtypes::Fp8KvBf16Q, 8, 128, 1, vec![131072]),
        CaseSpec::new(DecodeDtypes::Fp8, 1, 128, 1, vec![20000, 4200]),
    ];
    // Pages of 2, 4 and 8 tokens (the case matrix runs 1 and 16 up): every dtype, at 16 and
    // 128 heads, with lengths that end mid-page and mid-block.
    for (i, &d) in DecodeDtypes::ALL.iter().enumerate() {
        for (j, &page) in [2usize, 4, 8].iter().enumerate() {
            let heads = if (i + j) % 2 == 0 { 16 } else { 128 };
            let s_q = 1 + (i + j) % 2;
            specs.push(CaseSpec::new(d, page, heads, s_q, vec![1, 7, 130, 1001]));
        }
    }
    // Head counts and query tokens the case matrix skips: 2, 8 and 127 heads, S_q 3, 5, 6, 7
    // (rows that fill no tile evenly, up to 889 rows).
    for (d, page, heads, s_q, lens) in [
        (DecodeDtypes::Bf16, 64, 127, 7, [300, 2100]),
        (DecodeDtypes::Fp8KvBf16Q, 64, 8, 5, [90, 4097]),
        (DecodeDtypes::Fp8, 16, 2, 6, [33, 1500]),
        (DecodeDtypes::Fp16, 32, 127, 3, [64, 777]),
    ] {
        specs.push(CaseSpec::new(d, page, heads, s_q, lens.to_vec()));
    }
    let mut shared = CaseSpec::new(DecodeDtypes::Bf16, 16, 32, 2, vec![500, 613, 700, 801]);
    shared.share_prefix_pages = true;
    specs.push(shared);
    let mut shared8 = CaseSpec::new(DecodeDtypes::Fp8, 64, 128, 4, vec![1000, 1100, 1200]);
    shared8.share_prefix_pages = true;
    specs.push(shared8);
    let (runs, failures) = run_cases(test, &specs, &[Splits::Fixed(1), Splits::Planned], seed);
    report(test, seed, runs, &failures);
}

/// Caches with padded token rows and pages (strides of 640 elements per row, plus 64 per
/// page; the padding NaN) on every tile and dtype: the strides reach every kernel's
/// address arithmetic, and none may read the padding.
#[test]
fn padded_cache_strides() {
    let test = "padded_cache";
    let seed = common::seed(test);
    let mut specs = Vec::new();
    for &d in &DecodeDtypes::ALL {
        specs.push(CaseSpec::new(d, 16, 16, 1, vec![197, 64, 1031]));
        specs.push(CaseSpec::new(d, 64, 128, 2, vec![300, 700]));
        specs.push(CaseSpec::new(d, 128, 32, 1, vec![1, 129, 513]));
    }
    let (runs, failures) = run_cases_with(
        test,
        &specs,
        &[Splits::Fixed(1), Splits::Fixed(3)],
        seed,
        Some((64, 64)),
        &|_| {},
    );
    report(test, seed, runs, &failures);
}

/// Scales `h`'s values by `2^e` and its softmax scale by `2^-e`, so that the logits (and
/// the lse) stay as drawn and the outputs scale by `2^e`: a bf16 cache's stored values
/// (exact but for values that go subnormal, re-decoded so the references see what the
/// kernels read), an fp8 cache's `kv_scale`.
fn scale_values(h: &mut HostCase, e: i32) {
    let f = 2f32.powi(e);
    if h.spec.dtypes.kv() == ElemType::Fp8E4m3 {
        h.scales.kv_scale *= f;
    } else {
        let t = h.spec.dtypes.kv();
        let scaled: Vec<f32> = h.kv_vals.iter().map(|v| v * f).collect();
        h.kv_bytes = numeric::from_f32(t, &scaled);
        h.kv_vals = numeric::to_f32(t, &h.kv_bytes);
    }
    h.scales.softmax_scale /= f;
}

/// Zeroes the second half of V (latent dims `D_V / 2 .. D_V`) in every cache slot: each
/// row's second half of the output, and of every split partial, is zero.
fn zero_second_value_half(h: &mut HostCase) {
    let width = h.kv_bytes.len() / h.kv_vals.len();
    for row in 0..h.kv_vals.len() / D_QK {
        let dims = row * D_QK + D_V / 2..row * D_QK + D_V;
        h.kv_vals[dims.clone()].fill(0.0);
        h.kv_orig[dims.clone()].fill(0.0);
        h.kv_bytes[dims.start * width..dims.end * width].fill(0);
    }
}

/// Split outputs far above fp16's range (65504) and far below its normal range: the bf16
/// and fp8-Q 64-row TMA decodes' partials are fp16 over a power-of-two factor per half row
/// (`mla::abi::partial16`), which must keep both (the fp8 cache's f32 partials under bf16
/// Q, run here too, must as well). Values scaled by `2^e` ([`scale_values`]), outputs
/// compared after scaling back by `2^-e`, so that the tolerance's absolute floor (`1e-5` of
/// at least 1) cannot hide a tiny output's error; at `2^100` once more with V's second half
/// zero ([`zero_second_value_half`]): a zero half row under a large `kv_scale`, whose
/// factor is the smallest and its inverse the largest. H=128 on pages of 64, 16 and 4 (the
/// map and `cp.async` forms), bf16 and fp8 caches under bf16 Q, and fp8 Q.
#[test]
fn split_partials_keep_every_magnitude() {
    let test = "partial_magnitudes";
    let seed = common::seed(test);
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let sms = rt.device().sm_count as usize;
    let mut specs = Vec::new();
    for d in [
        DecodeDtypes::Bf16,
        DecodeDtypes::Fp8KvBf16Q,
        DecodeDtypes::Fp8,
    ] {
        for (page, s_q) in [(64, 1), (16, 2), (4, 1)] {
            specs.push(CaseSpec::new(d, page, 128, s_q, vec![3000, 700, 65, 1]));
        }
    }
    let splits = [
        Splits::Fixed(2),
        Splits::Fixed(7),
        Splits::Fixed(MAX_SPLITS as usize),
    ];
    let (mut runs, mut failures) = (0, Vec::new());
    let edits = [
        (-100i32, false),
        (-30, false),
        (0, false),
        (30, false),
        (100, false),
        (100, true),
    ];
    for (i, (e, zero_half)) in edits.into_iter().enumerate() {
        let edit = move |h: &mut HostCase| {
            if zero_half {
                zero_second_value_half(h);
            }
            scale_values(h, e);
        };
        let prepared = common::prepare_with(&specs, seed ^ (i as u64) << 40, &edit);
        let back = 2f64.powi(-e);
        for (h, refs) in &prepared {
            let mut d = DeviceCase::upload(&stream, h).expect("upload");
            let mut ws = harness::workspace_for(&stream, h).expect("workspace");
            let refs = (
                OracleOutput {
                    out: refs.0.out.iter().map(|v| v * back).collect(),
                    lse: refs.0.lse.clone(),
                },
                OracleOutput {
                    out: refs.1.out.iter().map(|v| v * back).collect(),
                    lse: refs.1.lse.clone(),
                },
            );
            for sp in splits {
                let counts = sp.counts(&h.spec.lens, h.spec.s_q * h.spec.heads, sms);
                let (out, lse) =
                    harness::run_decode(&rt, &stream, h, &mut d, &mut ws, &counts).expect("decode");
                let out = out.iter().map(|&v| (f64::from(v) * back) as f32).collect();
                let chk = harness::check(&(out, lse), &refs);
                runs += 1;
                if !chk.ok() {
                    let half = if zero_half {
                        " (V's second half zero)"
                    } else {
                        ""
                    };
                    failures.push(format!(
                        "2^{e}{half} {}: out {} | lse {}",
                        case_label(h, sp, Tile::M64N64),
                        chk.out,
                        chk.lse
                    ));
                }
            }
        }
    }
    report(test, seed, runs, &failures);
}

/// The NaN-poisoning cases: every dtype, one and several row tiles, pages of 16 and 64, a
/// sequence long enough for many splits; sequence 0's token 40 is NaN in one dim (a latent
/// dim, which K and V share, or a rope dim, K's alone).
fn nan_key_specs() -> Vec<CaseSpec> {
    let mut specs = Vec::new();
    for &d in &DecodeDtypes::ALL {
        specs.push(CaseSpec::new(d, 64, 16, 1, vec![700, 97, 1500]));
        specs.push(CaseSpec::new(d, 16, 16, 2, vec![1500, 300]));
        specs.push(CaseSpec::new(d, 64, 128, 1, vec![97, 700]));
        specs.push(CaseSpec::new(d, 64, 64, 2, vec![1031, 64, 5]));
    }
    specs
}

/// Token 40 of sequence 0: a latent dim at S_q = 1, a rope dim otherwise.
fn poison_token_40(h: &mut HostCase) {
    let dim = if h.spec.s_q == 1 { 7 } else { 530 };
    h.poison_key(0, 40, dim);
}

/// The oracle side of the NaN test, on the CPU: every row of sequence 0 sees token 40 and
/// is NaN (out and lse); the other sequences' rows are finite. Without this the GPU test
/// below could pass against a reference that dropped the NaN too.
#[test]
fn oracle_poisons_the_rows_that_see_a_nan_key() {
    let specs: Vec<CaseSpec> = nan_key_specs().into_iter().step_by(3).collect();
    assert_oracle_nan_rows("nan_key_oracle", &specs, &poison_token_40, &|spec, r| {
        r < spec.s_q * spec.heads
    });
}

/// For each spec, poisons a random case with `poison` and checks that the f64 oracle's rows
/// (out and lse) are NaN exactly where `poisoned(spec, row)` says, over the whole batch.
fn assert_oracle_nan_rows(
    name: &str,
    specs: &[CaseSpec],
    poison: &dyn Fn(&mut HostCase),
    poisoned: &dyn Fn(&CaseSpec, usize) -> bool,
) {
    let seed = common::seed(name);
    for (i, spec) in specs.iter().enumerate() {
        let mut rng = SplitMix64::new(seed ^ i as u64);
        let mut h = HostCase::random(spec, &mut rng);
        poison(&mut h);
        let (exact, _) = h.references();
        for (r, &l) in exact.lse.iter().enumerate() {
            let want = poisoned(spec, r);
            assert_eq!(l.is_nan(), want, "{spec:?}: lse row {r} = {l}");
            let o = &exact.out[r * mla::abi::D_V..(r + 1) * mla::abi::D_V];
            assert!(
                o.iter().all(|v| v.is_nan() == want),
                "{spec:?}: out row {r}"
            );
        }
    }
}

/// A NaN among a row's visible keys makes that row's out and lse NaN on every tile, with one
/// split, three and the most (the combine must not take a NaN chunk for an empty one, nor the
/// decode write a NaN row's LSE as -inf), and leaves every other row as the oracle has it.
#[test]
fn nan_in_a_visible_key_poisons_its_rows() {
    let test = "nan_key";
    let seed = common::seed(test);
    let (runs, failures) = run_cases_with(
        test,
        &nan_key_specs(),
        &SPLITS,
        seed,
        None,
        &poison_token_40,
    );
    report(test, seed, runs, &failures);
}

/// Cases for a NaN in a key only the step's last query token sees (sequence 0's last
/// position, a latent dim): every dtype, the 16-, 32- and 64-row tiles, pages of 1, 16 and 64
/// (the `cp.async` forms and the TMA ones), S_q up to 8, the window of unseen keys inside one
/// block and across two (length 129 at S_q = 8: positions 122..128).
fn unseen_nan_specs() -> Vec<CaseSpec> {
    let mut specs = Vec::new();
    for &d in &DecodeDtypes::ALL {
        specs.push(CaseSpec::new(d, 64, 16, 2, vec![700, 97]));
        specs.push(CaseSpec::new(d, 64, 8, 2, vec![1500, 64]));
        specs.push(CaseSpec::new(d, 64, 4, 8, vec![129, 70]));
        specs.push(CaseSpec::new(d, 16, 128, 2, vec![1500, 300]));
        specs.push(CaseSpec::new(d, 1, 64, 4, vec![300, 65]));
    }
    specs
}

/// Sequence 0's last position, latent dim 7 (the value too).
fn poison_last_key(h: &mut HostCase) {
    let last = h.spec.lens[0] - 1;
    h.poison_key(0, last, 7);
}

/// The oracle side: only sequence 0's last token sees the poisoned key, so its rows are NaN
/// (out and lse) and every other row is finite.
#[test]
fn oracle_poisons_only_the_token_that_sees_an_unseen_nan() {
    assert_oracle_nan_rows(
        "unseen_nan_oracle",
        &unseen_nan_specs(),
        &poison_last_key,
        &|spec, r| r < spec.s_q * spec.heads && r >= (spec.s_q - 1) * spec.heads,
    );
}

/// A NaN in a key only the step's last token sees makes that token's rows NaN and leaves the
/// earlier tokens' rows as the oracle has them (finite), with one split, three and the most:
/// P.V must not multiply their zero weights by the NaN.
#[test]
fn nan_in_an_unseen_key_leaves_earlier_tokens_exact() {
    let test = "unseen_nan";
    let seed = common::seed(test);
    let (runs, failures) = run_cases_with(
        test,
        &unseen_nan_specs(),
        &SPLITS,
        seed,
        None,
        &poison_last_key,
    );
    report(test, seed, runs, &failures);
}

/// The same inputs decoded many times give the same bits: every kernel reduces in a fixed
/// order, so a run-to-run difference can only come from a race. Aimed at the kernels whose
/// warps hand values over through shared memory (the TMA decode's two warpgroups, the ring
/// and fp8 16-row decodes), where racecheck's reports are not taken at face value
/// (docs/PERF.md v12). `MLA_GPU_REPEATS` runs per case (default 300), outputs poisoned
/// before each; the first run of each is checked against the oracle.
#[test]
fn repeated_runs_are_bitwise_identical() {
    let test = "repeat";
    let seed = common::seed(test);
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let reps = std::env::var("MLA_GPU_REPEATS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(300)
        .max(2);
    let sms = rt.device().sm_count as usize;
    // Cases of more sequences than this run on the `wgmma` tile only (see below).
    const MANY_SEQS: usize = 64;
    let specs = [
        // The TMA decodes' map forms (bf16 and fp8 caches) on their smallest pages with a
        // partial last block (racecheck's case: page 16, an fp8 cache's map from page 32),
        // and at page 64 over many pairs; the ring and fp8 16-row decodes at H = 16; the
        // `cp.async` forms at page 1.
        CaseSpec::new(DecodeDtypes::Bf16, 16, 32, 2, vec![197, 197, 197]),
        CaseSpec::new(DecodeDtypes::Bf16, 64, 128, 1, vec![1031, 4096, 77]),
        CaseSpec::new(DecodeDtypes::Fp8KvBf16Q, 32, 32, 2, vec![197, 197, 197]),
        CaseSpec::new(DecodeDtypes::Fp8KvBf16Q, 64, 128, 1, vec![1031, 4096, 77]),
        CaseSpec::new(DecodeDtypes::Bf16, 64, 16, 1, vec![2049, 300]),
        CaseSpec::new(DecodeDtypes::Fp8KvBf16Q, 64, 16, 2, vec![2049, 300]),
        // The TMA decodes' `cp.async` forms (full barriers of 32 or 128 arrivals): the
        // small-row decode's and the 64-row decode's at page 1; and the 64-row one over
        // 600 cells, where the empty third split of a two-block sequence is followed on the
        // same CTA by a busy one (at three splits, 132 CTAs: cells c + 396 and c + 528 for
        // c in 4..72), so a stage barrier's phase that drifted would show.
        CaseSpec::new(DecodeDtypes::Bf16, 1, 16, 2, vec![1031, 2048, 77]),
        CaseSpec::new(DecodeDtypes::Bf16, 1, 128, 1, vec![1031, 2048, 77]),
        CaseSpec::new(
            DecodeDtypes::Bf16,
            2,
            128,
            1,
            (0..100).map(|i| if i < 50 { 100 } else { 300 }).collect(),
        ),
        // The e4m3 decode's `cp.async` form (each warpgroup copies its own block; 128
        // arrivals a slab): at page 1, and over the same 600 cells with empty splits.
        CaseSpec::new(DecodeDtypes::Fp8KvBf16Q, 1, 128, 1, vec![1031, 2048, 77]),
        CaseSpec::new(
            DecodeDtypes::Fp8,
            2,
            128,
            1,
            (0..100).map(|i| if i < 50 { 100 } else { 300 }).collect(),
        ),
    ];
    let started = std::time::Instant::now();
    let prepared = common::prepare(&specs, seed);
    eprintln!(
        "[{test}] references at {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let (mut runs, mut failures) = (0usize, Vec::new());
    for (h, refs) in &prepared {
        let mut d = DeviceCase::upload(&stream, h).expect("upload");
        let mut ws = harness::workspace_for(&stream, h).expect("workspace");
        let tiles = tiles_for(&rt, h);
        for (tile, sp) in tiles
            .into_iter()
            .flat_map(|t| [(t, Splits::Fixed(1)), (t, Splits::Fixed(3))])
        {
            // The 600-cell cases are for the `cp.async` forms' barrier phases: the `wgmma`
            // tile only (on the others each of their configurations took 15 s of reading
            // back and comparing, for cells the smaller cases cover).
            if h.spec.lens.len() > MANY_SEQS && tile != Tile::Wg64N64 {
                continue;
            }
            let counts = sp.counts(&h.spec.lens, h.spec.s_q * h.spec.heads, sms);
            let name = case_label(h, sp, tile);
            let run = |d: &mut DeviceCase, ws: &mut DecodeWorkspace| {
                harness::run_decode_tiled(&rt, &stream, h, d, ws, &counts, tile).expect("decode")
            };
            let first = run(&mut d, &mut ws);
            let chk = harness::check(&first, refs);
            if !chk.ok() {
                failures.push(format!("{name}: out {} | lse {}", chk.out, chk.lse));
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let want = (bits(&first.0), bits(&first.1));
            let differing = (1..reps)
                .filter(|_| {
                    let got = run(&mut d, &mut ws);
                    (bits(&got.0), bits(&got.1)) != want
                })
                .count();
            runs += reps;
            if differing > 0 {
                failures.push(format!(
                    "{name}: {differing} of {reps} runs differ from the first"
                ));
            }
            // Progress, so that a timeout names the case it stopped in.
            eprintln!(
                "[{test}] {name}: done at {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
    }
    eprintln!("[{test}] {reps} runs per case");
    report(test, seed, runs, &failures);
}

/// 1, 3, max and planned splits all pass the oracle and agree with each other; permuting
/// the physical pages changes no bit of the output.
#[test]
fn split_and_page_permutation_invariance() {
    let test = "invariance";
    let seed = common::seed(test);
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let sms = rt.device().sm_count as usize;
    let mut rng = SplitMix64::new(seed);
    let mut failures = Vec::new();
    for &d in &DecodeDtypes::ALL {
        let s = CaseSpec::new(d, 16, 64, 2, vec![777, 64, 2049]);
        let h = HostCase::random(&s, &mut rng);
        let refs = h.references();
        let mut dc = DeviceCase::upload(&stream, &h).unwrap();
        let mut ws = harness::workspace_for(&stream, &h).unwrap();
        let mut outs = Vec::new();
        for sp in [
            Splits::Fixed(1),
            Splits::Fixed(3),
            Splits::Fixed(MAX_SPLITS as usize),
            Splits::Planned,
        ] {
            let counts = sp.counts(&h.spec.lens, s.s_q * s.heads, sms);
            let got = harness::run_decode(&rt, &stream, &h, &mut dc, &mut ws, &counts).unwrap();
            let chk = harness::check(&got, &refs);
            if !chk.ok() {
                failures.push(format!("{} {sp:?}: {} | {}", d.name(), chk.out, chk.lse));
            }
            outs.push((sp, counts, got));
        }
        // Mutual agreement: within twice the oracle tolerance of each other.
        let base = &outs[0].2;
        for (sp, _, o) in &outs[1..] {
            let diff = base
                .0
                .iter()
                .zip(&o.0)
                .map(|(a, b)| (a - b).abs() as f64)
                .fold(0.0, f64::max);
            let allowed = 2.0 * harness::check(base, &refs).out.allowed;
            eprintln!(
                "[{test}] {} splits {sp:?} vs 1: max |diff| = {diff:.3e} (allowed {allowed:.3e})",
                d.name()
            );
            if diff.is_nan() || diff > allowed {
                failures.push(format!(
                    "{} {sp:?} differs from 1 split by {diff:e}",
                    d.name()
                ));
            }
        }
        // Page permutation: bitwise identical for the same split counts.
        let hp = h.permute_pages(&mut rng);
        let mut dp = DeviceCase::upload(&stream, &hp).unwrap();
        for (sp, counts, o) in &outs {
            let got = harness::run_decode(&rt, &stream, &hp, &mut dp, &mut ws, counts).unwrap();
            let same = got
                .0
                .iter()
                .zip(&o.0)
                .all(|(a, b)| a.to_bits() == b.to_bits())
                && got
                    .1
                    .iter()
                    .zip(&o.1)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
            if !same {
                failures.push(format!(
                    "{} {sp:?}: output changed under page permutation",
                    d.name()
                ));
            }
        }
    }
    report(test, seed, DecodeDtypes::ALL.len() * 8, &failures);
}

/// fp8 accuracy on realistic values with outliers: the kernel's fp8 output against the f64
/// oracle on the unquantised data (reported), and against the oracle on the quantised
/// data (checked with the usual tolerance).
#[test]
fn fp8_accuracy_report() {
    let test = "fp8_accuracy";
    let seed = common::seed(test);
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let mut rng = SplitMix64::new(seed);
    let mut failures = Vec::new();
    for d in [DecodeDtypes::Fp8KvBf16Q, DecodeDtypes::Fp8] {
        for (heads, s_q) in [(16usize, 1usize), (128, 2)] {
            let mut s = CaseSpec::new(d, 64, heads, s_q, vec![3000, 1500, 4097]);
            s.values = Values::Outliers;
            let h = HostCase::random(&s, &mut rng);
            let refs = h.references();
            let mut dc = DeviceCase::upload(&stream, &h).unwrap();
            let mut ws = harness::workspace_for(&stream, &h).unwrap();
            let counts =
                Splits::Planned.counts(&s.lens, s_q * heads, rt.device().sm_count as usize);
            let got = harness::run_decode(&rt, &stream, &h, &mut dc, &mut ws, &counts).unwrap();
            let chk = harness::check(&got, &refs);
            if !chk.ok() {
                failures.push(format!("{} H={heads}: {} | {}", d.name(), chk.out, chk.lse));
            }
            // Against the unquantised inputs.
            let mut inp = h.oracle_input();
            inp.q = &h.q_orig;
            inp.kv_cache = &h.kv_orig;
            inp.q_scale = 1.0;
            inp.kv_scale = 1.0;
            let exact = mla_dev::oracle::decode(&inp);
            let num: f64 = got
                .0
                .iter()
                .zip(&exact.out)
                .map(|(a, b)| (*a as f64 - b).powi(2))
                .sum();
            let den: f64 = exact.out.iter().map(|b| b * b).sum();
            let rel = (num / den).sqrt();
            let qnum: f64 = refs
                .0
                .out
                .iter()
                .zip(&exact.out)
                .map(|(a, b)| (a - b).powi(2))
                .sum();
            let qrel = (qnum / den).sqrt();
            // The kernel against the f64 oracle on the same fp8 data: its own arithmetic
            // (an fp8 cache at H=128: the e4m3 tensor cores, P in e4m3), within the check's
            // tolerance above.
            let knum: f64 = got
                .0
                .iter()
                .zip(&refs.0.out)
                .map(|(a, b)| (*a as f64 - b).powi(2))
                .sum();
            let kden: f64 = refs.0.out.iter().map(|b| b * b).sum();
            let krel = (knum / kden).sqrt();
            eprintln!(
                "[{test}] {} H={heads} S_q={s_q}: kernel vs unquantised f64 rel L2 = {rel:.4e}; \
                 f64 on fp8 data vs unquantised = {qrel:.4e} (quantisation alone); kernel vs \
                 f64 on fp8 data = {krel:.4e} (arithmetic alone)",
                d.name()
            );
            if rel.is_nan() || rel > 2.0 * qrel + 1e-2 {
                failures.push(format!(
                    "{} H={heads}: rel L2 {rel} vs quantisation error {qrel}",
                    d.name()
                ));
            }
        }
    }
    report(test, seed, 4, &failures);
}

/// A bad request is refused before any launch, with the field named.
#[test]
fn bad_requests_are_typed_errors() {
    let test = "bad_requests";
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let mut rng = SplitMix64::new(1);
    let h = HostCase::random(
        &CaseSpec::new(DecodeDtypes::Bf16, 16, 16, 1, vec![100]),
        &mut rng,
    );
    let d = DeviceCase::upload(&stream, &h).unwrap();
    let mut ws = harness::workspace_for(&stream, &h).unwrap();
    ws.set_splits(&stream, &[1]).unwrap();
    let mut req = d.request(&stream, &h);
    req.q.shape[2] = 129;
    let e = rt.decode(&stream, &req, &ws).unwrap_err();
    assert!(matches!(e, MlaError::InvalidShape { .. }), "{e}");
    let mut req = d.request(&stream, &h);
    req.q.ptr += 2;
    let e = rt.decode(&stream, &req, &ws).unwrap_err();
    assert!(matches!(e, MlaError::Misaligned { .. }), "{e}");
    assert!(ws.set_splits(&stream, &[MAX_SPLITS as i32 + 1]).is_err());
    assert!(ws.set_splits(&stream, &[-1]).is_err());
    // The wgmma tile: fp16 is refused on every backend (and bf16 off sm_90a), as a typed
    // error before any launch.
    let h16 = HostCase::random(
        &CaseSpec::new(DecodeDtypes::Fp16, 16, 16, 1, vec![100]),
        &mut rng,
    );
    let d16 = DeviceCase::upload(&stream, &h16).unwrap();
    let req16 = d16.request(&stream, &h16);
    let e = rt
        .decode_tiled(&stream, &req16, &ws, Tile::Wg64N64)
        .unwrap_err();
    assert!(
        matches!(e, MlaError::Unsupported { what: "tile", .. }),
        "{e}"
    );
    let req = d.request(&stream, &h);
    let wg = rt.decode_tiled(&stream, &req, &ws, Tile::Wg64N64);
    if rt.backend() == mla::gate::Backend::Sm90a {
        wg.unwrap();
        stream.synchronize().unwrap();
    } else {
        let e = wg.unwrap_err();
        assert!(
            matches!(e, MlaError::Unsupported { what: "tile", .. }),
            "{e}"
        );
    }
}
