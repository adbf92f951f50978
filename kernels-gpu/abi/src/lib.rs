//! The ABI shared by the GPU kernels (`mla-kernels`, compiled for `nvptx64`) and the host
//! runtime (`mla-host`): geometry and tile constants, the `#[repr(C)]` params struct of
//! every kernel, and every kernel symbol name. Nothing here is restated on either side:
//! both crates import these items.
//!
//! `#![no_std]`, no dependencies, so it compiles for the GPU target unchanged.
#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]

use core::marker::PhantomData;

/// Width of the latent vector `c_kv` (= the value width).
pub const D_LATENT: usize = 512;
/// Width of the decoupled rope key.
pub const D_ROPE: usize = 64;
/// Key width: latent followed by rope.
pub const D_QK: usize = D_LATENT + D_ROPE;
/// Value width (the first `D_V` dims of each cached row).
pub const D_V: usize = D_LATENT;

/// Most query heads one launch accepts.
pub const MAX_HEADS: u32 = 128;
/// Most query tokens per sequence per step (MTP / speculative decode).
pub const MAX_S_Q: u32 = 8;
/// Most split-KV chunks one sequence may be cut into. The workspace holds this many
/// partial results per (sequence, query row); a larger request is a typed error. Enough
/// for one sequence to fill the 132 SMs of an H200 on its own (see [`split_bound`]).
pub const MAX_SPLITS: u32 = 128;
/// Largest page size (tokens per page); every power of two from 1 up to it is accepted.
pub const MAX_PAGE_SIZE: u32 = 256;

/// Element type codes, as carried in params and reported by the host.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElemType {
    Bf16 = 0,
    Fp16 = 1,
    /// OCP fp8 e4m3 ("e4m3fn": no infinities, `0x7f`/`0xff` are NaN, max 448).
    Fp8E4m3 = 2,
    F32 = 3,
    /// Index tensors (page table, sequence lengths).
    I32 = 4,
}

impl ElemType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            ElemType::Bf16 | ElemType::Fp16 => 2,
            ElemType::Fp8E4m3 => 1,
            ElemType::F32 | ElemType::I32 => 4,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            ElemType::Bf16 => "bf16",
            ElemType::Fp16 => "fp16",
            ElemType::Fp8E4m3 => "fp8_e4m3",
            ElemType::F32 => "f32",
            ElemType::I32 => "i32",
        }
    }

    /// The type of the rows appended to a paged cache of this type: bf16 for an fp8 cache
    /// (quantised on the way in), the cache's own type otherwise.
    pub const fn append_rows(self) -> ElemType {
        match self {
            ElemType::Fp8E4m3 => ElemType::Bf16,
            other => other,
        }
    }
}

/// A device address of elements of `T`, as the kernels receive it: a transparent `u64`.
/// The type parameter documents and checks the element type on the host; it costs nothing.
#[repr(transparent)]
pub struct DevPtr<T> {
    addr: u64,
    _elem: PhantomData<fn() -> T>,
}

impl<T> Clone for DevPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DevPtr<T> {}

impl<T> core::fmt::Debug for DevPtr<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "DevPtr({:#x})", self.addr)
    }
}

impl<T> DevPtr<T> {
    /// The null pointer, for the optional pointers documented as "may be null".
    pub const NULL: Self = Self::from_addr(0);

    pub const fn from_addr(addr: u64) -> Self {
        Self {
            addr,
            _elem: PhantomData,
        }
    }

    pub const fn addr(self) -> u64 {
        self.addr
    }

    pub const fn is_null(self) -> bool {
        self.addr == 0
    }

    /// The raw pointer, for device code.
    pub const fn ptr(self) -> *mut T {
        self.addr as *mut T
    }
}

/// Tile configuration of the tensor-core decode kernel (`mma.sync`, all archs).
pub mod decode_tile {
    use super::D_QK;

    /// Query rows per CTA (heads x query tokens folded together), default tile.
    pub const BLOCK_M: usize = 64;
    /// Query rows per CTA of the small tile (`s_q * heads <= 16`: a quarter of the MMA work).
    pub const BLOCK_M_SMALL: usize = 16;
    /// KV tokens per pipeline step.
    pub const BLOCK_N: usize = 64;
    /// Warps per CTA: 4 row groups of 16 x 2 column halves (64-row tile) or 1 x 8 (16-row).
    pub const WARPS: usize = 8;
    pub const THREADS: usize = WARPS * 32;
    /// One bf16/fp16 tile of `rows x D_QK`, 16-byte chunks XOR-swizzled by row.
    pub const QK_TILE_BYTES: usize = BLOCK_N * D_QK * 2;
    /// One fp8 staging tile of `BLOCK_N x D_QK` bytes.
    pub const FP8_STAGE_BYTES: usize = BLOCK_N * D_QK;
    /// Probabilities tile, `BLOCK_M x BLOCK_N` 16-bit (the 16-row tile uses its first rows).
    pub const P_TILE_BYTES: usize = BLOCK_M * BLOCK_N * 2;
    /// Row max / row sum exchange between the column splits: `[splits][rows]` f32, 128
    /// floats for both tiles (2 x 64 and 8 x 16).
    pub const RED_BYTES: usize = 2 * BLOCK_M * 4;
    const _: () = assert!(2 * BLOCK_M == 8 * BLOCK_M_SMALL);

    /// Byte offsets of the shared-memory regions.
    pub const SMEM_Q: usize = 0;
    /// Two KV stages (16-bit caches) or, for fp8 caches, one converted tile.
    pub const SMEM_KV: usize = SMEM_Q + QK_TILE_BYTES;
    pub const SMEM_P: usize = SMEM_KV + 2 * QK_TILE_BYTES;
    pub const SMEM_RED: usize = SMEM_P + P_TILE_BYTES;
    pub const SMEM_BYTES: usize = SMEM_RED + RED_BYTES;
    /// In the fp8 kernels the second KV stage holds the two raw fp8 stages.
    pub const SMEM_FP8_STAGE: usize = SMEM_KV + QK_TILE_BYTES;

    const _: () = assert!(2 * FP8_STAGE_BYTES <= QK_TILE_BYTES);
    const _: () = assert!(SMEM_BYTES <= 227 * 1024);

    /// The 16-row kernels with 16-bit caches stream KV through a ring of `RING_SLOTS`
    /// half-blocks of `HALF_N` tokens: while one 64-token block (two slots) is computed,
    /// three half-blocks (110 KB) are in flight, against one block (74 KB) with two full
    /// stages. Their shared memory: the 16-row Q tile, the ring, the P tile, the exchange.
    pub const HALF_N: usize = BLOCK_N / 2;
    pub const RING_SLOTS: usize = 5;
    pub const HALF_TILE_BYTES: usize = HALF_N * D_QK * 2;
    pub const SMEM_RING_Q: usize = 0;
    pub const SMEM_RING: usize = SMEM_RING_Q + BLOCK_M_SMALL * D_QK * 2;
    pub const SMEM_RING_P: usize = SMEM_RING + RING_SLOTS * HALF_TILE_BYTES;
    pub const SMEM_RING_RED: usize = SMEM_RING_P + P_TILE_BYTES;
    pub const SMEM_RING_BYTES: usize = SMEM_RING_RED + RED_BYTES;
    const _: () = assert!(SMEM_RING_BYTES <= SMEM_BYTES);

    /// The 16-row kernels with fp8 caches where the arch converts fp8 in hardware (sm_90a,
    /// sm_100a): KV is never converted in shared memory. Q as fp16 in `mma` fragment order
    /// (16 bytes per lane and step: one load gives a lane its A fragment), a ring of
    /// `RING_SLOTS` whole raw fp8 blocks (a pair computed, three in flight), P as fp16 in
    /// fragment order for two blocks' tokens, the exchange, and each Q row's power-of-two
    /// scale (f32).
    pub const F8_Q_BYTES: usize = BLOCK_M_SMALL * D_QK * 2;
    pub const F8_P_BYTES: usize = BLOCK_M_SMALL * 2 * BLOCK_N * 2;

