//! `cargo bench`: criterion over the decode (+ combine) on DeepSeek shapes, timed with CUDA
//! events through `iter_custom` (L2 flushed before every call, outside the timed region),
//! throughput in bytes from the peers' byte model. Without a GPU it says so and exits.
//! For the side-by-side with FlashMLA / FlashInfer see `benches/run_peers.sh`.

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use mla::DecodeDtypes;
use mla_dev::bench::{BenchCase, BenchShape, bytes};
use mla_dev::rng::SplitMix64;

fn decode(c: &mut Criterion) {
    let rt = match mla::load(0) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("\n!!! SKIPPED cargo bench: {e} !!!\n");
            return;
        }
    };
    let stream = rt.new_stream().expect("stream");
    let mut rng = SplitMix64::new(1);
    let mut group = c.benchmark_group("mla_decode");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(300));
    for dtypes in [DecodeDtypes::Bf16, DecodeDtypes::Fp8KvBf16Q] {
        for (batch, len, heads, s_q) in [
            (1, 4096, 16, 1),
            (64, 4096, 16, 1),
            (64, 4096, 128, 1),
            (32, 4096, 128, 2),
        ] {
            let shape = BenchShape {
                dtypes,
                tile: mla::tactic::Tile::default_for_plan(
                    heads * s_q,
                    mla::tactic::PlanSize {
                        max_batch: batch,
                        max_seq_len: len,
                        page_size: mla_dev::bench::PAGE,
                    },
                    rt.backend(),
                    dtypes,
                ),
                batch,
                len,
                heads,
                s_q,
                page: mla_dev::bench::PAGE,
            };
            let mut case = BenchCase::new(&rt, &stream, shape, &mut rng).expect("bench case");
            group.throughput(Throughput::Bytes(bytes(&shape) as u64));
            let id = format!(
                "{}/b{batch}/l{len}/h{heads}/sq{s_q}/{}",
                dtypes.name(),
                rt.variant().name()
            );
            group.bench_function(id, |bench| {
                bench.iter_custom(|iters| {
                    let us: f64 = (0..iters)
                        .map(|_| case.time_one(&rt, &stream).expect("decode"))
                        .sum();
                    Duration::from_secs_f64(us * 1e-6)
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, decode);
criterion_main!(benches);
