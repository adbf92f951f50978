//! The TMA-fed `wgmma` decode (sm_90a only; `--cfg mla_wgmma`): bf16 Q and a bf16 cache
//! with pages of at least `decode_tile::TMA_MIN_PAGE` tokens. Same grid, block, params
//! and outputs as [`crate::decode::wg`], plus the cache's tensor map as a second kernel
//! parameter (by value, so every launch, eager or captured, carries the map of its own
//! cache), so the host's split schedule, workspace and combine are shared.
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
//!   swizzled slab layout; no L2 policy: evict-first measured 2-7% faster in `mla bench`
//!   but 5-10% slower in the peers' harness, where a sequence's two head tiles read its
//!   KV further apart) on one mbarrier per stage and slab, each slab's S waiting only
//!   for its own.
//!   A stage is reloaded in two halves: slabs 0-3 and 8 (the only ones warpgroup 0's
//!   P.V reads, and the slab that holds B's P once S of B is done), and slabs 4-7. Each
//!   half is reloaded for the next pair by the warpgroup whose P.V read it last, as
//!   soon as that P.V is done (warpgroup 0 reloads slabs 0-3 and 8, warpgroup 1 slabs
//!   4-7). Each warpgroup starts its S on the half it reloads itself, then takes the
//!   other. Boxes past the sequence end, and pages
//!   outside `0..num_pages`, read as zeros (TMA's out-of-bounds fill); V rows of a page
//!   past the end are zeroed in shared memory.
//! - Named barriers (one warpgroup arrives, the other waits; 0 is the CTA barrier):
//!   [`BAR_SCALE0`], [`BAR_SCALE1`], [`BAR_P0`], [`BAR_P1`]; each warpgroup passes its
//!   arrivals in an order that keeps every shared buffer's reader ahead of its next
//!   writer (see the loop).

use crate::arch::{self, bulk, cp_async, cvt, smem, sync, wgmma};
use crate::decode::wg::{SLAB, SLAB_TILE, aligned_base, slab_off};
use crate::decode::{self, DecodeKind, M64};
use crate::elem::Bf16;
use mla_abi::DecodeParams;
use mla_abi::decode_tile as T;

const BLOCK_N: u32 = T::BLOCK_N as u32;
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

/// Page (or out-of-bounds coordinate) of box `q` of block `blk`: box `q` holds the
/// `min(page, 64)` tokens from `64 blk + q min(page, 64)`; `None` for boxes a block does
/// not have (pages of more than 16 tokens).
#[inline(always)]
fn box_token(p: &DecodeParams, blk: u32, q: u32) -> Option<u32> {
    let rows = p.page_size.min(BLOCK_N);
    (q * rows < BLOCK_N).then_some(blk * BLOCK_N + q * rows)
}

