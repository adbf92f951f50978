//! Primitive test kernels: one tiny kernel per instruction family that the product kernels
//! do not exercise yet, checked on the GPU against a CPU loop (`tests/gpu_primitives.rs`).
//! Built only into the separate primitives image (`--cfg mla_primitives`, sm_90a).
//!
//! `mla_prim_wgmma_m64n64k16_bf16`: grid `(1)`, block 128 (one warpgroup), 4 KB of dynamic
//! shared memory. Reads `a` `[64, 16]` and `b` `[64, 16]` bf16 row-major (K contiguous),
//! writes `d = a . b^T` `[64, 64]` f32. The operands are stored in the canonical K-major
//! layout without swizzle: 8 x 8 core matrices of 128 contiguous bytes (row `i` at `16 i`),
//! core `(row group, k group)` at `(row group * 2 + k group) * 128`, so the descriptors have
//! LBO = 128 B (next core in K) and SBO = 256 B (next core in M / N).

use crate::arch::{self, bulk, cvt, smem, sync, wgmma};
use crate::decode::wg::{aligned_base, sw64_off, vt_token};
use mla_abi::primitives::{
    BulkCopyParams, E4m3PrimParams, EXCHANGE_TILE_A, ExchangeParams, TmaSlabsParams,
    WgmmaLayoutParams, WgmmaPrimParams,
};

/// Byte offset of element `(r, k)` of a `64 x 16` operand in the no-swizzle K-major layout.
#[inline(always)]
fn core_off(r: u32, k: u32) -> u32 {
    ((r / 8) * 2 + k / 8) * 128 + (r % 8) * 16 + (k % 8) * 2
}

/// # Safety
/// Launched with one CTA of 128 threads and 4096 bytes of dynamic shared memory; the
/// pointers hold the documented shapes.
#[inline(always)]
pub unsafe fn wgmma_m64n64k16(p: WgmmaPrimParams) {
    let tid = arch::thread_idx_x();
    let base = smem::smem_base();
    let (sa, sb) = (base, base + 2048);
    let mut i = tid;
    while i < 64 * 16 {
        let (r, k) = (i / 16, i % 16);
        // SAFETY: i < 1024 elements of a and b; offsets < 2048 within each region.
        unsafe {
            let va = *p.a.ptr().add(i as usize) as u32;
            let vb = *p.b.ptr().add(i as usize) as u32;
            smem::st_shared_u16(sa + core_off(r, k), va);
            smem::st_shared_u16(sb + core_off(r, k), vb);
        }
        i += 128;
    }
    wgmma::fence_proxy_async_shared();
    let mut d = [0.0f32; 32];
    // SAFETY: all 128 threads (one warpgroup) run this straight-line code.
    unsafe {
        sync::bar_sync();
        let da = wgmma::smem_desc(sa, 128, 256, wgmma::Swizzle::None);
        let db = wgmma::smem_desc(sb, 128, 256, wgmma::Swizzle::None);
        wgmma::wgmma_fence();
        wgmma::wgmma_m64n64k16_bf16(&mut d, da, db, false);
        wgmma::wgmma_commit_group();
        wgmma::wgmma_wait_group::<0>();
    }
    let (w, lane) = (tid / 32, tid % 32);
    let (g, c) = (lane / 4, lane % 4);
    unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
        unroll!(e in [0, 1, 2, 3] {
            let row = 16 * w + g + 8 * (e as u32 / 2);
            let col = 8 * j as u32 + 2 * c + (e as u32 % 2);
            // SAFETY: row, col < 64.
            unsafe { *p.d.ptr().add((row * 64 + col) as usize) = d[4 * j + e] };
        });
    });
}

/// Byte offset of element `(r, c)` (`c < 64`) of a tile of 128-byte rows in the 128-byte
/// swizzle: 16-byte chunk `c / 8` of row `r` sits at chunk `(c / 8) ^ (r % 8)`. Eight rows
/// make one 1024-byte atom; the tile must be 1024-byte aligned.
#[inline(always)]
fn sw128_off(r: u32, c: u32) -> u32 {
    r * 128 + ((((c / 8) ^ (r % 8)) << 4) | ((c % 8) * 2))
}

