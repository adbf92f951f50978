//! The `wgmma` decode (sm_90a only; `--cfg mla_wgmma`): bf16 Q with a bf16 or fp8 e4m3
//! cache, or fp8 Q (widened exactly to bf16 as it loads) with an fp8 cache; the 64-row
//! tile, the same grid, params and outputs as [`crate::decode`]'s 64-row kernel, so the
//! host's split schedule, workspace and combine are shared.
//!
//! - Grid `(ceil(s_q * heads / 64), batch, max_splits)`, block 256 (two warpgroups),
//!   dynamic shared memory `decode_tile::WG_SMEM_BYTES`: up to 1 KB of alignment slack, Q
//!   and two KV stages as slab tiles (72 KB each, [`slab_off`]; with an fp8 cache the
//!   second holds two raw stages and each block is converted into the first), the P slab
//!   and the row exchange.
//! - Each warpgroup computes S for half of the block's tokens (64 x 32, 36 `wgmma`
//!   k-steps, both operands K-major from shared memory); the row maxima cross shared
//!   memory (named barrier 1), so both warpgroups hold the same running max. Each stores
//!   its half of P (bf16) to a P slab and multiplies P by its 256 output dims of V (an
//!   MN-major B over four slabs, transposed-B flag): its own half of the tokens from
//!   registers (the S accumulators repacked as A fragments), the other half from the P
//!   slab once named barrier 2 says it is there. The row sums cross shared memory once,
//!   at the end. No MMA is done twice.
//! - KV: `cp.async`, one row per 4 threads, two stages, the page looked up a block ahead;
//!   one CTA barrier per block (the next block is issued behind QK^T).
//!   A split works on the blocks [`mla_abi::chunk_blocks`] gives it and stores through
//!   [`crate::decode`]'s `write_rows` (out/lse for one split, else the workspace partials).

use crate::arch::{self, cp_async, cvt, smem, sync, wgmma};
use crate::decode::{self, DecodeKind, M64};
use crate::elem::Bf16;
use core::marker::PhantomData;
use mla_abi::DecodeParams;
use mla_abi::decode_tile as T;

/// Bytes of one 64-dim slab of a 64-row tile (64 rows x 128 bytes).
pub(crate) const SLAB: u32 = T::WG_SLAB_BYTES as u32;
/// One 64 x 576 16-bit tile in slabs.
pub(crate) const SLAB_TILE: u32 = T::QK_TILE_BYTES as u32;
const BLOCK_N: u32 = T::BLOCK_N as u32;
const D_QK: u32 = mla_abi::D_QK as u32;
const _: () = assert!(T::BLOCK_N * mla_abi::D_QK / 16 == 9 * 256);
/// Named barriers between the warpgroups (0 is the CTA barrier), once per block each:
/// both halves' row maxima are in the exchange / both halves of P are in the P slab.
const BAR_MAX: u32 = 1;
const BAR_P: u32 = 2;

/// Byte offset of 16-byte chunk `k` (`0..72`) of row `r` (`0..64`) of a slab tile: chunk
/// `k` lives in slab `k / 8`, as chunk `(k % 8) ^ (r % 8)` of the row's 128 bytes (the
/// 128-byte swizzle, so Q and K are K-major and V is MN-major `wgmma` operands).
#[inline(always)]
pub(crate) fn slab_off(r: u32, k: u32) -> u32 {
    (k / 8) * SLAB + r * 128 + (((k % 8) ^ (r % 8)) << 4)
}

/// [`decode::clean_rows_16`] on a 16-bit slab tile ([`slab_off`]): rows `first..end` of
/// its latent dims (slabs 0-7, the values), each NaN of rows below `valid` replaced by zero
/// ([`decode::unseen_rows`] says why), rows from `valid` on zeroed; thread `tid` of
/// `threads` takes every `threads`-th chunk.
///
/// # Safety
/// As [`decode::clean_rows_16`]'s: the rows are in the tile, no thread still reads them as
/// keys, and none reads them as values before the writers' `fence.proxy.async` and a
/// barrier after this.
#[inline(always)]
pub(crate) unsafe fn clean_slab_rows(tile: u32, rows: (u32, u32, u32), tid: u32, threads: u32) {
    // SAFETY: forwarded from the caller; chunks < 64 are slabs 0-7.
    unsafe { decode::clean_rows_16::<Bf16>(rows, tid, threads, |r, k| tile + slab_off(r, k)) };
}

