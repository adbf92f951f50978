//! The naive f64 CPU reference of MLA decode (the math of MLA.md section 1), and the
//! comparison rule the GPU tests judge kernels by.
//!
//! Written for clarity, not speed: every logit is a plain f64 dot product of the
//! dequantised query and key, the softmax is a two-pass max-subtracted one. Two choices
//! keep long sequences affordable without changing any result: per query token, one KV
//! row is converted once and dotted with all heads' queries, and sequences run on
//! separate threads (each sequence's arithmetic is the same whatever the thread count).
//!
//! Layouts (row-major): `q` `[batch, s_q, heads, D_QK]`, `kv_cache`
//! `[num_pages, page_size, D_QK]`, `page_table` `[batch, max_pages]`, `out`
//! `[batch, s_q, heads, D_V]`, `lse` `[batch, s_q, heads]`.

use std::fmt;
use std::ops::Range;
use std::sync::{Mutex, PoisonError};

use mla_abi::{D_QK, D_V, ElemType};

use crate::numeric::round_to;

/// One decode step's inputs, with every element already decoded to f32 (fp8 codes as
/// their e4m3 values, not yet multiplied by their scales).
#[derive(Clone, Copy, Debug)]
pub struct OracleInput<'a> {
    pub batch: usize,
    pub s_q: usize,
    pub heads: usize,
    pub page_size: usize,
    /// `[batch, s_q, heads, D_QK]` values as stored (fp8 codes decoded, not yet scaled).
    pub q: &'a [f32],
    /// `[num_pages, page_size, D_QK]` values as stored (keys: all 576; values: first 512).
    pub kv_cache: &'a [f32],
    /// `[batch, max_pages]` physical page ids, row-major.
    pub page_table: &'a [i32],
    pub max_pages: usize,
    /// `[batch]` KV lengths including this step's `s_q` tokens.
    pub seq_lens: &'a [i32],
    /// Multiplies `dot(q, k)` of the dequantised q and k (so it excludes the fp8 scales).
    pub softmax_scale: f64,
    /// Multiplies the final output.
    pub output_scale: f64,
    /// Dequantisation: `q = stored * q_scale`, `k = v = stored * kv_scale` (1 for 16-bit).
    pub q_scale: f64,
    pub kv_scale: f64,
}

/// The oracle's result.
#[derive(Clone, Debug, PartialEq)]
pub struct OracleOutput {
    /// `[batch, s_q, heads, D_V]`
    pub out: Vec<f64>,
    /// `[batch, s_q, heads]`, natural log; `-inf` for a row that sees no key.
    pub lse: Vec<f64>,
}

