//! The serving API on the GPU: the schedule kernel against its CPU twin (bit for bit),
//! `DecodePlan::run` against the oracle, a CUDA graph captured once and replayed 1000 times
//! while lengths, page tables and data change, two host threads on two streams sharing one
//! module, and driver errors surfacing as typed errors.

mod common;

use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use mla::plan::{ScheduleConfig, WorkspaceCapacity, row_tiles};
use mla::tactic::{PlanSize, Tactic, Tile};
use mla::{DecodeConfig, DecodeDtypes, DecodePlan, DecodeWorkspace, MlaError, Runtime};
use mla_dev::harness::{self, CaseSpec, DeviceCase, HostCase};
use mla_dev::rng::SplitMix64;

fn config(h: &HostCase, max_batch: usize) -> DecodeConfig {
    DecodeConfig {
        max_batch,
        ..h.decode_config()
    }
}

/// Runs `plan` on `d` (outputs poisoned first) and returns (out, lse, split counts).
fn run_plan(
    rt: &Runtime,
    stream: &Arc<cudarc::driver::CudaStream>,
    plan: &DecodePlan,
    h: &HostCase,
    d: &mut DeviceCase,
) -> ((Vec<f32>, Vec<f32>), Vec<i32>) {
    d.poison_outputs(stream).unwrap();
    let req = d.request(stream, h);
    plan.run(rt, stream, &req).unwrap();
    stream.synchronize().unwrap();
    let got = d.download(stream, h.spec.dtypes.out()).unwrap();
    (got, plan.read_splits(stream, h.spec.lens.len()).unwrap())
}

/// [`run_plan`], or with `stepped` through the per-step API: `schedule_step` once, then
/// `run_layer`.
fn run_plan_as(
    rt: &Runtime,
    stream: &Arc<cudarc::driver::CudaStream>,
    plan: &DecodePlan,
    h: &HostCase,
    d: &mut DeviceCase,
    stepped: bool,
) -> ((Vec<f32>, Vec<f32>), Vec<i32>) {
    if !stepped {
        return run_plan(rt, stream, plan, h, d);
    }
    d.poison_outputs(stream).unwrap();
    let req = d.request(stream, h);
    let cap = h.max_pages * h.spec.page_size;
    plan.schedule_step(rt, stream, &req.seq_lens, cap).unwrap();
    plan.run_layer(rt, stream, &req).unwrap();
    stream.synchronize().unwrap();
    let got = d.download(stream, h.spec.dtypes.out()).unwrap();
    (
        got,
        plan.read_step_splits(stream, h.spec.lens.len()).unwrap(),
    )
}

/// The split counts a run of `plan` on `h` writes, on the CPU (the lengths clamped to what
/// `h`'s page table holds, as the device's are): with `stepped`, those of `schedule_step`
/// (the schedule's rule); else those of the run, the schedule's or its work list's
/// ([`DecodePlan::run_split_twin`]).
fn cpu_twin(
    rt: &Runtime,
    stream: &Arc<cudarc::driver::CudaStream>,
    plan: &DecodePlan,
    h: &HostCase,
    d: &mut DeviceCase,
    stepped: bool,
) -> Vec<i32> {
    if stepped {
        let mut cfg = plan.schedule();
        cfg.max_len = h.max_pages * h.spec.page_size;
        return mla::plan::schedule(&h.seq_lens, &cfg);
    }
    let req = d.request(stream, h);
    plan.run_split_twin(rt, &req, &h.seq_lens).unwrap()
}

