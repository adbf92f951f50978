//! Split-KV combine: merges the per-chunk partials `(O_i, lse_i)` of a query row into the
//! final output with the exact log-sum-exp rule
//! `lse = log(sum_i exp(lse_i))`, `O = sum_i exp(lse_i - lse) * O_i`.
//!
//! - Grid: `(X, batch)` with `1 <= X <= ceil(s_q * heads / R)`: `R` query rows at a time
//!   per CTA (`combine_tile::ROWS_NARROW` in the narrow build, 1 in the wide one),
//!   `combine_tile::THREADS` (128) threads per row; thread `t` of a row owns output dims
//!   `4t .. 4t + 4`. CTA `x` takes row groups `x, x + X, ...` of its sequence, and a
//!   sequence of one split costs each of its CTAs one load: the host sizes `X` so that the
//!   whole grid is about one wave (at B = 128, H = 128 the grid of one group per CTA was
//!   4096 CTAs that mostly only read `num_splits`).
//! - Shared memory: none. Each warp loads all of the row's `lse_i` at once (lane `j`: chunks
//!   `j` and `j + 32`) and reduces them with shuffles; the `O_i` loads go out `UNROLL`
//!   chunks at a time, so a row costs a few memory latencies, not one per chunk (a 64-chunk
//!   row used to be a chain of 64 dependent round trips). Two builds: narrow
//!   (`combine_tile::UNROLL_NARROW`, few registers: many CTAs per SM for the thousands of
//!   rows of a large batch, whose plans have few chunks) and wide (`UNROLL_WIDE`, for plans
//!   of more than `NARROW_MAX_SPLITS` chunks: small batches, few rows). One build of 16
//!   measured 1.4-1.8x faster at B = 1 but up to 22% slower at B = 32-64 (then 142
//!   registers: 3 CTAs per SM). The first `UNROLL` chunks' O loads go out with the lse
//!   loads.
//! - Reads [`CombineParams`]: `num_splits[b]` (sequences with one split are skipped: the
//!   decode kernel wrote their output), `partial_lse`, `partial_o` (f32 rows, or with
//!   `partial_f16` the 16-bit form of the bf16 64-row TMA decodes, `mla_abi::partial16`);
//!   writes `out`, `lse`.
//! - Chunks with `lse_i = -inf` (no visible keys) get weight exactly 0; a row whose chunks
//!   are all empty gets `out = 0`, `lse = -inf`, never NaN. A chunk whose `lse_i` is NaN (or
//!   `+inf`) makes the row's `out` and `lse` NaN: a poisoned part is never dropped.

use crate::arch::{self, cvt, sync};
use crate::elem::Half16;
use mla_abi::{CombineParams, D_V, MAX_SPLITS, combine_tile, partial16};

const LOG2E: f32 = core::f32::consts::LOG2_E;
const LN2: f32 = core::f32::consts::LN_2;

/// The exact LSE merge's weights over up to `32 * N` parts held by one warp (lane `j`: parts
/// `j`, `j + 32`, ...): the maximum `m`, this lane's `N` weights `exp(l - m)` and their sum
/// over the warp. A part with `l = -inf` (no visible key) weighs exactly 0, and so does every
/// part when all are `-inf` (`m = -inf`, sum 0).
///
/// # Safety
/// All 32 lanes of the warp call it together.
#[inline(always)]
pub(crate) unsafe fn warp_lse_weights<const N: usize>(l: [f32; N]) -> (f32, [f32; N], f32) {
    let mut m = l[0];
    for &li in &l[1..] {
        m = sync::fmax(m, li);
    }
    // Unrolled by hand: inside the combine's row loop LLVM kept these loops and their
    // offsets in local memory.
    unroll!(x in [16, 8, 4, 2, 1] {
        // SAFETY: forwarded from the caller.
        m = sync::fmax(m, unsafe { sync::shfl_xor_f32(m, x as u32) });
    });
    let weight = |li: f32| {
        if li == f32::NEG_INFINITY {
            0.0
        } else {
            sync::ex2((li - m) * LOG2E)
        }
    };
    let w = l.map(weight);
    let mut sum = w[0];
    for &wi in &w[1..] {
        sum += wi;
    }
    unroll!(x in [16, 8, 4, 2, 1] {
        // SAFETY: forwarded from the caller.
        sum += unsafe { sync::shfl_xor_f32(sum, x as u32) };
    });
    (m, w, sum)
}

