//! The `mma.sync` decode kernel body (64-row and 16-row tiles, every arch): the grid,
//! block, shared memory and pipeline are described in [`super`]; the helpers it shares with
//! the other decode kernels live there too.

use super::*;
use core::marker::PhantomData;

/// Converts a landed raw fp8 stage into the swizzled 16-bit KV tile.
#[inline(always)]
unsafe fn convert_fp8_stage<K: DecodeKind>(raw_stage: u32, tile: u32) {
    let mut c = arch::thread_idx_x();
    while c < BLOCK_N * FP8_ROW_CHUNKS {
        let r = c / FP8_ROW_CHUNKS;
        let k = c % FP8_ROW_CHUNKS;
        // SAFETY: inside the raw stage and the tile (both sized by decode_tile).
        unsafe {
            let v = smem::ld_shared_v4(raw_stage + r * D_QK as u32 + (k << 4));
            smem::st_shared_v4(
                tile + qk_off(r, 2 * k),
                fp8x8_to_half::<K::Mma>([v[0], v[1]]),
            );
            smem::st_shared_v4(
                tile + qk_off(r, 2 * k + 1),
                fp8x8_to_half::<K::Mma>([v[2], v[3]]),
            );
        }
        c += THREADS;
    }
}

/// S (16 rows x 64/CS tokens) = Q[rows of rg] . K[tokens of ch]^T over all 576 dims.
/// `kv` holds the warp's tokens; with one 8-token tile per warp (`S_TILES == 1`) they start at
/// row `tok_row` of `kv` (a ring slot holds 32 tokens, a stage all 64).
#[inline(always)]
unsafe fn qk_tile_gemm<H: Half16, L: Layout>(
    q_smem: u32,
    kv: u32,
    tok_row: u32,
    rg: u32,
    ch: u32,
    lane: u32,
) -> [[f32; 4]; 4] {
    let mut s = [[0.0f32; 4]; 4];
    let a_row = rg * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
    let a_half = lane / 16;
    if L::S_TILES >= 4 {
        // Two pairs of 8-token tiles per k-step: ldmatrix.x4 gives (tile, k-half) x 2.
        let b_row0 = ch * 32 + (lane % 8) + (lane / 16) * 8;
        let b_half = (lane / 8) % 2;
        for ks in 0..(D_QK / 16) as u32 {
            // SAFETY: rows < 64 and chunks < 72 address the Q and KV tiles; warp converged.
            unsafe {
                let a = ldmatrix::ldmatrix_x4(q_smem + qk_off(a_row, ks * 2 + a_half));
                let b0 = ldmatrix::ldmatrix_x4(kv + qk_off(b_row0, ks * 2 + b_half));
                let b1 = ldmatrix::ldmatrix_x4(kv + qk_off(b_row0 + 16, ks * 2 + b_half));
                H::mma(&mut s[0], a, [b0[0], b0[1]]);
                H::mma(&mut s[1], a, [b0[2], b0[3]]);
                H::mma(&mut s[2], a, [b1[0], b1[1]]);
                H::mma(&mut s[3], a, [b1[2], b1[3]]);
            }
        }
    } else {
        // One 8-token tile: ldmatrix.x4 gives the four 8-dim chunks of two k-steps. Four
        // accumulators (one per k-step mod 4) keep the dependent MMA chain 9 deep, not 36.
        let b_row = tok_row + (lane % 8);
        let b_chunk = lane / 8;
        for kq in 0..(D_QK / 64) as u32 {
            unroll!(h in [0, 1] {
                let kp = 2 * kq + h as u32;
                // SAFETY: as above.
                unsafe {
                    let a0 = ldmatrix::ldmatrix_x4(q_smem + qk_off(a_row, kp * 4 + a_half));
                    let a1 = ldmatrix::ldmatrix_x4(q_smem + qk_off(a_row, kp * 4 + 2 + a_half));
                    let b = ldmatrix::ldmatrix_x4(kv + qk_off(b_row, kp * 4 + b_chunk));
                    H::mma(&mut s[2 * h], a0, [b[0], b[1]]);
                    H::mma(&mut s[2 * h + 1], a1, [b[2], b[3]]);
                }
            });
        }
        unroll!(e in [0, 1, 2, 3] {
            s[0][e] = (s[0][e] + s[1][e]) + (s[2][e] + s[3][e]);
        });
    }
    s
}

