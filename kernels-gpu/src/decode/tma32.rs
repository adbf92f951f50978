//! The small-row TMA decode (sm_90a only; `--cfg mla_wgmma`): bf16 Q with a bf16 or fp8
//! e4m3 cache, or fp8 Q with an fp8 cache; at most `decode_tile::TMA32_ROWS` query rows (16
//! heads at one or two query tokens), pages of at least `decode_tile::TMA_MIN_PAGE` tokens
//! (bf16 at any page size in the `cp.async` form).
//! The same grid, params and tensor map as [`crate::decode::tma`], so the host's schedule,
//! workspace and combine are shared.
//!
//! Both products run transposed, with the query rows as the `wgmma`'s N: S^T = K Q^T (A =
//! a block's K slabs as the copies land them, 64 tokens x 64 dims, K-major; B = the Q tile,
//! 32 rows, K-major) and O^T = V^T P^T (A = the same slabs read MN-major through the
//! transpose bit, 64 dims per `wgmma`; B = P as 32 rows x 64 tokens). A block costs the
//! `wgmma` work of 32 rows instead of a 64-row tile's, and every shared buffer is small.
//!
//! - Warps 0-3 (the consumer warpgroup; two with an fp8 cache, below) compute; warp 4's lane
//!   0 (the producer; warp 8 with an fp8 cache) issues the
//!   tensor copies (in the `cp.async` form, `DecodeKind::KV_CP`, warps 4-7 copy each slab's
//!   rows from the page table: pages of any size), one 64-dim slab of a block at a time,
//!   into a ring of slab slots
//!   (`decode_tile::tma32_smem`'s `slots`: 23 for a bf16 cache): slab `s` of the `n`-th
//!   block this CTA walks is the ring's slab `9 n + s`. Each slot has two mbarriers: *full* (the producer's
//!   expected bytes; the copy completes it) and *free* (the consumer's arrival once its
//!   last read of the slab is done: S^T for the rope slab 8, P.V for slabs 0-7). The
//!   producer runs ahead of the consumer by as many slabs as are free, across blocks and
//!   the persistent CTA's cells.
//! - An fp8 cache takes the e4m3 tensor cores, with two consumer warpgroups (warps 0-3 and
//!   4-7), each every other block of a cell (the second from the cell's second block), its
//!   own O, row statistics, P tile and row exchange; at the cell's end the second's rows are
//!   merged into the first's through shared memory ([`Consumer::merge`]) and the first
//!   writes the output. The producer is warp 8, the first of a third warpgroup whose four
//!   warps give registers to the consumers (`setmaxnreg`: 232 a consumer thread, 40 the
//!   rest; the launch's 384 x 168). The boxes land raw in a second ring (4 KB slabs of
//!   64-byte rows, whole blocks of nine), and S^T reads them as they are (e4m3
//!   `m64n32k32`, two per slab; bf16 Q as two e4m3 parts, `hi` and `lo`, with a power-of-two
//!   scale per row, [`e4m3::split_q_row`]; fp8 Q as it is). e4m3 `wgmma` reads A only
//!   K-major, so each consumer writes its block's V^T (eight tiles of 64 dims x 64 tokens,
//!   [`e4m3::transpose_vt_part`], a quarter a warp, tokens past the sequence end as zeros)
//!   into its own V^T entry (in the bf16 ring's place) while its S^T `wgmma`s run; a raw slab
//!   is free once both are done. P is quantised per row at `2^8` over the consumer's running
//!   max (its largest key exactly `2^8`, as in one running max: a reference left below a
//!   block's max would round that key's weight by up to 2^-4), and stored in V^T's token
//!   order; O is promoted to the f32 scratch (each consumer its own slots) every
//!   `2 E4M3_PROMOTE_PAIRS` blocks a consumer runs. The fp8 scales are in the params'
//!   softmax and value scales.
//! - A thread's S^T accumulators hold tokens `16 w + g` and `+ 8` (warp `w`, quad row `g`)
//!   of its rows `8 j + 2 c` and `+ 1` (`j < 4`, quad column `c`); so do its O^T
//!   accumulators (dims instead of tokens), so the row statistics of a thread's eight rows
//!   rescale its own O. A row's block max is a max over lanes and the four warps (shared
//!   memory, named barrier [`BAR_MAX`]); its exp-sum stays spread over the threads until
//!   the epilogue. P goes to shared memory with `stmatrix.trans` (row-major, the K-major
//!   B operand; named barrier [`BAR_P`]).
//! - V rows past the sequence end (inside a page that was read) are zeroed before the
//!   P.V (in V^T, by its transpose, with an fp8 cache); boxes past the end and pages outside
//!   `0..num_pages` land as zeros (the map).
//! - A sequence of one split writes its output through the Q tile's shared memory (one
//!   16-byte chunk per store); a split's f32 partial goes straight from the accumulators
//!   (each store a warp's four rows x 32 bytes).

use crate::arch::{self, bulk, cp_async, cvt, ldmatrix, smem, sync, wgmma};
use crate::decode::tma::e4m3::{self, load_q_e4m3_rows, split_q_row, transpose_vt_part};
use crate::decode::tma::{block_pages, for_each_cell, uniform};
use crate::decode::wg::{SLAB, aligned_base, sw64_off};
use crate::decode::{self, CtaWork, DecodeKind, trace};
use crate::elem::{Bf16, Half16};
use core::marker::PhantomData;
use mla_abi::DecodeParams;
use mla_abi::decode_tile::{self as T, Tma32Smem};

const BLOCK_N: u32 = T::BLOCK_N as u32;
const ROWS: u32 = T::TMA32_ROWS as u32;
const Q_SLAB: u32 = T::TMA32_Q_SLAB as u32;
const RAW_SLAB: u32 = T::TMA32_RAW_SLAB as u32;
/// An e4m3 Q tile (32 rows x 64 bytes) and the `lo` part's offset.
const E4_Q_TILE: u32 = ROWS * 64;
const E4_Q_LO: u32 = T::TMA32_E4_Q_LO as u32;
/// Blocks of a split between promotions of O to the f32 scratch (the fp8 forms).
const PROMOTE_BLOCKS: u32 = 2 * T::E4M3_PROMOTE_PAIRS;
/// A consumer warpgroup's threads (warps 0-3; with an fp8 cache warps 4-7 are the second);
/// then the producer warp (with an fp8 cache the first of a third warpgroup).
const CONSUMERS: u32 = 128;
/// The `cp.async` form's producer warpgroup (warps 4-7).
const CP_PRODUCERS: u32 = 128;
/// The consumer's named barriers (0 is the CTA barrier): the four warps' row maxima are
/// in the exchange; P (and any zeroed V rows) are in shared memory; the output staging.
const BAR_MAX: u32 = 1;
const BAR_P: u32 = 2;
const BAR_OUT: u32 = 3;
/// The second consumer's [`BAR_MAX`] and [`BAR_P`] are these plus `BAR_WG1`.
const BAR_WG1: u32 = 4;
/// Both consumers (fp8 forms): the cell's Q is in shared memory; the merge's steps.
const BAR_Q: u32 = 9;
const BAR_MERGE: u32 = 10;
/// The fp8 forms' register split: each consumer thread's limit and the third
/// warpgroup's (the producer warp, three idle), `2 * 128 * 232 + 128 * 40` = 384 x 168,
/// what the launch holds.
const REGS_CONSUMER: u32 = 232;
const REGS_SUPPORT: u32 = 40;
const _: () = assert!(2 * 128 * REGS_CONSUMER + 128 * REGS_SUPPORT <= 384 * 168);
const _: () = assert!(ROWS == 32 && CP_PRODUCERS == 2 * BLOCK_N);
const _: () = assert!(T::TMA32_RAW_SLOTS.is_multiple_of(9) && E4_Q_TILE * 9 == E4_Q_LO);
// The promotion scratch: O's 128 floats and the 8 rows' maxima per consumer thread.
const ACC_PER_WG: usize = (128 + 8) * CONSUMERS as usize;
const _: () = assert!(T::TMA32_FP8_CONSUMERS * ACC_PER_WG <= mla_abi::ACC_FLOATS_PER_CTA);
// The consumers' merge: a thread's four O tiles (64 floats) per step in the Q tile, its
// rows' maxima and sums in the P tiles.
const _: () = assert!(4 * 16 * 4 * CONSUMERS <= 9 * Q_SLAB && 16 * 4 * CONSUMERS <= 2 * ROWS * 128);
// The one-split output staging (rows of 1024 bytes, then a u64 offset per row) fits the
// Q tile.
const _: () = assert!(ROWS * (1024 + 8) <= 9 * Q_SLAB);

