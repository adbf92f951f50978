//! The TMA-fed `wgmma` decode (sm_90a only; `--cfg mla_wgmma`): a bf16 cache under bf16
//! Q, or an fp8 e4m3 cache under bf16 or fp8 Q (both products on the e4m3 tensor cores,
//! [`e4m3`]), with pages of at least `decode_tile::TMA_MIN_PAGE` tokens. Same block, params
//! and outputs as [`crate::decode::wg`], plus the cache's tensor map as a second kernel
//! parameter (by value, so every launch, eager or captured, carries the map of its own
//! cache), so the host's split schedule, workspace and combine are shared. Persistent: at
//! most one CTA per SM, each walking its cells of the virtual grid `(row tiles, batch,
//! persist_splits)` that have work (`decode_tma`). A cache the map does not take (pages
//! under `TMA_MIN_PAGE` tokens, strided) runs the same kernel's `cp.async` form: bf16 [`cp`],
//! which copies rows from the page table a block ahead instead of pairing blocks; fp8 the
//! e4m3 pair loop with each warpgroup copying its own block ([`Cta::copy_stage`]).
//!
//! - A split's blocks go in pairs: block A (stage 0) belongs to warpgroup 0, block B
//!   (stage 1) to warpgroup 1. Each computes S for its own block (64 x 64, 36 k-steps)
//!   and owns half of O: warpgroup 0 dims 0..256,
//!   warpgroup 1 dims 256..512. So each multiplies its own P (from registers) and the
//!   other's P (from shared memory) by its half of V.
//! - The running max passes from warpgroup 0 (block A) to warpgroup 1 (block B) and back
//!   through shared memory each pair, so the warpgroups run half a step apart: one does
//!   its softmax while the other's `wgmma`s run. Warpgroup 0 gives the P it shares the
//!   pair's final scale, and rescales its O by it before multiplying B's P.
//! - KV: `cp.async.bulk.tensor` (one box per slab and page, straight into the 128-byte
//!   swizzled slab layout, L2 evict-first) on one mbarrier per stage and slab, each
//!   slab's S waiting only for its own.
//!   A stage is reloaded in two halves: slabs 0-3 and 8 (the only ones warpgroup 0's
//!   P.V reads, and the slab that holds B's P once S of B is done), and slabs 4-7. Each
//!   half is reloaded for the next pair by the warpgroup whose P.V read it last, as
//!   soon as that P.V is done (warpgroup 0 reloads slabs 0-3 and 8, warpgroup 1 slabs
//!   4-7). Each warpgroup starts its S on the half it reloads itself, then takes the
//!   other. The reloads go out as early as the order allows (bf16): warpgroup 1 runs its
//!   own P.V before waiting for A's P and reloads stage 1's slabs 4-7 the moment it is
//!   done (its next S waits on that copy first), and warpgroup 0 reloads stage 1's half
//!   before its next S, not from inside it. Boxes past the sequence end, and pages
//!   outside `0..num_pages`, read as zeros (TMA's out-of-bounds fill); V rows of a page
//!   past the end are zeroed in shared memory.
//! - The e4m3 path (an fp8 cache, [`e4m3`]) reads a stage's raw slabs only in its owner's
//!   S and the block's V^T transpose, so the owner reloads its whole stage for the next pair
//!   as soon as its P.V of the current block is issued (warpgroup 0 stage 0, warpgroup 1
//!   stage 1); the V^T the next transpose overwrites is guarded by [`BAR_VT0`] /
//!   [`BAR_VT1`] instead. In the tensor-map forms a third warpgroup writes every V^T
//!   ([`Cta::XPOSE`], [`xpose_cell`]); in the `cp.async` forms each owner writes its own
//!   while its S runs.
//! - Named barriers (one warpgroup arrives, the other waits; 0 is the CTA barrier):
//!   [`BAR_SCALE0`], [`BAR_SCALE1`], [`BAR_P0`], [`BAR_P1`]; each warpgroup passes its
//!   arrivals in an order that keeps every shared buffer's reader ahead of its next
//!   writer (see `Cta::step_a` and `Cta::step_b`).
//!
//! - A sequence of one split writes its output tile through shared memory in whole
//!   16-byte chunks (`Cta::store_out`); a split cell of the bf16 forms its 16-bit partial
//!   (`mla_abi::partial16`) the same way (`Cta::store_partial16`), of fp8 Q its 16-bit
//!   partial straight from the fragments (`Cta::write_partial16`), of the fp8 cache under
//!   bf16 Q its f32 partial straight from the fragments (`decode::write_rows`).
//!
//! Here: the CTA's state, its phases (prologue, each warpgroup's pair step, epilogue) and
//! the kernel body; the copy issue in [`issue`], S, P and P.V in [`math`].

use crate::arch::{self, bulk, cp_async, ldmatrix, smem, sync, wgmma};
use crate::decode::wg::{SLAB, SLAB_TILE, aligned_base, slab_off};
use crate::decode::{self, DecodeKind, M64, trace};
use crate::elem::{Bf16, Fp16, Half16};
use core::marker::PhantomData;
use mla_abi::DecodeParams;
use mla_abi::decode_tile as T;

const BLOCK_N: u32 = T::BLOCK_N as u32;
// The one-split output staging (64 rows of 1024 bytes, then a u64 offset per row) fits the
// Q tile.
const _: () = assert!(BLOCK_N * (1024 + 8) <= SLAB_TILE);
/// Warpgroup 0's max and scale of this pair are in the exchange.
const BAR_SCALE0: u32 = 1;
/// Warpgroup 1's (the pair's final max and the scale from warpgroup 0's).
const BAR_SCALE1: u32 = 2;
/// Warpgroup 0's P (with the final scale) is in its P slab.
const BAR_P0: u32 = 3;
/// Warpgroup 1's P is in stage 1's slab 8.
const BAR_P1: u32 = 4;
/// Per warpgroup: the V rows it zeroed are written before its own P.V.
const BAR_WG: [u32; 2] = [5, 6];
/// The e4m3 path: warpgroup 1's P.V of block A is done, so warpgroup 0 may write the next
/// A's V^T (stage 0).
const BAR_VT0: u32 = 7;
/// The e4m3 path: warpgroup 0's P.V of block B is done (stage 1's V^T is free).
const BAR_VT1: u32 = 8;
/// The transposer's kernels ([`Cta::XPOSE`]): the two consumer warpgroups' CTA barrier
/// (the transposer takes no part in the cells' prologue, epilogue and output store).
const BAR_CONS: u32 = 9;
/// The transposer's kernels: stage `st`'s V^T is written, for consumer warpgroup `c`
/// (barrier `BAR_VT_READY + 2 st + c`: the transposer arrives, the consumer waits before
/// its P.V). [`BAR_VT0`] and [`BAR_VT1`] (`BAR_VT0 + st`) then say that both consumers'
/// P.V of the stage is done (both arrive, the transposer waits before it writes the stage
/// again).
const BAR_VT_READY: u32 = 10;
/// The transposer warpgroup's own barrier (a V^T cleaned after the whole transpose).
const BAR_XPOSE: u32 = 14;
/// Threads of the transposer's kernels: two consumer warpgroups and the transposer.
const XPOSE_THREADS: u32 = 384;
// Their cell walk's words: the marks (a word a warp), then each warp's walk state (three),
// inside the work list's region at `TMA_E4_WORDS`.
const _: () = assert!(4 * XPOSE_THREADS as usize / 32 <= T::walk_words(XPOSE_THREADS as usize));
/// Registers a thread of the transposer's kernels (`setmaxnreg`): the consumers' and the
/// transposer's sum to the launch's 384 x 168 (`setmaxnreg.inc` waits for registers the
/// CTA does not have otherwise).
const REGS_CONSUMER: u32 = 232;
const REGS_XPOSE: u32 = 40;
const _: () = assert!(256 * REGS_CONSUMER + 128 * REGS_XPOSE <= XPOSE_THREADS * 168);

mod cp;
pub(crate) mod e4m3;
mod issue;
mod math;

/// Lane 0's `x` in every lane: a value ptxas knows is warp-uniform (a `wgmma` behind a
/// branch on a value it cannot prove uniform is serialized).
///
/// # Safety
/// All 32 lanes of the warp, converged.
#[inline(always)]
pub(crate) unsafe fn uniform(x: u32) -> u32 {
    // SAFETY: forwarded from the caller.
    unsafe { sync::shfl_idx_f32(f32::from_bits(x), 0) }.to_bits()
}

pub(crate) use issue::block_pages;
use math::{exp_rows, frags_of, m_ref_of, scaled};