/// O (16 rows x 512/CS dims of ch) += P[rows of rg, 64 tokens] . V[64 tokens, dims of ch].
///
/// V tile n-pair `np` (16 dims) of lane `l` sits in swizzled chunk
/// `ch*64/CS + 8*(np/4) + ((2*(np%4) + l/16) ^ (row % 8))`: four per-lane column offsets plus
/// a constant 128 bytes per `np / 4`, so the addresses fold into immediates.
///
/// Tokens 0..32 are rows of `kv`, tokens 32..64 rows of `kv + hi_delta` (wrapping): two
/// ring slots, or with `hi_delta = 32 rows` the two halves of one stage.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_tile_gemm<H: Half16, L: Layout>(
    o: &mut [[f32; 4]; O_TILES_MAX],
    p_smem: u32,
    kv: u32,
    hi_delta: u32,
    rg: u32,
    ch: u32,
    lane: u32,
) {
    let a_row = rg * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
    let a_half = lane / 16;
    let v_row = (lane % 8) + ((lane / 8) % 2) * 8;
    let sw = v_row & 7;
    let col = |q: u32| (ch * (L::O_TILES as u32) + ((2 * q + lane / 16) ^ sw)) << 4;
    let vcol = [col(0), col(1), col(2), col(3)];
    for kk in 0..(BLOCK_N / 16) {
        // SAFETY: P rows < 64, chunks < 8; V rows < 64, chunks < 64 (of 72); converged.
        unsafe {
            let a = ldmatrix::ldmatrix_x4(p_smem + p_off(a_row, kk * 2 + a_half));
            // Branch-free, so the k-step loop keeps its shape.
            let half = kv.wrapping_add((kk / (HALF_N / 16)).wrapping_mul(hi_delta));
            let vbase = half + ((kk % (HALF_N / 16)) * 16 + v_row) * ROW_BYTES;
            unroll!(np in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                if np < L::O_TILES / 2 {
                    let v = ldmatrix::ldmatrix_x4_trans(vbase + vcol[np % 4] + (np as u32 / 4) * 128);
                    H::mma(&mut o[2 * np], a, [v[0], v[1]]);
                    H::mma(&mut o[2 * np + 1], a, [v[2], v[3]]);
                }
            });
        }
    }
}

/// One CTA of [`decode`]: its work, where its rows, KV row and shared regions are, and the
/// registers that live through the block loop (the accumulators and row statistics, the
/// page-table entries loaded one issue ahead, the stage).
struct Cta<'a, K: DecodeKind, L: Layout> {
    p: &'a DecodeParams,
    b: u32,
    split: u32,
    w: CtaWork,
    /// The tile's first query row.
    row0: u32,
    /// This warp's row group and column split, this lane's quad row `g` and column `c4`.
    rg: u32,
    ch: u32,
    lane: u32,
    g: u32,
    c4: u32,
    /// The KV row this thread copies in every block (ring: in every half-block).
    kv_r: u32,
    base: u32,
    /// Causal visibility of this thread's two rows (g and g + 8 of its row group).
    vis_r: [u32; 2],
    scale_log2: f32,
    /// This thread's KV row's page-table entries for the next issue: the next block, or
    /// (ring) the next two half-blocks.
    next_entry: [i32; 2],
    /// The two-stage pipeline's stage of the current block.
    stage: u32,
    o: [[f32; 4]; O_TILES_MAX],
    m_run: [f32; 2],
    l_run: [f32; 2],
    _kind: PhantomData<(K, L)>,
}

impl<'a, K: DecodeKind, L: Layout> Cta<'a, K, L> {
    /// The ring (16-row tile, 16-bit cache) or two full stages.
    const RING: bool = L::RING && !K::KV_FP8;

