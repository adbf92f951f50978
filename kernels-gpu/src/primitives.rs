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

use crate::arch::{self, bulk, cp_async, cvt, smem, sync, wgmma};
use crate::decode;
use mla_abi::DecodeParams;
use mla_abi::primitives::{BulkCopyParams, WgmmaLayoutParams, WgmmaPrimParams};

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

/// The 1024-byte aligned start of the dynamic shared memory (the kernels ask for 1 KB of
/// slack).
#[inline(always)]
fn aligned_base() -> u32 {
    (smem::smem_base() + 1023) & !1023
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
        if tid == 0 {
            bulk::mbarrier_init(bar, 1);
            bulk::fence_mbarrier_init();
        }
        // Unaligned: LLVM copies this barrier into both arms of the tid == 0 branch.
        sync::bar_sync_unaligned();
        if tid == 0 {
            bulk::mbarrier_arrive_expect_tx(bar, p.rows * p.row_bytes);
            for r in 0..p.rows {
                let src_row = *p.idx.ptr().add(r as usize) as usize;
                let src = p.src.ptr().add(src_row * p.row_bytes as usize) as *const u8;
                bulk::bulk_copy_g2s(rows_smem + r * p.row_bytes, src, p.row_bytes, bar);
            }
        }
        // A barrier that never completes traps (a launch error) rather than hanging.
        if !bulk::mbarrier_wait_parity_bounded(bar, 0, 1 << 24) {
            arch::trap();
        }
        let chunks = p.rows * p.row_bytes / 16;
        let mut i = tid;
        while i < chunks {
            let v = smem::ld_shared_v4(rows_smem + 16 * i);
            smem::st_global_v4(p.dst.ptr().add(16 * i as usize), v);
            i += 128;
        }
    }
}

/// Bytes of one 64-dim slab of a 64-row tile (64 rows x 128 bytes).
const SLAB: u32 = 8192;
/// One 64 x 576 16-bit tile in slabs.
const SLAB_TILE: u32 = 9 * SLAB;

/// Byte offset of 16-byte chunk `k` (`0..72`) of row `r` (`0..64`) of a slab tile: chunk
/// `k` lives in slab `k / 8`, as chunk `(k % 8) ^ (r % 8)` of the row's 128 bytes (the
/// 128-byte swizzle, so Q and K are K-major and V is MN-major `wgmma` operands).
#[inline(always)]
fn slab_off(r: u32, k: u32) -> u32 {
    (k / 8) * SLAB + r * 128 + (((k % 8) ^ (r % 8)) << 4)
}