/// The merged row's output factor and natural-log LSE from [`warp_lse_weights`]' maximum
/// `m` and weight sum `sum`: `(scale / sum, m + ln sum)`; `(0, -inf)` for a row no part saw
/// (`sum` 0); `(NaN, NaN)` when a part's lse was NaN or `+inf` (`sum` NaN): a poisoned part
/// makes the row NaN, never the empty row's zeros.
#[inline(always)]
pub(crate) fn merged_norm(m: f32, sum: f32, scale: f32) -> (f32, f32) {
    if sum > 0.0 {
        (scale / sum, m + sync::lg2(sum) * LN2)
    } else if sum == 0.0 {
        (0.0, f32::NEG_INFINITY)
    } else {
        (f32::NAN, f32::NAN)
    }
}

/// # Safety
/// Launched with the grid and block above on params that the host validated.
#[inline(always)]
pub unsafe fn combine<O: Half16, const UNROLL: usize, const ROWS: u32>(p: CombineParams) {
    let b = arch::block_idx_y();
    if b >= p.batch {
        return;
    }
    // SAFETY: b < batch and num_splits has batch entries.
    let splits = unsafe { *p.num_splits.ptr().add(b as usize) };
    if splits <= 1 {
        return;
    }
    // A padding sequence (length <= 0) is never written, whatever its count says.
    // SAFETY: b < batch entries of a non-null seq_lens.
    if !p.seq_lens.is_null() && unsafe { *p.seq_lens.ptr().add(b as usize) } <= 0 {
        return;
    }
    let splits = (splits as u32).min(p.max_splits).min(MAX_SPLITS);
    // ROWS query rows per step, `combine_tile::THREADS` threads each (whole warps: no CTA
    // barrier below, so a row's warps may leave early); the CTA strides over the
    // sequence's row groups by the grid's width.
    let rows = p.s_q * p.heads;
    let mut group = arch::block_idx_x();
    let step = arch::grid_dim_x();
    loop {
        let row = group * ROWS + arch::thread_idx_x() / combine_tile::THREADS as u32;
        if row >= rows {
            return;
        }
        // SAFETY: forwarded from the caller; row < rows, b < batch, 2 <= splits <=
        // min(max_splits, MAX_SPLITS).
        unsafe {
            if p.partial_f16 != 0 {
                combine_row::<O, UNROLL, true>(p, b, row, splits)
            } else {
                combine_row::<O, UNROLL, false>(p, b, row, splits)
            }
        };
        group += step;
    }
}