/// A row's exponent reference: its running max, or 0 while the row has seen nothing.
#[inline(always)]
fn m_ref_of(m: f32) -> f32 {
    if m == f32::NEG_INFINITY { 0.0 } else { m }
}

/// Where a slab sits in a ring: its slot and the parity of the slot's phase it takes.
#[derive(Clone, Copy)]
struct Pos {
    slot: u32,
    parity: u32,
}

impl Pos {
    /// Lane 0's position in every lane: ptxas then keeps the descriptors and barrier
    /// addresses computed from it in uniform registers (no move per `wgmma`).
    ///
    /// # Safety
    /// All 32 lanes of the warp, converged.
    #[inline(always)]
    unsafe fn lane0(self) -> Pos {
        Pos {
            // SAFETY: forwarded from the caller.
            slot: unsafe { uniform(self.slot) },
            ..self
        }
    }

    /// The ring position of the `n`-th slab in a ring of `slots` slots.
    #[inline(always)]
    fn of(n: u32, slots: u32) -> Pos {
        Pos {
            slot: n % slots,
            parity: (n / slots) & 1,
        }
    }

    /// The position `k` slabs on in a ring of `n` slots (`k < n`).
    #[inline(always)]
    fn plus(self, k: u32, n: u32) -> Pos {
        let t = self.slot + k;
        if t >= n {
            Pos {
                slot: t - n,
                parity: self.parity ^ 1,
            }
        } else {
            Pos {
                slot: t,
                parity: self.parity,
            }
        }
    }
}

/// The layout of kind `K`'s form and its roles' thread ranges.
struct Form<K>(PhantomData<K>);

impl<K: DecodeKind> Form<K> {
    const L: Tma32Smem = if K::KV_FP8 {
        T::TMA32_FP8
    } else if K::KV_CP {
        T::TMA32_BF16_CP
    } else {
        T::TMA32_BF16
    };
    const THREADS: u32 = Self::L.threads as u32;
    const SLOTS: u32 = Self::L.slots as u32;
    const RAW_SLOTS: u32 = Self::L.raw_slots as u32;
    /// The ring the copies land in: the raw ring for an fp8 cache, else the bf16 ring.
    const COPY_SLOTS: u32 = if K::KV_FP8 {
        Self::RAW_SLOTS
    } else {
        Self::SLOTS
    };
    /// Consumer warpgroups: two with an fp8 cache (each its own blocks of a cell, merged
    /// at the cell's end), else one.
    const WGS: u32 = if K::KV_FP8 {
        T::TMA32_FP8_CONSUMERS as u32
    } else {
        1
    };
    /// The producer warp's lane 0 (after the consumers); in the `cp.async` form the
    /// producer warpgroup's first thread (warps 4-7).
    const PRODUCER: u32 = Self::WGS * CONSUMERS;
}
const _: () = assert!(T::TMA32_FP8_CONSUMERS == 2 && T::TMA32_FP8.threads == 384);

/// The shared regions from the aligned base (opaque: recomputed where used rather than
/// held in registers through the block loop).
struct Smem<K> {
    base: u32,
    _kind: PhantomData<K>,
}

impl<K> Clone for Smem<K> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K> Copy for Smem<K> {}

impl<K: DecodeKind> Smem<K> {
    const L: Tma32Smem = Form::<K>::L;

    #[inline(always)]
    fn new() -> Self {
        Smem {
            base: arch::opaque(aligned_base()),
            _kind: PhantomData,
        }
    }
    #[inline(always)]
    fn q(self) -> u32 {
        self.base
    }
    /// Consumer `cw`'s P tile.
    #[inline(always)]
    fn p(self, cw: u32) -> u32 {
        self.base + Self::L.p as u32 + cw * ROWS * 128
    }
    /// Slot `slot` of the bf16 ring.
    #[inline(always)]
    fn slab(self, slot: u32) -> u32 {
        self.base + Self::L.ring as u32 + slot * SLAB
    }
    /// V^T entry `e` of the fp8 forms (in the bf16 ring's place): consumer `e`'s, written and
    /// read by it alone (its barriers are unused).
    #[inline(always)]
    fn vt(self, e: u32) -> u32 {
        self.base + Self::L.ring as u32 + e * T::TMA32_VT_ENTRY as u32
    }
    /// The rows' Q scales (`1 / up`, bf16 Q with an fp8 cache), after e4m3 P.
    #[inline(always)]
    fn q_scale(self) -> u32 {
        self.p(0) + ROWS * 64
    }
    /// Slot `slot` of the raw ring.
    #[inline(always)]
    fn raw(self, slot: u32) -> u32 {
        self.base + Self::L.raw as u32 + slot * RAW_SLAB
    }
    /// Consumer `cw`'s row exchange.
    #[inline(always)]
    fn red(self, cw: u32) -> u32 {
        self.base + Self::L.red as u32 + cw * 4 * ROWS * 4
    }
    /// The bf16 ring's mbarriers: full, then free.
    #[inline(always)]
    fn full(self, slot: u32) -> u32 {
        self.base + Self::L.bars as u32 + 8 * slot
    }
    #[inline(always)]
    fn free(self, slot: u32) -> u32 {
        self.base + Self::L.bars as u32 + 8 * (Self::L.slots as u32 + slot)
    }
    /// The raw ring's mbarriers: full, then free.
    #[inline(always)]
    fn raw_full(self, slot: u32) -> u32 {
        self.base + Self::L.bars as u32 + 8 * (2 * Self::L.slots as u32 + slot)
    }
    #[inline(always)]
    fn raw_free(self, slot: u32) -> u32 {
        self.base
            + Self::L.bars as u32
            + 8 * (2 * Self::L.slots as u32 + Self::L.raw_slots as u32 + slot)
    }
    #[inline(always)]
    fn cells(self) -> u32 {
        self.base + Self::L.cells as u32
    }
}

/// The producer's copies of one cell: every block of `w`, slab by slab, each into the next
/// slot of its ring (the bf16 ring, or the raw ring for an fp8 cache) once that slot is
/// free. `n`: the count of slabs before the cell's first, advanced past its last (every
/// role counts the same slabs; a slab's slot in either ring follows from it).
///
/// # Safety
/// One thread (the producer warp's lane 0), for every cell the consumer runs, in the same
/// order; the mbarriers are initialised; `tmap` is the cache's map.
#[inline(always)]
unsafe fn produce<K: DecodeKind>(
    p: &DecodeParams,
    tmap: *const u8,
    sm: Smem<K>,
    w: &CtaWork,
    b: u32,
    n_slabs: &mut u32,
) {
    let (len, kb0, kb1) = (w.len, w.kb0, w.kb1);
    if kb0 >= kb1 {
        return;
    }
    // The ring the copies land in: raw slabs of 64-byte rows, or bf16 slabs.
    let (n, bytes, row_bytes) = if K::KV_FP8 {
        (Form::<K>::RAW_SLOTS, RAW_SLAB, 64)
    } else {
        (Form::<K>::SLOTS, SLAB, 128)
    };
    let slab = |slot: u32| {
        if K::KV_FP8 {
            sm.raw(slot)
        } else {
            sm.slab(slot)
        }
    };
    let full = |slot: u32| {
        if K::KV_FP8 {
            sm.raw_full(slot)
        } else {
            sm.full(slot)
        }
    };
    let free = |slot: u32| {
        if K::KV_FP8 {
            sm.raw_free(slot)
        } else {
            sm.free(slot)
        }
    };
    let rows = p.page_size.min(BLOCK_N);
    // The cell's KV is streamed and read by no other CTA (at most 32 rows: one row tile).
    let policy = cp_async::l2_evict_first();
    let mut pages = block_pages(p, b, kb0, len);
    let mut blk = kb0;
    while blk < kb1 {
        // The next block's page entries go out now; their loads land while this block's
        // slabs wait for free slots.
        let next = if blk + 1 < kb1 {
            block_pages(p, b, blk + 1, len)
        } else {
            pages
        };
        let row_in_page = ((blk * BLOCK_N) & (p.page_size - 1)) as i32;
        let at = Pos::of(*n_slabs, n);
        let mut s = 0;
        while s < 9 {
            let at_s = at.plus(s, n);
            // SAFETY: the slot's last reader arrived on its free barrier (parity of the
            // previous use; a fresh barrier's previous phase counts as complete); each
            // box lands inside the slab at a multiple of 1024 bytes (512 for raw rows;
            // rows >= 16).
            unsafe {
                while !bulk::mbarrier_try_wait_parity(free(at_s.slot), at_s.parity ^ 1) {}
                bulk::mbarrier_arrive_expect_tx(full(at_s.slot), bytes);
                unroll!(q in [0, 1, 2, 3] {
                    if (q as u32) * rows < BLOCK_N {
                        let c = [(64 * s) as i32, row_in_page, pages[q]];
                        let dst = slab(at_s.slot) + q as u32 * rows * row_bytes;
                        bulk::tma_load_3d_hint(dst, tmap, c, full(at_s.slot), policy);
                    }
                });
            }
            s += 1;
        }
        *n_slabs += 9;
        pages = next;
        blk += 1;
    }
}

