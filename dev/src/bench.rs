//! `mla bench`: times the decode (+ combine) with CUDA events on DeepSeek shapes, the L2
//! flushed before every call, median of the repeats; and a device-to-device copy measured
//! in the same run as the bandwidth ceiling. Inputs are random (drawn from a pooled
//! generator so that large caches upload quickly), never zeros.
//!
//! By default it launches the decode with host-chosen splits on a grid of exactly those
//! splits (`Runtime::decode_tiled`). `MLA_BENCH_PLAN=1` times the serving path instead
//! (`DecodePlan::run`: the schedule kernel, or at B <= 8 the schedule folded into the
//! decode, the decode on the plan's graph-safe grid, the combine), which is what the peers'
//! harness times through the C ABI; the two differed by up to 25% at large batch before the
//! grid went split-major (docs/PERF.md v10). With `MLA_BENCH_PLAN=1`,
//! `MLA_BENCH_CHECKED=1` makes the plan a checked one (the checked mode's cost).

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtr};
use mla::plan::WorkspaceCapacity;
use mla::tactic::{PlanSize, Tactic, Tile};
use mla::{
    DecodeDtypes, DecodeRequest, DecodeWorkspace, HostMirror, MlaError, Runtime, Scales, TensorView,
};
use mla_abi::{D_QK, D_V, ElemType, MAX_SPLITS};

use crate::numeric;
use crate::rng::SplitMix64;

/// One timed shape (uniform lengths, causal when `s_q > 1`).
#[derive(Clone, Copy, Debug)]
pub struct BenchShape {
    pub dtypes: DecodeDtypes,
    pub tile: Tile,
    pub batch: usize,
    pub len: usize,
    pub heads: usize,
    pub s_q: usize,
    /// Tokens per page ([`PAGE`] in the default grid).
    pub page: usize,
}

impl BenchShape {
    /// `bf16 wg64n64 B64 L4096 H128 S1 P64`: what `MLA_BENCH_FILTER` matches and what a
    /// trace dump's lines carry.
    pub fn label(&self) -> String {
        format!(
            "{} {} B{} L{} H{} S{} P{}",
            self.dtypes.name(),
            self.tile.name(),
            self.batch,
            self.len,
            self.heads,
            self.s_q,
            self.page
        )
    }
}

/// One result row.
#[derive(Clone, Debug)]
pub struct BenchRow {
    pub shape: BenchShape,
    pub us: f64,
    pub gbps: f64,
    pub tflops: f64,
    pub max_splits: i32,
}

pub const PAGE: usize = 64;

/// Bytes moved per call, the peers' harness model: KV read once + q + out (16-bit).
pub fn bytes(s: &BenchShape) -> f64 {
    let kv = s.batch * s.len * D_QK * s.dtypes.kv().size();
    let q = s.batch * s.s_q * s.heads * D_QK * s.dtypes.q().size();
    let o = s.batch * s.s_q * s.heads * D_V * 2;
    (kv + q + o) as f64
}

/// FLOPs per call, the peers' harness model: `2 * B * H * S_q * L * (576 + 512)`.
pub fn flops(s: &BenchShape) -> f64 {
    2.0 * (s.batch * s.heads * s.s_q * s.len * (D_QK + D_V)) as f64
}

fn ptr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    s.device_ptr(stream).0
}

/// Random bytes of `dtype` values for `n` elements, tiled from a pool of 1M values.
fn pooled(rng: &mut SplitMix64, dtype: ElemType, n: usize) -> (Vec<u8>, f32) {
    let pool: Vec<f32> = (0..(1 << 20)).map(|_| rng.normal() as f32).collect();
    let scale = if dtype == ElemType::Fp8E4m3 {
        4.5 / 448.0
    } else {
        1.0
    };
    let enc: Vec<f32> = pool.iter().map(|v| v / scale).collect();
    let pool_bytes = numeric::from_f32(dtype, &enc);
    let es = dtype.size();
    let mut out = Vec::with_capacity(n * es);
    let mut off = 0usize;
    while out.len() < n * es {
        let take = (n * es - out.len()).min(pool_bytes.len() - off);
        out.extend_from_slice(&pool_bytes[off..off + take]);
        off = (off + take + 4099 * es) % (pool_bytes.len() - 4 * es) / es * es;
    }
    (out, scale)
}