/// Byte offset of byte `b` (`< 64`) of row `r` in a tile of 64-byte rows with the 64-byte
/// swizzle: 16-byte chunk `b / 16` of row `r` sits at chunk `(b / 16) ^ ((r / 2) % 4)`. Eight
/// rows make one 512-byte atom; the tile must be 512-byte aligned.
#[inline(always)]
pub(crate) fn sw64_off(r: u32, b: u32) -> u32 {
    r * 64 + ((((b / 16) ^ ((r / 2) % 4)) << 4) | (b % 16))
}

/// The token at k-position `p` of V^T: in each 16 positions, `4 c + i` holds token
/// `2 c + (i % 2) + 8 (i / 2)`, the order of a lane's accumulator columns.
#[inline(always)]
pub(crate) fn vt_token(p: u32) -> u32 {
    let q = p % 16;
    (p - q) + 2 * (q / 4) + (q % 2) + 8 * ((q / 2) % 2)
}

/// The 1024-byte aligned start of the dynamic shared memory (the kernels ask for 1 KB of
/// slack).
#[inline(always)]
pub(crate) fn aligned_base() -> u32 {
    (smem::smem_base() + 1023) & !1023
}

/// One thread's share of a block's KV copy: row `r`, chunks `c4 + 4 i` (`i < 18`). In the
/// slab layout chunk `k` of row `r` sits in slab `k / 8` at byte
/// `r * 128 + 16 ((k % 8) ^ (r % 8))`; for this thread's chunks `k / 8 = i / 2` and
/// `k % 8 = c4 + 4 (i % 2)`, so two swizzled row offsets and immediates address all 18
/// (no per-chunk swizzle arithmetic).
#[derive(Clone, Copy)]
struct KvRow {
    /// `r * 128 + swizzled chunk offset` for even / odd `i`.
    smem: [u32; 2],
    /// Byte offset of chunk `c4` in a row.
    src: u32,
}

impl KvRow {
    #[inline(always)]
    fn new(r: u32, c4: u32) -> Self {
        Self {
            smem: [slab_off(r, c4), slab_off(r, c4 + 4)],
            src: c4 * 16,
        }
    }

    /// Copies KV row `j` (page-table entry `entry`, from [`decode::kv_row_page_entry`];
    /// zeros where the row must not be read) into the slab tile at `stage`.
    ///
    /// # Safety
    /// `stage` is a slab tile of `BLOCK_N` rows.
    #[inline(always)]
    unsafe fn issue(self, p: &DecodeParams, entry: i32, j: u32, stage: u32) {
        let src = decode::kv_row_source(p, entry, j, 2);
        let n = src.n;
        // No L2 policy here (unlike decode::issue_kv_row): with one, ptxas 13.0 emitted
        // LDGSTS whose cache-policy descriptor names an odd uniform register (desc[UR1])
        // and the kernel died with CUDA_ERROR_ILLEGAL_INSTRUCTION on the H200.
        // Chunk c4 + 4 i is latent for i < 16 (64 chunks), rope after.
        let k0 = self.src / 16;
        unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17] {
            let dst = stage + self.smem[i % 2] + (i / 2) as u32 * SLAB;
            let s = src.part(i < 16, k0 + 4 * i as u32, 64);
            // SAFETY: chunk k0 + 4 i of one cache row (or unread, n == 0); dst inside the
            // stage.
            unsafe { cp_async::cp_async_cg_16(dst, s, n) };
        });
    }

    /// As [`KvRow::issue`] for an fp8 cache: the row's 576 bytes (36 chunks, this thread's
    /// 9) unswizzled into a raw stage of `BLOCK_N` rows.
    ///
    /// # Safety
    /// `raw` is a raw fp8 stage of `BLOCK_N` rows.
    #[inline(always)]
    unsafe fn issue_fp8(self, p: &DecodeParams, entry: i32, j: u32, raw: u32) {
        let src = decode::kv_row_source(p, entry, j, 1);
        let n = src.n;
        let r = j % BLOCK_N;
        let dst = raw + r * D_QK + self.src;
        // Chunk c4 + 4 i of the row's 36 is latent for i < 8 (32 chunks), rope after.
        let k0 = self.src / 16;
        unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
            let s = src.part(i < 8, k0 + 4 * i as u32, 32);
            // SAFETY: chunk k0 + 4 i of one cache row (or unread, n == 0); dst inside the
            // raw stage.
            unsafe { cp_async::cp_async_cg_16(dst + 64 * i as u32, s, n) };
        });
    }
}

