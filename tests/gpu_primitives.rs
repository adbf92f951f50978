//! Primitive test kernels on the GPU against a CPU loop (layer 2 of the test plan): the
//! instructions the next kernels will use, checked alone before any kernel relies on them.
//! Runs only on sm_90 (the image is sm_90a):
//! - `wgmma.mma_async m64n64k16` bf16, both operands in shared memory, no-swizzle K-major;
//! - the `wgmma` decode's layouts: 128-byte-swizzled K-major A and B over four k-steps;
//!   an MN-major (transposed) B in two 8 KB slabs with A from shared memory and from
//!   registers (m64n128k16), which also pins down which descriptor offset strides along K;
//! - the e4m3 layouts: `m64n64k32` over 64-byte-swizzled K-major tiles, P quantised to e4m3
//!   from the accumulators into the A registers, against a token-permuted V^T;
//! - `cp.async.bulk` rows gathered by index into shared memory on an `mbarrier`;
//! - TMA (`cp.async.bulk.tensor`, a host-encoded 3-D tensor map with the 128-byte swizzle)
//!   writing a paged bf16 block exactly in the `wgmma` decode's slab layout, pages of 64
//!   and of 16 tokens;
//! - the TMA decode's two-warpgroup exchange (`bar.arrive` / `bar.sync` on named barriers,
//!   then a CTA barrier) alone, with and without an `mbarrier` / `cp.async.bulk` prologue:
//!   the kernel compute-sanitizer's racecheck is pointed at to tell a tool report on that
//!   protocol from a race in the decode.

mod common;

use std::ffi::c_void;

use cudarc::driver::result;
use cudarc::driver::{CudaContext, CudaStream, DevicePtr};
use cudarc::nvrtc::Ptx;
use mla::abi::DevPtr;
use mla::abi::primitives::{
    BULK_COPY, BULK_MAX_ROW_BYTES, BULK_MAX_ROWS, BULK_SMEM_BYTES, BulkCopyParams, E4M3_SMEM_BYTES,
    E4m3PrimParams, EXCHANGE, EXCHANGE_SMEM_BYTES, ExchangeParams, TMA_SLABS, TMA_SMEM_BYTES,
    TmaSlabsParams, WGMMA_E4M3, WGMMA_LAYOUT_SMEM_BYTES, WGMMA_M64N64K16_BF16, WGMMA_RS_MN_B,
    WGMMA_SMEM_BYTES, WGMMA_SW128_KMAJOR, WGMMA_SW128_MN_B, WgmmaLayoutParams, WgmmaPrimParams,
};
use mla_dev::numeric;
use mla_dev::rng::SplitMix64;