/// Stores `rows x cols` bf16 of `src` (row-major) into the swizzled slabs at `tile`:
/// element `(r, c)` at slab `c / 64` (`slab_bytes` apart), [`sw128_off`]`(r, c % 64)`.
///
/// # Safety
/// `src` holds `rows * cols` values; the slabs fit in the dynamic shared memory.
#[inline(always)]
unsafe fn store_sw128(src: *const u16, rows: u32, cols: u32, tile: u32, slab_bytes: u32) {
    let mut i = arch::thread_idx_x();
    while i < rows * cols {
        let (r, c) = (i / cols, i % cols);
        // SAFETY: forwarded from the caller.
        unsafe {
            let v = *src.add(i as usize) as u32;
            smem::st_shared_u16(tile + (c / 64) * slab_bytes + sw128_off(r, c % 64), v);
        }
        i += 128;
    }
}

/// V^T of a 64-token x 64-dim e4m3 tile: `kv` (token rows of 64 bytes) into `vt` (dim
/// rows of 64 k-positions, [`vt_token`] order), both with the 64-byte swizzle. Thread
/// `t` of `threads` takes 4 x 4 byte blocks (four tokens of a position word, four dims):
/// four 32-bit loads, eight `prmt`, four 32-bit stores per block.
///
/// # Safety
/// `kv` and `vt` are 512-byte aligned 4 KB tiles in shared memory; `kv` is complete (a
/// barrier after its stores); nothing else writes `vt` until the caller's barrier.
#[inline(always)]
unsafe fn transpose_v_e4m3(kv: u32, vt: u32, t: u32, threads: u32) {
    let mut item = t;
    // 16 groups of four dims x 16 words of four positions.
    while item < 256 {
        let (n0, w) = (4 * (item / 16), item % 16);
        // SAFETY: rows < 64, bytes < 64 of each tile (forwarded from the caller).
        unsafe {
            let ld = |j: u32| smem::ld_shared_f32(kv + sw64_off(vt_token(4 * w + j), n0)).to_bits();
            let (w0, w1, w2, w3) = (ld(0), ld(1), ld(2), ld(3));
            // Byte d of word j goes to byte j of dim n0 + d's word.
            let (lo01, hi01) = (cvt::prmt(w0, w1, 0x5140), cvt::prmt(w0, w1, 0x7362));
            let (lo23, hi23) = (cvt::prmt(w2, w3, 0x5140), cvt::prmt(w2, w3, 0x7362));
            let out = [
                cvt::prmt(lo01, lo23, 0x5410),
                cvt::prmt(lo01, lo23, 0x7632),
                cvt::prmt(hi01, hi23, 0x5410),
                cvt::prmt(hi01, hi23, 0x7632),
            ];
            unroll!(d in [0, 1, 2, 3] {
                smem::st_shared_u32(vt + sw64_off(n0 + d as u32, 4 * w), out[d]);
            });
        }
        item += threads;
    }
}