/// Converts a landed raw fp8 stage into the bf16 slab tile at `tile` (e4m3 to bf16 is
/// exact), 16 raw bytes to two 16-byte chunks at a time.
///
/// # Safety
/// All threads of the CTA call it between barriers; `raw` and `tile` are a raw stage and a
/// slab tile.
#[inline(always)]
unsafe fn convert_fp8_stage<K: DecodeKind<Mma = Bf16>>(raw: u32, tile: u32) {
    const CHUNKS: u32 = D_QK / 16;
    let tid = arch::thread_idx_x();
    unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
        let c = tid + 256 * i as u32;
        let (r, k) = (c / CHUNKS, c % CHUNKS);
        // SAFETY: r < BLOCK_N, k < 36: inside the raw stage and the tile.
        unsafe {
            let v = smem::ld_shared_v4(raw + r * D_QK + (k << 4));
            smem::st_shared_v4(tile + slab_off(r, 2 * k), decode::fp8x8_to_half::<K::Mma>([v[0], v[1]]));
            smem::st_shared_v4(tile + slab_off(r, 2 * k + 1), decode::fp8x8_to_half::<K::Mma>([v[2], v[3]]));
        }
    });
}

/// One CTA of [`decode_wg`]: its work, where its rows, KV row and shared regions are, and
/// the registers that live through the block loop (accumulators, row statistics, the
/// page-table entry loaded a block ahead, the stage).
struct Cta<'a, K: DecodeKind<Mma = Bf16>> {
    p: &'a DecodeParams,
    b: u32,
    split: u32,
    w: decode::CtaWork,
    /// The tile's first query row.
    row0: u32,
    /// This thread's warpgroup, quad column `c`, and first row in the tile (`r_loc`: row
    /// g of its warp's 16; the other is `r_loc + 8`).
    wg: u32,
    c: u32,
    r_loc: u32,
    /// The KV row this thread copies (4 threads per row, 18 chunks each).
    kv_r: u32,
    row: KvRow,
    base: u32,
    /// Causal visibility of this thread's two rows.
    vis_r: [u32; 2],
    scale_log2: f32,
    /// This thread's page-table entry in the next block to issue.
    next_entry: i32,
    /// The stage of the current block.
    stage: u32,
    o: [[f32; 4]; 32],
    m_run: [f32; 2],
    l_run: [f32; 2],
    _kind: PhantomData<K>,
}

impl<'a, K: DecodeKind<Mma = Bf16>> Cta<'a, K> {
    #[inline(always)]
    fn new(p: &'a DecodeParams, w: decode::CtaWork, tile: u32, b: u32, split: u32) -> Self {
        let tid = arch::thread_idx_x();
        let warp = tid / 32;
        let lane = tid % 32;
        let row0 = tile * 64;
        let r_loc = 16 * (warp % 4) + lane / 4;
        let row_a = row0 + r_loc;
        let kv_r = tid / 4;
        let vis_r = [
            decode::visible(p, w.len, w.glen, row_a),
            decode::visible(p, w.len, w.glen, row_a + 8),
        ];
        Self {
            p,
            b,
            split,
            w,
            row0,
            wg: warp / 4,
            c: lane % 4,
            r_loc,
            kv_r,
            row: KvRow::new(kv_r, tid % 4),
            base: aligned_base(),
            vis_r,
            scale_log2: p.softmax_scale * core::f32::consts::LOG2_E,
            next_entry: -1,
            stage: 0,
            o: [[0.0; 4]; 32],
            m_run: [f32::NEG_INFINITY; 2],
            l_run: [0.0; 2],
            _kind: PhantomData,
        }
    }