/// One CTA of [`decode_tma`]: its work (broadcast from lane 0, so that ptxas sees
/// warp-uniform values: a `wgmma` behind a branch it cannot prove uniform is serialized),
/// where its rows and shared regions are, and the registers that live through the pair
/// loop (accumulators, row statistics).
struct Cta<'a, K: DecodeKind<Mma = Bf16>> {
    p: &'a DecodeParams,
    tmap: *const u8,
    b: u32,
    split: u32,
    nsplit: u32,
    len: u32,
    kb0: u32,
    kb1: u32,
    /// The tile's first query row.
    row0: u32,
    /// This thread's warpgroup, quad row `g` and column `c`, and first row in the tile
    /// (`r_loc`: row g of its warp's 16; the other is `r_loc + 8`).
    wg: u32,
    g: u32,
    c: u32,
    r_loc: u32,
    base: u32,
    /// This thread issues its warpgroup's halves (warpgroup 0: slabs 0-3 and 8, warpgroup
    /// 1: slabs 4-7, of both stages): with [`Cta::WARP_ISSUE`] every thread of the
    /// warpgroup's first warp (warp-uniform), else the warpgroup's first thread.
    issuer: bool,
    /// Causal visibility of this thread's two rows.
    vis_r: [u32; 2],
    /// The logit scale (log2 units) of this thread's two rows: the softmax scale, times
    /// the row's Q scale-down with an fp8 cache and bf16 Q ([`Cta::load_q_split`]).
    scale_r: [f32; 2],
    o: [[f32; 4]; 32],
    m_run: [f32; 2],
    l_run: [f32; 2],
    _kind: PhantomData<K>,
}

impl<'a, K: DecodeKind<Mma = Bf16>> Cta<'a, K> {
    #[inline(always)]
    fn new(
        p: &'a DecodeParams,
        tmap: *const u8,
        w: decode::CtaWork,
        tile: u32,
        b: u32,
        split: u32,
    ) -> Self {
        // SAFETY (every `uniform`): converged warps.
        let (len, kb0, kb1) = unsafe { (uniform(w.len), uniform(w.kb0), uniform(w.kb1)) };
        // Opaque: the lane's rows and addresses are computed per cell, not hoisted out of
        // the persistent loop into registers that live through every cell.
        let tid = arch::opaque(arch::thread_idx_x());
        let warp = tid / 32;
        let lane = tid % 32;
        let g = lane / 4;
        let row0 = tile * 64;
        let r_loc = 16 * (warp % 4) + g;
        let row_a = row0 + r_loc;
        Self {
            p,
            tmap,
            b,
            split,
            nsplit: w.nsplit,
            len,
            kb0,
            kb1,
            row0,
            wg: unsafe { uniform(warp / 4) },
            g,
            c: lane % 4,
            r_loc,
            // Opaque: addresses derive from it per cell, as in a CTA of one cell, rather than
            // being hoisted out of the persistent loop to live through every cell.
            base: arch::opaque(aligned_base()),
            issuer: if Self::WARP_ISSUE {
                // SAFETY: converged warps.
                unsafe { uniform(warp % 4) == 0 }
            } else {
                tid.is_multiple_of(128)
            },
            vis_r: [
                decode::visible(p, len, w.glen, row_a),
                decode::visible(p, len, w.glen, row_a + 8),
            ],
            scale_r: [p.softmax_scale * core::f32::consts::LOG2_E; 2],
            o: [[0.0; 4]; 32],
            m_run: [f32::NEG_INFINITY; 2],
            l_run: [0.0; 2],
            _kind: PhantomData,
        }
    }

    /// The copies are issued by a whole warp (bf16 caches): see [`Cta::issue_half`]. The
    /// e4m3 kernels keep one issuing thread: at 255 registers, the warp's issue made ptxas
    /// spill their cell walk's state.
    const WARP_ISSUE: bool = !K::KV_FP8;
    /// An fp8 cache (fp8 or bf16 Q): the e4m3 tensor-core path ([`e4m3`]).
    const E4: bool = K::KV_FP8;
    /// bf16 Q with an fp8 cache: Q split into two e4m3 parts ([`Cta::load_q_split`]).
    const SPLIT_Q: bool = K::KV_FP8 && !K::Q_FP8;
    /// The copies are made by `cp.async` from the page table (`K::KV_CP`), and S reads each
    /// slab after a proxy fence: bf16 in the block-ahead form ([`cp`]), the e4m3 path in its
    /// pair loop, each warpgroup copying its own stage ([`Cta::copy_stage`]).
    const CP: bool = K::KV_CP;
    /// The block-ahead form ([`cp`]: a bf16 cache, `K::KV_CP`).
    const CP_AHEAD: bool = K::KV_CP && !K::KV_FP8;
    /// The e4m3 path's tensor-map forms: a third warpgroup (warps 8-11, [`xpose_cell`])
    /// writes every block's V^T, so the consumers' S goes straight on to the softmax; the
    /// consumers wait for a stage's V^T before their P.V of it ([`BAR_VT_READY`]) and
    /// release it after ([`BAR_VT0`], [`BAR_VT1`]).
    const XPOSE: bool = K::KV_FP8 && !K::KV_CP;

    /// The cell's CTA barrier: every thread, or the two consumer warpgroups where a
    /// transposer runs beside them ([`Cta::XPOSE`]).
    ///
    /// # Safety
    /// Every thread that takes part, converged warps.
    #[inline(always)]
    unsafe fn cta_sync() {
        // SAFETY: forwarded from the caller.
        unsafe {
            if Self::XPOSE {
                sync::bar_sync_named::<BAR_CONS, 256>();
            } else {
                sync::bar_sync();
            }
        }
    }

    /// Waits until the transposer has written a stage's V^T for this warpgroup (barrier
    /// `ID`: [`BAR_VT_READY`] `+ 2 st + wg`; a constant, as a barrier number in a register
    /// made ptxas spill inside the pair loop).
    ///
    /// # Safety
    /// The whole warpgroup, once per block of the stage, before its P.V of it.
    #[inline(always)]
    unsafe fn vt_ready<const ID: u32>() {
        if Self::XPOSE {
            // SAFETY: forwarded from the caller.
            unsafe { sync::bar_sync_named::<ID, 256>() };
        }
    }

    /// This warpgroup's P.V of a stage's V^T is done (barrier `ID`: [`BAR_VT0`] or
    /// [`BAR_VT1`]), if `cond`: the transposer may write it again.
    ///
    /// # Safety
    /// The whole warpgroup, once per block of the stage, after the P.Vs that read it
    /// completed; `cond` warp-uniform.
    #[inline(always)]
    unsafe fn vt_release<const ID: u32>(cond: bool) {
        if Self::XPOSE {
            // SAFETY: forwarded from the caller. Predicated, not branched: a branch had
            // LLVM copy the `wgmma` wait before it into both paths.
            unsafe { sync::bar_arrive_named_if::<ID, XPOSE_THREADS>(cond) };
        }
    }

    #[inline(always)]
    fn kv_s(&self, st: u32) -> u32 {
        stage_s(self.base, st)
    }

    /// P of block A (warpgroup 0's) in its own slab; P of block B in stage 1's slab 8,
    /// free once S of B is done (K's last 64 dims are not part of V).
    #[inline(always)]
    fn p_s(&self, st: u32) -> u32 {
        if st == 0 {
            self.base + T::TMA_SMEM_P0 as u32
        } else if Self::E4 {
            self.kv_s(1) + T::TMA_E4_P1 as u32
        } else {
            self.kv_s(1) + 8 * SLAB
        }
    }

    /// The exchange: `[m0, scale0, m1, scale1, l0, l1] x 64` rows.
    #[inline(always)]
    fn red(&self, k: u32, r: u32) -> u32 {
        arch::opaque(self.base + T::TMA_SMEM_RED as u32 + r * 4) + k * 256
    }

    /// Stage `st`'s mbarriers, one per slab (slab `s` at `+ 8 s`).
    #[inline(always)]
    fn bars(&self, st: u32) -> u32 {
        stage_bars(self.base, st)
    }

    /// The issuer's page entries of the next pair's two blocks.
    #[inline(always)]
    fn pages_s(&self, which: u32) -> u32 {
        self.base + T::TMA_SMEM_PAGES as u32 + 32 * self.wg + 16 * which
    }

    /// Initialises the mbarriers (thread 0) and prefetches the map (the issuers), once per
    /// CTA before its first cell; a CTA barrier publishes them before any thread copies or
    /// arrives. (The `cp.async` e4m3 form's copies start in every thread before the
    /// prologue's barrier: without this one, a warp whose rows all lie past the sequence end
    /// could arrive before the init, which then erased its arrival and the slab never
    /// completed.)
    ///
    /// # Safety
    /// Every thread of the CTA, converged warps, once, before any copy.
    #[inline(always)]
    unsafe fn init_once(&self) {
        // SAFETY: forwarded from the caller.
        unsafe {
            if self.issuer && !Self::CP {
                bulk::prefetch_tensormap(self.tmap);
            }
            // The transposer's kernels initialised the mbarriers before their walk.
            if Self::XPOSE {
                return;
            }
            if arch::thread_idx_x() == 0 {
                // The `cp.async` form: a slab completes on its copying warpgroup's 128
                // `.noinc` arrivals.
                init_bars(self.base, if Self::CP { 128 } else { 1 });
            }
            sync::bar_sync();
        }
    }