    #[inline(always)]
    fn new(p: &'a DecodeParams, w: CtaWork, tile: u32, b: u32, split: u32) -> Self {
        let tid = arch::thread_idx_x();
        let warp = tid / 32;
        let lane = tid % 32;
        let rg = warp % L::RG;
        let g = lane / 4;
        let row0 = tile * L::BM;
        let row_a = row0 + rg * 16 + g;
        let vis_r = [
            visible(p, w.len, w.glen, row_a),
            visible(p, w.len, w.glen, row_a + 8),
        ];
        Self {
            p,
            b,
            split,
            w,
            row0,
            rg,
            ch: warp / L::RG,
            lane,
            g,
            c4: lane % 4,
            kv_r: if Self::RING {
                tid / HALF_TPR
            } else {
                tid / KV_TPR
            },
            base: smem::smem_base(),
            vis_r,
            scale_log2: p.softmax_scale * LOG2E,
            next_entry: [-1, -1],
            stage: 0,
            o: [[0.0; 4]; O_TILES_MAX],
            m_run: [f32::NEG_INFINITY; 2],
            l_run: [0.0; 2],
            _kind: PhantomData,
        }
    }

    #[inline(always)]
    fn q_smem(&self) -> u32 {
        self.base
            + if Self::RING {
                T::SMEM_RING_Q
            } else {
                T::SMEM_Q
            } as u32
    }

    #[inline(always)]
    fn p_smem(&self) -> u32 {
        self.base
            + if Self::RING {
                T::SMEM_RING_P
            } else {
                T::SMEM_P
            } as u32
    }

    #[inline(always)]
    fn red(&self) -> u32 {
        self.base
            + if Self::RING {
                T::SMEM_RING_RED
            } else {
                T::SMEM_RED
            } as u32
    }

    /// This thread's slot for row `g + 8 half` of its row group in the exchange `[CS][BM]`.
    #[inline(always)]
    fn red_slot(&self, half: u32) -> u32 {
        self.red() + (self.ch * L::BM + self.rg * 16 + self.g + 8 * half) * 4
    }

    /// The 16-bit KV tile of stage `s` (fp8 caches: the converted tile is stage 0's).
    #[inline(always)]
    fn kv_tile(&self, s: u32) -> u32 {
        self.base + T::SMEM_KV as u32 + s * T::QK_TILE_BYTES as u32
    }

    #[inline(always)]
    fn raw_stage(&self, s: u32) -> u32 {
        self.base + T::SMEM_FP8_STAGE as u32 + s * T::FP8_STAGE_BYTES as u32
    }

    /// Where stage `s`'s copies land: the tile, or for fp8 caches the raw stage.
    #[inline(always)]
    fn stage_of(&self, s: u32) -> u32 {
        if K::KV_FP8 {
            self.raw_stage(s)
        } else {
            self.kv_tile(s)
        }
    }

    /// Ring slot of half-block `h` (counted from the chunk's first half-block).
    #[inline(always)]
    fn slot(&self, h: u32) -> u32 {
        self.base + T::SMEM_RING as u32 + (h % RING_SLOTS) * HALF_TILE_BYTES
    }

    /// Ring: half-blocks `h = 0 .. 2 (kb1 - kb0)` of the chunk, tokens `kb0 * 64 + 32 h ..`.
    #[inline(always)]
    fn halves(&self) -> u32 {
        2 * (self.w.kb1 - self.w.kb0)
    }

    #[inline(always)]
    fn half_n0(&self, h: u32) -> u32 {
        self.w.kb0 * BLOCK_N + h * HALF_N
    }

    /// This thread's page-table entry in half-block `h` (-1 past the chunk).
    #[inline(always)]
    fn half_entry(&self, h: u32) -> i32 {
        if h < self.halves() {
            kv_row_page_entry(self.p, self.b, self.half_n0(h) + self.kv_r, self.w.len)
        } else {
            -1
        }
    }

    /// This thread's page-table entry in block `kb` (two stages).
    #[inline(always)]
    fn block_entry(&self, kb: u32) -> i32 {
        kv_row_page_entry(self.p, self.b, kb * BLOCK_N + self.kv_r, self.w.len)
    }

    #[inline(always)]
    fn row_a(&self) -> u32 {
        self.row0 + self.rg * 16 + self.g
    }