    /// KV: two bf16 stages, or (fp8 cache) the converted tile (stage 0's).
    #[inline(always)]
    fn kv_s(&self, s: u32) -> u32 {
        self.base + SLAB_TILE + s * SLAB_TILE
    }

    /// The fp8 cache's raw stage `s`.
    #[inline(always)]
    fn raw_s(&self, s: u32) -> u32 {
        self.base + T::WG_SMEM_FP8_RAW as u32 + s * T::FP8_STAGE_BYTES as u32
    }

    #[inline(always)]
    fn p_s(&self) -> u32 {
        self.base + T::WG_SMEM_P as u32
    }

    /// The row exchange: row maxima per warpgroup, then (after the loop) row sums.
    #[inline(always)]
    fn red_max(&self, w: u32, r: u32) -> u32 {
        self.base + T::WG_SMEM_RED as u32 + (w * 64 + r) * 4
    }

    #[inline(always)]
    fn red_sum(&self, w: u32, r: u32) -> u32 {
        self.base + T::WG_SMEM_RED as u32 + 512 + (w * 64 + r) * 4
    }

    /// This thread's page-table entry in block `kb`, checked at the issue.
    #[inline(always)]
    fn entry_of(&self, kb: u32) -> i32 {
        decode::kv_row_page_entry(self.p, self.b, kb * BLOCK_N + self.kv_r, self.w.len)
    }

    /// Issues this thread's copies of block `kb` (page-table entry `entry`) into stage
    /// `stage`.
    #[inline(always)]
    fn issue(&self, entry: i32, kb: u32, stage: u32) {
        let j = kb * BLOCK_N + self.kv_r;
        // SAFETY: the stage holds BLOCK_N slab-layout rows, or BLOCK_N raw fp8 rows.
        unsafe {
            if K::KV_FP8 {
                self.row.issue_fp8(self.p, entry, j, self.raw_s(stage))
            } else {
                self.row.issue(self.p, entry, j, self.kv_s(stage))
            }
        }
    }

    /// Issues block `kb + 1` (if the chunk has it) into the other stage as one commit
    /// group, and loads the entry of the block after it.
    #[inline(always)]
    fn issue_next(&mut self, kb: u32) {
        let kb1 = self.w.kb1;
        if kb + 1 < kb1 {
            self.issue(self.next_entry, kb + 1, self.stage ^ 1);
            if kb + 2 < kb1 {
                self.next_entry = self.entry_of(kb + 2);
            }
        }
        cp_async::cp_async_commit_group();
    }

    /// Loads the Q rows (zeros past the last row) and issues the chunk's first block (one
    /// commit group), then loads the next block's entry.
    ///
    /// # Safety
    /// All threads of the CTA, once, first.
    #[inline(always)]
    unsafe fn prologue(&mut self) {
        let (kb0, kb1) = (self.w.kb0, self.w.kb1);
        // fp8 Q converts as it loads (loads the thread waits for), so the first block's
        // copies go out before it; 16-bit Q is copied by `cp.async` ahead of them.
        if K::Q_FP8 && kb0 < kb1 {
            self.issue(self.entry_of(kb0), kb0, 0);
        }
        // SAFETY: the Q tile holds 64 slab-layout rows of a validated q (bf16, as the
        // converted cache).
        unsafe {
            decode::load_q_tile::<K, M64, K::Mma>(self.p, self.b, self.row0, self.base, slab_off)
        };
        if !K::Q_FP8 && kb0 < kb1 {
            self.issue(self.entry_of(kb0), kb0, 0);
        }
        cp_async::cp_async_commit_group();
        self.next_entry = if kb0 + 1 < kb1 {
            self.entry_of(kb0 + 1)
        } else {
            -1
        };
    }

