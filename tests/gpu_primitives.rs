//! Primitive test kernels on the GPU against a CPU loop (layer 2 of the test plan): the
//! instructions the next kernels will use, checked alone before any kernel relies on them.
//! Runs only on sm_90 (the image is sm_90a):
//! - `wgmma.mma_async m64n64k16` bf16, both operands in shared memory, no-swizzle K-major;
//! - the `wgmma` decode's layouts: 128-byte-swizzled K-major A and B over four k-steps;
//!   an MN-major (transposed) B in two 8 KB slabs with A from shared memory and from
//!   registers (m64n128k16), which also pins down which descriptor offset strides along K;
//! - `cp.async.bulk` rows gathered by index into shared memory on an `mbarrier`.

mod common;

use std::ffi::c_void;

use cudarc::driver::result;
use cudarc::driver::{CudaContext, CudaStream, DevicePtr};
use cudarc::nvrtc::Ptx;
use mla::abi::DevPtr;
use mla::abi::primitives::{
    BULK_COPY, BULK_MAX_ROW_BYTES, BULK_MAX_ROWS, BULK_SMEM_BYTES, BulkCopyParams,
    WGMMA_LAYOUT_SMEM_BYTES, WGMMA_M64N64K16_BF16, WGMMA_RS_MN_B, WGMMA_SMEM_BYTES,
    WGMMA_SW128_KMAJOR, WGMMA_SW128_MN_B, WgmmaLayoutParams, WgmmaPrimParams,
};
use mla::numeric;
use mla::rng::SplitMix64;

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
            (128, 1, 1),
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

/// The prototype `wgmma` decode (primitives image) against the f64 oracle: bf16, one split
/// per sequence, several page sizes, head counts (1 to 2 row tiles, partial tiles) and S_q
/// (causal), lengths around the 64-token block edges, outputs poisoned first.
#[test]
fn wgmma_decode_prototype_matches_oracle() {
    use mla::DecodeDtypes;
    use mla::abi::DecodeParams;
    use mla::abi::primitives::{WGMMA_DECODE_BF16, WGMMA_DECODE_SMEM_BYTES};
    use mla::harness::{self, CaseSpec, DeviceCase, HostCase};

    let test = "prim_wgmma_decode";
    let seed = common::seed(test);
    let Some((stream, module)) = prim_module(test) else {
        return;
    };
    let f = module.load_function(WGMMA_DECODE_BF16).unwrap();
    f.set_attribute(
        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        WGMMA_DECODE_SMEM_BYTES as i32,
    )
    .unwrap();
    let mut rng = SplitMix64::new(seed);
    let specs = [
        CaseSpec::new(
            DecodeDtypes::Bf16,
            64,
            128,
            1,
            vec![1, 63, 64, 65, 700, 4096],
        ),
        CaseSpec::new(DecodeDtypes::Bf16, 16, 64, 2, vec![2, 100, 1500]),
        CaseSpec::new(DecodeDtypes::Bf16, 1, 16, 1, vec![5, 300]),
        CaseSpec::new(DecodeDtypes::Bf16, 128, 100, 2, vec![129, 2000]),
    ];
    let mut failures = Vec::new();
    for spec in specs {
        let h = HostCase::random(&spec, &mut rng);
        let refs = h.references();
        let mut d = DeviceCase::upload(&stream, &h).unwrap();
        d.poison_outputs(&stream).unwrap();
        let b = spec.lens.len();
        let rows = spec.s_q * spec.heads;
        let ones = stream.clone_htod(&vec![1i32; b]).unwrap();
        let p = contiguous_params(
            [
                d.q.device_ptr(&stream).0,
                d.kv.device_ptr(&stream).0,
                d.table.device_ptr(&stream).0,
                d.lens.device_ptr(&stream).0,
                ones.device_ptr(&stream).0,
                d.out.device_ptr(&stream).0,
                d.lse.device_ptr(&stream).0,
            ],
            b,
            spec.s_q,
            spec.heads,
            spec.page_size,
            h.num_pages,
            h.max_pages,
            h.scales.softmax_scale,
            h.scales.output_scale,
        );
        let mut args = [&p as *const DecodeParams as *mut c_void];
        // SAFETY: the params match the kernel's struct; every buffer holds its shape.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                (1, rows.div_ceil(64) as u32, b as u32),
                (256, 1, 1),
                WGMMA_DECODE_SMEM_BYTES as u32,
                stream.cu_stream(),
                &mut args,
            )
        }
        .unwrap();
        let got = d.download(&stream, spec.dtypes.out()).unwrap();
        let c = harness::check(&got, &refs);
        eprintln!(
            "[{test}] P={} H={} S_q={} lens={:?}: out {} | lse {}",
            spec.page_size, spec.heads, spec.s_q, spec.lens, c.out, c.lse
        );
        if !c.ok() {
            failures.push(format!(
                "P={} H={} S_q={}",
                spec.page_size, spec.heads, spec.s_q
            ));
        }
    }
    eprintln!("[{test}] {} failures (seed {seed})", failures.len());
    assert!(failures.is_empty(), "{failures:?}");
}