    /// Byte offsets of the fp8 kernel's regions for `groups` 16-row groups per CTA: Q, P,
    /// the exchange and the scales hold one copy per group, the ring is shared.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct F8Smem {
        pub q: usize,
        pub ring: usize,
        pub p: usize,
        pub red: usize,
        pub qscale: usize,
        /// The whole layout's size.
        pub bytes: usize,
    }

    pub const fn f8_smem(groups: usize) -> F8Smem {
        let q = 0;
        let ring = q + groups * F8_Q_BYTES;
        let p = ring + RING_SLOTS * FP8_STAGE_BYTES;
        let red = p + groups * F8_P_BYTES;
        let qscale = red + groups * RED_BYTES;
        F8Smem {
            q,
            ring,
            p,
            red,
            qscale,
            bytes: qscale + groups * BLOCK_M_SMALL * 4,
        }
    }

    /// The 16-row kernel's layout (within the 16-row tile's `SMEM_BYTES`).
    pub const SMEM_F8: F8Smem = f8_smem(1);
    const _: () = assert!(SMEM_F8.bytes <= SMEM_BYTES && SMEM_F8.ring.is_multiple_of(16));

    /// The 32-row form of that kernel (sm_90a, `Tile::M32N64` on the host): two 16-row
    /// groups share every converted K and V fragment, so a sequence's fp8 blocks are read
    /// and converted once for 32 rows instead of once per 16-row tile.
    pub const BLOCK_M_F8X2: usize = 2 * BLOCK_M_SMALL;
    pub const SMEM_F8X2: F8Smem = f8_smem(2);
    const _: () = assert!(SMEM_F8X2.bytes <= 227 * 1024 && SMEM_F8X2.ring.is_multiple_of(16));

    /// The `wgmma` decode (sm_90a only, `names::DECODE_WG_BF16`): the same grid, block and
    /// params as the 64-row tile; Q and two KV stages as 128-byte-swizzled slab tiles (nine
    /// 64-dim slabs of 64 x 128 bytes each), after up to 1 KB of alignment slack (the
    /// swizzle atoms must be 1024-byte aligned); then P (64 rows x 64 tokens, one slab) and
    /// the warpgroups' row exchange (two f32 per row per warpgroup).
    pub const WG_SLAB_BYTES: usize = BLOCK_N * 128;
    /// Offsets from the aligned base.
    pub const WG_SMEM_P: usize = 3 * QK_TILE_BYTES;
    pub const WG_SMEM_RED: usize = WG_SMEM_P + WG_SLAB_BYTES;
    pub const WG_RED_BYTES: usize = 2 * 2 * BLOCK_M * 4;
    pub const WG_SMEM_BYTES: usize = 1024 + WG_SMEM_RED + WG_RED_BYTES;
    /// With an fp8 cache the second KV stage holds two raw fp8 stages (rows of 576 bytes)
    /// and the first the converted bf16 slab tile.
    pub const WG_SMEM_FP8_RAW: usize = 2 * QK_TILE_BYTES;
    const _: () = assert!(QK_TILE_BYTES == 9 * WG_SLAB_BYTES);
    const _: () = assert!(WG_SMEM_BYTES <= 227 * 1024);
    const _: () = assert!(BLOCK_M == 16 * (WARPS / 2));

    /// The TMA-fed `wgmma` decode (sm_90a only, `names::DECODE_TMA_BF16`,
    /// `DECODE_TMA_FP8KV_BF16Q` and `DECODE_TMA_FP8`, bf16 or fp8 caches with pages of at least
    /// `TMA_MIN_PAGE` tokens; an fp8 cache's boxes land raw, 64-byte rows, and feed the e4m3
    /// tensor cores as they are, `TMA_E4_*` below): the same block and params (plus the cache's `TensorMap`, by
    /// value); grid `min(row tiles * batch * splits, SMs)`, persistent over that virtual grid
    /// (`DecodeParams::persist_splits`). Each warpgroup owns every other block of a split
    /// (blocks are taken in pairs, one per KV stage). Offsets from the 1024-byte aligned base:
    /// Q, two KV stages filled by `cp.async.bulk.tensor` (box `{64 dims, min(page, 64) tokens,
    /// 1 page}`, 128-byte swizzle: one box per slab and page), the first warpgroup's P (the
    /// second's goes to stage 1's slab 8 once S is done with it), the exchange (max and scale
    /// of each warpgroup, then each one's row sums: 6 x 64 f32), eighteen mbarriers (one per
    /// stage and slab), the page entries the copies are issued with and the marks of a
    /// persistent CTA's cells.
    pub const TMA_SMEM_P0: usize = 3 * QK_TILE_BYTES;
    pub const TMA_SMEM_RED: usize = TMA_SMEM_P0 + WG_SLAB_BYTES;
    pub const TMA_RED_BYTES: usize = 6 * BLOCK_M * 4;
    pub const TMA_SMEM_BARS: usize = TMA_SMEM_RED + TMA_RED_BYTES;
    /// Each issuing thread's page entries of the next pair's two blocks (2 x 2 x 4 i32).
    pub const TMA_SMEM_PAGES: usize = TMA_SMEM_BARS + 2 * 9 * 8;
    /// A persistent CTA's walk words: the marks of its next virtual cells with work (one
    /// bit per cell, a word per warp), or in the work list's kernels its sums and walk
    /// state ([`walk_words`]).
    pub const TMA_SMEM_CELLS: usize = TMA_SMEM_PAGES + 2 * 2 * 4 * 4;
    pub const TMA_SMEM_BYTES: usize = 1024 + TMA_SMEM_CELLS + 8 * 4;
    /// The work list's 64-row TMA decodes (`names::DECODE_TMA_*_LIST`).
    pub const TMA_LIST_SMEM_BYTES: usize = 1024 + TMA_SMEM_CELLS + 4 * walk_words(THREADS);
    /// Smallest page size the TMA decode takes (a box of fewer than 8 rows would break
    /// the swizzle atoms; 16 keeps a block at four boxes per slab at most).
    pub const TMA_MIN_PAGE: usize = 16;
    const _: () = assert!(TMA_SMEM_BYTES <= 227 * 1024);
    const _: () = assert!(TMA_LIST_SMEM_BYTES <= 227 * 1024);
    /// The e4m3 TMA decodes' tensor-map forms (`names::DECODE_TMA_FP8KV_BF16Q`,
    /// `names::DECODE_TMA_FP8` and their `_LIST` forms): the two warpgroups above and a
    /// third that writes each block's V^T (`setmaxnreg`: 232 registers a consumer thread,
    /// 40 a transposer thread); the same layout, except that the walk words of their 12
    /// warps (marks, or the work list's [`walk_words`]) sit at `TMA_E4_WORDS`, in the half
    /// of the first warpgroup's P slab that an e4m3 P (64 x 64 bytes) leaves free.
    pub const TMA_E4_THREADS: usize = 384;
    pub const TMA_E4_WORDS: usize = TMA_SMEM_P0 + TMA_E4_SLAB;
    pub const TMA_E4_SMEM_BYTES: usize = 1024 + TMA_SMEM_CELLS;
    const _: () = assert!(TMA_E4_SLAB + 4 * walk_words(TMA_E4_THREADS) <= WG_SLAB_BYTES);
    /// The bf16 TMA decode's `cp.async` form (`names::DECODE_TMA_BF16_CP`: pages of fewer
    /// than `TMA_MIN_PAGE` tokens, fused caches the map does not take): the same layout and
    /// threads; warpgroup 0 copies each block from the page table a block ahead and
    /// multiplies its half of P.V, warpgroup 1 computes S, P and the other half. The stages'
    /// free mbarriers (two) sit where the tensor-map form keeps its page entries.
    pub const TMA_CP_THREADS: usize = THREADS;
    pub const TMA_CP_SMEM_FREE: usize = TMA_SMEM_PAGES;
    const _: () = assert!(2 * 8 <= TMA_SMEM_CELLS - TMA_SMEM_PAGES);

    /// The small-row TMA decode (sm_90a only, `names::DECODE_TMA32_*`: bf16 Q with a bf16
    /// or fp8 cache, or fp8 Q with an fp8 cache; at most `TMA32_ROWS` query rows, pages of
    /// at least `TMA_MIN_PAGE` tokens): the products transposed (S^T = K Q^T and O^T = V^T
    /// P^T, the rows as the `wgmma`'s N), so a block costs the `wgmma` work of 32 rows, not
    /// of a 64-row tile. One consumer warpgroup computes (two with an fp8 cache, each its
    /// own blocks of a cell, `TMA32_FP8_CONSUMERS`); one producer warp issues the
    /// tensor copies into a ring of 64-token x 64-dim slab slots, one mbarrier when full
    /// and one when free, running ahead across blocks and cells. An fp8 cache takes the e4m3
    /// tensor cores: its boxes land raw in a ring of 4 KB slabs (64-byte rows, the map's
    /// 64-byte swizzle; whole blocks, `TMA32_RAW_SLOTS` a multiple of nine), S^T reads them
    /// as they are, and each consumer writes its block's V^T (eight 4 KB tiles of 64 dims x
    /// 64 tokens) into its own of the `TMA32_VT_ENTRIES` entries in place of the bf16 slabs.
    /// Same grid, params and tensor map as the other TMA decodes. Offsets from the
    /// 1024-byte aligned base: Q (nine slabs of 32 rows, also the output's staging; an fp8
    /// cache's e4m3 Q parts `hi` and `lo`, `TMA32_E4_Q_LO` apart), P per consumer (32 rows x
    /// 64 tokens; e4m3 P in its first half, then, in the first consumer's, the rows' Q
    /// scales), the bf16 ring (or V^T entries), the raw ring, the row exchange per consumer
    /// (4 warps x 32 rows f32), the mbarriers (ring full, ring free, raw full, raw free),
    /// the marks of a persistent CTA's cells (one word per warp).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Tma32Smem {
        pub threads: usize,
        pub slots: usize,
        pub raw_slots: usize,
        pub p: usize,
        pub ring: usize,
        pub raw: usize,
        pub red: usize,
        pub bars: usize,
        pub cells: usize,
        /// Dynamic shared memory to launch with (the layout plus the alignment slack).
        pub bytes: usize,
    }

    pub const TMA32_ROWS: usize = 32;
    pub const TMA32_Q_SLAB: usize = TMA32_ROWS * 128;
    /// A raw fp8 slab: 64 tokens x 64 bytes.
    pub const TMA32_RAW_SLAB: usize = BLOCK_N * 64;

    /// The fp8 forms' raw ring: three blocks of nine slabs, so a block's slabs are contiguous.
    pub const TMA32_RAW_SLOTS: usize = 27;
    /// The fp8 forms' V^T entries (a block's eight V^T tiles each; one per consumer) and
    /// their size.
    pub const TMA32_VT_ENTRIES: usize = 2;
    pub const TMA32_VT_ENTRY: usize = 8 * TMA32_RAW_SLAB;
    /// The fp8 forms' e4m3 Q: the `lo` part's nine 2 KB tiles after the `hi` part's.
    pub const TMA32_E4_Q_LO: usize = 9 * TMA32_ROWS * 64;

    /// Consumer warpgroups of the small-row decode's fp8 forms: two, each its own blocks
    /// of a cell (the bf16 forms have one).
    pub const TMA32_FP8_CONSUMERS: usize = 2;

    pub const fn tma32_smem(fp8: bool) -> Tma32Smem {
        // fp8: the two consumer warpgroups, then a warpgroup of two transposer warps, an
        // idle warp and the producer warp.
        let threads = if fp8 { 12 * 32 } else { 5 * 32 };
        let wgs = if fp8 { TMA32_FP8_CONSUMERS } else { 1 };
        let (slots, raw_slots) = if fp8 {
            (TMA32_VT_ENTRIES, TMA32_RAW_SLOTS)
        } else {
            (23, 0)
        };
        let p = 9 * TMA32_Q_SLAB;
        let ring = p + wgs * TMA32_ROWS * 128;
        let raw = ring
            + if fp8 {
                slots * TMA32_VT_ENTRY
            } else {
                slots * WG_SLAB_BYTES
            };
        let red = raw + raw_slots * TMA32_RAW_SLAB;
        let bars = red + wgs * 4 * TMA32_ROWS * 4;
        let cells = bars + 2 * (slots + raw_slots) * 8;
        Tma32Smem {
            threads,
            slots,
            raw_slots,
            p,
            ring,
            raw,
            red,
            bars,
            cells,
            bytes: 1024 + cells + (threads / 32) * 4,
        }
    }

    /// The 32-bit words of the work list's walk region ([`super::DecodeParams::list_fixed`])
    /// for a CTA of `threads` threads: each warp's cost sum and longest sequence, the part's
    /// size, the batch's total cost, the first part's first sequence and its cost position,
    /// then each warp's walk state (five words).
    pub const fn walk_words(threads: usize) -> usize {
        7 * (threads / 32) + 4
    }

    /// The bf16-cache form.
    pub const TMA32_BF16: Tma32Smem = tma32_smem(false);
    /// The fp8-cache form.
    pub const TMA32_FP8: Tma32Smem = tma32_smem(true);
    /// The bf16 `cp.async` form (`names::DECODE_TMA32_BF16_CP`): the bf16 layout with a
    /// producer warpgroup (four warps copying) in place of the one producer warp.
    pub const TMA32_BF16_CP: Tma32Smem = {
        let l = tma32_smem(false);
        let threads = 8 * 32;
        Tma32Smem {
            threads,
            bytes: 1024 + l.cells + (threads / 32) * 4,
            ..l
        }
    };
    const _: () = assert!(TMA32_BF16.bytes <= 227 * 1024 && TMA32_FP8.bytes <= 227 * 1024);
    const _: () = assert!(TMA32_BF16_CP.bytes <= 227 * 1024);
    const _: () =
        assert!(TMA32_BF16.p.is_multiple_of(1024) && TMA32_BF16.ring.is_multiple_of(1024));
    const _: () = assert!(TMA32_FP8.raw.is_multiple_of(1024) && TMA32_ROWS * 1024 <= TMA32_BF16.p);
    const _: () = assert!(TMA32_RAW_SLOTS.is_multiple_of(9) && 2 * TMA32_E4_Q_LO <= TMA32_FP8.p);
    const _: () = assert!(TMA32_ROWS * 64 + TMA32_ROWS * 4 <= TMA32_ROWS * 128);

    /// The e4m3 TMA decode (`names::DECODE_TMA_FP8`: fp8 Q and an fp8 cache, e4m3 tensor
    /// cores) packs its 64-byte rows: Q and each stage's nine raw slabs are `TMA_E4_SLAB`
    /// apart (64 rows of 64 bytes, 64-byte swizzle; the map's swizzle is 64 bytes). Inside a
    /// stage (`QK_TILE_BYTES` apart, as above): the raw slabs, then V^T at `TMA_E4_VT` (512
    /// dim rows of 64 tokens, 64-byte swizzle), then the second warpgroup's P at
    /// `TMA_E4_P1` (stage 1; 64 rows of 64 e4m3). The first warpgroup's P is at
    /// `TMA_SMEM_P0`; the rest as above.
    pub const TMA_E4_SLAB: usize = BLOCK_N * 64;
    pub const TMA_E4_VT: usize = 9 * TMA_E4_SLAB;
    pub const TMA_E4_P1: usize = TMA_E4_VT + 512 * 64;
    const _: () = assert!(TMA_E4_P1 + TMA_E4_SLAB <= QK_TILE_BYTES);
    const _: () = assert!(TMA_E4_VT.is_multiple_of(1024) && TMA_E4_P1.is_multiple_of(1024));

    /// Block pairs the e4m3 TMA decode accumulates in O between promotions to its f32
    /// scratch ([`super::DecodeParams::acc`]): the e4m3 `wgmma` adds into O with about 13
    /// bits below the largest addend, so a long split's O drifts (measured 10% low at
    /// 2048 blocks in one split); 32 pairs keep it within about a bf16 ulp.
    pub const E4M3_PROMOTE_PAIRS: u32 = 32;
}

