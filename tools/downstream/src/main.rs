//! Built on the stable toolchain against the packaged `mla` crate: the kernel images must
//! come embedded (PTX for every arch, cubins for sm_90a and sm_100a), and loading runs
//! (or, with no GPU, says why not).

fn main() {
    let images = mla::images::embedded();
    for (name, ptx) in [
        ("sm_80", images.ptx_sm80),
        ("sm_90a", images.ptx_sm90a),
        ("sm_100a", images.ptx_sm100a),
    ] {
        assert!(ptx.contains(".entry"), "no {name} PTX embedded");
    }
    assert!(images.cubin_sm90a.is_some(), "no sm_90a cubin embedded");
    assert!(images.cubin_sm100a.is_some(), "no sm_100a cubin embedded");
    println!(
        "embedded: PTX sm_80 {} B, sm_90a {} B, sm_100a {} B; cubins sm_90a, sm_100a",
        images.ptx_sm80.len(),
        images.ptx_sm90a.len(),
        images.ptx_sm100a.len()
    );
    match mla::load_or_skip(0) {
        Ok(Some(rt)) => println!("loaded: {}", rt.device()),
        Ok(None) => {}
        Err(e) => panic!("loading failed: {e}"),
    }
    println!("downstream check passed");
}
