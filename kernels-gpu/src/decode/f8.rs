//! The 16- and 32-row decodes of fp8 caches (`s_q * heads <= 32`: the memory-bound shapes)
//! where the arch converts fp8 in hardware (sm_90a, sm_100a): `mma.sync` in fp16 with the
//! KV operands converted in registers, straight from the raw fp8 blocks in shared memory.
//! No converted KV tile, no conversion pass between barriers.
//!
//! - `RGS` 16-row groups per CTA (1, or 2 for the 32-row tile, sm_90a image): every warp
//!   computes all of them, so each K and V fragment is loaded and converted once and feeds
//!   one `mma` per group. What follows describes one group; Q, P, the exchange and the
//!   scales hold one copy per group (`decode_tile::f8_smem`).
//!
//! - Grid, block, params and outputs: as [`crate::decode`]'s 16-row tile (one row group x
//!   eight column splits: warp `ch` computes S for tokens `8 ch .. +8` of each block and O
//!   for dims `64 ch .. +64`).
//! - Shared memory (`decode_tile::SMEM_F8`): Q as fp16, a ring of five raw fp8 blocks
//!   (rows of 576 bytes, 16-byte chunks XOR-swizzled by row, [`raw_off`]), P as fp16 for
//!   128 tokens, the exchange, each Q row's scale. Q and P are stored in `mma` fragment
//!   order ([`frag_off`]): one 16-byte load is a lane's whole A fragment of a step. Blocks
//!   go in pairs: one pair is computed while three blocks are in flight (110 KB, 192
//!   tokens: the 16-bit ring holds 96), with one max exchange, one P tile and three barriers
//!   per pair.
//! - Q in fp16: a bf16 Q row is scaled by a power of two that puts its largest magnitude in
//!   `[2^14, 2^15)`, so its values convert exactly down to `2^-17` of that scale (below,
//!   the error is under `2^-38` of the row's largest value); the row's logits are scaled
//!   back with the softmax scale. An fp8 Q is exact in fp16 as it is.
//! - QK^T: the order of the 16 products inside one MMA step is free, so lane `(g, t)`
//!   (`g = lane / 4`, `t = lane % 4`) takes dims `16 t + 4 j .. +4` of each 64-dim group in
//!   step `j` (Q is stored in that order): one 16-byte load of its K row gives four steps,
//!   each K word two `cvt.rn.f16x2.e4m3x2`.
//! - P.V: `ldmatrix.trans` of the fp8 bytes as 16-bit pairs gives a lane tokens `2t, 2t + 1`
//!   of dims `2g, 2g + 1`; one `prmt` per word splits them into two n-tiles whose column
//!   `g` is dim `2g` ("even") or `2g + 1` ("odd") of a 16-dim chunk ([`pv2`]). A lane's
//!   accumulators then hold dims `16 c + 4 t .. +4` of each chunk `c`, rows `g`, `g + 8`.

use crate::arch::{self, cp_async, cvt, ldmatrix, mma, smem, sync};
use crate::decode::{self, CtaWork, DecodeKind};
use crate::elem::Half16;
use core::marker::PhantomData;
use mla_abi::{D_QK, D_V, DecodeParams, decode_tile as T};

const LOG2E: f32 = core::f32::consts::LOG2_E;
const THREADS: u32 = T::THREADS as u32;
/// Warps per CTA: the exchange's writers.
const WARPS: u32 = T::WARPS as u32;
const BLOCK_N: u32 = T::BLOCK_N as u32;
/// Bytes (and 16-byte chunks) of one raw fp8 KV row.
const ROW: u32 = D_QK as u32;
const ROW_CHUNKS: u32 = ROW / 16;
/// Threads per KV row of an issue: thread `i` copies row `i / TPR`, chunks `i % TPR + TPR n`.
const TPR: u32 = THREADS / BLOCK_N;
const SLOTS: u32 = T::RING_SLOTS as u32;
/// Blocks in flight while a pair is computed.
const AHEAD: u32 = SLOTS - 2;
const SLOT_BYTES: u32 = T::FP8_STAGE_BYTES as u32;
/// Steps of 16 dims (QK^T) or tokens (P.V, two blocks) per tile in fragment order.
const Q_STEPS: u32 = (D_QK / 16) as u32;
const P_STEPS: u32 = 2 * BLOCK_N / 16;
/// Dims of O per warp.
const O_DIMS: u32 = (D_V / 8) as u32;
const _: () = assert!(TPR * BLOCK_N == THREADS && ROW_CHUNKS.is_multiple_of(TPR));
const _: () = assert!(AHEAD == 3 && O_DIMS == 64 && D_V == 512);
const _: () =
    assert!(512 * Q_STEPS as usize == T::F8_Q_BYTES && 512 * P_STEPS as usize == T::F8_P_BYTES);
