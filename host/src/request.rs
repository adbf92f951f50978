//! What a caller hands the library: typed views of its device tensors plus scalars.
//! [`crate::validate`] turns a request into a checked shape or a typed error before any
//! device pointer is touched.

use crate::tensor::TensorView;
use mla_abi::ElemType;

/// The (q, kv cache, out) element types the decode supports. Accumulation is f32 always.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DecodeDtypes {
    /// q bf16, kv bf16, out bf16.
    Bf16,
    /// q fp16, kv fp16, out fp16.
    Fp16,
    /// q bf16, kv fp8 e4m3 (per-tensor `kv_scale`), out bf16.
    Fp8KvBf16Q,
    /// q fp8 e4m3 (`q_scale`), kv fp8 e4m3 (`kv_scale`), out bf16.
    Fp8,
}

impl DecodeDtypes {
    pub const ALL: [DecodeDtypes; 4] = [Self::Bf16, Self::Fp16, Self::Fp8KvBf16Q, Self::Fp8];

    /// The combination for these element types, or `None` if unsupported.
    pub fn from_types(q: ElemType, kv: ElemType) -> Option<Self> {
        match (q, kv) {
            (ElemType::Bf16, ElemType::Bf16) => Some(Self::Bf16),
            (ElemType::Fp16, ElemType::Fp16) => Some(Self::Fp16),
            (ElemType::Bf16, ElemType::Fp8E4m3) => Some(Self::Fp8KvBf16Q),
            (ElemType::Fp8E4m3, ElemType::Fp8E4m3) => Some(Self::Fp8),
            _ => None,
        }
    }

    pub fn q(self) -> ElemType {
        match self {
            Self::Bf16 | Self::Fp8KvBf16Q => ElemType::Bf16,
            Self::Fp16 => ElemType::Fp16,
            Self::Fp8 => ElemType::Fp8E4m3,
        }
    }

    pub fn kv(self) -> ElemType {
        match self {
            Self::Bf16 => ElemType::Bf16,
            Self::Fp16 => ElemType::Fp16,
            Self::Fp8KvBf16Q | Self::Fp8 => ElemType::Fp8E4m3,
        }
    }

    pub fn out(self) -> ElemType {
        match self {
            Self::Fp16 => ElemType::Fp16,
            _ => ElemType::Bf16,
        }
    }

    /// A short canonical name (`bf16`, `fp16`, `fp8kv_bf16q`, `fp8`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Bf16 => "bf16",
            Self::Fp16 => "fp16",
            Self::Fp8KvBf16Q => "fp8kv_bf16q",
            Self::Fp8 => "fp8",
        }
    }
}

/// Scalars of a decode. `q_scale` / `kv_scale` dequantise fp8 tensors and must be 1 for
/// 16-bit ones.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scales {
    pub softmax_scale: f32,
    pub output_scale: f32,
    pub q_scale: f32,
    pub kv_scale: f32,
}

impl Scales {
    /// `softmax_scale = 1/sqrt(D_QK)`, every other scale 1.
    pub fn default_for_mla() -> Self {
        Self {
            softmax_scale: 1.0 / (mla_abi::D_QK as f32).sqrt(),
            output_scale: 1.0,
            q_scale: 1.0,
            kv_scale: 1.0,
        }
    }
}

/// Host copies of device index tensors, when the caller has them. With them the validator
/// also checks lengths against the page table and every used page id against the cache:
/// a decode length past `max_pages * page_size` (which the device would cut there) is an
/// error here, lengths `<= 0` (padding) and below `s_q` are not; so is a gather length past
/// `out`'s rows (the device copies the first `max_len`); with `seq_lens` the used
/// entries of a row are its first `ceil(len / page_size)`, without it every entry of the
/// table counts as used.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostMirror<'a> {
    /// Same contents as `seq_lens`, `[batch]`.
    pub seq_lens: Option<&'a [i32]>,
    /// Same contents as `page_table`, row-major with the page table's row stride.
    pub page_table: Option<&'a [i32]>,
}

/// One MLA decode step.
#[derive(Clone, Copy, Debug)]
pub struct DecodeRequest<'a> {
    /// `[batch, s_q, heads, D_QK]`, last dim contiguous.
    pub q: TensorView<4>,
    /// `[num_pages, page_size, D_QK]`, last dim contiguous.
    pub kv_cache: TensorView<3>,
    /// `[batch, max_pages]` i32, last dim contiguous.
    pub page_table: TensorView<2>,
    /// `[batch]` i32, contiguous.
    pub seq_lens: TensorView<1>,
    /// `[batch, s_q, heads, D_V]`, last dim contiguous.
    pub out: TensorView<4>,
    /// `[batch, s_q, heads]` f32, contiguous.
    pub lse: TensorView<3>,
    pub scales: Scales,
    pub host: HostMirror<'a>,
}

