//! MLA decode over a paged latent KV cache: one file per kernel family, the helpers they
//! share here.
//!
//! - [`mma`]: the `mma.sync` kernel (64-row and 16-row tiles, sm_80+), described below.
//! - [`f8`]: the 16-row tile with an fp8 cache, converting in registers (sm_90a, sm_100a),
//!   and its 32-row form (sm_90a).
//! - [`wg`]: the 64-row `wgmma` kernel (sm_90a), [`tma`]: its TMA-fed bf16 form.
//! - [`reference`]: one CTA per query row, f32, for the `reference` backend.
//! - Here: page-table lookups, Q and KV row copies; in [`work`] the CTA's work
//!   ([`grid_cell_work`], [`cta_work`], the folded schedule, the checked mode's
//!   [`check_faults`]); in [`rows`] the row statistics and the row stores ([`write_rows`]).
//!
//! The `mma.sync` kernel:
//!
//! - Grid: `(ceil(s_q * heads / BM), batch, max_splits)` ([`grid_cell_work`]). CTA
//!   `(tile, b, split)` takes query rows `tile * BM .. +BM` of sequence `b` (row `r` is
//!   query token `r / heads`, head `r % heads`: S_q is folded into the rows) over KV chunk
//!   `split` of `num_splits[b]` (whole 64-token blocks, [`mla_abi::chunk_blocks`]). CTAs
//!   past `num_splits[b]` exit at once; a sequence with 0 splits (skipped by the schedule:
//!   no KV) is not computed or written.
//! - Block: 256 threads, 8 warps, arranged by the [`Layout`]: `RG` row groups of 16 rows
//!   (`BM = 16 RG`) times `CS` column splits. Warp `w` owns row group `rg = w % RG` and split
//!   `ch = w / RG`: for QK^T it computes tokens `ch * 64/CS .. +64/CS` of the block, for PV
//!   the output dims `ch * 512/CS .. +512/CS`. The `CS` warps of a row group exchange row
//!   maxima and probabilities through shared memory. [`M64`] (4 x 2: 128 accumulators per
//!   thread) is the default; [`M16`] (1 x 8: 32 accumulators) issues a quarter of the MMA
//!   work for `s_q * heads <= 16` (the memory-bound TP8 shapes).
//! - Shared memory (`decode_tile`), 64-row tile: Q tile 64 x 576 16-bit (72 KB), two KV
//!   stages of 64 x 576 16-bit (144 KB; for fp8 caches one converted tile + two raw fp8
//!   stages), the P tile 64 x 64 16-bit (8 KB), 512 B of row-max / row-sum exchange. 16-row
//!   tile with 16-bit caches: Q 16 x 576 (18 KB), a ring of five 32-token slots (180 KB), P,
//!   exchange (`SMEM_RING*`). 16-byte chunks of every row are XOR-swizzled by `row % 8` so
//!   `ldmatrix` is conflict-free. The 16-row tile with an fp8 cache runs this body only
//!   where the arch lacks the hardware fp8 conversion (sm_80); elsewhere
//!   [`f8`] (conversion in registers).
//! - Pipeline: every thread copies one KV row per issue with `cp.async`, its page looked up
//!   one issue ahead. Two stages: block `i + 1` is prefetched while block `i` is computed.
//!   Ring: one commit group per half-block; three half-blocks are in flight while a block
//!   (two slots) is computed.
//! - Reads [`DecodeParams`]; writes `out` + `lse` when the sequence has one split, else the
//!   partials (`partial_o`, `partial_lse`) for the combine kernel. Tokens past the visible
//!   range are never read (zero-filled by `cp.async` with a source size of 0) and are masked;
//!   a page id outside `0..num_pages` reads as zeros.

// The 16-row fp8 path where the build converts in hardware; the 32-row kernel of the
// sm_90a image always (sm_90a has the conversion whatever `MLA_HW_FP8` says).
#[cfg(any(mla_hw_fp8, mla_wgmma))]
pub mod f8;
pub mod mma;
pub mod reference;
mod rows;
#[cfg(mla_wgmma)]
pub mod tma;
#[cfg(mla_wgmma)]
pub mod tma32;
pub(crate) mod trace;
#[cfg(mla_wgmma)]
pub mod wg;
mod work;

