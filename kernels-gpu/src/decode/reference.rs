//! The plain reference decode: one CTA per query row, serial over the visible tokens, f32
//! arithmetic, online softmax. Slow on purpose and kept for debugging (the `reference`
//! backend); it shares no tile code with the tensor-core kernel.
//!
//! - Grid: `(s_q * heads, batch)`. Block: `ref_tile::THREADS` (128). Thread `t` holds q dims
//!   `t + 128 k` and accumulates output dims `4t .. 4t + 4`.
//! - Shared memory: 2 x 4 f32 (per-warp partial dot products, double-buffered by token).
//! - Reads [`DecodeParams`] (the workspace fields are unused); writes `out` and `lse`,
//!   except for padding sequences (length <= 0), whose rows are left as they are.

use crate::arch::{self, cvt, smem, sync};
use crate::decode::DecodeKind;
use crate::elem::Half16;
use mla_abi::{D_QK, D_V, DecodeParams, ref_tile};

const LOG2E: f32 = core::f32::consts::LOG2_E;
const LN2: f32 = core::f32::consts::LN_2;
const THREADS: usize = ref_tile::THREADS;
/// q dims per thread (576 / 128, rounded up).
const QK_PER_THREAD: usize = D_QK.div_ceil(THREADS);

/// Element `i` of a row of q or kv, as f32.
#[inline(always)]
unsafe fn elem<K: DecodeKind>(row: *const u8, i: usize, fp8: bool) -> f32 {
    // SAFETY: the caller passes i < D_QK of a valid row.
    unsafe {
        if fp8 {
            cvt::e4m3_to_f32(*row.add(i) as u32)
        } else {
            K::Mma::to_f32(*(row as *const u16).add(i))
        }
    }
}

/// Query row `row` (token `t`, head `h`) of sequence `b`.
#[derive(Clone, Copy)]
struct Row {
    b: u32,
    row: u32,
    t: u32,
    h: u32,
}

/// The keys query row `row` of sequence `b` attends to (`0..visible`), or `None` when the
/// CTA has no row: past the rows or the batch, or a padding slot (length <= 0, whose rows
/// the split decodes skip too and which is not written). In checked mode the row-0 CTA
/// checks the sequence's length and page-table entries.
#[inline(always)]
fn row_extent(p: &DecodeParams, r: Row) -> Option<u32> {
    if r.row >= p.s_q * p.heads || r.b >= p.batch {
        return None;
    }
    // SAFETY: b < batch entries.
    let glen_raw = unsafe { *p.seq_lens.ptr().add(r.b as usize) };
    if glen_raw <= 0 {
        return None;
    }
    let len_raw = p.shard.local_len(glen_raw);
    let len = mla_abi::clamp_len(len_raw, p.max_pages.saturating_mul(p.page_size));
    if !p.fault.is_null() && r.row == 0 {
        // SAFETY: b < batch; every token below the clamped length.
        unsafe { crate::decode::check_faults(p, r.b, len_raw, true, 0, len) };
    }
    Some(if p.shard.is_on() {
        p.shard
            .visible(mla_abi::clamp_len(glen_raw, u32::MAX), len, r.t, p.s_q)
    } else {
        (len + r.t + 1).saturating_sub(p.s_q)
    })
}

/// This thread's q dims `tid + 128 k` of the row, as f32 (0 past `D_QK`).
///
/// # Safety
/// `p` is validated and `r` is a row of it ([`row_extent`]).
#[inline(always)]
unsafe fn load_q<K: DecodeKind>(p: &DecodeParams, r: Row, tid: usize) -> [f32; QK_PER_THREAD] {
    let q_elem = if K::Q_FP8 { 1 } else { 2 };
    let (b, t, h) = (r.b as u64, r.t as u64, r.h as u64);
    let q_off = p.q_row(b, t, h);
    let q_pe_off = p.q_pe_row(b, t, h);
    // SAFETY: a validated q row and its rope part.
    let (q_row, q_pe_row) = unsafe {
        (
            (p.q.ptr() as *const u8).add(q_off as usize * q_elem),
            (p.q_pe.ptr() as *const u8).add(q_pe_off as usize * q_elem),
        )
    };
    let mut qv = [0.0f32; QK_PER_THREAD];
    unroll!(k in [0, 1, 2, 3, 4] {
        let i = tid + k * THREADS;
        if i < D_QK {
            let (row, d) = if i < D_V { (q_row, i) } else { (q_pe_row, i - D_V) };
            // SAFETY: dim d of the row's part.
            qv[k] = unsafe { elem::<K>(row, d, K::Q_FP8) };
        }
    });
    qv
}

