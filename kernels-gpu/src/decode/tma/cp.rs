//! The TMA decode's `cp.async` form (bf16 caches the tensor map does not take: pages of
//! fewer than `TMA_MIN_PAGE` tokens, strided fused caches). Copies gathered row by row from
//! the page table take longer to land than a tensor map's boxes, so this form copies a block
//! ahead instead of pairing blocks:
//!
//! - Warpgroup 0 copies block `k + 1` into the other stage (eight threads a row, each
//!   warp-level copy reading whole 128-byte lines; rows past the end or with an entry outside
//!   `0..num_pages` land as zeros), then multiplies block `k`'s P, from shared memory, by
//!   V's dims 0..256.
//! - Warpgroup 1 computes S of block `k` (all 576 dims), the running max and P, hands P and
//!   the rescale factor over (P in the P slab of the block's stage: stage 0's own slab, stage
//!   1's slab 8, dead once S is done), multiplies P from its registers by V's dims 256..512,
//!   and frees the stage.
//! - The stage's slabs complete on its nine full mbarriers (128 `cp.async` arrivals each,
//!   `.noinc`); each stage has a free mbarrier (lane 0 of each of warpgroup 1's warps,
//!   after its P.V); named barriers [`BAR_P`] (one per stage) hand P over.
//! - Warpgroup 0 keeps no row sums: warpgroup 1's are the rows' (the epilogue adds the two,
//!   zero and all). Its running max is the one warpgroup 1 hands over with each block.

use super::math::{exp_rows, frags_of, m_ref_of, slab_order};
use super::{BLOCK_N, Cta, for_each_cell, uniform};
use crate::arch::{self, bulk, cp_async, smem, sync, wgmma};
use crate::decode::wg::{SLAB, aligned_base};
use crate::decode::{self, DecodeKind};
use crate::elem::Bf16;
use mla_abi::DecodeParams;
use mla_abi::decode_tile as T;

/// Per stage: warpgroup 1's P and rescale factor of the stage's block are in place
/// (warpgroup 1 arrives, warpgroup 0 waits). One per stage, so that warpgroup 1, a block
/// ahead, never arrives twice on one phase.
const BAR_P: [u32; 2] = [3, 4];

impl<'a, K: DecodeKind<Mma = Bf16>> Cta<'a, K> {
    /// Stage `st`'s free mbarrier.
    #[inline(always)]
    fn free_cp(&self, st: u32) -> u32 {
        self.base + T::TMA_CP_SMEM_FREE as u32 + 8 * st
    }

    /// The parity of the phase block `blk`'s stage completes for it (bit `st` of `phase`:
    /// the stage's next phase at the cell's start; a stage takes every other block).
    #[inline(always)]
    fn parity_cp(&self, phase: u32, blk: u32) -> u32 {
        let i = blk - self.kb0;
        ((phase >> (i % 2)) + i / 2) & 1
    }