/// Times the prototype `wgmma` decode against the product 64-row kernel on B=64, L=4096,
/// H=128, S_q=1, bf16, page 64 (one split each), the L2 flushed before every call, median of
/// 10. Informational: prints both and their ratio; asserts only that the prototype's output
/// is finite.
#[test]
fn wgmma_decode_prototype_speed() {
    use mla::DecodeDtypes;
    use mla::abi::primitives::{WGMMA_DECODE_BF16, WGMMA_DECODE_SMEM_BYTES};
    use mla::abi::{D_QK, D_V, DecodeParams};
    use mla::bench::{BenchShape, flops, time_shape};

    let test = "prim_wgmma_decode_speed";
    let seed = common::seed(test);
    let Some((rt, _)) = common::gpu(test) else {
        return;
    };
    let Some((stream, module)) = prim_module(test) else {
        return;
    };
    let mut rng = SplitMix64::new(seed);
    let (b, len, heads, page) = (64usize, 4096usize, 128usize, 64usize);
    let shape = BenchShape {
        dtypes: DecodeDtypes::Bf16,
        tile: mla::tactic::Tile::M64N64,
        batch: b,
        len,
        heads,
        s_q: 1,
        page,
    };
    let product = time_shape(&rt, &stream, shape, &mut rng, 10).unwrap();

    // Inputs tiled from a pool of random bf16 values; pages in a random order.
    let pool = bf16_bits(&bf16_values(&mut rng, 1 << 20));
    let tiled = |n: usize| -> Vec<u16> { (0..n).map(|i| pool[(i * 7919) % pool.len()]).collect() };
    let pages = b * len / page;
    let table: Vec<i32> = rng.permutation(pages).iter().map(|&p| p as i32).collect();
    let q = stream.clone_htod(&tiled(b * heads * D_QK)).unwrap();
    let kv = stream.clone_htod(&tiled(pages * page * D_QK)).unwrap();
    let dt = stream.clone_htod(&table).unwrap();
    let dl = stream.clone_htod(&vec![len as i32; b]).unwrap();
    let ones = stream.clone_htod(&vec![1i32; b]).unwrap();
    let out = stream.clone_htod(&vec![0u16; b * heads * D_V]).unwrap();
    let lse = stream.clone_htod(&vec![0f32; b * heads]).unwrap();
    let mut flush = stream.alloc_zeros::<u8>(256 << 20).unwrap();
    let p = contiguous_params(
        [
            q.device_ptr(&stream).0,
            kv.device_ptr(&stream).0,
            dt.device_ptr(&stream).0,
            dl.device_ptr(&stream).0,
            ones.device_ptr(&stream).0,
            out.device_ptr(&stream).0,
            lse.device_ptr(&stream).0,
        ],
        b,
        1,
        heads,
        page,
        pages,
        len / page,
        1.0 / (D_QK as f32).sqrt(),
        1.0,
    );
    let f = module.load_function(WGMMA_DECODE_BF16).unwrap();
    f.set_attribute(
        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        WGMMA_DECODE_SMEM_BYTES as i32,
    )
    .unwrap();
    let (e0, e1) = rt.timing_events().unwrap();
    let mut times = Vec::new();
    for rep in 0..13 {
        stream.memset_zeros(&mut flush).unwrap();
        let mut args = [&p as *const DecodeParams as *mut c_void];
        e0.record(&stream).unwrap();
        // SAFETY: the params match the kernel's struct; every buffer holds its shape.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                (1, (heads as u32).div_ceil(64), b as u32),
                (256, 1, 1),
                WGMMA_DECODE_SMEM_BYTES as u32,
                stream.cu_stream(),
                &mut args,
            )
        }
        .unwrap();
        e1.record(&stream).unwrap();
        e1.synchronize().unwrap();
        if rep >= 3 {
            times.push(e0.elapsed_ms(&e1).unwrap() as f64 * 1e3);
        }
    }
    times.sort_by(f64::total_cmp);
    let us = times[times.len() / 2];
    let tflops = flops(&shape) / us * 1e-6;
    let got: Vec<u16> = stream.clone_dtoh(&out).unwrap();
    let finite = got.iter().all(|&v| numeric::bf16_to_f32(v).is_finite());
    eprintln!(
        "[{test}] B={b} L={len} H={heads} bf16: wgmma prototype {us:.1} us ({tflops:.1} TFLOP/s); \
         product m64n64 {:.1} us ({:.1} TFLOP/s); prototype speed {:.2}x (seed {seed})",
        product.us,
        product.tflops,
        product.us / us
    );
    assert!(finite, "the prototype wrote non-finite outputs");
}