#[test]
fn wgmma_m64n64k16_bf16_matches_cpu() {
    let test = "prim_wgmma";
    let seed = common::seed(test);
    let Some((rt, _)) = common::gpu(test) else {
        return;
    };
    if rt.device().compute_capability != (9, 0) {
        common::loud(&format!(
            "SKIPPED {test}: the primitives image is sm_90a only"
        ));
        return;
    }
    let Some(cubin) = mla::images::CUBIN_PRIM_SM_90A else {
        common::loud(&format!(
            "SKIPPED {test}: built without ptxas (no primitives cubin)"
        ));
        return;
    };
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let module = ctx.load_module(Ptx::from_binary(cubin.to_vec())).unwrap();
    let f = module.load_function(WGMMA_M64N64K16_BF16).unwrap();

    let mut rng = SplitMix64::new(seed);
    let a: Vec<f32> = (0..64 * 16)
        .map(|_| numeric::round_to(mla::abi::ElemType::Bf16, rng.normal()) as f32)
        .collect();
    let b: Vec<f32> = (0..64 * 16)
        .map(|_| numeric::round_to(mla::abi::ElemType::Bf16, rng.normal()) as f32)
        .collect();
    let bits = |v: &[f32]| -> Vec<u16> { v.iter().map(|&x| numeric::bf16_from_f32(x)).collect() };
    let da = stream.clone_htod(&bits(&a)).unwrap();
    let db = stream.clone_htod(&bits(&b)).unwrap();
    let dd = stream.clone_htod(&vec![f32::NAN; 64 * 64]).unwrap();
    let p = WgmmaPrimParams {
        a: DevPtr::from_addr(da.device_ptr(&stream).0),
        b: DevPtr::from_addr(db.device_ptr(&stream).0),
        d: DevPtr::from_addr(dd.device_ptr(&stream).0),
    };
    let mut args = [&p as *const WgmmaPrimParams as *mut c_void];
    // SAFETY: the params match the kernel's struct; the buffers hold the documented shapes.
    unsafe {
        result::launch_kernel(
            f.cu_function(),
            (1, 1, 1),
            (128, 1, 1),
            WGMMA_SMEM_BYTES as u32,
            stream.cu_stream(),
            &mut args,
        )
    }
    .unwrap();
    let got: Vec<f32> = stream.clone_dtoh(&dd).unwrap();
    let mut worst = (0.0f64, 0usize);
    for i in 0..64 {
        for j in 0..64 {
            let want: f64 = (0..16)
                .map(|k| a[i * 16 + k] as f64 * b[j * 16 + k] as f64)
                .sum();
            let err = (got[i * 64 + j] as f64 - want).abs();
            if err.is_nan() || err > worst.0 {
                worst = (if err.is_nan() { f64::INFINITY } else { err }, i * 64 + j);
            }
        }
    }
    eprintln!(
        "[{test}] max |err| = {:.3e} at [{}, {}] (seed {seed})",
        worst.0,
        worst.1 / 64,
        worst.1 % 64
    );
    // bf16 products are exact in f32; only the f32 accumulation order differs.
    assert!(
        worst.0 < 1e-4,
        "wgmma result off by {} at {}",
        worst.0,
        worst.1
    );
}

/// The primitives module on device 0 with its stream, or `None` after a loud skip.
fn prim_module(
    test: &str,
) -> Option<(
    std::sync::Arc<CudaStream>,
    std::sync::Arc<cudarc::driver::CudaModule>,
)> {
    let (rt, _) = common::gpu(test)?;
    if rt.device().compute_capability != (9, 0) {
        common::loud(&format!(
            "SKIPPED {test}: the primitives image is sm_90a only"
        ));
        return None;
    }
    let Some(cubin) = mla::images::CUBIN_PRIM_SM_90A else {
        common::loud(&format!(
            "SKIPPED {test}: built without ptxas (no primitives cubin)"
        ));
        return None;
    };
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let module = ctx.load_module(Ptx::from_binary(cubin.to_vec())).unwrap();
    Some((stream, module))
}

/// Launches `name` on one CTA of 128 threads with `smem` bytes of dynamic shared memory.
fn launch_one<P>(
    stream: &CudaStream,
    module: &std::sync::Arc<cudarc::driver::CudaModule>,
    name: &str,
    p: &P,
    smem: usize,
) {
    launch_block(stream, module, name, p, smem, 128)
}

/// [`launch_one`] with `threads` threads.
fn launch_block<P>(
    stream: &CudaStream,
    module: &std::sync::Arc<cudarc::driver::CudaModule>,
    name: &str,
    p: &P,
    smem: usize,
    threads: u32,
) {
    let f = module.load_function(name).unwrap();
    f.set_attribute(
        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        smem as i32,
    )
    .unwrap();
    let mut args = [p as *const P as *mut c_void];
    // SAFETY: the params match the kernel's struct; the buffers hold the documented shapes.
    unsafe {
        result::launch_kernel(
            f.cu_function(),
            (1, 1, 1),
            (threads, 1, 1),
            smem as u32,
            stream.cu_stream(),
            &mut args,
        )
    }
    .unwrap();
    stream.synchronize().unwrap();
}

fn bf16_values(rng: &mut SplitMix64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| numeric::round_to(mla::abi::ElemType::Bf16, rng.normal()) as f32)
        .collect()
}

fn bf16_bits(v: &[f32]) -> Vec<u16> {
    v.iter().map(|&x| numeric::bf16_from_f32(x)).collect()
}