    /// Loads the Q tile and issues the first KV copies: ring half-blocks `0 .. RING_AHEAD`
    /// (one commit group each, group 0 also holding Q, empty past the chunk), or the
    /// chunk's first block; then the page-table entries of the next issue.
    ///
    /// # Safety
    /// All threads of the CTA, once, first.
    #[inline(always)]
    unsafe fn prologue(&mut self) {
        let p = self.p;
        let (b, kb0, kb1) = (self.b, self.w.kb0, self.w.kb1);
        // SAFETY: the Q tile, ring slots and stages are regions of decode_tile; q and the
        // cache rows are validated.
        unsafe {
            load_q_tile::<K, L, K::Mma>(p, b, self.row0, self.q_smem(), qk_off);
            if Self::RING {
                unroll!(h in [0, 1, 2, 3] {
                    let h = h as u32;
                    if h < RING_AHEAD {
                        if h < self.halves() {
                            issue_kv_row::<K, HALF_TPR>(p, self.half_entry(h), self.half_n0(h), self.slot(h));
                        }
                        cp_async::cp_async_commit_group();
                    }
                });
            } else {
                if kb0 < kb1 {
                    let entry = self.block_entry(kb0);
                    issue_kv_row::<K, KV_TPR>(p, entry, kb0 * BLOCK_N, self.stage_of(0));
                }
                cp_async::cp_async_commit_group();
            }
        }
        self.next_entry = if Self::RING {
            [self.half_entry(RING_AHEAD), self.half_entry(RING_AHEAD + 1)]
        } else if kb0 + 1 < kb1 {
            [self.block_entry(kb0 + 1), -1]
        } else {
            [-1, -1]
        };
    }

    /// Waits until block `kb` has landed, issues the next copies, and (fp8 cache) converts
    /// the block into the 16-bit tile. Returns where its tokens `0..32` and `32..64` are.
    ///
    /// # Safety
    /// All threads of the CTA, once per block in order (CTA barriers inside).
    #[inline(always)]
    unsafe fn land(&mut self, kb: u32) -> (u32, u32) {
        let p = self.p;
        let kb1 = self.w.kb1;
        let hb = 2 * (kb - self.w.kb0);
        // SAFETY: forwarded from the caller; the slots and stages are regions of
        // decode_tile.
        unsafe {
            if Self::RING {
                // Wait for hb and hb + 1 (one newer half-block, hb + 2, may stay in
                // flight); once every thread is past the barrier, block kb - 1's slots, P
                // and the exchange are free (their last readers ran before it), so
                // half-blocks hb + RING_AHEAD and the next go there, leaving RING_AHEAD
                // half-blocks in flight, and no barrier is needed after the P.V.
                cp_async::cp_async_wait_group::<{ RING_AHEAD - 2 }>();
                sync::bar_sync();
                unroll!(i in [0, 1] {
                    let h = hb + RING_AHEAD + i as u32;
                    if h < self.halves() {
                        issue_kv_row::<K, HALF_TPR>(p, self.next_entry[i], self.half_n0(h), self.slot(h));
                    }
                    cp_async::cp_async_commit_group();
                });
                self.next_entry = [
                    self.half_entry(hb + RING_AHEAD + 2),
                    self.half_entry(hb + RING_AHEAD + 3),
                ];
                return (self.slot(hb), self.slot(hb + 1));
            }
            if kb + 1 < kb1 {
                let dst = self.stage_of(self.stage ^ 1);
                issue_kv_row::<K, KV_TPR>(p, self.next_entry[0], (kb + 1) * BLOCK_N, dst);
                if kb + 2 < kb1 {
                    self.next_entry[0] = self.block_entry(kb + 2);
                }
            }
            cp_async::cp_async_commit_group();
            cp_async::cp_async_wait_group::<1>();
            sync::bar_sync();
            let kv = if K::KV_FP8 {
                convert_fp8_stage::<K>(self.raw_stage(self.stage), self.kv_tile(0));
                sync::bar_sync();
                self.kv_tile(0)
            } else {
                self.kv_tile(self.stage)
            };
            (kv, kv + HALF_N * ROW_BYTES)
        }
    }

