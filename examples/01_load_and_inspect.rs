//! Step 1: load the kernels on the first GPU and look at what was chosen.
//!
//! `cargo run --release --example 01_load_and_inspect`

use mla::MlaError;

fn main() -> Result<(), MlaError> {
    let Some(rt) = mla::load_or_skip(0)? else {
        return Ok(());
    };
    println!("device: {}", rt.device());
    println!(
        "image:  {} ({:?}), backend {}",
        rt.variant().name(),
        rt.form(),
        rt.backend().name()
    );
    for k in rt.kernel_resources()? {
        println!(
            "  {:<28} {:>3} regs, {} B local",
            k.name, k.registers, k.local_bytes
        );
    }
    // What the gating layer says about a DeepSeek-V3 TP8 shape on this device.
    let geometry = mla::gate::Geometry {
        heads: 16,
        s_q: 1,
        page_size: 64,
        dtypes: mla::DecodeDtypes::Bf16,
        max_batch: 128,
        max_seq_len: 131072,
    };
    let registry = mla::gate::Registry::from_env()?;
    println!(
        "backend selection: {}",
        registry.select(rt.device(), &geometry)?
    );
    Ok(())
}