/// Where token `j`'s cache row and its rope part are; `valid` is false (and the rows are
/// not read) for a page-table entry outside `0..num_pages`.
#[derive(Clone, Copy)]
struct Token {
    kv: *const u8,
    kpe: *const u8,
    valid: bool,
}

/// [`Token`] of token `j` of sequence `b`.
///
/// # Safety
/// `b < batch` and `j` is below the sequence's clamped length (so inside row `b` of the
/// page table).
#[inline(always)]
unsafe fn token_source<K: DecodeKind>(p: &DecodeParams, b: u32, j: u32) -> Token {
    let kv_elem = if K::KV_FP8 { 1 } else { 2 };
    let page_slot = b as usize * p.page_table_stride as usize + (j >> p.page_shift) as usize;
    // SAFETY: j < len <= max_pages * page_size: inside row b of the table.
    let page = unsafe { *p.page_table.ptr().add(page_slot) };
    let valid = page >= 0 && (page as u32) < p.num_pages;
    let tok = (j & (p.page_size - 1)) as u64;
    let (off, off_pe) = if valid {
        (
            page as u64 * p.kv_stride_page + tok * p.kv_stride_token,
            page as u64 * p.kpe_stride_page + tok * p.kpe_stride_token,
        )
    } else {
        (0, 0)
    };
    // SAFETY: a cache row and its rope part (or unused when the page is invalid).
    unsafe {
        Token {
            kv: (p.kv_cache.ptr() as *const u8).add(off as usize * kv_elem),
            kpe: (p.kpe.ptr() as *const u8).add(off_pe as usize * kv_elem),
            valid,
        }
    }
}

/// The token's logit q . k (f32, not yet scaled): this thread's dims, summed over the warp
/// with shuffles and over the warps through the 16-byte shared slot `slot`.
///
/// # Safety
/// Every thread of the CTA calls it together (a CTA barrier inside); `slot` is one of the
/// two 16-byte halves of the shared buffer, not the one the previous token used.
#[inline(always)]
unsafe fn score<K: DecodeKind>(
    qv: &[f32; QK_PER_THREAD],
    tok: Token,
    tid: usize,
    slot: u32,
) -> f32 {
    let mut dot = 0.0f32;
    if tok.valid {
        unroll!(k in [0, 1, 2, 3, 4] {
            let i = tid + k * THREADS;
            if i < D_QK {
                let (row, d) = if i < D_V { (tok.kv, i) } else { (tok.kpe, i - D_V) };
                // SAFETY: dim d of a valid row's part.
                dot += qv[k] * unsafe { elem::<K>(row, d, K::KV_FP8) };
            }
        });
    }
    // SAFETY: forwarded from the caller; the slot holds one f32 per warp.
    unsafe {
        let mut off = 16;
        while off > 0 {
            dot += sync::shfl_xor_f32(dot, off);
            off /= 2;
        }
        let warp = (tid / 32) as u32;
        smem::st_shared_f32_if(slot + warp * 4, dot, tid.is_multiple_of(32) as u32);
        sync::bar_sync();
        let mut s = 0.0;
        for w in 0..(THREADS / 32) as u32 {
            s += smem::ld_shared_f32(slot + w * 4);
        }
        s
    }
}

