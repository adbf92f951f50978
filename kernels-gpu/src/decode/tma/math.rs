//! The TMA decode's math: S of a block (the `wgmma` sequence over the stage's slabs), the
//! masking and row maxima, P's fragments (exponentials, scaling, the store to a P slab),
//! and O += P.V from shared memory or registers.

use super::e4m3::Q_LO;
use super::{BLOCK_N, Cta};
use crate::arch::{self, bulk, smem, sync, wgmma};
use crate::decode::wg::SLAB;
use crate::decode::{self, DecodeKind};
use crate::elem::{Bf16, Half16};

/// The slab S of a block reads `j`-th (`j < 9`) in warpgroup `wg` (and the order a warpgroup
/// that copies a block writes them in). Half 0 is slabs 0-3 and 8, half 1 slabs 4-7:
/// warpgroup 0 takes 0-3, 8, then 4-7; warpgroup 1 4-7, then 0-3, 8.
#[inline(always)]
pub(super) fn slab_order(wg: u32, j: u32) -> u32 {
    match (wg, j) {
        (0, 0..4) => j,
        (0, 4) => 8,
        (0, _) => j - 1,
        (_, 0..4) => j + 4,
        (_, 8) => 8,
        (_, _) => j - 4,
    }
}

impl<'a, K: DecodeKind<Mma = Bf16>> Cta<'a, K> {
    /// S of block `blk` in stage `st` (mbarrier phase `parity`): this warpgroup's first
    /// half (warpgroup 0: slabs 0-3 and 8, whose copy goes out first) then the other, each
    /// slab after its own mbarrier (bf16 Q with an fp8 cache: each k-step twice, Q's `hi`
    /// and `lo` parts, [`Cta::load_q_split`]). `mid` runs
    /// once this warpgroup's first half is issued and committed (its own group), before
    /// the second; `pre_vt` on the e4m3 path's `cp.async` forms once all of S is issued,
    /// before the block's V^T transpose (the wait for the stage's V^T to be free; the
    /// tensor-map forms' transposer writes V^T instead).
    ///
    /// # Safety
    /// Converged warpgroup; the block's copies are issued on the stage's mbarriers.
    #[inline(always)]
    pub(super) unsafe fn qk(
        &self,
        s: &mut [f32; 32],
        st: u32,
        parity: u32,
        blk: u32,
        mid: &dyn Fn(),
        pre_vt: &dyn Fn(),
    ) {
        let kv = arch::opaque(self.kv_s(st));
        let q_s = arch::opaque(self.base);
        // The block-ahead form's S (warpgroup 1) takes warpgroup 0's order: its copies
        // write slabs 0-3 and 8 before waiting for the stage to be free.
        let wg = if Self::CP_AHEAD { 0 } else { self.wg };
        // Straight-line code (the polls leave their loops uniformly): ptxas serializes
        // wgmmas around branches and loop joins it cannot prove uniform. Each poll costs an
        // injected `wgmma.fence` (C7519), measured free.
        let order = |j: u32| slab_order(wg, j);
        // SAFETY: forwarded from the caller; each slab is read only once its mbarrier says
        // it landed; the descriptors address Q and the stage.
        unsafe {
            wgmma::wgmma_fence();
            unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
                if j == 5 {
                    wgmma::wgmma_commit_group();
                    mid();
                }
                let slab = order(j as u32);
                bulk::mbarrier_wait_parity_warp(self.bars(st) + 8 * slab, parity);
                if Self::CP {
                    // The slab's rows came through the generic proxy (`cp.async`).
                    wgmma::fence_proxy_async_shared();
                }
                if Self::E4 {
                    // Two k32 steps of 32 bytes (2 in the address field) per 4 KB tile.
                    let at = slab * (SLAB / 2);
                    let da = wgmma::Desc::new(q_s, 16, 512, wgmma::Swizzle::B64);
                    let dl = wgmma::Desc::new(q_s + Q_LO, 16, 512, wgmma::Swizzle::B64);
                    let db = wgmma::Desc::new(kv, 16, 512, wgmma::Swizzle::B64);
                    unroll!(kk in [0, 1] {
                        let k = 2 * kk as u32;
                        wgmma::wgmma_m64n64k32_e4m3(s, da.at_k(at, k), db.at_k(at, k), j > 0 || kk > 0);
                        if Self::SPLIT_Q {
                            wgmma::wgmma_m64n64k32_e4m3(s, dl.at_k(at, k), db.at_k(at, k), true);
                        }
                    });
                } else {
                    let da = wgmma::Desc::new(q_s, 16, 1024, wgmma::Swizzle::B128);
                    let db = wgmma::Desc::new(kv, 16, 1024, wgmma::Swizzle::B128);
                    // k-step kk of the slab: 32 bytes on, 2 in the descriptors' address field.
                    unroll!(kk in [0, 1, 2, 3] {
                        let k = 2 * kk as u32;
                        let at = slab * SLAB;
                        wgmma::wgmma_m64n64k16_bf16(s, da.at_k(at, k), db.at_k(at, k), j > 0 || kk > 0);
                    });
                }
            });
            wgmma::wgmma_commit_group();
            // The e4m3 path's `cp.async` forms: the block's V^T, while S runs.
            if Self::E4 && !Self::XPOSE {
                pre_vt();
                self.transpose_vt(st, blk);
            }
        }
    }

    /// V's k-step t (16 tokens) of this warpgroup's 256 output dims, stage `st`.
    #[inline(always)]
    pub(super) fn v_desc(&self, st: u32, t: u32) -> u64 {
        wgmma::Desc::new(
            arch::opaque(self.kv_s(st) + 4 * self.wg * SLAB),
            SLAB,
            1024,
            wgmma::Swizzle::B128,
        )
        .at(t * 16 * 128)
    }

    /// Masks S of block `blk` in place (keys past a row's visible end become `-inf`; a block
    /// every key of which both rows see is left as it is) and returns the row maxima of
    /// the scaled S (this thread's two rows). S stays unscaled: [`exp_rows`] applies the
    /// scale in its `fma`. The scale is positive (validated softmax scale, power-of-two Q
    /// scale-down), so the scaled row's max is the scaled max, exactly.
    #[inline(always)]
    pub(super) fn mask_max(&self, s: &mut [f32; 32], blk: u32) -> [f32; 2] {
        let mut m = [f32::NEG_INFINITY; 2];
        let end = blk * BLOCK_N + BLOCK_N;
        if end <= self.vis_r[0] && end <= self.vis_r[1] {
            unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
                unroll!(e in [0, 1, 2, 3] {
                    m[e / 2] = sync::fmax(m[e / 2], s[4 * j + e]);
                });
            });
        } else {
            unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
                unroll!(e in [0, 1, 2, 3] {
                    let tok = blk * BLOCK_N + 8 * j as u32 + 2 * self.c + (e % 2) as u32;
                    let x = if tok < self.vis_r[e / 2] { s[4 * j + e] } else { f32::NEG_INFINITY };
                    s[4 * j + e] = x;
                    m[e / 2] = sync::fmax(m[e / 2], x);
                });
            });
        }
        // SAFETY: converged warp.
        let m = unsafe { [decode::quad_max(m[0]), decode::quad_max(m[1])] };
        [m[0] * self.scale_r[0], m[1] * self.scale_r[1]]
    }

    /// Stores P's fragments to the P slab at `ps` (row r, token chunk ch, 128-byte
    /// swizzle).
    #[inline(always)]
    pub(super) fn store_p(&self, a: &[[u32; 4]; 4], ps: u32) {
        if Self::E4 {
            self.store_p_e4m3(a, ps);
            return;
        }
        let r_loc = self.r_loc;
        // Rows r_loc and r_loc + 8 share r % 8 = g: chunk ch of either is its row's
        // chunk-0 address with (ch << 4) XORed in.
        let row = arch::opaque(ps + r_loc * 128 + (self.g << 4) + 4 * self.c);
        let at = |r: u32, ch: u32| (row + (r - r_loc) * 128) ^ (ch << 4);
        unroll!(kk in [0, 1, 2, 3] {
            let ch = 2 * kk as u32;
            // SAFETY: rows < 64, chunks < 8: inside the slab.
            unsafe {
                smem::st_shared_u32(at(r_loc, ch), a[kk][0]);
                smem::st_shared_u32(at(r_loc + 8, ch), a[kk][1]);
                smem::st_shared_u32(at(r_loc, ch + 1), a[kk][2]);
                smem::st_shared_u32(at(r_loc + 8, ch + 1), a[kk][3]);
            }
        });
        wgmma::fence_proxy_async_shared();
    }

    /// O += P.V for the block in stage `st`, P from its slab (the other warpgroup's
    /// block), as one committed group.
    ///
    /// # Safety
    /// Converged warpgroup; the P slab and the stage's V half are in place (named barrier
    /// and mbarriers before the call).
    #[inline(always)]
    pub(super) unsafe fn pv_shared(&mut self, st: u32) {
        // SAFETY: forwarded from the caller.
        unsafe {
            wgmma::wgmma_fence();
            if Self::E4 {
                unroll!(kk in [0, 1] {
                    let da = wgmma::Desc::new(arch::opaque(self.p_s(st)), 16, 512, wgmma::Swizzle::B64).at(32 * kk as u32);
                    let db = self.vt_desc(st, kk as u32);
                    wgmma::wgmma_m64n256k32_ss_e4m3(&mut self.o, da, db, true);
                });
                wgmma::wgmma_commit_group();
                return;
            }
            unroll!(kk in [0, 1, 2, 3] {
                let da = wgmma::Desc::new(arch::opaque(self.p_s(st)), 16, 1024, wgmma::Swizzle::B128).at(32 * kk as u32);
                let db = self.v_desc(st, kk as u32);
                wgmma::wgmma_m64n256k16_ss_bf16::<1>(&mut self.o, da, db, true);
            });
            wgmma::wgmma_commit_group();
        }
    }

    /// O += P.V for the block in stage `st`, P from this warpgroup's registers (`a`), as
    /// one committed group.
    ///
    /// # Safety
    /// Converged warpgroup; the stage's V half is in place.
    #[inline(always)]
    pub(super) unsafe fn pv_regs(&mut self, a: &[[u32; 4]; 4], st: u32) {
        // SAFETY: forwarded from the caller.
        unsafe {
            wgmma::wgmma_fence();
            if Self::E4 {
                unroll!(kk in [0, 1] {
                    let db = self.vt_desc(st, kk as u32);
                    wgmma::wgmma_m64n256k32_rs_e4m3(&mut self.o, a[kk], db, true);
                });
                wgmma::wgmma_commit_group();
                return;
            }
            unroll!(kk in [0, 1, 2, 3] {
                let db = self.v_desc(st, kk as u32);
                wgmma::wgmma_m64n256k16_rs_bf16::<1>(&mut self.o, a[kk], db, true);
            });
            wgmma::wgmma_commit_group();
        }
    }

    /// The accumulators times a per-row factor (skipped when both are one).
    #[inline(always)]
    pub(super) fn rescale(&mut self, f: [f32; 2]) {
        if f[0] != 1.0 || f[1] != 1.0 {
            let o = &mut self.o;
            unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
                o[j][0] *= f[0];
                o[j][1] *= f[0];
                o[j][2] *= f[1];
                o[j][3] *= f[1];
            });
        }
    }
}