#[test]
fn schedule_kernel_matches_cpu_twin_and_plan_matches_oracle() {
    let test = "plan_run";
    let seed = common::seed(test);
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let mut rng = SplitMix64::new(seed);
    let mut failures = Vec::new();
    for (i, &d) in DecodeDtypes::ALL.iter().cycle().take(12).enumerate() {
        let b = rng.range(1, 40);
        let heads = [1, 16, 64, 128][i % 4];
        let s_q = [1, 2, 4][i % 3];
        let lens: Vec<usize> = (0..b)
            .map(|_| rng.range(s_q, if i % 2 == 0 { 300 } else { 3000 }))
            .collect();
        let h = HostCase::random(
            &CaseSpec::new(d, [16, 64][i % 2], heads, s_q, lens),
            &mut rng,
        );
        let refs = h.references();
        let tactic = Tactic::candidates()[i % Tactic::candidates().len()];
        let plan = rt.plan_decode(&stream, config(&h, b + 3), tactic).unwrap();
        let mut dc = DeviceCase::upload(&stream, &h).unwrap();
        let (got, splits) = run_plan(&rt, &stream, &plan, &h, &mut dc);
        let twin = cpu_twin(&rt, &stream, &plan, &h, &mut dc, false);
        if splits != twin {
            failures.push(format!(
                "{} B={b}: schedule {splits:?} != CPU twin {twin:?}",
                d.name()
            ));
        }
        let c = harness::check(&got, &refs);
        if !c.ok() {
            failures.push(format!(
                "{} B={b} H={heads} S_q={s_q} tactic {tactic}: {} | {}",
                d.name(),
                c.out,
                c.lse
            ));
        }
    }
    // Edge lengths the twin must agree on: zero-length-like clamps and many sequences.
    let cfg = ScheduleConfig {
        tiles: row_tiles(16),
        target_ctas: 132,
        max_splits: 64,
        max_len: 4096,
        step_log2: 0,
    };
    eprintln!(
        "[{test}] CPU twin sample: {:?}",
        mla::plan::schedule(&[1, 64, 65, 4096, 100_000], &cfg)
    );
    common::assert_no_failures(test, seed, &failures);
}

/// Long sequences take more splits than the short caps (64, or 32 from two row tiles on),
/// up to `MAX_SPLITS`, so that one long sequence fills the GPU. Small plans only: a plan's
/// grid holds `plan::split_cap` splits per sequence, below the short caps from nine
/// sequences on. The fold (`run`) and the schedule kernel (`schedule_step` + `run_layer`)
/// against the CPU twin, the twin's count above the short cap, and the output against the
/// oracle; every dtype, `Tactic::default_on`.
#[test]
fn long_sequences_take_more_splits() {
    let test = "long_splits";
    let seed = common::seed(test);
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let mut rng = SplitMix64::new(seed);
    let mut failures = Vec::new();
    // (heads, lens, per-step schedule)
    let cases: [(usize, Vec<usize>, bool); 4] = [
        (128, vec![rng.range(30_000, 40_000)], false),
        (16, vec![rng.range(40_000, 60_000)], false),
        (
            128,
            vec![
                rng.range(1, 300),
                rng.range(40_000, 50_000),
                rng.range(1, 300),
            ],
            true,
        ),
        (16, vec![rng.range(36_000, 40_000), rng.range(1, 100)], true),
    ];
    for (i, (heads, lens, stepped)) in cases.into_iter().enumerate() {
        let d = DecodeDtypes::ALL[i % DecodeDtypes::ALL.len()];
        let b = lens.len();
        let longest = lens.iter().copied().max().unwrap_or(1);
        let h = HostCase::random(&CaseSpec::new(d, 64, heads, 1, lens), &mut rng);
        let refs = h.references();
        let tactic = Tactic::default_for_plan(
            heads,
            PlanSize {
                max_batch: b,
                max_seq_len: longest,
                page_size: 64,
            },
            rt.backend(),
            d,
        );
        let plan = rt.plan_decode(&stream, config(&h, b), tactic).unwrap();
        let mut dc = DeviceCase::upload(&stream, &h).unwrap();
        let (got, splits) = run_plan_as(&rt, &stream, &plan, &h, &mut dc, stepped);
        let twin = cpu_twin(&rt, &stream, &plan, &h, &mut dc, stepped);
        let short = if plan.schedule().tiles >= 2 {
            mla::abi::SHORT_SPLITS_MULTI_TILE
        } else {
            mla::abi::SHORT_SPLITS_ONE_TILE
        } as i32;
        let long_splits = *twin.iter().max().unwrap_or(&0);
        let path = if stepped { "schedule kernel" } else { "fold" };
        let what = format!(
            "{} H={heads} B={b} L<={longest} ({path}) tactic {tactic}",
            d.name()
        );
        if splits != twin {
            failures.push(format!("{what}: schedule {splits:?} != CPU twin {twin:?}"));
        }
        if long_splits <= short {
            failures.push(format!(
                "{what}: the long sequence got {long_splits} splits, not above the short cap {short}"
            ));
        }
        let c = harness::check(&got, &refs);
        eprintln!(
            "[{test}] {what}: {long_splits} splits; {} | {}",
            c.out, c.lse
        );
        if !c.ok() {
            failures.push(format!("{what}: {} | {}", c.out, c.lse));
        }
    }
    common::assert_no_failures(test, seed, &failures);
}