/// [`produce`] by `cp.async` (the bf16 `cp.async` form, `K::KV_CP`): the producer
/// warpgroup copies a block once its nine slots are free, eight threads a row (thread `t`:
/// chunk `t % 8` of rows `t / 8 + 16 i`, at their swizzled places) and row by row (a row's
/// nine chunks in consecutive copies, so each warp sweeps four whole rows and the CTA 16 at a
/// time: the DRAM sees 18 KB runs, where slab by slab it saw one 128-byte line of 64 rows,
/// 1.1-2.3% of the decode's time from B=32, docs/PERF.md 3.18), then each thread arrives
/// on the nine slots' full barriers once its copies have landed
/// (`cp.async.mbarrier.arrive.noinc`: a barrier counts the warpgroup's [`CP_PRODUCERS`]
/// arrivals). Rows past the sequence end, or whose page entry is outside
/// `0..num_pages`, land as zeros (nothing read). A thread reads its rows' page entries a
/// block ahead. The copies come from warps that run no `wgmma` (a warpgroup's `wgmma`
/// waits for the `cp.async` copies its own threads issued before it), from four of them
/// (one warp keeps too few copies in flight), and each warp's copy reads whole 128-byte
/// lines (two threads a row, each copy touching 16 lines, was 1.2x slower): docs/PERF.md
/// 3.12.
///
/// # Safety
/// The producer warpgroup, for every cell the consumer runs, in the same order; the bf16
/// ring's full barriers count [`CP_PRODUCERS`] arrivals.
#[inline(always)]
unsafe fn produce_cp<K: DecodeKind>(
    p: &DecodeParams,
    sm: Smem<K>,
    w: &CtaWork,
    b: u32,
    n_slabs: &mut u32,
) {
    let (len, kb0, kb1) = (w.len, w.kb0, w.kb1);
    if kb0 >= kb1 {
        return;
    }
    let n = Form::<K>::SLOTS;
    let t = arch::thread_idx_x() - Form::<K>::PRODUCER;
    // Chunk c of rows r0 + 16 i: each copy of a warp reads four whole 128-byte lines.
    let (r0, c) = (t / 8, t % 8);
    let policy = cp_async::l2_evict_first();
    let entries = |blk: u32| {
        [0u32, 1, 2, 3].map(|i| decode::kv_row_page_entry(p, b, blk * BLOCK_N + r0 + 16 * i, len))
    };
    let mut ent = entries(kb0);
    let mut blk = kb0;
    while blk < kb1 {
        let next = if blk + 1 < kb1 { entries(blk + 1) } else { ent };
        // The fused rows: the rope part follows the latent part (the host routes split
        // caches elsewhere), so one address serves a row's 72 chunks.
        let src = [0u32, 1, 2, 3]
            .map(|i| decode::kv_row_source(p, ent[i as usize], blk * BLOCK_N + r0 + 16 * i, 2));
        let at = Pos::of(*n_slabs, n);
        // The block's nine slots free first, then each row's nine chunks back to back (a
        // warp's copies sweep four whole rows), then the nine full arrivals.
        let mut s = 0;
        while s < 9 {
            let at_s = at.plus(s, n);
            // SAFETY: a wait on the slot's free barrier, for the parity of its previous use
            // (a fresh barrier's previous phase counts as complete).
            unsafe { while !bulk::mbarrier_try_wait_parity(sm.free(at_s.slot), at_s.parity ^ 1) {} }
            s += 1;
        }
        unroll!(i in [0, 1, 2, 3] {
            let mut s = 0;
            while s < 9 {
                let at_s = at.plus(s, n);
                // SAFETY: the slot's last reader arrived on its free barrier (waited above);
                // rows r0 + 16 i < 64, chunk c < 8 of the slot (the rows share r0 % 8); a
                // valid row (n == 16) is 1152 contiguous bytes (chunk 8 s + c of it), else
                // nothing is read.
                unsafe {
                    let dst = sm.slab(at_s.slot) + r0 * 128 + ((c ^ (r0 % 8)) << 4);
                    let a = src[i].main.add((128 * s + 16 * c) as usize);
                    cp_async::cp_async_cg_16_hint(dst + 16 * 128 * i as u32, a, src[i].n, policy);
                }
                s += 1;
            }
        });
        let mut s = 0;
        while s < 9 {
            let at_s = at.plus(s, n);
            // SAFETY: the slot's full barrier, which counts CP_PRODUCERS arrivals; it
            // completes once this thread's copies above (all nine slots') have landed.
            unsafe { cp_async::cp_async_mbarrier_arrive_noinc(sm.full(at_s.slot)) };
            s += 1;
        }
        *n_slabs += 9;
        ent = next;
        blk += 1;
    }
}

/// The consumer warpgroup's state through a cell: its O^T (eight 64-dim tiles x this
/// thread's 16 values), and per row of this thread (`k = 2 j + e`: row `8 j + 2 c + e`) the
/// running max (log2 units, scaled) and exp-sum part.
struct Consumer<'a, K: DecodeKind> {
    p: &'a DecodeParams,
    sm: Smem<K>,
    /// This consumer warpgroup (0, or 1 for the second of the fp8 forms).
    cw: u32,
    b: u32,
    split: u32,
    nsplit: u32,
    len: u32,
    kb0: u32,
    kb1: u32,
    /// The thread's index in its warpgroup.
    tid: u32,
    glen: u32,
    /// The fewest keys any of this thread's rows sees: blocks below it need no mask.
    vis_min: u32,
    scale: f32,
    o: [[f32; 16]; 8],
    m_run: [f32; 8],
    l: [f32; 8],
}

impl<'a, K: DecodeKind> Consumer<'a, K> {
    /// This thread's warp, quad row and quad column (from the thread index where used,
    /// not held through the block loop).
    #[inline(always)]
    fn wgc(&self) -> (u32, u32, u32) {
        let tid = arch::opaque(self.tid);
        (tid / 32, (tid % 32) / 4, tid % 4)
    }

    /// This thread's row `k` (`8 (k / 2) + 2 c + k % 2`).
    #[inline(always)]
    fn row(c: u32, k: u32) -> u32 {
        8 * (k / 2) + 2 * c + k % 2
    }

    /// A position `k` slabs on in the bf16 ring.
    #[inline(always)]
    fn pos(at: Pos, k: u32) -> Pos {
        at.plus(k, Form::<K>::SLOTS)
    }

    /// Slab `k`'s (`< 9`) slot in the bf16 ring as a signed offset from `at`'s slot, and
    /// its parity: the block's slab addresses, descriptors and barriers are then `at`'s
    /// plus a multiple of that offset (one compare and select per slab, no slot
    /// arithmetic behind each `wgmma`).
    #[inline(always)]
    fn step(at: Pos, k: u32) -> (i32, u32) {
        let n = Form::<K>::SLOTS;
        if at.slot + k >= n {
            (k as i32 - n as i32, at.parity ^ 1)
        } else {
            (k as i32, at.parity)
        }
    }

    /// `base` plus `d` steps of `unit` (a descriptor or an address moved by a slot offset;
    /// the result is another slot's, so it stays in range).
    #[inline(always)]
    fn moved(base: u64, d: i32, unit: u32) -> u64 {
        base.wrapping_add((d as i64 * unit as i64) as u64)
    }

    #[inline(always)]
    fn new(p: &'a DecodeParams, sm: Smem<K>, w: &CtaWork, b: u32, split: u32) -> Self {
        let t = arch::opaque(arch::thread_idx_x());
        let (cw, tid) = if Form::<K>::WGS == 1 {
            (0, t)
        } else {
            (t / CONSUMERS, t % CONSUMERS)
        };
        let lane = tid % 32;
        let c = lane % 4;
        // A row's visible keys never decrease with its token (nor, so, with the row), and
        // row(c, 0) is the thread's lowest: one division, not eight.
        let vis_min = decode::visible(p, w.len, w.glen, Self::row(c, 0));
        // SAFETY (every `uniform`): converged warps.
        let (len, kb0, kb1) = unsafe { (uniform(w.len), uniform(w.kb0), uniform(w.kb1)) };
        Consumer {
            p,
            sm,
            cw,
            b,
            split,
            nsplit: unsafe { uniform(w.nsplit) },
            len,
            kb0,
            kb1,
            tid,
            glen: w.glen,
            vis_min,
            scale: p.softmax_scale * core::f32::consts::LOG2_E,
            o: [[0.0; 16]; 8],
            m_run: [f32::NEG_INFINITY; 8],
            l: [0.0; 8],
        }
    }

