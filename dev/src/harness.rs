//! Shared by the GPU tests, the benches and `mla demo`: random paged inputs with poisoned
//! unused memory, upload, one decode through the public API, and the check against the f64
//! oracle.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use mla::launch::DecodeWorkspace;
use mla::plan::WorkspaceCapacity;
use mla::tactic::Tile;
use mla::{
    DecodeConfig, DecodeDtypes, DecodeRequest, HostMirror, MlaError, Runtime, Scales, TensorView,
};
use mla_abi::{D_QK, D_V, ElemType, MAX_SPLITS};

use crate::numeric;
use crate::oracle::{self, Comparison, OracleInput, OracleOutput};
use crate::rng::SplitMix64;

/// One decode problem, as data.
#[derive(Clone, Debug)]
pub struct CaseSpec {
    pub dtypes: DecodeDtypes,
    pub page_size: usize,
    pub heads: usize,
    pub s_q: usize,
    /// KV length of each sequence (>= s_q).
    pub lens: Vec<usize>,
    pub output_scale: f32,
    /// Later sequences reuse sequence 0's full pages as their prefix (prefix sharing).
    pub share_prefix_pages: bool,
    /// Value distribution of q and kv.
    pub values: Values,
}

impl CaseSpec {
    /// A case with normal values, output scale 1 and no shared pages.
    pub fn new(
        dtypes: DecodeDtypes,
        page_size: usize,
        heads: usize,
        s_q: usize,
        lens: Vec<usize>,
    ) -> Self {
        Self {
            dtypes,
            page_size,
            heads,
            s_q,
            lens,
            output_scale: 1.0,
            share_prefix_pages: false,
            values: Values::Normal,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Values {
    /// Standard normal.
    Normal,
    /// Normal with 0.5% of values scaled by 30 (activation outliers), per-channel scale
    /// spread over 4x: what fp8 quantisation meets in real caches.
    Outliers,
}

/// How each sequence's KV range is split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Splits {
    /// This many chunks for every sequence (clamped to `1..=MAX_SPLITS`).
    Fixed(usize),
    /// The planner's choice for this GPU ([`mla::plan::split_counts`]).
    Planned,
}

impl Splits {
    pub fn counts(self, lens: &[usize], rows: usize, sm_count: usize) -> Vec<i32> {
        match self {
            Splits::Fixed(n) => vec![n.clamp(1, MAX_SPLITS as usize) as i32; lens.len()],
            Splits::Planned => {
                let l: Vec<i32> = lens.iter().map(|&x| x as i32).collect();
                mla::plan::split_counts(&l, rows, sm_count, MAX_SPLITS as usize)
            }
        }
    }
}

/// Host copies of a case's inputs: the stored bytes and their decoded values.
#[derive(Clone, Debug)]
pub struct HostCase {
    pub spec: CaseSpec,
    pub q_bytes: Vec<u8>,
    /// Stored q values decoded to f32 (before `q_scale`).
    pub q_vals: Vec<f32>,
    pub kv_bytes: Vec<u8>,
    /// Stored cache values decoded to f32 (before `kv_scale`); NaN in poisoned slots.
    pub kv_vals: Vec<f32>,
    /// `[batch, max_pages]`; entries past a sequence's pages are invalid ids.
    pub page_table: Vec<i32>,
    pub max_pages: usize,
    pub num_pages: usize,
    pub seq_lens: Vec<i32>,
    pub scales: Scales,
    /// The unquantised values the fp8 data was made from (for accuracy reports).
    pub q_orig: Vec<f32>,
    pub kv_orig: Vec<f32>,
}

fn nan_bits(dtype: ElemType) -> Vec<u8> {
    match dtype {
        ElemType::Bf16 => 0x7fc0u16.to_le_bytes().to_vec(),
        ElemType::Fp16 => 0x7e00u16.to_le_bytes().to_vec(),
        ElemType::Fp8E4m3 => vec![0x7f],
        ElemType::F32 => f32::NAN.to_le_bytes().to_vec(),
        ElemType::I32 => (-1i32).to_le_bytes().to_vec(),
    }
}

fn sample(rng: &mut SplitMix64, values: Values, channel: usize) -> f32 {
    let x = rng.normal();
    match values {
        Values::Normal => x as f32,
        Values::Outliers => {
            let ch_scale = 0.5 + 1.5 * (((channel * 2_654_435_761) % 1000) as f64 / 1000.0);
            let big = if rng.next_f64() < 0.005 { 30.0 } else { 1.0 };
            (x * ch_scale * big) as f32
        }
    }
}

/// Encodes `vals` as `dtype`; fp8 gets a per-tensor scale `max|x| / 448`. Returns (bytes,
/// decoded stored values, scale).
fn quantise(dtype: ElemType, vals: &[f32]) -> (Vec<u8>, Vec<f32>, f32) {
    if dtype == ElemType::Fp8E4m3 {
        let amax = vals
            .iter()
            .filter(|v| v.is_finite())
            .fold(0f32, |a, v| a.max(v.abs()));
        let scale = if amax > 0.0 { amax / 448.0 } else { 1.0 };
        let scaled: Vec<f32> = vals.iter().map(|v| v / scale).collect();
        let bytes = numeric::from_f32(dtype, &scaled);
        let dec = numeric::to_f32(dtype, &bytes);
        (bytes, dec, scale)
    } else {
        let bytes = numeric::from_f32(dtype, vals);
        let dec = numeric::to_f32(dtype, &bytes);
        (bytes, dec, 1.0)
    }
}

impl HostCase {
    /// A plan config for this case: its batch, shape and dtypes, and lengths up to what its
    /// page table holds.
    pub fn decode_config(&self) -> DecodeConfig {
        let s = &self.spec;
        DecodeConfig {
            max_batch: s.lens.len(),
            heads: s.heads,
            s_q: s.s_q,
            dtypes: s.dtypes,
            page_size: s.page_size,
            max_seq_len: self.max_pages * s.page_size,
        }
    }

    /// Random inputs for `spec`: pages in a random physical order, two spare pages, every
    /// slot past a sequence's length and every spare page NaN, every unused table entry an
    /// invalid page id.
    pub fn random(spec: &CaseSpec, rng: &mut SplitMix64) -> Self {
        let (b, p) = (spec.lens.len(), spec.page_size);
        let pages_of: Vec<usize> = spec.lens.iter().map(|&l| l.div_ceil(p)).collect();
        let shared = if spec.share_prefix_pages && b > 1 {
            spec.lens.iter().map(|&l| l / p).min().unwrap_or(0)
        } else {
            0
        };
        let used: usize = pages_of
            .iter()
            .enumerate()
            .map(|(i, &n)| if i == 0 { n } else { n - shared })
            .sum();
        let num_pages = used + 2;
        let max_pages = pages_of.iter().copied().max().unwrap_or(1) + 1;
        let perm = rng.permutation(num_pages);
        let mut next = 0usize;
        let mut table = vec![0i32; b * max_pages];
        for s in 0..b {
            for j in 0..max_pages {
                table[s * max_pages + j] = if j >= pages_of[s] {
                    if j % 2 == 0 {
                        -1
                    } else {
                        (num_pages + 7) as i32
                    }
                } else if s > 0 && j < shared {
                    table[j]
                } else {
                    next += 1;
                    perm[next - 1] as i32
                };
            }
        }

        // Cache: NaN everywhere, then each sequence's rows.
        let mut kv_orig = vec![f32::NAN; num_pages * p * D_QK];
        for s in 0..b {
            for pos in 0..spec.lens[s] {
                let page = table[s * max_pages + pos / p] as usize;
                let row = &mut kv_orig[(page * p + pos % p) * D_QK..][..D_QK];
                if row[0].is_nan() {
                    for (c, v) in row.iter_mut().enumerate() {
                        *v = sample(rng, spec.values, c);
                    }
                }
            }
        }
        let kv_t = spec.dtypes.kv();
        let (mut kv_bytes, mut kv_vals, kv_scale) = quantise(kv_t, &kv_orig);
        // Re-poison explicitly with the type's NaN (the encoder may saturate NaN for fp8).
        let nan = nan_bits(kv_t);
        for (i, v) in kv_orig.iter().enumerate() {
            if v.is_nan() {
                kv_bytes[i * nan.len()..][..nan.len()].copy_from_slice(&nan);
                kv_vals[i] = f32::NAN;
            }
        }

        let nq = b * spec.s_q * spec.heads * D_QK;
        let q_orig: Vec<f32> = (0..nq)
            .map(|i| sample(rng, spec.values, i % D_QK))
            .collect();
        let (q_bytes, q_vals, q_scale) = quantise(spec.dtypes.q(), &q_orig);
        let mut scales = Scales::default_for_mla();
        scales.output_scale = spec.output_scale;
        scales.q_scale = q_scale;
        scales.kv_scale = kv_scale;
        Self {
            spec: spec.clone(),
            q_bytes,
            q_vals,
            kv_bytes,
            kv_vals,
            page_table: table,
            max_pages,
            num_pages,
            seq_lens: spec.lens.iter().map(|&l| l as i32).collect(),
            scales,
            q_orig,
            kv_orig,
        }
    }

    /// Stores NaN (the cache type's pattern) in dim `dim` of sequence `s`'s token `pos`
    /// (`pos` below its length), in the stored bytes and the decoded values: the oracle then
    /// gives NaN in every row that sees the token.
    ///
    /// # Panics
    /// If `s`, `pos` or `dim` is out of range.
    pub fn poison_key(&mut self, s: usize, pos: usize, dim: usize) {
        assert!(
            pos < self.spec.lens[s] && dim < D_QK,
            "poison_key: outside the sequence"
        );
        let p = self.spec.page_size;
        let page = self.page_table[s * self.max_pages + pos / p] as usize;
        let at = (page * p + pos % p) * D_QK + dim;
        let nan = nan_bits(self.spec.dtypes.kv());
        self.kv_bytes[at * nan.len()..][..nan.len()].copy_from_slice(&nan);
        self.kv_vals[at] = f32::NAN;
    }

    /// The same logical inputs with the physical pages shuffled again.
    pub fn permute_pages(&self, rng: &mut SplitMix64) -> Self {
        let perm = rng.permutation(self.num_pages);
        let p = self.spec.page_size;
        let width = self.kv_bytes.len() / (self.num_pages * p * D_QK);
        let mut out = self.clone();
        for (old, &new) in perm.iter().enumerate() {
            let (a, n) = (old * p * D_QK, p * D_QK);
            let dst = new * p * D_QK;
            out.kv_vals[dst..dst + n].copy_from_slice(&self.kv_vals[a..a + n]);
            out.kv_orig[dst..dst + n].copy_from_slice(&self.kv_orig[a..a + n]);
            out.kv_bytes[dst * width..(dst + n) * width]
                .copy_from_slice(&self.kv_bytes[a * width..(a + n) * width]);
        }
        for e in out.page_table.iter_mut() {
            if *e >= 0 && (*e as usize) < self.num_pages {
                *e = perm[*e as usize] as i32;
            }
        }
        out
    }

    /// Rank `shard.rank`'s share of these inputs under decode context parallelism: the
    /// same q and global `seq_lens`, and a cache of its own holding, for each sequence, the
    /// global tokens the shard puts on this rank at their local positions (fresh pages in a
    /// random order, two spare NaN pages, invalid ids past each sequence's pages).
    pub fn shard(&self, shard: &mla_abi::Shard, rng: &mut SplitMix64) -> Self {
        let (b, p) = (self.spec.lens.len(), self.spec.page_size);
        let local: Vec<usize> = self
            .seq_lens
            .iter()
            .map(|&l| shard.local_len(l).max(0) as usize)
            .collect();
        let pages_of: Vec<usize> = local.iter().map(|&l| l.div_ceil(p)).collect();
        let num_pages = pages_of.iter().sum::<usize>() + 2;
        let max_pages = pages_of.iter().copied().max().unwrap_or(0) + 1;
        let perm = rng.permutation(num_pages);
        let mut table = vec![-1i32; b * max_pages];
        let mut next = 0;
        for s in 0..b {
            for j in 0..pages_of[s] {
                table[s * max_pages + j] = perm[next] as i32;
                next += 1;
            }
        }
        let width = self.kv_bytes.len() / self.kv_vals.len();
        let nan = nan_bits(self.spec.dtypes.kv());
        let mut out = self.clone();
        out.kv_vals = vec![f32::NAN; num_pages * p * D_QK];
        out.kv_orig = vec![f32::NAN; num_pages * p * D_QK];
        out.kv_bytes = nan
            .iter()
            .copied()
            .cycle()
            .take(num_pages * p * D_QK * width)
            .collect();
        for s in 0..b {
            let mut j = 0usize;
            for t in 0..self.seq_lens[s].max(0) as usize {
                if (t / shard.interleave as usize) % shard.ranks as usize != shard.rank as usize {
                    continue;
                }
                let src_page = self.page_table[s * self.max_pages + t / p] as usize;
                let src = (src_page * p + t % p) * D_QK;
                let dst_page = table[s * max_pages + j / p] as usize;
                let dst = (dst_page * p + j % p) * D_QK;
                out.kv_vals[dst..dst + D_QK].copy_from_slice(&self.kv_vals[src..src + D_QK]);
                out.kv_orig[dst..dst + D_QK].copy_from_slice(&self.kv_orig[src..src + D_QK]);
                out.kv_bytes[dst * width..(dst + D_QK) * width]
                    .copy_from_slice(&self.kv_bytes[src * width..(src + D_QK) * width]);
                j += 1;
            }
            assert_eq!(j, local[s], "shard local length");
        }
        out.page_table = table;
        out.num_pages = num_pages;
        out.max_pages = max_pages;
        out
    }

    /// The same inputs in a cache of `num_pages` pages (extra pages NaN) and a table of
    /// `max_pages` columns (extra entries invalid ids), so that inputs of different
    /// lengths fit one set of fixed-size device buffers (a captured CUDA graph).
    pub fn pad_to(&self, num_pages: usize, max_pages: usize) -> Self {
        assert!(
            num_pages >= self.num_pages && max_pages >= self.max_pages,
            "pad_to shrinks"
        );
        let p = self.spec.page_size;
        let mut out = self.clone();
        let width = self.kv_bytes.len() / (self.num_pages * p * D_QK);
        let extra = (num_pages - self.num_pages) * p * D_QK;
        out.kv_vals.extend(std::iter::repeat_n(f32::NAN, extra));
        out.kv_orig.extend(std::iter::repeat_n(f32::NAN, extra));
        let nan = nan_bits(self.spec.dtypes.kv());
        for _ in 0..extra {
            out.kv_bytes.extend_from_slice(&nan[..width]);
        }
        let b = self.spec.lens.len();
        out.page_table = vec![-1; b * max_pages];
        for s in 0..b {
            out.page_table[s * max_pages..s * max_pages + self.max_pages]
                .copy_from_slice(&self.page_table[s * self.max_pages..(s + 1) * self.max_pages]);
        }
        out.num_pages = num_pages;
        out.max_pages = max_pages;
        out
    }

    /// Copies this case's inputs into buffers uploaded for a case of the same padded sizes.
    pub fn upload_into(
        &self,
        stream: &Arc<CudaStream>,
        d: &mut DeviceCase,
    ) -> Result<(), MlaError> {
        stream.memcpy_htod(&self.q_bytes, &mut d.q)?;
        stream.memcpy_htod(&self.kv_bytes, &mut d.kv)?;
        stream.memcpy_htod(&self.page_table, &mut d.table)?;
        stream.memcpy_htod(&self.seq_lens, &mut d.lens)?;
        Ok(())
    }

    pub fn oracle_input(&self) -> OracleInput<'_> {
        OracleInput {
            batch: self.spec.lens.len(),
            s_q: self.spec.s_q,
            heads: self.spec.heads,
            page_size: self.spec.page_size,
            q: &self.q_vals,
            kv_cache: &self.kv_vals,
            page_table: &self.page_table,
            max_pages: self.max_pages,
            seq_lens: &self.seq_lens,
            softmax_scale: self.scales.softmax_scale as f64,
            output_scale: self.scales.output_scale as f64,
            q_scale: self.scales.q_scale as f64,
            kv_scale: self.scales.kv_scale as f64,
        }
    }

    /// f64 reference and the precision-emulating reference used for the tolerance.
    pub fn references(&self) -> (OracleOutput, OracleOutput) {
        let inp = self.oracle_input();
        // An fp8 cache takes the e4m3 tensor cores where it takes the TMA decode (under bf16
        // Q too, whose Q enters as two e4m3 parts), with P in e4m3; its other kernels keep
        // P in f16, well inside that budget.
        let p_type = match self.spec.dtypes {
            DecodeDtypes::Fp16 => ElemType::Fp16,
            DecodeDtypes::Fp8 | DecodeDtypes::Fp8KvBf16Q => ElemType::Fp8E4m3,
            DecodeDtypes::Bf16 => ElemType::Bf16,
        };
        (
            oracle::decode(&inp),
            oracle::decode_emulated(&inp, p_type, self.spec.dtypes.out()),
        )
    }
}

/// Element type code of the i32 index tensors.
const INDEX_TYPE: ElemType = ElemType::I32;

/// A case's tensors on the device.
pub struct DeviceCase {
    pub q: CudaSlice<u8>,
    pub kv: CudaSlice<u8>,
    pub table: CudaSlice<i32>,
    pub lens: CudaSlice<i32>,
    pub out: CudaSlice<u16>,
    pub lse: CudaSlice<f32>,
    /// Element strides of `kv` (`[page, token, 1]`): contiguous unless uploaded with
    /// [`DeviceCase::upload_padded`].
    pub kv_strides: [usize; 3],
}

/// The device address of `s` (for the tensor views the tests and examples build).
pub fn device_addr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    let (p, _sync) = s.device_ptr(stream);
    p
}