    /// Warpgroup 0 copies block `blk` into stage `(blk - kb0) % 2`: thread `t` copies chunk
    /// `t % 8` of rows `t / 8 + 16 i` of every slab, slab by slab in the order S reads them,
    /// arriving on each slab's full barrier (`.noinc`) after its rows' copies; slabs 4-7
    /// once warpgroup 1 has freed the stage.
    ///
    /// # Safety
    /// Warpgroup 0, converged; `blk < kb1`; the stage's full barriers count 128 arrivals.
    #[inline(always)]
    unsafe fn copy_block(&self, phase: u32, blk: u32) {
        let p = self.p;
        let st = (blk - self.kb0) % 2;
        let t = arch::thread_idx_x() % 128;
        let (r0, c) = (t / 8, t % 8);
        let t0 = blk * BLOCK_N;
        let src = [0u32, 1, 2, 3].map(|i| {
            let r = r0 + 16 * i;
            let e = decode::kv_row_page_entry(p, self.b, t0 + r, self.len);
            decode::kv_row_source(p, e, t0 + r, 2)
        });
        let kv = self.kv_s(st);
        let bars = self.bars(st);
        // SAFETY: the stage's last readers freed it (the free barrier's previous phase;
        // a fresh barrier's counts as complete); rows r0 + 16 i < 64, chunk c < 8 of slabs
        // < 9; a row with n == 16 is 1152 contiguous bytes of the fused cache (chunk 8 s + c
        // of it), else nothing is read.
        unsafe {
            // S's order: slabs 0-3 and 8, then 4-7. Only warpgroup 1's P.V reads slabs 4-7
            // (and this warpgroup's own, finished, P.V the others): the first five go out
            // before the wait for the stage to be free.
            unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
                let s = slab_order(0, j as u32);
                if j == 5 {
                    let free = self.free_cp(st);
                    bulk::mbarrier_wait_parity_warp(free, self.parity_cp(phase, blk) ^ 1);
                }
                unroll!(i in [0, 1, 2, 3] {
                    let r = r0 + 16 * i as u32;
                    let dst = kv + s * SLAB + r * 128 + ((c ^ (r % 8)) << 4);
                    let a = src[i].main.add((128 * s + 16 * c) as usize);
                    cp_async::cp_async_cg_16(dst, a, src[i].n);
                });
                cp_async::cp_async_mbarrier_arrive_noinc(bars + 8 * s);
            });
        }
    }

    /// Warpgroup 0's block `blk`: copies the next block, then takes this block's P and
    /// factor from warpgroup 1 and multiplies P by its half of V.
    ///
    /// # Safety
    /// Warpgroup 0, once per block, with warpgroup 1 in [`Cta::step_s`].
    #[inline(always)]
    unsafe fn step_copy(&mut self, phase: u32, blk: u32) {
        let st = (blk - self.kb0) % 2;
        // SAFETY: forwarded from the caller; BAR_P orders warpgroup 1's P and factor stores
        // before these reads, and its S's full-barrier waits before this P.V.
        unsafe {
            if blk + 1 < self.kb1 {
                self.copy_block(phase, blk + 1);
            }
            if st == 0 {
                sync::bar_sync_named::<{ BAR_P[0] }, 256>();
            } else {
                sync::bar_sync_named::<{ BAR_P[1] }, 256>();
            }
            // The block's rows came through the generic proxy; warpgroup 1 saw them land.
            wgmma::fence_proxy_async_shared();
            self.m_run = self.ld_rows(2 * st);
            let f = self.ld_rows(2 * st + 1);
            self.rescale(f);
            self.pv_shared(st);
            wgmma::wgmma_wait_group::<0>();
        }
    }

    /// Warpgroup 1's block `blk`: S, the running max and P; P and the factor to warpgroup 0;
    /// its own P.V; the stage freed.
    ///
    /// # Safety
    /// Warpgroup 1, once per block, with warpgroup 0 in [`Cta::step_copy`].
    #[inline(always)]
    unsafe fn step_s(&mut self, s: &mut [f32; 32], phase: u32, blk: u32) {
        let st = (blk - self.kb0) % 2;
        // SAFETY: forwarded from the caller; S reads each slab once its full barrier
        // completed; the P slab is free (warpgroup 0's P.V of the stage's previous block
        // finished before it copied this block).
        unsafe {
            self.qk(s, st, self.parity_cp(phase, blk), blk, &|| {}, &|| {});
            wgmma::wgmma_wait_group::<0>();
            // S has read the block's keys; both P.Vs read its values after BAR_P, which
            // this warpgroup passes below.
            let (first, valid) = decode::unseen_rows(self.p, self.len, blk);
            if first < valid {
                let t = arch::thread_idx_x() % 128;
                crate::decode::wg::clean_slab_rows(self.kv_s(st), (first, valid, valid), t, 128);
                wgmma::fence_proxy_async_shared();
            }
            let m_b = self.mask_max(s, blk);
            let m_run = self.m_run;
            let m = [sync::fmax(m_run[0], m_b[0]), sync::fmax(m_run[1], m_b[1])];
            let m_ref = m_ref_of(m);
            let f = [
                sync::ex2(m_run[0] - m_ref[0]),
                sync::ex2(m_run[1] - m_ref[1]),
            ];
            self.st_rows(2 * st, m);
            self.st_rows(2 * st + 1, f);
            let l_b = exp_rows(s, self.scale_r, m_ref);
            self.rescale(f);
            self.l_run = [self.l_run[0] * f[0] + l_b[0], self.l_run[1] * f[1] + l_b[1]];
            self.m_run = m;
            let a = frags_of::<K>(s);
            self.store_p(&a, self.p_s(st));
            if st == 0 {
                sync::bar_arrive_named::<{ BAR_P[0] }, 256>();
            } else {
                sync::bar_arrive_named::<{ BAR_P[1] }, 256>();
            }
            self.pv_regs(&a, st);
            wgmma::wgmma_wait_group::<0>();
            let lane0 = arch::opaque(arch::thread_idx_x()).is_multiple_of(32) as u32;
            bulk::mbarrier_arrive_if(self.free_cp(st), lane0);
        }
    }
}