/// Every query-token count the API admits (`s_q` 1..=8, the odd ones too: two, four and
/// six draft tokens), on head counts that fill no tile evenly, every dtype and several page
/// sizes, through the plan's default tactic (the kernels the library picks): `run` and
/// `schedule_step` + `run_layer`, against the oracle.
#[test]
fn every_query_token_count_matches_the_oracle() {
    let test = "every_s_q";
    let seed = common::seed(test);
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let mut rng = SplitMix64::new(seed);
    let mut failures = Vec::new();
    let mut checked = 0;
    for s_q in 1..=8usize {
        for (j, heads) in [5usize, 16, 20, 128].into_iter().enumerate() {
            let k = s_q * 4 + j;
            let d = DecodeDtypes::ALL[k % DecodeDtypes::ALL.len()];
            let page = [1, 16, 64, 256][k % 4];
            // The f64 oracle's time grows with rows x tokens: fewer sequences for many rows.
            let b = if s_q * heads > 128 {
                1 + k % 2
            } else {
                [1, 3, 9][k % 3]
            };
            let lens: Vec<usize> = (0..b).map(|_| rng.range(s_q, 2500)).collect();
            let h = HostCase::random(&CaseSpec::new(d, page, heads, s_q, lens), &mut rng);
            let refs = h.references();
            let cfg = config(&h, b);
            let tactic = rt.default_tactic(&cfg);
            let plan = rt.plan_decode(&stream, cfg, tactic).unwrap();
            let mut dc = DeviceCase::upload(&stream, &h).unwrap();
            for stepped in [false, true] {
                let (got, _) = run_plan_as(&rt, &stream, &plan, &h, &mut dc, stepped);
                let c = harness::check(&got, &refs);
                checked += 1;
                if !c.ok() {
                    failures.push(format!(
                        "{} H={heads} S_q={s_q} page {page} B={b} tactic {tactic}{}: {} | {}",
                        d.name(),
                        if stepped { " (schedule_step)" } else { "" },
                        c.out,
                        c.lse
                    ));
                }
            }
        }
    }
    eprintln!(
        "[{test}] {checked} decodes checked, {} failed",
        failures.len()
    );
    common::assert_no_failures(test, seed, &failures);
}

/// The 64-row TMA decodes' work list, forced on (`set_work_list`): random batches of
/// mixed lengths (one long sequence among short ones, or even ones), 64-128 heads, S_q 1-4,
/// every dtype, pages of 16 and 64 (and of 1, whose `cp.async` forms take no list and walk
/// the cells; an fp8 cache on pages of 16 takes the list in place of its `cp.async` form),
/// plans larger than the batch: `run` and `schedule_step` + `run_layer` against the oracle,
/// and the run's split counts against the host twin.
#[test]
fn work_list_matches_the_oracle_and_its_twin() {
    let test = "work_list";
    let seed = common::seed(test);
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let mut rng = SplitMix64::new(seed);
    let mut failures = Vec::new();
    let mut checked = 0;
    for k in 0..12usize {
        let d = DecodeDtypes::ALL[k % DecodeDtypes::ALL.len()];
        let heads = [128, 64, 100][k % 3];
        let s_q = 1 + k % 4;
        let page = [64, 16, 1][(k / 3) % 3];
        let rows = heads * s_q;
        // The f64 oracle's time grows with rows x tokens: about 2.5 M row-tokens a case.
        let tokens = 2_500_000 / rows;
        let b = rng.range(1, if rows > 256 { 3 } else { 8 });
        let lens: Vec<usize> = (0..b)
            .map(|i| match (k % 2, i) {
                (0, 0) => rng.range(tokens / 4, tokens / 2),
                (0, _) => rng.range(s_q, 300),
                _ => rng.range(s_q.max(tokens / (4 * b)), tokens / (2 * b)),
            })
            .collect();
        let h = HostCase::random(&CaseSpec::new(d, page, heads, s_q, lens.clone()), &mut rng);
        let refs = h.references();
        let cfg = config(&h, b + k % 3);
        let tactic = rt.default_tactic(&cfg);
        let mut plan = rt.plan_decode(&stream, cfg, tactic).unwrap();
        plan.set_work_list(Some(true));
        let mut dc = DeviceCase::upload(&stream, &h).unwrap();
        for stepped in [false, true] {
            let (got, splits) = run_plan_as(&rt, &stream, &plan, &h, &mut dc, stepped);
            let what = format!(
                "{} H={heads} S_q={s_q} page {page} lens {lens:?} tactic {tactic}{}",
                d.name(),
                if stepped { " (schedule_step)" } else { "" }
            );
            if !stepped {
                let twin = cpu_twin(&rt, &stream, &plan, &h, &mut dc, false);
                if splits != twin {
                    failures.push(format!("{what}: counts {splits:?} != twin {twin:?}"));
                }
            }
            let c = harness::check(&got, &refs);
            checked += 1;
            if !c.ok() {
                failures.push(format!("{what}: {} | {}", c.out, c.lse));
            }
        }
    }
    eprintln!(
        "[{test}] {checked} decodes checked, {} failed",
        failures.len()
    );
    common::assert_no_failures(test, seed, &failures);
}

