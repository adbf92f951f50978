//! The `wgmma` decode (sm_90a only; `--cfg mla_wgmma`): bf16 Q and cache, the 64-row tile,
//! the same grid, params and outputs as [`crate::decode`]'s 64-row kernel, so the host's
//! split schedule, workspace and combine are shared.
//!
//! - Grid `(max_splits, ceil(s_q * heads / 64), batch)`, block 256 (two warpgroups),
//!   dynamic shared memory `decode_tile::WG_SMEM_BYTES`: up to 1 KB of alignment slack, Q
//!   and two KV stages as slab tiles (72 KB each, [`slab_off`]).
//! - Both warpgroups compute the whole S = Q K^T (64 x 64, 36 `wgmma` k-steps, both
//!   operands K-major from shared memory) and the same softmax, so no S or P crosses shared
//!   memory; then each multiplies P (in registers, the S accumulators repacked as A
//!   fragments) by its 256 output dims of V (an MN-major B over four slabs, transposed-B
//!   flag). QK^T is computed twice: 50% more MMA work traded for no exchange.
//! - Ping-pong: two named barriers order the warpgroups' MMAs in the tensor pipe as QK0,
//!   QK1, PV0, PV1 per block, so each warpgroup's softmax overlaps the other's MMAs.
//! - KV: `cp.async`, one row per 4 threads, two stages, the page looked up a block ahead;
//!   one CTA barrier per block (the next block is issued just after it).
//!   A split works on the blocks [`mla_abi::chunk_blocks`] gives it and stores through
//!   [`crate::decode`]'s `write_rows` (out/lse for one split, else the workspace partials).

use crate::DecodeBf16;
use crate::arch::{self, cp_async, cvt, smem, sync, wgmma};
use crate::decode::{self, M64};
use mla_abi::DecodeParams;
use mla_abi::decode_tile as T;

/// Bytes of one 64-dim slab of a 64-row tile (64 rows x 128 bytes).
pub(crate) const SLAB: u32 = T::WG_SLAB_BYTES as u32;
/// One 64 x 576 16-bit tile in slabs.
pub(crate) const SLAB_TILE: u32 = T::QK_TILE_BYTES as u32;
const BLOCK_N: u32 = T::BLOCK_N as u32;
/// Named barriers of the ping-pong (0 is the CTA barrier): warpgroup 0 has issued its
/// QK^T / warpgroup 1 has issued its QK^T (128 arrive, 128 sync, once per block each).
const BAR_QK0_ISSUED: u32 = 1;
const BAR_QK1_ISSUED: u32 = 2;

/// Byte offset of 16-byte chunk `k` (`0..72`) of row `r` (`0..64`) of a slab tile: chunk
/// `k` lives in slab `k / 8`, as chunk `(k % 8) ^ (r % 8)` of the row's 128 bytes (the
/// 128-byte swizzle, so Q and K are K-major and V is MN-major `wgmma` operands).
#[inline(always)]
pub(crate) fn slab_off(r: u32, k: u32) -> u32 {
    (k / 8) * SLAB + r * 128 + (((k % 8) ^ (r % 8)) << 4)
}

/// The 1024-byte aligned start of the dynamic shared memory (the kernels ask for 1 KB of
/// slack).
#[inline(always)]
pub(crate) fn aligned_base() -> u32 {
    (smem::smem_base() + 1023) & !1023
}