    /// Waits until block `kb` has landed; with an fp8 cache issues the next raw block and
    /// converts this one into the bf16 tile. Returns the block's slab tile.
    ///
    /// # Safety
    /// All threads of the CTA, once per block in order (CTA barriers inside).
    #[inline(always)]
    unsafe fn land(&mut self, kb: u32) -> u32 {
        // The only group in flight is this block's (with Q for the first).
        cp_async::cp_async_wait_group::<0>();
        // cp.async wrote through the generic proxy; wgmma reads through the async one.
        wgmma::fence_proxy_async_shared();
        // SAFETY: forwarded from the caller.
        unsafe { sync::bar_sync() };
        // Past this barrier every thread has finished the previous block's P.V (its
        // wgmma_wait_group) and exchange reads, so the other stage (fp8: the converted
        // tile), P and the row exchange are free for this block.
        if K::KV_FP8 {
            // The next raw block goes out first, then this one becomes the bf16 tile (a
            // second barrier: every thread converts rows others copied and wgmma reads).
            self.issue_next(kb);
            // SAFETY: the raw stage landed (waited above, barrier); the tile is free.
            unsafe {
                convert_fp8_stage::<K>(self.raw_s(self.stage), self.kv_s(0));
                wgmma::fence_proxy_async_shared();
                sync::bar_sync();
            }
            self.kv_s(0)
        } else {
            self.kv_s(self.stage)
        }
    }

    /// S[:, 32 wg .. 32 wg + 32] = Q K^T for this warpgroup's half of block `kb`'s tokens
    /// (in the tile `kv`); the next bf16 block's copies go out while the tensor cores run.
    ///
    /// # Safety
    /// All threads of the CTA after [`Cta::land`]; converged warpgroups.
    #[inline(always)]
    unsafe fn qk(&mut self, kb: u32, kv: u32) -> [f32; 16] {
        let mut s = [0.0f32; 16];
        let (q_s, wg) = (self.base, self.wg);
        // SAFETY: forwarded from the caller; the descriptors address the Q tile and the
        // stage.
        unsafe {
            wgmma::wgmma_fence();
            for ks in 0..36u32 {
                let off = (ks / 4) * SLAB + (ks % 4) * 32;
                let da = wgmma::smem_desc(q_s + off, 16, 1024, wgmma::Swizzle::B128);
                let db = wgmma::smem_desc(kv + off + wg * 32 * 128, 16, 1024, wgmma::Swizzle::B128);
                wgmma::wgmma_m64n32k16_bf16::<0>(&mut s, da, db, ks > 0);
            }
            wgmma::wgmma_commit_group();
            if !K::KV_FP8 {
                self.issue_next(kb);
            }
            wgmma::wgmma_wait_group::<0>();
            // This warpgroup's S has read its 32 token rows as keys; no P.V reads them as
            // values before both warpgroups pass BAR_MAX (in `softmax`).
            let (first, valid) = decode::unseen_rows(self.p, self.w.len, kb);
            let (lo, hi) = (first.max(32 * wg), valid.min(32 * wg + 32));
            if lo < hi {
                clean_slab_rows(kv, (lo, hi, hi), arch::thread_idx_x() % 128, 128);
                wgmma::fence_proxy_async_shared();
            }
        }
        s
    }