/// The `cp.async` form's kernel body (see the module docs): the persistent cell walk of
/// [`super::decode_tma`], each cell a prologue (Q; warpgroup 0 copies the first block),
/// one step per block in each warpgroup, and the shared epilogue.
///
/// # Safety
/// As [`super::decode_tma`], for a fused bf16 cache of any page size (`K::KV_CP`); the map is
/// not read.
#[inline(always)]
pub(super) unsafe fn decode_cp<K: DecodeKind<Mma = Bf16>>(p: DecodeParams) {
    // Bit `st`: the parity of stage `st`'s next full-barrier phase.
    let mut phase = 0u32;
    let tid = arch::thread_idx_x();
    // SAFETY: thread 0 initialises the mbarriers before the first cell's CTA barriers; every
    // thread runs every phase (cell bounds from shared memory after a CTA barrier, block
    // bounds CTA-uniform), so the warpgroups meet at the named barriers block by block.
    unsafe {
        if tid == 0 {
            let base = aligned_base();
            super::init_stage_bars(base, 128);
            for k in 0..2 {
                bulk::mbarrier_init(base + T::TMA_CP_SMEM_FREE as u32 + 8 * k, 4);
            }
            bulk::fence_mbarrier_init();
        }
        for_each_cell!(
            &p,
            T::THREADS as u32,
            arch::opaque(aligned_base()) + T::TMA_SMEM_CELLS as u32,
            sync::bar_sync,
            |tile, b, split, work| {
                let mut cta = Cta::<K>::new(&p, core::ptr::null(), work, tile, b, split);
                let mut s = [0.0f32; 32];
                decode::load_q_tile::<K, decode::M64, Bf16>(
                    &p,
                    b,
                    cta.row0,
                    cta.base,
                    crate::decode::wg::slab_off,
                );
                cp_async::cp_async_commit_group();
                // A split may hold no block (later chunks of a short sequence can be empty):
                // nothing is copied then. A copy there would complete a phase of stage 0's
                // full barriers that no S waits for, and every later S of the CTA would read
                // its stage one copy early.
                if cta.wg == 0 && cta.kb0 < cta.kb1 {
                    cta.copy_block(phase, cta.kb0);
                }
                // Q's group only: the block's copies are in no group.
                cp_async::cp_async_wait_group::<0>();
                wgmma::fence_proxy_async_shared();
                sync::bar_sync();
                let mut blk = cta.kb0;
                while blk < cta.kb1 {
                    if cta.wg == 0 {
                        cta.step_copy(phase, blk);
                    } else {
                        cta.step_s(&mut s, phase, blk);
                    }
                    blk += 1;
                }
                let blocks = cta.kb1 - cta.kb0;
                phase ^= (blocks.div_ceil(2) & 1) | (((blocks / 2) & 1) << 1);
                cta.epilogue();
            }
        );
    }
}