pub use mma::decode;
pub(crate) use rows::{quad_max, quad_sum, red_max, red_sum, rescale_rows, write_rows};
// The exchange reductions over any writer count and the row normalisation: for `f8`.
#[cfg(any(mla_hw_fp8, mla_wgmma))]
pub(crate) use rows::{red_max_of, red_sum_of, row_norm};
pub(crate) use work::{
    CtaWork, cell_busy, check_faults, cta_work, fold_total, grid_cell_work, list_cost, list_find,
    list_piece, list_share, list_sums, list_work, visible,
};

use crate::arch::{self, cp_async, cvt, ldmatrix, smem, sync};
use crate::elem::Half16;
use mla_abi::{D_QK, D_V, DecodeParams, decode_tile as T};

const LOG2E: f32 = core::f32::consts::LOG2_E;
const LN2: f32 = core::f32::consts::LN_2;
/// 16-byte chunks per 16-bit row of D_QK values.
const ROW_CHUNKS: u32 = (D_QK * 2 / 16) as u32;
const ROW_BYTES: u32 = (D_QK * 2) as u32;
/// 16-byte chunks per fp8 row.
const FP8_ROW_CHUNKS: u32 = (D_QK / 16) as u32;
const THREADS: u32 = T::THREADS as u32;
const BLOCK_N: u32 = T::BLOCK_N as u32;
/// Most 8-column output tiles a warp owns (M64: 256 dims); the arrays are this size and
/// smaller layouts use a prefix (the rest is dead code to the compiler).
const O_TILES_MAX: usize = D_V / 2 / 8;

/// How the 8 warps of a CTA share the rows, tokens and output dims.
pub trait Layout {
    /// 16-row groups per CTA.
    const RG: u32;
    /// Warps per row group (column splits).
    const CS: u32;
    /// Rows per CTA.
    const BM: u32 = 16 * Self::RG;
    /// 8-token S tiles per warp.
    const S_TILES: usize = (BLOCK_N / Self::CS / 8) as usize;
    /// 8-dim output tiles per warp.
    const O_TILES: usize = D_V / Self::CS as usize / 8;
    /// Streams 16-bit caches through the half-block ring (`decode_tile::SMEM_RING*`)
    /// instead of two full stages; needs the small Q tile (16 rows) to fit.
    const RING: bool = false;
}

/// 64 rows: 4 row groups x 2 column halves.
pub struct M64;
impl Layout for M64 {
    const RG: u32 = 4;
    const CS: u32 = 2;
}

/// 16 rows: 1 row group x 8 column splits.
pub struct M16;
impl Layout for M16 {
    const RG: u32 = 1;
    const CS: u32 = 8;
    const RING: bool = true;
}

const _: () = assert!(M64::RG * M64::CS == T::WARPS as u32 && M64::BM == T::BLOCK_M as u32);
const _: () = assert!(M16::RG * M16::CS == T::WARPS as u32 && M16::BM == T::BLOCK_M_SMALL as u32);
const _: () = assert!(M64::O_TILES == O_TILES_MAX && M64::S_TILES == 4 && M16::S_TILES == 1);

/// What a decode kernel instantiation computes with.
pub trait DecodeKind {
    /// The tensor-core operand type (Q, K, P, V in shared memory) and the output type.
    type Mma: Half16;
    /// Queries are fp8 e4m3 (converted to `Mma` while loading).
    const Q_FP8: bool;
    /// The cache is fp8 e4m3 (converted to `Mma` after each stage lands).
    const KV_FP8: bool;
    /// The TMA decodes copy the cache with `cp.async`, row by row from the page table,
    /// instead of tensor-map boxes (`tma32`'s producer warpgroup, `produce_cp`; the 64-row
    /// decode's warpgroup 0, `tma::cp`): pages of any size. Only those decodes read it.
    const KV_CP: bool = false;
    /// The 64-row TMA decode walks the work list (`DecodeParams::list_fixed`) instead of
    /// the schedule's cells (`names::DECODE_TMA_*_LIST`). Only that decode reads it.
    const LIST: bool = false;
}

