//! The decodes' row statistics and outputs: quad reductions, the online-softmax rescale,
//! the cross-warp exchange reductions (`red_*`), a row's normalisation, and the row stores
//! to `out` / `lse` or the split partials.

use super::{DecodeKind, LN2, Layout, O_TILES_MAX};
use crate::arch::{smem, sync};
use crate::elem::Half16;
use mla_abi::{D_V, DecodeParams};

/// Row max over the quad (the 4 lanes sharing a row).
#[inline(always)]
pub(crate) unsafe fn quad_max(v: f32) -> f32 {
    // SAFETY: forwarded: the warp is converged.
    unsafe {
        let v = sync::fmax(v, sync::shfl_xor_f32(v, 1));
        sync::fmax(v, sync::shfl_xor_f32(v, 2))
    }
}

#[inline(always)]
pub(crate) unsafe fn quad_sum(v: f32) -> f32 {
    // SAFETY: forwarded: the warp is converged.
    unsafe {
        let v = v + sync::shfl_xor_f32(v, 1);
        v + sync::shfl_xor_f32(v, 2)
    }
}

/// One online-softmax step for a thread's two rows: from the new running maxima `m_new`
/// (log2 units) returns the exponent reference of each row and the factor `alpha` that the
/// row's earlier sums and accumulators take, and updates `m_run` and `l_run`. A row with
/// nothing visible yet keeps max -inf and uses 0 as its reference, so that exp2(-inf - ref)
/// is 0 and never NaN.
#[inline(always)]
pub(crate) fn rescale_rows(
    m_run: &mut [f32; 2],
    l_run: &mut [f32; 2],
    m_new: [f32; 2],
) -> ([f32; 2], [f32; 2]) {
    let m_ref = m_new.map(|m| if m == f32::NEG_INFINITY { 0.0 } else { m });
    let alpha = [
        sync::ex2(m_run[0] - m_ref[0]),
        sync::ex2(m_run[1] - m_ref[1]),
    ];
    *m_run = m_new;
    l_run[0] *= alpha[0];
    l_run[1] *= alpha[1];
    (m_ref, alpha)
}

/// Max over the column splits of row `r` in the exchange buffer `[CS][BM]` ([`red_max_of`]
/// with the layout's).
///
/// # Safety
/// As [`red_max_of`].
#[inline(always)]
pub(crate) unsafe fn red_max<L: Layout>(red: u32, r: u32) -> f32 {
    // SAFETY: forwarded from the caller.
    unsafe { red_max_of(red, L::CS, L::BM, r) }
}

/// Sum over the column splits of row `r` in the exchange buffer `[CS][BM]` ([`red_sum_of`]
/// with the layout's).
///
/// # Safety
/// As [`red_max_of`].
#[inline(always)]
pub(crate) unsafe fn red_sum<L: Layout>(red: u32, r: u32) -> f32 {
    // SAFETY: forwarded from the caller.
    unsafe { red_sum_of(red, L::CS, L::BM, r) }
}

/// Max over `splits` writers of row `r` in the exchange buffer `[splits][rows]` f32.
///
/// # Safety
/// `red` is the exchange buffer (`splits * rows` floats, `r < rows`) and the writes to it
/// are ordered by a barrier.
#[inline(always)]
pub(crate) unsafe fn red_max_of(red: u32, splits: u32, rows: u32, r: u32) -> f32 {
    let mut m = f32::NEG_INFINITY;
    for c in 0..splits {
        // SAFETY: c * rows + r < splits * rows floats.
        m = sync::fmax(m, unsafe { smem::ld_shared_f32(red + (c * rows + r) * 4) });
    }
    m
}

/// Sum over `splits` writers of row `r` in the exchange buffer `[splits][rows]`, in writer
/// order (every reader adds in the same order and gets the same value).
///
/// # Safety
/// As [`red_max_of`].
#[inline(always)]
pub(crate) unsafe fn red_sum_of(red: u32, splits: u32, rows: u32, r: u32) -> f32 {
    let mut l = 0.0;
    for c in 0..splits {
        // SAFETY: as above.
        l += unsafe { smem::ld_shared_f32(red + (c * rows + r) * 4) };
    }
    l
}