/// `mla_prim_wgmma_e4m3`: see `mla_abi::primitives`.
///
/// # Safety
/// Launched with one CTA of 128 threads and `E4M3_SMEM_BYTES` of dynamic shared memory; the
/// pointers hold the documented shapes (4-byte aligned).
#[inline(always)]
pub unsafe fn wgmma_e4m3(p: E4m3PrimParams) {
    let tid = arch::thread_idx_x();
    let base = aligned_base();
    let (sq, skv, svt) = (base, base + 4096, base + 8192);
    // One word (4 bytes of a row) per step: q and kv as they are.
    let mut i = tid;
    while i < 64 * 16 {
        let (r, w) = (i / 16, i % 16);
        // SAFETY: word i < 1024 of q and kv; the offsets stay inside each 4 KB tile.
        unsafe {
            let vq = *(p.q.ptr() as *const u32).add(i as usize);
            let vk = *(p.kv.ptr() as *const u32).add(i as usize);
            smem::st_shared_u32(sq + sw64_off(r, 4 * w), vq);
            smem::st_shared_u32(skv + sw64_off(r, 4 * w), vk);
        }
        i += 128;
    }
    wgmma::fence_proxy_async_shared();
    // SAFETY: every thread passes the barrier; the transpose reads kv only after it.
    unsafe {
        sync::bar_sync();
        transpose_v_e4m3(skv, svt, tid, 128);
    }
    wgmma::fence_proxy_async_shared();
    let mut s = [0.0f32; 32];
    let mut o = [0.0f32; 32];
    // SAFETY: all 128 threads (one warpgroup) run this straight-line code; the descriptors
    // address the three tiles.
    unsafe {
        sync::bar_sync();
        wgmma::wgmma_fence();
        unroll!(kk in [0, 1] {
            let step = 32 * kk as u32;
            let da = wgmma::smem_desc(sq + step, 16, 512, wgmma::Swizzle::B64);
            let db = wgmma::smem_desc(skv + step, 16, 512, wgmma::Swizzle::B64);
            wgmma::wgmma_m64n64k32_e4m3(&mut s, da, db, kk > 0);
        });
        wgmma::wgmma_commit_group();
        wgmma::wgmma_wait_group::<0>();
        store_acc(p.s.ptr(), &s);
        let sc = p.p_scale;
        // k-step kk: 8-column groups 4 kk .. 4 kk + 4; words 0 / 2 row g, 1 / 3 row g + 8.
        let frag = |kk: usize| {
            let q = |j: usize, e: usize| s[4 * (4 * kk + j) + e] * sc;
            [
                cvt::pack_e4m3x4([q(0, 0), q(0, 1), q(1, 0), q(1, 1)]),
                cvt::pack_e4m3x4([q(0, 2), q(0, 3), q(1, 2), q(1, 3)]),
                cvt::pack_e4m3x4([q(2, 0), q(2, 1), q(3, 0), q(3, 1)]),
                cvt::pack_e4m3x4([q(2, 2), q(2, 3), q(3, 2), q(3, 3)]),
            ]
        };
        let a = [frag(0), frag(1)];
        wgmma::wgmma_fence();
        unroll!(kk in [0, 1] {
            let db = wgmma::smem_desc(svt + 32 * kk as u32, 16, 512, wgmma::Swizzle::B64);
            wgmma::wgmma_m64n64k32_rs_e4m3(&mut o, a[kk], db, kk > 0);
        });
        wgmma::wgmma_commit_group();
        wgmma::wgmma_wait_group::<0>();
        store_acc(p.o.ptr(), &o);
    }
}

/// Writes the m64nN accumulators of one warpgroup to `d` (`[64, N]` f32, row-major).
///
/// # Safety
/// `d` holds `64 * N` values.
#[inline(always)]
unsafe fn store_acc<const R: usize>(d: *mut f32, acc: &[f32; R]) {
    let n = (R * 2) as u32;
    let tid = arch::thread_idx_x();
    let (w, lane) = (tid / 32, tid % 32);
    let (g, c) = (lane / 4, lane % 4);
    // Fully unrolled: a runtime index into `acc` would put it in local memory.
    unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
        if j < R / 4 {
            unroll!(e in [0, 1, 2, 3] {
                let row = 16 * w + g + 8 * (e as u32 / 2);
                let col = 8 * j as u32 + 2 * c + (e as u32 % 2);
                // SAFETY: row < 64, col < n.
                unsafe { *d.add((row * n + col) as usize) = acc[4 * j + e] };
            });
        }
    });
}