/// The rows of KV block `kb` (tokens `64 kb ..`) that hold a key some query row of the step
/// may not see although a later one does: `first..valid`, where `valid` is the block's
/// rows below `len` and `first` the first at or past `len - (s_q - 1)` (empty at `s_q = 1`).
/// Sharded, `len` is the rank's and the range covers its last `s_q - 1` keys, a superset.
///
/// Why: P.V multiplies a row's zero weights (keys it does not see) by the values, and a NaN
/// value times zero is NaN. A NaN in a key's latent part is also in its value (V is K's
/// first 512 dims), so every row that sees the key has a NaN logit and a NaN weight already:
/// replacing those values with zeros between S and P.V leaves every result as exact, and
/// the step's earlier tokens, which do not see the key, keep theirs.
#[inline(always)]
pub(crate) fn unseen_rows(p: &DecodeParams, len: u32, kb: u32) -> (u32, u32) {
    let base = kb * BLOCK_N;
    let valid = len.saturating_sub(base).min(BLOCK_N);
    let first = len
        .saturating_sub(p.s_q.saturating_sub(1))
        .saturating_sub(base)
        .min(valid);
    (first, valid)
}

/// Eight 16-bit values with each NaN replaced by +0 (infinities kept).
#[inline(always)]
pub(crate) fn nan_to_zero_16<H: Half16>(v: [u32; 4]) -> [u32; 4] {
    v.map(|w| {
        let lo = if (w & 0x7fff) > H::INF_BITS {
            0
        } else {
            0xffff
        };
        let hi = if ((w >> 16) & 0x7fff) > H::INF_BITS {
            0
        } else {
            0xffff_0000
        };
        w & (lo | hi)
    })
}

/// Sixteen e4m3 bytes with each NaN (`0x7f`, `0xff`) replaced by +0.
#[inline(always)]
pub(crate) fn nan_to_zero_e4m3(v: [u32; 4]) -> [u32; 4] {
    v.map(|w| {
        // Per byte: bit 7 of (low seven bits + 1) is set exactly when they are all ones; no
        // carry crosses a byte.
        let nan = ((w & 0x7f7f_7f7f) + 0x0101_0101) & 0x8080_8080;
        w & !((nan >> 7) * 0xff)
    })
}

/// Replaces the NaN values in rows `first..valid` of a swizzled tile of D_QK-wide 16-bit
/// rows (the `mma.sync` kernels' layout, [`qk_off`]; tokens `0..32` at `lo`, `32..64` at
/// `hi`) with zeros, latent dims only (the values); thread `tid` of `threads` takes every
/// `threads`-th chunk. Rolled: cold code beside the block loop.
///
/// # Safety
/// The rows are in the tile, no thread still reads them as keys, and none reads them as
/// values before a barrier after this.
#[inline(always)]
pub(crate) unsafe fn clean_unseen_rows<H: Half16>(
    (first, valid): (u32, u32),
    lo: u32,
    hi: u32,
    tid: u32,
    threads: u32,
) {
    let at = |r: u32, k: u32| {
        if r < BLOCK_N / 2 {
            lo + qk_off(r, k)
        } else {
            hi + qk_off(r - BLOCK_N / 2, k)
        }
    };
    // SAFETY: forwarded from the caller; the latent chunks (the swizzle keeps chunk groups
    // of 8) of rows < 64.
    unsafe { clean_rows_16::<H>((first, valid, valid), tid, threads, at) };
}