/// The split-KV chunk rule, shared by the decode kernel and the host planner: of `blocks`
/// KV blocks (`decode_tile::BLOCK_N` tokens each), chunk `split` of `splits` covers blocks
/// `[first, end)` with `per = ceil(blocks / splits)`, `first = min(split * per, blocks)`,
/// `end = min(first + per, blocks)`. Later chunks may be empty; `splits == 0` counts as 1.
pub const fn chunk_blocks(blocks: u32, splits: u32, split: u32) -> (u32, u32) {
    let splits = if splits == 0 { 1 } else { splits };
    let per = blocks.div_ceil(splits);
    let first = split.saturating_mul(per);
    let first = if first < blocks { first } else { blocks };
    let end = first.saturating_add(per);
    (first, if end < blocks { end } else { blocks })
}

/// The KV length a kernel works with: negative lengths count as 0 and lengths the page
/// table cannot address are cut to `cap` (`max_pages * page_size`). The decode, reference,
/// gather and schedule kernels and the schedule's host twin all clamp through this.
pub const fn clamp_len(len: i32, cap: u32) -> u32 {
    let l = if len < 0 { 0 } else { len as u32 };
    if l < cap { l } else { cap }
}

/// One rank's share of every sequence's KV under decode context parallelism: global token
/// `t` lives on rank `(t / interleave) % ranks`, at local position
/// `(t / (interleave * ranks)) * interleave + t % interleave` of that rank's paged cache. So
/// `interleave = 1` spreads tokens round-robin, `interleave = page_size` spreads whole pages
/// (vLLM's decode context parallelism lays pages out this way), and an `interleave` at least
/// `ceil(longest / ranks)` gives each rank one contiguous range. Every rank reads the same
/// global `seq_lens`; its local length and each query row's causal limit follow from them,
/// on the device, so a captured graph stays right as lengths grow. `ranks <= 1`: no
/// sharding (the cache holds every token).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Shard {
    /// This rank, `0..ranks`.
    pub rank: u32,
    /// Ranks the sequences are spread over, `..=MAX_MERGE_RANKS`; 0 or 1: off.
    pub ranks: u32,
    /// Consecutive global tokens per run on one rank, `>= 1`.
    pub interleave: u32,
    pub _pad: u32,
}

impl Shard {
    /// No sharding.
    pub const OFF: Shard = Shard {
        rank: 0,
        ranks: 1,
        interleave: 1,
        _pad: 0,
    };

    /// Whether sequences are spread over more than one rank.
    #[inline(always)]
    pub const fn is_on(&self) -> bool {
        self.ranks > 1
    }

    /// How many of the global positions `0..x` live on this rank (`x` itself when off).
    #[inline(always)]
    pub const fn local_count(&self, x: u32) -> u32 {
        if !self.is_on() {
            return x;
        }
        let g = if self.interleave == 0 {
            1
        } else {
            self.interleave
        };
        let run = x / g;
        let rounds = run / self.ranks;
        let owner = run % self.ranks;
        let mut n = rounds * g;
        if owner > self.rank {
            n += g;
        } else if owner == self.rank {
            n += x % g;
        }
        n
    }

    /// This rank's length of a sequence whose global length is `len`; lengths `<= 0`
    /// (padding) stay as they are.
    #[inline(always)]
    pub const fn local_len(&self, len: i32) -> i32 {
        if len <= 0 {
            len
        } else {
            self.local_count(len as u32) as i32
        }
    }

    /// Query token `t` of `s_q` (at global position `len - s_q + t`) sees the global keys
    /// `0..len - s_q + t + 1`, which are this rank's first `visible` local keys (local
    /// positions ascend with global ones), cut to the local length `local`.
    #[inline(always)]
    pub const fn visible(&self, glen: u32, local: u32, t: u32, s_q: u32) -> u32 {
        let end = (glen + t + 1).saturating_sub(s_q);
        let v = self.local_count(end);
        if v < local { v } else { local }
    }

    /// The schedule's KV blocks of a sequence of global length `len` on this rank: its local
    /// length's blocks under the clamp to `max_len`, and at least one while the sharded
    /// sequence has any token, so that a rank holding none of it still writes its rows
    /// (zeros, LSE `-inf`) for the merge.
    #[inline(always)]
    pub const fn schedule_blocks(&self, len: i32, max_len: u32) -> u64 {
        let blocks = schedule_blocks(self.local_len(len), max_len);
        if blocks == 0 && len > 0 && self.is_on() {
            1
        } else {
            blocks
        }
    }
}

/// KV blocks (`decode_tile::BLOCK_N` tokens) of a sequence of length `len` under the
/// schedule's clamp to `max_len`: the unit [`schedule_splits`] counts in, for the schedule
/// kernel, the decode's folded schedule and the host twin alike.
pub const fn schedule_blocks(len: i32, max_len: u32) -> u64 {
    clamp_len(len, max_len).div_ceil(decode_tile::BLOCK_N as u32) as u64
}

/// Launch shape of the split-KV combine kernel.
pub mod combine_tile {
    /// One CTA per query row; each thread owns `D_V / THREADS` output dims.
    pub const THREADS: usize = 128;
    pub const DIMS_PER_THREAD: usize = super::D_V / THREADS;
    const _: () = assert!(DIMS_PER_THREAD * THREADS == super::D_V);
    /// Chunk loads in flight per thread: the narrow kernel (few registers, so many CTAs
    /// per SM for grids of thousands of rows) and the wide one (one memory round trip per
    /// sixteen chunks, for few rows with many chunks).
    pub const UNROLL_NARROW: usize = 2;
    pub const UNROLL_WIDE: usize = 16;
    /// The wide kernel runs only where a launch allows more chunks than this (a large grid
    /// of few chunks is faster narrow: measured on the H200 at B = 32-64, the wide build
    /// alone was up to 22% slower there), and then where it takes fewer rounds (memory
    /// round trips times waves, `names::combine`).
    pub const NARROW_MAX_SPLITS: u32 = 8;
    /// CTAs per SM of each build on sm_90a: narrow 62 registers x 512 threads, wide 168
    /// x 128 (its first sixteen chunks' O in flight with the lse loads).
    pub const NARROW_CTAS_PER_SM: u32 = 2;
    pub const WIDE_CTAS_PER_SM: u32 = 2;
    /// Query rows per CTA of the narrow build (`THREADS` threads each): a large batch's
    /// combine is thousands of rows, most of them exiting at once when their sequence had
    /// one split; four rows per CTA launch a quarter of the CTAs.
    pub const ROWS_NARROW: u32 = 4;
}

/// The 16-bit split partial of the bf16 and fp8-Q 64-row TMA decodes
/// (`names::DECODE_F16_PARTIALS`), in the f32 workspace's row slots (`D_V` f32, 2 KB): half
/// `h` of a row (dims `h * D_V / 2 ..`, one warpgroup's) is stored as fp16 values `o / f_h`
/// in the slot's first `D_V` halves, and `f_h`, a power of two, as the f32 at index
/// `FACTOR + h`. The writer picks `f_h` so that the half's largest magnitude lands in
/// `[2^14, 2^15)`: every value keeps fp16's 11 significant bits relative to its half's
/// largest, whatever the values' range (fp16 alone overflows at 65504, which bf16 and
/// scaled fp8 values pass). A split's output is rounded once more than the f32 partial
/// rounds it, by at most `2^-11` of its half's largest magnitude: an eighth of a bf16
/// output's own rounding (every decode that writes this form has a bf16 output). Half the
/// partials' bytes for the combine to read.
pub mod partial16 {
    /// f32 index, in a row's slot, of the first half's factor (the second's follows).
    pub const FACTOR: usize = super::D_V / 2;
    /// The factor's exponent bias: `f = 2^(e - BIAS)` for the half's largest magnitude
    /// `m < 2^(e - 126)` (`e` its biased f32 exponent), so that `m / f < 2^15`.
    pub const BIAS: i32 = 141;
    /// The smallest exponent of a factor (a normal f32; its inverse, `2^126`, too).
    pub const MIN_EXP: i32 = -126;

    /// The factor `f` of a half row whose largest magnitude is `m`, and `1 / f`: `m / f`
    /// in `[2^14, 2^15)`, below fp16's largest finite 65504 after rounding; `f` at least
    /// `2^MIN_EXP` (zeros, subnormals). A NaN or infinite `m` takes the largest factor,
    /// `2^114`; its values stay NaN or infinite.
    #[inline(always)]
    pub fn factor(m: f32) -> (f32, f32) {
        let e = ((m.to_bits() >> 23) & 0xff) as i32;
        let k = if e - BIAS > MIN_EXP {
            e - BIAS
        } else {
            MIN_EXP
        };
        (
            f32::from_bits(((127 + k) as u32) << 23),
            f32::from_bits(((127 - k) as u32) << 23),
        )
    }
}

/// Launch shape of the reference decode: one CTA of 128 threads per query row; thread `t`
/// accumulates output dims `4t .. 4t + 4`.
pub mod ref_tile {
    pub const THREADS: usize = 128;
    /// Two slots of one f32 per warp.
    pub const SMEM_BYTES: usize = 2 * (THREADS / 32) * 4;
    const _: () = assert!(THREADS * 4 == super::D_V);
}

/// Launch shape of the split-KV schedule kernel: one CTA walks the whole batch.
pub mod schedule_tile {
    pub const THREADS: usize = 1024;
    pub const WARPS: usize = THREADS / 32;
}

