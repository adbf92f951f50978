//! Request validation: a decode, append or gather request becomes a checked shape or a
//! typed error naming the field, what was expected and what was received. Nothing here
//! dereferences a device address; host mirrors of the index tensors are read when given.
//!
//! The rules come in families, one small private fn each, shared by the three requests:
//! layouts (shapes and strides), element types, placement (null, alignment, byte spans),
//! self-overlap and aliasing of outputs, scales, and the host mirror (lengths and the page
//! ids they use).
//!
//! Three conventions hold throughout:
//! - The stride of a dim of extent 1 is never multiplied by anything but 0, so no rule
//!   looks at it (torch reports arbitrary strides for such dims of contiguous tensors).
//! - `page_table` and `seq_lens` hold i32: their views must carry [`ElemType::I32`].
//! - Counts the kernels receive as `u32` (batch, page count, page-table columns and row
//!   stride, gather rows) are checked to fit, so the returned shapes narrow without checks.

use std::collections::HashMap;
use std::ops::{Range, RangeInclusive};

use mla_abi::{D_QK, D_V, ElemType, MAX_HEADS, MAX_PAGE_SIZE, MAX_S_Q, Shard};

use crate::error::{MlaError, Result};
use crate::request::{
    AppendRequest, DecodeDtypes, DecodeRequest, DecodeShape, GatherRequest, HostMirror,
    MergeRequest, MergeShape, PagedShape, Scales, SplitParts,
};
use crate::tensor::TensorView;

/// Bytes the kernels move per load or store of q, kv and out rows: base addresses and row
/// strides of those tensors are multiples of it.
const CHUNK_ALIGN: u64 = 16;
/// Alignment of the 4-byte tensors (page table, lengths, lse).
const WORD_ALIGN: u64 = 4;
/// Largest count a `u32` kernel param holds.
const U32_LIMIT: usize = u32::MAX as usize;
/// Largest sequence length an i32 `seq_lens` entry holds.
const I32_LIMIT: usize = i32::MAX as usize;