/// `mla_prim_wgmma_sw128_kmajor`: see `mla_abi::primitives`.
///
/// # Safety
/// Launched with one CTA of 128 threads and `WGMMA_LAYOUT_SMEM_BYTES` of dynamic shared
/// memory; the pointers hold the documented shapes.
#[inline(always)]
pub unsafe fn wgmma_sw128_kmajor(p: WgmmaLayoutParams) {
    let ta = aligned_base();
    let tb = ta + 8192;
    // SAFETY: a and b hold 64 x 64 values; the tiles fit the 25 KB.
    unsafe {
        store_sw128(p.a.ptr(), 64, 64, ta, 8192);
        store_sw128(p.b.ptr(), 64, 64, tb, 8192);
    }
    wgmma::fence_proxy_async_shared();
    let mut d = [0.0f32; 32];
    // SAFETY: all 128 threads (one warpgroup) run this straight-line code.
    unsafe {
        sync::bar_sync();
        wgmma::wgmma_fence();
        unroll!(kk in [0, 1, 2, 3] {
            // K-major, 128-byte swizzle: 8-row atoms 1024 B apart (SBO), LBO unused (16);
            // k-step kk starts 32 bytes further into each row.
            let da = wgmma::smem_desc(ta + 32 * kk as u32, 16, 1024, wgmma::Swizzle::B128);
            let db = wgmma::smem_desc(tb + 32 * kk as u32, 16, 1024, wgmma::Swizzle::B128);
            wgmma::wgmma_m64n64k16_bf16(&mut d, da, db, kk > 0);
        });
        wgmma::wgmma_commit_group();
        wgmma::wgmma_wait_group::<0>();
        store_acc(p.d.ptr(), &d);
    }
}

/// The B descriptor of k-step `kk` of an MN-major `[64 (K), 128 (N)]` operand in two 8 KB
/// slabs: 16 K-rows of 128 bytes per step.
#[inline(always)]
fn mn_b_desc(tb: u32, kk: u32, p: &WgmmaLayoutParams) -> u64 {
    wgmma::smem_desc(tb + kk * 16 * 128, p.lbo, p.sbo, wgmma::Swizzle::B128)
}

/// `mla_prim_wgmma_sw128_mn_b`: see `mla_abi::primitives`.
///
/// # Safety
/// As [`wgmma_sw128_kmajor`].
#[inline(always)]
pub unsafe fn wgmma_sw128_mn_b(p: WgmmaLayoutParams) {
    let ta = aligned_base();
    let tb = ta + 8192;
    // SAFETY: a holds 64 x 64 values, b 64 x 128; the tiles fit the 25 KB.
    unsafe {
        store_sw128(p.a.ptr(), 64, 64, ta, 8192);
        store_sw128(p.b.ptr(), 64, 128, tb, 8192);
    }
    wgmma::fence_proxy_async_shared();
    let mut d = [0.0f32; 64];
    // SAFETY: all 128 threads (one warpgroup) run this straight-line code.
    unsafe {
        sync::bar_sync();
        wgmma::wgmma_fence();
        unroll!(kk in [0, 1, 2, 3] {
            let da = wgmma::smem_desc(ta + 32 * kk as u32, 16, 1024, wgmma::Swizzle::B128);
            wgmma::wgmma_m64n128k16_ss_bf16::<1>(&mut d, da, mn_b_desc(tb, kk as u32, &p), kk > 0);
        });
        wgmma::wgmma_commit_group();
        wgmma::wgmma_wait_group::<0>();
        store_acc(p.d.ptr(), &d);
    }
}