impl OracleInput<'_> {
    /// Query rows of one sequence: `s_q * heads`.
    fn rows_per_seq(&self) -> usize {
        self.s_q * self.heads
    }

    /// Number of physical pages the cache holds.
    fn num_pages(&self) -> usize {
        self.kv_cache.len() / (self.page_size * D_QK)
    }

    /// KV length of sequence `b` (a negative length counts as 0).
    fn seq_len(&self, b: usize) -> usize {
        usize::try_from(self.seq_lens[b]).unwrap_or(0)
    }

    /// KV positions query token `t` of sequence `b` sees: `0 .. L - s_q + t + 1`
    /// (none if the sequence is shorter than its own query tokens).
    fn visible(&self, b: usize, t: usize) -> usize {
        (self.seq_len(b) + t + 1).saturating_sub(self.s_q)
    }

    /// The stored query of `(b, t, h)`, `D_QK` values.
    fn q_row(&self, b: usize, t: usize, h: usize) -> &[f32] {
        let row = (b * self.s_q + t) * self.heads + h;
        &self.q[row * D_QK..(row + 1) * D_QK]
    }

    /// The stored KV row of position `j` of sequence `b`, `D_QK` values.
    ///
    /// # Panics
    /// If the page-table entry for `j` is not a page of the cache: the oracle defines the
    /// math only for well-formed inputs.
    fn kv_row(&self, b: usize, j: usize) -> &[f32] {
        let slot = b * self.max_pages + j / self.page_size;
        let page = self.page_table[slot];
        let num_pages = self.num_pages();
        let page = match usize::try_from(page) {
            Ok(p) if p < num_pages => p,
            _ => panic!(
                "oracle: sequence {b} position {j}: page table entry {page} is not one of \
                 the cache's {num_pages} pages"
            ),
        };
        let row = page * self.page_size + j % self.page_size;
        &self.kv_cache[row * D_QK..(row + 1) * D_QK]
    }

    /// Shape checks, with messages naming the field.
    fn check(&self) {
        assert!(self.page_size > 0, "oracle: page_size is 0");
        assert_eq!(
            self.q.len(),
            self.batch * self.rows_per_seq() * D_QK,
            "oracle: q must be [batch, s_q, heads, D_QK]"
        );
        assert_eq!(
            self.kv_cache.len() % (self.page_size * D_QK),
            0,
            "oracle: kv_cache must be [num_pages, page_size, D_QK]"
        );
        assert_eq!(
            self.seq_lens.len(),
            self.batch,
            "oracle: seq_lens must be [batch]"
        );
        assert!(
            self.page_table.len() >= self.batch * self.max_pages,
            "oracle: page_table must be [batch, max_pages]"
        );
        for b in 0..self.batch {
            let pages = self.seq_len(b).div_ceil(self.page_size);
            assert!(
                pages <= self.max_pages,
                "oracle: sequence {b} of length {} needs {pages} pages, the table has {}",
                self.seq_lens[b],
                self.max_pages
            );
        }
    }
}

/// Reused buffers of one thread.
#[derive(Default)]
struct Scratch {
    /// [heads, D_QK] dequantised queries of one token.
    q: Vec<f64>,
    /// [D_QK] one dequantised KV row.
    kv: Vec<f64>,
    /// [keys, heads] logits of one token, key-major.
    logits: Vec<f64>,
    /// [heads] row maxima and normalisers.
    max: Vec<f64>,
    sum: Vec<f64>,
}

/// All heads of query token `t` of sequence `b` attending over the KV positions `keys`
/// (already clipped to what the token sees). Writes `o` (`[heads, D_V]`, normalised over
/// `keys`) and `lse` (`[heads]`); with no keys `o = 0` and `lse = -inf`.
///
/// With `p_round`, each `exp(s_j - max)` is rounded to that type before it multiplies
/// the value (the normaliser keeps the unrounded sum), as the tensor-core kernels do.
#[allow(clippy::too_many_arguments)]
fn attend(
    inp: &OracleInput,
    b: usize,
    t: usize,
    keys: Range<usize>,
    p_round: Option<ElemType>,
    s: &mut Scratch,
    o: &mut [f64],
    lse: &mut [f64],
) {
    let heads = inp.heads;
    o.fill(0.0);
    if keys.is_empty() {
        lse.fill(f64::NEG_INFINITY);
        return;
    }
    let Scratch {
        q,
        kv,
        logits,
        max,
        sum,
    } = s;

    // Dequantised queries and one row of dequantised KV at a time.
    q.clear();
    for h in 0..heads {
        q.extend(
            inp.q_row(b, t, h)
                .iter()
                .map(|&x| f64::from(x) * inp.q_scale),
        );
    }
    let load_kv = |kv: &mut Vec<f64>, j: usize| {
        kv.clear();
        kv.extend(
            inp.kv_row(b, j)
                .iter()
                .map(|&x| f64::from(x) * inp.kv_scale),
        );
    };

    // Pass 1: s_j = softmax_scale * q . k_j for every head, and each head's maximum. The
    // e4m3 emulation raises each logit by its accumulation budget (`FP8_MMA_LOGIT_ERR` of
    // softmax_scale * sum |q_i k_i|): the tolerance then covers the tensor cores' fp8 sums.
    let fp8_mma = p_round == Some(ElemType::Fp8E4m3);
    logits.clear();
    for j in keys.clone() {
        load_kv(kv, j);
        for q_h in q.chunks_exact(D_QK) {
            let mut x = inp.softmax_scale * dot(q_h, kv);
            if fp8_mma {
                x += FP8_MMA_LOGIT_ERR * inp.softmax_scale * dot_abs(q_h, kv);
            }
            logits.push(x);
        }
    }
    max.clear();
    max.resize(heads, f64::NEG_INFINITY);
    for row in logits.chunks_exact(heads) {
        for (m, &x) in max.iter_mut().zip(row) {
            *m = m.max(x);
        }
    }

    // Pass 2: p_j = exp(s_j - max); o += p_j * v_j; sum += p_j.
    sum.clear();
    sum.resize(heads, 0.0);
    for (j, row) in keys.zip(logits.chunks_exact(heads)) {
        load_kv(kv, j);
        let v = &kv[..D_V];
        for h in 0..heads {
            let p = (row[h] - max[h]).exp();
            sum[h] += p;
            let p_mul = p_round.map_or(p, |ty| round_p(ty, p));
            axpy(p_mul, v, &mut o[h * D_V..(h + 1) * D_V]);
        }
    }

    for h in 0..heads {
        for x in &mut o[h * D_V..(h + 1) * D_V] {
            *x /= sum[h];
        }
        lse[h] = max[h] + sum[h].ln();
    }
}