/// A row's output factor and natural-log LSE from its exp-sum `l` and running max `m`
/// (log2 units): `(1 / l, (m + log2 l) ln 2)`, `(0, -inf)` for a row that saw nothing, and
/// `(NaN, NaN)` for a row whose sum is NaN (a NaN among its visible keys, or logits that
/// overflowed): a split's partial then carries NaN to the combine, which must not take it
/// for an empty chunk.
#[inline(always)]
pub(crate) fn row_norm(l: f32, m: f32) -> (f32, f32) {
    if l > 0.0 {
        (sync::rcp(l), (m + sync::lg2(l)) * LN2)
    } else if l == 0.0 {
        (0.0, f32::NEG_INFINITY)
    } else {
        (f32::NAN, f32::NAN)
    }
}

/// Normalises the accumulators and stores this thread's two rows: to `out`/`lse` when the
/// sequence has one split, else to the workspace partials.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn write_rows<K: DecodeKind, L: Layout>(
    p: &DecodeParams,
    o: &[[f32; 4]; O_TILES_MAX],
    l_tot: [f32; 2],
    m_run: [f32; 2],
    b: u32,
    row_a: u32,
    split: u32,
    nsplit: u32,
    ch: u32,
    c4: u32,
) {
    let rows = p.s_q * p.heads;
    let direct = nsplit == 1;
    unroll!(half in [0, 1] {
        let gr = row_a + 8 * half as u32;
        if gr < rows {
            let (inv, lse) = row_norm(l_tot[half], m_run[half]);
            let row_idx = (b * rows + gr) as usize;
            let dim0 = (ch as usize * (D_V / L::CS as usize)) + 2 * c4 as usize;
            if direct {
                let scale = inv * p.value_scale * p.output_scale;
                let (t, h) = (gr / p.heads, gr % p.heads);
                let row_off = b as u64 * p.out_stride_b + t as u64 * p.out_stride_s + h as u64 * p.out_stride_h;
                // SAFETY: dims < 512 of a validated out row; 4-byte aligned pairs.
                let dst = unsafe { (p.out.ptr() as *mut u16).add(row_off as usize + dim0) };
                unroll!(nt in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
                    if nt < L::O_TILES {
                        let v = K::Mma::pack2(o[nt][2 * half] * scale, o[nt][2 * half + 1] * scale);
                        // SAFETY: as above.
                        unsafe { *(dst.add(nt * 8) as *mut u32) = v };
                    }
                });
                if ch == 0 && c4 == 0 {
                    // SAFETY: row_idx < batch * rows entries of lse.
                    unsafe { *p.lse.ptr().add(row_idx) = lse };
                }
            } else {
                let scale = inv * p.value_scale;
                let part = split as usize * (p.batch * rows) as usize + row_idx;
                // SAFETY: split < max_splits: inside the workspace sized by the host.
                let dst = unsafe { p.partial_o.ptr().add(part * D_V + dim0) };
                unroll!(nt in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
                    if nt < L::O_TILES {
                        let v = [o[nt][2 * half] * scale, o[nt][2 * half + 1] * scale];
                        // SAFETY: as above; the row's D_V f32 start 2 KB aligned and
                        // dim0 + 8 nt is even: 8-byte aligned. One 8-byte store, not two
                        // 4-byte ones (half the store instructions, whole sectors).
                        unsafe { smem::st_global_v2(dst.add(nt * 8) as *mut u8, v.map(f32::to_bits)) };
                    }
                });
                if ch == 0 && c4 == 0 {
                    // SAFETY: as above.
                    unsafe { *p.partial_lse.ptr().add(part) = lse };
                }
            }
        }
    });
}