impl DeviceCase {
    pub fn upload(stream: &Arc<CudaStream>, h: &HostCase) -> Result<Self, MlaError> {
        Self::upload_with_kv(stream, h, &h.kv_bytes, [h.spec.page_size * D_QK, D_QK, 1])
    }

    /// The case's buffers with `kv` (cache bytes laid out by `kv_strides`) as the cache.
    fn upload_with_kv(
        stream: &Arc<CudaStream>,
        h: &HostCase,
        kv: &[u8],
        kv_strides: [usize; 3],
    ) -> Result<Self, MlaError> {
        let rows = h.spec.lens.len() * h.spec.s_q * h.spec.heads;
        Ok(Self {
            q: stream.clone_htod(&h.q_bytes)?,
            kv: stream.clone_htod(kv)?,
            table: stream.clone_htod(&h.page_table)?,
            lens: stream.clone_htod(&h.seq_lens)?,
            out: stream.alloc_zeros(rows * D_V)?,
            lse: stream.alloc_zeros(rows)?,
            kv_strides,
        })
    }

    /// As [`DeviceCase::upload`] with a strided cache: each token row `row_pad` elements
    /// longer and each page `page_pad` elements longer than its rows, the padding holding
    /// the dtype's NaN (so a kernel that reads it fails the check). Not for
    /// [`HostCase::upload_into`], which copies contiguous caches.
    pub fn upload_padded(
        stream: &Arc<CudaStream>,
        h: &HostCase,
        row_pad: usize,
        page_pad: usize,
    ) -> Result<Self, MlaError> {
        let p = h.spec.page_size;
        let nan = nan_bits(h.spec.dtypes.kv());
        let width = nan.len();
        let (row, page) = (D_QK + row_pad, p * (D_QK + row_pad) + page_pad);
        let mut bytes: Vec<u8> = nan
            .iter()
            .copied()
            .cycle()
            .take(h.num_pages * page * width)
            .collect();
        for pg in 0..h.num_pages {
            for t in 0..p {
                let src = ((pg * p + t) * D_QK) * width;
                let dst = (pg * page + t * row) * width;
                bytes[dst..dst + D_QK * width]
                    .copy_from_slice(&h.kv_bytes[src..src + D_QK * width]);
            }
        }
        Self::upload_with_kv(stream, h, &bytes, [page, row, 1])
    }