/// Largest |got - want| (NaN counts as infinite) and its index.
fn worst(got: &[f32], want: &[f64]) -> (f64, usize) {
    let mut w = (0.0f64, 0usize);
    for (i, (&g, &r)) in got.iter().zip(want).enumerate() {
        let e = (g as f64 - r).abs();
        let e = if e.is_nan() { f64::INFINITY } else { e };
        if e > w.0 {
            w = (e, i);
        }
    }
    w
}

/// Runs one layout kernel on fresh data and returns (max error, index) against the f64
/// product: `a [64, 64] . b^T` for the K-major kernel (`b` is `[64 N, 64 K]`), else
/// `a [64, 64] . b [64 K, 128 N]`.
fn run_layout(
    stream: &std::sync::Arc<CudaStream>,
    module: &std::sync::Arc<cudarc::driver::CudaModule>,
    name: &str,
    rng: &mut SplitMix64,
    lbo: u32,
    sbo: u32,
) -> (f64, usize) {
    let kmajor = name == WGMMA_SW128_KMAJOR;
    let n = if kmajor { 64 } else { 128 };
    let a = bf16_values(rng, 64 * 64);
    let b = bf16_values(rng, 64 * n);
    let da = stream.clone_htod(&bf16_bits(&a)).unwrap();
    let db = stream.clone_htod(&bf16_bits(&b)).unwrap();
    let dd = stream.clone_htod(&vec![f32::NAN; 64 * n]).unwrap();
    let p = WgmmaLayoutParams {
        a: DevPtr::from_addr(da.device_ptr(stream).0),
        b: DevPtr::from_addr(db.device_ptr(stream).0),
        d: DevPtr::from_addr(dd.device_ptr(stream).0),
        lbo,
        sbo,
    };
    launch_one(stream, module, name, &p, WGMMA_LAYOUT_SMEM_BYTES);
    let got: Vec<f32> = stream.clone_dtoh(&dd).unwrap();
    let mut want = vec![0.0f64; 64 * n];
    for i in 0..64 {
        for j in 0..n {
            want[i * n + j] = (0..64)
                .map(|k| {
                    let bv = if kmajor { b[j * 64 + k] } else { b[k * n + j] };
                    a[i * 64 + k] as f64 * bv as f64
                })
                .sum();
        }
    }
    worst(&got, &want)
}

#[test]
fn wgmma_sw128_kmajor_matches_cpu() {
    let test = "prim_wgmma_sw128_kmajor";
    let seed = common::seed(test);
    let Some((stream, module)) = prim_module(test) else {
        return;
    };
    let mut rng = SplitMix64::new(seed);
    let (err, at) = run_layout(&stream, &module, WGMMA_SW128_KMAJOR, &mut rng, 16, 1024);
    eprintln!("[{test}] max |err| = {err:.3e} at {at} (seed {seed})");
    // bf16 products are exact in f32; only the f32 accumulation order differs (K = 64).
    assert!(
        err < 1e-3,
        "128-byte swizzled K-major wgmma off by {err} at {at}"
    );
}

/// The MN-major B descriptor: the expected offsets (LBO = 8192, the next 64-column slab;
/// SBO = 1024, the next 8 K-rows) must match; if not, the swapped pair is tried too and
/// both results are printed, so a failure says which field strides along K.
#[test]
fn wgmma_mn_major_b_matches_cpu() {
    let test = "prim_wgmma_mn_b";
    let seed = common::seed(test);
    let Some((stream, module)) = prim_module(test) else {
        return;
    };
    let mut rng = SplitMix64::new(seed);
    let mut failures = Vec::new();
    for name in [WGMMA_SW128_MN_B, WGMMA_RS_MN_B] {
        let (err, at) = run_layout(&stream, &module, name, &mut rng, 8192, 1024);
        eprintln!("[{test}] {name} lbo=8192 sbo=1024: max |err| = {err:.3e} at {at}");
        if err >= 1e-3 {
            let (e2, at2) = run_layout(&stream, &module, name, &mut rng, 1024, 8192);
            eprintln!("[{test}] {name} lbo=1024 sbo=8192 (swapped): max |err| = {e2:.3e} at {at2}");
            failures.push(format!("{name}: off by {err} at {at} (swapped: {e2})"));
        }
    }
    eprintln!("[{test}] seed {seed}");
    assert!(failures.is_empty(), "{failures:?}");
}

