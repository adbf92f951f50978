//! MLA decode over a paged latent KV cache: one file per kernel family, the helpers they
//! share here.
//!
//! - [`mma`]: the `mma.sync` kernel (64-row and 16-row tiles, sm_80+), described below.
//! - [`f8`]: the 16-row tile with an fp8 cache, converting in registers (sm_90a, sm_100a),
//!   and its 32-row form (sm_90a).
//! - [`wg`]: the 64-row `wgmma` kernel (sm_90a), [`tma`]: its TMA-fed bf16 form.
//! - [`reference`]: one CTA per query row, f32, for the `reference` backend.
//! - Here: the CTA's work ([`cta_coords`], [`cta_work`], the folded schedule, the checked
//!   mode's [`check_faults`]), page-table lookups, Q and KV row copies, the row statistics.
//!
//! The `mma.sync` kernel:
//!
//! - Grid: `(ceil(s_q * heads / BM), batch, max_splits)` ([`cta_coords`]). CTA
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
#[cfg(mla_wgmma)]
pub mod tma;
#[cfg(mla_wgmma)]
pub mod wg;

pub use mma::decode;

use crate::arch::{self, cp_async, cvt, ldmatrix, smem, sync};
use crate::elem::Half16;
use mla_abi::{D_QK, D_V, DecodeParams, chunk_blocks, decode_tile as T};

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
/// (zeros past the last row).
#[inline(always)]
pub(crate) unsafe fn load_q_tile<K: DecodeKind, L: Layout>(
    p: &DecodeParams,
    b: u32,
    row0: u32,
    q_smem: u32,
    tile_off: fn(u32, u32) -> u32,
) {
    let rows = p.s_q * p.heads;
    let mut c = arch::thread_idx_x();
    while c < L::BM * ROW_CHUNKS {
        let r = c / ROW_CHUNKS;
        let k = c % ROW_CHUNKS;
        let gr = row0 + r;
        let dst = q_smem + tile_off(r, k);
        // Chunk k of the row (8 dims): the latent part from q, the rope part from q_pe
        // (base pointer, element offset, chunk within the part).
        let row_off = if gr < rows {
            let (t, h) = (gr / p.heads, gr % p.heads);
            Some(if k < 64 {
                (
                    p.q.ptr() as *const u8,
                    b as u64 * p.q_stride_b + t as u64 * p.q_stride_s + h as u64 * p.q_stride_h,
                    k,
                )
            } else {
                (
                    p.q_pe.ptr() as *const u8,
                    b as u64 * p.q_pe_stride_b
                        + t as u64 * p.q_pe_stride_s
                        + h as u64 * p.q_pe_stride_h,
                    k - 64,
                )
            })
        } else {
            None
        };
        if K::Q_FP8 {
            // 8 fp8 values -> 8 16-bit values (one 16-byte chunk).
            let v = match row_off {
                Some((base, off, kc)) => {
                    // SAFETY: row off + 8 kc .. +8 lies in the validated q (or q_pe) row;
                    // 8-byte aligned.
                    let raw =
                        unsafe { *(base.add((off + 8 * kc as u64) as usize) as *const [u32; 2]) };
                    fp8x8_to_half::<K::Mma>(raw)
                }
                None => [0; 4],
            };
            // SAFETY: dst is a 16-byte aligned address inside the Q tile.
            unsafe { smem::st_shared_v4(dst, v) };
        } else {
            let (src, n) = match row_off {
                // SAFETY: 16-byte chunk kc of a validated, 16-byte aligned q (or q_pe) row.
                Some((base, off, kc)) => (
                    unsafe { base.add(((off * 2) + 16 * kc as u64) as usize) },
                    16,
                ),
                None => (p.q.ptr() as *const u8, 0),
            };
            // SAFETY: dst inside the Q tile; src valid when n == 16, unread when n == 0.
            unsafe { cp_async::cp_async_cg_16(dst, src, n) };
        }
        c += THREADS;
    }
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

/// Row max over the quad (the 4 lanes sharing a row).
#[inline(always)]
pub(crate) unsafe fn quad_max(v: f32) -> f32 {
    // SAFETY: forwarded: the warp is converged.
    unsafe {
        let v = sync::fmax(v, sync::shfl_xor_f32(v, 1));
        sync::fmax(v, sync::shfl_xor_f32(v, 2))
    }
}

#[inline(always)]
pub(crate) unsafe fn quad_sum(v: f32) -> f32 {
    // SAFETY: forwarded: the warp is converged.
    unsafe {
        let v = v + sync::shfl_xor_f32(v, 1);
        v + sync::shfl_xor_f32(v, 2)
    }
}

/// One online-softmax step for a thread's two rows: from the new running maxima `m_new`
/// (log2 units) returns the exponent reference of each row and the factor `alpha` that the
/// row's earlier sums and accumulators take, and updates `m_run` and `l_run`. A row with
/// nothing visible yet keeps max -inf and uses 0 as its reference, so that exp2(-inf - ref)
/// is 0 and never NaN.
#[inline(always)]
pub(crate) fn rescale_rows(
    m_run: &mut [f32; 2],
    l_run: &mut [f32; 2],
    m_new: [f32; 2],
) -> ([f32; 2], [f32; 2]) {
    let m_ref = m_new.map(|m| if m == f32::NEG_INFINITY { 0.0 } else { m });
    let alpha = [
        sync::ex2(m_run[0] - m_ref[0]),
        sync::ex2(m_run[1] - m_ref[1]),
    ];
    *m_run = m_new;
    l_run[0] *= alpha[0];
    l_run[1] *= alpha[1];
    (m_ref, alpha)
}

/// Causal visibility of query row `gr` (`t * heads + h`) over a KV length `len`: the keys
/// `0..visible` it attends to (query token `t` sits at position `len - s_q + t`). Rows past
/// the last take the last token's count (their outputs are never stored). Sharded
/// ([`mla_abi::Shard`]): `len` is the local length and `glen` the global one, and the keys
/// are this rank's first `visible` (local positions ascend with global ones).
#[inline(always)]
pub(crate) fn visible(p: &DecodeParams, len: u32, glen: u32, gr: u32) -> u32 {
    let t = if gr < p.s_q * p.heads {
        gr / p.heads
    } else {
        p.s_q - 1
    };
    if p.shard.is_on() {
        p.shard.visible(glen, len, t, p.s_q)
    } else {
        (len + t + 1).saturating_sub(p.s_q)
    }
}

/// This CTA's `(row tile, sequence, split)` in a decode grid (every decode kernel's).
/// The grid is `(row tiles, batch, splits)`: split-major, so every split-0 CTA (all of the
/// work at large batch) launches before any CTA of a split a sequence may not have.
#[inline(always)]
pub(crate) fn cta_coords() -> (u32, u32, u32) {
    (
        arch::block_idx_x(),
        arch::block_idx_y(),
        arch::block_idx_z(),
    )
}

/// What CTA `(_, b, split)` of a decode grid (64- or 16-row tile, `mma.sync` or `wgmma`)
/// works on.
pub(crate) struct CtaWork {
    /// The sequence's KV length in this cache (this rank's share when sharded), cut to
    /// what its page table can address.
    pub len: u32,
    /// The global length (sharded: what the causal rule counts from; else `len`).
    pub glen: u32,
    /// Its split count, `1..=max_splits`.
    pub nsplit: u32,
    /// This split's 64-token blocks `kb0..kb1` ([`chunk_blocks`]).
    pub kb0: u32,
    pub kb1: u32,
}

/// The work of CTA `(_, b, split)`, or `None` when it has none: `b` past the batch, a
/// sequence the schedule skipped (0 splits: nothing is computed or written), or a split
/// past the sequence's count.
#[inline(always)]
pub(crate) fn cta_work(p: &DecodeParams, split: u32, b: u32) -> Option<CtaWork> {
    // The folded schedule (the warp sums over the whole batch) runs before the range check,
    // in converged code: every lane of every warp takes part.
    let batch_blocks = if p.fold.tiles != 0 {
        // SAFETY: converged warps; i < batch entries of seq_lens.
        Some(unsafe { warp_batch_blocks(p) })
    } else {
        None
    };
    if b >= p.batch {
        return None;
    }
    // SAFETY: b < batch entries of seq_lens and num_splits.
    let glen_raw = unsafe { *p.seq_lens.ptr().add(b as usize) };
    let len_raw = p.shard.local_len(glen_raw);
    let nsplit_raw = match batch_blocks {
        Some(total) => {
            let s = mla_abi::schedule_splits(
                p.shard.schedule_blocks(glen_raw, p.fold.max_len),
                total * p.fold.tiles as u64,
                p.fold.target_ctas as u64,
                p.max_splits as u64,
                p.fold.tiles as u64,
                p.fold.step_log2,
            ) as i32;
            if split == 0 && arch::block_idx_x() == 0 && arch::thread_idx_x() == 0 {
                // SAFETY: b < batch entries; one writer per sequence, read by the combine
                // after this grid completes.
                unsafe { *p.num_splits.ptr().add(b as usize) = s };
            }
            s
        }
        // SAFETY: as above.
        None => unsafe { *p.num_splits.ptr().add(b as usize) },
    };
    if nsplit_raw <= 0 {
        return None;
    }
    let nsplit = (nsplit_raw as u32).min(p.max_splits);
    if split >= nsplit {
        return None;
    }
    let len = mla_abi::clamp_len(len_raw, p.max_pages.saturating_mul(p.page_size));
    let (glen, blocks) = if p.shard.is_on() {
        // A rank with none of a live sequence's keys still runs one (empty) block, so
        // that its rows are written: zeros with LSE -inf, which the rank merge skips.
        (
            mla_abi::clamp_len(glen_raw, u32::MAX),
            len.div_ceil(BLOCK_N).max(1),
        )
    } else {
        (len, len.div_ceil(BLOCK_N))
    };
    let (kb0, kb1) = chunk_blocks(blocks, nsplit, split);
    if !p.fault.is_null() && arch::block_idx_x() == 0 {
        // SAFETY: b < batch; the tokens are this split's, below the clamped length.
        unsafe {
            check_faults(
                p,
                b,
                len_raw,
                split == 0,
                kb0 * BLOCK_N,
                (kb1 * BLOCK_N).min(len),
            )
        };
    }
    Some(CtaWork {
        len,
        glen,
        nsplit,
        kb0,
        kb1,
    })
}

/// Checked mode (`p.fault` non-null): the CTA's threads look at the page-table entries of
/// sequence `b`'s tokens `t0..t1` (the ones this CTA's decode reads) and, with
/// `check_len`, at its length; the first fault the grid meets claims the record.
///
/// # Safety
/// `p.fault` is the workspace's record, `b < batch`, and `t1 <= max_pages * page_size`.
#[inline(always)]
pub(crate) unsafe fn check_faults(
    p: &DecodeParams,
    b: u32,
    len_raw: i32,
    check_len: bool,
    t0: u32,
    t1: u32,
) {
    let tid = arch::thread_idx_x();
    if check_len
        && tid == 0
        && len_raw > 0
        && len_raw as u32 > p.max_pages.saturating_mul(p.page_size)
    {
        // SAFETY: forwarded from the caller.
        unsafe { record_fault(p, mla_abi::fault::SEQ_LEN, b, -1, len_raw) };
    }
    if t0 >= t1 {
        return;
    }
    let mut col = (t0 >> p.page_shift) + tid;
    let end = ((t1 - 1) >> p.page_shift) + 1;
    while col < end {
        let slot = b as usize * p.page_table_stride as usize + col as usize;
        // SAFETY: col < max_pages columns of row b (t1 <= max_pages * page_size).
        let entry = unsafe { *p.page_table.ptr().add(slot) };
        if entry < 0 || entry as u32 >= p.num_pages {
            // SAFETY: forwarded from the caller.
            unsafe { record_fault(p, mla_abi::fault::PAGE_ID, b, col as i32, entry) };
        }
        col += arch::block_dim_x();
    }
}

/// Claims the fault record for this fault if no fault holds it yet.
///
/// # Safety
/// `p.fault` is the workspace's record (`mla_abi::fault::WORDS` i32).
#[inline(always)]
unsafe fn record_fault(p: &DecodeParams, kind: i32, b: u32, column: i32, value: i32) {
    use mla_abi::fault;
    let rec = p.fault.ptr();
    // SAFETY: forwarded from the caller; the claiming thread alone writes the other words,
    // read by the host after the grid completes.
    unsafe {
        if arch::atomic_cas_global_i32(rec.add(fault::KIND), fault::NONE, kind) == fault::NONE {
            *rec.add(fault::SEQUENCE) = b as i32;
            *rec.add(fault::COLUMN) = column;
            *rec.add(fault::VALUE) = value;
        }
    }
}

/// The batch's KV blocks (the folded schedule's total before the row tiles), summed by
/// each warp over all of `seq_lens`: every lane returns the total.
///
/// # Safety
/// All 32 lanes of the warp call it together.
#[inline(always)]
unsafe fn warp_batch_blocks(p: &DecodeParams) -> u64 {
    let lane = arch::thread_idx_x() % 32;
    let mut sum = 0u64;
    let mut i = lane;
    while i < p.batch {
        // SAFETY: i < batch entries of seq_lens.
        sum += p
            .shard
            .schedule_blocks(unsafe { *p.seq_lens.ptr().add(i as usize) }, p.fold.max_len);
        i += 32;
    }
    // SAFETY: forwarded from the caller.
    unsafe { sync::warp_sum_u64(sum) }
}

/// Max over the column splits of row `r` in the exchange buffer `[CS][BM]` ([`red_max_of`]
/// with the layout's).
///
/// # Safety
/// As [`red_max_of`].
#[inline(always)]
pub(crate) unsafe fn red_max<L: Layout>(red: u32, r: u32) -> f32 {
    // SAFETY: forwarded from the caller.
    unsafe { red_max_of(red, L::CS, L::BM, r) }
}

/// Sum over the column splits of row `r` in the exchange buffer `[CS][BM]` ([`red_sum_of`]
/// with the layout's).
///
/// # Safety
/// As [`red_max_of`].
#[inline(always)]
pub(crate) unsafe fn red_sum<L: Layout>(red: u32, r: u32) -> f32 {
    // SAFETY: forwarded from the caller.
    unsafe { red_sum_of(red, L::CS, L::BM, r) }
}

/// Max over `splits` writers of row `r` in the exchange buffer `[splits][rows]` f32.
///
/// # Safety
/// `red` is the exchange buffer (`splits * rows` floats, `r < rows`) and the writes to it
/// are ordered by a barrier.
#[inline(always)]
pub(crate) unsafe fn red_max_of(red: u32, splits: u32, rows: u32, r: u32) -> f32 {
    let mut m = f32::NEG_INFINITY;
    for c in 0..splits {
        // SAFETY: c * rows + r < splits * rows floats.
        m = sync::fmax(m, unsafe { smem::ld_shared_f32(red + (c * rows + r) * 4) });
    }
    m
}

/// Sum over `splits` writers of row `r` in the exchange buffer `[splits][rows]`, in writer
/// order (every reader adds in the same order and gets the same value).
///
/// # Safety
/// As [`red_max_of`].
#[inline(always)]
pub(crate) unsafe fn red_sum_of(red: u32, splits: u32, rows: u32, r: u32) -> f32 {
    let mut l = 0.0;
    for c in 0..splits {
        // SAFETY: as above.
        l += unsafe { smem::ld_shared_f32(red + (c * rows + r) * 4) };
    }
    l
}

/// A row's output factor and natural-log LSE from its exp-sum `l` and running max `m`
/// (log2 units): `(1 / l, (m + log2 l) ln 2)`, or `(0, -inf)` for a row that saw nothing.
#[inline(always)]
pub(crate) fn row_norm(l: f32, m: f32) -> (f32, f32) {
    if l > 0.0 {
        (sync::rcp(l), (m + sync::lg2(l)) * LN2)
    } else {
        (0.0, f32::NEG_INFINITY)
    }
}

/// Normalises the accumulators and stores this thread's two rows: to `out`/`lse` when the
/// sequence has one split, else to the workspace partials.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn write_rows<K: DecodeKind, L: Layout>(
    p: &DecodeParams,
    o: &[[f32; 4]; O_TILES_MAX],
    l_tot: [f32; 2],
    m_run: [f32; 2],
    b: u32,
    row_a: u32,
    split: u32,
    nsplit: u32,
    ch: u32,
    c4: u32,
) {
    let rows = p.s_q * p.heads;
    let direct = nsplit == 1;
    unroll!(half in [0, 1] {
        let gr = row_a + 8 * half as u32;
        if gr < rows {
            let (inv, lse) = row_norm(l_tot[half], m_run[half]);
            let row_idx = (b * rows + gr) as usize;
            let dim0 = (ch as usize * (D_V / L::CS as usize)) + 2 * c4 as usize;
            if direct {
                let scale = inv * p.value_scale * p.output_scale;
                let (t, h) = (gr / p.heads, gr % p.heads);
                let row_off = b as u64 * p.out_stride_b + t as u64 * p.out_stride_s + h as u64 * p.out_stride_h;
                // SAFETY: dims < 512 of a validated out row; 4-byte aligned pairs.
                let dst = unsafe { (p.out.ptr() as *mut u16).add(row_off as usize + dim0) };
                unroll!(nt in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
                    if nt < L::O_TILES {
                        let v = K::Mma::pack2(o[nt][2 * half] * scale, o[nt][2 * half + 1] * scale);
                        // SAFETY: as above.
                        unsafe { *(dst.add(nt * 8) as *mut u32) = v };
                    }
                });
                if ch == 0 && c4 == 0 {
                    // SAFETY: row_idx < batch * rows entries of lse.
                    unsafe { *p.lse.ptr().add(row_idx) = lse };
                }
            } else {
                let scale = inv * p.value_scale;
                let part = split as usize * (p.batch * rows) as usize + row_idx;
                // SAFETY: split < max_splits: inside the workspace sized by the host.
                let dst = unsafe { p.partial_o.ptr().add(part * D_V + dim0) };
                unroll!(nt in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
                    if nt < L::O_TILES {
                        let v = [o[nt][2 * half] * scale, o[nt][2 * half + 1] * scale];
                        // SAFETY: as above; 8-byte aligned pairs.
                        unsafe { *(dst.add(nt * 8) as *mut [f32; 2]) = v };
                    }
                });
                if ch == 0 && c4 == 0 {
                    // SAFETY: as above.
                    unsafe { *p.partial_lse.ptr().add(part) = lse };
                }
            }
        }
    });
}
