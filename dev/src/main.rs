//! `mla`: the command-line face of the library.
//!
//! - `mla info`: device, arch, kernel image chosen, per-kernel resources.
//! - `mla demo`: a DeepSeek-shaped decode of every dtype on the GPU, checked against the
//!   f64 oracle; with no GPU, the oracle alone on the CPU at a small size.
//! - `mla bench`: CUDA-event timings of the decode on the peers' reference shapes, with the
//!   same-run copy bandwidth.

use std::process::ExitCode;
use std::time::Instant;

use mla::{DecodeDtypes, MlaError};
use mla_dev::harness::{self, CaseSpec, DeviceCase, HostCase, Splits};
use mla_dev::rng::SplitMix64;

const USAGE: &str = "usage: mla <info|demo|bench> [--seed N] [--json FILE (bench: the peers' JSON schema)] \
     [--grid default|extra|small|short (bench: extra = page sizes 16..128 and S_q 1, 2, 4; \
     small = B 1, 8; short = B 32..128 at L 256, 1024)]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let seed = args
        .iter()
        .position(|a| a == "--seed")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(SplitMix64::fresh_seed);
    let result = match args.first().map(String::as_str) {
        Some("info") => info(),
        Some("demo") => demo(seed),
        Some("bench") => {
            let opt = |name: &str| {
                args.iter()
                    .position(|a| a == name)
                    .and_then(|i| args.get(i + 1))
            };
            match opt("--grid").map(String::as_str) {
                None | Some("default") => {
                    bench(seed, opt("--json"), |_| mla_dev::bench::default_shapes())
                }
                Some("extra") => bench(seed, opt("--json"), mla_dev::bench::extra_shapes),
                Some("small") => bench(seed, opt("--json"), mla_dev::bench::small_shapes),
                Some("short") => bench(seed, opt("--json"), mla_dev::bench::short_shapes),
                Some(other) => {
                    eprintln!(
                        "--grid: expected default, extra, small or short, got {other:?}\n{USAGE}"
                    );
                    return ExitCode::from(2);
                }
            }
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn info() -> Result<bool, MlaError> {
    println!(
        "mla {} (ptxas at build: {})",
        env!("CARGO_PKG_VERSION"),
        or_none(mla::images::PTXAS_VERSION)
    );
    println!(
        "embedded images: PTX sm_80, sm_90a, sm_100a; cubins: sm_90a {}, sm_100a {}",
        yes_no(mla::images::CUBIN_SM_90A.is_some()),
        yes_no(mla::images::CUBIN_SM_100A.is_some())
    );
    let rt = match mla::load(0) {
        Ok(rt) => rt,
        Err(e @ (MlaError::NoDriver(_) | MlaError::NoDevice(_))) => {
            println!("no GPU: {e}");
            return Ok(true);
        }
        Err(e) => return Err(e),
    };
    println!("device: {}", rt.device());
    println!("kernel image: {} ({:?})", rt.variant().name(), rt.form());
    println!(
        "{:<28} {:>5} {:>7} {:>11} {:>8}",
        "kernel", "regs", "local B", "static smem", "threads"
    );
    for r in rt.kernel_resources()? {
        println!(
            "{:<28} {:>5} {:>7} {:>11} {:>8}",
            r.name, r.registers, r.local_bytes, r.static_smem_bytes, r.max_threads
        );
    }
    println!(
        "decode dynamic shared memory: {} B",
        mla::abi::decode_tile::SMEM_BYTES
    );
    Ok(true)
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn or_none(s: &str) -> &str {
    if s.is_empty() { "none" } else { s }
}

fn demo_spec(dtypes: DecodeDtypes, batch: usize, len: usize) -> CaseSpec {
    CaseSpec::new(
        dtypes,
        64,
        128,
        1,
        (0..batch).map(|i| len - 37 * i).collect(),
    )
}

fn demo(seed: u64) -> Result<bool, MlaError> {
    println!("seed {seed} (mla demo --seed {seed} repeats this run)");
    let mut rng = SplitMix64::new(seed);
    let rt = match mla::load(0) {
        Ok(rt) => Some(rt),
        Err(e @ (MlaError::NoDriver(_) | MlaError::NoDevice(_))) => {
            println!("NO GPU FOUND ({e}): running the f64 oracle alone on the CPU at a small size");
            None
        }
        Err(e) => return Err(e),
    };
    let Some(rt) = rt else {
        let spec = demo_spec(DecodeDtypes::Bf16, 2, 256);
        let h = HostCase::random(&spec, &mut rng);
        let t = Instant::now();
        let (r, e) = h.references();
        let err = r
            .out
            .iter()
            .zip(&e.out)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        println!(
            "oracle: B=2 L=256 H=128 S_q=1 bf16 in {:.2} s; max |bf16-emulated - f64| = {err:.3e}; lse[0] = {:.4}",
            t.elapsed().as_secs_f64(),
            r.lse[0]
        );
        return Ok(true);
    };
    println!(
        "device: {} -> {} ({:?})",
        rt.device(),
        rt.variant().name(),
        rt.form()
    );
    let stream = rt.new_stream()?;
    let sms = rt.device().sm_count as usize;
    println!(
        "{:<12} {:>3} {:>6} {:>4} {:>4} {:>7} {:>11} {:>11} {:>10} {:>5}",
        "dtypes", "B", "L", "H", "S_q", "splits", "max|err|", "allowed", "lse err", "ok"
    );
    let mut all_ok = true;
    for d in DecodeDtypes::ALL {
        for (batch, len) in [(1usize, 4096usize), (8, 2048)] {
            let spec = demo_spec(d, batch, len);
            let h = HostCase::random(&spec, &mut rng);
            let refs = h.references();
            let mut dc = DeviceCase::upload(&stream, &h)?;
            let mut ws = harness::workspace_for(&stream, &h)?;
            let counts = Splits::Planned.counts(&spec.lens, spec.heads * spec.s_q, sms);
            let got = harness::run_decode(&rt, &stream, &h, &mut dc, &mut ws, &counts)?;
            let c = harness::check(&got, &refs);
            all_ok &= c.ok();
            println!(
                "{:<12} {:>3} {:>6} {:>4} {:>4} {:>7} {:>11.3e} {:>11.3e} {:>10.2e} {:>5}",
                d.name(),
                batch,
                len,
                spec.heads,
                spec.s_q,
                counts.iter().max().copied().unwrap_or(1),
                c.out.max_abs_err,
                c.out.allowed,
                c.lse.max_abs_err,
                if c.ok() { "yes" } else { "NO" }
            );
        }
    }
    println!(
        "{}",
        if all_ok {
            "all checks passed"
        } else {
            "SOME CHECKS FAILED"
        }
    );
    Ok(all_ok)
}

/// Times `shapes(backend)` on the loaded runtime, skipping tiles its image or the shape's
/// dtypes lack (`Tile::check`).
fn bench(
    seed: u64,
    json: Option<&String>,
    shapes: impl Fn(mla::gate::Backend) -> Vec<mla_dev::bench::BenchShape>,
) -> Result<bool, MlaError> {
    let rt = mla::load(0)?;
    let backend = rt.backend();
    // MLA_BENCH_FILTER="bf16 wg64n64 B64 L4096 H128 S1": only shapes whose label holds it
    // (for profiling one kernel under ncu); "A|B" keeps shapes holding A or B.
    let filter = std::env::var("MLA_BENCH_FILTER").unwrap_or_default();
    let shapes: Vec<_> = shapes(backend)
        .into_iter()
        .filter(|s| s.tile.check(backend, s.dtypes).is_ok())
        .filter(|s| {
            let label = s.label();
            filter.split('|').any(|f| label.contains(f))
        })
        .collect();
    let stream = rt.new_stream()?;
    let mut rng = SplitMix64::new(seed);
    let copy = mla_dev::bench::copy_bandwidth(&rt, &stream)?;
    println!(
        "device: {} -> {} ({:?})",
        rt.device(),
        rt.variant().name(),
        rt.form()
    );
    println!("d2d copy: {copy:.0} GB/s (read + write); L2 flushed before every call; median of 20");
    println!(
        "{:<12} {:>7} {:>4} {:>6} {:>4} {:>4} {:>4} {:>7} {:>10} {:>9} {:>8} {:>7}",
        "dtypes", "tile", "B", "L", "H", "S_q", "page", "splits", "us", "GB/s", "TFLOP/s", "%copy"
    );
    let mut rows = Vec::new();
    for s in shapes {
        let r = mla_dev::bench::time_shape(&rt, &stream, s, &mut rng, 20)?;
        // The peers' naming: `mla_rs` with the shape's default tile, `mla_rs_m64` /
        // `mla_rs_m16` / `mla_rs_wg64` with another one; `_fp8` for fp8 KV.
        let fp8 = s.dtypes.kv() == mla::abi::ElemType::Fp8E4m3;
        let mut peer = String::from("mla_rs");
        if s.tile
            != mla::tactic::Tile::default_for_plan(
                s.heads * s.s_q,
                mla::tactic::PlanSize {
                    max_batch: s.batch,
                    max_seq_len: s.len,
                    page_size: s.page,
                },
                backend,
                s.dtypes,
            )
        {
            peer.push('_');
            peer.push_str(s.tile.name().split('n').next().unwrap_or_default());
        }
        if fp8 {
            peer.push_str("_fp8");
        }
        rows.push(serde_json::json!({
            "peer": peer, "tile": s.tile.name(),
            "B": s.batch, "L": s.len, "H": s.heads, "s_q": s.s_q, "page_size": s.page,
            "kv_dtype": if fp8 { "fp8" } else { "bf16" },
            "causal": s.s_q > 1, "us": r.us, "gbps": r.gbps, "tflops": r.tflops,
            "bytes": mla_dev::bench::bytes(&s), "flops": mla_dev::bench::flops(&s), "timing": "events",
        }));
        println!(
            "{:<12} {:>7} {:>4} {:>6} {:>4} {:>4} {:>4} {:>7} {:>10.1} {:>9.0} {:>8.1} {:>6.1}%",
            s.dtypes.name(),
            s.tile.name(),
            s.batch,
            s.len,
            s.heads,
            s.s_q,
            s.page,
            r.max_splits,
            r.us,
            r.gbps,
            r.tflops,
            100.0 * r.gbps / copy
        );
    }
    if let Some(path) = json {
        let doc = serde_json::json!({
            "meta": {
                "schema_version": 1,
                "gpu": rt.device().name,
                "sm_count": rt.device().sm_count,
                "capability": format!("{}.{}", rt.device().compute_capability.0, rt.device().compute_capability.1),
                "d2d_copy_GBps_read_plus_write": copy,
                "timing": {"fn": "CUDA events", "stat": "median", "reps": 20, "l2_flush_each_call": true, "cuda_graph": false},
                "image": rt.variant().name(),
                "seed": seed,
            },
            "results": rows,
        });
        let text = serde_json::to_string_pretty(&doc).unwrap_or_default();
        std::fs::write(path, text)
            .map_err(|e| MlaError::shape("--json", "a writable file", format!("{path}: {e}")))?;
        println!("wrote {path}");
    }
    Ok(true)
}