/// Decode params for contiguous q `[b, s_q, heads, 576]`, out `[b, s_q, heads, 512]`, a cache
/// of `num_pages` pages and a `[b, max_pages]` page table, one split per sequence.
#[allow(clippy::too_many_arguments)]
fn contiguous_params(
    ptrs: [u64; 7],
    b: usize,
    s_q: usize,
    heads: usize,
    page: usize,
    num_pages: usize,
    max_pages: usize,
    softmax_scale: f32,
    output_scale: f32,
) -> mla::abi::DecodeParams {
    use mla::abi::{D_QK, D_V};
    let rows = s_q * heads;
    let [q, kv, table, lens, splits, out, lse] = ptrs;
    mla::abi::DecodeParams {
        q: DevPtr::from_addr(q),
        kv_cache: DevPtr::from_addr(kv),
        page_table: DevPtr::from_addr(table),
        seq_lens: DevPtr::from_addr(lens),
        num_splits: DevPtr::from_addr(splits),
        out: DevPtr::from_addr(out),
        lse: DevPtr::from_addr(lse),
        partial_o: DevPtr::from_addr(0),
        partial_lse: DevPtr::from_addr(0),
        q_stride_b: (rows * D_QK) as u64,
        q_stride_s: (heads * D_QK) as u64,
        q_stride_h: D_QK as u64,
        kv_stride_page: (page * D_QK) as u64,
        kv_stride_token: D_QK as u64,
        out_stride_b: (rows * D_V) as u64,
        out_stride_s: (heads * D_V) as u64,
        out_stride_h: D_V as u64,
        batch: b as u32,
        s_q: s_q as u32,
        heads: heads as u32,
        page_size: page as u32,
        page_shift: page.trailing_zeros(),
        page_table_stride: max_pages as u32,
        num_pages: num_pages as u32,
        max_splits: 1,
        softmax_scale,
        value_scale: 1.0,
        output_scale,
        max_pages: max_pages as u32,
    }
}
