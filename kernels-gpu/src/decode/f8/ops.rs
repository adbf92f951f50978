//! The fp8 decode's tile operations: the raw-block and fragment-order offsets, a block's
//! `cp.async` copies, the Q load (fp16, scaled), S and O += P.V of a pair of blocks (KV
//! converted in registers), and the row stores.

use super::{BLOCK_N, GP, GQ, O_DIMS, ROW, ROW_CHUNKS, TPR};
use crate::arch::{self, cp_async, cvt, ldmatrix, mma, smem, sync};
use crate::decode::{self, DecodeKind};
use crate::elem::Half16;
use mla_abi::{D_V, DecodeParams};

/// Byte offset of dim (byte) `d` of row `r` in a raw block: 16-byte chunk `k` of row `r`
/// sits at chunk `k ^ ((r / 2) % 4)` (within its aligned group of four), so eight
/// consecutive rows' same chunk (an `ldmatrix` of V) and two rows' four chunks (a K
/// fragment load) hit distinct banks.
#[inline(always)]
pub(super) fn raw_off(r: u32, d: u32) -> u32 {
    r * ROW + (((d >> 4) ^ ((r >> 1) & 3)) << 4) + (d & 15)
}

/// Byte offset, in a fragment-order tile (Q or P), of the 16-bit pair at column `c` (even)
/// of row `r` (< 16). Step `c / 16` holds, for lane `(g, t)`, 16 bytes at
/// `16 (4 (8 step + g) + t)`: its A fragment `[row g k 2t, 2t + 1; row g + 8 k 2t, 2t + 1;
/// row g k 2t + 8, 2t + 9; row g + 8 k 2t + 8, 2t + 9]`. Step `k` is column `16 step + k`
/// for P; for Q (`permuted`) k `2t, 2t + 1, 2t + 8, 2t + 9` are columns `16 step + 4 t ..
/// +4` (the permuted step of the module docs, with [`q_col`]).
#[inline(always)]
pub(super) fn frag_off(r: u32, c: u32, permuted: bool) -> u32 {
    let (step, q) = (c / 16, c % 16);
    let (t, hi) = if permuted {
        (q / 4, (q % 4) / 2)
    } else {
        ((q % 8) / 2, q / 8)
    };
    16 * (4 * (8 * step + r % 8) + t) + 4 * (2 * hi + r / 8)
}

/// Q's column order: dim `d` sits at fragment column `q_col(d)`, so that step `4 kq + j` of
/// lane `t` takes dims `64 kq + 16 t + 4 j .. +4` (the four dims one K word of the lane
/// holds).
#[inline(always)]
pub(super) fn q_col(d: u32) -> u32 {
    let (kq, w) = (d / 64, d % 64);
    let (t, j, e) = (w / 16, (w % 16) / 4, w % 4);
    16 * (4 * kq + j) + 4 * t + e
}

/// Issues this thread's `cp.async` copies of one block (tokens `n0 ..`) into ring slot
/// `slot`; `entry` is its row's page-table entry ([`decode::kv_row_page_entry`]).
#[inline(always)]
pub(super) unsafe fn issue_block(p: &DecodeParams, entry: i32, n0: u32, slot: u32) {
    let r = arch::thread_idx_x() / TPR;
    let k0 = arch::thread_idx_x() % TPR;
    let src = decode::kv_row_source(p, entry, n0 + r, 1);
    let n = src.n;
    let main = decode::main_chunks(1);
    const { assert!(32u32.is_multiple_of(TPR)) };
    let policy = cp_async::l2_evict_first();
    for i in 0..ROW_CHUNKS / TPR {
        let k = k0 + TPR * i;
        let s = src.part(i < main / TPR, k, main);
        // SAFETY: the destination lies in the slot; when n == 16, s is chunk k of a cache
        // row that checked_page bounds-checked; unread when n == 0 (zero fill).
        unsafe { cp_async::cp_async_cg_16_hint(slot + raw_off(r, k << 4), s, n, policy) };
    }
}