/// q, kv cache, page table, lengths, out, lse.
type DeviceTensors = (
    CudaSlice<u8>,
    CudaSlice<u8>,
    CudaSlice<i32>,
    CudaSlice<i32>,
    CudaSlice<u16>,
    CudaSlice<f32>,
);

/// A shape's buffers on the device, planned and ready to time.
pub struct BenchCase {
    pub shape: BenchShape,
    req_parts: DeviceTensors,
    flush: CudaSlice<u8>,
    ws: DecodeWorkspace,
    scales: Scales,
    num_pages: usize,
    pages_per_seq: usize,
    pub max_splits: i32,
    events: (CudaEvent, CudaEvent),
    /// `MLA_BENCH_PLAN=1`: the serving path's plan for this shape.
    plan: Option<mla::DecodePlan>,
}

impl BenchCase {
    /// Uploads random inputs for `s` and sets the planner's split counts.
    pub fn new(
        rt: &Runtime,
        stream: &Arc<CudaStream>,
        s: BenchShape,
        rng: &mut SplitMix64,
    ) -> Result<Self, MlaError> {
        let pages_per_seq = s.len.div_ceil(s.page);
        let num_pages = s.batch * pages_per_seq;
        let table: Vec<i32> = rng
            .permutation(num_pages)
            .iter()
            .map(|&p| p as i32)
            .collect();
        let lens = vec![s.len as i32; s.batch];
        let (kv_bytes, kv_scale) = pooled(rng, s.dtypes.kv(), num_pages * s.page * D_QK);
        let (q_bytes, q_scale) = pooled(rng, s.dtypes.q(), s.batch * s.s_q * s.heads * D_QK);
        let rows = s.s_q * s.heads;
        // MLA_BENCH_MAX_SPLITS=N: cap the split count (to measure the split rule).
        let max_splits = std::env::var("MLA_BENCH_MAX_SPLITS")
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
            .map_or(MAX_SPLITS, |n| n.clamp(1, MAX_SPLITS));
        let tactic = Tactic {
            tile: s.tile,
            max_splits,
            ..Tactic::default()
        };
        let splits = tactic.split_counts_for(&lens, rows, s.dtypes, rt.device().sm_count as usize);
        let mut ws = DecodeWorkspace::new(
            stream,
            WorkspaceCapacity {
                batch: s.batch,
                rows,
                max_splits: splits.iter().copied().max().unwrap_or(1).max(1) as usize,
            },
        )?;
        ws.set_splits(stream, &splits)?;
        let mut scales = Scales::default_for_mla();
        if s.dtypes.kv() == ElemType::Fp8E4m3 {
            scales.kv_scale = kv_scale;
        }
        if s.dtypes.q() == ElemType::Fp8E4m3 {
            scales.q_scale = q_scale;
        }
        Ok(Self {
            shape: s,
            req_parts: (
                stream.clone_htod(&q_bytes)?,
                stream.clone_htod(&kv_bytes)?,
                stream.clone_htod(&table)?,
                stream.clone_htod(&lens)?,
                stream.alloc_zeros(s.batch * rows * D_V)?,
                stream.alloc_zeros(s.batch * rows)?,
            ),
            flush: stream.alloc_zeros(256 << 20)?,
            ws,
            scales,
            num_pages,
            pages_per_seq,
            max_splits: splits.iter().copied().max().unwrap_or(1),
            events: rt.timing_events()?,
            plan: if std::env::var("MLA_BENCH_PLAN").as_deref() == Ok("1") {
                let config = mla::DecodeConfig {
                    max_batch: s.batch,
                    heads: s.heads,
                    s_q: s.s_q,
                    dtypes: s.dtypes,
                    page_size: s.page,
                    max_seq_len: s.len,
                };
                let mut plan = rt.plan_decode(stream, config, tactic)?;
                // MLA_BENCH_CHECKED=1: the plan in checked mode (to measure its cost).
                plan.set_checked(std::env::var("MLA_BENCH_CHECKED").as_deref() == Ok("1"));
                Some(plan)
            } else {
                None
            },
        })
    }