/// A tensor's name and the error field of each of its dims and strides.
struct Names<const R: usize> {
    tensor: &'static str,
    all_strides: &'static str,
    shape: [&'static str; R],
    strides: [&'static str; R],
}

/// `names!("q"; 0 "batch" "batch", ..)`: per dim its index, what its extent counts and
/// what one step of its stride moves over.
macro_rules! names {
    ($t:literal; $($i:literal $dim:literal $step:literal),+ $(,)?) => {
        Names {
            tensor: $t,
            all_strides: concat!($t, ".strides"),
            shape: [$(concat!($t, ".shape[", $i, "] (", $dim, ")")),+],
            strides: [$(concat!($t, ".strides[", $i, "] (", $step, ")")),+],
        }
    };
}

const Q: Names<4> =
    names!("q"; 0 "batch" "batch", 1 "s_q" "token", 2 "heads" "head", 3 "D_QK" "dim");
const OUT: Names<4> =
    names!("out"; 0 "batch" "batch", 1 "s_q" "token", 2 "heads" "head", 3 "D_V" "dim");
const LSE: Names<3> = names!("lse"; 0 "batch" "batch", 1 "s_q" "token", 2 "heads" "head");
const KV: Names<3> =
    names!("kv_cache"; 0 "num_pages" "page", 1 "page_size" "token", 2 "D_QK" "dim");
const KPE: Names<3> =
    names!("kpe_cache"; 0 "num_pages" "page", 1 "page_size" "token", 2 "D_ROPE" "dim");
const Q_PE: Names<4> =
    names!("q_pe"; 0 "batch" "batch", 1 "s_q" "token", 2 "heads" "head", 3 "D_ROPE" "dim");
const PAGE_TABLE: Names<2> = names!("page_table"; 0 "batch" "batch", 1 "max_pages" "page");
const SEQ_LENS: Names<1> = names!("seq_lens"; 0 "batch" "batch");
const NEW_KV: Names<3> = names!("new_kv"; 0 "batch" "batch", 1 "s_q" "token", 2 "D_QK" "dim");
const GATHER_OUT: Names<3> = names!("out"; 0 "batch" "batch", 1 "max_len" "row", 2 "D_QK" "dim");
const OUTS: Names<5> = names!("outs"; 0 "ranks" "rank", 1 "batch" "batch", 2 "s_q" "token",
    3 "heads" "head", 4 "D_V" "dim");
const LSES: Names<4> =
    names!("lses"; 0 "ranks" "rank", 1 "batch" "batch", 2 "s_q" "token", 3 "heads" "head");
/// Alignment of the merge's 16-bit rows (it moves four elements at a time).
const QUAD_ALIGN: u64 = 8;

/// A tensor's name and the bytes `[start, end)` it may touch.
type Span = (&'static str, (u64, u64));

/// The checked geometry of a paged cache and its index tensors.
struct Paged {
    batch: usize,
    page_size: usize,
    num_pages: usize,
    max_pages: usize,
    /// Entries from one sequence's page-table row to the next.
    row_stride: usize,
}

impl Paged {
    /// Longest sequence the page table can address.
    fn capacity(&self) -> usize {
        self.max_pages.saturating_mul(self.page_size)
    }
}

/// `b * s * h` rows of `D_V` values, from a caller's fields: a count whose rows are not
/// addressable (an overflow, also of `s * h * D_V` when `b` is 0) is an `InvalidShape` of
/// `field`, never a panic.
pub fn addressable_rows(b: usize, s: usize, h: usize, field: &'static str) -> Result<usize> {
    s.checked_mul(h)
        .filter(|sh| sh.checked_mul(D_V).is_some())
        .and_then(|sh| b.checked_mul(sh))
        .filter(|r| r.checked_mul(D_V).is_some())
        .ok_or_else(|| {
            MlaError::shape(
                field,
                "a row count whose 512-wide rows are addressable",
                format!("{b} x {s} x {h}"),
            )
        })
}

/// A tensor a collective copies as one block of its elements from its base address (a
/// context-parallel combine's local `out` or `lse`): row-major over its dims longer than 1
/// (strides of extent-1 dims are not looked at, convention at the top: `[B, 1, H, 512]` as
/// a transposed `[B, H, 1, 512]` buffer is as contiguous as the canonical one), non-null,
/// aligned to its element size, and its byte span fits `u64`. Errors name `tensor`, or
/// `strides` for the layout.
pub fn block_source<const R: usize>(
    tensor: &'static str,
    strides: &'static str,
    view: &TensorView<R>,
) -> Result<()> {
    let names = Names {
        tensor,
        all_strides: strides,
        shape: [tensor; R],
        strides: [strides; R],
    };
    row_major(&names, view)?;
    placed(&names, view, view.dtype.size() as u64)?;
    Ok(())
}

/// Checks the lengths a step is scheduled from (`DecodePlan::schedule_step`): `[batch]`
/// i32, contiguous, non-null and aligned, by the rules a decode's `seq_lens` follows.
/// Returns the batch.
pub fn validate_seq_lens(seq_lens: &TensorView<1>) -> Result<usize> {
    let batch = dim_in(SEQ_LENS.shape[0], seq_lens.shape[0], 1..=U32_LIMIT)?;
    dtype_in(SEQ_LENS.tensor, seq_lens.dtype, &[ElemType::I32])?;
    row_major(&SEQ_LENS, seq_lens)?;
    placed(&SEQ_LENS, seq_lens, WORD_ALIGN)?;
    Ok(batch)
}

/// A shard's fields: `ranks` in `0..=MAX_MERGE_RANKS` (0 and 1: off, the other fields
/// ignored); when on, `rank < ranks` and `interleave >= 1`.
pub fn shard_fields(shard: &Shard) -> Result<()> {
    let max = mla_abi::MAX_MERGE_RANKS;
    if shard.ranks > max {
        return Err(MlaError::shape(
            "shard.ranks",
            format!("0..={max} (0 or 1: not sharded)"),
            shard.ranks,
        ));
    }
    if shard.is_on() && shard.rank >= shard.ranks {
        return Err(MlaError::shape(
            "shard.rank",
            format!("0..{} (shard.ranks)", shard.ranks),
            shard.rank,
        ));
    }
    if shard.is_on() && shard.interleave == 0 {
        return Err(MlaError::shape(
            "shard.interleave",
            ">= 1 (consecutive tokens per rank)",
            0,
        ));
    }
    Ok(())
}

/// Checks a rank merge and returns its shape.
pub fn validate_merge(req: &MergeRequest) -> Result<MergeShape> {
    let (o, l) = (&req.outs, &req.lses);
    let ranks = dim_in(
        OUTS.shape[0],
        o.shape[0],
        1..=mla_abi::MAX_MERGE_RANKS as usize,
    )?;
    let batch = dim_in(OUTS.shape[1], o.shape[1], 1..=U32_LIMIT)?;
    let s_q = dim_in(OUTS.shape[2], o.shape[2], 1..=MAX_S_Q as usize)?;
    let heads = dim_in(OUTS.shape[3], o.shape[3], 1..=MAX_HEADS as usize)?;
    dim_is(OUTS.shape[4], o.shape[4], D_V)?;
    dtype_in(OUTS.tensor, o.dtype, &[ElemType::Bf16, ElemType::Fp16])?;
    row_major_from(&OUTS, o, 1)?;
    for (i, want) in [ranks, batch, s_q, heads].into_iter().enumerate() {
        dim_as(LSES.shape[i], l.shape[i], want, OUTS.shape[i])?;
    }
    dtype_in(LSES.tensor, l.dtype, &[ElemType::F32])?;
    row_major_from(&LSES, l, 1)?;
    let source = [OUTS.shape[1], OUTS.shape[2], OUTS.shape[3]];
    decode_output_layout(&req.out, &req.lse, [batch, s_q, heads], source)?;
    row_major(&OUT, &req.out)?;
    if req.out.dtype != o.dtype {
        return Err(MlaError::DtypeMismatch {
            field: OUT.tensor,
            expected: format!("{} (the dtype of outs)", o.dtype.name()),
            got: req.out.dtype.name().into(),
        });
    }
    dtype_in(LSE.tensor, req.lse.dtype, &[ElemType::F32])?;
    let rows = batch * s_q * heads;
    dim_in("rows (batch * s_q * heads)", rows, 1..=i32::MAX as usize)?;
    let inputs = [placed(&OUTS, o, QUAD_ALIGN)?, placed(&LSES, l, WORD_ALIGN)?];
    let outputs = [
        placed(&OUT, &req.out, QUAD_ALIGN)?,
        placed(&LSE, &req.lse, WORD_ALIGN)?,
    ];
    no_aliasing(&outputs, &inputs)?;
    Ok(MergeShape {
        ranks,
        rows,
        dtype: o.dtype,
    })
}

/// The merged `out` and `lse` of a context-parallel step (written by the group's merge,
/// which reads `req.seq_lens`) apart from every input of the rank's decode `req` (validated
/// first), as a decode's own outputs are. Alignment as the merge's.
pub fn merged_outputs_apart(
    req: &DecodeRequest,
    parts: &SplitParts,
    out: &TensorView<4>,
    lse: &TensorView<3>,
) -> Result<()> {
    let inputs = decode_inputs(req, parts)?;
    let outputs = [
        placed(&OUT, out, QUAD_ALIGN)?,
        placed(&LSE, lse, WORD_ALIGN)?,
    ];
    no_aliasing(&outputs, &inputs)
}

/// The spans of everything a decode reads: q, the cache, the page table, the lengths, and
/// the split layouts' rope parts (the fused tensor's span where there is none).
fn decode_inputs(req: &DecodeRequest, parts: &SplitParts) -> Result<[Span; 6]> {
    let q = placed(&Q, &req.q, CHUNK_ALIGN)?;
    let [kv, page_table, seq_lens] =
        paged_placement(&req.kv_cache, &req.page_table, &req.seq_lens)?;
    let q_pe = match &parts.q_pe {
        Some(v) => q_pe_layout(v, &req.q)?,
        None => q,
    };
    let kpe = match &parts.kpe_cache {
        Some(v) => kpe_layout(v, &req.kv_cache)?,
        None => kv,
    };
    Ok([q, kv, page_table, seq_lens, q_pe, kpe])
}

/// Checks one decode step and returns its shape.
pub fn validate_decode(req: &DecodeRequest) -> Result<DecodeShape> {
    validate_decode_shard(req, &Shard::OFF)
}

/// [`validate_decode`] for one rank's share of the KV ([`Shard`], on when `ranks > 1`):
/// `seq_lens` are global lengths, and the page table's capacity and the used page ids are
/// checked against this rank's share of each (`Shard::local_len`).
pub fn validate_decode_shard(req: &DecodeRequest, shard: &Shard) -> Result<DecodeShape> {
    validate_decode_parts(req, &SplitParts::default(), shard)
}

/// [`validate_decode_shard`] with the split layouts of [`SplitParts`]: with `kpe_cache`,
/// `kv_cache` is `[num_pages, page_size, 512]` and `kpe_cache` `[num_pages, page_size, 64]`
/// (same pages, page size and dtype, each with its own strides); with `q_pe`, `q` is
/// `[batch, s_q, heads, 512]` and `q_pe` `[batch, s_q, heads, 64]`.
pub fn validate_decode_parts(
    req: &DecodeRequest,
    parts: &SplitParts,
    shard: &Shard,
) -> Result<DecodeShape> {
    shard_fields(shard)?;
    let (batch, s_q, heads) = query_layout(&req.q, width(parts.q_pe.is_some()))?;
    let paged = paged_layout(
        &req.kv_cache,
        width(parts.kpe_cache.is_some()),
        &req.page_table,
        &req.seq_lens,
        batch,
        Q.shape[0],
    )?;
    if !shard.is_on() {
        // A rank's share of the last s_q tokens may be anything down to none.
        enough_pages(&paged, s_q)?;
    }
    let source = [Q.shape[0], Q.shape[1], Q.shape[2]];
    decode_output_layout(&req.out, &req.lse, [batch, s_q, heads], source)?;

    let dtypes = decode_dtypes(req.q.dtype, req.kv_cache.dtype)?;
    dtype_in(OUT.tensor, req.out.dtype, &[dtypes.out()])?;
    dtype_in(LSE.tensor, req.lse.dtype, &[ElemType::F32])?;
    index_dtypes(&req.page_table, &req.seq_lens)?;

    let inputs = decode_inputs(req, parts)?;
    let out = placed(&OUT, &req.out, CHUNK_ALIGN)?;
    let lse = placed(&LSE, &req.lse, WORD_ALIGN)?;
    no_self_overlap(&OUT, &req.out)?;
    no_aliasing(&[out, lse], &inputs)?;

    decode_scales(&req.scales, dtypes)?;
    let capacity = paged.capacity().min(I32_LIMIT);
    // Lengths <= 0 are padding and short ones (< s_q) valid (zeros, lse -inf); sharded,
    // lengths are global (up to i32::MAX) and each rank's share must fit its table.
    let lens = if shard.is_on() {
        0..=I32_LIMIT
    } else {
        0..=capacity
    };
    host_mirror(&req.host, &paged, lens, "the page table's capacity", shard)?;

    Ok(DecodeShape {
        batch,
        s_q,
        heads,
        page_size: paged.page_size,
        num_pages: paged.num_pages,
        max_pages: paged.max_pages,
        dtypes,
    })
}

/// Checks an append of `s_q` new rows per sequence and returns its shape
/// (`rows = s_q`, `other` = the type of `new_kv`).
pub fn validate_append(req: &AppendRequest) -> Result<PagedShape> {
    validate_append_split(req, None)
}

/// [`validate_append`] into a split cache: `kv_cache` `[num_pages, page_size, 512]` and
/// its rope part `kpe` `[num_pages, page_size, 64]` (`new_kv` rows stay 576 wide).
pub fn validate_append_split(
    req: &AppendRequest,
    kpe: Option<&TensorView<3>>,
) -> Result<PagedShape> {
    let new = &req.new_kv;
    let batch = dim_in(NEW_KV.shape[0], new.shape[0], 1..=U32_LIMIT)?;
    // Any number of new rows (a prefill chunk too), as the page table holds them; the
    // launch takes at most 2^31 - 1 (`Unsupported` above).
    let s_q = dim_in(NEW_KV.shape[1], new.shape[1], 1..=U32_LIMIT)?;
    dim_is(NEW_KV.shape[2], new.shape[2], D_QK)?;
    unit_last_stride(&NEW_KV, new)?;
    let paged = paged_layout(
        &req.kv_cache,
        width(kpe.is_some()),
        &req.page_table,
        &req.seq_lens,
        batch,
        NEW_KV.shape[0],
    )?;
    enough_pages(&paged, s_q)?;

    let cache = paged_cache_dtype(req.kv_cache.dtype)?;
    dtype_in(NEW_KV.tensor, new.dtype, &[cache.append_rows()])?;
    index_dtypes(&req.page_table, &req.seq_lens)?;

    let new_kv = placed(&NEW_KV, new, CHUNK_ALIGN)?;
    let [kv, page_table, seq_lens] =
        paged_placement(&req.kv_cache, &req.page_table, &req.seq_lens)?;
    match kpe {
        Some(k) => {
            let rope = kpe_layout(k, &req.kv_cache)?;
            let inputs = [new_kv, page_table, seq_lens];
            no_aliasing(&[kv], &inputs)?;
            no_aliasing(&[rope], &inputs)?;
            // Both are written: their spans may interleave (the two parts of one fused
            // cache, as the decode takes them), their bytes may not.
            if !rows_disjoint(&req.kv_cache, k) {
                no_aliasing(&[kv, rope], &[])?;
            }
        }
        None => no_aliasing(&[kv], &[new_kv, page_table, seq_lens])?,
    }

    positive("kv_scale", req.kv_scale)?;
    unit_unless_fp8("kv_scale", req.kv_scale, KV.tensor, cache)?;
    // The kernel divides by kv_scale (IEEE, subnormals kept): any positive finite scale.
    // Lengths <= 0 are padding (the kernel writes nothing for them), as in a decode.
    host_mirror(
        &req.host,
        &paged,
        s_q..=paged.capacity().min(I32_LIMIT),
        "s_q new rows, within the page table's capacity",
        &Shard::OFF,
    )?;
    append_slots_distinct(&req.host, &paged, s_q)?;

    Ok(PagedShape {
        batch,
        rows: s_q,
        page_size: paged.page_size,
        num_pages: paged.num_pages,
        max_pages: paged.max_pages,
        cache,
        other: new.dtype,
    })
}

/// Checks a gather of each sequence's rows into `out` and returns its shape
/// (`rows` = the output's rows per sequence, `other` = the type of `out`).
pub fn validate_gather(req: &GatherRequest) -> Result<PagedShape> {
    validate_gather_split(req, None)
}

/// [`validate_gather`] from a split cache (`kv_cache` 512 wide, `kpe` its rope part);
/// `out` rows stay 576 wide.
pub fn validate_gather_split(
    req: &GatherRequest,
    kpe: Option<&TensorView<3>>,
) -> Result<PagedShape> {
    let out_view = &req.out;
    let batch = dim_in(GATHER_OUT.shape[0], out_view.shape[0], 1..=U32_LIMIT)?;
    let max_len = dim_in(GATHER_OUT.shape[1], out_view.shape[1], 1..=U32_LIMIT)?;
    dim_is(GATHER_OUT.shape[2], out_view.shape[2], D_QK)?;
    unit_last_stride(&GATHER_OUT, out_view)?;
    // The kernel steps from row to row by D_QK elements: it takes no row stride.
    if max_len > 1 && out_view.strides[1] != D_QK {
        return Err(MlaError::shape(
            GATHER_OUT.strides[1],
            format!("{D_QK} (rows contiguous)"),
            out_view.strides[1],
        ));
    }
    let paged = paged_layout(
        &req.kv_cache,
        width(kpe.is_some()),
        &req.page_table,
        &req.seq_lens,
        batch,
        GATHER_OUT.shape[0],
    )?;

    let cache = paged_cache_dtype(req.kv_cache.dtype)?;
    // An fp8 cache is copied as it is or dequantised to bf16.
    let allowed: &[ElemType] = match cache {
        ElemType::Fp8E4m3 => &[ElemType::Fp8E4m3, ElemType::Bf16],
        ElemType::Bf16 => &[ElemType::Bf16],
        _ => &[ElemType::Fp16],
    };
    dtype_in(GATHER_OUT.tensor, out_view.dtype, allowed)?;
    index_dtypes(&req.page_table, &req.seq_lens)?;

    let out = placed(&GATHER_OUT, out_view, CHUNK_ALIGN)?;
    let [kv, page_table, seq_lens] =
        paged_placement(&req.kv_cache, &req.page_table, &req.seq_lens)?;
    no_self_overlap(&GATHER_OUT, out_view)?;
    let rope = match kpe {
        Some(k) => kpe_layout(k, &req.kv_cache)?,
        None => kv,
    };
    no_aliasing(&[out], &[kv, page_table, seq_lens, rope])?;

    positive("kv_scale", req.kv_scale)?;
    unit_unless_fp8("kv_scale", req.kv_scale, KV.tensor, cache)?;
    let longest = max_len.min(paged.capacity()).min(I32_LIMIT);
    // Negative lengths are padding, as in a decode (the kernel reads them as 0).
    let bound = "the page table's capacity and out's rows";
    host_mirror(&req.host, &paged, 0..=longest, bound, &Shard::OFF)?;

    Ok(PagedShape {
        batch,
        rows: max_len,
        page_size: paged.page_size,
        num_pages: paged.num_pages,
        max_pages: paged.max_pages,
        cache,
        other: out_view.dtype,
    })
}

// ---- layouts -------------------------------------------------------------------------

fn dim_in(field: &'static str, got: usize, ok: RangeInclusive<usize>) -> Result<usize> {
    if ok.contains(&got) {
        Ok(got)
    } else {
        Err(MlaError::shape(
            field,
            format!("{}..={}", ok.start(), ok.end()),
            got,
        ))
    }
}

fn dim_is(field: &'static str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(MlaError::shape(field, want, got))
    }
}

/// A dim that must repeat one checked earlier (`source` names where it came from).
fn dim_as(field: &'static str, got: usize, want: usize, source: &'static str) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(MlaError::shape(field, format!("{want} (as {source})"), got))
    }
}