    /// Loads Q, issues the first pair (both halves; bit `st` of `phase`: the parity of the
    /// phase stage `st`'s mbarriers complete next), then S of this
    /// warpgroup's block of the first pair (warpgroup 1 has none if the split has one
    /// block) into `s`.
    ///
    /// # Safety
    /// All threads of the CTA, first in each cell (a CTA barrier inside), after
    /// [`Cta::init_once`]; every read of the previous cell's shared memory has completed
    /// in every thread (its epilogue's CTA barrier).
    #[inline(always)]
    unsafe fn prologue(&mut self, s: &mut [f32; 32], phase: u32) {
        let (p, b) = (self.p, self.b);
        let (kb0, kb1) = (self.kb0, self.kb1);
        // SAFETY: thread 0 initialised the mbarriers before any copy; every thread passes
        // the CTA barriers; the Q tile holds 64 slab-layout rows of a validated q.
        unsafe {
            if K::Q_FP8 {
                self.load_q_e4m3();
            } else if !Self::SPLIT_Q {
                decode::load_q_tile::<K, M64, Bf16>(p, b, self.row0, self.base, slab_off);
            }
            cp_async::cp_async_commit_group();
            self.issue_first_pair();
            if Self::SPLIT_Q {
                self.load_q_split();
            }
            cp_async::cp_async_wait_group::<0>();
            wgmma::fence_proxy_async_shared();
            Self::cta_sync();
            if Self::SPLIT_Q {
                let down = self.ld_rows(2);
                self.scale_r = [self.scale_r[0] * down[0], self.scale_r[1] * down[1]];
            }
        }
        let own0 = kb0 + self.wg;
        if own0 < kb1 {
            // SAFETY: converged warpgroup; the first pair's copies are issued.
            unsafe {
                self.qk(s, self.wg, (phase >> self.wg) & 1, own0, &|| {}, &|| {});
                wgmma::wgmma_wait_group::<0>();
                self.zero_tail(self.wg, own0);
            }
        }
    }

    /// Warpgroup 0's issuer issues the cell's first pair (both halves of each block)
    /// through its page slots; the other threads do nothing. In the e4m3 `cp.async` form
    /// each warpgroup copies its own block instead ([`Cta::copy_stage`]).
    ///
    /// # Safety
    /// Every thread, in the prologue, converged warpgroups: thread 0 initialised the
    /// mbarriers before; the issuer's page slots are free (the previous cell's last fetch
    /// was read).
    #[inline(always)]
    unsafe fn issue_first_pair(&self) {
        let (p, b, len, kb0, kb1) = (self.p, self.b, self.len, self.kb0, self.kb1);
        if Self::CP {
            // The e4m3 `cp.async` form: each warpgroup copies its own block of the pair.
            // Opaque: the prologue's S branches on the same test a few instructions on, and
            // LLVM threaded the two together, copying the CTA barrier between them into both
            // arms.
            if arch::opaque(kb0 + self.wg) < kb1 {
                // SAFETY: forwarded from the caller (the whole warpgroup, converged).
                unsafe { self.copy_stage(kb0 + self.wg, self.wg) };
            }
            return;
        }
        // The same threads either way; the e4m3 kernels keep the thread-index test, whose
        // code ptxas fits in their 255 registers.
        let first = if Self::WARP_ISSUE {
            self.issuer && self.wg == 0
        } else {
            arch::thread_idx_x() == 0
        };
        if first {
            let lane0 = arch::thread_idx_x().is_multiple_of(32);
            let mut blk = kb0;
            while blk < kb1 && blk < kb0 + 2 {
                let st = blk - kb0;
                // Its page slots are free until the first pair's fetch, which the issuer
                // issues after these reads.
                let slot = self.pages_s(st);
                // SAFETY: forwarded from the caller; the slot is the issuer's, written by
                // lane 0 and (with WARP_ISSUE) read by every lane after the warp barrier,
                // a converged warp (warp-uniform conditions).
                unsafe {
                    if !Self::WARP_ISSUE || lane0 {
                        smem::st_shared_v4(slot, block_pages(p, b, blk, len).map(|x| x as u32));
                    }
                    if Self::WARP_ISSUE {
                        sync::syncwarp();
                    }
                    self.issue_half(slot, blk, st, 0);
                    self.issue_half(slot, blk, st, 1);
                }
                blk += 1;
            }
        }
    }

    /// This thread's two rows of exchange entry `k`.
    #[inline(always)]
    fn ld_rows(&self, k: u32) -> [f32; 2] {
        // SAFETY: rows < 64 of the exchange.
        unsafe {
            [
                smem::ld_shared_f32(self.red(k, self.r_loc)),
                smem::ld_shared_f32(self.red(k, self.r_loc + 8)),
            ]
        }
    }

    /// Stores this quad's two rows of exchange entry `k` (lane `c == 0` of each quad).
    #[inline(always)]
    fn st_rows(&self, k: u32, v: [f32; 2]) {
        let leader = (self.c == 0) as u32;
        // SAFETY: rows < 64 of the exchange.
        unsafe {
            smem::st_shared_f32_if(self.red(k, self.r_loc), v[0], leader);
            smem::st_shared_f32_if(self.red(k, self.r_loc + 8), v[1], leader);
        }
    }

    /// Warpgroup 0's half of pair `(blk_a, blk_a + 1)` (`parity`: the pair's mbarrier
    /// phase): block A's max against the running max, shared first; A's P.V; B's final max
    /// and scale from warpgroup 1, A's P with it to warpgroup 1; B's P.V from shared
    /// memory; S of the next pair's A into `s`. Reloads slabs 0-3 and 8 of both stages.
    ///
    /// # Safety
    /// Warpgroup 0, once per pair, with warpgroup 1 in [`Cta::step_b`] (named barriers in
    /// the order of the module docs).
    #[inline(always)]
    unsafe fn step_a(&mut self, s: &mut [f32; 32], blk_a: u32, parity: u32, promote: Option<bool>) {
        let blk_b = blk_a + 1;
        let has_b = blk_b < self.kb1;
        let next_a = blk_a + 2 < self.kb1;
        let next_b = blk_b + 2 < self.kb1;
        let m_run = self.m_run;
        // SAFETY: forwarded from the caller; copies go out only for halves whose last
        // reader's wgmma_wait_group has returned.
        unsafe {
            let m_a = self.mask_max(s, blk_a);
            let m0 = [sync::fmax(m_run[0], m_a[0]), sync::fmax(m_run[1], m_a[1])];
            let m0_ref = m_ref_of(m0);
            let scale0 = [
                sync::ex2(m_run[0] - m0_ref[0]),
                sync::ex2(m_run[1] - m0_ref[1]),
            ];
            self.st_rows(0, m0);
            self.st_rows(1, scale0);
            sync::bar_arrive_named::<BAR_SCALE0, 256>();
            let l_a = exp_rows(s, self.scale_r, Self::p_ref(m0_ref));
            self.rescale(scale0);
            self.l_run = [
                self.l_run[0] * scale0[0] + l_a[0],
                self.l_run[1] * scale0[1] + l_a[1],
            ];
            let a = frags_of::<K>(s);
            Self::vt_ready::<BAR_VT_READY>();
            self.pv_regs(&a, 0);
            // The e4m3 path: stage 0's raw slabs were last read by S of A and its transpose.
            if Self::E4 {
                self.reissue_stage(next_a, blk_a + 2, 0);
            }
            // Warpgroup 1's final max and scale; A's P with that scale to warpgroup 1.
            sync::bar_sync_named::<BAR_SCALE1, 256>();
            self.m_run = self.ld_rows(2);
            let scale1 = self.ld_rows(3);
            self.store_p(&scaled::<K>(&a, scale1), self.p_s(0));
            sync::bar_arrive_named::<BAR_P0, 256>();
            wgmma::wgmma_wait_group::<0>();
            Self::vt_release::<BAR_VT0>(true);
            // Slabs 0-3 and 8 of stage 0: last read by the P.V above (and S of A).
            if !Self::E4 {
                self.reissue(next_a, blk_a + 2, 0, 0);
            }
            // O holds A's P.V against m0, and S is dead here.
            if let Some(first) = promote {
                self.promote(m0, first);
            }
            self.rescale(scale1);
            self.l_run = [self.l_run[0] * scale1[0], self.l_run[1] * scale1[1]];
            if has_b {
                sync::bar_sync_named::<BAR_P1, 256>();
                Self::vt_ready::<{ BAR_VT_READY + 2 }>();
                self.pv_shared(1);
            }
            // Slabs 0-3 and 8 (B's P) of stage 1: last read by the P.V above (the e4m3
            // path: stage 1's V^T, free for warpgroup 1's next transpose). `in_qk`: called
            // inside A''s S, whose first half is the one group issued after the P.V.
            let free_b = |in_qk: bool| {
                if has_b {
                    if in_qk {
                        wgmma::wgmma_wait_group::<1>();
                    } else {
                        wgmma::wgmma_wait_group::<0>();
                    }
                    if !Self::E4 {
                        self.reissue(next_b, blk_b + 2, 1, 0);
                    } else if Self::XPOSE {
                        Self::vt_release::<BAR_VT1>(true);
                    } else if next_b {
                        sync::bar_arrive_named::<BAR_VT1, 256>();
                    }
                }
            };
            // The e4m3 path: warpgroup 1's P.V of A (stage 0's V^T) is done.
            let vt_free = || {
                if Self::E4 && !Self::XPOSE {
                    sync::bar_sync_named::<BAR_VT0, 256>();
                }
            };
            if Self::E4 {
                if next_a {
                    self.qk(s, 0, parity ^ 1, blk_a + 2, &|| free_b(true), &vt_free);
                } else {
                    free_b(false);
                }
            } else {
                // bf16: the copy goes out before A''s S, as soon as the P.V is done.
                // Warpgroup 1's next S reads it, and issued from inside A''s S it also
                // waited for A''s first copies to land.
                free_b(false);
                if next_a {
                    self.qk(s, 0, parity ^ 1, blk_a + 2, &|| {}, &vt_free);
                }
            }
            wgmma::wgmma_wait_group::<0>();
            if next_a {
                self.zero_tail(0, blk_a + 2);
            }
        }
    }