// `dot` and `axpy` are plain indexed loops rather than iterator chains: the GPU tests
// run the oracle on long sequences in unoptimised builds too, where every iterator
// adapter is a function call per element.

/// `sum_i a[i] * b[i]`, in index order.
fn dot(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = 0.0;
    let mut i = 0;
    while i < n {
        acc += a[i] * b[i];
        i += 1;
    }
    acc
}

/// `sum |a_i b_i|`.
fn dot_abs(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x * y).abs()).sum()
}

/// `y += a * x`.
fn axpy(a: f64, x: &[f64], y: &mut [f64]) {
    let n = x.len().min(y.len());
    let (x, y) = (&x[..n], &mut y[..n]);
    let mut i = 0;
    while i < n {
        y[i] += a * x[i];
        i += 1;
    }
}

/// Run `f(b, scratch, out_b, lse_b)` for every sequence, where `out_b` is
/// `[s_q, heads, D_V]` and `lse_b` `[s_q, heads]` of sequence `b`. Sequences are shared
/// among threads; each call's result does not depend on which thread ran it.
fn per_sequence<F>(inp: &OracleInput, f: F) -> OracleOutput
where
    F: Fn(usize, &mut Scratch, &mut [f64], &mut [f64]) + Sync,
{
    inp.check();
    let rows = inp.rows_per_seq();
    let mut out = vec![0.0; inp.batch * rows * D_V];
    let mut lse = vec![f64::NEG_INFINITY; inp.batch * rows];
    if rows == 0 || inp.batch == 0 {
        return OracleOutput { out, lse };
    }
    let jobs: Vec<_> = out
        .chunks_mut(rows * D_V)
        .zip(lse.chunks_mut(rows))
        .enumerate()
        .collect();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len());
    let queue = Mutex::new(jobs.into_iter());
    let worker = || {
        let mut scratch = Scratch::default();
        loop {
            let job = queue.lock().unwrap_or_else(PoisonError::into_inner).next();
            let Some((b, (out_b, lse_b))) = job else {
                break;
            };
            f(b, &mut scratch, out_b, lse_b);
        }
    };
    // One worker runs on the calling thread, so a single sequence never leaves it (and
    // its panic message, e.g. a bad page id, reaches the caller as it is).
    std::thread::scope(|scope| {
        for _ in 1..threads {
            scope.spawn(worker);
        }
        worker();
    });
    OracleOutput { out, lse }
}