/// The innermost dim is contiguous: the kernels read it in 16-byte chunks.
fn unit_last_stride<const R: usize>(names: &Names<R>, view: &TensorView<R>) -> Result<()> {
    let last = R - 1;
    if view.shape[last] > 1 && view.strides[last] != 1 {
        return Err(MlaError::shape(names.strides[last], 1, view.strides[last]));
    }
    Ok(())
}

/// Exactly row-major: for the tensors whose strides the kernels do not receive.
fn row_major<const R: usize>(names: &Names<R>, view: &TensorView<R>) -> Result<()> {
    row_major_from(names, view, 0)
}

/// Row-major over dims `first..R` (a stack of row-major blocks along the dims before).
fn row_major_from<const R: usize>(
    names: &Names<R>,
    view: &TensorView<R>,
    first: usize,
) -> Result<()> {
    let mut want = 1usize;
    for i in (first..R).rev() {
        if view.shape[i] > 1 && view.strides[i] != want {
            return Err(MlaError::shape(
                names.strides[i],
                format!("{want} (row-major)"),
                view.strides[i],
            ));
        }
        want = want.saturating_mul(view.shape[i]);
    }
    Ok(())
}

fn query_layout(q: &TensorView<4>, width: usize) -> Result<(usize, usize, usize)> {
    let batch = dim_in(Q.shape[0], q.shape[0], 1..=U32_LIMIT)?;
    let s_q = dim_in(Q.shape[1], q.shape[1], 1..=MAX_S_Q as usize)?;
    let heads = dim_in(Q.shape[2], q.shape[2], 1..=MAX_HEADS as usize)?;
    dim_is(Q.shape[3], q.shape[3], width)?;
    unit_last_stride(&Q, q)?;
    Ok((batch, s_q, heads))
}