/// Rows `first..end` of a tile of 16-bit rows whose 16-byte chunk `k < 64` (the latent
/// dims) of row `r` sits at `at(r, k)`: in rows below `valid` each NaN replaced by zero,
/// rows from `valid` on (past the sequence end) all zeros; thread `tid` of `threads` takes
/// every `threads`-th chunk. Rolled: cold code beside the block loops (four unrolled copies
/// inside a pair loop cost instruction fetch around it).
///
/// # Safety
/// `first <= valid` and `first <= end <= 64`; `at` addresses shared memory of the tile for
/// rows `< 64`; no thread still reads the rows as keys, and none reads them as values
/// before a barrier (and, for `wgmma`, the writers' `fence.proxy.async`) after this.
#[inline(always)]
pub(crate) unsafe fn clean_rows_16<H: Half16>(
    (first, valid, end): (u32, u32, u32),
    tid: u32,
    threads: u32,
    at: impl Fn(u32, u32) -> u32,
) {
    let mut i = tid;
    while i < (end - first) * 64 {
        let r = first + i / 64;
        let a = at(r, i % 64);
        // SAFETY: forwarded from the caller.
        unsafe {
            arch::no_unroll();
            let v = if r < valid {
                nan_to_zero_16::<H>(smem::ld_shared_v4(a))
            } else {
                [0; 4]
            };
            smem::st_shared_v4(a, v);
        }
        i += threads;
    }
}

/// Byte offset of 16-byte chunk `k` of row `r` in a swizzled tile of D_QK-wide rows.
#[inline(always)]
fn qk_off(r: u32, k: u32) -> u32 {
    r * ROW_BYTES + ((k ^ (r & 7)) << 4)
}

/// Byte offset of chunk `k` (0..8) of row `r` of the swizzled 64-wide P tile.
#[inline(always)]
fn p_off(r: u32, k: u32) -> u32 {
    r * (BLOCK_N * 2) + ((k ^ (r & 7)) << 4)
}

/// The page-table entry of KV row `j` of sequence `b` as stored (`-1` past `len`), not yet
/// checked: the issue checks it ([`checked_page`]), so the load's latency stays off the
/// path between the lookup and the issue.
#[inline(always)]
pub(crate) fn kv_row_page_entry(p: &DecodeParams, b: u32, j: u32, len: u32) -> i32 {
    if j >= len {
        return -1;
    }
    // SAFETY: j < len, clamped by the caller to max_pages * page_size.
    unsafe { *page_entry_ptr(p, b, j) }
}

/// Address of the page-table entry of KV row `j` of sequence `b`.
///
/// # Safety
/// `j < max_pages * page_size` (the caller's `len`, clamped), so the entry is inside row
/// `b` of the page table.
#[inline(always)]
pub(crate) unsafe fn page_entry_ptr(p: &DecodeParams, b: u32, j: u32) -> *const i32 {
    let slot = b as usize * p.page_table_stride as usize + (j >> p.page_shift) as usize;
    // SAFETY: forwarded from the caller.
    unsafe { p.page_table.ptr().add(slot) }
}

/// The page a page-table entry names, or -1 when the row must not be read (past `len`, or
/// an entry outside `0..num_pages`).
#[inline(always)]
pub(crate) fn checked_page(p: &DecodeParams, entry: i32) -> i32 {
    if entry < 0 || entry as u32 >= p.num_pages {
        -1
    } else {
        entry
    }
}

/// 16-byte chunks of the latent part (`D_V` dims) of a cache or q row of `elem_bytes`
/// elements: 64 (16-bit) or 32 (fp8). Chunks from here on are the rope part.
pub(crate) const fn main_chunks(elem_bytes: u64) -> u32 {
    (D_V as u64 * elem_bytes / 16) as u32
}

/// Where the `cp.async` copies of a KV row read: chunk `k` (16 bytes) of the row at
/// `main + 16 k` for `k < main_chunks`, at `rope + 16 (k - main_chunks)` after (the fused
/// cache's row continues there; a split cache's rope tensor holds it), and `n` bytes of
/// each (16; 0 for a row that must not be read: both addresses are then the cache's first
/// row, valid and unread, and the copy zero-fills).
#[derive(Clone, Copy)]
pub(crate) struct RowSrc {
    pub main: *const u8,
    pub rope: *const u8,
    pub n: u32,
}

impl RowSrc {
    /// The address of chunk `k`, which the caller knows to be latent (`k < main_chunks`)
    /// or not.
    #[inline(always)]
    pub(crate) fn part(self, latent: bool, k: u32, main_chunks: u32) -> *const u8 {
        if self.n == 0 {
            self.main
        } else if latent {
            // SAFETY: chunk k of the latent part of a valid row.
            unsafe { self.main.add((k << 4) as usize) }
        } else {
            // SAFETY: chunk k - main_chunks of the rope part of a valid row.
            unsafe { self.rope.add(((k - main_chunks) << 4) as usize) }
        }
    }
}