/// The split cap of a short sequence with two or more row tiles (more than 64 query rows on
/// the 64-row tiles). Each split of such a shape writes a 64 x 512 f32 partial per row tile
/// that the combine reads back, and at one block per split the CTA's fixed cost (Q tile,
/// partial, prologue) is paid per block. Measured on the H200 (`mla bench --grid small`,
/// `MLA_BENCH_MAX_SPLITS`, docs/PERF.md 3.5), B = 1, bf16: H = 128 S_q = 1, L = 4096
/// 35.9 -> 28.0 us (64 -> 32 splits), L = 16384 44.0 -> 40.6; S_q = 2 L = 4096
/// 36.7 -> 35.5, L = 16384 50.0 -> 49.3.
pub const SHORT_SPLITS_MULTI_TILE: u64 = 32;
/// The split cap of a short sequence with one row tile (H = 16, B = 1, L = 16384: 24.8 us
/// at 64 splits, 31.1 at 32).
pub const SHORT_SPLITS_ONE_TILE: u64 = 64;
/// A sequence may take more splits than its short cap as long as each split keeps at least
/// this many KV blocks: eight blocks per split was the fastest cut of a B = 1 H = 128
/// L = 16384 sequence (8 splits of 32 blocks 87.1 us, 16 of 16 54.8, 32 of 8 40.6, 64 of 4
/// 44.0), and without it one 128K-token sequence ran on 64 of the 132 SMs.
pub const LONG_SPLIT_BLOCKS: u64 = 8;

/// Most splits a sequence of `blocks` KV blocks may take with `tiles` row tiles under a cap
/// of `max_splits`: `min(max_splits, max(short cap, blocks / LONG_SPLIT_BLOCKS))`, where
/// the short cap is [`SHORT_SPLITS_MULTI_TILE`] from two row tiles on and
/// [`SHORT_SPLITS_ONE_TILE`] below. Nondecreasing in `blocks`, so the bound of a plan's
/// longest sequence bounds every sequence (the decode grid).
pub const fn split_bound(blocks: u64, tiles: u64, max_splits: u64) -> u64 {
    let short = if tiles >= 2 {
        SHORT_SPLITS_MULTI_TILE
    } else {
        SHORT_SPLITS_ONE_TILE
    };
    let long = blocks / LONG_SPLIT_BLOCKS;
    let cap = if long > short { long } else { short };
    if cap < max_splits { cap } else { max_splits }
}

/// The work list's part size ([`DecodeParams::list_fixed`]) for a batch of summed cost
/// `total` whose longest sequence has `most` blocks, cut into `parts` parts, with partials
/// for `max_splits` splits: an even share, but no smaller than keeps every sequence within
/// `max_splits` pieces (a run of `n <= (max_splits - 1) x size` blocks meets at most
/// `max_splits` parts); one part for all where the workspace holds one split. At least 1.
/// The decode and the host twin `plan::work_list` both call this.
pub const fn list_share(total: u32, most: u32, parts: u32, max_splits: u32) -> u32 {
    let bound = if max_splits >= 2 {
        most.div_ceil(max_splits - 1)
    } else {
        total
    };
    let even = total.div_ceil(if parts < 1 { 1 } else { parts });
    let s = if even > bound { even } else { bound };
    if s < 1 { 1 } else { s }
}

/// The piece of part `part` (cost positions `ps..pe`, parts of `share`) in a live sequence
/// of `blocks` KV blocks whose cost (`fixed + blocks`) starts at position `c`: its blocks
/// `kb0..kb1`, its split index and the sequence's split count, or `None` where the part
/// holds none of its blocks. The fixed cost comes before the blocks (a part holding only
/// that has no piece of the sequence); a sequence of no blocks is one piece, in the part
/// where its cost starts. Positions fit `u32` (the host bounds the batch's cost).
pub const fn list_piece(
    c: u32,
    blocks: u32,
    fixed: u32,
    part: u32,
    (share, ps, pe): (u32, u32, u32),
) -> Option<(u32, u32, u32, u32)> {
    if blocks == 0 {
        return if c >= ps && c < pe {
            Some((0, 0, 0, 1))
        } else {
            None
        };
    }
    let f = c + fixed;
    let end = f + blocks;
    let u0 = if ps > f { ps } else { f };
    let u1 = if pe < end { pe } else { end };
    if u0 >= u1 {
        return None;
    }
    let first = f / share;
    Some((u0 - f, u1 - f, part - first, (end - 1) / share - first + 1))
}

/// The split count of one sequence under the on-device schedule (the kernel and its host
/// twin `plan::schedule` both call this): `floor(blocks * target_ctas / total_blocks)`,
/// clamped to `1..=min(split_bound(blocks, tiles, max_splits), ceil(blocks / 2^step_log2))`,
/// where `total_blocks` is the batch's KV blocks times the `tiles` row tiles. At most about
/// one wave of `target_ctas` CTAs in all. `step_log2` is 1 for the decodes that compute
/// blocks in pairs (the fp8 16- and 32-row kernels): a split of one block costs them a
/// pair's time, so a sequence is cut into pairs. A sequence with no KV (length <= 0: a
/// padding slot of a batch bucket) gets 0: it is skipped, and its output rows are not
/// written.
pub const fn schedule_splits(
    blocks: u64,
    total_blocks: u64,
    target_ctas: u64,
    max_splits: u64,
    tiles: u64,
    step_log2: u32,
) -> u32 {
    if blocks == 0 {
        return 0;
    }
    let total = if total_blocks == 0 { 1 } else { total_blocks };
    let s = blocks.saturating_mul(target_ctas) / total;
    let bound = split_bound(blocks, tiles, max_splits);
    let k = step_log2 & 7;
    let steps = (blocks + (1u64 << k) - 1) >> k;
    let hi = if bound < steps { bound } else { steps };
    let hi = if hi == 0 { 1 } else { hi };
    let s = if s > hi { hi } else { s };
    (if s == 0 { 1 } else { s }) as u32
}

/// Launch shape of the paged-KV append and gather kernels: one CTA per token row,
/// each thread moves 8 elements.
pub mod paged_tile {
    pub const THREADS: usize = 128;
    pub const ELEMS_PER_THREAD: usize = 8;
    pub const ACTIVE_THREADS: usize = super::D_QK / ELEMS_PER_THREAD;
    const _: () = assert!(ACTIVE_THREADS <= THREADS);
}

/// Kernel symbol names; [`kernels::ALL`] says what each one takes and how it launches.
pub mod names {
    pub const DECODE_BF16: &str = "mla_decode_mma_bf16";
    pub const DECODE_FP16: &str = "mla_decode_mma_fp16";
    pub const DECODE_FP8KV_BF16Q: &str = "mla_decode_mma_fp8kv_bf16q";
    pub const DECODE_FP8: &str = "mla_decode_mma_fp8";
    pub const DECODE16_BF16: &str = "mla_decode_mma16_bf16";
    pub const DECODE16_FP16: &str = "mla_decode_mma16_fp16";
    pub const DECODE16_FP8KV_BF16Q: &str = "mla_decode_mma16_fp8kv_bf16q";
    pub const DECODE16_FP8: &str = "mla_decode_mma16_fp8";
    /// The 32-row fp8-cache decodes (`decode_tile::SMEM_F8X2`): only in the sm_90a image.
    pub const DECODE32_FP8KV_BF16Q: &str = "mla_decode_mma32_fp8kv_bf16q";
    pub const DECODE32_FP8: &str = "mla_decode_mma32_fp8";
    /// The `wgmma` decodes (64-row tile; bf16 Q with a bf16 or an fp8 cache, fp8 Q with an
    /// fp8 cache): only in the sm_90a image (`super::kernels::Images::Sm90aOnly`).
    pub const DECODE_WG_BF16: &str = "mla_decode_wg_bf16";
    pub const DECODE_WG_FP8KV_BF16Q: &str = "mla_decode_wg_fp8kv_bf16q";
    /// fp8 Q with an fp8 cache: Q widened to bf16 (exact) as it loads, then as
    /// `DECODE_WG_FP8KV_BF16Q`.
    pub const DECODE_WG_FP8: &str = "mla_decode_wg_fp8";
    /// The TMA-fed `wgmma` decode (bf16; `decode_tile::TMA_*`). Its entry takes a second
    /// parameter after the `DecodeParams`: the cache's `TensorMap`, by value.
    pub const DECODE_TMA_BF16: &str = "mla_decode_tma_bf16";
    /// The bf16 TMA decode with its copies made by `cp.async` from the page table, a block
    /// ahead, by one of its two warpgroups (the same parameters; the map is not read;
    /// launch shape `decode_tile::TMA_CP_THREADS`): more than `decode_tile::TMA32_ROWS` rows
    /// on pages of fewer than `decode_tile::TMA_MIN_PAGE` tokens, and fused cache layouts the
    /// map does not take.
    pub const DECODE_TMA_BF16_CP: &str = "mla_decode_tma_bf16_cp";
    /// The TMA decode of an fp8 e4m3 cache with bf16 Q on the e4m3 tensor cores: each Q
    /// row scaled by a power of two and split into two e4m3 parts (`hi`, and `lo` for what
    /// `hi` leaves), every k-step of S run for both against the raw cache; P in e4m3.
    pub const DECODE_TMA_FP8KV_BF16Q: &str = "mla_decode_tma_fp8kv_bf16q";
    /// fp8 Q with an fp8 cache on the e4m3 tensor cores: Q and the cache raw, P in e4m3,
    /// as `DECODE_TMA_FP8KV_BF16Q` with one Q part.
    pub const DECODE_TMA_FP8: &str = "mla_decode_tma_fp8";
    /// The three TMA decodes above on the work list (`DecodeParams::list_fixed` >= 1: each
    /// persistent CTA runs its part of the batch's cost, cut at block granularity, and
    /// writes the split counts; shared memory `decode_tile::TMA_LIST_SMEM_BYTES`). The
    /// same parameters; a separate symbol, so that the cell walk's code is the list's
    /// neither way.
    pub const DECODE_TMA_BF16_LIST: &str = "mla_decode_tma_bf16_list";
    pub const DECODE_TMA_FP8KV_BF16Q_LIST: &str = "mla_decode_tma_fp8kv_bf16q_list";
    pub const DECODE_TMA_FP8_LIST: &str = "mla_decode_tma_fp8_list";
    /// The two e4m3 TMA decodes with their copies made by `cp.async` from the page table, each
    /// warpgroup copying its own block of a pair (the same parameters; the map is not read):
    /// more than `decode_tile::TMA32_ROWS` rows, or the `wgmma` tile at any rows, on pages of
    /// fewer than `decode_tile::TMA_MIN_PAGE` tokens, and fused cache layouts the map does not
    /// take.
    pub const DECODE_TMA_FP8KV_BF16Q_CP: &str = "mla_decode_tma_fp8kv_bf16q_cp";
    pub const DECODE_TMA_FP8_CP: &str = "mla_decode_tma_fp8_cp";
    /// The bf16 and fp8-Q 64-row TMA decodes (map, work list and `cp.async` forms): their
    /// split partials are in the 16-bit form (`partial16`), which their combines read
    /// (`CombineParams::partial_f16`). The fp8 cache under bf16 Q writes f32 partials.
    pub const DECODE_F16_PARTIALS: [&str; 6] = [
        DECODE_TMA_BF16,
        DECODE_TMA_BF16_LIST,
        DECODE_TMA_BF16_CP,
        DECODE_TMA_FP8,
        DECODE_TMA_FP8_LIST,
        DECODE_TMA_FP8_CP,
    ];
    /// The TMA decodes' `cp.async` forms: their launches pass a zeroed map, which they do not
    /// read.
    pub const DECODE_TMA_CP_FORMS: [&str; 4] = [
        DECODE_TMA_BF16_CP,
        DECODE_TMA32_BF16_CP,
        DECODE_TMA_FP8KV_BF16Q_CP,
        DECODE_TMA_FP8_CP,
    ];
    /// The small-row TMA decodes (at most `decode_tile::TMA32_ROWS` rows; the same
    /// parameters as `DECODE_TMA_BF16`): bf16, an fp8 cache under bf16 Q, fp8 Q and cache.
    pub const DECODE_TMA32_BF16: &str = "mla_decode_tma32_bf16";
    pub const DECODE_TMA32_FP8KV_BF16Q: &str = "mla_decode_tma32_fp8kv_bf16q";
    pub const DECODE_TMA32_FP8: &str = "mla_decode_tma32_fp8";
    /// The kernels that move registers between their warpgroups (`setmaxnreg`: the small-row
    /// decode's fp8 forms and the 64-row e4m3 TMA decodes' tensor-map forms, 384 threads at
    /// 168 registers, consumers raised to 232): they may keep a few per-cell values in
    /// local memory (at most `REGISTER_SPLIT_LOCAL_BYTES` of stack a thread), never inside
    /// their `wgmma` loop (`tests/ptx_check.rs`).
    pub const REGISTER_SPLIT: &[&str] = &[
        DECODE_TMA32_FP8KV_BF16Q,
        DECODE_TMA32_FP8,
        DECODE_TMA_FP8KV_BF16Q,
        DECODE_TMA_FP8,
        DECODE_TMA_FP8KV_BF16Q_LIST,
        DECODE_TMA_FP8_LIST,
    ];
    pub const REGISTER_SPLIT_LOCAL_BYTES: u32 = 64;
    /// The bf16 small-row TMA decode with its copies made by `cp.async` from the page table
    /// by a producer warpgroup (the same parameters; the map is not read; launch shape
    /// `decode_tile::TMA32_BF16_CP`): pages of fewer than `decode_tile::TMA_MIN_PAGE`
    /// tokens, and fused cache layouts the map does not take.
    pub const DECODE_TMA32_BF16_CP: &str = "mla_decode_tma32_bf16_cp";
    pub const COMBINE_BF16: &str = "mla_combine_bf16";
    pub const COMBINE_FP16: &str = "mla_combine_fp16";
    pub const COMBINE_WIDE_BF16: &str = "mla_combine_wide_bf16";
    pub const COMBINE_WIDE_FP16: &str = "mla_combine_wide_fp16";
    /// The rank merge of context-parallel decode (`MergeParams`).
    pub const MERGE_BF16: &str = "mla_merge_bf16";
    pub const MERGE_FP16: &str = "mla_merge_fp16";