/// One sequence's partial over `chunk`, each token's range clipped to what it sees.
fn partial_into(
    inp: &OracleInput,
    b: usize,
    chunk: &Range<usize>,
    p_round: Option<ElemType>,
    s: &mut Scratch,
    o: &mut [f64],
    lse: &mut [f64],
) {
    let heads = inp.heads;
    for t in 0..inp.s_q {
        let visible = inp.visible(b, t);
        let keys = chunk.start.min(visible)..chunk.end.min(visible);
        let o_t = &mut o[t * heads * D_V..(t + 1) * heads * D_V];
        let lse_t = &mut lse[t * heads..(t + 1) * heads];
        attend(inp, b, t, keys, p_round, s, o_t, lse_t);
    }
}

/// MLA decode in f64, exactly as MLA.md section 1 defines it.
pub fn decode(inp: &OracleInput) -> OracleOutput {
    per_sequence(inp, |b, s, out_b, lse_b| {
        partial_into(inp, b, &(0..inp.seq_len(b)), None, s, out_b, lse_b);
        for x in out_b.iter_mut() {
            *x *= inp.output_scale;
        }
    })
}

/// One split-KV partial of sequence `b`: attention over the KV positions in `chunk`,
/// each query token's range cut to the positions it sees. Returns `(o, lse)` with `o`
/// `[s_q, heads, D_V]` normalised over the chunk's own keys and `lse` `[s_q, heads]`;
/// a row that sees no key of the chunk gets `o = 0` and `lse = -inf`.
///
/// `output_scale` is not applied (partials are combined first).
pub fn decode_partial(inp: &OracleInput, b: usize, chunk: Range<usize>) -> (Vec<f64>, Vec<f64>) {
    inp.check();
    let rows = inp.rows_per_seq();
    let mut o = vec![0.0; rows * D_V];
    let mut lse = vec![f64::NEG_INFINITY; rows];
    let mut s = Scratch::default();
    partial_into(inp, b, &chunk, None, &mut s, &mut o, &mut lse);
    (o, lse)
}

/// The exact merge of split partials. `parts` holds one `(o [n, D_V], lse [n])` per
/// split; per row `lse = ln(sum_i exp(lse_i))` and `o = sum_i exp(lse_i - lse) * o_i`.
/// A part with `lse_i = -inf` contributes nothing (whatever its `o`); a row whose parts
/// are all `-inf` comes out as zeros and `-inf`, never NaN.
///
/// # Panics
/// If the parts disagree on `n` or an `o` is not `n * D_V` long.
pub fn combine(parts: &[(Vec<f64>, Vec<f64>)]) -> (Vec<f64>, Vec<f64>) {
    let n = parts.first().map_or(0, |(_, lse)| lse.len());
    for (i, (o, lse)) in parts.iter().enumerate() {
        assert_eq!(
            lse.len(),
            n,
            "combine: part {i} has {} rows, part 0 {n}",
            lse.len()
        );
        assert_eq!(o.len(), n * D_V, "combine: part {i}: o must be [{n}, D_V]");
    }
    let mut out = vec![0.0; n * D_V];
    let mut lse = vec![f64::NEG_INFINITY; n];
    for r in 0..n {
        // NaN-propagating maximum: a NaN part makes the row NaN rather than vanish.
        let max = parts
            .iter()
            .map(|(_, l)| l[r])
            .fold(
                f64::NEG_INFINITY,
                |m, x| if x.is_nan() || x > m { x } else { m },
            );
        if max == f64::NEG_INFINITY {
            continue; // no part saw a key: zeros and -inf
        }
        let sum: f64 = parts.iter().map(|(_, l)| (l[r] - max).exp()).sum();
        let total = max + sum.ln();
        lse[r] = total;
        let o_r = &mut out[r * D_V..(r + 1) * D_V];
        for (o_i, l) in parts {
            let w = (l[r] - total).exp();
            if w != 0.0 {
                axpy(w, &o_i[r * D_V..(r + 1) * D_V], o_r);
            }
        }
    }
    (out, lse)
}