/// `e <= bound`, false for NaN.
fn within(e: f64, bound: f64) -> bool {
    e <= bound
}

/// The e4m3 path's pieces (`mla_prim_wgmma_e4m3`): S from two 64-byte-swizzled K-major
/// tiles, and O = e4m3(S * p_scale) . V with P packed from S's accumulators into the A
/// registers against V^T in the permuted token order. The CPU reference quantises the
/// kernel's own S, so O's check covers the packing and V^T alone. fp8 products are exact;
/// the bound allows for the tensor cores' accumulation (relative to the sum of magnitudes).
#[test]
fn wgmma_e4m3_matches_cpu() {
    let test = "prim_wgmma_e4m3";
    let seed = common::seed(test);
    let Some((stream, module)) = prim_module(test) else {
        return;
    };
    let mut rng = SplitMix64::new(seed);
    let mut e4m3 = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| numeric::e4m3_from_f32(rng.normal() as f32 * 4.0))
            .collect()
    };
    let (q, kv) = (e4m3(64 * 64), e4m3(64 * 64));
    let f = |b: &[u8]| {
        b.iter()
            .map(|&x| numeric::e4m3_to_f32(x) as f64)
            .collect::<Vec<_>>()
    };
    let (qf, kf) = (f(&q), f(&kv));
    let mut s_ref = vec![0.0f64; 64 * 64];
    let mut s_mag = vec![0.0f64; 64 * 64];
    for r in 0..64 {
        for t in 0..64 {
            for d in 0..64 {
                s_ref[r * 64 + t] += qf[r * 64 + d] * kf[t * 64 + d];
                s_mag[r * 64 + t] += (qf[r * 64 + d] * kf[t * 64 + d]).abs();
            }
        }
    }
    let s_max = s_ref.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let p_scale = (200.0 / s_max) as f32;
    let dq = stream.clone_htod(&q).unwrap();
    let dkv = stream.clone_htod(&kv).unwrap();
    let ds = stream.clone_htod(&vec![f32::NAN; 64 * 64]).unwrap();
    let dout = stream.clone_htod(&vec![f32::NAN; 64 * 64]).unwrap();
    let p = E4m3PrimParams {
        q: DevPtr::from_addr(dq.device_ptr(&stream).0),
        kv: DevPtr::from_addr(dkv.device_ptr(&stream).0),
        s: DevPtr::from_addr(ds.device_ptr(&stream).0),
        o: DevPtr::from_addr(dout.device_ptr(&stream).0),
        p_scale,
    };
    launch_one(&stream, &module, WGMMA_E4M3, &p, E4M3_SMEM_BYTES);
    let s: Vec<f32> = stream.clone_dtoh(&ds).unwrap();
    let o: Vec<f32> = stream.clone_dtoh(&dout).unwrap();
    let bad_s = (0..64 * 64)
        .filter(|&i| {
            let e = (s[i] as f64 - s_ref[i]).abs();
            !within(e, 1e-3 * s_mag[i] + 1e-6)
        })
        .count();
    // P from the kernel's S, quantised as the kernel does (f32 product, then RNE to e4m3).
    let pq: Vec<f64> = s
        .iter()
        .map(|&x| numeric::e4m3_to_f32(numeric::e4m3_from_f32(x * p_scale)) as f64)
        .collect();
    let mut bad_o = 0;
    let mut worst_o = (0.0f64, 0usize);
    for r in 0..64 {
        for n in 0..64 {
            let (mut want, mut mag) = (0.0f64, 0.0f64);
            for t in 0..64 {
                want += pq[r * 64 + t] * kf[t * 64 + n];
                mag += (pq[r * 64 + t] * kf[t * 64 + n]).abs();
            }
            let e = (o[r * 64 + n] as f64 - want).abs();
            if !within(e, 1e-3 * mag + 1e-6) {
                bad_o += 1;
            }
            if e.is_nan() || e > worst_o.0 {
                worst_o = (e, r * 64 + n);
            }
        }
    }
    eprintln!(
        "[{test}] S: {bad_s} of 4096 off; O: {bad_o} of 4096 off (worst {:.3e} at {}); p_scale {p_scale} (seed {seed})",
        worst_o.0, worst_o.1
    );
    assert_eq!(bad_s, 0, "S from the 64-byte-swizzled e4m3 tiles");
    assert_eq!(bad_o, 0, "O from P in registers against the permuted V^T");
}