    fn request(&self, stream: &CudaStream) -> DecodeRequest<'static> {
        let s = self.shape;
        let (q, kv, table, lens, out, lse) = &self.req_parts;
        DecodeRequest {
            q: TensorView::contiguous(
                ptr(q, stream),
                s.dtypes.q(),
                [s.batch, s.s_q, s.heads, D_QK],
            ),
            kv_cache: TensorView::contiguous(
                ptr(kv, stream),
                s.dtypes.kv(),
                [self.num_pages, self.shape.page, D_QK],
            ),
            page_table: TensorView::contiguous(
                ptr(table, stream),
                ElemType::I32,
                [s.batch, self.pages_per_seq],
            ),
            seq_lens: TensorView::contiguous(ptr(lens, stream), ElemType::I32, [s.batch]),
            out: TensorView::contiguous(
                ptr(out, stream),
                s.dtypes.out(),
                [s.batch, s.s_q, s.heads, D_V],
            ),
            lse: TensorView::contiguous(ptr(lse, stream), ElemType::F32, [s.batch, s.s_q, s.heads]),
            scales: self.scales,
            host: HostMirror::default(),
        }
    }

    /// One decode + combine, timed with CUDA events, after flushing the L2 (outside the
    /// timed region). Microseconds.
    pub fn time_one(&mut self, rt: &Runtime, stream: &Arc<CudaStream>) -> Result<f64, MlaError> {
        stream.memset_zeros(&mut self.flush)?;
        let req = self.request(stream);
        let (e0, e1) = &self.events;
        e0.record(stream)?;
        match &self.plan {
            Some(plan) => {
                plan.run(rt, stream, &req)?;
            }
            None => {
                rt.decode_tiled(stream, &req, &self.ws, self.shape.tile)?;
            }
        }
        e1.record(stream)?;
        e1.synchronize()?;
        Ok(e0.elapsed_ms(e1)? as f64 * 1e3)
    }
}

/// Times one shape: 3 warm-up runs, then the median of `reps`.
pub fn time_shape(
    rt: &Runtime,
    stream: &Arc<CudaStream>,
    s: BenchShape,
    rng: &mut SplitMix64,
    reps: usize,
) -> Result<BenchRow, MlaError> {
    let mut case = BenchCase::new(rt, stream, s, rng)?;
    for _ in 0..3 {
        case.time_one(rt, stream)?;
    }
    let mut times = (0..reps.max(1))
        .map(|_| case.time_one(rt, stream))
        .collect::<Result<Vec<f64>, _>>()?;
    times.sort_by(f64::total_cmp);
    let us = times[times.len() / 2];
    // MLA_TRACE_PRINT=1 with a trace build (`MLA_TRACE=1`): the last run's phase stamps.
    if std::env::var("MLA_TRACE_PRINT").as_deref() == Ok("1") && case.plan.is_none() {
        let words = case.ws.scratch_words(stream)?;
        let stride = mla::abi::ACC_FLOATS_PER_CTA / 2;
        println!("{}", trace_summary(&words, stride));
        // MLA_TRACE_DUMP=FILE: every CTA's record appended to FILE, one line each.
        if let Ok(path) = std::env::var("MLA_TRACE_DUMP") {
            let text = trace_lines(&words, stride, &s.label());
            let written = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()));
            if let Err(e) = written {
                eprintln!("MLA_TRACE_DUMP {path}: {e}");
            }
        }
    }
    Ok(BenchRow {
        shape: s,
        us,
        gbps: bytes(&s) / us * 1e-3,
        tflops: flops(&s) / us * 1e-6,
        max_splits: case.max_splits,
    })
}

/// The trace build's records in the scratch (one per CTA every `stride` words, those with the
/// magic), with their CTA index.
fn trace_records(words: &[u64], stride: usize) -> impl Iterator<Item = (usize, &[u64])> {
    use mla::abi::trace::{MAGIC, WORDS};
    words
        .chunks(stride)
        .enumerate()
        .filter(|(_, r)| r.len() >= WORDS && r[0] == MAGIC)
}

/// The cells a record holds (word 2's low half; its high half is the SM).
fn recorded_cells(r: &[u64]) -> usize {
    ((r[2] & 0xffff_ffff) as usize).min(mla::abi::trace::CELLS as usize)
}

