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
    // What a plan for a DeepSeek-V3 TP8 shape runs on this device: the backend, the
    // tactic the library picks (the measured one), every kernel it may launch.
    let stream = rt.new_stream()?;
    let config = mla::DecodeConfig {
        max_batch: 128,
        heads: 16,
        s_q: 1,
        dtypes: mla::DecodeDtypes::Bf16,
        page_size: 64,
        max_seq_len: 131072,
    };
    let plan = rt.plan_decode(&stream, config, rt.default_tactic(&config))?;
    let info = plan.info(&rt);
    println!(
        "plan for B<=128 H=16 S_q=1 bf16 page 64: backend {}, tactic {}, {} MB workspace",
        info.backend,
        info.tactic,
        info.workspace_bytes >> 20
    );
    println!("  kernels: {}", info.kernels.join(", "));
    Ok(())
}