#[test]
fn bulk_copy_gathers_rows_exactly() {
    let test = "prim_bulk_copy";
    let seed = common::seed(test);
    let Some((stream, module)) = prim_module(test) else {
        return;
    };
    let mut rng = SplitMix64::new(seed);
    let src_rows = 3 * BULK_MAX_ROWS;
    for (rows, row_bytes) in [(BULK_MAX_ROWS, BULK_MAX_ROW_BYTES), (37, 576), (1, 16)] {
        let src: Vec<u8> = (0..src_rows * row_bytes)
            .map(|_| (rng.next_u64() >> 56) as u8)
            .collect();
        let idx: Vec<i32> = rng.permutation(src_rows)[..rows]
            .iter()
            .map(|&i| i as i32)
            .collect();
        let dsrc = stream.clone_htod(&src).unwrap();
        let didx = stream.clone_htod(&idx).unwrap();
        let ddst = stream.clone_htod(&vec![0xa5u8; rows * row_bytes]).unwrap();
        let p = BulkCopyParams {
            src: DevPtr::from_addr(dsrc.device_ptr(&stream).0),
            idx: DevPtr::from_addr(didx.device_ptr(&stream).0),
            dst: DevPtr::from_addr(ddst.device_ptr(&stream).0),
            rows: rows as u32,
            row_bytes: row_bytes as u32,
        };
        launch_one(&stream, &module, BULK_COPY, &p, BULK_SMEM_BYTES);
        let got: Vec<u8> = stream.clone_dtoh(&ddst).unwrap();
        let bad = (0..rows)
            .filter(|&r| {
                let s = idx[r] as usize * row_bytes;
                got[r * row_bytes..(r + 1) * row_bytes] != src[s..s + row_bytes]
            })
            .count();
        eprintln!("[{test}] {rows} rows of {row_bytes} B: {bad} rows differ (seed {seed})");
        assert_eq!(bad, 0, "bulk copy of {rows} x {row_bytes} B");
    }
}