/// The kernels' chunk rule (one definition: [`mla_abi::chunk_blocks`], in tokens).
pub use mla::plan::chunk_range;

/// [`decode`] computed the split-KV way: sequence `b` cut into `splits[b]` chunks by
/// [`chunk_range`], one [`decode_partial`] per chunk, [`combine`]d, and `output_scale`
/// applied after the combine. Equal to [`decode`] up to rounding.
///
/// # Panics
/// If `splits.len() != batch`.
pub fn decode_split(inp: &OracleInput, splits: &[usize]) -> OracleOutput {
    assert_eq!(
        splits.len(),
        inp.batch,
        "decode_split: splits must be [batch]"
    );
    let rows = inp.rows_per_seq();
    per_sequence(inp, |b, s, out_b, lse_b| {
        let len = inp.seq_len(b);
        let parts: Vec<(Vec<f64>, Vec<f64>)> = (0..splits[b].max(1))
            .map(|i| {
                let mut o = vec![0.0; rows * D_V];
                let mut l = vec![f64::NEG_INFINITY; rows];
                partial_into(
                    inp,
                    b,
                    &chunk_range(len, splits[b], i),
                    None,
                    s,
                    &mut o,
                    &mut l,
                );
                (o, l)
            })
            .collect();
        let (o, l) = combine(&parts);
        for (dst, x) in out_b.iter_mut().zip(&o) {
            *dst = inp.output_scale * x;
        }
        lse_b.copy_from_slice(&l);
    })
}

/// The error budget of a logit from the e4m3 tensor cores, relative to its magnitude
/// `softmax_scale * sum |q_i k_i|`. Their fp8 products are summed with about 13 bits below
/// the largest addend's exponent (the sums are not f32-exact), over a row's 18 `k32` steps
/// (36 under bf16 Q, in two parts). Over long sequences the log-sum-exp averages many
/// logits' errors, and came out up to about 2^-13 of the magnitude off (1.9e-3 at
/// magnitudes near 17, across 21840 decodes of the case matrix); with a few keys it is one
/// logit's error: 2^-10.6 of the magnitude at bf16 Q, H=100, S_q=4, three visible keys
/// (1.0e-2 at 16.4; seed 179634805746812269, docs/PERF.md section 4), past the 2^-12 this
/// budget was. [`decode_emulated`] with e4m3 P raises every logit by this much, so the
/// tolerance is twice the resulting shift.
pub const FP8_MMA_LOGIT_ERR: f64 = 1.0 / 2048.0;

/// A probability `p <= 1` as a kernel feeds it to P x V in `ty`: rounded to `ty`; for fp8
/// e4m3 (an fp8 cache on the e4m3 tensor cores) quantised as `p * 2^8` (the row's max at 256, so
/// small values stay normal) and scaled back.
pub fn round_p(ty: ElemType, p: f64) -> f64 {
    if ty == ElemType::Fp8E4m3 {
        round_to(ty, p * 256.0) / 256.0
    } else {
        round_to(ty, p)
    }
}

/// The reference that rounds like a kernel, used to set tolerances: [`decode`], except
/// that each probability `exp(s_j - max)` is rounded to `p_type` (the type the kernel
/// feeds its P x V product: bf16, fp16, or e4m3 as [`round_p`] does) before it multiplies V, while the normaliser
/// sums the unrounded values, and the scaled output is rounded to `out_type`. A kernel
/// may be off the exact result by about twice what this one is (see [`compare`]).
pub fn decode_emulated(inp: &OracleInput, p_type: ElemType, out_type: ElemType) -> OracleOutput {
    per_sequence(inp, |b, s, out_b, lse_b| {
        partial_into(inp, b, &(0..inp.seq_len(b)), Some(p_type), s, out_b, lse_b);
        for x in out_b.iter_mut() {
            *x = round_to(out_type, inp.output_scale * *x);
        }
    })
}