/// The split layouts of a decode ([`crate::DecodePlan::run_split`]): the rope part of the
/// cache, and of q, in tensors of their own, as FlashInfer's, vLLM's and mistral.rs's
/// paged caches keep them. `None`: that tensor is fused (576 wide).
#[derive(Clone, Copy, Debug, Default)]
pub struct SplitParts {
    /// `[num_pages, page_size, 64]`, last dim contiguous, the cache's dtype; `kv_cache` is
    /// then the latent part, `[num_pages, page_size, 512]`. Each has its own strides.
    pub kpe_cache: Option<TensorView<3>>,
    /// `[batch, s_q, heads, 64]`, last dim contiguous, q's dtype; `q` is then
    /// `[batch, s_q, heads, 512]` (q_nope after the absorbed projection).
    pub q_pe: Option<TensorView<4>>,
}

/// The shape facts of a request that passed validation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeShape {
    pub batch: usize,
    pub s_q: usize,
    pub heads: usize,
    pub page_size: usize,
    pub num_pages: usize,
    /// Page-table columns per sequence.
    pub max_pages: usize,
    pub dtypes: DecodeDtypes,
}

impl DecodeShape {
    /// Query rows per sequence (`s_q * heads`).
    pub fn rows(&self) -> usize {
        self.s_q * self.heads
    }

    /// Longest sequence the page table can address.
    pub fn max_seq_len(&self) -> usize {
        self.max_pages * self.page_size
    }
}

/// Write `s_q` new tokens per sequence (a decode step's tokens, or a prefill chunk: any
/// count the page table holds) into the paged cache at positions
/// `seq_lens[b] - s_q ..= seq_lens[b] - 1`. A length `<= 0` is padding: nothing is written
/// for it (with host copies, a length in `1..s_q` is an error); a position at or past the
/// table's `max_pages * page_size`, or on a page id outside `0..num_pages`, is skipped
/// ([`HostMirror`] says what host copies check). Two new rows that the page
/// table maps to the same cache slot (sequences sharing a page past their common prefix)
/// are written in no defined order: the table must give each new token a slot of its own.
/// At most 65535 sequences a call (append and gather: a typed `Unsupported` error above).
#[derive(Clone, Copy, Debug)]
pub struct AppendRequest<'a> {
    /// `[batch, s_q, D_QK]`, last dim contiguous: the cache's type, bf16 for an fp8 cache.
    pub new_kv: TensorView<3>,
    /// `[num_pages, page_size, D_QK]`.
    pub kv_cache: TensorView<3>,
    /// `[batch, max_pages]` i32.
    pub page_table: TensorView<2>,
    /// `[batch]` i32, lengths including the new tokens.
    pub seq_lens: TensorView<1>,
    /// fp8 caches store `saturate(x / kv_scale)` (one IEEE division, then round to nearest
    /// even); finite and > 0 (subnormals too); must be 1 otherwise.
    pub kv_scale: f32,
    pub host: HostMirror<'a>,
}

/// Copy each sequence's rows out of the pages into `out[b, 0..seq_lens[b], :]` (a length
/// `<= 0` is padding: nothing is copied; a length is cut at the table's `max_pages *
/// page_size` and at `out`'s rows, and rows past the cut are not written).
#[derive(Clone, Copy, Debug)]
pub struct GatherRequest<'a> {
    /// `[num_pages, page_size, D_QK]`.
    pub kv_cache: TensorView<3>,
    /// `[batch, max_pages]` i32.
    pub page_table: TensorView<2>,
    /// `[batch]` i32.
    pub seq_lens: TensorView<1>,
    /// `[batch, max_len, D_QK]`, rows contiguous: the cache's type, or bf16 when
    /// dequantising an fp8 cache.
    pub out: TensorView<3>,
    /// Multiplies dequantised fp8 values.
    pub kv_scale: f32,
    pub host: HostMirror<'a>,
}

/// Checked facts of an append or gather.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedShape {
    pub batch: usize,
    /// `s_q` for an append, the output's rows per sequence for a gather.
    pub rows: usize,
    pub page_size: usize,
    pub num_pages: usize,
    pub max_pages: usize,
    pub cache: ElemType,
    /// The element type of `new_kv` (append) or `out` (gather).
    pub other: ElemType,
}

/// A rank merge ([`crate::Runtime::merge`]): the results of `ranks` decodes of the same
/// query rows, each over its own share of the KV (context parallelism), merged into the
/// exact result by their LSE.
#[derive(Clone, Copy, Debug)]
pub struct MergeRequest {
    /// `[ranks, batch, s_q, heads, 512]` bf16 or fp16, each rank's `[batch, s_q, heads,
    /// 512]` row-major; ranks any multiple of 4 elements apart.
    pub outs: TensorView<5>,
    /// `[ranks, batch, s_q, heads]` f32 natural-log LSE (`-inf`: the rank saw no key of
    /// the row), each rank's row-major.
    pub lses: TensorView<4>,
    /// `[batch, s_q, heads, 512]` row-major, the dtype of `outs`.
    pub out: TensorView<4>,
    /// `[batch, s_q, heads]` f32 row-major.
    pub lse: TensorView<3>,
}

/// Checked facts of a rank merge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MergeShape {
    pub ranks: usize,
    /// Query rows, `batch * s_q * heads`.
    pub rows: usize,
    pub dtype: ElemType,
}