    /// The combine kernel for a 16-bit output (`fp16`, else bf16), a launch's chunk bound
    /// and its rows (`batch * s_q * heads`) on `sm_count` SMs, when every sequence may
    /// have the bound: [`combine_expecting`] with `splits = max_splits`.
    pub const fn combine(fp16: bool, max_splits: u32, rows: u64, sm_count: u32) -> &'static str {
        combine_expecting(fp16, max_splits, max_splits, rows, sm_count)
    }

    /// The combine kernel for a 16-bit output (`fp16`, else bf16), a launch's chunk bound
    /// `max_splits`, the chunks a sequence is expected to have (`splits`: even lengths,
    /// the plan's share per sequence) and its rows (`batch * s_q * heads`) on `sm_count`
    /// SMs. Wide where the launch allows more than `combine_tile::NARROW_MAX_SPLITS`
    /// chunks and it takes fewer rounds than narrow: a round is one memory round trip of
    /// every row in one wave, `ceil(splits / UNROLL)` trips times the waves the rows take.
    /// At B = 8, H = 16, S_q = 4 (512 rows of 16 chunks) narrow is 8 trips in one wave,
    /// wide one trip in two waves.
    pub const fn combine_expecting(
        fp16: bool,
        max_splits: u32,
        splits: u32,
        rows: u64,
        sm_count: u32,
    ) -> &'static str {
        use super::combine_tile as C;
        let splits = if splits < 1 {
            1
        } else if splits > max_splits {
            max_splits
        } else {
            splits
        } as u64;
        let sm = if sm_count < 1 { 1 } else { sm_count } as u64;
        let narrow_rows = C::ROWS_NARROW as u64 * C::NARROW_CTAS_PER_SM as u64 * sm;
        let wide_rows = C::WIDE_CTAS_PER_SM as u64 * sm;
        let narrow = splits.div_ceil(C::UNROLL_NARROW as u64) * rows.div_ceil(narrow_rows);
        let wide_rounds = splits.div_ceil(C::UNROLL_WIDE as u64) * rows.div_ceil(wide_rows);
        let wide = max_splits > C::NARROW_MAX_SPLITS && wide_rounds < narrow;
        match (fp16, wide) {
            (false, false) => COMBINE_BF16,
            (true, false) => COMBINE_FP16,
            (false, true) => COMBINE_WIDE_BF16,
            (true, true) => COMBINE_WIDE_FP16,
        }
    }
    pub const APPEND_BF16: &str = "mla_append_bf16";
    pub const APPEND_FP16: &str = "mla_append_fp16";
    pub const APPEND_FP8_FROM_BF16: &str = "mla_append_fp8_from_bf16";
    pub const GATHER_BF16: &str = "mla_gather_bf16";
    pub const GATHER_FP16: &str = "mla_gather_fp16";
    pub const GATHER_FP8: &str = "mla_gather_fp8";
    pub const GATHER_FP8_TO_BF16: &str = "mla_gather_fp8_to_bf16";
    pub const SCHEDULE: &str = "mla_schedule";
    pub const DECODE_REF_BF16: &str = "mla_decode_ref_bf16";
    pub const DECODE_REF_FP16: &str = "mla_decode_ref_fp16";
    pub const DECODE_REF_FP8KV_BF16Q: &str = "mla_decode_ref_fp8kv_bf16q";
    pub const DECODE_REF_FP8: &str = "mla_decode_ref_fp8";
}

/// Every kernel of the product images in one typed table: symbol, parameters, block
/// size, dynamic shared memory and the images that hold it. The host loads and configures
/// exactly these (`Runtime::load`), launches with their blocks and shared memory, and
/// `tests/ptx_check.rs` holds each image's entries to it.
pub mod kernels {
    use super::names::*;
    use super::*;

    /// What an entry takes: its params struct and, for the TMA decode, the cache's
    /// [`TensorMap`] by value after it.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Params {
        Decode,
        /// `DecodeParams`, then a `TensorMap`.
        DecodeWithMap,
        Combine,
        Merge,
        Append,
        Gather,
        Schedule,
    }

    impl Params {
        /// Bytes of the first parameter (the params struct).
        pub const fn size(self) -> usize {
            use core::mem::size_of;
            match self {
                Params::Decode | Params::DecodeWithMap => size_of::<DecodeParams>(),
                Params::Combine => size_of::<CombineParams>(),
                Params::Merge => size_of::<MergeParams>(),
                Params::Append => size_of::<AppendParams>(),
                Params::Gather => size_of::<GatherParams>(),
                Params::Schedule => size_of::<ScheduleParams>(),
            }
        }

        /// Bytes of the second parameter, if the entry has one.
        pub const fn second(self) -> Option<usize> {
            match self {
                Params::DecodeWithMap => Some(core::mem::size_of::<TensorMap>()),
                _ => None,
            }
        }
    }

    /// Which product images hold a kernel.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Images {
        /// sm_80 (portable), sm_90a and sm_100a.
        All,
        /// The sm_90a image only (`wgmma`, TMA).
        Sm90aOnly,
    }

    /// One kernel: how to launch it.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Kernel {
        pub symbol: &'static str,
        pub params: Params,
        /// Threads per CTA.
        pub block: u32,
        /// Dynamic shared memory per CTA, bytes (the load opts in to it).
        pub smem: u32,
        pub images: Images,
    }

    const fn k(symbol: &'static str, params: Params, block: usize, smem: usize) -> Kernel {
        Kernel {
            symbol,
            params,
            block: block as u32,
            smem: smem as u32,
            images: Images::All,
        }
    }

    const fn sm90a(kernel: Kernel) -> Kernel {
        Kernel {
            images: Images::Sm90aOnly,
            ..kernel
        }
    }

    const DT: usize = decode_tile::THREADS;
    const NARROW: usize = combine_tile::THREADS * combine_tile::ROWS_NARROW as usize;

    pub const ALL: &[Kernel] = &[
        k(DECODE_BF16, Params::Decode, DT, decode_tile::SMEM_BYTES),
        k(DECODE_FP16, Params::Decode, DT, decode_tile::SMEM_BYTES),
        k(
            DECODE_FP8KV_BF16Q,
            Params::Decode,
            DT,
            decode_tile::SMEM_BYTES,
        ),
        k(DECODE_FP8, Params::Decode, DT, decode_tile::SMEM_BYTES),
        k(DECODE16_BF16, Params::Decode, DT, decode_tile::SMEM_BYTES),
        k(DECODE16_FP16, Params::Decode, DT, decode_tile::SMEM_BYTES),
        k(
            DECODE16_FP8KV_BF16Q,
            Params::Decode,
            DT,
            decode_tile::SMEM_BYTES,
        ),
        k(DECODE16_FP8, Params::Decode, DT, decode_tile::SMEM_BYTES),
        sm90a(k(
            DECODE32_FP8KV_BF16Q,
            Params::Decode,
            DT,
            decode_tile::SMEM_F8X2.bytes,
        )),
        sm90a(k(
            DECODE32_FP8,
            Params::Decode,
            DT,
            decode_tile::SMEM_F8X2.bytes,
        )),
        sm90a(k(
            DECODE_WG_BF16,
            Params::Decode,
            DT,
            decode_tile::WG_SMEM_BYTES,
        )),
        sm90a(k(
            DECODE_WG_FP8KV_BF16Q,
            Params::Decode,
            DT,
            decode_tile::WG_SMEM_BYTES,
        )),
        sm90a(k(
            DECODE_WG_FP8,
            Params::Decode,
            DT,
            decode_tile::WG_SMEM_BYTES,
        )),
        sm90a(k(
            DECODE_TMA_BF16,
            Params::DecodeWithMap,
            DT,
            decode_tile::TMA_SMEM_BYTES,
        )),
        sm90a(k(
            DECODE_TMA_BF16_CP,
            Params::DecodeWithMap,
            decode_tile::TMA_CP_THREADS,
            decode_tile::TMA_SMEM_BYTES,
        )),
        sm90a(k(
            DECODE_TMA_FP8KV_BF16Q,
            Params::DecodeWithMap,
            decode_tile::TMA_E4_THREADS,
            decode_tile::TMA_E4_SMEM_BYTES,
        )),
        sm90a(k(
            DECODE_TMA_FP8,
            Params::DecodeWithMap,
            decode_tile::TMA_E4_THREADS,
            decode_tile::TMA_E4_SMEM_BYTES,
        )),
        sm90a(k(
            DECODE_TMA_BF16_LIST,
            Params::DecodeWithMap,
            DT,
            decode_tile::TMA_LIST_SMEM_BYTES,
        )),
        sm90a(k(
            DECODE_TMA_FP8KV_BF16Q_LIST,
            Params::DecodeWithMap,
            decode_tile::TMA_E4_THREADS,
            decode_tile::TMA_E4_SMEM_BYTES,
        )),
        sm90a(k(
            DECODE_TMA_FP8_LIST,
            Params::DecodeWithMap,
            decode_tile::TMA_E4_THREADS,
            decode_tile::TMA_E4_SMEM_BYTES,
        )),
        sm90a(k(
            DECODE_TMA_FP8KV_BF16Q_CP,
            Params::DecodeWithMap,
            DT,
            decode_tile::TMA_SMEM_BYTES,
        )),
        sm90a(k(
            DECODE_TMA_FP8_CP,
            Params::DecodeWithMap,
            DT,
            decode_tile::TMA_SMEM_BYTES,
        )),
        sm90a(k(
            DECODE_TMA32_BF16,
            Params::DecodeWithMap,
            decode_tile::TMA32_BF16.threads,
            decode_tile::TMA32_BF16.bytes,
        )),
        sm90a(k(
            DECODE_TMA32_BF16_CP,
            Params::DecodeWithMap,
            decode_tile::TMA32_BF16_CP.threads,
            decode_tile::TMA32_BF16_CP.bytes,
        )),
        sm90a(k(
            DECODE_TMA32_FP8KV_BF16Q,
            Params::DecodeWithMap,
            decode_tile::TMA32_FP8.threads,
            decode_tile::TMA32_FP8.bytes,
        )),
        sm90a(k(
            DECODE_TMA32_FP8,
            Params::DecodeWithMap,
            decode_tile::TMA32_FP8.threads,
            decode_tile::TMA32_FP8.bytes,
        )),
        k(COMBINE_BF16, Params::Combine, NARROW, 0),
        k(COMBINE_FP16, Params::Combine, NARROW, 0),
        k(COMBINE_WIDE_BF16, Params::Combine, combine_tile::THREADS, 0),
        k(COMBINE_WIDE_FP16, Params::Combine, combine_tile::THREADS, 0),
        k(MERGE_BF16, Params::Merge, NARROW, 0),
        k(MERGE_FP16, Params::Merge, NARROW, 0),
        k(APPEND_BF16, Params::Append, paged_tile::THREADS, 0),
        k(APPEND_FP16, Params::Append, paged_tile::THREADS, 0),
        k(APPEND_FP8_FROM_BF16, Params::Append, paged_tile::THREADS, 0),
        k(GATHER_BF16, Params::Gather, paged_tile::THREADS, 0),
        k(GATHER_FP16, Params::Gather, paged_tile::THREADS, 0),
        k(GATHER_FP8, Params::Gather, paged_tile::THREADS, 0),
        k(GATHER_FP8_TO_BF16, Params::Gather, paged_tile::THREADS, 0),
        k(
            SCHEDULE,
            Params::Schedule,
            schedule_tile::THREADS,
            schedule_tile::WARPS * 8,
        ),
        k(
            DECODE_REF_BF16,
            Params::Decode,
            ref_tile::THREADS,
            ref_tile::SMEM_BYTES,
        ),
        k(
            DECODE_REF_FP16,
            Params::Decode,
            ref_tile::THREADS,
            ref_tile::SMEM_BYTES,
        ),
        k(
            DECODE_REF_FP8KV_BF16Q,
            Params::Decode,
            ref_tile::THREADS,
            ref_tile::SMEM_BYTES,
        ),
        k(
            DECODE_REF_FP8,
            Params::Decode,
            ref_tile::THREADS,
            ref_tile::SMEM_BYTES,
        ),
    ];

    /// The table's entry for `symbol`.
    pub fn find(symbol: &str) -> Option<&'static Kernel> {
        ALL.iter().find(|k| k.symbol == symbol)
    }
}

