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

/// # Safety
/// Launched with the grid and block above and 32 bytes of dynamic shared memory, on params
/// the host validated.
#[inline(always)]
pub unsafe fn decode_reference<K: DecodeKind>(p: DecodeParams) {
    let row = arch::block_idx_x();
    let b = arch::block_idx_y();
    let rows = p.s_q * p.heads;
    if row >= rows || b >= p.batch {
        return;
    }
    let tid = arch::thread_idx_x() as usize;
    let (t, h) = (row / p.heads, row % p.heads);
    // SAFETY: b < batch entries.
    let glen_raw = unsafe { *p.seq_lens.ptr().add(b as usize) };
    if glen_raw <= 0 {
        // A padding slot, as the split decodes skip it: its rows are not written.
        return;
    }
    let len_raw = p.shard.local_len(glen_raw);
    let len = mla_abi::clamp_len(len_raw, p.max_pages.saturating_mul(p.page_size));
    if !p.fault.is_null() && row == 0 {
        // SAFETY: b < batch; every token below the clamped length.
        unsafe { crate::decode::check_faults(&p, b, len_raw, true, 0, len) };
    }
    let visible = if p.shard.is_on() {
        p.shard
            .visible(mla_abi::clamp_len(glen_raw, u32::MAX), len, t, p.s_q)
    } else {
        (len + t + 1).saturating_sub(p.s_q)
    };

    let q_elem = if K::Q_FP8 { 1 } else { 2 };
    let kv_elem = if K::KV_FP8 { 1 } else { 2 };
    let q_off = b as u64 * p.q_stride_b + t as u64 * p.q_stride_s + h as u64 * p.q_stride_h;
    let q_pe_off =
        b as u64 * p.q_pe_stride_b + t as u64 * p.q_pe_stride_s + h as u64 * p.q_pe_stride_h;
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

    let scale_log2 = p.softmax_scale * LOG2E;
    let red = smem::smem_base();
    let warp = (tid / 32) as u32;
    let mut m = f32::NEG_INFINITY;
    let mut l = 0.0f32;
    let mut acc = [0.0f32; 4];
    let mut j = 0u32;
    while j < visible {
        let slot = red + (j % 2) * 16;
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
        let (kv_row, kpe_row) = unsafe {
            (
                (p.kv_cache.ptr() as *const u8).add(off as usize * kv_elem),
                (p.kpe.ptr() as *const u8).add(off_pe as usize * kv_elem),
            )
        };
        let mut dot = 0.0f32;
        if valid {
            unroll!(k in [0, 1, 2, 3, 4] {
                let i = tid + k * THREADS;
                if i < D_QK {
                    let (row, d) = if i < D_V { (kv_row, i) } else { (kpe_row, i - D_V) };
                    // SAFETY: dim d of a valid row's part.
                    dot += qv[k] * unsafe { elem::<K>(row, d, K::KV_FP8) };
                }
            });
        }
        // SAFETY: every thread of the CTA runs the shuffles and the barrier (the loop bound
        // is CTA-uniform); the slots are inside the 32-byte shared buffer.
        let s = unsafe {
            let mut off = 16;
            while off > 0 {
                dot += sync::shfl_xor_f32(dot, off);
                off /= 2;
            }
            if tid.is_multiple_of(32) {
                smem::st_shared_f32(slot + warp * 4, dot);
            }
            sync::bar_sync();
            let mut s = 0.0;
            for w in 0..(THREADS / 32) as u32 {
                s += smem::ld_shared_f32(slot + w * 4);
            }
            s * scale_log2
        };
        let m_new = sync::fmax(m, s);
        let alpha = sync::ex2(m - m_new);
        let pj = sync::ex2(s - m_new);
        l = l * alpha + pj;
        unroll!(d in [0, 1, 2, 3] {
            let v = if valid {
                // SAFETY: dims 4 tid + d < 512 of a valid row.
                unsafe { elem::<K>(kv_row, 4 * tid + d, K::KV_FP8) }
            } else {
                0.0
            };
            acc[d] = acc[d] * alpha + pj * v;
        });
        m = m_new;
        j += 1;
    }

    let (inv, lse) = if l > 0.0 {
        (1.0 / l, (m + sync::lg2(l)) * LN2)
    } else {
        (0.0, f32::NEG_INFINITY)
    };
    let scale = inv * p.value_scale * p.output_scale;
    let o_off = b as u64 * p.out_stride_b + t as u64 * p.out_stride_s + h as u64 * p.out_stride_h;
    // SAFETY: dims 4 tid .. +4 of a validated out row; 8-byte aligned.
    unsafe {
        let dst = (p.out.ptr() as *mut u16).add(o_off as usize + 4 * tid) as *mut [u32; 2];
        *dst = [
            K::Mma::pack2(acc[0] * scale, acc[1] * scale),
            K::Mma::pack2(acc[2] * scale, acc[3] * scale),
        ];
        if tid == 0 {
            *p.lse.ptr().add((b * rows + row) as usize) = lse;
        }
    }
}