/// `run_layer` refuses, with a typed error naming the field, a plan that has no
/// `schedule_step` yet and a request whose batch is not the scheduled one (its split counts
/// would be missing or another batch's: output rows silently skipped); with the matching
/// schedule it runs and matches the oracle.
#[test]
fn run_layer_needs_the_scheduled_batch() {
    let test = "layer_batch";
    let seed = common::seed(test);
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let mut rng = SplitMix64::new(seed);
    let h = HostCase::random(
        &CaseSpec::new(DecodeDtypes::Bf16, 64, 16, 1, vec![900, 70, 2000]),
        &mut rng,
    );
    let refs = h.references();
    let plan = rt
        .plan_decode(&stream, config(&h, 3), Tactic::default_for(16))
        .unwrap();
    let mut dc = DeviceCase::upload(&stream, &h).unwrap();
    dc.poison_outputs(&stream).unwrap();
    let req = dc.request(&stream, &h);
    let field = |e: MlaError| match e {
        MlaError::InvalidShape { field, .. } => field,
        other => panic!("[{test}] expected a shape error, got {other}"),
    };
    let e = plan
        .run_layer(&rt, &stream, &req)
        .expect_err("no schedule_step yet");
    assert_eq!(field(e), "schedule_step");
    // Schedule the first two sequences only, then run the three.
    let two = mla::TensorView::contiguous(req.seq_lens.ptr, mla::abi::ElemType::I32, [2]);
    let cap = h.max_pages * h.spec.page_size;
    plan.schedule_step(&rt, &stream, &two, cap).unwrap();
    let e = plan
        .run_layer(&rt, &stream, &req)
        .expect_err("another batch");
    assert_eq!(field(e), "seq_lens.shape[0] (batch of run_layer)");
    plan.schedule_step(&rt, &stream, &req.seq_lens, cap)
        .unwrap();
    plan.run_layer(&rt, &stream, &req).unwrap();
    stream.synchronize().unwrap();
    let got = dc.download(&stream, DecodeDtypes::Bf16.out()).unwrap();
    let c = harness::check(&got, &refs);
    assert!(c.ok(), "[{test}] {} | {} (seed {seed})", c.out, c.lse);
    eprintln!("[{test}] both misuses refused, the scheduled layer exact (seed {seed})");
}

/// Captures `plan.schedule_step` of `lens` into a graph that is never launched: the host
/// takes the slot as scheduled, its counts on the device stay as they were.
fn capture_only_schedule(
    rt: &Runtime,
    stream: &Arc<cudarc::driver::CudaStream>,
    plan: &DecodePlan,
    lens: &mla::TensorView<1>,
    cap: usize,
) {
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    plan.schedule_step(rt, stream, lens, cap).unwrap();
    let graph = stream
        .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
        .unwrap();
    drop(graph);
}

/// A `schedule_step` that was only captured (its graph never launched) leaves the slot's
/// counts as they were: zeros on a new plan. The host takes the slot as scheduled, so an
/// eager `run_layer` of that batch runs; every live sequence must still be decoded (in one
/// split) and match the oracle, never left unwritten.
#[test]
fn run_layer_after_a_captured_schedule_stays_exact() {
    let test = "layer_captured_schedule";
    let seed = common::seed(test);
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let mut rng = SplitMix64::new(seed);
    for (dtypes, heads) in [
        (DecodeDtypes::Bf16, 16),
        (DecodeDtypes::Bf16, 128),
        (DecodeDtypes::Fp8KvBf16Q, 128),
    ] {
        let h = HostCase::random(
            &CaseSpec::new(dtypes, 64, heads, 1, vec![4000, 70, 9000, 1]),
            &mut rng,
        );
        let refs = h.references();
        let plan = rt
            .plan_decode(&stream, config(&h, 4), rt.default_tactic(&config(&h, 4)))
            .unwrap();
        let mut dc = DeviceCase::upload(&stream, &h).unwrap();
        let req = dc.request(&stream, &h);
        let cap = h.max_pages * h.spec.page_size;
        capture_only_schedule(&rt, &stream, &plan, &req.seq_lens, cap);
        dc.poison_outputs(&stream).unwrap();
        let req = dc.request(&stream, &h);
        plan.run_layer(&rt, &stream, &req).unwrap();
        stream.synchronize().unwrap();
        let got = dc.download(&stream, dtypes.out()).unwrap();
        let c = harness::check(&got, &refs);
        assert!(
            c.ok(),
            "[{test}] {dtypes:?} H={heads}: {} | {} (seed {seed})",
            c.out,
            c.lse
        );
        assert_eq!(
            plan.read_step_splits(&stream, 4).unwrap(),
            vec![0; 4],
            "[{test}] the captured schedule wrote counts"
        );
    }
    eprintln!("[{test}] eager layers after a captured-only schedule exact (seed {seed})");
}