/// [`RowSrc`] of KV row `j` (`entry`: its page-table entry).
#[inline(always)]
pub(crate) fn kv_row_source(p: &DecodeParams, entry: i32, j: u32, elem_bytes: u64) -> RowSrc {
    let page = checked_page(p, entry);
    let base = p.kv_cache.ptr() as *const u8;
    if page < 0 {
        return RowSrc {
            main: base,
            rope: base,
            n: 0,
        };
    }
    let t = (j & (p.page_size - 1)) as u64;
    let off = page as u64 * p.kv_stride_page + t * p.kv_stride_token;
    let off_pe = page as u64 * p.kpe_stride_page + t * p.kpe_stride_token;
    // SAFETY: 0 <= page < num_pages (checked_page) and t < page_size: rows inside the cache
    // and its rope part (validated).
    unsafe {
        RowSrc {
            main: base.add((off * elem_bytes) as usize),
            rope: (p.kpe.ptr() as *const u8).add((off_pe * elem_bytes) as usize),
            n: 16,
        }
    }
}

/// Threads per KV row when issuing a full block (`BLOCK_N` rows) or a ring half-block
/// (`HALF_N` rows): thread `t` copies row `t / TPR`, chunks `t % TPR + TPR * i`, so it looks
/// up one page per issue.
const KV_TPR: u32 = THREADS / BLOCK_N;
const HALF_N: u32 = T::HALF_N as u32;
const HALF_TPR: u32 = THREADS / HALF_N;
const RING_SLOTS: u32 = T::RING_SLOTS as u32;
/// Half-blocks in flight while a block (two slots) is computed; the prologue issues as many.
const RING_AHEAD: u32 = RING_SLOTS - 2;
const _: () = assert!(RING_AHEAD >= 2 && RING_AHEAD <= 4);
const HALF_TILE_BYTES: u32 = T::HALF_TILE_BYTES as u32;
const _: () = assert!(KV_TPR * BLOCK_N == THREADS && ROW_CHUNKS.is_multiple_of(KV_TPR));
const _: () = assert!(FP8_ROW_CHUNKS.is_multiple_of(KV_TPR));
const _: () = assert!(HALF_TPR * HALF_N == THREADS && ROW_CHUNKS.is_multiple_of(HALF_TPR));

/// Loads the CTA's `BM` query rows into the Q tile, chunk `k` of row `r` at `tile_off(r, k)`
/// (zeros past the last row); fp8 Q widens exactly to `H` as it loads (16-bit Q is copied
/// as it is, and `H` is unused). Every thread of the CTA: [`load_q_rows`] over `THREADS`.
#[inline(always)]
pub(crate) unsafe fn load_q_tile<K: DecodeKind, L: Layout, H: Half16>(
    p: &DecodeParams,
    b: u32,
    row0: u32,
    q_smem: u32,
    tile_off: fn(u32, u32) -> u32,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        load_q_rows::<K, H>(
            p,
            b,
            (row0, L::BM),
            (arch::thread_idx_x(), THREADS),
            q_smem,
            tile_off,
        )
    };
}

