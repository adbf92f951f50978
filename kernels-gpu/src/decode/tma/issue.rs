//! The TMA decode's copy issue: the page entries of a block's boxes (read now, or fetched
//! into shared memory ahead with `cp.async`), the `cp.async.bulk.tensor` boxes of a stage
//! half on its mbarriers, the issuer's per-pair fetch and reissue, and the zeroing of V rows
//! past the sequence end once a block has landed.

use super::{BAR_WG, BLOCK_N, Cta};
use crate::arch::{self, bulk, cp_async, smem, sync, wgmma};
use crate::decode::wg::SLAB;
use crate::decode::{self, DecodeKind};
use crate::elem::Bf16;
use mla_abi::DecodeParams;

/// Page (or out-of-bounds coordinate) of box `q` of block `blk`: box `q` holds the
/// `min(page, 64)` tokens from `64 blk + q min(page, 64)`; `None` for boxes a block does
/// not have (pages of more than 16 tokens).
#[inline(always)]
pub(crate) fn box_token(p: &DecodeParams, blk: u32, q: u32) -> Option<u32> {
    let rows = p.page_size.min(BLOCK_N);
    (q * rows < BLOCK_N).then_some(blk * BLOCK_N + q * rows)
}

/// Block `blk`'s box pages, read now (prologue).
#[inline(always)]
pub(crate) fn block_pages(p: &DecodeParams, b: u32, blk: u32, len: u32) -> [i32; 4] {
    let mut pages = [p.num_pages as i32; 4];
    unroll!(q in [0, 1, 2, 3] {
        if let Some(t) = box_token(p, blk, q as u32) {
            // t < len keeps the entry inside row b of the page table.
            pages[q] = decode::kv_row_page_entry(p, b, t, len);
        }
    });
    pages
}

/// Block `blk`'s box pages fetched into the four words at `dst` (16-byte aligned) with
/// `cp.async` by one thread, so it holds no register for them until it issues; boxes past
/// the end get `num_pages` (out of bounds: zeros). The e4m3 path's issuer.
///
/// # Safety
/// One thread; `dst` is its own 16 bytes of shared memory; it waits for its `cp.async`
/// groups before reading them.
#[inline(always)]
unsafe fn fetch_pages_one(p: &DecodeParams, b: u32, blk: u32, len: u32, dst: u32) {
    unroll!(q in [0, 1, 2, 3] {
        let slot = dst + 4 * q as u32;
        // SAFETY: the slot is the caller's; a table entry is read only for a token < len
        // (inside row b, as in decode::kv_row_page_entry).
        unsafe {
            match box_token(p, blk, q as u32) {
                Some(t) if t < len => {
                    cp_async::cp_async_ca_4(slot, decode::page_entry_ptr(p, b, t) as *const u8);
                }
                _ => smem::st_shared_u32(slot, p.num_pages),
            }
        }
    });
    cp_async::cp_async_commit_group();
}

/// Word `lane` (`0..8`) of the next pair's page entries, fetched by that lane of the
/// issuing warp with `cp.async`: box `lane % 4` of block `blk0 + lane / 4` into
/// `dst + 4 lane` (the two blocks' four-word slots, 16 bytes apart). Boxes past the end, or
/// that the block does not have, get `num_pages` (out of bounds: zeros); a block past the
/// split's end (`kb1`) is not touched. The other lanes do nothing. Each lane commits a
/// group, so the lanes' fetches stay apart from any earlier ones.
/// (The per-word body is [`fetch_pages_one`]'s, written out again: a helper shared by the two
/// made ptxas spill the e4m3 kernels, at 255 registers.)
///
/// # Safety
/// The 32 lanes of one warp, converged; the 32 bytes at `dst` are the warp's own; every lane
/// waits for its `cp.async` groups and the warp meets at a `bar.warp.sync` before any lane
/// reads the words.
#[inline(always)]
unsafe fn fetch_pages(p: &DecodeParams, b: u32, blk0: u32, kb1: u32, len: u32, dst: u32) {
    let lane = arch::thread_idx_x() % 32;
    let blk = blk0 + lane / 4;
    if lane < 8 && blk < kb1 {
        let slot = dst + 4 * lane;
        // SAFETY: the slot is the warp's; a table entry is read only for a token < len
        // (inside row b, as in decode::kv_row_page_entry).
        unsafe {
            match box_token(p, blk, lane % 4) {
                Some(t) if t < len => {
                    cp_async::cp_async_ca_4(slot, decode::page_entry_ptr(p, b, t) as *const u8);
                }
                _ => smem::st_shared_u32(slot, p.num_pages),
            }
        }
    }
    cp_async::cp_async_commit_group();
}