/// Params of `mla_decode_mma_*` (`BLOCK_M` rows per CTA), `mla_decode_mma16_*`
/// (`BLOCK_M_SMALL`) and `mla_decode_ref_*` (one row per CTA, grid `(s_q*heads, batch)`).
/// Grid of the first two: `(ceil(s_q*heads / rows per CTA), batch, max_splits)` (split-major),
/// block `decode_tile::THREADS`, dynamic shared memory `decode_tile::SMEM_BYTES`.
///
/// Strides are in elements. Element types follow the kernel: q and kv 16-bit (bf16 or
/// fp16) or fp8 per the symbol; `out` is 16-bit (fp16 only for the fp16 kernel).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DecodeParams {
    /// `[batch, s_q, heads, D_QK]`, last dim contiguous. Never null.
    pub q: DevPtr<u8>,
    /// `[num_pages, page_size, D_QK]`, last dim contiguous. Never null.
    pub kv_cache: DevPtr<u8>,
    /// `[batch, page_table_stride]` i32 page ids. Never null.
    pub page_table: DevPtr<i32>,
    /// `[batch]` i32 KV lengths including this step's `s_q` tokens. Never null.
    pub seq_lens: DevPtr<i32>,
    /// `[batch]` i32 split count of each sequence, `0..=max_splits` (0: skipped, its rows
    /// are not written). Never null.
    pub num_splits: DevPtr<i32>,
    /// `[batch, s_q, heads, D_V]`: written for sequences with one split. Never null.
    pub out: DevPtr<u8>,
    /// `[batch, s_q, heads]` f32 natural-log LSE, written with `out`. Never null.
    pub lse: DevPtr<f32>,
    /// `[max_splits, batch, s_q, heads, D_V]` f32 partial outputs. Null only if every
    /// sequence has one split.
    pub partial_o: DevPtr<f32>,
    /// `[max_splits, batch, s_q, heads]` f32 partial LSE. Null with `partial_o`.
    pub partial_lse: DevPtr<f32>,
    pub q_stride_b: u64,
    pub q_stride_s: u64,
    pub q_stride_h: u64,
    pub kv_stride_page: u64,
    pub kv_stride_token: u64,
    pub out_stride_b: u64,
    pub out_stride_s: u64,
    pub out_stride_h: u64,
    pub batch: u32,
    pub s_q: u32,
    pub heads: u32,
    /// Tokens per page, a power of two; `page_shift = log2(page_size)`.
    pub page_size: u32,
    pub page_shift: u32,
    /// Columns of the page table per sequence (entries beyond a sequence's pages are never read).
    pub page_table_stride: u32,
    /// Valid page ids are `0..num_pages`; a token on any other id reads as zeros.
    pub num_pages: u32,
    /// Capacity of the split dimension of the workspace.
    pub max_splits: u32,
    /// Logit scale including fp8 `q_scale * kv_scale`.
    pub softmax_scale: f32,
    /// Dequantisation factor of values (`kv_scale` for fp8 caches, else 1).
    pub value_scale: f32,
    /// Multiplies the final output.
    pub output_scale: f32,
    /// Page-table columns in use per sequence: lengths beyond `max_pages * page_size` are
    /// cut there, so no table entry past a row's end is ever read.
    pub max_pages: u32,
    /// A persistent decode (the TMA decodes): the split dimension of the virtual grid
    /// `(row tiles, batch, persist_splits)`, split-major as the launched grid of the other
    /// decodes, whose cells the launched CTAs (`grid.x` of them, at most one per SM) take
    /// in turn: CTA `c` takes cells `c, c + grid.x, ...` that have work. 0: one CTA per
    /// cell of the launched grid.
    pub persist_splits: u32,
    /// The work list of the 64-row TMA decodes' list kernels (`names::DECODE_TMA_*_LIST`,
    /// which must get `f >= 1`; every other decode must get 0 and walks the cells above):
    /// the decode prices each live sequence at its KV blocks plus `f` blocks of fixed
    /// cost, cuts that cost, concatenated over the batch, into `max(1, grid.x / row
    /// tiles)` parts of equal size (at least `ceil(longest / (max_splits - 1))` blocks, so
    /// no sequence takes more than `max_splits` pieces), and each CTA runs its part's
    /// pieces (one per sequence it meets, a contiguous block range) for one row tile. It
    /// writes `num_splits` itself (a sequence's pieces are its splits, in order), so it
    /// reads neither them nor `fold`.
    pub list_fixed: u32,
    /// Checked mode ([`fault`]): null, off; else the workspace's fault record, where a
    /// decode that meets a page-table entry outside `0..num_pages` or a length past
    /// `max_pages * page_size` records the first such fault.
    pub fault: DevPtr<i32>,
    /// The split schedule folded into the decode ([`SchedFold`]); `tiles == 0`: off, the
    /// split counts are read from `num_splits`.
    pub fold: SchedFold,
    /// Context parallelism ([`Shard`]): `seq_lens` are global lengths and the cache holds
    /// this rank's share of each sequence. Off (`ranks <= 1`): the cache holds it all.
    pub shard: Shard,
    /// The rope part (dims `D_V..D_QK`) of the cache rows: dim `D_V + d` of token `t` in
    /// page `g` at element `g * kpe_stride_page + t * kpe_stride_token + d` of `kpe`;
    /// `kv_cache` then holds dims `0..D_V` of each row (a split cache). For a fused cache
    /// the host passes `kv_cache + D_V` elements and the cache's strides. Never null.
    pub kpe: DevPtr<u8>,
    pub kpe_stride_page: u64,
    pub kpe_stride_token: u64,
    /// The rope part of the q rows, likewise (`q + D_V` elements for a fused q). Never null.
    pub q_pe: DevPtr<u8>,
    pub q_pe_stride_b: u64,
    pub q_pe_stride_s: u64,
    pub q_pe_stride_h: u64,
    /// The e4m3 TMA decodes' promotion scratch: [`ACC_FLOATS_PER_CTA`] f32 per launched CTA
    /// (the 64-row decode: `[32, 256]` f32x4, one 512-byte row per O fragment), where a
    /// CTA adds its O from time to time so that the e4m3 tensor cores' truncated sums never
    /// accumulate more than [`decode_tile::E4M3_PROMOTE_PAIRS`] block pairs. The host sizes
    /// it for the device's SM count (the persistent grid's bound). Never null.
    pub acc: DevPtr<f32>,
}

impl DecodeParams {
    /// Element offset in `q` of the row of sequence `b`, query token `t`, head `h`.
    #[inline(always)]
    pub const fn q_row(&self, b: u64, t: u64, h: u64) -> u64 {
        b * self.q_stride_b + t * self.q_stride_s + h * self.q_stride_h
    }

    /// Element offset in `q_pe` of the same row's rope part.
    #[inline(always)]
    pub const fn q_pe_row(&self, b: u64, t: u64, h: u64) -> u64 {
        b * self.q_pe_stride_b + t * self.q_pe_stride_s + h * self.q_pe_stride_h
    }
}

/// f32 values of [`DecodeParams::acc`] per CTA of the TMA decodes: 256 threads x 136 (the
/// 64-row decode's 128 per thread; the small-row decode's two consumer warpgroups, 128 O
/// values and 8 row maxima per thread each).
pub const ACC_FLOATS_PER_CTA: usize = decode_tile::THREADS * 136;

/// The record a trace build's (`MLA_TRACE=1`) bf16 TMA decodes leave in each CTA's share of
/// [`DecodeParams::acc`], as u64 words: [`trace::MAGIC`], the entry stamp (`%globaltimer`,
/// ns), the cells recorded (the SM's `%smid` in the high half), then per cell (at most
/// [`trace::CELLS`]) `(b << 32) | blocks` and its four stamps: start, prologue end,
/// block-loop end, epilogue end.
pub mod trace {
    /// The first word of a CTA's record.
    pub const MAGIC: u64 = 0x6d6c_615f_7472_6163;
    /// Cells recorded per CTA.
    pub const CELLS: u32 = 8;
    /// Words of a whole record.
    pub const WORDS: usize = 3 + 5 * CELLS as usize;
    const _: () = assert!(2 * WORDS <= super::ACC_FLOATS_PER_CTA);
}