/// Loads the CTA's `16 RGS` query rows as fp16 into the Q tiles (row `r` in group `r / 16`'s
/// tile, fragment order, [`frag_off`] of [`q_col`]; zeros past the last row) and each row's
/// scale-back factor (`2^-s`, f32) at `qscale + 4 r`. Warp `w` loads rows `2 RGS w ..
/// +2 RGS`; lane `l` words `l + 32 i` (dims `2 (l + 32 i)`, `+1`).
#[inline(always)]
pub(super) unsafe fn load_q<K: DecodeKind, const RGS: usize>(
    p: &DecodeParams,
    b: u32,
    row0: u32,
    q_s: u32,
    qscale: u32,
) {
    let warp = arch::thread_idx_x() / 32;
    let lane = arch::thread_idx_x() % 32;
    let rows = p.s_q * p.heads;
    // Every row's words are loaded before any is scaled, so the rows' global loads overlap
    // (the scaling's shuffles would otherwise wait out each row's load in turn).
    let mut words = [[0u32; 9]; 4];
    unroll!(rr in [0, 1, 2, 3] {
        if rr < 2 * RGS {
            let gr = row0 + 2 * RGS as u32 * warp + rr as u32;
            if gr < rows {
                let (t, h) = (gr / p.heads, gr % p.heads);
                let off = p.q_row(b as u64, t as u64, h as u64);
                let off_pe = p.q_pe_row(b as u64, t as u64, h as u64);
                unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
                    // Dims 2 (lane + 32 i), +1: latent for i < 8, the rope part's 2 lane
                    // for i = 8.
                    let (base, e) = if i < 8 {
                        (p.q.ptr() as *const u8, off + 2 * (lane as u64 + 32 * i as u64))
                    } else {
                        (p.q_pe.ptr() as *const u8, off_pe + 2 * lane as u64)
                    };
                    // SAFETY: elements e, e + 1 of a validated q (or q_pe) row (2-byte
                    // aligned for fp8, 4-byte for 16-bit elements).
                    words[rr][i] = unsafe {
                        if K::Q_FP8 {
                            cvt::e4m3x2_to_f16x2(*(base.add(e as usize) as *const u16))
                        } else {
                            *(base.add(2 * e as usize) as *const u32)
                        }
                    };
                });
            }
        }
    });
    unroll!(rr in [0, 1, 2, 3] {
        if rr < 2 * RGS {
            let r = 2 * RGS as u32 * warp + rr as u32;
            // SAFETY: row r < 16 RGS of the CTA (forwarded from the caller); converged warp.
            unsafe { load_q_row::<K, RGS>(words[rr], r, lane, q_s, qscale) };
        }
    });
}

/// Scales (bf16 Q) and stores row `r` of the CTA's Q tiles from this lane's `w` (see
/// [`load_q`]).
///
/// # Safety
/// `r < 16 RGS`; `q_s` and `qscale` are the CTA's Q tiles and scales; converged warp.
#[inline(always)]
pub(super) unsafe fn load_q_row<K: DecodeKind, const RGS: usize>(
    mut w: [u32; 9],
    r: u32,
    lane: u32,
    q_s: u32,
    qscale: u32,
) {
    // The row's group tile and its row in it.
    let (tile, rl) = if RGS == 1 {
        (q_s, r)
    } else {
        (q_s + (r / 16) * GQ, r % 16)
    };
    let mut down = 1.0f32;
    if !K::Q_FP8 {
        // The row's largest magnitude (bf16 bits), then the power of two 2^s that puts
        // it in [2^14, 2^15).
        let mut m = 0u32;
        unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
            m = decode::bf16x2_max_mag(m, w[i]);
        });
        unroll!(k in [0, 1, 2, 3, 4] {
            // SAFETY: converged warp (the row is warp-uniform).
            let o = unsafe { sync::shfl_xor_f32(f32::from_bits(m), 16 >> k) }.to_bits();
            m = m.max(o);
        });
        let up;
        (up, down) = decode::f16_row_scale(m);
        unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
            w[i] = decode::bf16x2_to_f16x2_scaled(w[i], up);
        });
    }
    // SAFETY: row rl < 16 of a group tile, dims < 576: inside the Q tiles; the scale
    // slot r < 16 RGS.
    unsafe {
        unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
            let d = 2 * (lane + 32 * i as u32);
            smem::st_shared_u32(tile + frag_off(rl, q_col(d), true), w[i]);
        });
        if lane == 0 {
            smem::st_shared_f32(qscale + 4 * r, down);
        }
    }
}