/// Loads query rows `row0 .. row0 + bm` of sequence `b` (zeros past the last row) with the
/// `threads` threads `tid < threads` (a multiple of `bm`): chunk `k` (8 dims) of row `r` at
/// `q_smem + tile_off(r, k)`, the latent chunks from `q`, the rope chunks from `q_pe`; fp8
/// Q widened exactly to `H` (16-bit Q copied by `cp.async`, left uncommitted). Thread `t`
/// takes row `t / (threads / bm)` and every `threads / bm`-th chunk of it, so the row's
/// address (a division by the head count, three 64-bit products) is computed once per
/// thread, not once per chunk: per chunk, that arithmetic made the Q load a tenth of a
/// short cell's stall samples (Nsight Compute).
///
/// # Safety
/// `q_smem + tile_off(r, k)` is a 16-byte aligned address of the tile for `r < bm`,
/// `k < ROW_CHUNKS`; `b < batch` of params the host validated.
#[inline(always)]
pub(crate) unsafe fn load_q_rows<K: DecodeKind, H: Half16>(
    p: &DecodeParams,
    b: u32,
    (row0, bm): (u32, u32),
    (tid, threads): (u32, u32),
    q_smem: u32,
    tile_off: impl Fn(u32, u32) -> u32,
) {
    let tpr = threads / bm;
    let (r, k0) = (tid / tpr, tid % tpr);
    let gr = row0 + r;
    // Bytes per element of Q: chunk `k` of a part starts `8 k` elements into its row.
    let es: usize = if K::Q_FP8 { 1 } else { 2 };
    // The row's latent and rope parts; `None` past the last row (and for threads past the
    // tile's rows, which a `threads` that is a multiple of `bm` does not have).
    let src = (gr < p.s_q * p.heads && r < bm).then(|| {
        let (t, h) = ((gr / p.heads) as u64, (gr % p.heads) as u64);
        // SAFETY: the row offsets of a validated q and q_pe row.
        unsafe {
            (
                (p.q.ptr() as *const u8).add(es * p.q_row(b as u64, t, h) as usize),
                (p.q_pe.ptr() as *const u8).add(es * p.q_pe_row(b as u64, t, h) as usize),
            )
        }
    });
    // Chunk k of the row (k < ROW_CHUNKS), when the row exists.
    let chunk = |k: u32| {
        src.map(|(q, q_pe)| {
            // SAFETY: chunk k of the row's part lies inside it (64 latent chunks of 8
            // dims, then 8 rope chunks).
            unsafe {
                if k < 64 {
                    q.add(8 * es * k as usize)
                } else {
                    q_pe.add(8 * es * (k - 64) as usize)
                }
            }
        })
    };
    if r >= bm {
        return;
    }
    if K::Q_FP8 {
        // 8 fp8 values -> 8 16-bit values (one 16-byte chunk). The loads go out a batch at
        // a time before any conversion: loaded and stored one by one, each chunk cost a
        // global load's latency.
        const BATCH: u32 = 3;
        let mut k = k0;
        while k < ROW_CHUNKS {
            let mut raw = [[0u32; 2]; BATCH as usize];
            unroll!(i in [0, 1, 2] {
                let kk = k + i as u32 * tpr;
                if kk < ROW_CHUNKS && let Some(at) = chunk(kk) {
                    // SAFETY: 8 bytes of the row's part, 8-byte aligned.
                    raw[i] = unsafe { *(at as *const [u32; 2]) };
                }
            });
            unroll!(i in [0, 1, 2] {
                let kk = k + i as u32 * tpr;
                if kk < ROW_CHUNKS {
                    // SAFETY: a 16-byte aligned address inside the tile; zeros past the
                    // last row (e4m3 zero widens to zero).
                    unsafe { smem::st_shared_v4(q_smem + tile_off(r, kk), fp8x8_to_half::<H>(raw[i])) };
                }
            });
            k += BATCH * tpr;
        }
    } else {
        // Evict-first in L2, as the KV boxes and FlashMLA's Q: a Q line taken with the
        // normal policy evicts a normal line, which after a kernel that left L2 dirty (a
        // producer, the harness's zeroing flush) is a write-back competing with the
        // prologue's reads. The split CTAs of a row tile read its Q at about the same time,
        // so they still meet it in L2. (The e4m3 decodes' Q paths keep the normal policy:
        // there it measured 0.86-1.00x the speed, bf16 Q split into parts reading its rows
        // twice.)
        let policy = cp_async::l2_evict_first();
        let mut k = k0;
        while k < ROW_CHUNKS {
            let (at, n) = match chunk(k) {
                Some(at) => (at, 16),
                None => (p.q.ptr() as *const u8, 0),
            };
            // SAFETY: the destination inside the tile; the source is a 16-byte aligned
            // chunk of a validated row when n == 16, unread when n == 0 (zero fill).
            unsafe { cp_async::cp_async_cg_16_hint(q_smem + tile_off(r, k), at, n, policy) };
            k += tpr;
        }
    }
}