/// Bytes of one 16-row group's Q and P tiles.
const GQ: u32 = T::F8_Q_BYTES as u32;
const GP: u32 = T::F8_P_BYTES as u32;

const _: () = assert!(T::BLOCK_M_F8X2 == 2 * T::BLOCK_M_SMALL);

/// Byte offset of dim (byte) `d` of row `r` in a raw block: 16-byte chunk `k` of row `r`
/// sits at chunk `k ^ ((r / 2) % 4)` (within its aligned group of four), so eight
/// consecutive rows' same chunk (an `ldmatrix` of V) and two rows' four chunks (a K
/// fragment load) hit distinct banks.
#[inline(always)]
fn raw_off(r: u32, d: u32) -> u32 {
    r * ROW + (((d >> 4) ^ ((r >> 1) & 3)) << 4) + (d & 15)
}

/// Byte offset, in a fragment-order tile (Q or P), of the 16-bit pair at column `c` (even)
/// of row `r` (< 16). Step `c / 16` holds, for lane `(g, t)`, 16 bytes at
/// `16 (4 (8 step + g) + t)`: its A fragment `[row g k 2t, 2t + 1; row g + 8 k 2t, 2t + 1;
/// row g k 2t + 8, 2t + 9; row g + 8 k 2t + 8, 2t + 9]`. Step `k` is column `16 step + k`
/// for P; for Q (`permuted`) k `2t, 2t + 1, 2t + 8, 2t + 9` are columns `16 step + 4 t ..
/// +4` (the permuted step of the module docs, with [`q_col`]).
#[inline(always)]
fn frag_off(r: u32, c: u32, permuted: bool) -> u32 {
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
fn q_col(d: u32) -> u32 {
    let (kq, w) = (d / 64, d % 64);
    let (t, j, e) = (w / 16, (w % 16) / 4, w % 4);
    16 * (4 * kq + j) + 4 * t + e
}

/// Issues this thread's `cp.async` copies of one block (tokens `n0 ..`) into ring slot
/// `slot`; `entry` is its row's page-table entry ([`decode::kv_row_page_entry`]).
#[inline(always)]
unsafe fn issue_block(p: &DecodeParams, entry: i32, n0: u32, slot: u32) {
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
unsafe fn load_q<K: DecodeKind, const RGS: usize>(
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
                let off = b as u64 * p.q_stride_b + t as u64 * p.q_stride_s + h as u64 * p.q_stride_h;
                let off_pe = b as u64 * p.q_pe_stride_b
                    + t as u64 * p.q_pe_stride_s
                    + h as u64 * p.q_pe_stride_h;
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
unsafe fn load_q_row<K: DecodeKind, const RGS: usize>(
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
            m = m.max(w[i] & 0x7fff).max((w[i] >> 16) & 0x7fff);
        });
        unroll!(k in [0, 1, 2, 3, 4] {
            // SAFETY: converged warp (the row is warp-uniform).
            let o = unsafe { sync::shfl_xor_f32(f32::from_bits(m), 16 >> k) }.to_bits();
            m = m.max(o);
        });
        let s = if m == 0 {
            0
        } else {
            (14 - ((m >> 7) as i32 - 127)).clamp(-100, 100)
        };
        let up = f32::from_bits(((127 + s) as u32) << 23);
        down = f32::from_bits(((127 - s) as u32) << 23);
        unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
            let lo = f32::from_bits(w[i] << 16) * up;
            let hi = f32::from_bits(w[i] & 0xffff_0000) * up;
            w[i] = cvt::pack_f16x2(lo, hi);
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
unsafe fn qk2<const RGS: usize>(
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
unsafe fn pv2<const RGS: usize>(
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

/// One CTA of [`decode_fp8`]: its work, where its rows, KV row and shared regions are, and
/// the registers that live through the pair loop (accumulators, row statistics and Q
/// scales per row group, the page-table entries loaded one issue ahead).
struct Cta<'a, K: DecodeKind, const RGS: usize> {
    p: &'a DecodeParams,
    b: u32,
    split: u32,
    w: CtaWork,
    /// The tile's first query row.
    row0: u32,
    /// This warp's column split, this lane's quad row `g` and column `t`.
    ch: u32,
    lane: u32,
    g: u32,
    t: u32,
    /// The KV row this thread copies in every block.
    kv_r: u32,
    base: u32,
    /// Causal visibility of this thread's rows (g and g + 8 of each group).
    vis_r: [[u32; 2]; RGS],
    /// This thread's row's page-table entries for the next two issues.
    next_entry: [i32; 2],
    /// The rows' softmax scale in log2 units times their Q scale-back factor.
    row_scale: [[f32; 2]; RGS],
    o: [[[f32; 4]; 8]; RGS],
    m_run: [[f32; 2]; RGS],
    l_run: [[f32; 2]; RGS],
    _kind: PhantomData<K>,
}

impl<'a, K: DecodeKind, const RGS: usize> Cta<'a, K, RGS> {
    /// Rows per CTA, and the exchange's row stride ([ch][BM] f32).
    const BM: u32 = 16 * RGS as u32;
    const REG: T::F8Smem = T::f8_smem(RGS);

    #[inline(always)]
    fn new(p: &'a DecodeParams, w: CtaWork, tile: u32, b: u32, split: u32) -> Self {
        let tid = arch::thread_idx_x();
        let lane = tid % 32;
        let g = lane / 4;
        let row0 = tile * Self::BM;
        let mut vis_r = [[0u32; 2]; RGS];
        unroll!(rg in [0, 1] {
            if rg < RGS {
                let row_a = row0 + 16 * rg as u32 + g;
                vis_r[rg] = [
                    decode::visible(p, w.len, w.glen, row_a),
                    decode::visible(p, w.len, w.glen, row_a + 8),
                ];
            }
        });
        Self {
            p,
            b,
            split,
            w,
            row0,
            ch: tid / 32,
            lane,
            g,
            t: lane % 4,
            kv_r: tid / TPR,
            base: smem::smem_base(),
            vis_r,
            next_entry: [-1, -1],
            row_scale: [[0.0; 2]; RGS],
            o: [[[0.0; 4]; 8]; RGS],
            m_run: [[f32::NEG_INFINITY; 2]; RGS],
            l_run: [[0.0; 2]; RGS],
            _kind: PhantomData,
        }
    }

    #[inline(always)]
    fn q_s(&self) -> u32 {
        self.base + Self::REG.q as u32
    }

    #[inline(always)]
    fn p_s(&self) -> u32 {
        self.base + Self::REG.p as u32
    }

    #[inline(always)]
    fn red(&self) -> u32 {
        self.base + Self::REG.red as u32
    }

    #[inline(always)]
    fn qscale(&self) -> u32 {
        self.base + Self::REG.qscale as u32
    }

    /// Ring slot of block `i` of the chunk.
    #[inline(always)]
    fn slot(&self, i: u32) -> u32 {
        self.base + Self::REG.ring as u32 + (i % SLOTS) * SLOT_BYTES
    }

    #[inline(always)]
    fn blocks(&self) -> u32 {
        self.w.kb1 - self.w.kb0
    }

    /// This thread's row's page-table entry in block `i` of the chunk (-1 past it).
    #[inline(always)]
    fn entry(&self, i: u32) -> i32 {
        if i < self.blocks() {
            let j = (self.w.kb0 + i) * BLOCK_N + self.kv_r;
            decode::kv_row_page_entry(self.p, self.b, j, self.w.len)
        } else {
            -1
        }
    }

    /// Issues blocks `0 .. AHEAD` (one commit group each, empty past the chunk), loads Q
    /// and its row scales; then the entries of the next issue and this thread's row scales.
    ///
    /// # Safety
    /// All threads of the CTA, once, first (a CTA barrier inside).
    #[inline(always)]
    unsafe fn prologue(&mut self) {
        let p = self.p;
        // SAFETY: the ring slots, Q tiles and scales are regions of f8_smem(RGS); q and the
        // cache rows are validated.
        unsafe {
            unroll!(i in [0, 1, 2] {
                let i = i as u32;
                if i < self.blocks() {
                    issue_block(p, self.entry(i), (self.w.kb0 + i) * BLOCK_N, self.slot(i));
                }
                cp_async::cp_async_commit_group();
            });
            load_q::<K, RGS>(p, self.b, self.row0, self.q_s(), self.qscale());
            sync::bar_sync();
        }
        self.next_entry = [self.entry(AHEAD), self.entry(AHEAD + 1)];
        let scale_log2 = p.softmax_scale * LOG2E;
        unroll!(rg in [0, 1] {
            if rg < RGS {
                let r = 16 * rg as u32 + self.g;
                // SAFETY: the scale slots were written before the barrier above.
                self.row_scale[rg] = unsafe {
                    [
                        scale_log2 * smem::ld_shared_f32(self.qscale() + 4 * r),
                        scale_log2 * smem::ld_shared_f32(self.qscale() + 4 * (r + 8)),
                    ]
                };
            }
        });
    }

    /// Blocks `i` and `i + 1` of the chunk (an odd chunk's last pair has no second block:
    /// its S is masked): wait for them, issue the next two, S, the online softmax across
    /// the warps, P to shared memory, O += P V.
    ///
    /// # Safety
    /// All threads of the CTA, once per pair in order (CTA barriers inside).
    #[inline(always)]
    unsafe fn pair_step(&mut self, i: u32) {
        let p = self.p;
        let has_b = i + 1 < self.blocks();
        // SAFETY: forwarded from the caller. Blocks i and i + 1 have landed once this
        // thread's groups up to i + 1 have (one newer group, block i + 2, may be pending)
        // and every thread passed the barrier; the slots of blocks i - 2 and i - 1 (the
        // next issues'), P and the exchange are free then too (their last readers ran
        // before it).
        unsafe {
            cp_async::cp_async_wait_group::<{ AHEAD - 2 }>();
            sync::bar_sync();
            unroll!(x in [0, 1] {
                let j = i + AHEAD + x as u32;
                if j < self.blocks() {
                    issue_block(p, self.next_entry[x], (self.w.kb0 + j) * BLOCK_N, self.slot(j));
                }
                cp_async::cp_async_commit_group();
            });
        }
        self.next_entry = [self.entry(i + AHEAD + 2), self.entry(i + AHEAD + 3)];
        let blk = [
            self.slot(i),
            if has_b {
                self.slot(i + 1)
            } else {
                self.slot(i)
            },
        ];
        // SAFETY: forwarded from the caller; the blocks have landed.
        unsafe {
            let mut s = qk2::<RGS>(self.q_s(), blk, self.ch, self.g, self.t);
            let m_loc = self.mask_scale(&mut s, i, has_b);
            let m_new = self.exchange_max(m_loc);
            self.softmax_to_p(&s, m_new);
            sync::bar_sync();
            let p_s = self.p_s();
            pv2::<RGS>(&mut self.o, p_s, blk, self.ch, self.lane);
        }
    }

    /// Masks S of the pair starting at block `i`, scales it to log2 units, and returns
    /// this thread's row maxima.
    #[inline(always)]
    fn mask_scale(&self, s: &mut [[[f32; 4]; 2]; RGS], i: u32, has_b: bool) -> [[f32; 2]; RGS] {
        let n0 = (self.w.kb0 + i) * BLOCK_N + self.ch * 8 + 2 * self.t;
        let mut m_loc = [[f32::NEG_INFINITY; 2]; RGS];
        unroll!(rg in [0, 1] {
            if rg < RGS {
                unroll!(x in [0, 1] {
                    unroll!(e in [0, 1, 2, 3] {
                        let j = n0 + x as u32 * BLOCK_N + (e % 2) as u32;
                        let seen = j < self.vis_r[rg][e / 2] && (x == 0 || has_b);
                        let v = if seen {
                            s[rg][x][e] * self.row_scale[rg][e / 2]
                        } else {
                            f32::NEG_INFINITY
                        };
                        s[rg][x][e] = v;
                        m_loc[rg][e / 2] = sync::fmax(m_loc[rg][e / 2], v);
                    });
                });
            }
        });
        m_loc
    }

    /// The new running maxima of this thread's rows: the quad's, then the warps' through
    /// the exchange.
    ///
    /// # Safety
    /// All threads of the CTA (a CTA barrier inside); converged warps.
    #[inline(always)]
    unsafe fn exchange_max(&self, m_loc: [[f32; 2]; RGS]) -> [[f32; 2]; RGS] {
        let (bm, red, g) = (Self::BM, self.red(), self.g);
        let mut m_new = [[0.0f32; 2]; RGS];
        // SAFETY: forwarded from the caller; the exchange holds [8][BM] f32.
        unsafe {
            unroll!(rg in [0, 1] {
                if rg < RGS {
                    let m0 = decode::quad_max(m_loc[rg][0]);
                    let m1 = decode::quad_max(m_loc[rg][1]);
                    if self.t == 0 {
                        let r = self.ch * bm + 16 * rg as u32 + g;
                        smem::st_shared_f32(red + r * 4, m0);
                        smem::st_shared_f32(red + (r + 8) * 4, m1);
                    }
                }
            });
            sync::bar_sync();
            unroll!(rg in [0, 1] {
                if rg < RGS {
                    let r = 16 * rg as u32 + g;
                    m_new[rg] = [
                        sync::fmax(self.m_run[rg][0], decode::red_max_of(red, WARPS, bm, r)),
                        sync::fmax(self.m_run[rg][1], decode::red_max_of(red, WARPS, bm, r + 8)),
                    ];
                }
            });
        }
        m_new
    }

    /// The online-softmax step from the new maxima: probabilities to the P tiles as fp16,
    /// added to the row sums; the accumulators rescaled.
    #[inline(always)]
    fn softmax_to_p(&mut self, s: &[[[f32; 4]; 2]; RGS], m_new: [[f32; 2]; RGS]) {
        let (p_s, ch, g, t) = (self.p_s(), self.ch, self.g, self.t);
        unroll!(rg in [0, 1] {
            if rg < RGS {
                let (m_ref, alpha) = decode::rescale_rows(&mut self.m_run[rg], &mut self.l_run[rg], m_new[rg]);
                let s = &s[rg];
                unroll!(x in [0, 1] {
                    let p0 = sync::ex2(s[x][0] - m_ref[0]);
                    let p1 = sync::ex2(s[x][1] - m_ref[0]);
                    let p2 = sync::ex2(s[x][2] - m_ref[1]);
                    let p3 = sync::ex2(s[x][3] - m_ref[1]);
                    self.l_run[rg][0] += p0 + p1;
                    self.l_run[rg][1] += p2 + p3;
                    // SAFETY: rows < 16, tokens < 128 of group rg's P tile.
                    unsafe {
                        let col = x as u32 * BLOCK_N + ch * 8 + 2 * t;
                        let pt = p_s + rg as u32 * GP;
                        smem::st_shared_u32(pt + frag_off(g, col, false), cvt::pack_f16x2(p0, p1));
                        smem::st_shared_u32(pt + frag_off(g + 8, col, false), cvt::pack_f16x2(p2, p3));
                    }
                });
                let o = &mut self.o[rg];
                unroll!(n in [0, 1, 2, 3, 4, 5, 6, 7] {
                    o[n][0] *= alpha[0];
                    o[n][1] *= alpha[0];
                    o[n][2] *= alpha[1];
                    o[n][3] *= alpha[1];
                });
            }
        });
    }

    /// The row sums: quad reduce, then the other warps' through the exchange.
    ///
    /// # Safety
    /// All threads of the CTA (CTA barriers inside); converged warps.
    #[inline(always)]
    unsafe fn row_sums(&self) -> [[f32; 2]; RGS] {
        let (bm, red, g) = (Self::BM, self.red(), self.g);
        let mut l_tot = [[0.0f32; 2]; RGS];
        // SAFETY: forwarded from the caller; the exchange holds [8][BM] f32.
        unsafe {
            let mut l = [[0.0f32; 2]; RGS];
            unroll!(rg in [0, 1] {
                if rg < RGS {
                    l[rg] = [decode::quad_sum(self.l_run[rg][0]), decode::quad_sum(self.l_run[rg][1])];
                }
            });
            sync::bar_sync();
            if self.t == 0 {
                unroll!(rg in [0, 1] {
                    if rg < RGS {
                        let r = self.ch * bm + 16 * rg as u32 + g;
                        smem::st_shared_f32(red + r * 4, l[rg][0]);
                        smem::st_shared_f32(red + (r + 8) * 4, l[rg][1]);
                    }
                });
            }
            sync::bar_sync();
            unroll!(rg in [0, 1] {
                if rg < RGS {
                    let r = 16 * rg as u32 + g;
                    l_tot[rg] = [decode::red_sum_of(red, WARPS, bm, r), decode::red_sum_of(red, WARPS, bm, r + 8)];
                }
            });
        }
        l_tot
    }

    /// Drains the copies, sums the rows and stores this thread's rows of each group.
    ///
    /// # Safety
    /// All threads of the CTA, once, last (CTA barriers inside); the host sized out, lse
    /// and the workspace (validated).
    #[inline(always)]
    unsafe fn epilogue(self) {
        // Drain the (possibly empty) last groups before the CTA may exit.
        cp_async::cp_async_wait_group::<0>();
        // SAFETY: forwarded from the caller.
        let l_tot = unsafe { self.row_sums() };
        unroll!(rg in [0, 1] {
            if rg < RGS {
                let row_a = self.row0 + 16 * rg as u32 + self.g;
                // SAFETY: forwarded from the caller.
                unsafe {
                    write_rows::<K>(self.p, &self.o[rg], l_tot[rg], self.m_run[rg], self.b, row_a, self.split, self.w.nsplit, self.ch, self.t)
                };
            }
        });
    }
}

/// The kernel body (see the module docs), `RGS` 16-row groups per CTA: the prologue (the
/// first blocks, Q), per pair of blocks of the split's chunk the pair step, the epilogue
/// (row sums, stores).
///
/// # Safety
/// As [`decode::decode`] with the 16-row layout (`RGS` 1) or the 32-row one (`RGS` 2: the
/// grid's row tiles are 32 rows, the shared memory `decode_tile::SMEM_F8X2`) and an
/// fp8 cache.
#[inline(always)]
pub unsafe fn decode_fp8<K: DecodeKind, const RGS: usize>(p: DecodeParams) {
    const { assert!(RGS == 1 || RGS == 2) };
    let (tile, b, split) = decode::cta_coords();
    let Some(work) = decode::cta_work(&p, split, b) else {
        return;
    };
    let blocks = work.kb1 - work.kb0;
    let mut cta = Cta::<K, RGS>::new(&p, work, tile, b, split);
    // SAFETY (whole pipeline): every shared address stays inside the regions of
    // `f8_smem(RGS)`; every barrier is reached by all threads (loop bounds are CTA-uniform).
    unsafe {
        cta.prologue();
        // Blocks are taken in pairs (i, i + 1): one exchange, one P tile and three barriers
        // per pair.
        let mut i = 0;
        while i < blocks {
            cta.pair_step(i);
            i += 2;
        }
        cta.epilogue();
    }
}

/// Normalises and stores this thread's rows `row_a`, `row_a + 8`: dims
/// `64 ch + 16 c + 4 t .. +4` for the warp's chunks `c` in 0..4 (see [`pv2`]), to `out` /
/// `lse` when the sequence has one split, else to the partials.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn write_rows<K: DecodeKind>(
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