/// Phase times of a trace build's bf16 TMA decode (the kernels' `decode::trace` record, one
/// per CTA every `stride` words): medians and maxima over the CTAs, in us, of the first
/// cell's start after the kernel's first entry, each cell's prologue (64 rows: Q and the
/// first pair landed, first S done; small rows: Q landed), its block loop per block, its
/// epilogue, the gap between cells, and the span from the first entry to the last
/// epilogue's end; and the earliest, 10th-percentile and mean CTA end (the tail's spread).
pub fn trace_summary(words: &[u64], stride: usize) -> String {
    let recs: Vec<&[u64]> = trace_records(words, stride).map(|(_, r)| r).collect();
    let Some(t0) = recs.iter().map(|r| r[1]).min() else {
        return "trace: no record (not a trace build, or not a bf16 TMA decode)".into();
    };
    let us = |ns: u64| ns as f64 * 1e-3;
    let (mut start, mut pro, mut per_block, mut epi, mut gap, mut ends) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let mut entry = vec![];
    for r in &recs {
        entry.push(us(r[1] - t0));
        let cells = recorded_cells(r);
        for c in 0..cells {
            let w = &r[3 + 5 * c..8 + 5 * c];
            let blocks = (w[0] & 0xffff_ffff).max(1) as f64;
            if c == 0 {
                start.push(us(w[1].saturating_sub(r[1])));
            } else {
                gap.push(us(w[1].saturating_sub(r[3 + 5 * (c - 1) + 4])));
            }
            pro.push(us(w[2].saturating_sub(w[1])));
            per_block.push(us(w[3].saturating_sub(w[2])) / blocks);
            epi.push(us(w[4].saturating_sub(w[3])));
        }
        if cells > 0 {
            ends.push(us(r[3 + 5 * (cells - 1) + 4] - t0));
        }
    }
    let stat = |v: &mut Vec<f64>| {
        if v.is_empty() {
            return "-".to_string();
        }
        v.sort_by(f64::total_cmp);
        format!("{:.2}/{:.2}", v[v.len() / 2], v[v.len() - 1])
    };
    // The spread of the CTAs' last ends (sorted by `stat`): where the tail begins.
    let tail = |v: &[f64]| match v {
        [] => "-".to_string(),
        _ => format!(
            "{:.2}/{:.2}/{:.2}",
            v[0],
            v[v.len() / 10],
            v.iter().sum::<f64>() / v.len() as f64
        ),
    };
    format!(
        "trace ({} CTAs, median/max us): entry {}  first cell start {}  prologue {}  \
         loop per block {}  epilogue {}  between cells {}  end {}  ends min/p10/mean {}",
        recs.len(),
        stat(&mut entry),
        stat(&mut start),
        stat(&mut pro),
        stat(&mut per_block),
        stat(&mut epi),
        stat(&mut gap),
        stat(&mut ends),
        tail(&ends),
    )
}

/// A trace build's records (as [`trace_summary`] reads them) as text, one line per CTA:
/// `label`, the CTA, its SM, the entry (ns after the earliest), and each recorded cell's
/// blocks and four stamps (ns after the earliest entry).
pub fn trace_lines(words: &[u64], stride: usize, label: &str) -> String {
    let t0 = trace_records(words, stride)
        .map(|(_, r)| r[1])
        .min()
        .unwrap_or(0);
    let mut out = String::new();
    for (cta, r) in trace_records(words, stride) {
        let cells = recorded_cells(r);
        out += &format!("{label}\t{cta}\t{}\t{}", r[2] >> 32, r[1] - t0);
        for c in 0..cells {
            let w = &r[3 + 5 * c..8 + 5 * c];
            out += &format!("\t{}", w[0] & 0xffff_ffff);
            for &t in &w[1..] {
                out += &format!(" {}", t.saturating_sub(t0));
            }
        }
        out += "\n";
    }
    out
}