/// The schedule kernel's rule run by every decode CTA instead (batches up to
/// [`SCHED_FOLD_MAX_BATCH`]): each warp sums the batch's KV blocks from `seq_lens` (lengths
/// clamped to `max_len`), the CTA takes its sequence's count from [`schedule_splits`] with
/// `tiles`, `target_ctas` and the params' `max_splits`, and the CTA of row tile 0, split 0
/// writes it to `num_splits[b]` for the combine. Saves the schedule kernel's launch, which a
/// dependent decode waits out in full.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SchedFold {
    /// Row tiles per sequence; 0: no fold.
    pub tiles: u32,
    pub target_ctas: u32,
    pub max_len: u32,
    /// log2 of the KV blocks the decode computes per step ([`schedule_splits`]).
    pub step_log2: u32,
}

/// Largest batch whose decode folds the schedule in (every warp of every CTA reads all of
/// `seq_lens`). H200, peers' harness, two repeats each (docs/PERF.md v12): B=1 1-6% faster
/// on every shape and dtype, B=8 within 2% either way, B=64/128 up to 3% slower (the fp8
/// `wgmma` decode at H=128), so the fold stops at 8.
pub const SCHED_FOLD_MAX_BATCH: usize = 8;

/// A TMA tensor map (the driver's opaque 128-byte `CUtensorMap`), passed by value as the
/// TMA decode's second kernel parameter: the kernel issues its copies from the
/// parameter's own address, so each launch, eager or captured in a graph, reads the map
/// of the cache it was given, and no copy of the map lives in device memory.
///
/// A map must be 64-byte aligned. rustc's nvptx kernel ABI takes parameter alignments up
/// to 16 only, so the entry is emitted as `.param .align 16 .b8 <entry>_param_1[128]`
/// and the build raises that declaration to `.align 64` in the PTX
/// ([`TENSOR_MAP_PARAM_ALIGN`]) before `ptxas` or the driver lays the parameters out.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorMap {
    pub words: [u64; 16],
}

/// The alignment the TMA decode's tensor-map parameter is declared with in the PTX.
pub const TENSOR_MAP_PARAM_ALIGN: usize = 64;

/// The checked mode's fault record: four i32 words in the plan's workspace, zero when no
/// fault was met. The first decode CTA to meet one claims the record (compare-and-swap of
/// word [`fault::KIND`] from 0) and writes the rest; later faults leave it as it is.
pub mod fault {
    /// Word 0: what was met, [`NONE`], [`PAGE_ID`] or [`SEQ_LEN`].
    pub const KIND: usize = 0;
    /// Word 1: the sequence (batch index).
    pub const SEQUENCE: usize = 1;
    /// Word 2: the page-table column of a [`PAGE_ID`] fault; -1 for [`SEQ_LEN`].
    pub const COLUMN: usize = 2;
    /// Word 3: the value met (the page id, or the length).
    pub const VALUE: usize = 3;
    pub const WORDS: usize = 4;
    pub const NONE: i32 = 0;
    /// A page-table entry the sequence's length reaches is outside `0..num_pages`.
    pub const PAGE_ID: i32 = 1;
    /// A length is past what the page table addresses (`max_pages * page_size`).
    pub const SEQ_LEN: i32 = 2;
}

/// Most ranks one merge takes (`mla_merge_*`).
pub const MAX_MERGE_RANKS: u32 = 64;

/// Params of `mla_merge_bf16` / `mla_merge_fp16`: `ranks` results of the same `rows` query
/// rows merged by their LSE. Grid: `ceil(rows / combine_tile::ROWS_NARROW)`, block
/// `combine_tile::THREADS * combine_tile::ROWS_NARROW`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MergeParams {
    /// `[ranks][rows, D_V]` 16-bit, ranks `out_rank_stride` elements apart. Never null.
    pub outs: DevPtr<u8>,
    /// `[ranks][rows]` f32, ranks `lse_rank_stride` apart. Never null.
    pub lses: DevPtr<f32>,
    /// `[rows, D_V]` 16-bit. Never null.
    pub out: DevPtr<u8>,
    /// `[rows]` f32. Never null.
    pub lse: DevPtr<f32>,
    pub out_rank_stride: u64,
    pub lse_rank_stride: u64,
    /// `[rows / rows_per_seq]` i32 lengths, or null: a row of a sequence whose length is
    /// `<= 0` (padding) is left as it is, neither read nor written (the context-parallel
    /// decode's merge, whose ranks wrote no row of a padding sequence). Null: every row.
    pub seq_lens: DevPtr<i32>,
    pub rows: u32,
    /// `1..=MAX_MERGE_RANKS`.
    pub ranks: u32,
    /// Rows per sequence (`s_q * heads`), `>= 1`.
    pub rows_per_seq: u32,
    pub _pad: u32,
}

/// Params of `mla_combine_*`. Grid: `(X, batch)`, `X` in `1..=ceil(s_q * heads / R)` (each CTA
/// strides over its sequence's groups of `R` rows), block `combine_tile::THREADS * R`; `R` is
/// `combine_tile::ROWS_NARROW` for the narrow kernels and 1 for the wide ones.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CombineParams {
    /// `[max_splits, batch, s_q, heads, D_V]` f32. Never null.
    pub partial_o: DevPtr<f32>,
    /// `[max_splits, batch, s_q, heads]` f32 (natural log, `-inf` for empty chunks). Never null.
    pub partial_lse: DevPtr<f32>,
    /// `[batch]` i32; sequences with one split (the decode wrote them) or none (skipped)
    /// are left alone.
    pub num_splits: DevPtr<i32>,
    /// `[batch, s_q, heads, D_V]` 16-bit. Never null.
    pub out: DevPtr<u8>,
    /// `[batch, s_q, heads]` f32. Never null.
    pub lse: DevPtr<f32>,
    pub out_stride_b: u64,
    pub out_stride_s: u64,
    pub out_stride_h: u64,
    pub batch: u32,
    pub s_q: u32,
    pub heads: u32,
    pub max_splits: u32,
    pub output_scale: f32,
    /// 0: `partial_o` holds f32 rows. 1: the 16-bit form the bf16 and fp8-Q 64-row TMA
    /// decodes write ([`partial16`]): fp16 rows with an exponent factor per half row.
    pub partial_f16: u32,
    /// `[batch]` i32 lengths, or null: a sequence of length `<= 0` (padding) is left alone
    /// whatever its `num_splits` entry holds (a step slot's counts may be another step's).
    pub seq_lens: DevPtr<i32>,
}

/// Params of `mla_append_*`. Grid: `(s_q, batch)`, block `paged_tile::THREADS`.
/// Token `t` of sequence `b` goes to position `seq_lens[b] - s_q + t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AppendParams {
    /// `[batch, s_q, D_QK]` new rows (bf16 for the fp8 cache). Never null.
    pub new_kv: DevPtr<u8>,
    /// `[num_pages, page_size, D_QK]`. Never null.
    pub kv_cache: DevPtr<u8>,
    /// `[batch, page_table_stride]` i32. Never null.
    pub page_table: DevPtr<i32>,
    /// `[batch]` i32, lengths including the new tokens. Never null.
    pub seq_lens: DevPtr<i32>,
    pub new_stride_b: u64,
    pub new_stride_s: u64,
    pub kv_stride_page: u64,
    pub kv_stride_token: u64,
    pub batch: u32,
    pub s_q: u32,
    pub page_size: u32,
    pub page_shift: u32,
    pub page_table_stride: u32,
    pub num_pages: u32,
    /// fp8 caches store `saturate(x / kv_scale)` (an IEEE division, then one rounding to
    /// e4m3: not `x * (1 / kv_scale)`, which rounds twice).
    pub kv_scale: f32,
    /// Page-table columns in use per sequence (see [`DecodeParams::max_pages`]).
    pub max_pages: u32,
    /// The cache rows' rope part, as [`DecodeParams::kpe`] (`kv_cache + D_V` for a fused
    /// cache). Never null.
    pub kpe: DevPtr<u8>,
    pub kpe_stride_page: u64,
    pub kpe_stride_token: u64,
}

/// Params of `mla_gather_*`. Grid: `(out_rows, batch)`, block `paged_tile::THREADS`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GatherParams {
    /// `[num_pages, page_size, D_QK]`. Never null.
    pub kv_cache: DevPtr<u8>,
    /// `[batch, page_table_stride]` i32. Never null.
    pub page_table: DevPtr<i32>,
    /// `[batch]` i32. Never null.
    pub seq_lens: DevPtr<i32>,
    /// `[batch, out_stride_b / D_QK, D_QK]`: row `j < seq_lens[b]` of sequence `b` at
    /// `out + b * out_stride_b + j * D_QK`. Never null.
    pub out: DevPtr<u8>,
    pub out_stride_b: u64,
    pub kv_stride_page: u64,
    pub kv_stride_token: u64,
    pub batch: u32,
    pub page_size: u32,
    pub page_shift: u32,
    pub page_table_stride: u32,
    pub num_pages: u32,
    /// Rows per sequence the output can hold; longer sequences are cut there.
    pub out_rows: u32,
    /// Multiplies dequantised fp8 values (`kv_scale`).
    pub kv_scale: f32,
    /// Page-table columns in use per sequence (see [`DecodeParams::max_pages`]).
    pub max_pages: u32,
    /// The cache rows' rope part, as [`DecodeParams::kpe`]. Never null.
    pub kpe: DevPtr<u8>,
    pub kpe_stride_page: u64,
    pub kpe_stride_token: u64,
}

/// Params of `mla_schedule`. Grid `(1)`, block `schedule_tile::THREADS`. Writes the split
/// count of every sequence from the device-resident lengths, so a captured CUDA graph stays
/// right as lengths change.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ScheduleParams {
    /// `[batch]` i32 KV lengths. Never null.
    pub seq_lens: DevPtr<i32>,
    /// `[batch]` i32 output: split count per sequence. Never null.
    pub num_splits: DevPtr<i32>,
    pub batch: u32,
    /// Row tiles per sequence (`ceil(s_q * heads / rows per CTA)` of the decode's tile).
    pub tiles: u32,
    /// CTAs the schedule aims at (waves x SMs).
    pub target_ctas: u32,
    /// Upper bound of any split count (the decode grid's x dimension).
    pub max_splits: u32,
    /// Lengths are clamped to `0..=max_len` (`max_pages * page_size`), as the decode does.
    pub max_len: u32,
    /// log2 of the KV blocks the decode computes per step ([`schedule_splits`]).
    pub step_log2: u32,
    /// The decode's shard ([`Shard`]): the schedule counts this rank's blocks.
    pub shard: Shard,
}

/// The primitive test kernels of the separate primitives image (`mla_prim_sm_90a`): one tiny
/// kernel per instruction family the product kernels do not exercise yet.
pub mod primitives {
    use super::DevPtr;

    pub const WGMMA_M64N64K16_BF16: &str = "mla_prim_wgmma_m64n64k16_bf16";

