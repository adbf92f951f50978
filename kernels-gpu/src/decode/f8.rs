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
//!   (rows of 576 bytes, 16-byte chunks XOR-swizzled by row, [`ops::raw_off`]), P as fp16 for
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
//!
//! Here: the CTA's state, its phases (prologue, pair step, epilogue) and the kernel body;
//! the offsets, copies, Q load, MMAs and row stores in [`ops`].

use crate::arch::{self, cp_async, cvt, smem, sync};
use crate::decode::{self, CtaWork, DecodeKind};
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

mod ops;

use ops::{frag_off, issue_block, load_q, pv2, qk2, write_rows};

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
            // Every warp's S of the pair is done (the exchange's barrier); the P.V reads
            // the blocks after the barrier below.
            self.clean_unseen(i, blk[0]);
            if has_b {
                self.clean_unseen(i + 1, blk[1]);
            }
            self.softmax_to_p(&s, m_new);
            sync::bar_sync();
            let p_s = self.p_s();
            pv2::<RGS>(&mut self.o, p_s, blk, self.ch, self.lane);
        }
    }

    /// The raw block `i` of the chunk (at `slot`) with each NaN value (latent bytes) of the
    /// rows only the step's later tokens see replaced by zero ([`decode::unseen_rows`]).
    /// Rolled: cold code beside the pair loop.
    ///
    /// # Safety
    /// All threads of the CTA, after every read of the block as keys and before a barrier
    /// that precedes its reads as values.
    #[inline(always)]
    unsafe fn clean_unseen(&self, i: u32, slot: u32) {
        let (first, valid) = decode::unseen_rows(self.p, self.w.len, self.w.kb0 + i);
        let mut c = arch::thread_idx_x();
        while c < (valid - first) * (D_V as u32 / 16) {
            let at = slot + (first + c / 32) * ROW + 16 * (c % 32);
            // SAFETY: forwarded from the caller; row < 64 of the block, chunk < 32 (the
            // latent bytes: the swizzle keeps aligned groups of four chunks).
            unsafe {
                arch::no_unroll();
                smem::st_shared_v4(at, decode::nan_to_zero_e4m3(smem::ld_shared_v4(at)));
            }
            c += THREADS;
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
    // SAFETY: every thread of the CTA, converged, first.
    let Some((tile, b, split, work)) = (unsafe { decode::grid_cell_work(&p) }) else {
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