    /// Warpgroup 1's half of pair `(blk_a, blk_a + 1)`: block B's max (if any) against
    /// warpgroup 0's, the pair's final max and scale to warpgroup 0; B's P to its slab, and
    /// the two P.Vs: bf16 B's from registers, then A's from shared memory; the e4m3 path
    /// A's first. S of the next pair's B into `s`. Reloads slabs 4-7 of both stages.
    ///
    /// # Safety
    /// Warpgroup 1, once per pair, with warpgroup 0 in [`Cta::step_a`].
    #[inline(always)]
    unsafe fn step_b(&mut self, s: &mut [f32; 32], blk_a: u32, parity: u32, promote: Option<bool>) {
        let blk_b = blk_a + 1;
        let has_b = blk_b < self.kb1;
        let next_a = blk_a + 2 < self.kb1;
        let next_b = blk_b + 2 < self.kb1;
        // SAFETY: forwarded from the caller; copies go out only for halves whose last
        // reader's wgmma_wait_group has returned.
        unsafe {
            let m_b = if has_b {
                self.mask_max(s, blk_b)
            } else {
                [f32::NEG_INFINITY; 2]
            };
            sync::bar_sync_named::<BAR_SCALE0, 256>();
            let m0 = self.ld_rows(0);
            let scale0 = self.ld_rows(1);
            let m1 = [sync::fmax(m0[0], m_b[0]), sync::fmax(m0[1], m_b[1])];
            let m1_ref = m_ref_of(m1);
            let scale1 = [sync::ex2(m0[0] - m1_ref[0]), sync::ex2(m0[1] - m1_ref[1])];
            self.st_rows(2, m1);
            self.st_rows(3, scale1);
            sync::bar_arrive_named::<BAR_SCALE1, 256>();
            self.m_run = m1;
            let f = [scale0[0] * scale1[0], scale0[1] * scale1[1]];
            self.rescale(f);
            self.l_run = [self.l_run[0] * f[0], self.l_run[1] * f[1]];
            // Without a block B, s holds no S: P is computed but not summed, and the
            // P.V below multiplies zeros by A's (finite) V, so that no wgmma sits behind
            // a branch.
            let l_b = exp_rows(s, self.scale_r, Self::p_ref(m1_ref));
            if has_b {
                self.l_run = [self.l_run[0] + l_b[0], self.l_run[1] + l_b[1]];
            }
            let a = frags_of::<K>(s).map(|f| f.map(|w| if has_b { w } else { 0 }));
            if has_b {
                self.store_p(&a, self.p_s(1));
                sync::bar_arrive_named::<BAR_P1, 256>();
            }
            if Self::E4 {
                // A's P.V first: it frees stage 0's V^T, which warpgroup 0's next transpose
                // overwrites.
                sync::bar_sync_named::<BAR_P0, 256>();
                Self::vt_ready::<{ BAR_VT_READY + 1 }>();
                self.pv_shared(0);
                if has_b {
                    Self::vt_ready::<{ BAR_VT_READY + 3 }>();
                }
                self.pv_regs(&a, has_b as u32);
                // Stage 1's raw slabs were last read by S of B and its transpose.
                self.reissue_stage(next_b, blk_b + 2, 1);
                wgmma::wgmma_wait_group::<1>();
                if Self::XPOSE {
                    // Without a block B the P.V above read stage 0 as well.
                    Self::vt_release::<BAR_VT0>(has_b);
                } else if next_a {
                    // Stage 0's V^T is free for warpgroup 0's next transpose.
                    sync::bar_arrive_named::<BAR_VT0, 256>();
                }
                wgmma::wgmma_wait_group::<0>();
                Self::vt_release::<BAR_VT0>(!has_b);
                Self::vt_release::<BAR_VT1>(has_b);
            } else {
                // B's own P.V first, before waiting for A's P: stage 1's slabs 4-7 (read
                // only by this warpgroup, and first by its next S) go out as soon as it is
                // done. That copy's latency is the pair loop's longest wait where memory
                // rules (docs/PERF.md 3.3, "Copy latency").
                self.pv_regs(&a, has_b as u32);
                wgmma::wgmma_wait_group::<0>();
                self.reissue(next_b, blk_b + 2, 1, 1);
                sync::bar_sync_named::<BAR_P0, 256>();
                self.pv_shared(0);
                wgmma::wgmma_wait_group::<0>();
                // Slabs 4-7 of stage 0: last read by A's P.V above.
                self.reissue(next_a, blk_a + 2, 0, 1);
            }
            // O holds the pair against m1, and S is dead until the next S.
            if let Some(first) = promote {
                self.promote(m1, first);
            }
            let vt_free = || {
                if Self::E4 && !Self::XPOSE {
                    sync::bar_sync_named::<BAR_VT1, 256>();
                }
            };
            if next_b {
                self.qk(s, 1, parity ^ 1, blk_b + 2, &|| {}, &vt_free);
                wgmma::wgmma_wait_group::<0>();
                self.zero_tail(1, blk_b + 2);
            }
        }
    }

    /// Each warpgroup summed its own blocks' P against the same final max: the row sum is
    /// both. Stores this thread's rows (warpgroup `wg` holds output dims `256 wg .. +256`).
    ///
    /// # Safety
    /// All threads of the CTA, once, last (a CTA barrier inside); the host sized out, lse
    /// and the workspace (validated).
    #[inline(always)]
    unsafe fn epilogue(mut self) {
        let wg = self.wg;
        // SAFETY: the scratch holds this cell's promotions (a uniform condition).
        if Self::E4 && self.promotes() {
            unsafe { self.merge_acc() };
        }
        // The e4m3 path's P and row sums are 2^8 times the softmax's; the log-sum-exp takes
        // that out (the normalised output needs nothing: both carry it).
        if Self::E4 {
            self.m_run = self.m_run.map(|m| m - e4m3::P_LOG2_SCALE);
        }
        // SAFETY: forwarded from the caller; converged warps.
        unsafe {
            let l_own = [
                decode::quad_sum(self.l_run[0]),
                decode::quad_sum(self.l_run[1]),
            ];
            self.st_rows(4 + wg, l_own);
            Self::cta_sync();
            let l_other = self.ld_rows(5 - wg);
            let l_tot = [l_own[0] + l_other[0], l_own[1] + l_other[1]];
            // A split cell of the bf16 forms writes the 16-bit partial staged; fp8 Q's writes
            // it straight from the fragments (staged, the e4m3 forms' split rows ran 4-11%
            // slower and their register allocation moved: 255, or 168 under `setmaxnreg`);
            // the fp8 cache under bf16 Q keeps f32 partials (the same 16-bit store made its
            // split rows 2% slower, fp8 Q's 2% faster: PERF.md 3.26).
            if self.nsplit == 1 {
                self.store_out(l_tot);
            } else if !Self::E4 {
                self.store_partial16(l_tot);
            } else if !Self::SPLIT_Q {
                self.write_partial16(l_tot);
            } else {
                let row_a = self.row0 + self.r_loc;
                decode::write_rows::<K, M64>(
                    self.p,
                    &self.o,
                    l_tot,
                    self.m_run,
                    self.b,
                    row_a,
                    self.split,
                    self.nsplit,
                    wg,
                    self.c,
                );
            }
        }
    }