/// A captured-only `schedule_step` leaves the slot's counts of the step before; when a
/// sequence of that step is padding now (length 0), an eager `run_layer` must still skip it
/// (its rows unwritten, whatever the stale count: one split or several), and decode the live
/// sequence exactly.
#[test]
fn stale_step_counts_leave_padding_unwritten() {
    let test = "layer_stale_padding";
    let seed = common::seed(test);
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let mut rng = SplitMix64::new(seed);
    let mut failures = Vec::new();
    for (dtypes, heads, lens) in [
        (DecodeDtypes::Bf16, 128, vec![3000, 2000]),
        (DecodeDtypes::Bf16, 128, vec![9000, 70]),
        (DecodeDtypes::Bf16, 16, vec![3000, 2000]),
        (DecodeDtypes::Fp8KvBf16Q, 128, vec![3000, 2000]),
    ] {
        let what = format!("{dtypes:?} H={heads} lens {lens:?}");
        let h = HostCase::random(&CaseSpec::new(dtypes, 64, heads, 1, lens), &mut rng);
        let refs = h.references();
        let plan = rt
            .plan_decode(&stream, config(&h, 2), rt.default_tactic(&config(&h, 2)))
            .unwrap();
        let mut dc = DeviceCase::upload(&stream, &h).unwrap();
        let cap = h.max_pages * h.spec.page_size;
        // Step 1: both sequences live, scheduled and run.
        let req = dc.request(&stream, &h);
        plan.schedule_step(&rt, &stream, &req.seq_lens, cap)
            .unwrap();
        plan.run_layer(&rt, &stream, &req).unwrap();
        stream.synchronize().unwrap();
        let stale = plan.read_step_splits(&stream, 2).unwrap();
        // Step 2: sequence 1 is padding; its schedule only captured.
        let live = h.seq_lens[0];
        stream.memcpy_htod(&[live, 0], &mut dc.lens).unwrap();
        let mut req = dc.request(&stream, &h);
        req.host = mla::HostMirror::default();
        capture_only_schedule(&rt, &stream, &plan, &req.seq_lens, cap);
        dc.poison_outputs(&stream).unwrap();
        let mut req = dc.request(&stream, &h);
        req.host = mla::HostMirror::default();
        plan.run_layer(&rt, &stream, &req).unwrap();
        stream.synchronize().unwrap();
        let (out, lse) = dc.download(&stream, dtypes.out()).unwrap();
        let rows = heads * mla::abi::D_V;
        if !out[rows..2 * rows].iter().all(|v| v.is_nan())
            || !lse[heads..2 * heads].iter().all(|v| v.is_nan())
        {
            failures.push(format!(
                "{what}: the padding's rows were written (stale counts {stale:?})"
            ));
        }
        let c = mla_dev::oracle::compare(
            &out[..rows],
            &refs.0.out[..rows],
            &refs.1.out[..rows],
            harness::OUT_ATOL,
        );
        if !c.ok {
            failures.push(format!("{what}: sequence 0: {c}"));
        }
        eprintln!("[{test}] {what}: stale counts {stale:?}");
    }
    common::assert_no_failures(test, seed, &failures);
}