/// `mla_prim_wgmma_decode_bf16`: a prototype `wgmma` decode (bf16, one split per sequence),
/// checked against the f64 oracle in `tests/gpu_primitives.rs` before it may join the
/// product image.
///
/// - Grid `(1, ceil(s_q * heads / 64), batch)`, block 256 (two warpgroups), dynamic shared
///   memory `WGMMA_DECODE_SMEM_BYTES`: 1 KB alignment slack, Q and two KV stages as slab
///   tiles (72 KB each).
/// - Both warpgroups compute the whole S = Q K^T (64 x 64, 36 `wgmma` k-steps, both operands
///   K-major) and the same softmax, so no S or P crosses shared memory; then each multiplies
///   P (in registers, the S accumulators repacked as A fragments) by its 256 output dims of
///   V (an MN-major B over four slabs, transposed-B flag). QK^T is computed twice: a first
///   step that trades 50% more MMA work for no exchange.
/// - KV: `cp.async`, one row per 4 threads, two stages, the page looked up a block ahead
///   (as the product kernel). Writes `out` and `lse` (`num_splits` must be 1).
///
/// # Safety
/// Launched as above on params the host validated, every sequence with one split.
#[inline(always)]
pub unsafe fn wgmma_decode_bf16(p: DecodeParams) {
    let tile = arch::block_idx_y();
    let b = arch::block_idx_z();
    if b >= p.batch {
        return;
    }
    // SAFETY: b < batch entries of seq_lens.
    let len_raw = unsafe { *p.seq_lens.ptr().add(b as usize) };
    let len = mla_abi::clamp_len(len_raw, p.max_pages.saturating_mul(p.page_size));
    let rows = p.s_q * p.heads;
    let row0 = tile * 64;
    let blocks = len.div_ceil(64);

    let tid = arch::thread_idx_x();
    let warp = tid / 32;
    let lane = tid % 32;
    let wg = warp / 4;
    let wq = warp % 4;
    let g = lane / 4;
    let c = lane % 4;
    let base = aligned_base();
    let q_s = base;
    let kv_s = |s: u32| base + SLAB_TILE + s * SLAB_TILE;

    // The KV row this thread copies (4 threads per row, 18 chunks each).
    let kv_r = tid / 4;
    let page_of = |j: u32| decode::kv_row_page(&p, b, j, len);
    let issue = |page: i32, kb: u32, stage: u32| {
        let src = decode::kv_row_addr(&p, page, kb * 64 + kv_r, 2);
        let mut k = tid % 4;
        while k < 72 {
            let dst = kv_s(stage) + slab_off(kv_r, k);
            // SAFETY: dst inside the stage; src + 16k is chunk k of a checked row, or
            // nothing is read (size 0).
            unsafe {
                match src {
                    Some(a) => cp_async::cp_async_cg_16(dst, a.add((k << 4) as usize), 16),
                    None => cp_async::cp_async_cg_16(dst, p.kv_cache.ptr() as *const u8, 0),
                }
            }
            k += 4;
        }
    };

    // Q rows (zeros past the last row) and block 0.
    let mut ch = tid;
    while ch < 64 * 72 {
        let (r, k) = (ch / 72, ch % 72);
        let gr = row0 + r;
        let dst = q_s + slab_off(r, k);
        // SAFETY: a validated q row's chunk k, or nothing read (size 0).
        unsafe {
            if gr < rows {
                let (t, h) = (gr / p.heads, gr % p.heads);
                let off =
                    b as u64 * p.q_stride_b + t as u64 * p.q_stride_s + h as u64 * p.q_stride_h;
                cp_async::cp_async_cg_16(
                    dst,
                    p.q.ptr().add((off * 2 + 16 * k as u64) as usize) as *const u8,
                    16,
                );
            } else {
                cp_async::cp_async_cg_16(dst, p.q.ptr() as *const u8, 0);
            }
        }
        ch += 256;
    }
    if blocks > 0 {
        issue(page_of(kv_r), 0, 0);
    }
    cp_async::cp_async_commit_group();
    let mut next_page = if blocks > 1 { page_of(64 + kv_r) } else { -1 };

    // This thread's two rows (g and g + 8 of its warp's 16) and their causal visibility.
    let row_a = row0 + 16 * wq + g;
    let vis = |gr: u32| -> u32 {
        let t = if gr < rows { gr / p.heads } else { p.s_q - 1 };
        (len + t + 1).saturating_sub(p.s_q)
    };
    let vis_r = [vis(row_a), vis(row_a + 8)];
    let scale_log2 = p.softmax_scale * core::f32::consts::LOG2_E;

    let mut o = [[0.0f32; 4]; 32];
    let mut m_run = [f32::NEG_INFINITY; 2];
    let mut l_run = [0.0f32; 2];
    let mut stage = 0u32;
    let mut kb = 0u32;
    while kb < blocks {
        if kb + 1 < blocks {
            issue(next_page, kb + 1, stage ^ 1);
            if kb + 2 < blocks {
                next_page = page_of((kb + 2) * 64 + kv_r);
            }
        }
        cp_async::cp_async_commit_group();
        cp_async::cp_async_wait_group::<1>();
        // cp.async wrote through the generic proxy; wgmma reads through the async one.
        wgmma::fence_proxy_async_shared();
        // SAFETY: every thread reaches the barriers (loop bounds are CTA-uniform); the
        // descriptors address the Q tile and this stage; each warpgroup runs the wgmma
        // sequences converged.
        unsafe {
            sync::bar_sync();
            let kv = kv_s(stage);
            let mut s = [0.0f32; 32];
            wgmma::wgmma_fence();
            for ks in 0..36u32 {
                let off = (ks / 4) * SLAB + (ks % 4) * 32;
                let da = wgmma::smem_desc(q_s + off, 16, 1024, wgmma::Swizzle::B128);
                let db = wgmma::smem_desc(kv + off, 16, 1024, wgmma::Swizzle::B128);
                wgmma::wgmma_m64n64k16_bf16(&mut s, da, db, ks > 0);
            }
            wgmma::wgmma_commit_group();
            wgmma::wgmma_wait_group::<0>();

            // Mask, scale, row max (the quad holds all 64 columns of its two rows).
            let mut m_loc = [f32::NEG_INFINITY; 2];
            unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
                unroll!(e in [0, 1, 2, 3] {
                    let tok = kb * 64 + 8 * j as u32 + 2 * c + (e % 2) as u32;
                    let x = if tok < vis_r[e / 2] { s[4 * j + e] * scale_log2 } else { f32::NEG_INFINITY };
                    s[4 * j + e] = x;
                    m_loc[e / 2] = sync::fmax(m_loc[e / 2], x);
                });
            });
            let m_new = [
                sync::fmax(m_run[0], decode::quad_max(m_loc[0])),
                sync::fmax(m_run[1], decode::quad_max(m_loc[1])),
            ];
            let (m_ref, alpha) = decode::rescale_rows(&mut m_run, &mut l_run, m_new);
            unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
                unroll!(e in [0, 1, 2, 3] {
                    let pe = sync::ex2(s[4 * j + e] - m_ref[e / 2]);
                    l_run[e / 2] += pe;
                    s[4 * j + e] = pe;
                });
            });
            unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
                o[j][0] *= alpha[0];
                o[j][1] *= alpha[0];
                o[j][2] *= alpha[1];
                o[j][3] *= alpha[1];
            });
            // O[:, this warpgroup's 256 dims] += P . V: P's k-step kk is the S tiles 2kk and
            // 2kk + 1 repacked; V's is 16 token rows of slabs 4 wg .. 4 wg + 4.
            wgmma::wgmma_fence();
            unroll!(kk in [0, 1, 2, 3] {
                let t0 = 4 * (2 * kk);
                let t1 = 4 * (2 * kk + 1);
                let a = [
                    cvt::pack_bf16x2(s[t0], s[t0 + 1]),
                    cvt::pack_bf16x2(s[t0 + 2], s[t0 + 3]),
                    cvt::pack_bf16x2(s[t1], s[t1 + 1]),
                    cvt::pack_bf16x2(s[t1 + 2], s[t1 + 3]),
                ];
                let db = wgmma::smem_desc(
                    kv + 4 * wg * SLAB + kk as u32 * 16 * 128,
                    SLAB,
                    1024,
                    wgmma::Swizzle::B128,
                );
                wgmma::wgmma_m64n256k16_rs_bf16::<1>(&mut o, a, db, true);
            });
            wgmma::wgmma_commit_group();
            wgmma::wgmma_wait_group::<0>();
            // Both warpgroups are done with this stage before it is refilled.
            sync::bar_sync();
        }
        stage ^= 1;
        kb += 1;
    }
    cp_async::cp_async_wait_group::<0>();

    // Row sums over the quad; normalise and store this warpgroup's dims of both rows.
    // SAFETY: converged warps; rows < `rows` of a validated out / lse.
    unsafe {
        unroll!(h in [0, 1] {
            let l = decode::quad_sum(l_run[h]);
            let gr = row_a + 8 * h as u32;
            if gr < rows {
                let (inv, lse) = if l > 0.0 {
                    (sync::rcp(l), (m_run[h] + sync::lg2(l)) * core::f32::consts::LN_2)
                } else {
                    (0.0, f32::NEG_INFINITY)
                };
                let scale = inv * p.value_scale * p.output_scale;
                let (t, hd) = (gr / p.heads, gr % p.heads);
                let row_off = b as u64 * p.out_stride_b + t as u64 * p.out_stride_s + hd as u64 * p.out_stride_h;
                let dst = (p.out.ptr() as *mut u16).add(row_off as usize + 256 * wg as usize + 2 * c as usize);
                unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
                    let v = cvt::pack_bf16x2(o[j][2 * h] * scale, o[j][2 * h + 1] * scale);
                    *(dst.add(8 * j) as *mut u32) = v;
                });
                if wg == 0 && c == 0 {
                    *p.lse.ptr().add((b * rows + gr) as usize) = lse;
                }
            }
        });
    }
}