    /// A split cell of fp8 Q on an fp8 cache: its 16-bit partial (`mla_abi::partial16`) from
    /// the fragments, no staging (the e4m3 forms' staged partials ran their split rows 4-11%
    /// slower). A quad holds a half row's fp16 pairs two 8-column tiles at a time; two
    /// shuffles give each lane four consecutive values, so a warp store covers whole 32-byte
    /// sectors (8 bytes a lane, a quad's 32 contiguous bytes of one row), as the f32 form's
    /// does; 4-byte pair stores left half sectors and ran every split row 4-8 us slower.
    ///
    /// # Safety
    /// All threads of the CTA, converged warps, after the epilogue's barrier; a cell of a
    /// split sequence (`split < max_splits`, inside the workspace the host sized).
    #[inline(always)]
    unsafe fn write_partial16(&self, l_tot: [f32; 2]) {
        let p = self.p;
        let rows = p.s_q * p.heads;
        let part0 = (self.split as usize * p.batch as usize + self.b as usize) * rows as usize;
        let q = self.c;
        let quad = arch::opaque(arch::thread_idx_x()) % 32 - q;
        // Shuffle 1: lane q reads lane [1, 2, 0, 3][q]; lanes 0 and 3 send their second
        // tile's pair, lanes 1 and 2 their first. Shuffle 2: lane q reads [0, 3, 1, 2][q],
        // each lane sending the other pair.
        let src1 = quad + ((0b11_00_10_01u32 >> (2 * q)) & 3);
        let src2 = quad + ((0b10_01_11_00u32 >> (2 * q)) & 3);
        let (first, last) = (q == 0, q == 3);
        let send_second = first || last;
        unroll!(half in [0, 1] {
            let gr = self.row0 + self.r_loc + 8 * half as u32;
            let (inv, lse) = decode::row_norm(l_tot[half], self.m_run[half]);
            let sc = inv * p.value_scale;
            let mut m = 0.0f32;
            unroll!(nt in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
                m = sync::fmax(m, decode::fabs(self.o[nt][2 * half]));
                m = sync::fmax(m, decode::fabs(self.o[nt][2 * half + 1]));
            });
            // SAFETY: converged warps: the quad's four lanes hold the warpgroup's half row.
            let m = unsafe { decode::quad_max(m) };
            let (f, inv_f) = mla_abi::partial16::factor(m * decode::fabs(sc));
            // Each value is `o * sc * inv_f`, in that order, as `store_partial16` scales:
            // a product `sc * inv_f` overflows where the half row is zero or tiny and
            // `kv_scale` is large (inf, and NaN on a zero `o`).
            let v = |x: f32| x * sc * inv_f;
            let live = gr < rows;
            let slot = (part0 + gr as usize) * mla_abi::D_V;
            // Halves 256 wg + 16 j + 4 q .. + 4 of the slot: lane q's four values of
            // tiles 2j and 2j + 1.
            let dst = (p.partial_o.ptr().wrapping_add(slot) as *mut u16)
                .wrapping_add(256 * self.wg as usize + 4 * q as usize);
            unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                let w0 = Fp16::pack2(v(self.o[2 * j][2 * half]), v(self.o[2 * j][2 * half + 1]));
                let w1 = Fp16::pack2(v(self.o[2 * j + 1][2 * half]), v(self.o[2 * j + 1][2 * half + 1]));
                let (s1, s2) = if send_second { (w1, w0) } else { (w0, w1) };
                // SAFETY: converged warps (every lane, live row or not).
                let (r1, r2) = unsafe {
                    (
                        sync::shfl_idx_f32(f32::from_bits(s1), src1).to_bits(),
                        sync::shfl_idx_f32(f32::from_bits(s2), src2).to_bits(),
                    )
                };
                // Selects, not a branch on the lane: [w0, r1] at lane 0, [r2, w1] at
                // lane 3, [r1, r2] between.
                let lo = if first { w0 } else if last { r2 } else { r1 };
                let hi = if last { w1 } else if first { r1 } else { r2 };
                if live {
                    // SAFETY: slot < max_splits * batch * rows slots of D_V f32 (a live
                    // row); halves below 512 of its first D_V halves, 8-byte aligned.
                    unsafe { smem::st_global_v2(dst.wrapping_add(16 * j) as *mut u8, [lo, hi]) };
                }
            });
            if live && q == 0 {
                // SAFETY: as above; the factors and the lse sit inside the workspace.
                unsafe {
                    *p.partial_o.ptr().add(slot + mla_abi::partial16::FACTOR + self.wg as usize) = f;
                    if self.wg == 0 {
                        *p.partial_lse.ptr().add(part0 + gr as usize) = lse;
                    }
                }
            }
        });
    }

    /// A sequence of one split: the normalised tile (64 rows x 512 bf16) goes through the
    /// Q tile's shared memory (free once every S is done), then out in whole 16-byte
    /// chunks, a warp writing 512 contiguous bytes of a row per store. Written straight
    /// from the fragments, each store of a warp touched eight rows 16 bytes apiece, and the
    /// epilogue's global stores were the kernel's largest stall (Nsight Compute, `lg`
    /// throttle). The staged row `r` holds its 16-byte chunk `ch` at `ch ^ (r % 8)`, so
    /// that the fragments' eight rows of a store fall in distinct banks.
    ///
    /// # Safety
    /// All threads of the CTA, after the epilogue's CTA barrier (every `wgmma` done); the
    /// host sized `out` and `lse` (validated). Ends with a CTA barrier: the next cell's Q
    /// lands in the same shared memory.
    #[inline(always)]
    unsafe fn store_out(&self, l_tot: [f32; 2]) {
        let p = self.p;
        let rows = p.s_q * p.heads;
        let stage = self.base;
        let chunk_at = |r: u32, ch: u32| decode::staged_chunk(stage, r, ch);
        // The rows' offsets in `out`, after the staged tile (the Q tile's last 8 KB).
        let offs = stage + BLOCK_N * 1024;
        // SAFETY: rows < 64 and chunks < 64 of the Q tile's first 64 KB, and the 512 bytes
        // after them; lse rows below `rows` of sequence b < batch; out rows below `rows`,
        // dims < 512 (validated out).
        unsafe {
            let mut sc = [0.0f32; 2];
            unroll!(half in [0, 1] {
                let r = self.r_loc + 8 * half as u32;
                let (inv, lse) = decode::row_norm(l_tot[half], self.m_run[half]);
                sc[half] = inv * p.value_scale * p.output_scale;
                let gr = self.row0 + r;
                if self.wg == 0 && self.c == 0 && gr < rows {
                    *p.lse.ptr().add((self.b * rows + gr) as usize) = lse;
                }
            });
            let tid = arch::thread_idx_x();
            if Self::E4 {
                // The e4m3 kernels (255 registers) spilled with `stmatrix` staging: one
                // 4-byte store per fragment pair.
                unroll!(half in [0, 1] {
                    let r = self.r_loc + 8 * half as u32;
                    unroll!(nt in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
                        let v = Bf16::pack2(self.o[nt][2 * half] * sc[half], self.o[nt][2 * half + 1] * sc[half]);
                        smem::st_shared_u32(chunk_at(r, 32 * self.wg + nt as u32) + 4 * self.c, v);
                    });
                });
            } else {
                self.stage_frags::<Bf16, false>(sc, [1.0; 2], tid);
            }
            // The rows' offsets once the fragments are staged.
            let end = (rows - self.row0).min(BLOCK_N);
            if tid < end {
                smem::st_shared_u64(offs + 8 * tid, decode::out_row(p, self.b, self.row0 + tid));
            }
            Self::cta_sync();
            decode::store_staged_rows(
                p.out.ptr() as *mut u16,
                stage,
                offs,
                (tid / 64, 4, end),
                tid % 64,
            );
            Self::cta_sync();
        }
    }

    /// A split cell of the bf16 forms: the normalised tile as its 16-bit partial
    /// (`mla_abi::partial16`), staged and written as [`Cta::store_out`] writes a one-split
    /// tile: each warpgroup's half row as fp16 over a power-of-two factor, into the
    /// workspace slot of (split, sequence, row), with the factor and the row's lse.
    ///
    /// # Safety
    /// As [`Cta::store_out`], in a bf16 form (`stmatrix` staging), for a cell of a split
    /// sequence (`split < max_splits`, inside the workspace the host sized).
    #[inline(always)]
    unsafe fn store_partial16(&self, l_tot: [f32; 2]) {
        let p = self.p;
        let rows = p.s_q * p.heads;
        let stage = self.base;
        // The slots' offsets (16-bit elements) in the workspace, after the staged tile.
        let offs = stage + BLOCK_N * 1024;
        // The workspace slot index of (split, b, row 0): split-major over every row.
        let part0 = (self.split as usize * p.batch as usize + self.b as usize) * rows as usize;
        // SAFETY: as in `store_out`; slots below max_splits * batch * rows.
        unsafe {
            // Each value is `o * sc * sf`: `sf` the inverse of the half row's factor (a
            // product `sc * sf` could overflow where `o` is tiny).
            let mut sc = [0.0f32; 2];
            let mut sf = [1.0f32; 2];
            unroll!(half in [0, 1] {
                let gr = self.row0 + self.r_loc + 8 * half as u32;
                let (inv, lse) = decode::row_norm(l_tot[half], self.m_run[half]);
                sc[half] = inv * p.value_scale;
                let mut m = 0.0f32;
                unroll!(nt in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
                    m = sync::fmax(m, decode::fabs(self.o[nt][2 * half]));
                    m = sync::fmax(m, decode::fabs(self.o[nt][2 * half + 1]));
                });
                // The quad's four lanes hold the warpgroup's half of the row.
                let (f, inv_f) =
                    mla_abi::partial16::factor(decode::quad_max(m) * decode::fabs(sc[half]));
                sf[half] = inv_f;
                if self.c == 0 && gr < rows {
                    let slot = (part0 + gr as usize) * mla_abi::D_V;
                    *p.partial_o.ptr().add(slot + mla_abi::partial16::FACTOR + self.wg as usize) = f;
                    if self.wg == 0 {
                        *p.partial_lse.ptr().add(part0 + gr as usize) = lse;
                    }
                }
            });
            let tid = arch::thread_idx_x();
            self.stage_frags::<Fp16, true>(sc, sf, tid);
            // A slot holds D_V f32: 2 D_V 16-bit elements.
            let end = (rows - self.row0).min(BLOCK_N);
            if tid < end {
                let off = (part0 + (self.row0 + tid) as usize) * 2 * mla_abi::D_V;
                smem::st_shared_u64(offs + 8 * tid, off as u64);
            }
            Self::cta_sync();
            let dst = p.partial_o.ptr() as *mut u16;
            decode::store_staged_rows(dst, stage, offs, (tid / 64, 4, end), tid % 64);
            Self::cta_sync();
        }
    }

    /// Stages this thread's (`tid`'s) fragments of the tile as `O` values `o * sc` (times
    /// `sf` too where `SCALED`) at [`decode::staged_chunk`]'s places, with `stmatrix`: four
    /// 8 x 8 matrices a store (n-tiles nt and nt + 1, rows g and g + 8 of the warp's 16),
    /// lane l giving matrix l / 8's row l % 8.
    ///
    /// # Safety
    /// As [`Cta::store_out`], in a bf16 form, before its barrier.
    #[inline(always)]
    unsafe fn stage_frags<O: Half16, const SCALED: bool>(
        &self,
        sc: [f32; 2],
        sf: [f32; 2],
        tid: u32,
    ) {
        let stage = self.base;
        let chunk_at = |r: u32, ch: u32| decode::staged_chunk(stage, r, ch);
        let pack = |a: f32, b: f32, half: usize| {
            if SCALED {
                O::pack2(a * sc[half] * sf[half], b * sc[half] * sf[half])
            } else {
                O::pack2(a * sc[half], b * sc[half])
            }
        };
        let lane = tid % 32;
        let (m, rr) = (lane / 8, lane % 8);
        let r = self.r_loc - self.g + 8 * (m % 2) + rr;
        // SAFETY: rows < 64 and chunks < 64 of the Q tile's first 64 KB.
        unroll!(q in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
            let nt = 2 * q;
            let o = &self.o;
            let v = [
                pack(o[nt][0], o[nt][1], 0),
                pack(o[nt][2], o[nt][3], 1),
                pack(o[nt + 1][0], o[nt + 1][1], 0),
                pack(o[nt + 1][2], o[nt + 1][3], 1),
            ];
            unsafe { ldmatrix::stmatrix_x4(chunk_at(r, 32 * self.wg + nt as u32 + m / 2), v) };
        });
    }
}