impl<'a, K: DecodeKind<Mma = Bf16>> Cta<'a, K> {
    /// Issues half `h` (slabs 0-3 and 8, or 4-7) of block `blk` into stage `st`, its box
    /// pages read from the four words at `pages` (shared memory), slab `s` completed on the
    /// stage's mbarrier `s`. A bf16 cache lands as the slab's swizzled rows; an fp8 cache as
    /// a packed 4 KB tile of 64-byte rows, 64-byte swizzled by the map (the e4m3 path).
    ///
    /// A loop over the box positions, each issuing the half's slabs straight-line with one
    /// page read. Its warpgroup's next `wgmma` waits for the issuing warp, so the path is
    /// kept short: with [`Cta::WARP_ISSUE`] the whole warp runs it with the same values (a
    /// page word every lane reads at one address is uniform) and `elect.sync` picks the lane
    /// that arrives on each mbarrier and issues each box, so the coordinates stay in uniform
    /// registers (from one thread's branch ptxas loops over the lanes around every box).
    /// Unrolled (20 boxes, each behind its own branch) it spread the hot path over three
    /// times as many instruction-cache lines (docs/PERF.md 3.3, instruction fetch).
    ///
    /// # Safety
    /// The issuer ([`Cta::issuer`]): with [`Cta::WARP_ISSUE`] the 32 lanes of one warp,
    /// converged, else one thread; the half's mbarriers initialised with no copy pending on
    /// them; nothing reads a slab until its mbarrier completes; `pages` holds the block's
    /// pages (the caller waited for their `cp.async`).
    #[inline(always)]
    pub(super) unsafe fn issue_half(&self, pages: u32, blk: u32, st: u32, h: u32) {
        let p = self.p;
        let (dst, bars) = (self.kv_s(st), self.bars(st));
        let rows = p.page_size.min(BLOCK_N);
        let row_in_page = (blk * BLOCK_N) & (p.page_size - 1);
        // A slab's bytes, the bytes of one landed row, and the slabs' stride.
        // (The e4m3 path: packed 4 KB slabs, 64-byte swizzled by the map.)
        let (bytes, row_bytes, stride) = if Self::E4 {
            (SLAB / 2, 64, SLAB / 2)
        } else {
            (SLAB, 128, SLAB)
        };
        let slab = |i: u32| if h == 0 && i == 4 { 8 } else { 4 * h + i };
        // KV is streamed: evict-first keeps it from pushing out of L2 what other kernels
        // reuse (and the dirty lines ahead of this kernel from being written back during it).
        // A sequence's row tiles run side by side in the persistent walk, so the second
        // tile's copies still find the lines the first brought in.
        let policy = cp_async::l2_evict_first();
        // SAFETY: each box lands inside its slab (rows * (64 / rows) rows of `row_bytes`),
        // at a multiple of 1024 bytes (rows >= 16; 512 on the e4m3 path's 64-byte rows); the map is valid (host); the page
        // words are the caller's.
        unsafe {
            for i in 0..5 - h {
                if Self::WARP_ISSUE {
                    bulk::mbarrier_arrive_expect_tx_elect(bars + 8 * slab(i), bytes);
                } else {
                    bulk::mbarrier_arrive_expect_tx(bars + 8 * slab(i), bytes);
                }
            }
            // One page per box position (64 / rows of them: one at pages of 64 tokens or
            // more), read once and shared by the half's slabs.
            let mut q = 0;
            while q * rows < BLOCK_N {
                let page = smem::ld_shared_f32(pages + 4 * q).to_bits() as i32;
                let at = q * rows * row_bytes;
                for i in 0..5 - h {
                    let s = slab(i);
                    let c = [(64 * s) as i32, row_in_page as i32, page];
                    let (d, bar) = (dst + s * stride + at, bars + 8 * s);
                    if Self::WARP_ISSUE {
                        bulk::tma_load_3d_hint_elect(d, self.tmap, c, bar, policy);
                    } else {
                        bulk::tma_load_3d_hint(d, self.tmap, c, bar, policy);
                    }
                }
                q += 1;
            }
        }
    }