    /// The online softmax of block `kb`'s S: mask, scale, row max over this half (the quad
    /// holds its 32 columns of two rows), then over both halves through shared memory
    /// (named barrier [`BAR_MAX`]); the new probabilities' row sums, P's half as A
    /// fragments (k-steps `2 wg`, `2 wg + 1` of the block's four), also stored to the P
    /// slab for the other warpgroup; the accumulators rescaled.
    ///
    /// # Safety
    /// Both warpgroups, once per block (a named barrier inside); converged warps; the
    /// previous block's P and exchange readers are past the block's first barrier.
    #[inline(always)]
    unsafe fn softmax(&mut self, kb: u32, mut s: [f32; 16]) -> [[u32; 4]; 2] {
        let (wg, c, r_loc) = (self.wg, self.c, self.r_loc);
        let other = 1 - wg;
        let mut m_loc = [f32::NEG_INFINITY; 2];
        unroll!(j in [0, 1, 2, 3] {
            unroll!(e in [0, 1, 2, 3] {
                let tok = kb * BLOCK_N + 32 * wg + 8 * j as u32 + 2 * c + (e % 2) as u32;
                let x = if tok < self.vis_r[e / 2] { s[4 * j + e] * self.scale_log2 } else { f32::NEG_INFINITY };
                s[4 * j + e] = x;
                m_loc[e / 2] = sync::fmax(m_loc[e / 2], x);
            });
        });
        let mut frags = [[0u32; 4]; 2];
        // SAFETY: forwarded from the caller; rows < 64 of the exchange and the P slab.
        unsafe {
            let m_half = [decode::quad_max(m_loc[0]), decode::quad_max(m_loc[1])];
            smem::st_shared_f32_if(self.red_max(wg, r_loc), m_half[0], (c == 0) as u32);
            smem::st_shared_f32_if(self.red_max(wg, r_loc + 8), m_half[1], (c == 0) as u32);
            sync::bar_sync_named::<BAR_MAX, 256>();
            let m_new = [
                sync::fmax(
                    self.m_run[0],
                    sync::fmax(m_half[0], smem::ld_shared_f32(self.red_max(other, r_loc))),
                ),
                sync::fmax(
                    self.m_run[1],
                    sync::fmax(
                        m_half[1],
                        smem::ld_shared_f32(self.red_max(other, r_loc + 8)),
                    ),
                ),
            ];
            let (m_ref, alpha) = decode::rescale_rows(&mut self.m_run, &mut self.l_run, m_new);
            unroll!(j in [0, 1, 2, 3] {
                unroll!(e in [0, 1, 2, 3] {
                    let pe = sync::ex2(s[4 * j + e] - m_ref[e / 2]);
                    self.l_run[e / 2] += pe;
                    s[4 * j + e] = pe;
                });
            });
            let p_s = self.p_s();
            unroll!(kk in [0, 1] {
                let t0 = 4 * (2 * kk);
                let t1 = 4 * (2 * kk + 1);
                frags[kk] = [
                    cvt::pack_bf16x2(s[t0], s[t0 + 1]),
                    cvt::pack_bf16x2(s[t0 + 2], s[t0 + 3]),
                    cvt::pack_bf16x2(s[t1], s[t1 + 1]),
                    cvt::pack_bf16x2(s[t1 + 2], s[t1 + 3]),
                ];
                // Row r, token chunk 4 wg + j.
                let ch0 = 4 * wg + 2 * kk as u32;
                let at = |r: u32, ch: u32| p_s + r * 128 + ((ch ^ (r % 8)) << 4) + 4 * c;
                smem::st_shared_u32(at(r_loc, ch0), frags[kk][0]);
                smem::st_shared_u32(at(r_loc + 8, ch0), frags[kk][1]);
                smem::st_shared_u32(at(r_loc, ch0 + 1), frags[kk][2]);
                smem::st_shared_u32(at(r_loc + 8, ch0 + 1), frags[kk][3]);
            });
            wgmma::fence_proxy_async_shared();
            // Once the running max settles most blocks leave it unchanged: skip the 128
            // multiplies by one (per thread; no collective op inside).
            if alpha[0] != 1.0 || alpha[1] != 1.0 {
                let o = &mut self.o;
                unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
                    o[j][0] *= alpha[0];
                    o[j][1] *= alpha[0];
                    o[j][2] *= alpha[1];
                    o[j][3] *= alpha[1];
                });
            }
        }
        frags
    }

    /// O[:, this warpgroup's 256 dims] += P . V over the block's four 16-token k-steps:
    /// this half's two from registers (`frags`), then (past the barrier [`BAR_P`] that says
    /// the other half is stored) the other's two from the P slab. V's k-step t is 16 token
    /// rows of slabs `4 wg .. 4 wg + 4` of the tile `kv`.
    ///
    /// # Safety
    /// Both warpgroups, once per block after [`Cta::softmax`] (a named barrier inside).
    #[inline(always)]
    unsafe fn pv(&mut self, kv: u32, frags: [[u32; 4]; 2]) {
        let wg = self.wg;
        let other = 1 - wg;
        let p_s = self.p_s();
        let v_desc = |t: u32| {
            wgmma::smem_desc(
                kv + 4 * wg * SLAB + t * 16 * 128,
                SLAB,
                1024,
                wgmma::Swizzle::B128,
            )
        };
        // SAFETY: forwarded from the caller; the descriptors address this stage and P.
        unsafe {
            wgmma::wgmma_fence();
            unroll!(kk in [0, 1] {
                wgmma::wgmma_m64n256k16_rs_bf16::<1>(&mut self.o, frags[kk], v_desc(2 * wg + kk as u32), true);
            });
            sync::bar_sync_named::<BAR_P, 256>();
            unroll!(kk in [0, 1] {
                let t = 2 * other + kk as u32;
                let da = wgmma::smem_desc(p_s + 32 * t, 16, 1024, wgmma::Swizzle::B128);
                wgmma::wgmma_m64n256k16_ss_bf16::<1>(&mut self.o, da, v_desc(t), true);
            });
            wgmma::wgmma_commit_group();
            wgmma::wgmma_wait_group::<0>();
        }
        self.stage ^= 1;
    }

    /// Drains the copies; each warpgroup summed its half of the tokens (against the same
    /// running max), so the row sum is both halves': it crosses shared memory once. Then
    /// stores this thread's rows (warpgroup `wg` holds output dims `256 wg .. +256`, the
    /// 64-row tile's column split `wg`).
    ///
    /// # Safety
    /// All threads of the CTA, once, last (a named barrier inside); the host sized out,
    /// lse and the workspace (validated).
    #[inline(always)]
    unsafe fn epilogue(self) {
        cp_async::cp_async_wait_group::<0>();
        let (wg, c, r_loc) = (self.wg, self.c, self.r_loc);
        let other = 1 - wg;
        // SAFETY: forwarded from the caller; converged warps.
        unsafe {
            let l_half = [
                decode::quad_sum(self.l_run[0]),
                decode::quad_sum(self.l_run[1]),
            ];
            smem::st_shared_f32_if(self.red_sum(wg, r_loc), l_half[0], (c == 0) as u32);
            smem::st_shared_f32_if(self.red_sum(wg, r_loc + 8), l_half[1], (c == 0) as u32);
            sync::bar_sync_named::<BAR_MAX, 256>();
            let l_tot = [
                l_half[0] + smem::ld_shared_f32(self.red_sum(other, r_loc)),
                l_half[1] + smem::ld_shared_f32(self.red_sum(other, r_loc + 8)),
            ];
            let row_a = self.row0 + r_loc;
            decode::write_rows::<K, M64>(
                self.p,
                &self.o,
                l_tot,
                self.m_run,
                self.b,
                row_a,
                self.split,
                self.w.nsplit,
                wg,
                c,
            );
        }
    }
}