/// The cell walk of a persistent TMA decode: runs `$body` with `($tile, $b, $split, $work)`
/// bound for each cell of the virtual grid `(row tiles, batch, persist_splits)` that is
/// this CTA's (`c, c + grid, ...`) and has work, in order. Every `$threads` cells, each
/// thread checks one (its split count, or the folded schedule) and a ballot per warp marks
/// those with work in the word at `$marks + 4 warp` (an expression evaluated where used);
/// the walk reads the marks through a `shfl`, so ptxas sees uniform bounds. `state =
/// ADDRESS` (optional) keeps the walk's position, the marks left and the row tiles in three
/// words per warp from there (every lane storing the same values) and reads the thread index
/// where used, so that nothing of the walk's lives in a register through `$body` (the e4m3
/// decodes' consumers spill: fp8 Q 14 / 30 `STL` / `LDL` with the walk held, 8 / 10 without;
/// the fp8 cache 25 / 43 and 17 / 18, most outside the pair loop); without it the walk holds
/// them in registers. `$bar` is the CTA barrier around a marking (the
/// unaligned one where a warp may reach it split). A macro, not a function taking a
/// closure: the kernels' bodies must stay in their entry, and a closure that large is not
/// inlined; an iterator held more registers.
///
/// Every thread of the CTA runs it, converged warps (unsafe code inside).
macro_rules! for_each_cell {
    ($p:expr, $threads:expr, $marks:expr, $bar:path, $(state = $state:expr,)?
     |$tile:pat_param, $b:pat_param, $split:pat_param, $work:pat_param| $body:block) => {{
        let p: &DecodeParams = $p;
        let threads: u32 = $threads;
        // Shadowed where the state is in shared memory: the thread index is read where used.
        #[allow(unused_variables)]
        let tid = || arch::thread_idx_x();
        $(
            let _ = $state;
            let tid = || arch::opaque(arch::thread_idx_x());
        )?
        // The virtual grid and this CTA's share of it, recomputed where used (opaque)
        // rather than held in registers through the cells.
        let tiles = || arch::opaque((p.s_q * p.heads).div_ceil(BLOCK_N));
        // With the state in shared memory, the row tiles are its third word (ptxas merges
        // the opaque copies of one value and held it through the cells).
        $(
            let tiles_at = || $state + 12 * (arch::opaque(arch::thread_idx_x()) / 32) + 8;
            smem::st_shared_f32_if(tiles_at(), f32::from_bits(tiles()), 1);
            let tiles = || uniform(smem::ld_shared_f32(tiles_at()).to_bits());
        )?
        let coords = |i: u32| {
            let (c, g, tiles) = (arch::block_idx_x(), arch::grid_dim_x(), tiles());
            let v = c + i * g;
            (v % tiles, (v / tiles) % p.batch, v / (tiles * p.batch))
        };
        let mine = || {
            let (c, g) = (arch::block_idx_x(), arch::grid_dim_x());
            let cells = tiles() * p.batch * p.persist_splits;
            if c < cells {
                (cells - c).div_ceil(g)
            } else {
                0
            }
        };
        // The next of this CTA's cells to look at (a multiple of 32: one warp's marks).
        let mut at = 0u32;
        while at < mine() {
            let marks = $marks;
            if at.is_multiple_of(threads) {
                let i = at + tid();
                // The cell's coordinates before the folded schedule's total (every lane,
                // converged), which is live only up to its one use: the e4m3 TMA decodes
                // (255 registers) spilled it when it was live across the divisions.
                let (tile, b, split) = coords(i);
                let fold = decode::fold_total(p);
                let busy = i < mine() && decode::cell_busy(p, tile, b, split, fold);
                let word = sync::ballot(busy);
                // The previous marks are read by every thread before they change.
                $bar();
                smem::st_shared_f32_if(
                    marks + 4 * (tid() / 32),
                    f32::from_bits(word),
                    tid().is_multiple_of(32) as u32,
                );
                $bar();
            }
            let mut m = uniform(smem::ld_shared_f32(marks + 4 * (at % threads / 32)).to_bits());
            while m != 0 {
                let i = at + m.trailing_zeros();
                m &= m - 1;
                let (tile, b, split) = coords(i);
                let fold = decode::fold_total(p);
                let Some(work) = decode::cta_work(p, tile, split, b, fold) else {
                    continue;
                };
                // The state's address is evaluated on each side of `$body`: nothing of the
                // walk's is live through it.
                $(
                    let w: u32 = $state + 12 * (arch::opaque(arch::thread_idx_x()) / 32);
                    smem::st_shared_f32_if(w, f32::from_bits(at), 1);
                    smem::st_shared_f32_if(w + 4, f32::from_bits(m), 1);
                )?
                let ($tile, $b, $split, $work) = (tile, b, split, work);
                $body
                $(
                    let w: u32 = $state + 12 * (arch::opaque(arch::thread_idx_x()) / 32);
                    at = uniform(smem::ld_shared_f32(w).to_bits());
                    m = uniform(smem::ld_shared_f32(w + 4).to_bits());
                )?
            }
            at += 32;
        }
    }};
}
pub(crate) use for_each_cell;