    /// One block: S = Q K^T, the online softmax across the column splits, P to shared
    /// memory, O += P V. `kv_lo` and `kv_hi` hold the block's tokens `0..32` and `32..64`.
    ///
    /// # Safety
    /// All threads of the CTA, once per block after [`Cta::land`] (CTA barriers inside).
    #[inline(always)]
    unsafe fn block_step(&mut self, kb: u32, kv_lo: u32, kv_hi: u32) {
        // SAFETY: forwarded from the caller.
        unsafe {
            let (s, m_loc) = self.scores(kb, kv_lo, kv_hi);
            let m_new = self.exchange_max(m_loc);
            // Every warp's S of the block is done (the exchange's barrier) and no P.V reads
            // the block before the barrier below.
            let unseen = super::unseen_rows(self.p, self.w.len, kb);
            if unseen.0 < unseen.1 {
                super::clean_unseen_rows::<K::Mma>(
                    unseen,
                    kv_lo,
                    kv_hi,
                    arch::thread_idx_x(),
                    arch::block_dim_x(),
                );
            }
            let (m_ref, alpha) = rescale_rows(&mut self.m_run, &mut self.l_run, m_new);
            self.softmax_to_p(&s, m_ref);
            self.rescale_o(alpha);
            sync::bar_sync();
            let p_smem = self.p_smem();
            pv_tile_gemm::<K::Mma, L>(
                &mut self.o,
                p_smem,
                kv_lo,
                kv_hi.wrapping_sub(kv_lo),
                self.rg,
                self.ch,
                self.lane,
            );
            // Two stages: the next issue (before the top barrier) overwrites this block's
            // stage, P and the exchange, so every thread must be past this P.V first. The
            // ring issues after its top barrier and needs none here.
            if !Self::RING {
                sync::bar_sync();
            }
        }
        self.stage ^= 1;
    }

    /// S of block `kb` masked and scaled to log2 units, and this thread's row maxima.
    ///
    /// # Safety
    /// The block has landed ([`Cta::land`]); converged warp.
    #[inline(always)]
    unsafe fn scores(&self, kb: u32, kv_lo: u32, kv_hi: u32) -> ([[f32; 4]; 4], [f32; 2]) {
        let ch = self.ch;
        // The warp's QK^T tokens: all 64 (row base 0 of kv_lo) with 4 tiles per warp, else
        // 8 tokens at ch * 8, in the half that holds them.
        let (kv_qk, tok_row) = if L::S_TILES >= 4 {
            (kv_lo, 0)
        } else if ch * 8 < HALF_N {
            (kv_lo, ch * 8)
        } else {
            (kv_hi, ch * 8 - HALF_N)
        };
        // SAFETY: forwarded from the caller.
        let mut s = unsafe {
            qk_tile_gemm::<K::Mma, L>(self.q_smem(), kv_qk, tok_row, self.rg, ch, self.lane)
        };
        let n_base = kb * BLOCK_N + ch * (BLOCK_N / L::CS) + 2 * self.c4;
        let mut m_loc = [f32::NEG_INFINITY; 2];
        unroll!(nt in [0, 1, 2, 3] {
            if nt < L::S_TILES {
                unroll!(e in [0, 1, 2, 3] {
                    let j = n_base + nt as u32 * 8 + (e % 2) as u32;
                    let x = if j < self.vis_r[e / 2] { s[nt][e] * self.scale_log2 } else { f32::NEG_INFINITY };
                    s[nt][e] = x;
                    m_loc[e / 2] = sync::fmax(m_loc[e / 2], x);
                });
            }
        });
        (s, m_loc)
    }

    /// The new running maxima of this thread's rows: the quad's, then the column splits'
    /// through the exchange.
    ///
    /// # Safety
    /// All threads of the CTA (a CTA barrier inside); converged warps.
    #[inline(always)]
    unsafe fn exchange_max(&self, m_loc: [f32; 2]) -> [f32; 2] {
        let red = self.red();
        let r = self.rg * 16 + self.g;
        // SAFETY: forwarded from the caller; the exchange holds [CS][BM] f32.
        unsafe {
            let m0 = quad_max(m_loc[0]);
            let m1 = quad_max(m_loc[1]);
            // The quad leaders store behind a branch on the lane (as cheap as predicated
            // stores here); tests/ptx_check.rs's SYNC_SITES fails the build's check if the
            // barrier after it is ever copied into its arms.
            if self.c4 == 0 {
                smem::st_shared_f32(self.red_slot(0), m0);
                smem::st_shared_f32(self.red_slot(1), m1);
            }
            sync::bar_sync();
            [
                sync::fmax(self.m_run[0], red_max::<L>(red, r)),
                sync::fmax(self.m_run[1], red_max::<L>(red, r + 8)),
            ]
        }
    }