    /// The decode request over these buffers (host mirrors included, so the validator also
    /// checks every used page id).
    pub fn request<'a>(&self, stream: &CudaStream, h: &'a HostCase) -> DecodeRequest<'a> {
        let s = &h.spec;
        let b = s.lens.len();
        DecodeRequest {
            q: TensorView::contiguous(
                device_addr(&self.q, stream),
                s.dtypes.q(),
                [b, s.s_q, s.heads, D_QK],
            ),
            kv_cache: TensorView {
                ptr: device_addr(&self.kv, stream),
                dtype: s.dtypes.kv(),
                shape: [h.num_pages, s.page_size, D_QK],
                strides: self.kv_strides,
            },
            page_table: TensorView::contiguous(
                device_addr(&self.table, stream),
                INDEX_TYPE,
                [b, h.max_pages],
            ),
            seq_lens: TensorView::contiguous(device_addr(&self.lens, stream), INDEX_TYPE, [b]),
            out: TensorView::contiguous(
                device_addr(&self.out, stream),
                s.dtypes.out(),
                [b, s.s_q, s.heads, D_V],
            ),
            lse: TensorView::contiguous(
                device_addr(&self.lse, stream),
                ElemType::F32,
                [b, s.s_q, s.heads],
            ),
            scales: h.scales,
            host: HostMirror {
                seq_lens: Some(&h.seq_lens),
                page_table: Some(&h.page_table),
            },
        }
    }

    /// Fills `out` and `lse` with NaN so that an unwritten element fails the check.
    pub fn poison_outputs(&mut self, stream: &Arc<CudaStream>) -> Result<(), MlaError> {
        let o = vec![0xffffu16; self.out.len()];
        stream.memcpy_htod(&o, &mut self.out)?;
        let l = vec![f32::NAN; self.lse.len()];
        stream.memcpy_htod(&l, &mut self.lse)?;
        Ok(())
    }

    /// `out` and `lse` as f32.
    pub fn download(
        &self,
        stream: &Arc<CudaStream>,
        out_t: ElemType,
    ) -> Result<(Vec<f32>, Vec<f32>), MlaError> {
        let o: Vec<u16> = stream.clone_dtoh(&self.out)?;
        let l: Vec<f32> = stream.clone_dtoh(&self.lse)?;
        let bytes: Vec<u8> = o.iter().flat_map(|v| v.to_le_bytes()).collect();
        Ok((numeric::to_f32(out_t, &bytes), l))
    }
}