/// Block `blk`'s box pages, read now (prologue).
#[inline(always)]
fn block_pages(p: &DecodeParams, b: u32, blk: u32, len: u32) -> [i32; 4] {
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
/// `cp.async`, so the issuing thread holds no register for them until it issues; boxes
/// past the end get `num_pages` (out of bounds: zeros).
///
/// # Safety
/// One thread; `dst` is its own 16 bytes of shared memory; it waits for its `cp.async`
/// groups before reading them.
#[inline(always)]
unsafe fn fetch_pages(p: &DecodeParams, b: u32, blk: u32, len: u32, dst: u32) {
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

/// The pages [`fetch_pages`] put at `src`.
///
/// # Safety
/// The thread that fetched them.
#[inline(always)]
unsafe fn read_pages(src: u32) -> [i32; 4] {
    cp_async::cp_async_wait_group::<0>();
    // SAFETY: forwarded from the caller; 16 bytes of shared memory.
    unsafe { smem::ld_shared_v4(src) }.map(|w| w as i32)
}

/// Issues half `h` (slabs 0-3 and 8, or 4-7) of block `blk` into the stage at `dst`,
/// slab `s` completed on the mbarrier at `bars + 8 s`.
///
/// # Safety
/// One thread; the half's mbarriers initialised with no copy pending on them; nothing
/// reads a slab until its mbarrier completes.
#[inline(always)]
unsafe fn issue_half(
    p: &DecodeParams,
    tmap: *const u8,
    pages: [i32; 4],
    blk: u32,
    dst: u32,
    h: u32,
    bars: u32,
) {
    let rows = p.page_size.min(BLOCK_N);
    let row_in_page = (blk * BLOCK_N) & (p.page_size - 1);
    // SAFETY: each box lands inside its slab (rows * (64 / rows) rows of 128 bytes), at a
    // multiple of 1024 bytes (rows >= 8); the map is valid (host).
    unsafe {
        for i in 0..5 - h {
            let s = if h == 0 {
                if i < 4 { i } else { 8 }
            } else {
                4 + i
            };
            let bar = bars + 8 * s;
            bulk::mbarrier_arrive_expect_tx(bar, SLAB);
            unroll!(q in [0, 1, 2, 3] {
                if (q as u32) * rows < BLOCK_N {
                    let c = [(64 * s) as i32, row_in_page as i32, pages[q]];
                    bulk::tma_load_3d(dst + s * SLAB + q as u32 * rows * 128, tmap, c, bar);
                }
            });
        }
    }
}

/// The kernel body (see the module docs).
///
/// # Safety
/// Launched with the grid and block of [`crate::decode::wg`] and `TMA_SMEM_BYTES` of
/// dynamic shared memory on params the host validated (bf16 Q and cache, pages of at
/// least `TMA_MIN_PAGE` tokens); `tmap` is the generic address of the cache's map as
/// `decode_tile` describes it, in the kernel's parameter space.
#[inline(always)]
pub unsafe fn decode_tma<K: DecodeKind<Mma = Bf16>>(p: DecodeParams, tmap: *const u8) {
    let (tile, b, split) = decode::cta_coords();
    let Some(decode::CtaWork {
        len,
        glen,
        nsplit,
        kb0,
        kb1,
    }) = decode::cta_work(&p, split, b)
    else {
        return;
    };
    let row0 = tile * 64;
    // Broadcast from lane 0 so that ptxas sees warp-uniform values: a `wgmma` behind a
    // branch it cannot prove uniform is serialized.
    // SAFETY: converged warps.
    let uniform = |x: u32| unsafe { sync::shfl_idx_f32(f32::from_bits(x), 0) }.to_bits();
    let (len, kb0, kb1) = (uniform(len), uniform(kb0), uniform(kb1));

    let tid = arch::thread_idx_x();
    let warp = tid / 32;
    let lane = tid % 32;
    let wg = uniform(warp / 4);
    let wq = warp % 4;
    let g = lane / 4;
    let c = lane % 4;
    let base = aligned_base();
    let q_s = base;
    let kv_s = |st: u32| base + SLAB_TILE + st * SLAB_TILE;
    // P of block A (warpgroup 0's) in its own slab; P of block B in stage 1's slab 8,
    // free once S of B is done (K's last 64 dims are not part of V).
    let p_s = [base + T::TMA_SMEM_P0 as u32, kv_s(1) + 8 * SLAB];
    // The exchange: [m0, scale0, m1, scale1, l0, l1] x 64 rows.
    let red = |k: u32, r: u32| arch::opaque(base + T::TMA_SMEM_RED as u32 + r * 4) + k * 256;
    // Stage `st`'s mbarriers, one per slab (slab `s` at `+ 8 s`).
    let bars = |st: u32| base + T::TMA_SMEM_BARS as u32 + 72 * st;
    // The issuer's page entries of the next pair's two blocks.
    let pages_s = |which: u32| base + T::TMA_SMEM_PAGES as u32 + 32 * wg + 16 * which;
    // The thread that issues this warpgroup's halves (warpgroup 0: slabs 0-3 and 8,
    // warpgroup 1: slabs 4-7, of both stages).
    let issuer = tid.is_multiple_of(128);

    // SAFETY: thread 0 initialises the mbarriers before any copy; every thread passes the
    // CTA barriers; the Q tile holds 64 slab-layout rows of a validated q.
    unsafe {
        if issuer {
            bulk::prefetch_tensormap(tmap);
        }
        if tid == 0 {
            for k in 0..18 {
                bulk::mbarrier_init(bars(0) + 8 * k, 1);
            }
            bulk::fence_mbarrier_init();
        }
        decode::load_q_tile::<K, M64>(&p, b, row0, q_s, slab_off);
        cp_async::cp_async_commit_group();
        if tid == 0 {
            // The first pair, both halves (the mbarriers' phase 0).
            let mut blk = kb0;
            while blk < kb1 && blk < kb0 + 2 {
                let st = blk - kb0;
                let pages = block_pages(&p, b, blk, len);
                issue_half(&p, tmap, pages, blk, kv_s(st), 0, bars(st));
                issue_half(&p, tmap, pages, blk, kv_s(st), 1, bars(st));
                blk += 1;
            }
        }
        cp_async::cp_async_wait_group::<0>();
        wgmma::fence_proxy_async_shared();
        sync::bar_sync();
    }
    // This thread's two rows (g and g + 8 of its warp's 16) and their causal visibility.
    let r_loc = 16 * wq + g;
    let row_a = row0 + r_loc;
    let vis_r = [
        decode::visible(&p, len, glen, row_a),
        decode::visible(&p, len, glen, row_a + 8),
    ];
    let scale_log2 = p.softmax_scale * core::f32::consts::LOG2_E;

    // S of the block in stage `st` (mbarrier phase `parity`): this warpgroup's first half
    // (warpgroup 0: slabs 0-3 and 8, whose copy goes out first) then the other, each slab
    // after its own mbarrier. `mid` runs once this warpgroup's first half is issued and
    // committed (its own group), before the second.
    let qk = #[inline(always)]
    |s: &mut [f32; 32], st: u32, parity: u32, mid: &dyn Fn()| {
        let kv = arch::opaque(kv_s(st));
        let q_s = arch::opaque(q_s);
        // Half 0 is slabs 0-3 and 8, half 1 slabs 4-7. Warpgroup 0 takes 0-3, 8, then 4-7;
        // warpgroup 1 4-7, then 0-3, 8. Straight-line code (the polls leave their loops
        // uniformly): ptxas serializes wgmmas around branches and loop joins it cannot
        // prove uniform. Each poll costs an injected `wgmma.fence` (C7519), measured free.
        let order = |j: u32| match (wg, j) {
            (0, 0..4) => j,
            (0, 4) => 8,
            (0, _) => j - 1,
            (_, 0..4) => j + 4,
            (_, 8) => 8,
            (_, _) => j - 4,
        };
        // SAFETY: converged warpgroup; each slab is read only once its mbarrier says it
        // landed; the descriptors address Q and the stage.
        unsafe {
            wgmma::wgmma_fence();
            unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
                if j == 5 {
                    wgmma::wgmma_commit_group();
                    mid();
                }
                let slab = order(j as u32);
                bulk::mbarrier_wait_parity_warp(bars(st) + 8 * slab, parity);
                let da = wgmma::smem_desc(q_s + slab * SLAB, 16, 1024, wgmma::Swizzle::B128);
                let db = wgmma::smem_desc(kv + slab * SLAB, 16, 1024, wgmma::Swizzle::B128);
                // k-step kk of the slab: 32 bytes on, 2 in the descriptors' address field.
                unroll!(kk in [0, 1, 2, 3] {
                    let k = 2 * kk as u64;
                    wgmma::wgmma_m64n64k16_bf16(s, da + k, db + k, j > 0 || kk > 0);
                });
            });
            wgmma::wgmma_commit_group();
        }
    };
    // After S of block `blk` (stage `st`) landed in this warpgroup: V rows past the
    // sequence end (inside a page that was read) become zeros, before any P.V reads them.
    let zero_tail = |st: u32, blk: u32| {
        let valid = len.saturating_sub(blk * BLOCK_N);
        if valid < BLOCK_N {
            let mut i = tid % 128;
            while i < (BLOCK_N - valid) * 64 {
                // SAFETY: row valid + i / 64 < 64, chunk i % 64 < 64: inside slabs 0-7.
                unsafe { smem::st_shared_v4(kv_s(st) + slab_off(valid + i / 64, i % 64), [0; 4]) };
                i += 128;
            }
            wgmma::fence_proxy_async_shared();
            // SAFETY: the whole warpgroup takes this branch (uniform condition).
            unsafe {
                if wg == 0 {
                    sync::bar_sync_named::<{ BAR_WG[0] }, 128>();
                } else {
                    sync::bar_sync_named::<{ BAR_WG[1] }, 128>();
                }
            }
        }
    };
    // V's k-step t (16 tokens) of this warpgroup's 256 output dims, stage `st`.
    let v_desc = |st: u32, t: u32| {
        wgmma::smem_desc(
            arch::opaque(kv_s(st) + 4 * wg * SLAB) + t * 16 * 128,
            SLAB,
            1024,
            wgmma::Swizzle::B128,
        )
    };
    // Masked, scaled S of block `blk` and its row maxima (this thread's two rows).
    let mask_max = |s: &mut [f32; 32], blk: u32| {
        let mut m = [f32::NEG_INFINITY; 2];
        unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
            unroll!(e in [0, 1, 2, 3] {
                let tok = blk * BLOCK_N + 8 * j as u32 + 2 * c + (e % 2) as u32;
                let x = if tok < vis_r[e / 2] { s[4 * j + e] * scale_log2 } else { f32::NEG_INFINITY };
                s[4 * j + e] = x;
                m[e / 2] = sync::fmax(m[e / 2], x);
            });
        });
        // SAFETY: converged warp.
        unsafe { [decode::quad_max(m[0]), decode::quad_max(m[1])] }
    };
    // exp2(S - m_ref) in place; returns this thread's part of the row sums.
    let exp_rows = |s: &mut [f32; 32], m_ref: [f32; 2]| {
        let mut l = [0.0f32; 2];
        unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
            unroll!(e in [0, 1, 2, 3] {
                let pe = sync::ex2(s[4 * j + e] - m_ref[e / 2]);
                l[e / 2] += pe;
                s[4 * j + e] = pe;
            });
        });
        l
    };
    // P as the A fragments of the block's four k-steps.
    let frags_of = |s: &[f32; 32]| {
        let mut a = [[0u32; 4]; 4];
        unroll!(kk in [0, 1, 2, 3] {
            let t0 = 8 * kk;
            let t1 = 8 * kk + 4;
            a[kk] = [
                cvt::pack_bf16x2(s[t0], s[t0 + 1]),
                cvt::pack_bf16x2(s[t0 + 2], s[t0 + 3]),
                cvt::pack_bf16x2(s[t1], s[t1 + 1]),
                cvt::pack_bf16x2(s[t1 + 2], s[t1 + 3]),
            ];
        });
        a
    };
    // Fragments times a per-row factor (rows g: words 0 and 2, g + 8: words 1 and 3).
    let scaled = |a: &[[u32; 4]; 4], f: [f32; 2]| {
        let mut out = [[0u32; 4]; 4];
        unroll!(kk in [0, 1, 2, 3] {
            unroll!(w in [0, 1, 2, 3] {
                let x = a[kk][w];
                let (lo, hi) = (f32::from_bits(x << 16), f32::from_bits(x & 0xffff_0000));
                out[kk][w] = cvt::pack_bf16x2(lo * f[w % 2], hi * f[w % 2]);
            });
        });
        out
    };
    // Stores P's fragments to the P slab at `ps` (row r, token chunk ch, 128-byte swizzle).
    let store_p = |a: &[[u32; 4]; 4], ps: u32| {
        // Rows r_loc and r_loc + 8 share r % 8 = g: chunk ch of either is its row's
        // chunk-0 address with (ch << 4) XORed in.
        let row = arch::opaque(ps + r_loc * 128 + (g << 4) + 4 * c);
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
    };
    // O += P.V for the block in stage `st`, P from its slab (the other warpgroup's block),
    // as one committed group.
    let pv_shared = #[inline(always)]
    |o: &mut [[f32; 4]; 32], st: u32| {
        // SAFETY: converged warpgroup; the P slab and the stage's V half are in place
        // (named barrier and mbarriers above the call).
        unsafe {
            wgmma::wgmma_fence();
            unroll!(kk in [0, 1, 2, 3] {
                let da = wgmma::smem_desc(arch::opaque(p_s[st as usize]) + 32 * kk as u32, 16, 1024, wgmma::Swizzle::B128);
                wgmma::wgmma_m64n256k16_ss_bf16::<1>(o, da, v_desc(st, kk as u32), true);
            });
            wgmma::wgmma_commit_group();
        }
    };
    let rescale = |o: &mut [[f32; 4]; 32], f: [f32; 2]| {
        if f[0] != 1.0 || f[1] != 1.0 {
            unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
                o[j][0] *= f[0];
                o[j][1] *= f[0];
                o[j][2] *= f[1];
                o[j][3] *= f[1];
            });
        }
    };
    let ld_rows = |k: u32| {
        // SAFETY: rows < 64 of the exchange.
        unsafe {
            [
                smem::ld_shared_f32(red(k, r_loc)),
                smem::ld_shared_f32(red(k, r_loc + 8)),
            ]
        }
    };
    let st_rows = |k: u32, v: [f32; 2]| {
        // SAFETY: rows < 64 of the exchange; lane c == 0 of each quad writes.
        unsafe {
            smem::st_shared_f32_if(red(k, r_loc), v[0], (c == 0) as u32);
            smem::st_shared_f32_if(red(k, r_loc + 8), v[1], (c == 0) as u32);
        }
    };
    let m_ref_of = |m: [f32; 2]| m.map(|x| if x == f32::NEG_INFINITY { 0.0 } else { x });

    let mut o = [[0.0f32; 4]; 32];
    let mut m_run = [f32::NEG_INFINITY; 2];
    let mut l_run = [0.0f32; 2];
    let mut s = [0.0f32; 32];
    // This warpgroup's block of the first pair (warpgroup 1 has none if the split has
    // one block).
    let own0 = kb0 + wg;
    if own0 < kb1 {
        qk(&mut s, wg, 0, &|| {});
        // SAFETY: converged warpgroup.
        unsafe { wgmma::wgmma_wait_group::<0>() };
        zero_tail(wg, own0);
    }
    let mut pair = 0u32;
    let mut blk_a = kb0;
    while blk_a < kb1 {
        let blk_b = blk_a + 1;
        let has_b = blk_b < kb1;
        let next_a = blk_a + 2 < kb1;
        let next_b = blk_b + 2 < kb1;
        let parity = pair & 1;
        // The issuer fetches the next pair's page entries now; it reads them after a P.V.
        if issuer && next_a {
            // SAFETY: this issuer's own slots.
            unsafe {
                fetch_pages(&p, b, blk_a + 2, len, pages_s(0));
                if next_b {
                    fetch_pages(&p, b, blk_b + 2, len, pages_s(1));
                }
            }
        }
        // SAFETY: converged warpgroups; both reach the named barriers in the order the
        // module docs give (has_b and the next-block flags are CTA-uniform); the wgmma
        // descriptors address Q, the stages and the P slabs; copies go out only for halves
        // whose last reader's wgmma_wait_group has returned.
        unsafe {
            if wg == 0 {
                // Block A: max against the running max, shared first.
                let m_a = mask_max(&mut s, blk_a);
                let m0 = [sync::fmax(m_run[0], m_a[0]), sync::fmax(m_run[1], m_a[1])];
                let m0_ref = m_ref_of(m0);
                let scale0 = [
                    sync::ex2(m_run[0] - m0_ref[0]),
                    sync::ex2(m_run[1] - m0_ref[1]),
                ];
                st_rows(0, m0);
                st_rows(1, scale0);
                sync::bar_arrive_named::<BAR_SCALE0, 256>();
                let l_a = exp_rows(&mut s, m0_ref);
                rescale(&mut o, scale0);
                l_run = [l_run[0] * scale0[0] + l_a[0], l_run[1] * scale0[1] + l_a[1]];
                let a = frags_of(&s);
                wgmma::wgmma_fence();
                unroll!(kk in [0, 1, 2, 3] {
                    wgmma::wgmma_m64n256k16_rs_bf16::<1>(&mut o, a[kk], v_desc(0, kk as u32), true);
                });
                wgmma::wgmma_commit_group();
                // Warpgroup 1's final max and scale; A's P with that scale to warpgroup 1.
                sync::bar_sync_named::<BAR_SCALE1, 256>();
                m_run = ld_rows(2);
                let scale1 = ld_rows(3);
                store_p(&scaled(&a, scale1), p_s[0]);
                sync::bar_arrive_named::<BAR_P0, 256>();
                wgmma::wgmma_wait_group::<0>();
                // Slabs 0-3 and 8 of stage 0: last read by the P.V above (and S of A).
                if issuer && next_a {
                    issue_half(
                        &p,
                        tmap,
                        read_pages(pages_s(0)),
                        blk_a + 2,
                        kv_s(0),
                        0,
                        bars(0),
                    );
                }
                rescale(&mut o, scale1);
                l_run = [l_run[0] * scale1[0], l_run[1] * scale1[1]];
                if has_b {
                    sync::bar_sync_named::<BAR_P1, 256>();
                    pv_shared(&mut o, 1);
                }
                // Slabs 0-3 and 8 (B's P) of stage 1: last read by the P.V above, which
                // completes while A''s S is issued (before its second half's wait, so this
                // copy does not queue behind warpgroup 1's).
                // `in_qk`: A''s first half is the one group issued after the P.V.
                let free_b = |in_qk: bool| {
                    if has_b {
                        if in_qk {
                            wgmma::wgmma_wait_group::<1>();
                        } else {
                            wgmma::wgmma_wait_group::<0>();
                        }
                        if issuer && next_b {
                            issue_half(
                                &p,
                                tmap,
                                read_pages(pages_s(1)),
                                blk_b + 2,
                                kv_s(1),
                                0,
                                bars(1),
                            );
                        }
                    }
                };
                if next_a {
                    qk(&mut s, 0, parity ^ 1, &|| free_b(true));
                } else {
                    free_b(false);
                }
                wgmma::wgmma_wait_group::<0>();
                if next_a {
                    zero_tail(0, blk_a + 2);
                }
            } else {
                // Block B (if any): max against warpgroup 0's.
                let m_b = if has_b {
                    mask_max(&mut s, blk_b)
                } else {
                    [f32::NEG_INFINITY; 2]
                };
                sync::bar_sync_named::<BAR_SCALE0, 256>();
                let m0 = ld_rows(0);
                let scale0 = ld_rows(1);
                let m1 = [sync::fmax(m0[0], m_b[0]), sync::fmax(m0[1], m_b[1])];
                let m1_ref = m_ref_of(m1);
                let scale1 = [sync::ex2(m0[0] - m1_ref[0]), sync::ex2(m0[1] - m1_ref[1])];
                st_rows(2, m1);
                st_rows(3, scale1);
                sync::bar_arrive_named::<BAR_SCALE1, 256>();
                m_run = m1;
                let f = [scale0[0] * scale1[0], scale0[1] * scale1[1]];
                rescale(&mut o, f);
                l_run = [l_run[0] * f[0], l_run[1] * f[1]];
                // B's P to its slab and the P.V of A's P first: it frees stage 0's slabs
                // 4-7, which A''s S needs half a step before B''s S needs stage 1.
                // Without a block B, s holds no S: P is computed but not summed, and the
                // P.V below multiplies zeros by A's (finite) V, so that no wgmma sits behind
                // a branch.
                let l_b = exp_rows(&mut s, m1_ref);
                if has_b {
                    l_run = [l_run[0] + l_b[0], l_run[1] + l_b[1]];
                }
                let a = frags_of(&s).map(|f| f.map(|w| if has_b { w } else { 0 }));
                if has_b {
                    store_p(&a, p_s[1]);
                    sync::bar_arrive_named::<BAR_P1, 256>();
                }
                sync::bar_sync_named::<BAR_P0, 256>();
                pv_shared(&mut o, 0);
                let st_b = has_b as u32;
                wgmma::wgmma_fence();
                unroll!(kk in [0, 1, 2, 3] {
                    wgmma::wgmma_m64n256k16_rs_bf16::<1>(&mut o, a[kk], v_desc(st_b, kk as u32), true);
                });
                wgmma::wgmma_commit_group();
                wgmma::wgmma_wait_group::<1>();
                // Slabs 4-7 of stage 0: last read by A's P.V above.
                if issuer && next_a {
                    issue_half(
                        &p,
                        tmap,
                        read_pages(pages_s(0)),
                        blk_a + 2,
                        kv_s(0),
                        1,
                        bars(0),
                    );
                }
                wgmma::wgmma_wait_group::<0>();
                // Slabs 4-7 of stage 1: last read by B's P.V.
                if issuer && next_b {
                    issue_half(
                        &p,
                        tmap,
                        read_pages(pages_s(1)),
                        blk_b + 2,
                        kv_s(1),
                        1,
                        bars(1),
                    );
                }
                if next_b {
                    qk(&mut s, 1, parity ^ 1, &|| {});
                    wgmma::wgmma_wait_group::<0>();
                    zero_tail(1, blk_b + 2);
                }
            }
        }
        pair += 1;
        blk_a += 2;
    }

    // Each warpgroup summed its own blocks' P against the same final max: the row sum is
    // both. Warpgroup `wg` holds output dims 256 wg .. 256 wg + 256.
    // SAFETY: converged warps, every thread reaches the barrier; the host sized out/lse
    // and the workspace (validated).
    unsafe {
        let l_own = [decode::quad_sum(l_run[0]), decode::quad_sum(l_run[1])];
        st_rows(4 + wg, l_own);
        sync::bar_sync();
        let l_other = ld_rows(5 - wg);
        let l_tot = [l_own[0] + l_other[0], l_own[1] + l_other[1]];
        decode::write_rows::<K, M64>(&p, &o, l_tot, m_run, b, row_a, split, nsplit, wg, c);
    }
}