/// S (per row group, 16 rows x this warp's 8 tokens: the `C` fragment of one n-tile) =
/// Q . K^T over all 576 dims for K rows `8 ch .. +8` of the raw blocks at `blk[0]` and
/// `blk[1]` (each Q fragment load serves both blocks, each converted K word every group).
#[inline(always)]
pub(super) unsafe fn qk2<const RGS: usize>(
    q_s: u32,
    blk: [u32; 2],
    ch: u32,
    g: u32,
    t: u32,
) -> [[[f32; 4]; 2]; RGS] {
    // Independent accumulators per (group, block): four for one group, one for two (the
    // four (group, block) chains keep MMAs in flight, and more spill at 255 registers).
    let acc = if RGS == 1 { 4 } else { 1 };
    let mut s = [[[[0.0f32; 4]; 4]; 2]; RGS];
    let krow = ch * 8 + g;
    let lane_off = 16 * (4 * g + t);
    unroll!(kq in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
        let kq = kq as u32;
        // SAFETY: rows < 64 of the blocks, steps < 36 of each group's Q tile, inside their
        // regions; converged warp.
        unsafe {
            let koff = raw_off(krow, 64 * kq + 16 * t);
            let kw = [
                smem::ld_shared_v4(blk[0] + koff),
                smem::ld_shared_v4(blk[1] + koff),
            ];
            unroll!(j in [0, 1, 2, 3] {
                let step = 512 * (4 * kq + j as u32) + lane_off;
                let mut frag = [[0u32; 4]; RGS];
                unroll!(rg in [0, 1] {
                    if rg < RGS {
                        frag[rg] = smem::ld_shared_v4(q_s + rg as u32 * GQ + step);
                    }
                });
                unroll!(x in [0, 1] {
                    let bk = cvt::e4m3x4_to_f16x2x2(kw[x][j]);
                    unroll!(rg in [0, 1] {
                        if rg < RGS {
                            mma::mma_m16n8k16_f16(&mut s[rg][x][j % acc], frag[rg], bk);
                        }
                    });
                });
            });
        }
    });
    let mut r = [[[0.0f32; 4]; 2]; RGS];
    unroll!(rg in [0, 1] {
        if rg < RGS {
            unroll!(x in [0, 1] {
                unroll!(e in [0, 1, 2, 3] {
                    let a = &s[rg][x];
                    r[rg][x][e] = if acc == 4 {
                        (a[0][e] + a[1][e]) + (a[2][e] + a[3][e])
                    } else {
                        a[0][e]
                    };
                });
            });
        }
    });
    r
}

/// O (rows `g`, `g + 8`; 8 n-tiles over dims `64 ch .. +64`, see [`write_rows`]) += P . V
/// over the 128 tokens of the raw blocks at `blk[0]` and `blk[1]` (P columns `0..64` and
/// `64..128`). Per step and 32 dims one `ldmatrix.x4.trans` of the fp8 bytes as 16-bit
/// pairs gives lane `(g, t)` tokens `2t, 2t + 1` (and `+8`) of dims `2g, 2g + 1` of two
/// chunks; one `prmt` per word splits the dims into the n-tiles "even" and "odd" (column `g`
/// is dim `2g` or `2g + 1` of the chunk), each half one `cvt.rn.f16x2.e4m3x2`.
/// With two row groups each converted V pair feeds both groups' `mma`s (group `rg`'s P tile
/// at `p_s + rg GP`).
#[inline(always)]
pub(super) unsafe fn pv2<const RGS: usize>(
    o: &mut [[[f32; 4]; 8]; RGS],
    p_s: u32,
    blk: [u32; 2],
    ch: u32,
    lane: u32,
) {
    let lane_off = 16 * lane;
    // The row this lane addresses in each ldmatrix: matrix lane / 8 (tokens +8 for odd
    // matrices, the next chunk for matrices 2 and 3), row lane % 8.
    let m_tok = 8 * ((lane / 8) % 2) + lane % 8;
    let m_chunk = lane / 16;
    unroll!(kk in [0, 1, 2, 3, 4, 5, 6, 7] {
        let kk = kk as u32;
        let blk = if kk < BLOCK_N / 16 { blk[0] } else { blk[1] };
        let tok = 16 * (kk % (BLOCK_N / 16)) + m_tok;
        // SAFETY: steps < 8 of the P tile; rows < 64 of the block, dims < 512; converged
        // warp.
        unsafe {
            let mut a = [[0u32; 4]; RGS];
            unroll!(rg in [0, 1] {
                if rg < RGS {
                    a[rg] = smem::ld_shared_v4(p_s + rg as u32 * GP + 512 * kk + lane_off);
                }
            });
            unroll!(gi in [0, 1] {
                let chunk = 4 * ch + 2 * gi as u32 + m_chunk;
                let v = ldmatrix::ldmatrix_x4_trans(blk + raw_off(tok, 16 * chunk));
                // v[0]: chunk c0 tokens 2t, 2t + 1; v[1]: the same + 8; v[2], v[3]: c0 + 1.
                // Each byte pair [dim 2g, 2g + 1] of token 2t then 2t + 1 -> [even | odd].
                let w = [
                    cvt::prmt(v[0], 0, 0x3120),
                    cvt::prmt(v[1], 0, 0x3120),
                    cvt::prmt(v[2], 0, 0x3120),
                    cvt::prmt(v[3], 0, 0x3120),
                ];
                unroll!(c in [0, 1] {
                    let lo = cvt::e4m3x4_to_f16x2x2(w[2 * c]);
                    let hi = cvt::e4m3x4_to_f16x2x2(w[2 * c + 1]);
                    unroll!(rg in [0, 1] {
                        if rg < RGS {
                            let o = &mut o[rg];
                            mma::mma_m16n8k16_f16(&mut o[4 * gi + 2 * c], a[rg], [lo[0], hi[0]]);
                            mma::mma_m16n8k16_f16(&mut o[4 * gi + 2 * c + 1], a[rg], [lo[1], hi[1]]);
                        }
                    });
                });
            });
        }
    });
}