/// `out` `[batch, s_q, heads, D_V]` with its last dim contiguous, `lse` `[batch, s_q, heads]`
/// row-major (the kernels take strides for `out` only).
fn decode_output_layout(
    out: &TensorView<4>,
    lse: &TensorView<3>,
    dims: [usize; 3],
    source: [&'static str; 3],
) -> Result<()> {
    for (i, &want) in dims.iter().enumerate() {
        dim_as(OUT.shape[i], out.shape[i], want, source[i])?;
    }
    dim_is(OUT.shape[3], out.shape[3], D_V)?;
    unit_last_stride(&OUT, out)?;
    for (i, &want) in dims.iter().enumerate() {
        dim_as(LSE.shape[i], lse.shape[i], want, source[i])?;
    }
    row_major(&LSE, lse)
}

/// The cache `[num_pages, page_size, D_QK]` with non-overlapping rows and pages, and the
/// page table `[batch, max_pages]` and lengths `[batch]` that index it.
fn paged_layout(
    kv: &TensorView<3>,
    width: usize,
    page_table: &TensorView<2>,
    seq_lens: &TensorView<1>,
    batch: usize,
    batch_source: &'static str,
) -> Result<Paged> {
    let num_pages = dim_in(KV.shape[0], kv.shape[0], 1..=U32_LIMIT)?;
    let page_size = kv.shape[1];
    if !page_size.is_power_of_two() || page_size > MAX_PAGE_SIZE as usize {
        return Err(MlaError::shape(
            KV.shape[1],
            format!("a power of two in 1..={MAX_PAGE_SIZE}"),
            page_size,
        ));
    }
    dim_is(KV.shape[2], kv.shape[2], width)?;
    unit_last_stride(&KV, kv)?;
    rows_apart(&KV, kv, width)?;

    dim_as(
        PAGE_TABLE.shape[0],
        page_table.shape[0],
        batch,
        batch_source,
    )?;
    let max_pages = dim_in(PAGE_TABLE.shape[1], page_table.shape[1], 1..=U32_LIMIT)?;
    unit_last_stride(&PAGE_TABLE, page_table)?;
    // The stride of an extent-1 dim is never looked at (convention at the top).
    let row_stride = if batch > 1 { page_table.strides[0] } else { 0 };
    if row_stride > U32_LIMIT {
        return Err(MlaError::shape(
            PAGE_TABLE.strides[0],
            format!("<= {U32_LIMIT} (a u32 kernel param)"),
            row_stride,
        ));
    }
    dim_as(SEQ_LENS.shape[0], seq_lens.shape[0], batch, batch_source)?;
    row_major(&SEQ_LENS, seq_lens)?;

    Ok(Paged {
        batch,
        page_size,
        num_pages,
        max_pages,
        row_stride,
    })
}

/// The width of a cache or q row: 576, or 512 when its rope part is a tensor of its own.
fn width(rope_apart: bool) -> usize {
    if rope_apart { D_V } else { D_QK }
}

/// Rows and pages of a cache (or its rope part) `width` elements wide share no element
/// (append writes rows in place).
fn rows_apart(names: &Names<3>, kv: &TensorView<3>, width: usize) -> Result<()> {
    let (num_pages, page_size) = (kv.shape[0], kv.shape[1]);
    let token_stride = if page_size > 1 {
        if kv.strides[1] < width {
            return Err(MlaError::shape(
                names.strides[1],
                format!(">= {width} (one row)"),
                kv.strides[1],
            ));
        }
        kv.strides[1]
    } else {
        width
    };
    if num_pages > 1 {
        let page_rows = page_size.checked_mul(token_stride);
        if page_rows.is_none_or(|need| kv.strides[0] < need) {
            return Err(MlaError::shape(
                names.strides[0],
                format!(">= page_size x token stride = {page_size} x {token_stride}"),
                kv.strides[0],
            ));
        }
    }
    Ok(())
}

/// The rope part of a split cache: `[num_pages, page_size, 64]` of the cache's dtype,
/// last dim contiguous, rows apart, 16-byte aligned rows.
fn kpe_layout(kpe: &TensorView<3>, kv: &TensorView<3>) -> Result<Span> {
    for i in 0..2 {
        dim_as(KPE.shape[i], kpe.shape[i], kv.shape[i], KV.shape[i])?;
    }
    dim_is(KPE.shape[2], kpe.shape[2], D_QK - D_V)?;
    dtype_in(KPE.tensor, kpe.dtype, &[kv.dtype])?;
    unit_last_stride(&KPE, kpe)?;
    rows_apart(&KPE, kpe, D_QK - D_V)?;
    placed(&KPE, kpe, CHUNK_ALIGN)
}

/// The rope part of a split q: `[batch, s_q, heads, 64]` of q's dtype, last dim
/// contiguous, 16-byte aligned rows.
fn q_pe_layout(q_pe: &TensorView<4>, q: &TensorView<4>) -> Result<Span> {
    for i in 0..3 {
        dim_as(Q_PE.shape[i], q_pe.shape[i], q.shape[i], Q.shape[i])?;
    }
    dim_is(Q_PE.shape[3], q_pe.shape[3], D_QK - D_V)?;
    dtype_in(Q_PE.tensor, q_pe.dtype, &[q.dtype])?;
    unit_last_stride(&Q_PE, q_pe)?;
    placed(&Q_PE, q_pe, CHUNK_ALIGN)
}

/// The page table must be able to hold the `s_q` tokens every sequence has at least.
fn enough_pages(paged: &Paged, s_q: usize) -> Result<()> {
    if paged.capacity() < s_q {
        return Err(MlaError::shape(
            PAGE_TABLE.shape[1],
            format!(
                ">= {} (pages for s_q = {s_q} tokens)",
                s_q.div_ceil(paged.page_size)
            ),
            paged.max_pages,
        ));
    }
    Ok(())
}

// ---- element types -------------------------------------------------------------------

fn dtype_in(field: &'static str, got: ElemType, allowed: &[ElemType]) -> Result<()> {
    if allowed.contains(&got) {
        return Ok(());
    }
    let expected: Vec<&str> = allowed.iter().map(|t| t.name()).collect();
    Err(MlaError::DtypeMismatch {
        field,
        expected: expected.join(" or "),
        got: got.name().to_string(),
    })
}

fn decode_dtypes(q: ElemType, kv: ElemType) -> Result<DecodeDtypes> {
    DecodeDtypes::from_types(q, kv).ok_or_else(|| {
        let pairs: Vec<String> = DecodeDtypes::ALL
            .iter()
            .map(|d| format!("({}, {})", d.q().name(), d.kv().name()))
            .collect();
        MlaError::Unsupported {
            what: "decode element types (q, kv_cache)",
            got: format!("({}, {})", q.name(), kv.name()),
            why: format!("supported pairs: {}", pairs.join(", ")),
        }
    })
}

/// Paged caches are 16-bit or fp8.
fn paged_cache_dtype(cache: ElemType) -> Result<ElemType> {
    match cache {
        ElemType::Bf16 | ElemType::Fp16 | ElemType::Fp8E4m3 => Ok(cache),
        ElemType::F32 | ElemType::I32 => Err(MlaError::Unsupported {
            what: "kv_cache element type",
            got: cache.name().to_string(),
            why: "paged caches are bf16, fp16 or fp8_e4m3".to_string(),
        }),
    }
}

/// The index tensors are i32.
fn index_dtypes(page_table: &TensorView<2>, seq_lens: &TensorView<1>) -> Result<()> {
    for (field, dtype) in [
        (PAGE_TABLE.tensor, page_table.dtype),
        (SEQ_LENS.tensor, seq_lens.dtype),
    ] {
        if dtype != ElemType::I32 {
            return Err(MlaError::DtypeMismatch {
                field,
                expected: "i32".to_string(),
                got: dtype.name().to_string(),
            });
        }
    }
    Ok(())
}

// ---- placement: null, alignment, byte span ---------------------------------------------

/// Non-null, `align`-aligned at its base and at every stride the kernels step by (all
/// but the contiguous last dim), and its byte span fits `u64`. Returns the span.
fn placed<const R: usize>(names: &Names<R>, view: &TensorView<R>, align: u64) -> Result<Span> {
    if view.ptr == 0 {
        return Err(MlaError::NullPointer {
            field: names.tensor,
        });
    }
    if !view.ptr.is_multiple_of(align) {
        return Err(MlaError::Misaligned {
            field: names.tensor,
            addr: view.ptr,
            align,
        });
    }
    let elem = view.dtype.size() as u128;
    for i in 0..R - 1 {
        let bytes = view.strides[i] as u128 * elem;
        if view.shape[i] > 1 && !bytes.is_multiple_of(u128::from(align)) {
            return Err(MlaError::Misaligned {
                field: names.strides[i],
                addr: u64::try_from(bytes).unwrap_or(u64::MAX),
                align,
            });
        }
    }
    let span = view.byte_span().ok_or_else(|| {
        MlaError::shape(
            names.tensor,
            "a byte span that fits in u64",
            format!(
                "shape {:?}, strides {:?} from {:#x}",
                view.shape, view.strides, view.ptr
            ),
        )
    })?;
    Ok((names.tensor, span))
}

fn paged_placement(
    kv: &TensorView<3>,
    page_table: &TensorView<2>,
    seq_lens: &TensorView<1>,
) -> Result<[Span; 3]> {
    Ok([
        placed(&KV, kv, CHUNK_ALIGN)?,
        placed(&PAGE_TABLE, page_table, WORD_ALIGN)?,
        placed(&SEQ_LENS, seq_lens, WORD_ALIGN)?,
    ])
}

// ---- outputs: self-overlap and aliasing -------------------------------------------------

/// No two elements of an output share an address: ordered by stride, each dim longer
/// than 1 steps past everything the dims inside it cover (the last dim is contiguous).
/// This accepts every row-major layout, padded or permuted.
fn no_self_overlap<const R: usize>(names: &Names<R>, view: &TensorView<R>) -> Result<()> {
    // A fixed array, not a Vec: validation runs on every decode step and allocates nothing.
    let mut dims = [(0usize, 0usize); R];
    let mut n = 0;
    for i in (0..R - 1).filter(|&i| view.shape[i] > 1) {
        dims[n] = (view.strides[i], view.shape[i]);
        n += 1;
    }
    dims[..n].sort_unstable();
    let mut covered = view.shape[R - 1] as u128;
    for &(stride, extent) in &dims[..n] {
        if (stride as u128) < covered {
            return Err(MlaError::shape(
                names.all_strides,
                "strides under which no two elements share an address",
                format!("{:?} for shape {:?}", view.strides, view.shape),
            ));
        }
        covered = covered.saturating_add((extent as u128 - 1) * stride as u128);
    }
    Ok(())
}

/// Two caches' rows share no byte, by their addresses modulo the row period: with the
/// same page and row strides, a page stride that is a multiple of the row stride (or one
/// page), every row of either starts at the same residue modulo the row stride (the page
/// stride for one-row pages), so rows whose residue intervals are disjoint never meet.
/// False where that does not show it (the span check then decides).
fn rows_disjoint(a: &TensorView<3>, b: &TensorView<3>) -> bool {
    let elem = a.dtype.size() as u128;
    if b.dtype != a.dtype || a.shape[..2] != b.shape[..2] || a.strides[..2] != b.strides[..2] {
        return false;
    }
    let (page, row) = (a.strides[0] as u128 * elem, a.strides[1] as u128 * elem);
    let period = if a.shape[1] > 1 {
        if a.shape[0] > 1 && (row == 0 || !page.is_multiple_of(row)) {
            return false;
        }
        row
    } else if a.shape[0] > 1 {
        page
    } else {
        // One row each: their spans are exact.
        return false;
    };
    let (wa, wb) = (a.shape[2] as u128 * elem, b.shape[2] as u128 * elem);
    if period == 0 || wa + wb > period {
        return false;
    }
    // b's row start, relative to a's, modulo the period: b's bytes [d, d + wb) must lie in
    // a's gap [wa, period).
    let d = (u128::from(b.ptr) + period - u128::from(a.ptr) % period) % period;
    d >= wa && d + wb <= period
}

/// Each output's span is disjoint from every earlier output's and from every input's.
fn no_aliasing(outputs: &[Span], inputs: &[Span]) -> Result<()> {
    for (i, &(a, (a0, a1))) in outputs.iter().enumerate() {
        for &(b, (b0, b1)) in outputs[..i].iter().chain(inputs) {
            if a0 < b1 && b0 < a1 {
                return Err(MlaError::Aliasing { a, b });
            }
        }
    }
    Ok(())
}

// ---- scales --------------------------------------------------------------------------

fn finite(field: &'static str, value: f32) -> Result<()> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(MlaError::shape(field, "a finite value", value))
    }
}

