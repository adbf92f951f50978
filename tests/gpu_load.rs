//! Every image form the H200 can run loads, resolves every kernel, and computes the same
//! decode: the sm_90a cubin, the sm_90a PTX through the driver JIT, and the portable sm_80
//! PTX through the driver JIT.

mod common;

use mla::{DecodeDtypes, ImageForm, LoadOptions, Runtime, Variant};
use mla_dev::harness::{self, CaseSpec, DeviceCase, HostCase, Splits};
use mla_dev::rng::SplitMix64;

#[test]
fn every_image_form_loads_and_decodes() {
    let test = "image_forms";
    let seed = common::seed(test);
    let Some((rt0, _)) = common::gpu(test) else {
        return;
    };
    let native = rt0.variant();
    drop(rt0);
    let mut forms = vec![
        (Some(native), Some(ImageForm::Cubin)),
        (Some(native), Some(ImageForm::PtxJit)),
        (Some(Variant::Portable), Some(ImageForm::PtxJit)),
    ];
    if native == Variant::Portable {
        forms.truncate(1);
        forms[0].1 = Some(ImageForm::PtxJit);
    }
    // An `MLA_IMAGE_FILE` override (A/B runs) gives the native variant its own form only: a
    // load requiring the other is refused by name, which `image_source`'s unit tests check.
    if let Some(path) = std::env::var_os("MLA_IMAGE_FILE") {
        let file_form = ImageForm::of_image_file(&path);
        forms.retain(|&(v, f)| v == Some(Variant::Portable) || f == Some(file_form));
        eprintln!("[{test}] MLA_IMAGE_FILE set: native {file_form:?} only");
    }
    let mut rng = SplitMix64::new(seed);
    let mut failures = Vec::new();
    for (variant, form) in forms {
        let rt =
            Runtime::load_with(0, mla::images::embedded(), LoadOptions { variant, form }).unwrap();
        let stream = rt.new_stream().unwrap();
        for res in rt.kernel_resources().unwrap() {
            // Register-split kernels may keep a few per-cell values in local memory.
            let allowed = if mla::abi::names::REGISTER_SPLIT.contains(&res.name) {
                mla::abi::names::REGISTER_SPLIT_LOCAL_BYTES
            } else {
                0
            };
            assert!(
                i64::from(res.local_bytes) <= i64::from(allowed),
                "{:?} {:?}: {} uses {} bytes of local memory (allowed {allowed})",
                variant,
                form,
                res.name,
                res.local_bytes
            );
        }
        for d in DecodeDtypes::ALL {
            let spec = CaseSpec::new(d, 64, 128, 2, vec![1000, 130]);
            let h = HostCase::random(&spec, &mut rng);
            let refs = h.references();
            let mut dc = DeviceCase::upload(&stream, &h).unwrap();
            let mut ws = harness::workspace_for(&stream, &h).unwrap();
            let counts = Splits::Fixed(4).counts(&spec.lens, 256, 132);
            let got = harness::run_decode(&rt, &stream, &h, &mut dc, &mut ws, &counts).unwrap();
            let c = harness::check(&got, &refs);
            eprintln!(
                "[{test}] {:?} {:?} {}: {}",
                rt.variant(),
                rt.form(),
                d.name(),
                c.out
            );
            if !c.ok() {
                failures.push(format!(
                    "{:?} {:?} {}: {} | {}",
                    rt.variant(),
                    rt.form(),
                    d.name(),
                    c.out,
                    c.lse
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