/// A row's exponent reference: its max, or 0 for a row with nothing visible yet.
#[inline(always)]
pub(super) fn m_ref_of(m: [f32; 2]) -> [f32; 2] {
    m.map(|x| if x == f32::NEG_INFINITY { 0.0 } else { x })
}

/// exp2(S * scale - m_ref) in place (S unscaled, from [`Cta::mask_max`]; one `fma` per
/// value); returns this thread's part of the row sums.
#[inline(always)]
pub(super) fn exp_rows(s: &mut [f32; 32], scale: [f32; 2], m_ref: [f32; 2]) -> [f32; 2] {
    let mut l = [0.0f32; 2];
    unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
        unroll!(e in [0, 1, 2, 3] {
            let pe = sync::ex2(sync::fma(s[4 * j + e], scale[e / 2], -m_ref[e / 2]));
            l[e / 2] += pe;
            s[4 * j + e] = pe;
        });
    });
    l
}

/// P as the A fragments of the block's four k-steps.
#[inline(always)]
pub(super) fn frags_of<K: DecodeKind>(s: &[f32; 32]) -> [[u32; 4]; 4] {
    if K::KV_FP8 {
        return super::e4m3::frags_e4m3(s);
    }
    let mut a = [[0u32; 4]; 4];
    unroll!(kk in [0, 1, 2, 3] {
        let t0 = 8 * kk;
        let t1 = 8 * kk + 4;
        a[kk] = [
            Bf16::pack2(s[t0], s[t0 + 1]),
            Bf16::pack2(s[t0 + 2], s[t0 + 3]),
            Bf16::pack2(s[t1], s[t1 + 1]),
            Bf16::pack2(s[t1 + 2], s[t1 + 3]),
        ];
    });
    a
}

/// Fragments times a per-row factor (rows g: words 0 and 2, g + 8: words 1 and 3).
#[inline(always)]
pub(super) fn scaled<K: DecodeKind>(a: &[[u32; 4]; 4], f: [f32; 2]) -> [[u32; 4]; 4] {
    if K::KV_FP8 {
        return super::e4m3::scaled_e4m3(a, f);
    }
    let mut out = [[0u32; 4]; 4];
    unroll!(kk in [0, 1, 2, 3] {
        unroll!(w in [0, 1, 2, 3] {
            let x = a[kk][w];
            let (lo, hi) = (Bf16::to_f32(x as u16), Bf16::to_f32((x >> 16) as u16));
            out[kk][w] = Bf16::pack2(lo * f[w % 2], hi * f[w % 2]);
        });
    });
    out
}