/// The kernel body (see the module docs).
///
/// # Safety
/// Launched with the grid, block and shared memory above on params the host validated
/// (bf16 Q and cache, shapes, strides, workspace capacity).
#[inline(always)]
pub unsafe fn decode_wg_bf16(p: DecodeParams) {
    let split = arch::block_idx_x();
    let tile = arch::block_idx_y();
    let b = arch::block_idx_z();
    let Some(decode::CtaWork {
        len,
        nsplit,
        kb0,
        kb1,
    }) = decode::cta_work(&p, split, b)
    else {
        return;
    };
    let row0 = tile * 64;

    let tid = arch::thread_idx_x();
    let warp = tid / 32;
    let lane = tid % 32;
    let wg = warp / 4;
    let wq = warp % 4;
    let g = lane / 4;
    let c = lane % 4;
    let base = aligned_base();
    let q_s = base;
    let kv_s = |s: u32| base + SLAB_TILE + s * SLAB_TILE;

    // The KV row this thread copies (4 threads per row, 18 chunks each).
    let kv_r = tid / 4;
    let page_of = |j: u32| decode::kv_row_page(&p, b, j, len);
    // Block `kb` into `stage` (this thread: row kv_r, chunks tid % 4 + 4 i).
    let issue = |page: i32, kb: u32, stage: u32| {
        // SAFETY: the stage holds BLOCK_N slab-layout rows; page comes from kv_row_page.
        unsafe {
            decode::issue_kv_row::<DecodeBf16, 4>(&p, page, kb * BLOCK_N, kv_s(stage), slab_off)
        }
    };

    // Q rows (zeros past the last row) and the chunk's first block.
    // SAFETY: the Q tile holds 64 slab-layout rows of a validated q.
    unsafe { decode::load_q_tile::<DecodeBf16, M64>(&p, b, row0, q_s, slab_off) };
    if kb0 < kb1 {
        issue(page_of(kb0 * BLOCK_N + kv_r), kb0, 0);
    }
    cp_async::cp_async_commit_group();
    let mut next_page = if kb0 + 1 < kb1 {
        page_of((kb0 + 1) * BLOCK_N + kv_r)
    } else {
        -1
    };

    // This thread's two rows (g and g + 8 of its warp's 16) and their causal visibility.
    let row_a = row0 + 16 * wq + g;
    let vis_r = [
        decode::visible(&p, len, row_a),
        decode::visible(&p, len, row_a + 8),
    ];
    let scale_log2 = p.softmax_scale * core::f32::consts::LOG2_E;

    let mut o = [[0.0f32; 4]; 32];
    let mut m_run = [f32::NEG_INFINITY; 2];
    let mut l_run = [0.0f32; 2];
    let mut stage = 0u32;
    let mut kb = kb0;
    while kb < kb1 {
        // The only group in flight is this block's (with Q for the first).
        cp_async::cp_async_wait_group::<0>();
        // cp.async wrote through the generic proxy; wgmma reads through the async one.
        wgmma::fence_proxy_async_shared();
        // SAFETY: every thread reaches the barrier (loop bounds are CTA-uniform).
        unsafe { sync::bar_sync() };
        // One barrier per block: past it every thread has finished the previous block's
        // P.V (its wgmma_wait_group), so the other stage is free for the next block.
        if kb + 1 < kb1 {
            issue(next_page, kb + 1, stage ^ 1);
            if kb + 2 < kb1 {
                next_page = page_of((kb + 2) * BLOCK_N + kv_r);
            }
        }
        cp_async::cp_async_commit_group();
        // SAFETY: the descriptors address the Q tile and this stage; each warpgroup runs
        // the wgmma sequences converged.
        unsafe {
            let kv = kv_s(stage);
            let mut s = [0.0f32; 32];
            // Ping-pong: warpgroup 1 issues its QK^T after warpgroup 0's, and warpgroup 0
            // its P.V after warpgroup 1's QK^T, so the tensor pipe runs QK0, QK1, PV0, PV1
            // and each softmax overlaps the other warpgroup's MMAs.
            if wg == 1 {
                sync::bar_sync_named::<BAR_QK0_ISSUED, 256>();
            }
            wgmma::wgmma_fence();
            for ks in 0..36u32 {
                let off = (ks / 4) * SLAB + (ks % 4) * 32;
                let da = wgmma::smem_desc(q_s + off, 16, 1024, wgmma::Swizzle::B128);
                let db = wgmma::smem_desc(kv + off, 16, 1024, wgmma::Swizzle::B128);
                wgmma::wgmma_m64n64k16_bf16(&mut s, da, db, ks > 0);
            }
            wgmma::wgmma_commit_group();
            if wg == 0 {
                sync::bar_arrive_named::<BAR_QK0_ISSUED, 256>();
            } else {
                sync::bar_arrive_named::<BAR_QK1_ISSUED, 256>();
            }
            wgmma::wgmma_wait_group::<0>();

            // Mask, scale, row max (the quad holds all 64 columns of its two rows).
            let mut m_loc = [f32::NEG_INFINITY; 2];
            unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
                unroll!(e in [0, 1, 2, 3] {
                    let tok = kb * BLOCK_N + 8 * j as u32 + 2 * c + (e % 2) as u32;
                    let x = if tok < vis_r[e / 2] { s[4 * j + e] * scale_log2 } else { f32::NEG_INFINITY };
                    s[4 * j + e] = x;
                    m_loc[e / 2] = sync::fmax(m_loc[e / 2], x);
                });
            });
            let m_new = [
                sync::fmax(m_run[0], decode::quad_max(m_loc[0])),
                sync::fmax(m_run[1], decode::quad_max(m_loc[1])),
            ];
            let (m_ref, alpha) = decode::rescale_rows(&mut m_run, &mut l_run, m_new);
            unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
                unroll!(e in [0, 1, 2, 3] {
                    let pe = sync::ex2(s[4 * j + e] - m_ref[e / 2]);
                    l_run[e / 2] += pe;
                    s[4 * j + e] = pe;
                });
            });
            unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
                o[j][0] *= alpha[0];
                o[j][1] *= alpha[0];
                o[j][2] *= alpha[1];
                o[j][3] *= alpha[1];
            });
            // O[:, this warpgroup's 256 dims] += P . V: P's k-step kk is the S tiles 2kk and
            // 2kk + 1 repacked; V's is 16 token rows of slabs 4 wg .. 4 wg + 4.
            // The A fragments are packed before the fence: a register of a wgmma written
            // between its fence and itself makes ptxas insert its own fence there.
            let mut frags = [[0u32; 4]; 4];
            unroll!(kk in [0, 1, 2, 3] {
                let t0 = 4 * (2 * kk);
                let t1 = 4 * (2 * kk + 1);
                frags[kk] = [
                    cvt::pack_bf16x2(s[t0], s[t0 + 1]),
                    cvt::pack_bf16x2(s[t0 + 2], s[t0 + 3]),
                    cvt::pack_bf16x2(s[t1], s[t1 + 1]),
                    cvt::pack_bf16x2(s[t1 + 2], s[t1 + 3]),
                ];
            });
            if wg == 0 {
                sync::bar_sync_named::<BAR_QK1_ISSUED, 256>();
            }
            wgmma::wgmma_fence();
            unroll!(kk in [0, 1, 2, 3] {
                let a = frags[kk];
                let db = wgmma::smem_desc(
                    kv + 4 * wg * SLAB + kk as u32 * 16 * 128,
                    SLAB,
                    1024,
                    wgmma::Swizzle::B128,
                );
                wgmma::wgmma_m64n256k16_rs_bf16::<1>(&mut o, a, db, true);
            });
            wgmma::wgmma_commit_group();
            wgmma::wgmma_wait_group::<0>();
        }
        stage ^= 1;
        kb += 1;
    }
    cp_async::cp_async_wait_group::<0>();

    // Both warpgroups saw all 64 columns: the quad sums are the full row sums. Warpgroup
    // `wg` holds output dims 256 wg .. 256 wg + 256, the 64-row tile's column split `wg`.
    // SAFETY: converged warps; the host sized out/lse and the workspace (validated).
    unsafe {
        let l_tot = [decode::quad_sum(l_run[0]), decode::quad_sum(l_run[1])];
        decode::write_rows::<DecodeBf16, M64>(&p, &o, l_tot, m_run, b, row_a, split, nsplit, wg, c);
    }
}