/// The token's value dims `4 tid .. +4` (zeros for an invalid page).
///
/// # Safety
/// `tok` is from [`token_source`].
#[inline(always)]
unsafe fn token_values<K: DecodeKind>(tok: Token, tid: usize) -> [f32; 4] {
    let mut v = [0.0f32; 4];
    if tok.valid {
        unroll!(d in [0, 1, 2, 3] {
            // SAFETY: dims 4 tid + d < 512 of a valid row.
            v[d] = unsafe { elem::<K>(tok.kv, 4 * tid + d, K::KV_FP8) };
        });
    }
    v
}

/// Normalises this thread's output dims `4 tid .. +4` and stores them to `out`, and (thread
/// 0) the row's LSE.
///
/// # Safety
/// `out` and `lse` hold the row (validated).
#[inline(always)]
unsafe fn store_row<K: DecodeKind>(
    p: &DecodeParams,
    r: Row,
    tid: usize,
    m: f32,
    l: f32,
    acc: [f32; 4],
) {
    // A NaN sum (a NaN among the visible keys) makes the row NaN, its LSE too
    // (`decode::row_norm`).
    let (inv, lse) = if l > 0.0 {
        (1.0 / l, (m + sync::lg2(l)) * LN2)
    } else if l == 0.0 {
        (0.0, f32::NEG_INFINITY)
    } else {
        (f32::NAN, f32::NAN)
    };
    let scale = inv * p.value_scale * p.output_scale;
    let (b, t, h) = (r.b as u64, r.t as u64, r.h as u64);
    let o_off = b * p.out_stride_b + t * p.out_stride_s + h * p.out_stride_h;
    // SAFETY: dims 4 tid .. +4 of a validated out row; 8-byte aligned.
    unsafe {
        let dst = (p.out.ptr() as *mut u16).add(o_off as usize + 4 * tid) as *mut [u32; 2];
        *dst = [
            K::Mma::pack2(acc[0] * scale, acc[1] * scale),
            K::Mma::pack2(acc[2] * scale, acc[3] * scale),
        ];
        if tid == 0 {
            *p.lse.ptr().add((r.b * p.s_q * p.heads + r.row) as usize) = lse;
        }
    }
}

/// The kernel body (see the module docs): the row's extent, its q, then per visible token
/// the score, the online-softmax step and the values; the row is stored at the end.
///
/// # Safety
/// Launched with the grid and block above and 32 bytes of dynamic shared memory, on params
/// the host validated.
#[inline(always)]
pub unsafe fn decode_reference<K: DecodeKind>(p: DecodeParams) {
    let row = arch::block_idx_x();
    let r = Row {
        b: arch::block_idx_y(),
        row,
        t: row / p.heads,
        h: row % p.heads,
    };
    let Some(visible) = row_extent(&p, r) else {
        return;
    };
    let tid = arch::thread_idx_x() as usize;
    // SAFETY: a row of the validated params.
    let qv = unsafe { load_q::<K>(&p, r, tid) };
    let scale_log2 = p.softmax_scale * LOG2E;
    let red = smem::smem_base();
    let mut m = f32::NEG_INFINITY;
    let mut l = 0.0f32;
    let mut acc = [0.0f32; 4];
    let mut j = 0u32;
    while j < visible {
        // SAFETY: j < visible <= the clamped length.
        let tok = unsafe { token_source::<K>(&p, r.b, j) };
        // SAFETY: every thread runs the loop the same number of times (CTA-uniform bound);
        // tokens alternate between the two slots of the shared buffer.
        let s = unsafe { score::<K>(&qv, tok, tid, red + (j % 2) * 16) } * scale_log2;
        let m_new = sync::fmax(m, s);
        let alpha = sync::ex2(m - m_new);
        let pj = sync::ex2(s - m_new);
        l = l * alpha + pj;
        // SAFETY: from token_source.
        let v = unsafe { token_values::<K>(tok, tid) };
        unroll!(d in [0, 1, 2, 3] {
            acc[d] = acc[d] * alpha + pj * v[d];
        });
        m = m_new;
        j += 1;
    }
    // SAFETY: the host sized out and lse (validated).
    unsafe { store_row::<K>(&p, r, tid, m, l, acc) };
}