/// `mla_prim_wgmma_rs_mn_b`: see `mla_abi::primitives`.
///
/// # Safety
/// As [`wgmma_sw128_kmajor`].
#[inline(always)]
pub unsafe fn wgmma_rs_mn_b(p: WgmmaLayoutParams) {
    let tb = aligned_base();
    // SAFETY: b holds 64 x 128 values; the slabs fit the 25 KB.
    unsafe { store_sw128(p.b.ptr(), 64, 128, tb, 8192) };
    wgmma::fence_proxy_async_shared();
    let tid = arch::thread_idx_x();
    let (w, lane) = (tid / 32, tid % 32);
    let (g, c) = (lane / 4, lane % 4);
    // A fragment of k-step kk: (row, k) pairs as in mma.sync m16n8k16.
    let frag = |kk: u32| -> [u32; 4] {
        let at = |r: u32, k: u32| -> u32 {
            // SAFETY: r < 64, k + 1 < 64: inside a.
            unsafe {
                let lo = *p.a.ptr().add((r * 64 + k) as usize) as u32;
                let hi = *p.a.ptr().add((r * 64 + k + 1) as usize) as u32;
                lo | (hi << 16)
            }
        };
        let (r0, k0) = (16 * w + g, 16 * kk + 2 * c);
        [
            at(r0, k0),
            at(r0 + 8, k0),
            at(r0, k0 + 8),
            at(r0 + 8, k0 + 8),
        ]
    };
    let mut d = [0.0f32; 64];
    // SAFETY: all 128 threads (one warpgroup) run this straight-line code.
    unsafe {
        sync::bar_sync();
        wgmma::wgmma_fence();
        unroll!(kk in [0, 1, 2, 3] {
            wgmma::wgmma_m64n128k16_rs_bf16::<1>(&mut d, frag(kk as u32), mn_b_desc(tb, kk as u32, &p), kk > 0);
        });
        wgmma::wgmma_commit_group();
        wgmma::wgmma_wait_group::<0>();
        store_acc(p.d.ptr(), &d);
    }
}

/// `mla_prim_bulk_copy`: see `mla_abi::primitives`.
///
/// # Safety
/// Launched with one CTA of 128 threads and `BULK_SMEM_BYTES` of dynamic shared memory;
/// `rows <= BULK_MAX_ROWS`, `row_bytes` a multiple of 16 `<= BULK_MAX_ROW_BYTES`, every
/// `idx[r]` a valid row of `src`, `dst` holds `rows * row_bytes`.
#[inline(always)]
pub unsafe fn bulk_copy(p: BulkCopyParams) {
    let tid = arch::thread_idx_x();
    let bar = smem::smem_base();
    let rows_smem = bar + 128;
    // SAFETY: bar is the first 8 bytes of the dynamic shared memory; every thread reaches
    // the barriers; the copies stay inside the rows region (documented bounds).
    unsafe {
        init_mbarrier(bar);
        if tid == 0 {
            bulk::mbarrier_arrive_expect_tx(bar, p.rows * p.row_bytes);
            for r in 0..p.rows {
                let src_row = *p.idx.ptr().add(r as usize) as usize;
                let src = p.src.ptr().add(src_row * p.row_bytes as usize) as *const u8;
                bulk::bulk_copy_g2s(rows_smem + r * p.row_bytes, src, p.row_bytes, bar);
            }
        }
        wait_then_write_back(bar, rows_smem, p.dst.ptr(), p.rows * p.row_bytes);
    }
}

/// Thread 0 initialises the single-arrival mbarrier at `bar`; then a CTA barrier.
///
/// # Safety
/// Every thread of the CTA calls it; `bar` is 8 bytes of this CTA's shared memory.
#[inline(always)]
unsafe fn init_mbarrier(bar: u32) {
    // SAFETY: forwarded from the caller.
    unsafe {
        if arch::thread_idx_x() == 0 {
            bulk::mbarrier_init(bar, 1);
            bulk::fence_mbarrier_init();
        }
        // Unaligned: LLVM copies this barrier into both arms of the tid == 0 branch.
        sync::bar_sync_unaligned();
    }
}