/// The work list's walk ([`DecodeParams::list_fixed`] >= 1, the 64-row TMA decodes' list
/// kernels): runs `$body` with `($tile, $b, $split, $work)` bound for each piece of work
/// that is this CTA's, in order. The virtual items `(part, row tile)`, `max(1, grid /
/// tiles)` parts of each of the `tiles` row tiles, are the CTAs' in turn. First the CTA sums
/// the batch's cost (each thread a run of sequences, a scan over the warps through the walk
/// words), sizes the parts ([`decode::list_share`]) and finds the sequence where its first
/// part starts (a later item's part: walked to from there, one sequence at a time). Then it
/// takes each sequence the part meets that it holds blocks of ([`decode::list_piece`]), in
/// order; `$split` is the piece's index in its sequence.
///
/// Between pieces the walk keeps its state in its warp's words (every lane storing the same
/// values: no register lives through `$body` for it; held in registers, the e4m3 forms
/// spilled) and reads it through a `shfl`, so ptxas sees uniform bounds. Words
/// ([`mla_abi::decode_tile::walk_words`], `W` warps): the warps' sums, then their longest
/// sequences; the part size, the total, the first part's first sequence and its cost
/// position; five words per warp (the item, the sequence, its cost position, and where the
/// item's part starts). `$bar` is the CTA barrier. A macro for the reason
/// [`for_each_cell`] is one.
///
/// Every thread of the CTA runs it, converged warps (unsafe code inside).
macro_rules! for_each_piece {
    ($p:expr, $threads:expr, $words:expr, $bar:path,
     |$tile:pat_param, $b:pat_param, $split:pat_param, $work:pat_param| $body:block) => {{
        let p: &DecodeParams = $p;
        let threads: u32 = $threads;
        let warps = threads / 32;
        // The virtual grid, recomputed where used (opaque) rather than held in registers.
        let tiles = || arch::opaque((p.s_q * p.heads).div_ceil(BLOCK_N));
        let word = |i: u32| $words + 4 * i;
        let mine =
            |i: u32| $words + 4 * (2 * warps + 4 + 5 * (arch::opaque(arch::thread_idx_x()) / 32) + i);
        let ld = |a: u32| uniform(smem::ld_shared_f32(a).to_bits());
        let st = |a: u32, v: u32| smem::st_shared_f32_if(a, f32::from_bits(v), 1);
        // The parts, and a part's cost positions.
        let parts = || (arch::grid_dim_x() / tiles()).max(1);
        let part_span = |part: u32| {
            let (share, total) = (ld(word(2 * warps)), ld(word(2 * warps + 1)));
            let ps = part.saturating_mul(share);
            (share, ps, ps.saturating_add(share).min(total))
        };
        {
            let tid = arch::thread_idx_x();
            let (lane, warp) = (tid % 32, tid / 32);
            // Each thread's run, its summed cost and longest sequence; the warps' inclusive
            // scan of the sums.
            let (lo, hi, sum, most) = decode::list_sums(p, tid, threads);
            let mut inc = sum;
            let mut most_w = most;
            unroll!(d in [1, 2, 4, 8, 16] {
                let d = d as u32;
                let up = sync::shfl_idx_f32(f32::from_bits(inc), lane.saturating_sub(d)).to_bits();
                inc += if lane >= d { up } else { 0 };
                most_w = most_w.max(sync::shfl_xor_f32(f32::from_bits(most_w), d).to_bits());
            });
            smem::st_shared_f32_if(word(warp), f32::from_bits(inc), (lane == 31) as u32);
            smem::st_shared_f32_if(word(warps + warp), f32::from_bits(most_w), (lane == 0) as u32);
            $bar();
            let (mut before, mut total, mut most_all) = (0u32, 0u32, 0u32);
            for w in 0..warps {
                let s = smem::ld_shared_f32(word(w)).to_bits();
                before += if w < warp { s } else { 0 };
                total += s;
                most_all = most_all.max(smem::ld_shared_f32(word(warps + w)).to_bits());
            }
            let share = decode::list_share(p, total, most_all, parts());
            // The first part's start, when it has one: the thread whose run holds it finds
            // the sequence (every thread walks its run; one stores).
            let ps = (arch::block_idx_x() / tiles()).saturating_mul(share);
            let start = before + inc - sum;
            let owner = ps < total && start <= ps && ps < start + sum;
            let (b0, c0) = decode::list_find(p, lo, if owner { hi } else { lo }, start, ps);
            let w = 2 * warps;
            smem::st_shared_f32_if(word(w), f32::from_bits(share), (tid == 0) as u32);
            smem::st_shared_f32_if(word(w + 1), f32::from_bits(total), (tid == 0) as u32);
            smem::st_shared_f32_if(word(w + 2), f32::from_bits(b0), owner as u32);
            smem::st_shared_f32_if(word(w + 3), f32::from_bits(c0), owner as u32);
            $bar();
            let (b0, c0) = if ps < total {
                (ld(word(w + 2)), ld(word(w + 3)))
            } else {
                (p.batch, 0)
            };
            st(mine(0), arch::block_idx_x());
            st(mine(1), b0);
            st(mine(2), c0);
            st(mine(3), b0);
            st(mine(4), c0);
        }
        loop {
            let next = 'next: loop {
                let (v, b, c) = (ld(mine(0)), ld(mine(1)), ld(mine(2)));
                if v >= parts() * tiles() {
                    break 'next None;
                }
                let part = v / tiles();
                let (share, ps, pe) = part_span(part);
                if b >= p.batch || c >= pe {
                    // The item is done: the next one starts where its part does, walked
                    // to from this part's start (parts only grow).
                    let v = v + arch::grid_dim_x();
                    let (mut b, mut c) = (ld(mine(3)), ld(mine(4)));
                    let ps = part_span(v / tiles()).1;
                    while b < p.batch {
                        // SAFETY: b < batch entries of seq_lens.
                        let len = uniform(*p.seq_lens.ptr().add(b as usize) as u32) as i32;
                        let cost = decode::list_cost(p, len).1;
                        if ps < c + cost {
                            break;
                        }
                        b += 1;
                        c += cost;
                    }
                    st(mine(0), v);
                    st(mine(1), b);
                    st(mine(2), c);
                    st(mine(3), b);
                    st(mine(4), c);
                    continue;
                }
                // SAFETY: b < batch entries of seq_lens.
                let glen_raw = uniform(*p.seq_lens.ptr().add(b as usize) as u32) as i32;
                st(mine(1), b + 1);
                st(mine(2), c + decode::list_cost(p, glen_raw).1);
                let tile = v % tiles();
                if let Some((split, nsplit, kb0, kb1)) =
                    decode::list_piece(p, tile, part, b, glen_raw, c, (share, ps, pe))
                {
                    break 'next Some((tile, b, glen_raw, (split, nsplit), (kb0, kb1)));
                }
            };
            let Some((tile, b, glen_raw, (split, nsplit), range)) = next else {
                break;
            };
            let work = decode::list_work(p, tile, b, glen_raw, (split, nsplit), range);
            let ($tile, $b, $split, $work) = (tile, b, split, work);
            $body
        }
    }};
}

/// The 64-row TMA decodes' walk: [`for_each_piece`] in the list kernels (`K::LIST`), else
/// [`for_each_cell`]; `$list` is a constant, so each kernel holds one walk.
macro_rules! walk {
    ($list:expr, $p:expr, $threads:expr, $words:expr, $bar:path, $(state = $state:expr,)?
     |$tile:pat_param, $b:pat_param, $split:pat_param, $work:pat_param| $body:block) => {
        if $list {
            for_each_piece!($p, $threads, $words, $bar, |$tile, $b, $split, $work| $body)
        } else {
            for_each_cell!($p, $threads, $words, $bar, $(state = $state,)?
                |$tile, $b, $split, $work| $body)
        }
    };
}

/// One cell of the consumer warpgroups (warps 0-7): the prologue, the pair steps, the
/// epilogue; `phase` (bit `st`: the parity of stage `st`'s next mbarrier phase; bit 2:
/// initialised) carries on to the next cell.
///
/// # Safety
/// Both consumer warpgroups, converged, for each of the walk's cells in order (see
/// [`decode_tma`]).
#[inline(always)]
unsafe fn consume_cell<K: DecodeKind<Mma = Bf16>>(
    p: &DecodeParams,
    tmap: *const u8,
    (tile, b, split): (u32, u32, u32),
    work: decode::CtaWork,
    phase: &mut u32,
    (traced, cell_no): (bool, &mut u32),
) {
    if traced {
        trace::cell_begin(p, *cell_no, b, work.kb1 - work.kb0);
    }
    let mut cta = Cta::<K>::new(p, tmap, work, tile, b, split);
    // Declared per cell: S is dead between cells (its first wgmma overwrites it).
    let mut s = [0.0f32; 32];
    // SAFETY: forwarded from the caller.
    unsafe {
        if *phase & 4 == 0 {
            cta.init_once();
            *phase |= 4;
        }
        cta.prologue(&mut s, *phase);
        if traced {
            trace::cell_stamp(p, *cell_no, 1);
        }
        let mut pair = 0u32;
        let mut blk_a = cta.kb0;
        while blk_a < cta.kb1 {
            // The e4m3 path: O into the f32 scratch every few pairs of a long split (not
            // after its last pair).
            let promote = (Cta::<K>::E4
                && (pair + 1).is_multiple_of(T::E4M3_PROMOTE_PAIRS)
                && blk_a + 2 < cta.kb1)
                .then_some(pair + 1 == T::E4M3_PROMOTE_PAIRS);
            cta.fetch_next_pages(blk_a);
            if cta.wg == 0 {
                cta.step_a(&mut s, blk_a, (*phase + pair) & 1, promote);
            } else {
                cta.step_b(&mut s, blk_a, ((*phase >> 1) + pair) & 1, promote);
            }
            pair += 1;
            blk_a += 2;
        }
        *phase = next_phase(*phase, cta.kb1 - cta.kb0);
        if traced {
            trace::cell_stamp(p, *cell_no, 2);
        }
        cta.epilogue();
        if traced {
            trace::cell_end(p, cell_no);
        }
    }
}

/// Stage `st`'s shared memory (its slabs) from the CTA's aligned base.
#[inline(always)]
fn stage_s(base: u32, st: u32) -> u32 {
    base + SLAB_TILE + st * SLAB_TILE
}

/// Stage `st`'s mbarriers, one per slab (slab `s` at `+ 8 s`), from the CTA's aligned base.
#[inline(always)]
fn stage_bars(base: u32, st: u32) -> u32 {
    base + T::TMA_SMEM_BARS as u32 + 72 * st
}

/// Initialises both stages' mbarriers (`count` arrivals a phase) and fences the init; a
/// CTA barrier after it publishes them.
///
/// # Safety
/// One thread of the CTA, once, before any copy or arrival on them.
#[inline(always)]
unsafe fn init_bars(base: u32, count: u32) {
    // SAFETY: forwarded from the caller.
    unsafe {
        init_stage_bars(base, count);
        bulk::fence_mbarrier_init();
    }
}