/// Element offset in `out` of sequence `b`'s output row `gr` (`t * heads + h`).
#[cfg(mla_wgmma)]
#[inline(always)]
pub(crate) fn out_row(p: &DecodeParams, b: u32, gr: u32) -> u64 {
    let (t, h) = (gr / p.heads, gr % p.heads);
    b as u64 * p.out_stride_b + t as u64 * p.out_stride_s + h as u64 * p.out_stride_h
}

/// `|x|`, as bits (one `abs.f32`, which ptxas folds into a max's operand).
#[cfg(mla_wgmma)]
#[inline(always)]
pub(crate) fn fabs(x: f32) -> f32 {
    f32::from_bits(x.to_bits() & 0x7fff_ffff)
}

/// The byte address of 16-byte chunk `ch` of row `r` in an output staging tile:
/// rows of 1024 bytes (512 16-bit dims), chunk `ch` at `ch ^ (r % 8)`, so that the eight rows
/// of a fragment store fall in distinct banks.
#[cfg(mla_wgmma)]
#[inline(always)]
pub(crate) fn staged_chunk(stage: u32, r: u32, ch: u32) -> u32 {
    stage + r * 1024 + ((ch ^ (r % 8)) << 4)
}

/// Writes a staged output tile ([`staged_chunk`]) out: this thread's chunk `ch` of staged
/// rows `first, first + step, ...` below `end` (sixteen at most), staged row `r` going to
/// 16-bit element offset `offs[r]` of `dst` (the u64 at `offs + 8 r`: [`out_row`] of
/// `out`, or a workspace slot, which the kernel writes beside the staging once per row),
/// one 16-byte store per chunk (validation keeps `out`'s base and strides 16-byte aligned,
/// `CHUNK_ALIGN`; the workspace's slots are 2 KB). With each
/// row's division and three 64-bit products at its store, the sixteen unrolled stores were
/// about 900 instructions run once per cell from a cold instruction cache (Nsight Compute:
/// a quarter of a short cell's stall samples, most of them `no_inst`); with the table they
/// are about 150.
///
/// # Safety
/// The staged rows and offsets below `end` are written and visible to this thread (a
/// barrier after the stores); `end <= first + 16 step`; each offset starts 512 16-bit
/// elements of `dst` (a row of the validated `out`, or a sized workspace slot), 16-byte
/// aligned; `ch < 64`.
#[cfg(mla_wgmma)]
#[inline(always)]
pub(crate) unsafe fn store_staged_rows(
    dst: *mut u16,
    stage: u32,
    offs: u32,
    (first, step, end): (u32, u32, u32),
    ch: u32,
) {
    unroll!(pass in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
        let r = first + step * pass as u32;
        if r < end {
            // SAFETY: forwarded from the caller; r < end.
            unsafe {
                let v = smem::ld_shared_v4(staged_chunk(stage, r, ch));
                let off = smem::ld_shared_u64(offs + 8 * r) + 8 * ch as u64;
                smem::st_global_v4(dst.add(off as usize) as *mut u8, v);
            }
        }
    });
}

