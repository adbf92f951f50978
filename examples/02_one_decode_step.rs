//! Step 2: one decode step through the plan / run API, checked against the f64 oracle.
//!
//! `cargo run --release --example 02_one_decode_step`

use mla::{DecodeConfig, DecodeDtypes, MlaError};
use mla_dev::harness::{self, CaseSpec, DeviceCase, HostCase, Values};
use mla_dev::rng::SplitMix64;

fn main() -> Result<(), MlaError> {
    let Some(rt) = mla::load_or_skip(0)? else {
        return Ok(());
    };
    let stream = rt.new_stream()?;
    // Eight sequences of DeepSeek-V3 at TP8 (16 heads), one query token each, bf16 cache.
    let spec = CaseSpec {
        dtypes: DecodeDtypes::Bf16,
        page_size: 64,
        heads: 16,
        s_q: 1,
        lens: vec![4096, 17, 1000, 2049, 64, 65, 3000, 1],
        output_scale: 1.0,
        share_prefix_pages: false,
        values: Values::Normal,
    };
    let host = HostCase::random(&spec, &mut SplitMix64::new(42));
    let mut dev = DeviceCase::upload(&stream, &host)?;

    // Plan once per batch-shape bucket (allocates; outside any graph capture) ...
    let config = DecodeConfig {
        max_batch: 8,
        heads: 16,
        s_q: 1,
        dtypes: DecodeDtypes::Bf16,
        page_size: 64,
        max_seq_len: host.max_pages * 64,
    };
    let plan = rt.plan_decode(&stream, config, rt.default_tactic(&config))?;
    // ... and run every step: validation, then launches on this stream only.
    dev.poison_outputs(&stream)?;
    let shape = plan.run(&rt, &stream, &dev.request(&stream, &host))?;
    stream.synchronize()?;
    println!("ran {shape:?} with tactic {}", plan.tactic());
    println!(
        "split counts chosen on the device: {:?}",
        plan.read_splits(&stream, 8)?
    );

    let got = dev.download(&stream, DecodeDtypes::Bf16.out())?;
    let check = harness::check(&got, &host.references());
    println!("out: {}\nlse: {}", check.out, check.lse);
    assert!(check.ok(), "decode disagrees with the oracle");
    Ok(())
}