fn positive(field: &'static str, value: f32) -> Result<()> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(MlaError::shape(field, "a finite value > 0", value))
    }
}

/// Only fp8 tensors are dequantised: a scale on a 16-bit one would be silently ignored.
fn unit_unless_fp8(field: &'static str, value: f32, tensor: &str, dtype: ElemType) -> Result<()> {
    if dtype == ElemType::Fp8E4m3 || value == 1.0 {
        return Ok(());
    }
    Err(MlaError::shape(
        field,
        format!(
            "1 ({tensor} is {}: only fp8 tensors are dequantised)",
            dtype.name()
        ),
        value,
    ))
}

fn decode_scales(scales: &Scales, dtypes: DecodeDtypes) -> Result<()> {
    positive("scales.softmax_scale", scales.softmax_scale)?;
    finite("scales.output_scale", scales.output_scale)?;
    positive("scales.q_scale", scales.q_scale)?;
    positive("scales.kv_scale", scales.kv_scale)?;
    unit_unless_fp8("scales.q_scale", scales.q_scale, Q.tensor, dtypes.q())?;
    unit_unless_fp8("scales.kv_scale", scales.kv_scale, KV.tensor, dtypes.kv())?;
    // The kernels use products of the scales (the logits' factor in base 2, the outputs'
    // dequantising factor): each factor finite is not enough.
    positive(
        "scales.softmax_scale * q_scale * kv_scale * log2(e)",
        scales.softmax_scale * scales.q_scale * scales.kv_scale * core::f32::consts::LOG2_E,
    )?;
    finite(
        "scales.output_scale * kv_scale",
        scales.output_scale * scales.kv_scale,
    )
}