    /// Loads the cell's Q rows (zeros past the last) as nine 32-row slabs of bf16, 128-byte
    /// swizzled; with an fp8 cache as nine e4m3 tiles of 32 rows x 64 bytes (64-byte
    /// swizzle): fp8 Q as it is, bf16 Q as its `hi` and `lo` parts (`E4_Q_LO` apart) with the
    /// rows' `1 / up` in [`Smem::q_scale`].
    ///
    /// # Safety
    /// The consumer warpgroup; the previous cell's readers of the Q tile are done (its
    /// epilogue's barrier).
    #[inline(always)]
    unsafe fn load_q(&self) {
        let q = self.sm.q();
        // SAFETY (each arm): the offsets lie in the Q tile (nine slabs of 32 rows, or the
        // two e4m3 parts' nine 2 KB tiles) and the scales; b < batch; converged warps.
        if self.cw != 0 {
            // The first consumer loads the tile for both.
        } else if K::KV_FP8 {
            let tile = move |r: u32, k: u32| q + (k / 4) * E4_Q_TILE + sw64_off(r, 16 * (k % 4));
            if K::Q_FP8 {
                let t = (self.tid, CONSUMERS);
                unsafe { load_q_e4m3_rows(self.p, self.b, (0, ROWS), t, tile) };
            } else {
                let (r, part) = (self.tid / 4, self.tid % 4);
                unsafe {
                    let down =
                        split_q_row::<true>(self.p, self.b, r, part, E4_Q_LO, |k| tile(r, k));
                    let at = self.sm.q_scale() + 4 * r;
                    smem::st_shared_f32_if(at, down, (part == 0) as u32);
                }
            }
        } else {
            let slab_off = |r: u32, k: u32| (k / 8) * Q_SLAB + r * 128 + (((k % 8) ^ (r % 8)) << 4);
            unsafe {
                decode::load_q_rows::<K, Bf16>(
                    self.p,
                    self.b,
                    (0, ROWS),
                    (self.tid, CONSUMERS),
                    q,
                    slab_off,
                )
            };
        }
        cp_async::cp_async_commit_group();
        cp_async::cp_async_wait_group::<0>();
        wgmma::fence_proxy_async_shared();
        // SAFETY: the consumer warpgroups, converged.
        unsafe {
            if Form::<K>::WGS == 1 {
                sync::bar_sync_named::<BAR_OUT, CONSUMERS>();
            } else {
                sync::bar_sync_named::<BAR_Q, { 2 * CONSUMERS }>();
            }
        }
    }

    /// This consumer warpgroup's named barrier `ID` (the second consumer's is `ID +
    /// BAR_WG1`).
    ///
    /// # Safety
    /// The whole consumer warpgroup, converged.
    #[inline(always)]
    unsafe fn bar_wg<const ID: u32>(&self) {
        // SAFETY: forwarded from the caller.
        unsafe {
            if Form::<K>::WGS == 1 {
                sync::bar_sync_named::<ID, CONSUMERS>();
            } else {
                sync::bar_sync_id::<CONSUMERS>(ID + BAR_WG1 * self.cw);
            }
        }
    }

    /// Thread 0 frees the slab at `at` for the producer (predicated: no branch on the
    /// thread index between the `wgmma` waits).
    #[inline(always)]
    fn release(&self, at: Pos) {
        // SAFETY: an initialised mbarrier; this slab's reads are complete.
        unsafe { bulk::mbarrier_arrive_if(self.sm.free(at.slot), (self.tid == 0) as u32) };
    }