/// A kernel result judged against the oracle.
#[derive(Clone, Debug)]
pub struct Comparison {
    /// Largest `|got - reference|` over the positions where both are finite.
    pub max_abs_err: f64,
    /// Where that error is (0 when there is no finite pair).
    pub worst_index: usize,
    /// `2 * emulated_err + atol_floor * max(1, max|reference|)`.
    pub allowed: f64,
    /// Largest `|emulated - reference|` over finite pairs.
    pub emulated_err: f64,
    /// First index where got and reference disagree on NaN/inf-ness (or inf sign).
    pub nan_mismatch: Option<usize>,
    pub ok: bool,
    /// `got` and `reference` at `worst_index`.
    pub worst_got: f64,
    pub worst_ref: f64,
    /// `got` and `reference` at `nan_mismatch`.
    pub mismatch_values: Option<(f64, f64)>,
}

/// Judge a kernel output `got` (as f32) against the f64 `reference` ([`decode`]), with
/// `emulated` ([`decode_emulated`]) setting the tolerance:
/// `allowed = 2 * max|emulated - reference| + atol_floor * max(1, max|reference|)`.
/// NaN and infinities must sit where the reference has them (infinities with the same
/// sign); the first place they do not is `nan_mismatch`, and fails the comparison.
/// `Display` gives a one-line report with the worst index and its values.
///
/// # Panics
/// If the three slices differ in length.
pub fn compare(got: &[f32], reference: &[f64], emulated: &[f64], atol_floor: f64) -> Comparison {
    assert_eq!(
        got.len(),
        reference.len(),
        "compare: got and reference lengths"
    );
    assert_eq!(
        emulated.len(),
        reference.len(),
        "compare: emulated and reference lengths"
    );

    let emulated_err = emulated
        .iter()
        .zip(reference)
        .filter(|(e, r)| e.is_finite() && r.is_finite())
        .map(|(e, r)| (e - r).abs())
        .fold(0.0, f64::max);
    let ref_max = reference
        .iter()
        .filter(|r| r.is_finite())
        .map(|r| r.abs())
        .fold(0.0, f64::max);
    let allowed = 2.0 * emulated_err + atol_floor * ref_max.max(1.0);

    let mut c = Comparison {
        max_abs_err: 0.0,
        worst_index: 0,
        allowed,
        emulated_err,
        nan_mismatch: None,
        ok: false,
        worst_got: got.first().map_or(0.0, |&g| f64::from(g)),
        worst_ref: reference.first().copied().unwrap_or(0.0),
        mismatch_values: None,
    };
    for (i, (&g, &r)) in got.iter().zip(reference).enumerate() {
        let g = f64::from(g);
        if g.is_finite() && r.is_finite() {
            let err = (g - r).abs();
            if err > c.max_abs_err {
                c.max_abs_err = err;
                c.worst_index = i;
                c.worst_got = g;
                c.worst_ref = r;
            }
        } else {
            let same = (g.is_nan() && r.is_nan()) || (g.is_infinite() && g == r);
            if !same && c.nan_mismatch.is_none() {
                c.nan_mismatch = Some(i);
                c.mismatch_values = Some((g, r));
            }
        }
    }
    c.ok = c.nan_mismatch.is_none() && c.max_abs_err <= c.allowed;
    c
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.ok { "ok" } else { "FAIL" };
        write!(
            f,
            "{verdict}: max |err| {:.3e} at [{}] (got {:.6e}, ref {:.6e}), allowed {:.3e} \
             (emulated err {:.3e})",
            self.max_abs_err,
            self.worst_index,
            self.worst_got,
            self.worst_ref,
            self.allowed,
            self.emulated_err
        )?;
        if let (Some(i), Some((g, r))) = (self.nan_mismatch, self.mismatch_values) {
            write!(f, "; NaN/inf mismatch at [{i}] (got {g}, ref {r})")?;
        }
        Ok(())
    }
}