    /// After S of block `blk` (stage `st`) landed in this warpgroup: V rows past the
    /// sequence end (inside a page that was read) become zeros, and so do the NaN values of
    /// the rows only the step's later tokens see ([`decode::unseen_rows`]), before any P.V
    /// reads them.
    ///
    /// # Safety
    /// The whole warpgroup calls it (a warpgroup barrier inside, behind a uniform branch).
    #[inline(always)]
    pub(super) unsafe fn zero_tail(&self, st: u32, blk: u32) {
        let (first, valid) = decode::unseen_rows(self.p, self.len, blk);
        // The e4m3 path's transposes write zeros past the end (the `cp.async` forms' copies
        // land those rows as zeros; the transposer masks them) and clean its V^T.
        if first < BLOCK_N && !Self::E4 {
            // SAFETY: rows < 64 of the stage's slabs 0-7; S of the block is done, and its
            // P.Vs wait for the barrier below.
            unsafe {
                crate::decode::wg::clean_slab_rows(
                    self.kv_s(st),
                    (first, valid, BLOCK_N),
                    arch::thread_idx_x() % 128,
                    128,
                )
            };
            wgmma::fence_proxy_async_shared();
            // SAFETY: the whole warpgroup takes this branch (uniform condition).
            unsafe { self.wg_sync() };
        }
    }

    /// This warpgroup's own named barrier.
    ///
    /// # Safety
    /// The whole warpgroup, converged.
    #[inline(always)]
    pub(super) unsafe fn wg_sync(&self) {
        // SAFETY: forwarded from the caller.
        unsafe {
            if self.wg == 0 {
                sync::bar_sync_named::<{ BAR_WG[0] }, 128>();
            } else {
                sync::bar_sync_named::<{ BAR_WG[1] }, 128>();
            }
        }
    }

    /// The issuer fetches the next pair's page entries (blocks `blk_a + 2` and, if the
    /// split has it, `blk_a + 3`; with [`Cta::WARP_ISSUE`] one word per lane); it reads
    /// them after a P.V.
    ///
    /// # Safety
    /// Once per pair, before the pair's [`Cta::reissue`]s; the whole warpgroup.
    #[inline(always)]
    pub(super) unsafe fn fetch_next_pages(&self, blk_a: u32) {
        let (p, b, kb1, len) = (self.p, self.b, self.kb1, self.len);
        // The `cp.async` form reads each row's entry as it copies it.
        if self.issuer && blk_a + 2 < kb1 && !Self::CP {
            // SAFETY: the issuer's own slots; with WARP_ISSUE a converged warp (a
            // warp-uniform condition).
            unsafe {
                if Self::WARP_ISSUE {
                    fetch_pages(p, b, blk_a + 2, kb1, len, self.pages_s(0));
                } else {
                    fetch_pages_one(p, b, blk_a + 2, len, self.pages_s(0));
                    if blk_a + 3 < kb1 {
                        fetch_pages_one(p, b, blk_a + 3, len, self.pages_s(1));
                    }
                }
            }
        }
    }

    /// The fetched pages are in shared memory for the issuer (with [`Cta::WARP_ISSUE`],
    /// every lane of the issuing warp).
    ///
    /// # Safety
    /// The issuer.
    #[inline(always)]
    unsafe fn pages_landed(&self) {
        cp_async::cp_async_wait_group::<0>();
        if Self::WARP_ISSUE {
            // SAFETY: forwarded from the caller (a converged warp).
            unsafe { sync::syncwarp() };
        }
    }

    /// With `next` (the next pair has the block), the issuer reloads half `h` of stage `st`
    /// with block `blk` from the pages it fetched.
    ///
    /// # Safety
    /// The whole warpgroup; the half's last reader (a P.V, or S) has completed (its
    /// `wgmma_wait_group` returned); the pages were fetched ([`Cta::fetch_next_pages`]).
    #[inline(always)]
    pub(super) unsafe fn reissue(&self, next: bool, blk: u32, st: u32, h: u32) {
        if self.issuer && next {
            // SAFETY: forwarded from the caller; with WARP_ISSUE a converged warp (a
            // warp-uniform condition).
            unsafe {
                self.pages_landed();
                self.issue_half(self.pages_s(st), blk, st, h);
            }
        }
    }

    /// The e4m3 path: with `next`, the issuer reloads both halves of stage `st` with block
    /// `blk` (one wait for the fetched pages); in the `cp.async` form the whole warpgroup
    /// copies it ([`Cta::copy_stage`]).
    ///
    /// # Safety
    /// As [`Cta::reissue`], for the whole stage, its own (stage `wg`); the warpgroup
    /// converged.
    #[inline(always)]
    pub(super) unsafe fn reissue_stage(&self, next: bool, blk: u32, st: u32) {
        if Self::CP {
            if next {
                // SAFETY: forwarded from the caller.
                unsafe { self.copy_stage(blk, st) };
            }
            return;
        }
        if self.issuer && next {
            // SAFETY: forwarded from the caller.
            unsafe {
                self.pages_landed();
                self.issue_half(self.pages_s(st), blk, st, 0);
                self.issue_half(self.pages_s(st), blk, st, 1);
            }
        }
    }
}