/// Waits for phase 0 of `bar` (a barrier that never completes traps, a launch error,
/// rather than hanging), then the 128 threads copy `bytes` of shared memory from `src` to
/// `dst` unchanged.
///
/// # Safety
/// All 128 threads call it; `src .. src + bytes` is shared memory the copies filled,
/// `dst` holds `bytes`, `bytes` a multiple of 16.
#[inline(always)]
unsafe fn wait_then_write_back(bar: u32, src: u32, dst: *mut u8, bytes: u32) {
    // SAFETY: forwarded from the caller.
    unsafe {
        if !bulk::mbarrier_wait_parity_bounded(bar, 0, 1 << 24) {
            arch::trap();
        }
        let mut i = arch::thread_idx_x();
        while i < bytes / 16 {
            smem::st_global_v4(dst.add(16 * i as usize), smem::ld_shared_v4(src + 16 * i));
            i += 128;
        }
    }
}

/// `mla_prim_tma_slabs`: see `mla_abi::primitives`.
///
/// # Safety
/// Launched with one CTA of 128 threads and `TMA_SMEM_BYTES` of dynamic shared memory;
/// `tmap` a tensor map as documented there, `rows` a power of two in `8..=64`, pages
/// `page .. page + 64 / rows` inside the map, `dst` holds 72 KB.
#[inline(always)]
pub unsafe fn tma_slabs(p: TmaSlabsParams) {
    const SLAB: u32 = 64 * 128;
    let tid = arch::thread_idx_x();
    let tile = aligned_base();
    // The mbarrier sits past the tile's slack-aligned 72 KB.
    let bar = tile + 9 * SLAB;
    // SAFETY: the tile and the mbarrier lie inside the dynamic shared memory (1 KB slack +
    // 72 KB + 128 bytes); every thread reaches the barriers; the copies stay in the tile.
    unsafe {
        init_mbarrier(bar);
        if tid == 0 {
            bulk::mbarrier_arrive_expect_tx(bar, 9 * SLAB);
            let pages = 64 / p.rows;
            for s in 0..9u32 {
                for q in 0..pages {
                    // Box {64 dims, rows tokens, 1 page}: rows of 128 bytes, so page q's
                    // box lands q * rows rows down the slab, on a 1024-byte boundary when
                    // rows >= 8.
                    let dst = tile + s * SLAB + q * p.rows * 128;
                    let c = [(64 * s) as i32, 0, (p.page + q) as i32];
                    bulk::tma_load_3d(dst, p.tmap.ptr() as *const u8, c, bar);
                }
            }
        }
        wait_then_write_back(bar, tile, p.dst.ptr(), 9 * SLAB);
    }
}