/// [`init_bars`] without the fence, for a kernel that initialises more mbarriers of its own
/// before one fence covers them all.
///
/// # Safety
/// As [`init_bars`]; the caller fences the init before the CTA barrier that publishes it.
#[inline(always)]
unsafe fn init_stage_bars(base: u32, count: u32) {
    // SAFETY: forwarded from the caller; 18 mbarriers of the CTA's own.
    unsafe {
        for k in 0..18 {
            bulk::mbarrier_init(stage_bars(base, 0) + 8 * k, count);
        }
    }
}

/// The stages' mbarrier parities after a cell of `blocks` blocks: stage 0 took
/// `ceil(blocks / 2)` phases, stage 1 `floor(blocks / 2)`.
#[inline(always)]
fn next_phase(phase: u32, blocks: u32) -> u32 {
    phase ^ ((blocks.div_ceil(2) & 1) | (((blocks / 2) & 1) << 1))
}

/// The transposer's part of a cell ([`Cta::XPOSE`]; warpgroup 2, thread `t` of its 128):
/// each block's V^T into its stage ([`e4m3::transpose_vt_part`], warp `t / 32` doing part
/// `t / 32`), block `kb0 + i` into stage `i % 2` as the consumers take them, once its raw
/// slabs 0-7 have landed and both consumers' P.V of the stage's last block is done (`used`:
/// bit `st`, the stage has been written before, in this cell or an earlier one). Tokens
/// past the sequence end enter V^T as zeros, with no read of their raw rows; a block with
/// keys only later query tokens see has each NaN of its V^T cleaned. Then a proxy fence and
/// an arrival on the stage's two ready barriers.
///
/// # Safety
/// The whole transposer warpgroup, converged, for each of the walk's cells in order, with
/// the consumers in [`consume_cell`]; `phase` as theirs.
#[inline(always)]
unsafe fn xpose_cell(p: &DecodeParams, work: decode::CtaWork, phase: u32, used: &mut u32) {
    // SAFETY: converged warps.
    let (len, kb0, kb1) = unsafe { (uniform(work.len), uniform(work.kb0), uniform(work.kb1)) };
    let t = arch::opaque(arch::thread_idx_x()) % 128;
    let mut blk = kb0;
    while blk < kb1 {
        let i = blk - kb0;
        let st = i % 2;
        let parity = ((phase >> st) + i / 2) & 1;
        let base = arch::opaque(aligned_base());
        let (raw, bars) = (stage_s(base, st), stage_bars(base, st));
        let (first, valid) = decode::unseen_rows(p, len, blk);
        // SAFETY: forwarded from the caller; the stage's raw slabs are read once landed,
        // its V^T written once both consumers released it; named barriers as the
        // consumers' steps pass them.
        unsafe {
            if *used & (1 << st) != 0 {
                sync::bar_sync_id::<XPOSE_THREADS>(BAR_VT0 + st);
            }
            *used |= 1 << st;
            for s in 0..8 {
                arch::no_unroll();
                bulk::mbarrier_wait_parity_warp(bars + 8 * s, parity);
            }
            let vt = raw + T::TMA_E4_VT as u32;
            e4m3::transpose_vt_part::<true, false>(raw, vt, t / 32, t % 32, valid);
            if first < valid {
                sync::bar_sync_named::<BAR_XPOSE, 128>();
                e4m3::clean_vt(vt, t, 128);
            }
            wgmma::fence_proxy_async_shared();
            sync::bar_arrive_id::<256>(BAR_VT_READY + 2 * st);
            sync::bar_arrive_id::<256>(BAR_VT_READY + 2 * st + 1);
        }
        blk += 1;
    }
}

/// The kernel body (see the module docs): a persistent CTA takes the cells of the virtual
/// grid `(row tiles, batch, persist_splits)` that are its own (`c, c + grid, ...`) and have
/// work; it marks them a CTA's threads at a time (one bit per cell, each thread checking
/// one), then runs each: the prologue (Q, the first pair's copies and S), per pair of
/// blocks the page fetch and each warpgroup's step, the epilogue (row sums, stores). The
/// mbarriers are initialised once; their phases carry on from cell to cell. The list kinds
/// (`K::LIST`) walk the work list's pieces (`for_each_piece`) instead of the cells. The
/// e4m3 tensor-map forms ([`Cta::XPOSE`]) run a third warpgroup that writes the V^Ts
/// ([`xpose_cell`]), walking the same cells; `setmaxnreg` gives the consumers
/// [`REGS_CONSUMER`] registers a thread and it [`REGS_XPOSE`].
///
/// # Safety
/// Launched with `decode_tile::THREADS` threads (`decode_tile::TMA_E4_THREADS` for
/// [`Cta::XPOSE`]), at most `tiles * batch * persist_splits` CTAs in x, and
/// `TMA_SMEM_BYTES` (`TMA_LIST_SMEM_BYTES` for `K::LIST`, with `list_fixed >= 1`; the
/// `TMA_E4_` sizes for [`Cta::XPOSE`]) of dynamic shared memory on params the host validated
/// (bf16 Q with a bf16 or (`K::KV_FP8`) fp8 cache, or (`K::Q_FP8`) fp8 Q with an fp8 cache;
/// pages of at least `TMA_MIN_PAGE` tokens, any in the `cp.async` forms (`K::KV_CP`: fused
/// caches, the map not read), `persist_splits >= 1`; with an fp8 cache,
/// `p.acc` holds `ACC_FLOATS_PER_CTA` floats per launched CTA); `tmap` is the generic
/// address of the cache's map as `decode_tile` describes it, in the kernel's parameter space.
#[inline(always)]
pub unsafe fn decode_tma<K: DecodeKind<Mma = Bf16>>(p: DecodeParams, tmap: *const u8) {
    if Cta::<K>::CP_AHEAD {
        // SAFETY: forwarded from the caller (the `cp.async` form reads no map).
        unsafe { cp::decode_cp::<K>(p) };
        return;
    }
    // Bit `st`: the parity of stage `st`'s next mbarrier phase; bit 2: initialised.
    let mut phase = 0u32;
    // Trace builds only (`decode::trace`): the bf16 kernels' phase stamps.
    let traced = cfg!(mla_trace) && !Cta::<K>::E4;
    let mut cell_no = 0u32;
    if traced {
        trace::begin(&p);
    }
    let marks = || arch::opaque(aligned_base()) + T::TMA_SMEM_CELLS as u32;
    if Cta::<K>::XPOSE {
        let marks = || arch::opaque(aligned_base()) + T::TMA_E4_WORDS as u32;
        let tid = arch::thread_idx_x();
        // SAFETY: every thread walks the same cells in the same order (the marks and the
        // list's words come from shared memory after CTA barriers), so the consumers and
        // the transposer reach the named barriers in the order [`xpose_cell`] gives;
        // `setmaxnreg` by whole warpgroups, their limits summing to the launch's 384 x 168.
        unsafe {
            if tid == 0 {
                init_bars(arch::opaque(aligned_base()), 1);
            }
            sync::bar_sync();
            if tid < 256 {
                wgmma::setmaxnreg_inc::<REGS_CONSUMER>();
                walk!(
                    K::LIST,
                    &p,
                    XPOSE_THREADS,
                    marks(),
                    sync::bar_sync,
                    state = marks() + 4 * (XPOSE_THREADS / 32),
                    |tile, b, split, work| {
                        consume_cell::<K>(
                            &p,
                            tmap,
                            (tile, b, split),
                            work,
                            &mut phase,
                            (false, &mut cell_no),
                        );
                    }
                );
            } else {
                wgmma::setmaxnreg_dec::<REGS_XPOSE>();
                let mut used = 0u32;
                walk!(
                    K::LIST,
                    &p,
                    XPOSE_THREADS,
                    marks(),
                    sync::bar_sync,
                    state = marks() + 4 * (XPOSE_THREADS / 32),
                    |_, _, _, work| {
                        let blocks = work.kb1 - work.kb0;
                        xpose_cell(&p, work, phase, &mut used);
                        phase = next_phase(phase, blocks);
                    }
                );
                // The consumers' releases of each stage's last block.
                if used & 1 != 0 {
                    sync::bar_sync_named::<BAR_VT0, XPOSE_THREADS>();
                }
                if used & 2 != 0 {
                    sync::bar_sync_named::<BAR_VT1, XPOSE_THREADS>();
                }
            }
        }
        return;
    }
    // SAFETY: every thread runs every phase (the marks come from shared memory after a
    // CTA barrier, loop bounds and has_b / next flags are CTA-uniform), so both
    // warpgroups reach the named barriers in the order the module docs give; each
    // warpgroup runs its wgmma sequences converged.
    unsafe {
        walk!(
            K::LIST,
            &p,
            T::THREADS as u32,
            marks(),
            sync::bar_sync,
            |tile, b, split, work| {
                consume_cell::<K>(
                    &p,
                    tmap,
                    (tile, b, split),
                    work,
                    &mut phase,
                    (traced, &mut cell_no),
                );
            }
        );
    }
}
