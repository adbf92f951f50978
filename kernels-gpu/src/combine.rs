//! Split-KV combine: merges the per-chunk partials `(O_i, lse_i)` of a query row into the
//! final output with the exact log-sum-exp rule
//! `lse = log(sum_i exp(lse_i))`, `O = sum_i exp(lse_i - lse) * O_i`.
//!
//! - Grid: `(s_q * heads, batch)`: one CTA per query row. Block: `combine_tile::THREADS`
//!   (128); thread `t` owns output dims `4t .. 4t + 4`.
//! - Shared memory: none.
//! - Reads [`CombineParams`]: `num_splits[b]` (sequences with one split are skipped: the
//!   decode kernel wrote their output), `partial_lse`, `partial_o`; writes `out`, `lse`.
//! - Chunks with `lse_i = -inf` (no visible keys) get weight exactly 0; a row whose chunks
//!   are all empty gets `out = 0`, `lse = -inf`, never NaN.

use crate::arch::{self, sync};
use crate::elem::Half16;
use mla_abi::{CombineParams, D_V, combine_tile};

const LOG2E: f32 = core::f32::consts::LOG2_E;
const LN2: f32 = core::f32::consts::LN_2;

/// # Safety
/// Launched with the grid and block above on params that the host validated.
#[inline(always)]
pub unsafe fn combine<O: Half16>(p: CombineParams) {
    let row = arch::block_idx_x();
    let b = arch::block_idx_y();
    let rows = p.s_q * p.heads;
    if row >= rows || b >= p.batch {
        return;
    }
    // SAFETY: b < batch and num_splits has batch entries.
    let splits = unsafe { *p.num_splits.ptr().add(b as usize) };
    if splits <= 1 {
        return;
    }
    let splits = (splits as u32).min(p.max_splits);
    let split_stride = (p.batch * rows) as usize;
    let row_idx = (b * rows + row) as usize;

    // SAFETY (all loads below): split < max_splits and row_idx < batch * rows index the
    // workspace the host sized as max_splits * batch * rows (* D_V).
    let lse_at = |i: u32| unsafe { *p.partial_lse.ptr().add(i as usize * split_stride + row_idx) };
    let mut m = f32::NEG_INFINITY;
    for i in 0..splits {
        m = sync::fmax(m, lse_at(i));
    }

    let t = arch::thread_idx_x() as usize;
    let dim0 = t * combine_tile::DIMS_PER_THREAD;
    let mut acc = [0.0f32; combine_tile::DIMS_PER_THREAD];
    let mut sum = 0.0f32;
    if m != f32::NEG_INFINITY {
        for i in 0..splits {
            let l = lse_at(i);
            if l == f32::NEG_INFINITY {
                // An empty chunk: weight 0, and its O is never read (it may be garbage).
                continue;
            }
            let w = sync::ex2((l - m) * LOG2E);
            sum += w;
            let src = (i as usize * split_stride + row_idx) * D_V + dim0;
            // SAFETY: 16-byte aligned (D_V and dim0 multiples of 4 f32) and in bounds.
            let v = unsafe { arch::smem::ld_global_nc_v4(p.partial_o.ptr().add(src) as *const u8) };
            for j in 0..combine_tile::DIMS_PER_THREAD {
                acc[j] += w * f32::from_bits(v[j]);
            }
        }
    }
    let (scale, lse) = if sum > 0.0 {
        (p.output_scale / sum, m + sync::lg2(sum) * LN2)
    } else {
        (0.0, f32::NEG_INFINITY)
    };

    let tok = row / p.heads;
    let head = row % p.heads;
    let dst =
        b as u64 * p.out_stride_b + tok as u64 * p.out_stride_s + head as u64 * p.out_stride_h;
    let packed = [
        O::pack2(acc[0] * scale, acc[1] * scale),
        O::pack2(acc[2] * scale, acc[3] * scale),
    ];
    // SAFETY: dst + dim0 + 4 <= the row's D_V elements of `out` (validated strides); 8-byte
    // aligned since dim0 is a multiple of 4 and the host checked row alignment.
    unsafe {
        let o = (p.out.ptr() as *mut u16).add(dst as usize + dim0) as *mut [u32; 2];
        *o = packed;
        if t == 0 {
            *p.lse.ptr().add(row_idx) = lse;
        }
    }
}