    /// Probabilities `exp2(S - m_ref)`: to the P tile as 16-bit, added to the row sums.
    #[inline(always)]
    fn softmax_to_p(&mut self, s: &[[f32; 4]; 4], m_ref: [f32; 2]) {
        let (rg, ch, g, c4) = (self.rg, self.ch, self.g, self.c4);
        let p_smem = self.p_smem();
        unroll!(nt in [0, 1, 2, 3] {
            if nt < L::S_TILES {
                let p0 = sync::ex2(s[nt][0] - m_ref[0]);
                let p1 = sync::ex2(s[nt][1] - m_ref[0]);
                let p2 = sync::ex2(s[nt][2] - m_ref[1]);
                let p3 = sync::ex2(s[nt][3] - m_ref[1]);
                self.l_run[0] += p0 + p1;
                self.l_run[1] += p2 + p3;
                let col_chunk = ch * L::S_TILES as u32 + nt as u32;
                let r_a = rg * 16 + g;
                // SAFETY: rows < BM, chunk < 8: inside the P tile.
                unsafe {
                    smem::st_shared_u32(p_smem + p_off(r_a, col_chunk) + 4 * c4, K::Mma::pack2(p0, p1));
                    smem::st_shared_u32(p_smem + p_off(r_a + 8, col_chunk) + 4 * c4, K::Mma::pack2(p2, p3));
                }
            }
        });
    }

    /// The accumulators times each row's `alpha`.
    #[inline(always)]
    fn rescale_o(&mut self, alpha: [f32; 2]) {
        let o = &mut self.o;
        unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
            if i < L::O_TILES {
                o[i][0] *= alpha[0];
                o[i][1] *= alpha[0];
                o[i][2] *= alpha[1];
                o[i][3] *= alpha[1];
            }
        });
    }

    /// Drains the copies, sums the rows over the quad and the column splits, and stores
    /// this thread's rows.
    ///
    /// # Safety
    /// All threads of the CTA, once, last (CTA barriers inside); the host sized out, lse
    /// and the workspace (validated).
    #[inline(always)]
    unsafe fn epilogue(self) {
        // Drain the (possibly empty) last group before the CTA may exit.
        cp_async::cp_async_wait_group::<0>();
        let red = self.red();
        let r = self.rg * 16 + self.g;
        // SAFETY: forwarded from the caller; the exchange holds [CS][BM] f32.
        unsafe {
            let l0 = quad_sum(self.l_run[0]);
            let l1 = quad_sum(self.l_run[1]);
            sync::bar_sync();
            if self.c4 == 0 {
                smem::st_shared_f32(self.red_slot(0), l0);
                smem::st_shared_f32(self.red_slot(1), l1);
            }
            sync::bar_sync();
            let l_tot = [red_sum::<L>(red, r), red_sum::<L>(red, r + 8)];
            write_rows::<K, L>(
                self.p,
                &self.o,
                l_tot,
                self.m_run,
                self.b,
                self.row_a(),
                self.split,
                self.w.nsplit,
                self.ch,
                self.c4,
            );
        }
    }
}

/// The decode kernel body: the prologue (Q, the first KV copies), per block of the
/// split's chunk the landing of its KV and the block step, the epilogue (row sums, stores).
///
/// # Safety
/// Launched with the grid, block and shared memory documented above, on params that the
/// host validated (shapes, strides, alignment, workspace capacity).
#[inline(always)]
pub unsafe fn decode<K: DecodeKind, L: Layout>(p: DecodeParams) {
    // The 16-row tile with an fp8 cache converts in registers where the arch converts fp8
    // in hardware (super::f8); this body's shared-memory conversion pass elsewhere.
    #[cfg(mla_hw_fp8)]
    if K::KV_FP8 && L::RING {
        // SAFETY: forwarded from the caller (the 16-row layout, an fp8 cache).
        unsafe { super::f8::decode_fp8::<K, 1>(p) };
        return;
    }
    // SAFETY: every thread of the CTA, converged, first.
    let Some((tile, b, split, work)) = (unsafe { grid_cell_work(&p) }) else {
        return;
    };
    let (kb0, kb1) = (work.kb0, work.kb1);
    let mut cta = Cta::<K, L>::new(&p, work, tile, b, split);
    // SAFETY (whole pipeline): every smem address stays inside the regions of
    // decode_tile; every barrier is reached by all threads (loop bounds are CTA-uniform).
    unsafe {
        cta.prologue();
        let mut kb = kb0;
        while kb < kb1 {
            let (kv_lo, kv_hi) = cta.land(kb);
            cta.block_step(kb, kv_lo, kv_hi);
            kb += 1;
        }
        cta.epilogue();
    }
}
