//! The f64 oracle against an independent dense formula, and its properties: page-table
//! permutation invariance, split invariance (including chunks with no visible key), the
//! exact combine, and the comparison rule the GPU tests use.
//!
//! Every test draws fresh data and prints its seed; rerun one with the printed seed by
//! replacing `fresh_seed()` locally.

use mla_abi::decode_tile::BLOCK_N;
use mla_abi::{D_QK, D_V, ElemType};
use mla_dev::numeric::{e4m3_from_f32, e4m3_to_f32};
use mla_dev::oracle::{
    self, OracleInput, OracleOutput, chunk_range, combine, compare, decode, decode_emulated,
    decode_partial, decode_split,
};
use mla_dev::rng::SplitMix64;

/// One decode step's data, laid out as the oracle reads it.
struct Case {
    s_q: usize,
    heads: usize,
    page_size: usize,
    seq_lens: Vec<i32>,
    q: Vec<f32>,
    kv: Vec<f32>,
    page_table: Vec<i32>,
    max_pages: usize,
    softmax_scale: f64,
    output_scale: f64,
    q_scale: f64,
    kv_scale: f64,
}

impl Case {
    fn batch(&self) -> usize {
        self.seq_lens.len()
    }

    fn input(&self) -> OracleInput<'_> {
        OracleInput {
            batch: self.batch(),
            s_q: self.s_q,
            heads: self.heads,
            page_size: self.page_size,
            q: &self.q,
            kv_cache: &self.kv,
            page_table: &self.page_table,
            max_pages: self.max_pages,
            seq_lens: &self.seq_lens,
            softmax_scale: self.softmax_scale,
            output_scale: self.output_scale,
            q_scale: self.q_scale,
            kv_scale: self.kv_scale,
        }
    }
}

/// A random case. Pages are handed out in a shuffled order with spare pages in between,
/// cache slots past each length hold NaN and unused table entries hold an invalid page
/// id, so reading anything outside the visible rows shows up as NaN or a panic.
///
/// `fp8_like`: stored values are e4m3 values with scales != 1 (as an fp8 cache holds
/// them); otherwise they are plain values with scale 1.
fn make_case(
    rng: &mut SplitMix64,
    s_q: usize,
    heads: usize,
    page_size: usize,
    lens: &[usize],
    fp8_like: bool,
) -> Case {
    let batch = lens.len();
    let pages_of: Vec<usize> = lens.iter().map(|&l| l.div_ceil(page_size)).collect();
    let max_pages = pages_of.iter().copied().max().unwrap_or(0) + 1;
    let used: usize = pages_of.iter().sum();
    let num_pages = used + 3;
    let order = rng.permutation(num_pages);

    let mut page_table = vec![i32::MAX; batch * max_pages];
    let mut kv = vec![f32::NAN; num_pages * page_size * D_QK];
    let (q_scale, kv_scale) = if fp8_like {
        (0.125, 0.0625)
    } else {
        (1.0, 1.0)
    };
    let stored = |rng: &mut SplitMix64, scale: f64| -> f32 {
        let x = (rng.normal() / scale) as f32;
        if fp8_like {
            e4m3_to_f32(e4m3_from_f32(x))
        } else {
            x
        }
    };

    let mut next = 0;
    for (b, &len) in lens.iter().enumerate() {
        for p in 0..pages_of[b] {
            let page = order[next];
            next += 1;
            page_table[b * max_pages + p] = page as i32;
            for slot in 0..page_size {
                if p * page_size + slot >= len {
                    break;
                }
                let row = (page * page_size + slot) * D_QK;
                for d in 0..D_QK {
                    kv[row + d] = stored(rng, kv_scale);
                }
            }
        }
    }
    let q = (0..batch * s_q * heads * D_QK)
        .map(|_| stored(rng, q_scale))
        .collect();
    Case {
        s_q,
        heads,
        page_size,
        seq_lens: lens.iter().map(|&l| l as i32).collect(),
        q,
        kv,
        page_table,
        max_pages,
        softmax_scale: 1.0 / (D_QK as f64).sqrt() * rng.uniform(0.5, 2.0),
        output_scale: rng.uniform(0.25, 3.0),
        q_scale,
        kv_scale,
    }
}