    /// S^T of the block whose first slab is at `at`: nine slabs, each after its own full
    /// barrier, four k-steps each; the rope slab is freed once S^T is done.
    ///
    /// # Safety
    /// Converged warpgroup; the producer issues this block's slabs at `at`.
    #[inline(always)]
    unsafe fn qk(&self, s: &mut [f32; 16], at: Pos, blk: u32) {
        if K::KV_FP8 {
            // SAFETY: forwarded from the caller.
            unsafe { self.qk_e4m3(s, at, blk) };
            return;
        }
        let sm = self.sm;
        // SAFETY: converged warps (forwarded).
        let at = unsafe { at.lane0() };
        let full0 = sm.full(at.slot) as u64;
        let da0 = wgmma::smem_desc(sm.slab(at.slot), 16, 1024, wgmma::Swizzle::B128);
        let db0 = wgmma::smem_desc(arch::opaque(sm.q()), 16, 1024, wgmma::Swizzle::B128);
        // SAFETY: forwarded from the caller; each slab is read once its copy landed.
        unsafe {
            wgmma::wgmma_fence();
            unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
                let (d, parity) = Self::step(at, j as u32);
                bulk::mbarrier_wait_parity_warp(Self::moved(full0, d, 8) as u32, parity);
                if K::KV_CP {
                    // `cp.async` wrote the slab through the generic proxy; `wgmma` reads
                    // through the async one.
                    wgmma::fence_proxy_async_shared();
                }
                let da = Self::moved(da0, d, SLAB >> 4);
                let db = db0 + ((j as u32 * Q_SLAB) >> 4) as u64;
                unroll!(kk in [0, 1, 2, 3] {
                    let k = 2 * kk as u64;
                    wgmma::wgmma_m64n32k16_bf16::<0>(s, da + k, db + k, j > 0 || kk > 0);
                });
            });
            wgmma::wgmma_commit_group();
            wgmma::wgmma_wait_group::<0>();
        }
        self.release(Self::pos(at, 8));
    }

    /// [`Consumer::qk`] with an fp8 cache: S^T from the block's raw slabs at `at` (raw ring)
    /// and the e4m3 Q, two `k32` steps a slab (each twice under bf16 Q: `hi`, then `lo`),
    /// and the block's V^T; then, after a warpgroup barrier, thread 0 frees the nine raw
    /// slabs.
    ///
    /// # Safety
    /// As [`Consumer::qk`].
    #[inline(always)]
    unsafe fn qk_e4m3(&self, s: &mut [f32; 16], at: Pos, blk: u32) {
        let sm = self.sm;
        // SAFETY: converged warps (forwarded).
        let at = unsafe { at.lane0() };
        // The block's nine slabs are contiguous in the raw ring (whole blocks, `at.slot` a
        // multiple of nine) and share a parity: every descriptor and barrier is one base
        // plus a constant, so the `wgmma` issue carries no per-slab address arithmetic.
        let (full, free) = (sm.raw_full(at.slot), sm.raw_free(at.slot));
        let da0 = wgmma::smem_desc(sm.raw(at.slot), 16, 512, wgmma::Swizzle::B64);
        let db0 = wgmma::smem_desc(arch::opaque(sm.q()), 16, 512, wgmma::Swizzle::B64);
        // SAFETY: forwarded from the caller; each slab is read once its copy landed.
        unsafe {
            // The ring holds three blocks, so the block these slots held before this one was
            // the other consumer's: until it has landed and been freed, the full barriers
            // may still be a phase behind, and a wait on this block's parity would pass on
            // that older phase. Its release is the phase the producer waited on before
            // issuing this block; one barrier tells, as a block's nine are freed together.
            bulk::mbarrier_wait_parity_warp(free, at.parity ^ 1);
            wgmma::wgmma_fence();
            unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
                bulk::mbarrier_wait_parity_warp(full + 8 * j as u32, at.parity);
                let da = da0 + ((j as u32 * RAW_SLAB) >> 4) as u64;
                let db = db0 + ((j as u32 * E4_Q_TILE) >> 4) as u64;
                let dl = db + (E4_Q_LO >> 4) as u64;
                unroll!(kk in [0, 1] {
                    let k = 2 * kk as u64;
                    wgmma::wgmma_m64n32k32_e4m3(s, da + k, db + k, j > 0 || kk > 0);
                    if !K::Q_FP8 {
                        wgmma::wgmma_m64n32k32_e4m3(s, da + k, dl + k, true);
                    }
                });
            });
            wgmma::wgmma_commit_group();
            // The block's V^T into this warpgroup's entry behind the S^T `wgmma`s (each warp
            // a quarter; the previous block's P.V, its last reader, is complete), tokens past
            // the end as zeros; the softmax's proxy fence and P barrier make it visible to
            // the P.V.
            let valid = self.len.saturating_sub(blk * BLOCK_N);
            let lane = self.tid % 32;
            let w = arch::opaque(self.tid) / 32;
            let (raw, vt) = (sm.raw(at.slot), sm.vt(self.cw));
            if valid >= BLOCK_N {
                transpose_vt_part::<false, true>(raw, vt, w, lane, BLOCK_N);
            } else {
                transpose_vt_part::<true, true>(raw, vt, w, lane, valid);
            }
            wgmma::wgmma_wait_group::<0>();
            // Every warp's transpose has read the slabs before thread 0 frees them.
            self.bar_wg::<BAR_MAX>();
            let first = (self.tid == 0) as u32;
            unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
                bulk::mbarrier_arrive_if(free + 8 * j as u32, first);
            });
            // Every part of the V^T is written (the barrier); the softmax's proxy fence and
            // P barrier order these writes before the P.V too.
            let (lo, hi) = decode::unseen_rows(self.p, self.len, blk);
            if lo < hi {
                e4m3::clean_vt(vt, self.tid, CONSUMERS);
            }
        }
    }

    /// V rows of block `blk` (slabs 0-7 at `at`) past the sequence end become zeros, and so
    /// do the NaN values of the rows only the step's later tokens see
    /// ([`decode::unseen_rows`]).
    #[inline(always)]
    fn zero_tail(&self, blk: u32, at: Pos) {
        let (first, valid) = decode::unseen_rows(self.p, self.len, blk);
        // With an fp8 cache the V^T transpose wrote those tokens as zeros, and `qk_e4m3`
        // cleans its V^T.
        if first < BLOCK_N && !K::KV_FP8 {
            let dst = |r: u32, ch: u32| {
                self.sm.slab(Self::pos(at, ch / 8).slot) + r * 128 + (((ch % 8) ^ (r % 8)) << 4)
            };
            // SAFETY: rows < 64, chunk < 8 of a slab of this block (landed; S^T done).
            unsafe {
                decode::clean_rows_16::<Bf16>((first, valid, BLOCK_N), self.tid, CONSUMERS, dst)
            };
        }
    }

    /// Each of this thread's eight row values `v` combined by `op` (identity `zero`) over
    /// the rows' 64 tokens: the lanes of a quad column (shuffles over `g`), then the four
    /// warps through the exchange (named barrier [`BAR_MAX`]; `FIRST`: the caller is the
    /// first consumer, its barrier named by constant, as in the epilogue only it runs).
    ///
    /// # Safety
    /// Converged warpgroup; the exchange's previous readers are past a later barrier.
    #[inline(always)]
    unsafe fn across_warpgroup<const FIRST: bool>(
        &self,
        mut v: [f32; 8],
        op: fn(f32, f32) -> f32,
        zero: f32,
    ) -> [f32; 8] {
        let (w, g, c) = self.wgc();
        let red = self.sm.red(self.cw);
        // SAFETY: forwarded from the caller; rows < 32 of the four warps' exchange.
        unsafe {
            unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7] {
                v[k] = op(v[k], sync::shfl_xor_f32(v[k], 4));
                v[k] = op(v[k], sync::shfl_xor_f32(v[k], 8));
                v[k] = op(v[k], sync::shfl_xor_f32(v[k], 16));
            });
            unroll!(j in [0, 1, 2, 3] {
                let at = red + w * 128 + (8 * j as u32 + 2 * c) * 4;
                smem::st_shared_f32_if(at, v[2 * j], (g == 0) as u32);
                smem::st_shared_f32_if(at + 4, v[2 * j + 1], (g == 0) as u32);
            });
            if FIRST {
                sync::bar_sync_named::<BAR_MAX, CONSUMERS>();
            } else {
                self.bar_wg::<BAR_MAX>();
            }
            unroll!(j in [0, 1, 2, 3] {
                let (mut a, mut b) = (zero, zero);
                unroll!(ww in [0, 1, 2, 3] {
                    let x = smem::ld_shared_u64(red + ww as u32 * 128 + (8 * j as u32 + 2 * c) * 4);
                    a = op(a, f32::from_bits(x as u32));
                    b = op(b, f32::from_bits((x >> 32) as u32));
                });
                v[2 * j] = a;
                v[2 * j + 1] = b;
            });
        }
        v
    }

    /// Block `blk`'s softmax (S^T in `s`, unscaled): masks keys past each row's visible
    /// end, the block's row maxima over the warpgroup, the running max and the factor for
    /// O and the exp-sums, P to shared memory.
    ///
    /// # Safety
    /// Converged warpgroup, after [`Consumer::qk`] (and the block's zeroing); the previous
    /// block's P.V is complete.
    #[inline(always)]
    unsafe fn softmax(&mut self, s: &mut [f32; 16], blk: u32) {
        let (w, g, c) = self.wgc();
        let tok0 = blk * BLOCK_N + 16 * w + g;
        // bf16 Q with an fp8 cache entered S^T scaled by each row's `up`: S^T times the
        // row's `1 / up` (a power of two, exact) first.
        if K::KV_FP8 && !K::Q_FP8 {
            unroll!(j in [0, 1, 2, 3] {
                // SAFETY: rows 8 j + 2 c, + 1 < 32 of the scales (written before the cell's
                // Q barrier).
                let x = unsafe { smem::ld_shared_u64(self.sm.q_scale() + 4 * Self::row(c, 2 * j as u32)) };
                unroll!(e in [0, 1, 2, 3] {
                    s[4 * j + e] *= f32::from_bits((x >> (32 * (e % 2))) as u32);
                });
            });
        }
        let mut mx = [f32::NEG_INFINITY; 8];
        if blk * BLOCK_N + BLOCK_N <= self.vis_min {
            unroll!(j in [0, 1, 2, 3] {
                unroll!(e in [0, 1, 2, 3] {
                    let k = 2 * j + e % 2;
                    mx[k] = sync::fmax(mx[k], s[4 * j + e]);
                });
            });
        } else {
            // A block some row sees only in part (the last ones): each row's visible
            // keys, recomputed here rather than held through the block loop.
            unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7] {
                let vis = decode::visible(self.p, self.len, self.glen, Self::row(c, k as u32));
                unroll!(h in [0, 1] {
                    let e = 2 * h + k % 2;
                    let x = if tok0 + 8 * (h as u32) < vis { s[4 * (k / 2) + e] } else { f32::NEG_INFINITY };
                    s[4 * (k / 2) + e] = x;
                    mx[k] = sync::fmax(mx[k], x);
                });
            });
        }
        // SAFETY: converged warpgroup; the previous block's readers of the exchange passed
        // its P barrier.
        let mx = unsafe { self.across_warpgroup::<false>(mx, sync::fmax, f32::NEG_INFINITY) };
        // The running max (scaled; the scale is positive) and the factor for what O and the
        // sums hold; O and the sums rescaled before P = exp2(S scale - m_ref) is formed
        // (fewer values live at once: O, S, the running maxima and sums, the factors).
        let mut f = [1.0f32; 8];
        let mut same = true;
        unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7] {
            let m_new = sync::fmax(self.m_run[k], mx[k] * self.scale);
            f[k] = sync::ex2(self.m_run[k] - m_ref_of(m_new));
            same &= f[k] == 1.0;
            self.m_run[k] = m_new;
            self.l[k] *= f[k];
        });
        // Warp-uniform (a ballot): no divergent branch before the `stmatrix` below.
        // SAFETY: converged warp.
        if unsafe { sync::ballot(!same) } != 0 {
            unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
                unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                    self.o[i][e] *= f[2 * (e / 4) + e % 2];
                });
            });
        }
        // e4m3 P against the row's max at 2^8 (the sums carry the same factor).
        let up = if K::KV_FP8 { e4m3::P_LOG2_SCALE } else { 0.0 };
        unroll!(j in [0, 1, 2, 3] {
            unroll!(e in [0, 1, 2, 3] {
                let k = 2 * j + e % 2;
                let pe = sync::ex2(sync::fma(s[4 * j + e], self.scale, up - m_ref_of(self.m_run[k])));
                s[4 * j + e] = pe;
                self.l[k] += pe;
            });
        });
        if K::KV_FP8 {
            self.store_p_e4m3(s, w, g, c);
        } else {
            self.store_p_bf16(s, w);
        }
        wgmma::fence_proxy_async_shared();
        // SAFETY: converged warpgroup.
        unsafe { self.bar_wg::<BAR_P>() };
    }

    /// P (bf16) as rows of 64 tokens (128-byte swizzle): matrix (j, h) of the stores holds
    /// tokens 16 w + 8 h .. + 8 of rows 8 j .. 8 j + 8.
    #[inline(always)]
    fn store_p_bf16(&self, s: &[f32; 16], w: u32) {
        let lane = self.tid % 32;
        let (mm, r) = (lane / 8, lane % 8);
        unroll!(x in [0, 1] {
            let (j, h) = (2 * x as u32 + mm / 2, mm % 2);
            let addr = self.sm.p(self.cw) + (8 * j + r) * 128 + (((2 * w + h) ^ r) << 4);
            let mut v = [0u32; 4];
            unroll!(m in [0, 1, 2, 3] {
                let (jj, hh) = (2 * x + m / 2, m % 2);
                v[m] = Bf16::pack2(s[4 * jj + 2 * hh], s[4 * jj + 2 * hh + 1]);
            });
            // SAFETY: rows < 32, chunks < 8 of the P tile; converged warp.
            unsafe { ldmatrix::stmatrix_x4_trans(addr, v) };
        });
    }

    /// P (e4m3) as rows of 64 bytes (64-byte swizzle) in V^T's token order (`wg::vt_token`'s):
    /// token `16 w + g` of a row sits at position `16 w + 4 (g / 2) + g % 2`, token `+ 8` two
    /// positions on, so lanes `g` and `g ^ 1` hold a row's four bytes at `16 w + 4 (g / 2)`.
    /// Each packs its two tokens per row, swaps half of its rows with the other (one
    /// shuffle), and stores four rows' words: even `g` rows `2 c + e` and `8 + 2 c + e`,
    /// odd `g` rows `16 + ..` and `24 + ..`.
    #[inline(always)]
    fn store_p_e4m3(&self, s: &[f32; 16], w: u32, g: u32, c: u32) {
        // Words of two rows (k = 2 m, 2 m + 1): per row its (token g, token g + 8) bytes.
        let pair = |j: usize| {
            cvt::pack_e4m3x2(s[4 * j], s[4 * j + 2])
                | cvt::pack_e4m3x2(s[4 * j + 1], s[4 * j + 3]) << 16
        };
        let wd = [pair(0), pair(1), pair(2), pair(3)];
        let odd = g % 2 == 1;
        let (mine, send) = if odd {
            ([wd[2], wd[3]], [wd[0], wd[1]])
        } else {
            ([wd[0], wd[1]], [wd[2], wd[3]])
        };
        // SAFETY: converged warp; the partner lane is `lane ^ 4` (g ^ 1, same c).
        let got = unsafe { sync::shfl_xor_u64(send[0] as u64 | (send[1] as u64) << 32, 4) };
        let theirs = [got as u32, (got >> 32) as u32];
        // Bytes of (mine, theirs): row a at 0-1 and 4-5, row b at 2-3 and 6-7 (token g, g + 8).
        let (sel_a, sel_b) = if odd {
            (0x1504, 0x3726)
        } else {
            (0x5140, 0x7362)
        };
        let ps = arch::opaque(self.sm.p(self.cw));
        let pos = 16 * w + 4 * (g / 2);
        let j0 = if odd { 2 } else { 0 };
        unroll!(m in [0, 1] {
            let row = 8 * (j0 + m as u32) + 2 * c;
            let (a, b) = (cvt::prmt(mine[m], theirs[m], sel_a), cvt::prmt(mine[m], theirs[m], sel_b));
            // SAFETY: rows < 32, bytes < 64 of the e4m3 P tile.
            unsafe {
                smem::st_shared_u32(ps + sw64_off(row, pos), a);
                smem::st_shared_u32(ps + sw64_off(row + 1, pos), b);
            }
        });
    }

    /// O^T += V^T P^T for the block at `at`: eight 64-dim tiles (slab `i` is tile `i`),
    /// committed two slabs a group; each pair of slabs is freed as its group completes.
    ///
    /// # Safety
    /// Converged warpgroup, after [`Consumer::softmax`].
    #[inline(always)]
    unsafe fn pv(&mut self, at: Pos) {
        let sm = self.sm;
        let p_s = arch::opaque(sm.p(self.cw));
        // SAFETY: converged warps (forwarded).
        let at = unsafe { at.lane0() };
        let da0 = wgmma::smem_desc(sm.slab(at.slot), SLAB, 1024, wgmma::Swizzle::B128);
        let db0 = wgmma::smem_desc(p_s, 16, 1024, wgmma::Swizzle::B128);
        // SAFETY: forwarded from the caller; the slabs landed (S^T waited for them).
        unsafe {
            wgmma::wgmma_fence();
            unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
                let v = Self::moved(da0, Self::step(at, i as u32).0, SLAB >> 4);
                unroll!(t in [0, 1, 2, 3] {
                    // Token step t: 16 rows of 128 bytes on (V), 32 bytes on (P).
                    let da = v + (t as u64) * ((16 * 128) >> 4);
                    let db = db0 + (t as u64) * (32 >> 4);
                    wgmma::wgmma_m64n32k16_bf16::<1>(&mut self.o[i], da, db, true);
                });
                if i % 2 == 1 {
                    wgmma::wgmma_commit_group();
                }
            });
            wgmma::wgmma_wait_group::<3>();
            self.release(at);
            self.release(Self::pos(at, 1));
            wgmma::wgmma_wait_group::<2>();
            self.release(Self::pos(at, 2));
            self.release(Self::pos(at, 3));
            wgmma::wgmma_wait_group::<1>();
            self.release(Self::pos(at, 4));
            self.release(Self::pos(at, 5));
            wgmma::wgmma_wait_group::<0>();
            self.release(Self::pos(at, 6));
            self.release(Self::pos(at, 7));
        }
    }

    /// [`Consumer::pv`] with an fp8 cache: O^T += V^T P^T from this warpgroup's V^T entry
    /// (written in [`Consumer::qk_e4m3`]): two `k32` steps per 64-dim tile.
    ///
    /// # Safety
    /// As [`Consumer::pv`].
    #[inline(always)]
    unsafe fn pv_e4m3(&mut self) {
        let sm = self.sm;
        // SAFETY: forwarded from the caller; the entry's writes passed the P barrier. The
        // warpgroup index from lane 0 keeps the descriptors in uniform registers.
        unsafe {
            let cw = uniform(self.cw);
            let p_s = arch::opaque(sm.p(cw));
            let da0 = wgmma::smem_desc(sm.vt(cw), 16, 512, wgmma::Swizzle::B64);
            let db = wgmma::smem_desc(p_s, 16, 512, wgmma::Swizzle::B64);
            wgmma::wgmma_fence();
            unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
                unroll!(kk in [0, 1] {
                    let k = 2 * kk as u64;
                    let da = da0 + ((i as u32 * RAW_SLAB) >> 4) as u64;
                    wgmma::wgmma_m64n32k32_e4m3(&mut self.o[i], da + k, db + k, true);
                });
            });
            wgmma::wgmma_commit_group();
            wgmma::wgmma_wait_group::<0>();
        }
    }

    /// The cell's rows: exp-sums over the warpgroup, then the output (one split) or the
    /// split's f32 partial and LSE.
    ///
    /// # Safety
    /// The (first) consumer warpgroup, converged, after the cell's last block (every `wgmma`
    /// complete; with two consumers, after [`Consumer::merge`]); the host sized out, lse and
    /// the workspace (validated).
    #[inline(always)]
    unsafe fn epilogue(&mut self) {
        let p = self.p;
        let (w, g, c) = self.wgc();
        let rows = p.s_q * p.heads;
        // SAFETY: converged warpgroup; every thread read the last block's maxima before
        // the block's P barrier.
        let l = unsafe { self.across_warpgroup::<true>(self.l, |x, y| x + y, 0.0) };
        let mut inv = [0.0f32; 8];
        let mut lse = [0.0f32; 8];
        // e4m3 P and the sums are 2^8 times the softmax's: the log-sum-exp takes that out.
        let up = if K::KV_FP8 { e4m3::P_LOG2_SCALE } else { 0.0 };
        unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7] {
            (inv[k], lse[k]) = decode::row_norm(l[k], self.m_run[k] - up);
        });
        let b = self.b;
        if self.nsplit == 1 {
            let stage = self.sm.q();
            let lane = self.tid % 32;
            let (mm, r) = (lane / 8, lane % 8);
            let sc = inv.map(|x| x * p.value_scale * p.output_scale);
            // SAFETY: the Q tile is free (every S^T is done: each warp passed the last
            // block's barriers); rows < 32 of 1024 bytes, chunks < 64, then 256 bytes of
            // offsets (36 KB of Q tile).
            unsafe {
                unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
                    unroll!(x in [0, 1] {
                        let (j, h) = (2 * x as u32 + mm / 2, mm % 2);
                        let ch = 8 * i as u32 + 2 * w + h;
                        let addr = decode::staged_chunk(stage, 8 * j + r, ch);
                        let mut v = [0u32; 4];
                        unroll!(m in [0, 1, 2, 3] {
                            let (jj, hh) = (2 * x + m / 2, m % 2);
                            let o = &self.o[i];
                            v[m] = Bf16::pack2(o[4 * jj + 2 * hh] * sc[2 * jj], o[4 * jj + 2 * hh + 1] * sc[2 * jj + 1]);
                        });
                        ldmatrix::stmatrix_x4_trans(addr, v);
                    });
                });
                // The rows' offsets in `out`, after the staged rows (in the Q tile's last
                // slab).
                let offs = stage + ROWS * 1024;
                if w == 0 && g == 0 {
                    unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7] {
                        let row = 8 * (k as u32 / 2) + 2 * c + (k as u32 % 2);
                        if row < rows {
                            *p.lse.ptr().add((b * rows + row) as usize) = lse[k];
                        }
                    });
                }
                let tid = self.tid;
                let end = rows.min(ROWS);
                if tid < end {
                    smem::st_shared_u64(offs + 8 * tid, decode::out_row(p, b, tid));
                }
                sync::bar_sync_named::<BAR_OUT, CONSUMERS>();
                decode::store_staged_rows(
                    p.out.ptr() as *mut u16,
                    stage,
                    offs,
                    (tid / 64, 2, end),
                    tid % 64,
                );
            }
        } else {
            let split = self.split;
            unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7] {
                let (j, e) = (k / 2, k % 2);
                let row = 8 * j as u32 + 2 * c + e as u32;
                if row < rows {
                    let part = split as usize * (p.batch * rows) as usize + (b * rows + row) as usize;
                    let scale = inv[k] * p.value_scale;
                    // SAFETY: split < max_splits, row < rows of sequence b < batch: inside
                    // the workspace the host sized; dims < 512.
                    unsafe {
                        let dst = p.partial_o.ptr().add(part * mla_abi::D_V + (16 * w + g) as usize);
                        unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
                            *dst.add(64 * i) = self.o[i][4 * j + e] * scale;
                            *dst.add(64 * i + 8) = self.o[i][4 * j + 2 + e] * scale;
                        });
                        if w == 0 && g == 0 {
                            *p.partial_lse.ptr().add(part) = lse[k];
                        }
                    }
                }
            });
        }
        // SAFETY: converged warpgroup: the staging (and the exchange) are read before the
        // next cell's Q lands there.
        unsafe { sync::bar_sync_named::<BAR_OUT, CONSUMERS>() };
    }

    /// The whole cell: Q, then per block S^T, softmax, P.V; the epilogue. `n_slabs`: as for
    /// [`produce`]. With two consumers (fp8 forms) each takes every other block (the
    /// second from `kb0 + 1`) and the second's rows are merged into the first's, which
    /// runs the epilogue. With an fp8 cache a consumer that runs more than
    /// [`PROMOTE_BLOCKS`] blocks of a cell moves O to the f32 scratch after every
    /// [`PROMOTE_BLOCKS`] and merges it back at the end.
    ///
    /// # Safety
    /// The consumer warpgroups, for every cell the producer runs, in the same order.
    #[inline(always)]
    unsafe fn run(&mut self, n_slabs: &mut u32, cell_no: u32) {
        let traced = cfg!(mla_trace) && !K::KV_FP8;
        let wgs = Form::<K>::WGS;
        let n0 = *n_slabs;
        let own = (self.kb1 - self.kb0 + wgs - 1 - self.cw) / wgs;
        let promotes = K::KV_FP8 && own > PROMOTE_BLOCKS;
        // SAFETY: forwarded from the caller.
        unsafe {
            self.load_q();
            if traced {
                trace::cell_stamp(self.p, cell_no, 1);
            }
            let mut blk = self.kb0 + self.cw;
            let mut done = 0u32;
            while blk < self.kb1 {
                // The block's first slab in the slab count every role keeps.
                let n = if wgs == 1 {
                    *n_slabs
                } else {
                    n0 + 9 * (blk - self.kb0)
                };
                let at = Pos::of(n, Form::<K>::COPY_SLOTS);
                let mut s = [0.0f32; 16];
                self.qk(&mut s, at, blk);
                self.zero_tail(blk, at);
                self.softmax(&mut s, blk);
                if K::KV_FP8 {
                    self.pv_e4m3();
                } else {
                    self.pv(at);
                }
                if wgs == 1 {
                    *n_slabs += 9;
                }
                blk += wgs;
                done += 1;
                if promotes && done.is_multiple_of(PROMOTE_BLOCKS) {
                    self.promote(done == PROMOTE_BLOCKS);
                }
            }
            *n_slabs = n0 + 9 * (self.kb1 - self.kb0);
            if traced {
                trace::cell_stamp(self.p, cell_no, 2);
            }
            if promotes {
                self.promote(false);
                unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
                    self.o[i] = self.ld_acc(i);
                });
            }
            if wgs > 1 {
                self.merge();
                if self.cw != 0 {
                    return;
                }
            }
            self.epilogue();
        }
    }

    /// Folds the second consumer's rows into the first's (two consumers, after both ran
    /// their blocks of the cell): its running maxima and exp-sum parts go through the P
    /// tiles (free: every P.V is done), its O through the Q tile (free: every S^T is done)
    /// four tiles at a time, and the first rescales both to the larger max. A thread's rows
    /// and dims are the same in both consumers, so each thread merges its own values. Both
    /// consumers run the same straight-line code (the second's stores predicated, its own
    /// merged values unused), so no barrier sits behind a branch.
    ///
    /// # Safety
    /// Both consumer warpgroups, converged, after their last block's P.V.
    #[inline(always)]
    unsafe fn merge(&mut self) {
        let (q, ml) = (self.sm.q(), self.sm.p(0));
        let tid = self.tid;
        let second = (self.cw != 0) as u32;
        // This thread's 16 bytes of quad `qd` of O tile `i % 4`: a warp's stores contiguous.
        let slot = |i: u32, qd: u32| q + ((4 * (i % 4) + qd) * CONSUMERS + tid) * 16;
        let at_m = |k: u32| ml + (k * CONSUMERS + tid) * 4;
        let at_l = |k: u32| ml + ((8 + k) * CONSUMERS + tid) * 4;
        // Per row of this thread: the factors for the first's and the second's values.
        let mut f = [[0.0f32; 8]; 2];
        // SAFETY: the offsets lie in the Q tile (4 x 4 x 128 x 16 bytes) and the P tiles
        // (16 x 128 x 4 bytes), asserted above; each step's writes are read after the
        // barrier that follows them and overwritten after the one that follows the reads.
        unsafe {
            unroll!(half in [0, 1] {
                sync::bar_sync_named::<BAR_MERGE, { 2 * CONSUMERS }>();
                if half == 0 {
                    unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7] {
                        smem::st_shared_f32_if(at_m(k as u32), self.m_run[k], second);
                        smem::st_shared_f32_if(at_l(k as u32), self.l[k], second);
                    });
                }
                unroll!(i in [0, 1, 2, 3] {
                    let o = &self.o[4 * half + i];
                    unroll!(qd in [0, 1, 2, 3] {
                        let v = [0, 1, 2, 3].map(|e| o[4 * qd + e].to_bits());
                        smem::st_shared_v4_if(slot(i as u32, qd as u32), v, second);
                    });
                });
                sync::bar_sync_named::<BAR_MERGE, { 2 * CONSUMERS }>();
                if half == 0 {
                    unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7] {
                        let m1 = smem::ld_shared_f32(at_m(k as u32));
                        let l1 = smem::ld_shared_f32(at_l(k as u32));
                        let m = sync::fmax(self.m_run[k], m1);
                        let r = m_ref_of(m);
                        f[0][k] = sync::ex2(self.m_run[k] - r);
                        f[1][k] = sync::ex2(m1 - r);
                        self.m_run[k] = m;
                        self.l[k] = self.l[k] * f[0][k] + l1 * f[1][k];
                    });
                }
                unroll!(i in [0, 1, 2, 3] {
                    let o = &mut self.o[4 * half + i];
                    unroll!(qd in [0, 1, 2, 3] {
                        let v = smem::ld_shared_v4(slot(i as u32, qd as u32));
                        unroll!(e in [0, 1, 2, 3] {
                            let k = 2 * qd + e % 2;
                            o[4 * qd + e] = sync::fma(f32::from_bits(v[e]), f[1][k], o[4 * qd + e] * f[0][k]);
                        });
                    });
                });
            });
        }
    }

    /// This thread's scratch slots ([`mla_abi::DecodeParams::acc`], this CTA's): O tile
    /// `i`'s four 16-byte quads at floats `4 ((4 i + q) * CONSUMERS + tid)`, then the rows'
    /// maxima at `32 * 4 * CONSUMERS + k * CONSUMERS + tid`, so a warp's accesses are
    /// contiguous.
    #[inline(always)]
    fn acc(&self) -> *mut f32 {
        let at = arch::block_idx_x() as usize * mla_abi::ACC_FLOATS_PER_CTA
            + self.cw as usize * ACC_PER_WG;
        // SAFETY: inside the launch's scratch (the host sizes it for grid.x CTAs, each
        // ACC_FLOATS_PER_CTA floats, enough for these slots).
        unsafe { self.p.acc.ptr().add(at) }
    }

    /// O tile `i` from this thread's scratch slots.
    #[inline(always)]
    fn ld_acc(&self, i: usize) -> [f32; 16] {
        let (acc, tid) = (self.acc(), arch::opaque(self.tid) as usize);
        let mut o = [0.0; 16];
        unroll!(q in [0, 1, 2, 3] {
            // SAFETY: this thread's slot of quad q of tile i.
            let v = unsafe { smem::ld_global_v4_f32(acc_quad(acc, tid, i, q)) };
            unroll!(e in [0, 1, 2, 3] {
                o[4 * q + e] = v[e];
            });
        });
        o
    }

    /// Moves O into the f32 scratch and restarts it at zero (`first`: the cell's first
    /// promotion): the e4m3 `wgmma` adds into O with about 13 bits below the largest addend,
    /// so a long split's O drifts; the scratch sums the partial O's in f32, each row against
    /// the max of its last promotion (stored beside it): read, rescaled to the running max,
    /// O added, written back.
    ///
    /// # Safety
    /// The consumer warpgroup after a block's P.V (every `wgmma` on O complete).
    #[inline(always)]
    unsafe fn promote(&mut self, first: bool) {
        let (acc, tid) = (self.acc(), arch::opaque(self.tid) as usize);
        let m_at = |k: usize| 32 * 4 * CONSUMERS as usize + k * CONSUMERS as usize + tid;
        // The factor taking the scratch's rows to the running max (at most one; zero for a
        // row that had seen nothing then: its scratch holds zeros).
        let mut f = [0.0f32; 8];
        if !first {
            unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7] {
                // SAFETY: this thread's own slot.
                let base = unsafe { *acc.add(m_at(k)) };
                f[k] = if base == f32::NEG_INFINITY { 0.0 } else { sync::ex2(base - self.m_run[k]) };
            });
        }
        unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7] {
            let mut o = self.o[i];
            if !first {
                let g = self.ld_acc(i);
                unroll!(e in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                    o[e] = sync::fma(g[e], f[2 * (e / 4) + e % 2], o[e]);
                });
            }
            unroll!(q in [0, 1, 2, 3] {
                let v = [o[4 * q], o[4 * q + 1], o[4 * q + 2], o[4 * q + 3]];
                // SAFETY: this thread's slot of quad q of tile i.
                unsafe { smem::st_global_v4_f32(acc_quad(acc, tid, i, q), v) };
            });
        });
        unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7] {
            // SAFETY: this thread's own slot.
            unsafe { *acc.add(m_at(k)) = self.m_run[k] };
        });
        self.o = [[0.0; 16]; 8];
    }
}