/// Normalises and stores this thread's rows `row_a`, `row_a + 8`: dims
/// `64 ch + 16 c + 4 t .. +4` for the warp's chunks `c` in 0..4 (see [`pv2`]), to `out` /
/// `lse` when the sequence has one split, else to the partials.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn write_rows<K: DecodeKind>(
    p: &DecodeParams,
    o: &[[f32; 4]; 8],
    l_tot: [f32; 2],
    m_run: [f32; 2],
    b: u32,
    row_a: u32,
    split: u32,
    nsplit: u32,
    ch: u32,
    t: u32,
) {
    let rows = p.s_q * p.heads;
    unroll!(half in [0, 1] {
        let gr = row_a + 8 * half as u32;
        if gr < rows {
            let (inv, lse) = decode::row_norm(l_tot[half], m_run[half]);
            let row_idx = (b * rows + gr) as usize;
            // Group gi (dims 64 ch + 32 gi ..): dims 4t .. +4 of its first chunk from
            // n-tiles 4 gi (even) and 4 gi + 1 (odd), columns 2t, 2t + 1; dims 16 + 4t .. +4
            // of its second chunk from n-tiles 4 gi + 2 and 4 gi + 3.
            let vals = |gi: usize, scale: f32| {
                let mut v = [0.0f32; 8];
                unroll!(c in [0, 1] {
                    let (ev, od) = (o[4 * gi + 2 * c], o[4 * gi + 2 * c + 1]);
                    v[4 * c] = ev[2 * half] * scale;
                    v[4 * c + 1] = od[2 * half] * scale;
                    v[4 * c + 2] = ev[2 * half + 1] * scale;
                    v[4 * c + 3] = od[2 * half + 1] * scale;
                });
                v
            };
            if nsplit == 1 {
                let scale = inv * p.value_scale * p.output_scale;
                let (tq, h) = (gr / p.heads, gr % p.heads);
                let row_off = b as u64 * p.out_stride_b + tq as u64 * p.out_stride_s + h as u64 * p.out_stride_h;
                unroll!(gi in [0, 1] {
                    let v = vals(gi, scale);
                    unroll!(c in [0, 1] {
                        let d = (ch * O_DIMS + 32 * gi as u32 + 16 * c as u32 + 4 * t) as usize;
                        // SAFETY: dims d .. d + 4 < 512 of a validated out row; 4-byte
                        // aligned pairs.
                        unsafe {
                            let dst = (p.out.ptr() as *mut u16).add(row_off as usize + d) as *mut u32;
                            *dst = K::Mma::pack2(v[4 * c], v[4 * c + 1]);
                            *dst.add(1) = K::Mma::pack2(v[4 * c + 2], v[4 * c + 3]);
                        }
                    });
                });
                if ch == 0 && t == 0 {
                    // SAFETY: row_idx < batch * rows entries of lse.
                    unsafe { *p.lse.ptr().add(row_idx) = lse };
                }
            } else {
                let scale = inv * p.value_scale;
                let part = split as usize * (p.batch * rows) as usize + row_idx;
                unroll!(gi in [0, 1] {
                    let v = vals(gi, scale).map(f32::to_bits);
                    unroll!(c in [0, 1] {
                        let d = (ch * O_DIMS + 32 * gi as u32 + 16 * c as u32 + 4 * t) as usize;
                        // SAFETY: split < max_splits: inside the workspace the host sized;
                        // the row's D_V f32 start 2 KB aligned and d is a multiple of 4:
                        // 16-byte aligned.
                        unsafe {
                            let dst = p.partial_o.ptr().add(part * D_V + d) as *mut u8;
                            smem::st_global_v4(dst, [v[4 * c], v[4 * c + 1], v[4 * c + 2], v[4 * c + 3]]);
                        }
                    });
                });
                if ch == 0 && t == 0 {
                    // SAFETY: as above.
                    unsafe { *p.partial_lse.ptr().add(part) = lse };
                }
            }
        }
    });
}