/// Issues the `cp.async` copies of this thread's row of the KV rows starting at token `n0`
/// (`THREADS / TPR` rows: a full block or a ring half-block) into a stage: the swizzled
/// 16-bit tile ([`qk_off`]), or for fp8 caches the raw staging buffer (rows of 576 bytes,
/// unswizzled). `entry` is the row's page-table entry from [`kv_row_page_entry`], loaded one
/// issue ahead so its latency is not on the issue path.
#[inline(always)]
pub(crate) unsafe fn issue_kv_row<K: DecodeKind, const TPR: u32>(
    p: &DecodeParams,
    entry: i32,
    n0: u32,
    stage: u32,
) {
    let r = arch::thread_idx_x() / TPR;
    let k0 = arch::thread_idx_x() % TPR;
    let j = n0 + r;
    let (chunks_per_row, elem) = if K::KV_FP8 {
        (FP8_ROW_CHUNKS, 1)
    } else {
        (ROW_CHUNKS, 2)
    };
    let src = kv_row_source(p, entry, j, elem);
    let n = src.n;
    let main = main_chunks(elem);
    // KV is streamed: evict-first keeps it from pushing out what is reused in L2.
    let policy = cp_async::l2_evict_first();
    // The swizzle only permutes chunks within 8-chunk groups, so this thread's chunks
    // k0 + TPR i take at most two swizzled offsets (TPR = 4: k % 8 alternates between k0
    // and k0 + 4; TPR a multiple of 8: k % 8 = k0): a base per phase plus whole 128-byte
    // groups, with no swizzle arithmetic per chunk.
    const { assert!(TPR.is_multiple_of(8) || TPR == 4) };
    const { assert!(ROW_CHUNKS.is_multiple_of(TPR)) };
    let phases = if TPR >= 8 { 1 } else { 8 / TPR };
    let group_step = (TPR * phases / 8) * 128;
    let bases = [stage + qk_off(r, k0), stage + qk_off(r, k0 + TPR)];
    // TPR divides the latent chunks, so chunk k0 + TPR i is latent exactly for
    // i < main / TPR.
    const { assert!((ROW_CHUNKS - 8).is_multiple_of(TPR) && (FP8_ROW_CHUNKS - 4).is_multiple_of(TPR)) };
    // Unrolled: at most 18 chunks per thread (TPR >= 4); later ones are past the row.
    unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17] {
        let i = i as u32;
        let k = k0 + TPR * i;
        if k < chunks_per_row {
            let dst = if K::KV_FP8 {
                stage + r * D_QK as u32 + (k << 4)
            } else {
                bases[(i % phases) as usize] + (i / phases) * group_step
            };
            let s = src.part(i < main / TPR, k, main);
            // SAFETY: dst inside the stage; when n == 16, s is chunk k of a cache row that
            // checked_page bounds-checked; unread when n == 0.
            unsafe { cp_async::cp_async_cg_16_hint(dst, s, n, policy) };
        }
    });
}

/// The largest magnitude, as bf16 bits with the sign cleared, of `m` and the two bf16
/// values of word `w` (a row's scan for [`f16_row_scale`]).
#[inline(always)]
pub(crate) fn bf16x2_max_mag(m: u32, w: u32) -> u32 {
    m.max(w & 0x7fff).max((w >> 16) & 0x7fff)
}

/// The powers of two `(up, down)`, `down = 1 / up`, that put a bf16 row whose largest
/// magnitude has bits `m` ([`bf16x2_max_mag`]) in `[2^e, 2^(e + 1))` once scaled up (the
/// shift clamped to `2^+-100`). A row of zeros keeps `(1, 1)`.
#[inline(always)]
pub(crate) fn pow2_row_scale(m: u32, e: i32) -> (f32, f32) {
    let s = if m == 0 {
        0
    } else {
        (e - ((m >> 7) as i32 - 127)).clamp(-100, 100)
    };
    (
        f32::from_bits(((127 + s) as u32) << 23),
        f32::from_bits(((127 - s) as u32) << 23),
    )
}

/// [`pow2_row_scale`] into `[2^14, 2^15)`: the row then converts to f16 exactly down to
/// `2^-17` of that magnitude.
#[inline(always)]
pub(crate) fn f16_row_scale(m: u32) -> (f32, f32) {
    pow2_row_scale(m, 14)
}

/// The two bf16 values of word `w` times `up`, as two f16 values.
#[inline(always)]
pub(crate) fn bf16x2_to_f16x2_scaled(w: u32, up: f32) -> u32 {
    let lo = f32::from_bits(w << 16) * up;
    let hi = f32::from_bits(w & 0xffff_0000) * up;
    cvt::pack_f16x2(lo, hi)
}

/// Eight fp8 e4m3 values (two little-endian words) to eight 16-bit values, exactly.
#[inline(always)]
pub(crate) fn fp8x8_to_half<H: Half16>(raw: [u32; 2]) -> [u32; 4] {
    let mut o = [0u32; 4];
    unroll!(i in [0, 1, 2, 3] {
        let (lo, hi) = cvt::e4m3x2_to_f32x2(raw[i / 2] >> (16 * (i % 2)));
        o[i] = H::pack2(lo, hi);
    });
    o
}