/// The textbook formula, written apart from the oracle: gather a sequence's rows into a
/// dense `[L, D_QK]` matrix, form the whole `[s_q * heads, L]` logit matrix with the
/// scales folded into one factor, mask the causal tail with `-inf`, softmax, multiply.
fn dense_reference(c: &Case) -> OracleOutput {
    let rows = c.s_q * c.heads;
    let mut out = Vec::new();
    let mut lse = Vec::new();
    let logit_scale = c.softmax_scale * c.q_scale * c.kv_scale;
    for b in 0..c.batch() {
        let len = c.seq_lens[b] as usize;
        let mut keys = Vec::with_capacity(len * D_QK);
        for j in 0..len {
            let page = c.page_table[b * c.max_pages + j / c.page_size] as usize;
            let start = (page * c.page_size + j % c.page_size) * D_QK;
            keys.extend(c.kv[start..start + D_QK].iter().map(|&x| x as f64));
        }
        let mut logits = vec![0.0f64; rows * len];
        for t in 0..c.s_q {
            for h in 0..c.heads {
                let r = t * c.heads + h;
                let q0 = ((b * c.s_q + t) * c.heads + h) * D_QK;
                let q = &c.q[q0..q0 + D_QK];
                for j in 0..len {
                    let k = &keys[j * D_QK..(j + 1) * D_QK];
                    let mut s = 0.0;
                    for d in 0..D_QK {
                        s += q[d] as f64 * k[d];
                    }
                    let causal_ok = j + c.s_q <= len + t;
                    logits[r * len + j] = if causal_ok {
                        logit_scale * s
                    } else {
                        f64::NEG_INFINITY
                    };
                }
            }
        }
        for r in 0..rows {
            let row = &logits[r * len..(r + 1) * len];
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = row.iter().map(|&s| (s - m).exp()).collect();
            let z: f64 = e.iter().sum();
            lse.push(m + z.ln());
            for d in 0..D_V {
                let mut acc = 0.0;
                for j in 0..len {
                    acc += e[j] / z * keys[j * D_QK + d];
                }
                out.push(c.output_scale * c.kv_scale * acc);
            }
        }
    }
    OracleOutput { out, lse }
}

/// Largest `|a - b|`, with NaN anywhere counting as infinite.
fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            if x == y {
                0.0
            } else {
                let d = (x - y).abs();
                if d.is_nan() { f64::INFINITY } else { d }
            }
        })
        .fold(0.0, f64::max)
}

fn max_abs(a: &[f64]) -> f64 {
    a.iter().map(|x| x.abs()).fold(0.0, f64::max)
}

/// Lengths that stress the paging: `s_q` itself, page boundaries +- 1, and a random one.
fn boundary_lengths(rng: &mut SplitMix64, s_q: usize, page_size: usize) -> Vec<usize> {
    let p = page_size;
    let mut lens = vec![s_q, p.saturating_sub(1), p, p + 1, 2 * p - 1, 2 * p + 1];
    lens.push(rng.range(1, 160));
    lens.retain(|&l| l >= s_q && l >= 1);
    lens.dedup();
    lens
}