// ---- host mirror ---------------------------------------------------------------------

/// Lengths in `lens` (`bound` names its end in errors) or <= 0 (padding: no page); each
/// known sequence's used page ids (entries `0..ceil(L / page_size)`
/// of its row) name a page of the cache. Entries past them are never read and may hold
/// anything. Without host lengths every entry of the table counts as used. With a shard on,
/// the lengths are global and `L` is this rank's share of each ([`Shard::local_len`]),
/// which must fit the page table.
fn host_mirror(
    host: &HostMirror,
    paged: &Paged,
    lens: RangeInclusive<usize>,
    bound: &str,
    shard: &Shard,
) -> Result<()> {
    if let Some(seq_lens) = host.seq_lens {
        if seq_lens.len() != paged.batch {
            return Err(MlaError::shape(
                "host.seq_lens.len()",
                format!("{} (the batch)", paged.batch),
                seq_lens.len(),
            ));
        }
        for (b, &len) in seq_lens.iter().enumerate() {
            // Padding (len <= 0) uses no page and writes nothing.
            if len <= 0 {
                continue;
            }
            if !usize::try_from(len).is_ok_and(|l| lens.contains(&l)) {
                let (lo, hi) = (*lens.start(), *lens.end());
                return Err(MlaError::OutOfRange {
                    field: SEQ_LENS.tensor,
                    index: b,
                    expected: if lo <= 1 {
                        format!("a length <= {hi} ({bound}; <= 0 is padding)")
                    } else {
                        format!("a length in {lo}..={hi} ({bound}; <= 0 is padding)")
                    },
                    got: i64::from(len),
                });
            }
        }
        let capacity = paged.capacity().min(I32_LIMIT);
        for (b, &len) in seq_lens.iter().enumerate().filter(|_| shard.is_on()) {
            let l = shard.local_len(len);
            if l.max(0) as usize > capacity {
                return Err(MlaError::OutOfRange {
                    field: SEQ_LENS.tensor,
                    index: b,
                    expected: format!(
                        "a global length whose share on rank {} of {} (interleave {}), \
                         here {l} tokens, fits the page table: <= {capacity}",
                        shard.rank, shard.ranks, shard.interleave
                    ),
                    got: i64::from(len),
                });
            }
        }
    }
    let Some(table) = host.page_table else {
        return Ok(());
    };
    let need = (paged.batch - 1)
        .checked_mul(paged.row_stride)
        .and_then(|rows| rows.checked_add(paged.max_pages))
        .filter(|&need| need <= table.len());
    let Some(need) = need else {
        return Err(MlaError::shape(
            "host.page_table.len()",
            format!(
                ">= (batch - 1) x row stride + max_pages = {} x {} + {}",
                paged.batch - 1,
                paged.row_stride,
                paged.max_pages
            ),
            table.len(),
        ));
    };
    match host.seq_lens {
        // Rows that overlap or touch cover `0..need` without a gap: check each entry once.
        None if paged.row_stride <= paged.max_pages => page_ids(table, 0..need, paged.num_pages),
        _ => {
            // Row starts ascend with `b`; `next` skips entries an earlier row checked.
            let mut next = 0;
            for b in 0..paged.batch {
                // Lengths were checked above: within the table's capacity; a decode's
                // padding (<= 0) uses no entry.
                let used = host.seq_lens.map_or(paged.max_pages, |lens| {
                    (shard.local_len(lens[b]).max(0) as usize).div_ceil(paged.page_size)
                });
                let start = b * paged.row_stride;
                page_ids(table, start.max(next)..start + used, paged.num_pages)?;
                next = next.max(start + used);
            }
            Ok(())
        }
    }
}

