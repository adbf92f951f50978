//! Step 4: decode context parallelism over every visible GPU. Each sequence's KV is spread
//! over the GPUs in whole pages (`Shard`, as vLLM's decode context parallelism lays it
//! out); each GPU decodes its share with the global lengths, then `ContextParallel`
//! all-gathers the ranks' `(out, lse)` over NCCL and merges them on every GPU. Prints the
//! time per step on one GPU and on all of them, the speedup, and how far the merged result
//! is from the one-GPU result.
//!
//! `cargo run --release --example 04_context_parallel [batch] [len] [gpus]`
//! (defaults: 2 sequences of 131072 tokens, H=128, bf16, page 64, every GPU). Needs
//! `libnccl.so` on the loader's path (NCCL's PyPI wheel ships `libnccl.so.2`: link it).

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use mla::{ContextParallel, DecodeDtypes, MlaError, Shard, TensorView};
use mla_dev::harness::{CaseSpec, DeviceCase, HostCase};
use mla_dev::rng::SplitMix64;

const HEADS: usize = 128;
const PAGE: usize = 64;
const STEPS: usize = 20;

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// One rank's decode of its share: plan, buffers, `STEPS` timed steps (decode + combine).
/// Returns the mean time per step and the merged output.
fn rank_run(
    ordinal: usize,
    rank: usize,
    ranks: usize,
    id: mla::NcclId,
    host: &HostCase,
    start: &Barrier,
) -> Result<(Duration, Vec<u16>), MlaError> {
    let rt = mla::load(ordinal)?;
    let stream = rt.new_stream()?;
    let shard = Shard {
        rank: rank as u32,
        ranks: ranks as u32,
        interleave: PAGE as u32,
        _pad: 0,
    };
    let local = host.shard(&shard, &mut SplitMix64::new(rank as u64));
    let dev = DeviceCase::upload(&stream, &local)?;
    let s = &host.spec;
    // The shard keeps the case's shape; its page table holds this rank's share.
    let config = local.decode_config();
    let mut plan = rt.plan_decode(&stream, config, rt.default_tactic(&config))?;
    plan.set_shard(shard)?;
    let rows = s.lens.len() * s.s_q * s.heads;
    let mut cp = ContextParallel::new(
        &rt,
        rank,
        ranks,
        &id,
        rows,
        s.dtypes.out(),
        Duration::from_secs(60),
    )?;
    let out = stream.alloc_zeros::<u16>(rows * mla::abi::D_V)?;
    let lse = stream.alloc_zeros::<f32>(rows)?;
    let dims = [s.lens.len(), s.s_q, s.heads];
    let (po, pl) = {
        use cudarc::driver::DevicePtr;
        (out.device_ptr(&stream).0, lse.device_ptr(&stream).0)
    };
    let out_v = TensorView::contiguous(
        po,
        s.dtypes.out(),
        [dims[0], dims[1], dims[2], mla::abi::D_V],
    );
    let lse_v = TensorView::contiguous(pl, mla::abi::ElemType::F32, dims);
    let req = dev.request(&stream, &local);
    let step = |cp: &mut ContextParallel| -> Result<(), MlaError> {
        // SAFETY: a live stream; every buffer outlives the wait.
        unsafe { cp.decode_raw(&rt, stream.cu_stream(), &plan, &req, &out_v, &lse_v)? };
        cp.wait(&stream)
    };
    step(&mut cp)?; // warm-up
    start.wait();
    // The decode alone, then decode + gather + merge (what a step costs on this rank).
    let t0 = Instant::now();
    for _ in 0..STEPS {
        plan.run(&rt, &stream, &req)?;
    }
    stream.synchronize()?;
    let decode = t0.elapsed() / STEPS as u32;
    start.wait();
    let t0 = Instant::now();
    for _ in 0..STEPS {
        step(&mut cp)?;
    }
    let dt = t0.elapsed() / STEPS as u32;
    if rank == 0 {
        println!(
            "  {ranks} GPU(s), rank 0: decode {:.1} us, decode + gather + merge {:.1} us per step",
            decode.as_secs_f64() * 1e6,
            dt.as_secs_f64() * 1e6
        );
    }
    let got: Vec<u16> = stream.clone_dtoh(&out)?;
    Ok((dt, got))
}

/// Every rank on its own thread and GPU; rank 0's time and output.
fn run(gpus: usize, host: &Arc<HostCase>) -> Result<(Duration, Vec<u16>), MlaError> {
    let id = ContextParallel::unique_id()?;
    let start = Arc::new(Barrier::new(gpus));
    let handles: Vec<_> = (0..gpus)
        .map(|r| {
            let (host, start) = (host.clone(), start.clone());
            std::thread::spawn(move || rank_run(r, r, gpus, id, &host, &start))
        })
        .collect();
    let mut first = None;
    for h in handles {
        let res = h.join().map_err(|_| MlaError::Comm {
            op: "rank thread",
            detail: "panicked".into(),
        })??;
        first.get_or_insert(res);
    }
    first.ok_or(MlaError::Comm {
        op: "run",
        detail: "no rank".into(),
    })
}

fn main() -> Result<(), MlaError> {
    let Some(rt) = mla::load_or_skip(0)? else {
        return Ok(());
    };
    let visible = cudarc::driver::CudaContext::device_count()? as usize;
    drop(rt);
    let (batch, len) = (arg(1, 2), arg(2, 131072));
    let gpus = arg(3, visible).clamp(1, visible);
    let spec = CaseSpec::new(DecodeDtypes::Bf16, PAGE, HEADS, 1, vec![len; batch]);
    let host = Arc::new(HostCase::random(&spec, &mut SplitMix64::new(7)));
    println!("B={batch} L={len} H={HEADS} S_q=1 bf16 page {PAGE}; {visible} GPU(s) visible");

    let (one, base) = run(1, &host)?;
    println!(
        "1 GPU: {:.1} us per step (decode + combine)",
        one.as_secs_f64() * 1e6
    );
    if gpus == 1 {
        println!("only one GPU: no speedup to measure (run with two or more GPUs)");
        return Ok(());
    }
    let (many, got) = run(gpus, &host)?;
    let to_f32 = |v: &[u16]| {
        v.iter()
            .map(|&x| f32::from_bits(u32::from(x) << 16))
            .collect::<Vec<_>>()
    };
    let (a, b) = (to_f32(&base), to_f32(&got));
    let diff = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    println!(
        "{gpus} GPUs: {:.1} us per step, speedup {:.2}x over 1 GPU; max |diff| to 1 GPU {diff:.2e}",
        many.as_secs_f64() * 1e6,
        one.as_secs_f64() / many.as_secs_f64()
    );
    assert!(diff < 2e-2, "the merged result strays from one GPU's");
    Ok(())
}