/// The kernel body (see the module docs): the prologue (Q, the first block), per block of
/// the split's chunk its landing, S, the softmax and P.V, the epilogue (row sums, stores).
///
/// # Safety
/// Launched with the grid, block and shared memory above on params the host validated
/// (bf16 Q with a bf16 or (`K::KV_FP8`) fp8 e4m3 cache, or (`K::Q_FP8`) fp8 Q with an fp8
/// cache; shapes, strides, workspace capacity).
#[inline(always)]
pub unsafe fn decode_wg<K: DecodeKind<Mma = Bf16>>(p: DecodeParams) {
    // SAFETY: every thread of the CTA, converged, first.
    let Some((tile, b, split, work)) = (unsafe { decode::grid_cell_work(&p) }) else {
        return;
    };
    let (kb0, kb1) = (work.kb0, work.kb1);
    let mut cta = Cta::<K>::new(&p, work, tile, b, split);
    // SAFETY: every thread runs every phase (loop bounds are CTA-uniform), so all reach
    // the CTA and named barriers; each warpgroup runs its wgmma sequences converged.
    unsafe {
        cta.prologue();
        let mut kb = kb0;
        while kb < kb1 {
            let kv = cta.land(kb);
            let s = cta.qk(kb, kv);
            let frags = cta.softmax(kb, s);
            cta.pv(kv, frags);
            kb += 1;
        }
        cta.epilogue();
    }
}