/// The decode's tensor map (`mla::tmap::encode_paged_map`) over a contiguous paged bf16
/// cache `[num_pages, rows, 576]`: box `{64 dims, rows tokens, 1 page}`, 128-byte swizzle
/// (so a box lands as one slab's rows), as the 128 bytes the kernel reads.
fn encode_cache_map(cache: u64, rows: usize, num_pages: usize) -> [u8; 128] {
    let map = mla::tmap::encode_paged_map(
        cache,
        mla::tmap::MapLayout::Bf16Swizzle128,
        rows,
        num_pages,
        576,
        rows * 576,
    )
    .expect("cuTensorMapEncodeTiled");
    let mut bytes = [0u8; 128];
    for (i, w) in map.words.iter().enumerate() {
        bytes[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
    }
    bytes
}

#[test]
fn tma_slabs_land_in_the_slab_layout() {
    let test = "prim_tma_slabs";
    let seed = common::seed(test);
    let Some((stream, module)) = prim_module(test) else {
        return;
    };
    let mut rng = SplitMix64::new(seed);
    for rows in [64usize, 16] {
        let num_pages = 1 + 64 / rows + 1;
        let cache: Vec<u16> = (0..num_pages * rows * 576)
            .map(|_| (rng.next_u64() >> 48) as u16)
            .collect();
        let dcache = stream.clone_htod(&cache).unwrap();
        let map = encode_cache_map(dcache.device_ptr(&stream).0, rows, num_pages);
        let dmap = stream.clone_htod(&map).unwrap();
        let ddst = stream.clone_htod(&vec![0xa5u8; 64 * 1152]).unwrap();
        let page = 1usize;
        let p = TmaSlabsParams {
            tmap: DevPtr::from_addr(dmap.device_ptr(&stream).0),
            dst: DevPtr::from_addr(ddst.device_ptr(&stream).0),
            page: page as u32,
            rows: rows as u32,
        };
        launch_one(&stream, &module, TMA_SLABS, &p, TMA_SMEM_BYTES);
        let got: Vec<u8> = stream.clone_dtoh(&ddst).unwrap();
        // Token t of the block is row t % rows of page `page + t / rows`; its 16-byte chunk
        // k must sit at the slab offset (slab k / 8, row t, chunk (k % 8) ^ (t % 8)).
        let mut bad = 0;
        for t in 0..64 {
            let row = (page + t / rows) * rows + t % rows;
            for k in 0..72 {
                let off = (k / 8) * 8192 + t * 128 + (((k % 8) ^ (t % 8)) << 4);
                let want: Vec<u8> = cache[row * 576 + 8 * k..row * 576 + 8 * k + 8]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect();
                if got[off..off + 16] != want[..] {
                    bad += 1;
                }
            }
        }
        eprintln!("[{test}] pages of {rows} tokens: {bad} of 4608 chunks misplaced (seed {seed})");
        assert_eq!(bad, 0, "TMA slab layout, pages of {rows}");
    }
}

#[test]
fn exchange_protocol_passes_every_value() {
    let test = "prim_exchange";
    let seed = common::seed(test);
    let Some((stream, module)) = prim_module(test) else {
        return;
    };
    let mut rng = SplitMix64::new(seed);
    // MLA_PRIM_SYNC_MODE=1, 2, 3 or 4: the exchange with bar.sync pairs, CTA barriers,
    // bar.sync pairs plus per-warpgroup barriers and mbarrier polls, or those plus a tile
    // handed to a wgmma each round (the racecheck controls); default 0, the decode's
    // bar.arrive / bar.sync.
    let sync_mode = std::env::var("MLA_PRIM_SYNC_MODE")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(0)
        .min(4);
    for bulk_prologue in [0u32, 1] {
        let rounds = 1 + (rng.next_u64() % 8) as u32;
        // The copied word starts every thread's sum in the prologue variant.
        let start = if bulk_prologue != 0 { 0.25f32 } else { 0.0 };
        let src: Vec<f32> = vec![start; 4];
        let dsrc = stream.clone_htod(&src).unwrap();
        let dout = stream.clone_htod(&vec![f32::NAN; 512]).unwrap();
        let p = ExchangeParams {
            src: DevPtr::from_addr(dsrc.device_ptr(&stream).0),
            out: DevPtr::from_addr(dout.device_ptr(&stream).0),
            rounds,
            bulk_prologue,
            sync_mode,
        };
        launch_block(&stream, &module, EXCHANGE, &p, EXCHANGE_SMEM_BYTES, 256);
        let got: Vec<f32> = stream.clone_dtoh(&dout).unwrap();
        // Row r, round k: warpgroup 0 sends a = 64 k + r and a + 1/2; warpgroup 1 sums
        // 2a + 1/2 and sends back 2a + 1/2 and 2a; warpgroup 0 sums 4a + 1/2.
        let sums = |r: usize| {
            let a = |k: u32| (64 * k) as f32 + r as f32;
            let s0: f32 = (0..rounds).map(|k| 4.0 * a(k) + 0.5).sum::<f32>() + start;
            let s1: f32 = (0..rounds).map(|k| 2.0 * a(k) + 0.5).sum::<f32>() + start;
            (s0, s1)
        };
        let bad = (0..256usize)
            .filter(|&tid| {
                let (s0, s1) = sums(tid % 64);
                let want = if tid < 128 { [s0, s1] } else { [s1, s0] };
                got[2 * tid..2 * tid + 2] != want
            })
            .count();
        eprintln!(
            "[{test}] sync mode {sync_mode}, prologue {bulk_prologue}, {rounds} rounds: {bad} of 256 threads wrong (seed {seed})"
        );
        assert_eq!(
            bad, 0,
            "exchange, prologue {bulk_prologue}, {rounds} rounds"
        );
    }
}