/// Thread `tid`'s slot of quad `q` (4 floats) of O tile `i` in the scratch at `acc`
/// ([`Consumer::acc`]'s layout).
#[inline(always)]
fn acc_quad(acc: *mut f32, tid: usize, i: usize, q: usize) -> *mut f32 {
    // SAFETY: inside that CTA's scratch (tile i < 8, quad q < 4, tid < CONSUMERS).
    unsafe { acc.add(4 * ((4 * i + q) * CONSUMERS as usize + tid)) }
}

/// The kernel body (see the module docs): a persistent CTA takes the cells of the virtual
/// grid `(row tiles, batch, persist_splits)` that are its own (`c, c + grid, ...`) and have
/// work, marked one bit per thread at a time; the consumer warpgroup (two with an fp8
/// cache, each walking the cells in its own loop after taking its registers) runs each
/// cell, the producer issues its copies.
///
/// # Safety
/// Launched with the threads of `K`'s layout (`TMA32_BF16`, `TMA32_FP8`, or with
/// `K::KV_CP` `TMA32_BF16_CP`), at most `tiles * batch * persist_splits` CTAs in x, and that
/// layout's `bytes` of dynamic shared memory on params the host validated (bf16 Q with a
/// bf16 or fp8 cache, or fp8 Q with an fp8 cache; at most `TMA32_ROWS` rows; pages of at
/// least `TMA_MIN_PAGE` tokens, or with `K::KV_CP` a fused bf16 cache of any page size;
/// `persist_splits >= 1`); `tmap` is the generic address of the cache's map as for
/// [`crate::decode::tma`] (not read with `K::KV_CP`).
#[inline(always)]
pub unsafe fn decode_tma32<K: DecodeKind<Mma = Bf16>>(p: DecodeParams, tmap: *const u8) {
    let tid = arch::thread_idx_x();
    let sm = Smem::<K>::new();
    // Trace builds only (`decode::trace`): the bf16 cache's phase stamps, by thread 0 (a
    // consumer thread), the "prologue" being the Q tile's load.
    let traced = cfg!(mla_trace) && !K::KV_FP8;
    let mut cell_no = 0u32;
    if traced {
        trace::begin(&p);
    }
    // SAFETY: thread 0 initialises every mbarrier before the CTA barrier below; the
    // producer prefetches the map.
    unsafe {
        if tid == 0 {
            let bars = 2 * (Form::<K>::SLOTS + Form::<K>::RAW_SLOTS);
            for k in 0..bars {
                // The `cp.async` form's full barriers: the producer warpgroup's arrivals.
                let count = if K::KV_CP && k < Form::<K>::SLOTS {
                    CP_PRODUCERS
                } else {
                    1
                };
                bulk::mbarrier_init(sm.full(0) + 8 * k, count);
            }
            bulk::fence_mbarrier_init();
        }
        if tid == Form::<K>::PRODUCER && !K::KV_CP {
            bulk::prefetch_tensormap(tmap);
        }
        // Unaligned CTA barriers in this kernel: the producer warp reaches them with lane
        // 0 back from its copies, possibly at another copy of the instruction.
        sync::bar_sync_unaligned();
    }
    // The slabs this CTA's cells have taken so far: each role's ring positions.
    let mut n_slabs = 0u32;
    // This CTA's cells with work, in the order every role walks them.
    macro_rules! cells {
        ($($body:tt)*) => {
            for_each_cell!(
                &p,
                Form::<K>::THREADS,
                sm.cells(),
                sync::bar_sync_unaligned,
                $($body)*
            )
        };
    }
    if Form::<K>::WGS > 1 {
        // SAFETY: as below; `setmaxnreg` by whole warpgroups (the consumers are warpgroups
        // 0-1), their limits summing to the launch's 384 x 168.
        unsafe {
            if tid < Form::<K>::PRODUCER {
                wgmma::setmaxnreg_inc::<REGS_CONSUMER>();
                cells!(|_, b, split, work| {
                    let mut cell = Consumer::<K>::new(&p, sm, &work, b, split);
                    cell.run(&mut n_slabs, 0);
                });
            } else {
                wgmma::setmaxnreg_dec::<REGS_SUPPORT>();
                cells!(|_, b, _, work| {
                    if tid == Form::<K>::PRODUCER {
                        produce(&p, tmap, sm, &work, b, &mut n_slabs);
                    }
                });
            }
        }
        return;
    }
    // SAFETY: every thread walks the same cells in the same order (`for_each_cell`): the
    // producer issues exactly the slabs the consumer reads.
    unsafe {
        cells!(|_, b, split, work| {
            if tid < CONSUMERS {
                if traced {
                    trace::cell_begin(&p, cell_no, b, work.kb1 - work.kb0);
                }
                let mut cell = Consumer::<K>::new(&p, sm, &work, b, split);
                cell.run(&mut n_slabs, cell_no);
                if traced {
                    trace::cell_end(&p, &mut cell_no);
                }
            } else if K::KV_CP {
                produce_cp(&p, sm, &work, b, &mut n_slabs);
            } else if tid == Form::<K>::PRODUCER {
                produce(&p, tmap, sm, &work, b, &mut n_slabs);
            }
        });
    }
}
