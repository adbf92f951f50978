//! Primitive test kernels on the GPU against a CPU loop (layer 2 of the test plan): the
//! instructions the next kernels will use, checked alone before any kernel relies on them.
//! `wgmma.mma_async m64n64k16` bf16 with both operands in shared memory (no-swizzle K-major
//! descriptors): `d = a . b^T` against an f64 loop. Runs only on sm_90 (the image is sm_90a).

mod common;

use std::ffi::c_void;

use cudarc::driver::result;
use cudarc::driver::{CudaContext, DevicePtr};
use cudarc::nvrtc::Ptx;
use mla::abi::DevPtr;
use mla::abi::primitives::{WGMMA_M64N64K16_BF16, WGMMA_SMEM_BYTES, WgmmaPrimParams};
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