/// One query row `row` of sequence `b`, merged over its `splits` chunks by the
/// `combine_tile::THREADS` threads (whole warps) that own it. `F16`: the partials are in
/// the 16-bit form (`mla_abi::partial16`): a chunk's four fp16 values and its half row's
/// factor, which scales the chunk's weight.
///
/// # Safety
/// The row's warps together and converged; `b < batch`, `row < s_q * heads` and
/// `splits <= min(max_splits, MAX_SPLITS)` of params the host validated.
#[inline(always)]
unsafe fn combine_row<O: Half16, const UNROLL: usize, const F16: bool>(
    p: CombineParams,
    b: u32,
    row: u32,
    splits: u32,
) {
    let rows = p.s_q * p.heads;
    let split_stride = (p.batch * rows) as usize;
    let row_idx = (b * rows + row) as usize;

    // O: this thread's four dims of each chunk, UNROLL chunk loads in flight at a time.
    let t = (arch::thread_idx_x() % combine_tile::THREADS as u32) as usize;
    let dim0 = t * combine_tile::DIMS_PER_THREAD;
    const { assert!(UNROLL >= 1 && UNROLL <= 16) };
    // Chunk i's entry of `partial_lse`, and its slot (`D_V` f32) of `partial_o`.
    let part = |i: u32| i as usize * split_stride + row_idx;
    // Chunks i0 .. i0 + UNROLL (sixteen slots, of which the first UNROLL are used: the
    // rest fold away).
    let load = |i0: u32| {
        let mut vs = [[0u32; 4]; 16];
        unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
            let i = i0 + j as u32;
            if j < UNROLL && i < splits {
                let slot = part(i) * D_V;
                // SAFETY: i < splits <= max_splits and row_idx < batch * rows index the
                // workspace the host sized as max_splits * batch * rows * D_V f32; 16-byte
                // aligned (D_V and dim0 multiples of 4 f32), 8-byte in the 16-bit form
                // (dim0 a multiple of 4 halves), whose factors sit inside the slot.
                vs[j] = unsafe {
                    let base = p.partial_o.ptr().add(slot);
                    if F16 {
                        let h = arch::smem::ld_global_nc_v2((base as *const u16).add(dim0) as *const u8);
                        [h[0], h[1], 0, 0]
                    } else {
                        arch::smem::ld_global_nc_v4(base.add(dim0) as *const u8)
                    }
                };
            }
        });
        vs
    };
    // The first chunks' O go out before the lse loads below, so that both arrive in one
    // memory latency rather than one after the other.
    let mut vs = load(0);

    // Every warp holds all the row's lse values, lane j those of chunks j, j + 32, j + 64
    // and j + 96, all loaded at once (one memory latency, not one per chunk), and reduces
    // them with shuffles: the max, each chunk's weight, their sum.
    const PARTS: usize = MAX_SPLITS as usize / 32;
    const _: () = assert!(PARTS * 32 == MAX_SPLITS as usize);
    let lane = arch::thread_idx_x() % 32;
    // SAFETY (the loads below): as in `load`.
    let lse_at = |i: u32| {
        if i < splits {
            unsafe { *p.partial_lse.ptr().add(part(i)) }
        } else {
            f32::NEG_INFINITY
        }
    };
    // The 16-bit form: lane j also loads the factors of chunks j, j + 32, ... for the
    // warp's half row (dims `4t ..` of a warp lie in one half), which scale their weights
    // below: the weights' sum is the lse's, without them.
    let half = dim0 / (D_V / 2);
    // SAFETY: as in `load`; the factors sit inside the slot.
    let factor_at = |i: u32| {
        if F16 && i < splits {
            let f = unsafe {
                p.partial_o
                    .ptr()
                    .add(part(i) * D_V + partial16::FACTOR + half)
            };
            f32::from_bits(unsafe { arch::smem::ld_global_nc_b32(f as *const u8) })
        } else {
            1.0
        }
    };
    let factors: [f32; PARTS] = core::array::from_fn(|k| factor_at(lane + 32 * k as u32));
    // SAFETY: the row's warps run this code converged (row and b are warp-uniform).
    let (m, mut w, sum) = unsafe {
        warp_lse_weights::<PARTS>(core::array::from_fn(|k| lse_at(lane + 32 * k as u32)))
    };
    if F16 {
        // A chunk of weight 0 keeps 0: its factor may be garbage (never written).
        for (wk, &f) in w.iter_mut().zip(&factors) {
            if *wk != 0.0 {
                *wk *= f;
            }
        }
    }

    // A chunk of weight 0 may hold garbage (an empty chunk's O is never written): its value
    // is replaced by 0, never multiplied.
    let mut acc = [0.0f32; combine_tile::DIMS_PER_THREAD];
    let mut i0 = 0;
    loop {
        let mut ws = [0.0f32; 16];
        unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
            if j < UNROLL {
                let i = i0 + j as u32;
                // Chunk i's weight sits in part i / 32 (selects, not an indexed array).
                let mut src_w = w[0];
                for (k, &wk) in w.iter().enumerate().skip(1) {
                    if i >= 32 * k as u32 {
                        src_w = wk;
                    }
                }
                // SAFETY: a warp-uniform source lane (i is uniform).
                ws[j] = unsafe { sync::shfl_idx_f32(src_w, i % 32) };
            }
        });
        unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
            if j < UNROLL && ws[j] != 0.0 {
                if F16 {
                    // The weight carries the half row's factor.
                    for d in 0..combine_tile::DIMS_PER_THREAD {
                        let bits = (vs[j][d / 2] >> (16 * (d % 2))) as u16;
                        acc[d] += ws[j] * cvt::f16_to_f32(bits);
                    }
                } else {
                    for d in 0..combine_tile::DIMS_PER_THREAD {
                        acc[d] += ws[j] * f32::from_bits(vs[j][d]);
                    }
                }
            }
        });
        i0 += UNROLL as u32;
        if i0 >= splits {
            break;
        }
        vs = load(i0);
    }
    // A NaN part's lse (the decode met NaN in that chunk) makes the row NaN.
    let (scale, lse) = merged_norm(m, sum, p.output_scale);

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