/// The fp8-cache 16- and 32-row decodes compute blocks in pairs, so the schedule cuts a
/// sequence into splits of two blocks at least (`Tile::step_log2`): the fold (`run` at up
/// to 8 sequences), the schedule kernel (`run` above 8) and `schedule_step` + `run_layer`
/// against the CPU twin, every count within `ceil(blocks / 2)`, and the output against
/// the oracle; both fp8 dtypes, S_q 1 and 2 at H=16 (16 and 32 rows, the plan's default
/// tile, or the 32-row tile where the default is the `wgmma` one).
#[test]
fn paired_decodes_take_two_block_splits() {
    let test = "paired_splits";
    let seed = common::seed(test);
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let mut rng = SplitMix64::new(seed);
    let mut failures = Vec::new();
    for (i, d) in [DecodeDtypes::Fp8KvBf16Q, DecodeDtypes::Fp8]
        .into_iter()
        .enumerate()
    {
        for s_q in [1, 2] {
            for (b, stepped) in [(1, false), (1, true), (3, false), (12, false), (12, true)] {
                let lens: Vec<usize> = (0..b)
                    .map(|k| match k % 3 {
                        0 => rng.range(1000, 9000),
                        1 => rng.range(s_q, 200),
                        _ => 64 * rng.range(1, 12) + rng.range(0, 2),
                    })
                    .collect();
                let h = HostCase::random(&CaseSpec::new(d, 64, 16, s_q, lens.clone()), &mut rng);
                let refs = h.references();
                let mut tactic = Tactic::default_for_plan(
                    16 * s_q,
                    PlanSize {
                        max_batch: b,
                        max_seq_len: h.spec.lens.iter().copied().max().unwrap_or(1),
                        page_size: 64,
                    },
                    rt.backend(),
                    d,
                );
                // A plan large enough for the e4m3 TMA decode (one block a step) takes the
                // 32-row tile here: this test is about the pairing tiles.
                if tactic.tile == Tile::Wg64N64 {
                    tactic.tile = Tile::M32N64;
                }
                let plan = rt.plan_decode(&stream, config(&h, b), tactic).unwrap();
                let mut dc = DeviceCase::upload(&stream, &h).unwrap();
                let (got, splits) = run_plan_as(&rt, &stream, &plan, &h, &mut dc, stepped);
                let twin = cpu_twin(&rt, &stream, &plan, &h, &mut dc, stepped);
                let step = 1usize << plan.schedule().step_log2;
                let what = format!(
                    "{} H=16 S_q={s_q} B={b} lens {lens:?} tactic {tactic} step {step}{}",
                    d.name(),
                    if stepped { " (schedule_step)" } else { "" }
                );
                if splits != twin {
                    failures.push(format!("{what}: schedule {splits:?} != CPU twin {twin:?}"));
                }
                if rt.backend() == mla::Backend::Sm90a && step != 2 {
                    failures.push(format!("{what}: the plan does not pair blocks"));
                }
                for (&n, &l) in splits.iter().zip(&lens) {
                    let pairs = l.div_ceil(64).div_ceil(step);
                    if n < 1 || n as usize > pairs {
                        failures.push(format!("{what}: {n} splits for {l} tokens"));
                    }
                }
                let c = harness::check(&got, &refs);
                if i == 0 && b == 1 {
                    eprintln!("[{test}] {what}: splits {splits:?}; {} | {}", c.out, c.lse);
                }
                if !c.ok() {
                    failures.push(format!("{what}: {} | {}", c.out, c.lse));
                }
            }
        }
    }
    common::assert_no_failures(test, seed, &failures);
}