/// `mla_prim_exchange`: see `mla_abi::primitives`.
///
/// # Safety
/// Launched with one CTA of 256 threads and `EXCHANGE_SMEM_BYTES` of dynamic shared
/// memory; `out` holds 512 f32, `src` 16 bytes when `bulk_prologue != 0`.
#[inline(always)]
pub unsafe fn exchange(p: ExchangeParams) {
    let tid = arch::thread_idx_x();
    let base = smem::smem_base();
    let bar = base;
    let copied = base + 16;
    let wg = tid / 128;
    let t = tid % 128;
    let r = t % 64;
    let writer = (t < 64) as u32;
    // Slot k, row r: [m0, scale0, m1, scale1, l0, l1] as in the decode.
    let slot = |k: u32| arch::opaque(base + 128 + r * 4) + k * 256;
    // SAFETY: every address is inside the documented shared memory; all 256 threads reach
    // every barrier in the same order (the rounds and the prologue flag are uniform).
    unsafe {
        let mut sum = 0.0f32;
        if p.bulk_prologue != 0 {
            init_mbarrier(bar);
            if tid == 0 {
                bulk::mbarrier_arrive_expect_tx(bar, 16);
                bulk::bulk_copy_g2s(copied, p.src.ptr() as *const u8, 16, bar);
            }
            if !bulk::mbarrier_wait_parity_bounded(bar, 0, 1 << 24) {
                arch::trap();
            }
            sum = smem::ld_shared_f32(copied);
        }
        // The producer's and the consumer's side of named barrier `ID` in the chosen form.
        let (mode, send, recv) = (p.sync_mode, 1u32, 2u32);
        let give = |id: u32| match (mode, id) {
            (0, 1) => sync::bar_arrive_named::<1, 256>(),
            (0, _) => sync::bar_arrive_named::<2, 256>(),
            (1 | 3 | 4, 1) => sync::bar_sync_named::<1, 256>(),
            (1 | 3 | 4, _) => sync::bar_sync_named::<2, 256>(),
            _ => sync::bar_sync(),
        };
        let take = |id: u32| match (mode, id) {
            (0 | 1 | 3 | 4, 1) => sync::bar_sync_named::<1, 256>(),
            (0 | 1 | 3 | 4, _) => sync::bar_sync_named::<2, 256>(),
            _ => sync::bar_sync(),
        };
        // Mode 4 (mode 3 plus the decode's async-proxy traffic): the sending warpgroup
        // rewrites tile A (zeros, generic stores) and fences it to the async proxy before
        // its handoff; the receiving one runs a `wgmma` over tiles A and B after it (and
        // waits for it before its own handoff back), as the decode's P tiles go from one
        // warpgroup's stores to the other's `wgmma`.
        let (tile_a, tile_b) = (base + EXCHANGE_TILE_A, base + EXCHANGE_TILE_A + 2048);
        let store_tile = || {
            if mode == 4 {
                let mut i = t;
                while i < 512 {
                    smem::st_shared_u32(tile_a + 4 * i, 0);
                    i += 128;
                }
                wgmma::fence_proxy_async_shared();
            }
        };
        let run_wgmma = || {
            let mut d = [0.0f32; 32];
            if mode == 4 {
                let da = wgmma::smem_desc(tile_a, 128, 256, wgmma::Swizzle::None);
                let db = wgmma::smem_desc(tile_b, 128, 256, wgmma::Swizzle::None);
                wgmma::wgmma_fence();
                wgmma::wgmma_m64n64k16_bf16(&mut d, da, db, false);
                wgmma::wgmma_commit_group();
                wgmma::wgmma_wait_group::<0>();
            }
            // Zero tiles: d is zero; added so the product is used.
            d[0] + d[31]
        };
        if mode == 4 {
            // Both tiles zero before the first round's `wgmma`.
            let mut i = tid;
            while i < 1024 {
                smem::st_shared_u32(tile_a + 4 * i, 0);
                i += 256;
            }
            wgmma::fence_proxy_async_shared();
            sync::bar_sync();
        }
        let extras = || {
            if mode >= 3 {
                if wg == 0 {
                    sync::bar_sync_named::<5, 128>();
                } else {
                    sync::bar_sync_named::<6, 128>();
                }
                if p.bulk_prologue != 0 && !bulk::mbarrier_wait_parity_bounded(bar, 0, 1 << 24) {
                    arch::trap();
                }
            }
        };
        for k in 0..p.rounds {
            if wg == 0 {
                let a = (64 * k + r) as f32;
                smem::st_shared_f32_if(slot(0), a, writer);
                smem::st_shared_f32_if(slot(1), a + 0.5, writer);
                store_tile();
                give(send);
                extras();
                take(recv);
                sum += smem::ld_shared_f32(slot(2)) + smem::ld_shared_f32(slot(3)) + run_wgmma();
            } else {
                take(send);
                let (a, b) = (smem::ld_shared_f32(slot(0)), smem::ld_shared_f32(slot(1)));
                sum += a + b + run_wgmma();
                smem::st_shared_f32_if(slot(2), a + b, writer);
                smem::st_shared_f32_if(slot(3), 2.0 * a, writer);
                extras();
                give(recv);
            }
        }
        smem::st_shared_f32_if(slot(4 + wg), sum, writer);
        sync::bar_sync();
        let other = smem::ld_shared_f32(slot(5 - wg));
        *p.out.ptr().add(2 * tid as usize) = sum;
        *p.out.ptr().add(2 * tid as usize + 1) = other;
    }
}