#[test]
fn matches_dense_formula() {
    let seed = SplitMix64::fresh_seed();
    eprintln!("seed = {seed}");
    let mut rng = SplitMix64::new(seed);
    let mut cases = 0;
    for page_size in [1, 16, 64] {
        for heads in [1, 3, 16] {
            for s_q in [1, 2, 4] {
                let lens = boundary_lengths(&mut rng, s_q, page_size);
                let fp8_like = cases % 2 == 1;
                let c = make_case(&mut rng, s_q, heads, page_size, &lens, fp8_like);
                let got = decode(&c.input());
                let want = dense_reference(&c);
                let tol = 1e-12 * max_abs(&want.out).max(1.0);
                let what =
                    format!("P={page_size} H={heads} s_q={s_q} lens={lens:?} fp8={fp8_like}");
                assert!(
                    got.out.iter().all(|x| x.is_finite()),
                    "{what}: non-finite out"
                );
                let d_out = max_diff(&got.out, &want.out);
                assert!(
                    d_out <= tol,
                    "{what}: out differs by {d_out:e} (tol {tol:e})"
                );
                let d_lse = max_diff(&got.lse, &want.lse);
                assert!(
                    d_lse <= 1e-12 * max_abs(&want.lse).max(1.0),
                    "{what}: lse differs by {d_lse:e}"
                );
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 27);
}

#[test]
fn single_key_row_is_that_value() {
    // L = s_q = 1: the only key gets probability 1, so out = output_scale * v and
    // lse = the one logit. A check that needs no second implementation.
    let seed = SplitMix64::fresh_seed();
    eprintln!("seed = {seed}");
    let mut rng = SplitMix64::new(seed);
    let c = make_case(&mut rng, 1, 2, 16, &[1], false);
    let got = decode(&c.input());
    let page = c.page_table[0] as usize;
    let k = &c.kv[page * 16 * D_QK..][..D_QK];
    for h in 0..2 {
        let q = &c.q[h * D_QK..(h + 1) * D_QK];
        let s: f64 = q.iter().zip(k).map(|(&a, &b)| a as f64 * b as f64).sum();
        assert!((got.lse[h] - c.softmax_scale * s).abs() < 1e-12);
        let out_h = &got.out[h * D_V..(h + 1) * D_V];
        for (d, (&o, &v)) in out_h.iter().zip(&k[..D_V]).enumerate() {
            let want = c.output_scale * v as f64;
            assert!((o - want).abs() < 1e-12, "h={h} d={d}");
        }
    }
}

#[test]
fn page_table_permutation_invariance() {
    let seed = SplitMix64::fresh_seed();
    eprintln!("seed = {seed}");
    let mut rng = SplitMix64::new(seed);
    for page_size in [1, 16, 64] {
        let lens = [1, 77, 200, page_size * 3 + 1, 129];
        let mut c = make_case(&mut rng, 2, 3, page_size, &lens, true);
        // Prefix sharing: sequence 4 reuses sequence 2's first page.
        c.page_table[4 * c.max_pages] = c.page_table[2 * c.max_pages];
        let before = decode(&c.input());

        let num_pages = c.kv.len() / (page_size * D_QK);
        let perm = rng.permutation(num_pages);
        let page_elems = page_size * D_QK;
        let mut moved = vec![f32::NAN; c.kv.len()];
        for (old, &new) in perm.iter().enumerate() {
            moved[new * page_elems..(new + 1) * page_elems]
                .copy_from_slice(&c.kv[old * page_elems..(old + 1) * page_elems]);
        }
        c.kv = moved;
        for e in c.page_table.iter_mut() {
            if let Some(&p) = usize::try_from(*e).ok().and_then(|i| perm.get(i)) {
                *e = p as i32;
            }
        }
        let after = decode(&c.input());
        let d = max_diff(&before.out, &after.out).max(max_diff(&before.lse, &after.lse));
        assert!(
            d <= 1e-12,
            "P={page_size}: permuted pages changed the result by {d:e}"
        );
    }
}

#[test]
fn chunk_range_rule() {
    assert_eq!(chunk_range(130, 2, 0), 0..2 * BLOCK_N);
    assert_eq!(chunk_range(130, 2, 1), 2 * BLOCK_N..130);
    assert_eq!(chunk_range(10, 3, 0), 0..10);
    assert!(chunk_range(10, 3, 1).is_empty());
    assert!(chunk_range(10, 3, 2).is_empty());
    assert!(chunk_range(0, 1, 0).is_empty());
    for len in [1, 63, 64, 65, 127, 128, 129, 1000, 4097] {
        for splits in [1, 2, 3, 7, 64] {
            let mut next = 0;
            for i in 0..splits {
                let r = chunk_range(len, splits, i);
                if r.is_empty() {
                    continue;
                }
                assert_eq!(r.start, next, "len={len} splits={splits} i={i}: gap");
                assert_eq!(r.start % BLOCK_N, 0);
                next = r.end;
            }
            assert_eq!(next, len, "len={len} splits={splits}: not covered");
        }
    }
}

#[test]
fn split_invariance() {
    let seed = SplitMix64::fresh_seed();
    eprintln!("seed = {seed}");
    let mut rng = SplitMix64::new(seed);
    for s_q in [1, 4] {
        // Short sequences have fewer blocks than splits (empty chunks); 65 with s_q = 4
        // leaves the last one-key chunk invisible to the first query tokens.
        let lens = [s_q, 40, 64, 65, 129, rng.range(200, 400)];
        let c = make_case(&mut rng, s_q, 3, 16, &lens, s_q == 4);
        let inp = c.input();
        let whole = decode(&inp);
        let batch = lens.len();
        let mixed: Vec<usize> = (0..batch).map(|_| rng.range(1, 64)).collect();
        for splits in [vec![1; batch], vec![3; batch], vec![64; batch], mixed] {
            let got = decode_split(&inp, &splits);
            let d_out = max_diff(&got.out, &whole.out);
            let d_lse = max_diff(&got.lse, &whole.lse);
            assert!(
                d_out <= 1e-10 && d_lse <= 1e-10,
                "s_q={s_q} splits={splits:?}: out {d_out:e}, lse {d_lse:e}"
            );
        }
        assert!(
            chunk_range(40, 64, 1).is_empty(),
            "the case must have empty chunks"
        );
    }
}

#[test]
fn partial_with_no_visible_key() {
    let seed = SplitMix64::fresh_seed();
    eprintln!("seed = {seed}");
    let mut rng = SplitMix64::new(seed);
    let (s_q, heads) = (4, 2);
    let c = make_case(&mut rng, s_q, heads, 16, &[65], false);
    let inp = c.input();
    // Token t sees 0..62 + t; the chunk 64..65 is visible only to the last token.
    let (o, lse) = decode_partial(&inp, 0, 64..65);
    for t in 0..s_q {
        for h in 0..heads {
            let r = t * heads + h;
            let o_r = &o[r * D_V..(r + 1) * D_V];
            if t < 3 {
                assert_eq!(lse[r], f64::NEG_INFINITY, "t={t} h={h}");
                assert!(o_r.iter().all(|&x| x == 0.0), "t={t} h={h}: o not zero");
            } else {
                assert!(lse[r].is_finite(), "t={t} h={h}");
                assert!(o_r.iter().any(|&x| x != 0.0));
            }
        }
    }
    // An empty chunk past the end: every row empty.
    let (o, lse) = decode_partial(&inp, 0, 128..192);
    assert!(lse.iter().all(|&l| l == f64::NEG_INFINITY));
    assert!(o.iter().all(|&x| x == 0.0));
    // Combining the empty partial with the whole changes nothing.
    let (o_all, lse_all) = decode_partial(&inp, 0, 0..65);
    let (o_c, lse_c) = combine(&[(o.clone(), lse.clone()), (o_all.clone(), lse_all.clone())]);
    assert_eq!(max_diff(&o_c, &o_all), 0.0);
    assert_eq!(max_diff(&lse_c, &lse_all), 0.0);
}

#[test]
fn combine_exact_and_all_neg_inf() {
    let n = 3;
    let ninf = f64::NEG_INFINITY;
    let fill = |vals: [f64; 3]| -> Vec<f64> {
        vals.iter()
            .flat_map(|&v| std::iter::repeat_n(v, D_V))
            .collect()
    };
    // Row 0: weights 2/8 and 6/8. Row 1: every part empty (its o deliberately NaN, which
    // must not leak). Row 2: only the second part saw keys.
    let a = (fill([1.0, f64::NAN, f64::NAN]), vec![2f64.ln(), ninf, ninf]);
    let b = (fill([5.0, f64::NAN, -7.0]), vec![6f64.ln(), ninf, 0.5]);
    let (o, lse) = combine(&[a, b]);
    assert_eq!(o.len(), n * D_V);
    assert!((lse[0] - 8f64.ln()).abs() < 1e-15);
    assert!(
        o[..D_V].iter().all(|&x| (x - 4.0).abs() < 1e-14),
        "row 0: {}",
        o[0]
    );
    assert_eq!(lse[1], ninf);
    assert!(
        o[D_V..2 * D_V].iter().all(|&x| x == 0.0),
        "row 1 must be zeros"
    );
    assert!((lse[2] - 0.5).abs() < 1e-15);
    assert!(o[2 * D_V..].iter().all(|&x| (x + 7.0).abs() < 1e-14));
    assert!(o.iter().all(|x| !x.is_nan()));

    // Every part empty in every row.
    let empty = (vec![0.0; n * D_V], vec![ninf; n]);
    let (o, lse) = combine(&[empty.clone(), empty.clone(), empty]);
    assert!(lse.iter().all(|&l| l == ninf));
    assert!(o.iter().all(|&x| x == 0.0));
}

#[test]
fn emulated_reference_is_close_but_not_equal() {
    let seed = SplitMix64::fresh_seed();
    eprintln!("seed = {seed}");
    let mut rng = SplitMix64::new(seed);
    let c = make_case(&mut rng, 2, 4, 16, &[37, 300], false);
    let inp = c.input();
    let exact = decode(&inp);
    let scale = max_abs(&exact.out);
    for ty in [ElemType::Bf16, ElemType::Fp16] {
        let emu = decode_emulated(&inp, ty, ty);
        let d = max_diff(&emu.out, &exact.out);
        // bf16 keeps 8 significant bits, fp16 11: the error is a few units of the last
        // place of the output, never zero and never large.
        assert!(d > 0.0, "{}: emulation changed nothing", ty.name());
        assert!(
            d < 2e-2 * scale,
            "{}: emulation error {d:e} too large",
            ty.name()
        );
        assert_eq!(max_diff(&emu.lse, &exact.lse), 0.0, "lse is not rounded");
        // The output is representable in the output type.
        for &x in &emu.out {
            assert_eq!(mla_dev::numeric::round_to(ty, x), x);
        }
    }
    // Each rounding on its own: f32 everywhere is within f32 rounding of the exact
    // result; rounding only the probabilities to bf16 costs far more than that.
    let f32_only = decode_emulated(&inp, ElemType::F32, ElemType::F32);
    let d_f32 = max_diff(&f32_only.out, &exact.out);
    assert!(d_f32 <= 1e-6 * scale, "f32 emulation error {d_f32:e}");
    let p_only = decode_emulated(&inp, ElemType::Bf16, ElemType::F32);
    let d_p = max_diff(&p_only.out, &exact.out);
    assert!(
        d_p > 1e-5 * scale,
        "bf16 probabilities changed too little: {d_p:e}"
    );
}

#[test]
fn compare_catches_nan_and_error_and_passes_emulated() {
    let seed = SplitMix64::fresh_seed();
    eprintln!("seed = {seed}");
    let mut rng = SplitMix64::new(seed);
    let c = make_case(&mut rng, 1, 3, 16, &[50, 99], false);
    let inp = c.input();
    let reference = decode(&inp).out;
    let emulated = decode_emulated(&inp, ElemType::Bf16, ElemType::Bf16).out;
    let as_f32 = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();

    // The emulated reference itself passes.
    let good = as_f32(&emulated);
    let cmp = compare(&good, &reference, &emulated, 1e-6);
    assert!(cmp.ok, "{cmp}");
    assert!(cmp.emulated_err > 0.0 && cmp.max_abs_err > 0.0);
    assert!(cmp.nan_mismatch.is_none());

    // A planted NaN.
    let k = rng.range(0, good.len() - 1);
    let mut bad = good.clone();
    bad[k] = f32::NAN;
    let cmp = compare(&bad, &reference, &emulated, 1e-6);
    assert!(!cmp.ok, "NaN not caught: {cmp}");
    assert_eq!(cmp.nan_mismatch, Some(k));
    assert!(cmp.to_string().contains(&format!("[{k}]")), "{cmp}");

    // A planted inf.
    let mut bad = good.clone();
    bad[k] = f32::NEG_INFINITY;
    assert_eq!(
        compare(&bad, &reference, &emulated, 1e-6).nan_mismatch,
        Some(k)
    );

    // A planted error a few times the allowance.
    let allowed = compare(&good, &reference, &emulated, 1e-6).allowed;
    let mut bad = good.clone();
    bad[k] += (4.0 * allowed) as f32;
    let cmp = compare(&bad, &reference, &emulated, 1e-6);
    assert!(!cmp.ok, "error not caught: {cmp}");
    assert_eq!(cmp.worst_index, k);
    assert!(cmp.nan_mismatch.is_none());
    assert!(cmp.to_string().starts_with("FAIL"), "{cmp}");

    // NaN in the reference where the kernel is finite; matching NaN and inf are fine.
    let cmp = compare(&[1.0, 2.0], &[1.0, f64::NAN], &[1.0, f64::NAN], 1e-6);
    assert_eq!(cmp.nan_mismatch, Some(1));
    let cmp = compare(
        &[f32::NAN, f32::INFINITY, 1.0],
        &[f64::NAN, f64::INFINITY, 1.0],
        &[f64::NAN, f64::INFINITY, 1.0],
        1e-6,
    );
    assert!(cmp.ok, "{cmp}");
    let cmp = compare(
        &[f32::NEG_INFINITY],
        &[f64::INFINITY],
        &[f64::INFINITY],
        1e-6,
    );
    assert!(!cmp.ok, "inf sign mismatch not caught");

    // The floor: with emulated == reference, only atol_floor * max(1, max|ref|) is allowed.
    let cmp = compare(&[10.0, 0.0], &[10.0, 0.0], &[10.0, 0.0], 1e-3);
    assert!((cmp.allowed - 1e-2).abs() < 1e-15);
    assert!(compare(&[10.0, 0.009], &[10.0, 0.0], &[10.0, 0.0], 1e-3).ok);
    assert!(!compare(&[10.0, 0.011], &[10.0, 0.0], &[10.0, 0.0], 1e-3).ok);
}

#[test]
#[should_panic(expected = "page table entry")]
fn invalid_page_in_range_panics() {
    let mut rng = SplitMix64::new(7);
    let mut c = make_case(&mut rng, 1, 1, 16, &[20], false);
    c.page_table[1] = 1 << 20;
    let _ = oracle::decode(&c.input());
}
