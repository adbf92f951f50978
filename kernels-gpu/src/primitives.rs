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

use crate::arch::{self, smem, sync, wgmma};
use mla_abi::primitives::WgmmaPrimParams;

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