/// A padding slot (device length 0 or negative, as a batch bucket larger than the live
/// batch has) is skipped: the schedule gives it 0 splits and its output rows stay
/// untouched, while the other sequences are exact; on the tensor-core and the reference
/// backend.
#[test]
fn zero_length_padding_is_skipped() {
    let test = "padding";
    let seed = common::seed(test);
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let mut rng = SplitMix64::new(seed);
    let h = HostCase::random(
        &CaseSpec::new(DecodeDtypes::Bf16, 16, 16, 1, vec![700, 9, 333]),
        &mut rng,
    );
    let refs = h.references();
    let mut failures = Vec::new();
    let backends = [None, Some(mla::gate::Backend::Reference)];
    for (backend, pad) in backends.into_iter().flat_map(|b| [(b, 0i32), (b, -4)]) {
        let what = format!("backend {backend:?}, padding length {pad}");
        let plan = rt
            .plan_decode_on(&stream, config(&h, 3), Tactic::default(), backend)
            .unwrap();
        let mut dc = DeviceCase::upload(&stream, &h).unwrap();
        stream
            .memcpy_htod(&[700i32, pad, 333], &mut dc.lens)
            .unwrap();
        dc.poison_outputs(&stream).unwrap();
        let mut req = dc.request(&stream, &h);
        req.host = mla::HostMirror::default();
        plan.run(&rt, &stream, &req).unwrap();
        stream.synchronize().unwrap();
        if backend.is_none() {
            let splits = plan.read_splits(&stream, 3).unwrap();
            if splits[1] != 0 {
                failures.push(format!("{what}: splits {splits:?}, want 0 for the padding"));
            }
        }
        let (out, lse) = dc.download(&stream, DecodeDtypes::Bf16.out()).unwrap();
        let rows = 16 * mla::abi::D_V;
        if !out[rows..2 * rows].iter().all(|v| v.is_nan()) {
            failures.push(format!("{what}: the skipped sequence's out was written"));
        }
        if !lse[16..32].iter().all(|v| v.is_nan()) {
            failures.push(format!("{what}: the skipped sequence's lse was written"));
        }
        for s in [0usize, 2] {
            let r = s * rows..(s + 1) * rows;
            let c = mla_dev::oracle::compare(
                &out[r.clone()],
                &refs.0.out[r.clone()],
                &refs.1.out[r],
                harness::OUT_ATOL,
            );
            if !c.ok {
                failures.push(format!("{what}: sequence {s}: {c}"));
            }
        }
    }
    eprintln!(
        "[{test}] 2 backends x lengths 0 and -4: {} failed",
        failures.len()
    );
    common::assert_no_failures(test, seed, &failures);
}