/// Device-to-device copy bandwidth (bytes read + written per second, GB/s) over 2 GiB.
pub fn copy_bandwidth(rt: &Runtime, stream: &Arc<CudaStream>) -> Result<f64, MlaError> {
    let n = 1usize << 30;
    let src: CudaSlice<u8> = stream.alloc_zeros(n)?;
    let mut dst: CudaSlice<u8> = stream.alloc_zeros(n)?;
    let (e0, e1) = rt.timing_events()?;
    stream.memcpy_dtod(&src, &mut dst)?;
    let mut best = f64::MAX;
    for _ in 0..5 {
        e0.record(stream)?;
        stream.memcpy_dtod(&src, &mut dst)?;
        e1.record(stream)?;
        e1.synchronize()?;
        best = best.min(e0.elapsed_ms(&e1)? as f64);
    }
    Ok(2.0 * n as f64 / (best * 1e-3) * 1e-9)
}

/// The default grid: the peers' reference shapes at page 64, bf16, fp8 KV and fp8 Q with
/// fp8 KV, plus H = 16 with S_q = 2; shapes of up to 32 rows (`H * S_q`) with the 16- and
/// 64-row tiles, more than 16 rows with the 64-row `mma.sync` and `wgmma` tiles.
pub fn default_shapes() -> Vec<BenchShape> {
    let mut v = Vec::new();
    for dtypes in [
        DecodeDtypes::Bf16,
        DecodeDtypes::Fp8KvBf16Q,
        DecodeDtypes::Fp8,
    ] {
        for (heads, s_q) in [(16, 1), (16, 2), (128, 1), (128, 2)] {
            for (batch, len) in [(1, 4096), (8, 4096), (64, 4096), (128, 4096), (64, 16384)] {
                for tile in Tile::ALL {
                    // The 16-row tile only where it saves MMA work (one or two row tiles);
                    // the wgmma tile where the 16-row tile is not the default (the bench
                    // skips it where the image or dtypes lack it, Tile::check).
                    let rows = heads * s_q;
                    let wanted = match tile {
                        Tile::M64N64 => true,
                        Tile::M16N64 => rows <= 32,
                        Tile::Wg64N64 | Tile::M32N64 => rows > 16,
                    };
                    if wanted {
                        v.push(BenchShape {
                            dtypes,
                            tile,
                            batch,
                            len,
                            heads,
                            s_q,
                            page: PAGE,
                        });
                    }
                }
            }
        }
    }
    v
}

/// Secondary targets, each against its own baseline in the same grid: page sizes
/// 16, 32, 64, 128 (B = 64, L = 4096; H = 16 and 128) and MTP S_q = 1, 2, 3, 4 at page 64
/// (B = 64, L = 4096; H = 16 and 128), bf16 and fp8 KV, each with the shape's default tile
/// on `backend`.
pub fn extra_shapes(backend: mla::gate::Backend) -> Vec<BenchShape> {
    let mut v = Vec::new();
    for dtypes in [DecodeDtypes::Bf16, DecodeDtypes::Fp8KvBf16Q] {
        for heads in [16, 128] {
            let shape = |s_q: usize, page: usize| BenchShape {
                dtypes,
                tile: Tile::default_for_plan(
                    heads * s_q,
                    PlanSize {
                        max_batch: 64,
                        max_seq_len: 4096,
                        page_size: page,
                    },
                    backend,
                    dtypes,
                ),
                batch: 64,
                len: 4096,
                heads,
                s_q,
                page,
            };
            for page in [16, 32, 64, 128] {
                v.push(shape(1, page));
            }
            for s_q in [2, 3, 4] {
                v.push(shape(s_q, PAGE));
            }
        }
    }
    v
}

/// Small batches (B = 1, 8) over the peers' lengths and heads, bf16, each with the shape's
/// default tile on `backend`: the small-batch target's shapes.
pub fn small_shapes(backend: mla::gate::Backend) -> Vec<BenchShape> {
    default_tile_shapes(backend, &[1, 8], &[1024, 4096, 16384])
}

/// Short sequences at large batch (B = 32, 64, 128; L = 256, 1024), bf16, each with the
/// shape's default tile on `backend`: the shapes where a decode's fixed cost per cell and
/// the combine weigh most (for `MLA_NCU` / `MLA_BENCH_FILTER`).
pub fn short_shapes(backend: mla::gate::Backend) -> Vec<BenchShape> {
    default_tile_shapes(backend, &[32, 64, 128], &[256, 1024])
}