    /// Params of `mla_prim_wgmma_m64n64k16_bf16`: grid `(1)`, block 128, 4096 bytes of
    /// dynamic shared memory; `d = a . b^T`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct WgmmaPrimParams {
        /// `[64, 16]` bf16, row-major.
        pub a: DevPtr<u16>,
        /// `[64, 16]` bf16, row-major.
        pub b: DevPtr<u16>,
        /// `[64, 64]` f32, row-major.
        pub d: DevPtr<f32>,
    }

    pub const WGMMA_SMEM_BYTES: usize = 4096;

    /// The layouts the `wgmma` decode needs, each checked alone: 128-byte-swizzled tiles of
    /// 64-element (128-byte) rows, 8-row atoms of 1024 bytes, every tile 1024-byte aligned.
    ///
    /// `mla_prim_wgmma_sw128_kmajor`: `d [64, 64] = a [64, 64] . b [64, 64]^T`, both operands
    /// K-major (Q and K tiles), four k-steps at +32 bytes of the descriptors' start address.
    pub const WGMMA_SW128_KMAJOR: &str = "mla_prim_wgmma_sw128_kmajor";
    /// `mla_prim_wgmma_sw128_mn_b`: `d [64, 128] = a [64, 64] . b [64, 128]`, `a` K-major in
    /// shared memory (P), `b` row-major by K (V: token rows of dims), stored MN-major as two
    /// 64-column slabs of 8 KB, read with the transposed-B flag; B descriptor offsets `lbo`,
    /// `sbo` from the params.
    pub const WGMMA_SW128_MN_B: &str = "mla_prim_wgmma_sw128_mn_b";
    /// `mla_prim_wgmma_rs_mn_b`: as `WGMMA_SW128_MN_B` with `a` from registers (P kept in
    /// registers between QK^T and PV).
    pub const WGMMA_RS_MN_B: &str = "mla_prim_wgmma_rs_mn_b";

    /// Params of the three layout kernels: grid `(1)`, block 128, `WGMMA_LAYOUT_SMEM_BYTES`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct WgmmaLayoutParams {
        /// `[64, 64]` bf16, row-major (M x K).
        pub a: DevPtr<u16>,
        /// K-major kernel: `[64 (N), 64 (K)]`; MN-major kernels: `[64 (K), 128 (N)]`; bf16.
        pub b: DevPtr<u16>,
        /// K-major kernel: `[64, 64]`; MN-major kernels: `[64, 128]`; f32, row-major.
        pub d: DevPtr<f32>,
        /// B descriptor: leading / stride dimension byte offsets (MN-major kernels).
        pub lbo: u32,
        pub sbo: u32,
    }

    /// 1 KB of alignment slack + an 8 KB A tile + 16 KB for B.
    pub const WGMMA_LAYOUT_SMEM_BYTES: usize = 1024 + 8192 + 16384;

    /// `mla_prim_wgmma_e4m3`: the layouts an e4m3 decode needs, in one warpgroup. Tiles of
    /// 64-byte rows with the 64-byte swizzle (a TMA box of 64 fp8 dims lands so), 8-row atoms
    /// of 512 bytes. `s [64, 64] = q . kv^T` (`m64n64k32` e4m3, both K-major, two k-steps at
    /// +32 bytes); then P = e4m3(`s * p_scale`) packed from the accumulators into the A
    /// registers and `o [64, 64] = P . kv` against V^T (`kv` transposed in shared memory by
    /// 4 x 4 byte blocks, each 16 tokens stored in the order `2c, 2c + 1, 2c + 8, 2c + 9`
    /// for `c = 0..4`, which puts each lane's accumulators in its A fragment as they are).
    pub const WGMMA_E4M3: &str = "mla_prim_wgmma_e4m3";

    /// Params of `mla_prim_wgmma_e4m3`: grid `(1)`, block 128, `E4M3_SMEM_BYTES`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct E4m3PrimParams {
        /// `[64, 64]` e4m3, row-major (query rows x dims).
        pub q: DevPtr<u8>,
        /// `[64, 64]` e4m3, row-major (tokens x dims): K for `s`, V for `o`.
        pub kv: DevPtr<u8>,
        /// `[64, 64]` f32, row-major.
        pub s: DevPtr<f32>,
        /// `[64, 64]` f32, row-major.
        pub o: DevPtr<f32>,
        /// P's quantisation scale.
        pub p_scale: f32,
    }

    /// 1 KB of alignment slack + the q, kv and V^T tiles (4 KB each).
    pub const E4M3_SMEM_BYTES: usize = 1024 + 3 * 4096;

    /// `mla_prim_bulk_copy`: `cp.async.bulk` rows `idx[r]` of `src` (rows of `row_bytes`) into
    /// shared memory row `r`, completed on an `mbarrier` (one arrival with the expected
    /// bytes), then written back to `dst` row `r` with ordinary loads and stores.
    pub const BULK_COPY: &str = "mla_prim_bulk_copy";

    /// Params of `mla_prim_bulk_copy`: grid `(1)`, block 128, `BULK_SMEM_BYTES`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct BulkCopyParams {
        pub src: DevPtr<u8>,
        /// `[rows]` row indices into `src`.
        pub idx: DevPtr<i32>,
        /// `[rows, row_bytes]`.
        pub dst: DevPtr<u8>,
        /// `1..=BULK_MAX_ROWS`.
        pub rows: u32,
        /// A multiple of 16, at most `BULK_MAX_ROW_BYTES`.
        pub row_bytes: u32,
    }

    pub const BULK_MAX_ROWS: usize = 64;
    pub const BULK_MAX_ROW_BYTES: usize = 1152;
    /// 128 bytes for the mbarrier, then the rows.
    pub const BULK_SMEM_BYTES: usize = 128 + BULK_MAX_ROWS * BULK_MAX_ROW_BYTES;

    /// `mla_prim_tma_slabs`: one 64-token block of a paged bf16 cache (`[num_pages,
    /// page_size, 576]`, contiguous) into shared memory by nine TMA copies, one per 64-dim
    /// slab, through a 3-D tensor map (`{576, page_size, num_pages}`, box `{64, rows, 1}`,
    /// 128-byte swizzle) the host encoded; `64 / rows` boxes per slab when pages hold fewer
    /// than 64 tokens. The shared tile is written back to `dst` byte for byte, so the host
    /// checks it is exactly the `wgmma` decode's slab layout.
    pub const TMA_SLABS: &str = "mla_prim_tma_slabs";

    /// Params of `mla_prim_tma_slabs`: grid `(1)`, block 128, `TMA_SMEM_BYTES`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct TmaSlabsParams {
        /// The 128-byte tensor map, in global memory (64-byte aligned).
        pub tmap: DevPtr<u8>,
        /// `[64 * 576]` bf16: the shared tile as it landed (nine slabs of 64 x 128 bytes).
        pub dst: DevPtr<u8>,
        /// The block's first page (`64 / rows` pages from it).
        pub page: u32,
        /// Tokens per page and rows per box: a power of two, 8..=64.
        pub rows: u32,
    }

    /// 1 KB of alignment slack (the 128-byte swizzle needs 1024-byte aligned boxes), the
    /// mbarrier, then the 72 KB tile.
    pub const TMA_SMEM_BYTES: usize = 1024 + 128 + 64 * 1152;

    /// `mla_prim_exchange`: the TMA decode's two-warpgroup exchange protocol alone, to check
    /// it and to run compute-sanitizer's racecheck on it without the rest of the decode.
    /// 256 threads; `rounds` rounds of: warpgroup 0 writes two 64-row slots and
    /// `bar.arrive`s barrier 1; warpgroup 1 `bar.sync`s it, reads them, writes two more from
    /// them and `bar.arrive`s barrier 2; warpgroup 0 `bar.sync`s that and reads them. Then
    /// each warpgroup writes its running sum to its own slot, `bar.sync 0`, and reads the
    /// other's. `out[tid] = [own sum, other's sum]`. With `bulk_prologue != 0` the kernel
    /// first waits on an `mbarrier` for one 16-byte `cp.async.bulk` from `src`, as the
    /// decode does before its loop. `sync_mode` 1 replaces each `bar.arrive` with a
    /// `bar.sync` on the same named barrier, 2 every named barrier with `bar.sync 0`, 3 is
    /// 1 plus a per-warpgroup (128-thread) named barrier and, after the prologue, an
    /// `mbarrier` poll each round, 4 is 3 plus a tile handed from one warpgroup's generic
    /// stores (fenced to the async proxy) to the other's `wgmma` each round: the controls
    /// that tell which barrier forms and proxies racecheck orders accesses by.
    pub const EXCHANGE: &str = "mla_prim_exchange";

    /// Params of `mla_prim_exchange`: grid `(1)`, block 256, `EXCHANGE_SMEM_BYTES`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub struct ExchangeParams {
        /// 16 bytes, read only with `bulk_prologue != 0`.
        pub src: DevPtr<u8>,
        /// `[256, 2]` f32.
        pub out: DevPtr<f32>,
        pub rounds: u32,
        pub bulk_prologue: u32,
        /// 0: `bar.arrive` / `bar.sync` on named barriers (the decode's protocol); 1:
        /// `bar.sync` on both sides; 2: `bar.sync 0` everywhere; 3: 1 with the decode's
        /// other barrier kinds in each round; 4: 3 with a `wgmma` over a handed-over tile.
        pub sync_mode: u32,
    }

    /// The mbarrier and the 16 copied bytes (128), six 64-row f32 slots, then (at
    /// `EXCHANGE_TILE_A`) two 2 KB bf16 tiles for sync mode 4's `wgmma`.
    pub const EXCHANGE_SMEM_BYTES: usize = EXCHANGE_TILE_A as usize + 4096;
    /// Offset of sync mode 4's `wgmma` operand tiles (A, then B 2 KB on).
    pub const EXCHANGE_TILE_A: u32 = 2048;

    /// Every primitive kernel with the size of its params struct.
    pub const ALL: &[(&str, usize)] = &[
        (
            WGMMA_M64N64K16_BF16,
            core::mem::size_of::<WgmmaPrimParams>(),
        ),
        (
            WGMMA_SW128_KMAJOR,
            core::mem::size_of::<WgmmaLayoutParams>(),
        ),
        (WGMMA_SW128_MN_B, core::mem::size_of::<WgmmaLayoutParams>()),
        (WGMMA_RS_MN_B, core::mem::size_of::<WgmmaLayoutParams>()),
        (WGMMA_E4M3, core::mem::size_of::<E4m3PrimParams>()),
        (BULK_COPY, core::mem::size_of::<BulkCopyParams>()),
        (TMA_SLABS, core::mem::size_of::<TmaSlabsParams>()),
        (EXCHANGE, core::mem::size_of::<ExchangeParams>()),
    ];
}

const _: () = assert!(core::mem::size_of::<DevPtr<u8>>() == 8);
const _: () = assert!(core::mem::size_of::<ScheduleParams>() == 2 * 8 + 6 * 4 + 16);
const _: () = assert!(core::mem::size_of::<DecodeParams>() == 11 * 8 + 8 * 8 + 18 * 4 + 16 + 7 * 8);
const _: () = assert!(core::mem::size_of::<TensorMap>() == 128);
const _: () = assert!(core::mem::size_of::<MergeParams>() == 7 * 8 + 4 * 4);
const _: () = assert!(core::mem::align_of::<TensorMap>() == 16);
const _: () = assert!(core::mem::size_of::<CombineParams>() == 5 * 8 + 3 * 8 + 6 * 4 + 8);
const _: () = assert!(core::mem::size_of::<AppendParams>() == 4 * 8 + 4 * 8 + 8 * 4 + 3 * 8);
const _: () = assert!(core::mem::size_of::<GatherParams>() == 4 * 8 + 3 * 8 + 8 * 4 + 3 * 8);