/// The outcome of one decode against the oracle.
#[derive(Debug)]
pub struct CaseCheck {
    pub out: Comparison,
    pub lse: Comparison,
}

impl CaseCheck {
    pub fn ok(&self) -> bool {
        self.out.ok && self.lse.ok
    }
}

/// Absolute floor of the tolerance (times `max(1, max|ref|)`).
pub const OUT_ATOL: f64 = 1e-5;
pub const LSE_ATOL: f64 = 2e-4;

/// Runs one decode of `h` with `splits` and returns the raw outputs (poisoned beforehand).
pub fn run_decode(
    rt: &Runtime,
    stream: &Arc<CudaStream>,
    h: &HostCase,
    d: &mut DeviceCase,
    ws: &mut DecodeWorkspace,
    splits: &[i32],
) -> Result<(Vec<f32>, Vec<f32>), MlaError> {
    run_decode_tiled(rt, stream, h, d, ws, splits, Tile::M64N64)
}

/// [`run_decode`] with an explicit tile.
pub fn run_decode_tiled(
    rt: &Runtime,
    stream: &Arc<CudaStream>,
    h: &HostCase,
    d: &mut DeviceCase,
    ws: &mut DecodeWorkspace,
    splits: &[i32],
    tile: Tile,
) -> Result<(Vec<f32>, Vec<f32>), MlaError> {
    d.poison_outputs(stream)?;
    ws.set_splits(stream, splits)?;
    let req = d.request(stream, h);
    rt.decode_tiled(stream, &req, ws, tile)?;
    stream.synchronize()?;
    d.download(stream, h.spec.dtypes.out())
}

/// A workspace large enough for `h`.
pub fn workspace_for(stream: &Arc<CudaStream>, h: &HostCase) -> Result<DecodeWorkspace, MlaError> {
    DecodeWorkspace::new(
        stream,
        WorkspaceCapacity {
            batch: h.spec.lens.len(),
            rows: h.spec.s_q * h.spec.heads,
            max_splits: MAX_SPLITS as usize,
        },
    )
}

/// Compares kernel outputs with the references.
pub fn check(got: &(Vec<f32>, Vec<f32>), refs: &(OracleOutput, OracleOutput)) -> CaseCheck {
    CaseCheck {
        out: oracle::compare(&got.0, &refs.0.out, &refs.1.out, OUT_ATOL),
        lse: oracle::compare(&got.1, &refs.0.lse, &refs.1.lse, LSE_ATOL),
    }
}