/// bf16 at H = 16 and 128, S_q = 1 and 2, page 64, over `batches` x `lens`, each with the
/// default tile of a plan of exactly that size on `backend`.
fn default_tile_shapes(
    backend: mla::gate::Backend,
    batches: &[usize],
    lens: &[usize],
) -> Vec<BenchShape> {
    let mut v = Vec::new();
    for (heads, s_q) in [(16, 1), (16, 2), (128, 1), (128, 2)] {
        for &batch in batches {
            for &len in lens {
                v.push(BenchShape {
                    dtypes: DecodeDtypes::Bf16,
                    tile: Tile::default_for_plan(
                        heads * s_q,
                        PlanSize {
                            max_batch: batch,
                            max_seq_len: len,
                            page_size: PAGE,
                        },
                        backend,
                        DecodeDtypes::Bf16,
                    ),
                    batch,
                    len,
                    heads,
                    s_q,
                    page: PAGE,
                });
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::{trace_lines, trace_summary};

    /// One CTA's record as the trace build writes it: the magic, the entry stamp, the cell
    /// count, then per cell `(b << 32) | blocks` and its four stamps (ns).
    fn record(stride: usize, entry: u64, cells: &[(u64, [u64; 4])]) -> Vec<u64> {
        let mut r = vec![0u64; stride];
        r[0] = mla::abi::trace::MAGIC;
        r[1] = entry;
        r[2] = cells.len() as u64;
        for (c, (blocks, st)) in cells.iter().enumerate() {
            r[3 + 5 * c] = (7 << 32) | blocks;
            r[4 + 5 * c..8 + 5 * c].copy_from_slice(st);
        }
        r
    }

    #[test]
    fn trace_lines_give_each_cta_its_sm_and_stamps() {
        let stride = 64;
        let mut words = record(stride, 1_000, &[(16, [3_000, 11_000, 43_000, 45_000])]);
        let mut second = record(stride, 1_200, &[(4, [3_200, 10_200, 18_200, 20_200])]);
        // SM 77 in word 2's high half; the cell count stays in the low half.
        second[2] |= 77 << 32;
        words.extend(second);
        let text = trace_lines(&words, stride, "bf16 B1");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0], "bf16 B1\t0\t0\t0\t16 2000 10000 42000 44000");
        assert_eq!(lines[1], "bf16 B1\t1\t77\t200\t4 2200 9200 17200 19200");
        // The summary reads the count past the SM.
        assert!(trace_summary(&words, stride).contains("end 44.00/44.00"));
    }

    #[test]
    fn trace_summary_reads_the_phases_of_each_cta() {
        let stride = 64;
        let mut words = record(stride, 1_000, &[(16, [3_000, 11_000, 43_000, 45_000])]);
        words.extend(record(
            stride,
            1_200,
            &[
                (4, [3_200, 10_200, 18_200, 20_200]),
                (4, [21_200, 28_200, 36_200, 38_200]),
            ],
        ));
        // A CTA without the magic (not a trace build's record) is left out.
        words.extend(vec![5u64; stride]);
        let s = trace_summary(&words, stride);
        assert!(s.starts_with("trace (2 CTAs"), "{s}");
        // Entries 0 and 0.2 us after the first; first cells 2.0 us after each entry.
        assert!(s.contains("entry 0.20/0.20"), "{s}");
        assert!(s.contains("first cell start 2.00/2.00"), "{s}");
        // Prologues 8, 7, 7 us; loops 32 / 16, 8 / 4, 8 / 4 us per block; epilogues 2 us.
        assert!(s.contains("prologue 7.00/8.00"), "{s}");
        assert!(s.contains("loop per block 2.00/2.00"), "{s}");
        assert!(s.contains("epilogue 2.00/2.00"), "{s}");
        // The second CTA's second cell starts 1 us after its first ended.
        assert!(s.contains("between cells 1.00/1.00"), "{s}");
        // Last ends 44.0 and 37.2 us after the earliest entry.
        assert!(s.contains("end 44.00/44.00"), "{s}");
        // The spread of the ends: the first 37.2 us, the 10th percentile (of two) the
        // same, the mean 40.6.
        assert!(s.contains("ends min/p10/mean 37.20/37.20/40.60"), "{s}");
    }

    #[test]
    fn trace_summary_says_when_there_is_no_record() {
        let s = trace_summary(&[0u64; 128], 64);
        assert!(s.contains("no record"), "{s}");
    }
}