/// The reference backend (one CTA per row, f32, serial over tokens) against the oracle,
/// and against the tensor-core backend on the same inputs.
#[test]
fn reference_backend_matches_oracle() {
    let test = "reference_backend";
    let seed = common::seed(test);
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let mut rng = SplitMix64::new(seed);
    let mut failures = Vec::new();
    for (i, &d) in DecodeDtypes::ALL.iter().enumerate() {
        // Every length holds the s_q query tokens (a shorter one is a typed error).
        let s_q = [1, 2, 4, 8][i];
        let lens = (0..3).map(|_| rng.range(s_q, 700)).collect();
        let h = HostCase::random(
            &CaseSpec::new(d, [1, 16, 64, 256][i], [1, 3, 16, 128][i], s_q, lens),
            &mut rng,
        );
        let refs = h.references();
        let plan = rt
            .plan_decode_on(
                &stream,
                config(&h, 3),
                Tactic::default(),
                Some(mla::gate::Backend::Reference),
            )
            .unwrap();
        assert_eq!(plan.backend(), mla::gate::Backend::Reference);
        let mut dc = DeviceCase::upload(&stream, &h).unwrap();
        dc.poison_outputs(&stream).unwrap();
        plan.run(&rt, &stream, &dc.request(&stream, &h)).unwrap();
        stream.synchronize().unwrap();
        let got = dc.download(&stream, d.out()).unwrap();
        let c = harness::check(&got, &refs);
        if !c.ok() {
            failures.push(format!(
                "{} H={}: {} | {}",
                d.name(),
                h.spec.heads,
                c.out,
                c.lse
            ));
        }
    }
    eprintln!(
        "[{test}] 4 decodes, {} failed (seed {seed})",
        failures.len()
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Capture schedule + decode + combine once; replay 1000 times while the lengths, the page
/// table and the data change between replays; every replay is checked against the oracle.
#[test]
fn graph_replays_stay_exact_as_inputs_change() {
    let test = "graph";
    let seed = common::seed(test);
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let replays: usize = std::env::var("MLA_GRAPH_REPLAYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let (b, heads, s_q, page) = (4usize, 16usize, 2usize, 16usize);
    let max_len = 320usize;
    let max_pages = max_len.div_ceil(page) + 1;
    let num_pages = b * max_pages + 2;
    let mk_spec = |rng: &mut SplitMix64| {
        CaseSpec::new(
            DecodeDtypes::Bf16,
            page,
            heads,
            s_q,
            (0..b).map(|_| rng.range(s_q, max_len)).collect(),
        )
    };

    let mut rng = SplitMix64::new(seed);
    let first = HostCase::random(&mk_spec(&mut rng), &mut rng).pad_to(num_pages, max_pages);
    let mut dc = DeviceCase::upload(&stream, &first).unwrap();
    let plan = rt
        .plan_decode(&stream, config(&first, b), Tactic::default())
        .unwrap();
    // Warm up outside capture, then capture one run.
    let req = dc.request(&stream, &first);
    plan.run(&rt, &stream, &req).unwrap();
    stream.synchronize().unwrap();
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    plan.run(&rt, &stream, &req).unwrap();
    let graph = stream
        .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
        .unwrap()
        .expect("a captured graph");

    let mut failures = Vec::new();
    let batch = 50;
    let mut done = 0;
    while done < replays {
        let n = batch.min(replays - done);
        let specs: Vec<CaseSpec> = (0..n).map(|_| mk_spec(&mut rng)).collect();
        let cases = common::prepare(&specs, seed ^ (done as u64) << 20);
        for (h, refs) in cases {
            let h = h.pad_to(num_pages, max_pages);
            h.upload_into(&stream, &mut dc).unwrap();
            dc.poison_outputs(&stream).unwrap();
            graph.launch().unwrap();
            stream.synchronize().unwrap();
            let got = dc.download(&stream, h.spec.dtypes.out()).unwrap();
            let c = harness::check(&got, &refs);
            if !c.ok() {
                failures.push(format!(
                    "replay {done}: lens {:?}: {} | {}",
                    h.spec.lens, c.out, c.lse
                ));
            }
            done += 1;
        }
    }
    eprintln!(
        "[{test}] {done} graph replays checked, {} failed (seed {seed})",
        failures.len()
    );
    for f in failures.iter().take(10) {
        eprintln!("  FAIL {f}");
    }
    assert!(failures.is_empty());
}

/// Two host threads, each with its own stream and plan, share one loaded module.
#[test]
fn two_threads_two_streams_share_one_module() {
    let test = "concurrency";
    let seed = common::seed(test);
    let Some((rt, _)) = common::gpu(test) else {
        return;
    };
    let rt = Arc::new(rt);
    let failures: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2u64)
            .map(|t| {
                let rt = rt.clone();
                s.spawn(move || {
                    let stream = rt.new_stream().unwrap();
                    let mut rng = SplitMix64::new(seed ^ (t + 1));
                    let mut fails = Vec::new();
                    for i in 0..20 {
                        let d = DecodeDtypes::ALL[(i + t as usize) % 4];
                        let lens = (0..5).map(|_| rng.range(2, 2000)).collect();
                        let h = HostCase::random(&CaseSpec::new(d, 64, 32, 2, lens), &mut rng);
                        let refs = h.references();
                        let plan = rt
                            .plan_decode(&stream, config(&h, 5), Tactic::default())
                            .unwrap();
                        let mut dc = DeviceCase::upload(&stream, &h).unwrap();
                        let (got, _) = run_plan(&rt, &stream, &plan, &h, &mut dc);
                        let c = harness::check(&got, &refs);
                        if !c.ok() {
                            fails.push(format!("thread {t} case {i}: {} | {}", c.out, c.lse));
                        }
                    }
                    fails
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    eprintln!(
        "[{test}] 40 decodes on 2 threads, {} failed (seed {seed})",
        failures.len()
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Out of memory and plan/request mismatches are typed errors, never panics.
#[test]
fn driver_and_plan_errors_are_typed() {
    let test = "typed_errors";
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let huge = WorkspaceCapacity {
        batch: 60_000,
        rows: 1024,
        max_splits: 64,
    };
    match DecodeWorkspace::new(&stream, huge) {
        Err(MlaError::Alloc { what, bytes, .. }) => {
            eprintln!("[{test}] OOM is typed: {what}, {bytes} bytes")
        }
        other => panic!("expected MlaError::Alloc, got {other:?}"),
    }
    let mut rng = SplitMix64::new(3);
    let h = HostCase::random(
        &CaseSpec::new(DecodeDtypes::Bf16, 16, 16, 1, vec![100, 50]),
        &mut rng,
    );
    let dc = DeviceCase::upload(&stream, &h).unwrap();
    let mut cfg = config(&h, 2);
    cfg.heads = 32;
    let plan = rt.plan_decode(&stream, cfg, Tactic::default()).unwrap();
    let e = plan
        .run(&rt, &stream, &dc.request(&stream, &h))
        .unwrap_err();
    assert!(matches!(e, MlaError::InvalidShape { .. }), "{e}");
    let mut cfg = config(&h, 1);
    cfg.max_batch = 1;
    let plan = rt.plan_decode(&stream, cfg, Tactic::default()).unwrap();
    let e = plan
        .run(&rt, &stream, &dc.request(&stream, &h))
        .unwrap_err();
    assert!(e.to_string().contains("batch"), "{e}");
    let bad = DecodeConfig {
        heads: 0,
        ..config(&h, 2)
    };
    assert!(rt.plan_decode(&stream, bad, Tactic::default()).is_err());
}