/// Every entry of `table[entries]` names a page of the cache.
fn page_ids(table: &[i32], entries: Range<usize>, num_pages: usize) -> Result<()> {
    for index in entries {
        let id = table[index];
        if !usize::try_from(id).is_ok_and(|p| p < num_pages) {
            return Err(MlaError::OutOfRange {
                field: PAGE_TABLE.tensor,
                index,
                expected: format!("a page id in 0..{num_pages}"),
                got: i64::from(id),
            });
        }
    }
    Ok(())
}

/// No two new rows of an append land on the same cache slot (their writes would race).
/// Needs both host mirrors, already checked by [`host_mirror`].
fn append_slots_distinct(host: &HostMirror, paged: &Paged, s_q: usize) -> Result<()> {
    let (Some(seq_lens), Some(table)) = (host.seq_lens, host.page_table) else {
        return Ok(());
    };
    let mut writer: HashMap<(i32, usize), usize> = HashMap::new();
    for (b, &len) in seq_lens.iter().enumerate() {
        // Padding (<= 0) writes nothing; other lengths are at least s_q (checked).
        let Some(len) = usize::try_from(len).ok().filter(|&l| l >= s_q) else {
            continue;
        };
        for pos in len - s_q..len {
            let index = b * paged.row_stride + pos / paged.page_size;
            let slot = pos % paged.page_size;
            let page = table[index];
            if let Some(other) = writer.insert((page, slot), b) {
                return Err(MlaError::OutOfRange {
                    field: PAGE_TABLE.tensor,
                    index,
                    expected: format!(
                        "a page whose slot {slot} no other new row writes (sequence {other} \
                         writes it too)"
                    ),
                    got: i64::from(page),
                });
            }
        }
    }
    Ok(())
}
