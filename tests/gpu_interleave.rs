//! Serving patterns on the GPU, for every kernel a plan can pick (each tile the image runs
//! for each dtype, the TMA decode among them, pages of 16, 64 and 256, the schedule folded
//! into the decode and the schedule kernel):
//! - eager runs and replays of graphs captured on two caches, mixed on one plan, every
//!   step against the f64 oracle;
//! - two plans on two streams doing the same at once;
//! - the checked mode: no fault on valid inputs (whose unused page-table entries are
//!   invalid ids: a check that reads past a sequence's pages fails), the first page id
//!   outside `0..num_pages` and the first length past the table's capacity recorded
//!   exactly, and outputs unchanged by the check;
//! - lengths shorter than `s_q` (device-side only): zero rows with lse -inf.

mod common;

use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaStream, DevicePtr};
use mla::gate::Backend;
use mla::tactic::{PlanSize, Tactic, Tile};
use mla::{DecodeConfig, DecodeDtypes, DecodeFault, DecodePlan, MlaError, Runtime, STEP_SLOTS};
use mla_dev::harness::{self, CaseSpec, DeviceCase, HostCase};
use mla_dev::oracle::OracleOutput;
use mla_dev::rng::SplitMix64;

/// One kernel configuration a plan can run.
#[derive(Clone, Copy, Debug)]
struct KernelCase {
    dtypes: DecodeDtypes,
    heads: usize,
    s_q: usize,
    page: usize,
    tile: Tile,
    backend: Option<Backend>,
    /// Sequences per decode: up to `SCHED_FOLD_MAX_BATCH` the decode folds the schedule
    /// in, above it the schedule kernel runs.
    batch: usize,
}

impl KernelCase {
    fn label(&self) -> String {
        format!(
            "{} H={} S_q={} page {} tile {:?}{} B={}",
            self.dtypes.name(),
            self.heads,
            self.s_q,
            self.page,
            self.tile,
            if self.backend == Some(Backend::Reference) {
                " (reference backend)"
            } else {
                ""
            },
            self.batch
        )
    }

    fn spec(&self, rng: &mut SplitMix64) -> CaseSpec {
        // Long enough that a split holds two or more blocks (the TMA decode's rule) under
        // the plan's split bound for MAX_BATCH sequences.
        let lens = (0..self.batch)
            .map(|i| {
                if i == 0 {
                    rng.range(1600, 2600)
                } else {
                    rng.range(self.s_q, 1800)
                }
            })
            .collect();
        CaseSpec::new(self.dtypes, self.page, self.heads, self.s_q, lens)
    }

    fn config(&self, h: &HostCase) -> DecodeConfig {
        DecodeConfig {
            max_batch: MAX_BATCH,
            heads: self.heads,
            s_q: self.s_q,
            dtypes: self.dtypes,
            page_size: self.page,
            max_seq_len: h.max_pages * self.page,
        }
    }

    fn plan(
        &self,
        rt: &Runtime,
        stream: &Arc<CudaStream>,
        h: &HostCase,
        checked: bool,
    ) -> DecodePlan {
        let tactic = Tactic {
            tile: self.tile,
            ..Tactic::default()
        };
        let mut plan = rt
            .plan_decode_on(stream, self.config(h), tactic, self.backend)
            .unwrap_or_else(|e| panic!("{}: {e}", self.label()));
        plan.set_checked(checked);
        plan
    }
}

const MAX_BATCH: usize = 16;

/// Every tile the loaded image runs for each dtype at H=128 S_q=1 (on sm_90a the bf16
/// `wgmma` tile takes the TMA decode at these lengths), the 16-row default and the `wgmma`
/// tile at H=16 S_q=2 (on sm_90a its small-row TMA decode for bf16 at pages of 16 and
/// more), each at pages 16, 64 and 256; every other case with more sequences than the fold
/// takes; and the reference backend.
fn kernel_cases(rt: &Runtime) -> Vec<KernelCase> {
    let mut v = Vec::new();
    for d in DecodeDtypes::ALL {
        for page in [16, 64, 256] {
            let mut shapes = vec![(16, 2, Tile::M16N64)];
            if Tile::Wg64N64.check(rt.backend(), d).is_ok() {
                shapes.push((16, 2, Tile::Wg64N64));
            }
            for tile in Tile::ALL {
                if tile.check(rt.backend(), d).is_ok() {
                    shapes.push((128, 1, tile));
                }
            }
            for (heads, s_q, tile) in shapes {
                let batch = if v.len() % 2 == 0 {
                    3
                } else {
                    mla::abi::SCHED_FOLD_MAX_BATCH + 2
                };
                v.push(KernelCase {
                    dtypes: d,
                    heads,
                    s_q,
                    page,
                    tile,
                    backend: None,
                    batch,
                });
            }
        }
        v.push(KernelCase {
            dtypes: d,
            heads: 16,
            s_q: 1,
            page: 64,
            tile: Tile::M64N64,
            backend: Some(Backend::Reference),
            batch: 3,
        });
    }
    v
}

type Prepared = (HostCase, (OracleOutput, OracleOutput));

/// Prints the test's summary line and every failure, then fails the test if any.
fn report(test: &str, summary: &str, failures: &[String]) {
    eprintln!("[{test}] {summary}");
    for f in failures {
        eprintln!("  FAIL {f}");
    }
    assert!(failures.is_empty());
}

/// Two independent inputs (A and B: other data, other page orders, other buffers) per
/// case, with their references.
fn prepare_pairs(cases: &[KernelCase], seed: u64) -> Vec<[Prepared; 2]> {
    let mut rng = SplitMix64::new(seed);
    let specs: Vec<CaseSpec> = cases
        .iter()
        .flat_map(|c| {
            let s = c.spec(&mut rng);
            [s.clone(), s]
        })
        .collect();
    let mut all = common::prepare(&specs, seed).into_iter();
    cases
        .iter()
        .map(|_| [all.next().unwrap(), all.next().unwrap()])
        .collect()
}

/// Captures one run of `plan` on `d` into a graph.
fn capture(
    rt: &Runtime,
    stream: &Arc<CudaStream>,
    plan: &DecodePlan,
    h: &HostCase,
    d: &DeviceCase,
) -> cudarc::driver::CudaGraph {
    // The request first: taking the buffers' addresses through cudarc orders the stream
    // after their last writes, which a capture must not record.
    let req = d.request(stream, h);
    stream.synchronize().unwrap();
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    plan.run(rt, stream, &req).unwrap();
    stream
        .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
        .unwrap()
        .expect("a captured graph")
}

fn check_step(
    stream: &Arc<CudaStream>,
    p: &Prepared,
    d: &DeviceCase,
    what: &str,
    failures: &mut Vec<String>,
) {
    let got = d.download(stream, p.0.spec.dtypes.out()).unwrap();
    let c = harness::check(&got, &p.1);
    if !c.ok() {
        failures.push(format!("{what}: {} | {}", c.out, c.lse));
    }
}

/// One plan, caches A and B: eager runs on either mixed with replays of graphs captured
/// on each, every step checked.
#[test]
fn eager_runs_and_graph_replays_mix_on_one_plan() {
    let test = "interleave";
    let seed = common::seed(test);
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let cases = kernel_cases(&rt);
    let inputs = prepare_pairs(&cases, seed);
    let steps = [
        "eager A", "eager B", "replay A", "eager B", "replay B", "replay A", "eager A", "replay B",
        "eager B", "eager A",
    ];
    let mut failures = Vec::new();
    for (case, [pa, pb]) in cases.iter().zip(&inputs) {
        let mut da = DeviceCase::upload(&stream, &pa.0).unwrap();
        let mut db = DeviceCase::upload(&stream, &pb.0).unwrap();
        let plan = case.plan(&rt, &stream, &pa.0, false);
        plan.run(&rt, &stream, &da.request(&stream, &pa.0)).unwrap();
        stream.synchronize().unwrap();
        let ga = capture(&rt, &stream, &plan, &pa.0, &da);
        let gb = capture(&rt, &stream, &plan, &pb.0, &db);
        for (i, step) in steps.iter().enumerate() {
            let on_a = step.ends_with('A');
            let (p, d) = if on_a { (pa, &mut da) } else { (pb, &mut db) };
            d.poison_outputs(&stream).unwrap();
            if step.starts_with("replay") {
                if on_a { &ga } else { &gb }.launch().unwrap();
            } else {
                plan.run(&rt, &stream, &d.request(&stream, &p.0)).unwrap();
            }
            stream.synchronize().unwrap();
            let what = format!("{}: step {i} ({step})", case.label());
            check_step(&stream, p, d, &what, &mut failures);
        }
    }
    let summary = format!(
        "{} kernel cases x {} steps checked, {} failed (seed {seed})",
        cases.len(),
        steps.len(),
        failures.len()
    );
    report(test, &summary, &failures);
}

/// Two plans of the same config on two streams, each with its own cache and graph, eager
/// runs and replays launched on both before either is waited for.
#[test]
fn two_plans_on_two_streams_mix_eager_and_replays() {
    let test = "interleave_streams";
    let seed = common::seed(test);
    let Some((rt, s1)) = common::gpu(test) else {
        return;
    };
    let s2 = rt.new_stream().unwrap();
    let cases = kernel_cases(&rt);
    let inputs = prepare_pairs(&cases, seed);
    // (plan 1 on stream 1, plan 2 on stream 2): replay or eager.
    let steps = [(true, false), (false, true), (false, false), (true, true)];
    let mut failures = Vec::new();
    for (case, [p1, p2]) in cases.iter().zip(&inputs) {
        let mut d1 = DeviceCase::upload(&s1, &p1.0).unwrap();
        let mut d2 = DeviceCase::upload(&s2, &p2.0).unwrap();
        let plan1 = case.plan(&rt, &s1, &p1.0, false);
        let plan2 = case.plan(&rt, &s2, &p2.0, false);
        plan1.run(&rt, &s1, &d1.request(&s1, &p1.0)).unwrap();
        plan2.run(&rt, &s2, &d2.request(&s2, &p2.0)).unwrap();
        s1.synchronize().unwrap();
        s2.synchronize().unwrap();
        let g1 = capture(&rt, &s1, &plan1, &p1.0, &d1);
        let g2 = capture(&rt, &s2, &plan2, &p2.0, &d2);
        for (i, &(r1, r2)) in steps.iter().enumerate() {
            d1.poison_outputs(&s1).unwrap();
            d2.poison_outputs(&s2).unwrap();
            s1.synchronize().unwrap();
            s2.synchronize().unwrap();
            if r1 {
                g1.launch().unwrap();
            } else {
                plan1.run(&rt, &s1, &d1.request(&s1, &p1.0)).unwrap();
            }
            if r2 {
                g2.launch().unwrap();
            } else {
                plan2.run(&rt, &s2, &d2.request(&s2, &p2.0)).unwrap();
            }
            s1.synchronize().unwrap();
            s2.synchronize().unwrap();
            let what = format!("{}: step {i} (replay {r1}, {r2})", case.label());
            check_step(&s1, p1, &d1, &format!("{what}, plan 1"), &mut failures);
            check_step(&s2, p2, &d2, &format!("{what}, plan 2"), &mut failures);
        }
    }
    let summary = format!(
        "{} kernel cases x {} steps x 2 streams checked, {} failed (seed {seed})",
        cases.len(),
        steps.len(),
        failures.len()
    );
    report(test, &summary, &failures);
}

/// Runs `plan` on `d` with device-side inputs only (no host mirror, as a serving stack
/// runs) and returns the fault it recorded, after clearing the record.
fn run_and_take_fault(
    rt: &Runtime,
    stream: &Arc<CudaStream>,
    plan: &DecodePlan,
    h: &HostCase,
    d: &DeviceCase,
) -> Option<DecodeFault> {
    let mut req = d.request(stream, h);
    req.host = mla::HostMirror::default();
    plan.run(rt, stream, &req).unwrap();
    let f = plan.fault(rt, stream).unwrap();
    plan.clear_fault(rt, stream).unwrap();
    f
}

#[test]
fn checked_mode_records_the_first_fault() {
    let test = "checked";
    let seed = common::seed(test);
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let cases = kernel_cases(&rt);
    let inputs = prepare_pairs(&cases, seed);
    let mut rng = SplitMix64::new(seed ^ 0x5eed);
    let mut failures = Vec::new();
    let expect = |failures: &mut Vec<String>,
                  what: String,
                  got: Option<DecodeFault>,
                  want: Option<DecodeFault>| {
        if got != want {
            failures.push(format!("{what}: fault {got:?}, expected {want:?}"));
        }
    };
    for (case, [p, _]) in cases.iter().zip(&inputs) {
        let h = &p.0;
        let label = case.label();
        let mut d = DeviceCase::upload(&stream, h).unwrap();
        let plan = case.plan(&rt, &stream, h, true);
        assert!(plan.info(&rt).checked && plan.checked());
        // Valid inputs: no fault, and the outputs are the unchecked ones.
        d.poison_outputs(&stream).unwrap();
        let f = run_and_take_fault(&rt, &stream, &plan, h, &d);
        expect(&mut failures, format!("{label}: valid inputs"), f, None);
        let got = d.download(&stream, h.spec.dtypes.out()).unwrap();
        let c = harness::check(&got, &p.1);
        if !c.ok() {
            failures.push(format!("{label}: checked outputs: {} | {}", c.out, c.lse));
        }
        // A bad page id inside sequence b's length: past num_pages, then negative.
        let b = rng.range(0, h.seq_lens.len() - 1);
        let pages = (h.seq_lens[b] as usize).div_ceil(case.page);
        let col = rng.range(0, pages - 1);
        for bad in [
            h.num_pages as i32 + rng.range(0, 999) as i32,
            -1 - rng.range(0, 8) as i32,
        ] {
            let mut table = h.page_table.clone();
            table[b * h.max_pages + col] = bad;
            stream.memcpy_htod(&table, &mut d.table).unwrap();
            let f = run_and_take_fault(&rt, &stream, &plan, h, &d);
            let want = DecodeFault::PageId {
                sequence: b,
                column: col,
                page: bad,
            };
            expect(
                &mut failures,
                format!("{label}: page id {bad}"),
                f,
                Some(want),
            );
        }
        stream.memcpy_htod(&h.page_table, &mut d.table).unwrap();
        // A length past the table's capacity (its row made valid to the end, so the
        // length is the only fault).
        let cap = h.max_pages * case.page;
        let mut table = h.page_table.clone();
        for c in 0..h.max_pages {
            let e = &mut table[b * h.max_pages + c];
            if *e < 0 || *e as usize >= h.num_pages {
                *e = 0;
            }
        }
        stream.memcpy_htod(&table, &mut d.table).unwrap();
        let mut lens = h.seq_lens.clone();
        lens[b] = (cap + 1 + rng.range(0, 4999)) as i32;
        stream.memcpy_htod(&lens, &mut d.lens).unwrap();
        let f = run_and_take_fault(&rt, &stream, &plan, h, &d);
        let want = DecodeFault::SeqLen {
            sequence: b,
            len: lens[b],
        };
        expect(
            &mut failures,
            format!("{label}: length {}", lens[b]),
            f,
            Some(want),
        );
    }
    let summary = format!(
        "{} kernel cases, {} failed (seed {seed})",
        cases.len(),
        failures.len()
    );
    report(test, &summary, &failures);
}

/// A device length below `s_q` (no host mirror to refuse it): the query tokens that see no
/// position get zero rows and lse -inf, the others match the oracle on the same lengths.
#[test]
fn lengths_below_s_q_give_zero_rows() {
    let test = "short_lengths";
    let seed = common::seed(test);
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let mut rng = SplitMix64::new(seed);
    let mut failures = Vec::new();
    let s_q = 4;
    for d in DecodeDtypes::ALL {
        for heads in [4, 16, 32] {
            let spec = CaseSpec::new(d, 16, heads, s_q, vec![s_q, 300, s_q]);
            let h = HostCase::random(&spec, &mut rng);
            let mut short = h.clone();
            short.seq_lens = vec![2, 300, 1];
            let refs = short.references();
            let mut dc = DeviceCase::upload(&stream, &h).unwrap();
            stream.memcpy_htod(&short.seq_lens, &mut dc.lens).unwrap();
            let config = h.decode_config();
            let tactic = Tactic::default_for_plan(
                s_q * heads,
                PlanSize {
                    max_batch: 3,
                    max_seq_len: 300,
                    page_size: 16,
                },
                rt.backend(),
                d,
            );
            let plan = rt.plan_decode(&stream, config, tactic).unwrap();
            dc.poison_outputs(&stream).unwrap();
            let mut req = dc.request(&stream, &h);
            req.host = mla::HostMirror::default();
            plan.run(&rt, &stream, &req).unwrap();
            stream.synchronize().unwrap();
            let got = dc.download(&stream, d.out()).unwrap();
            let c = harness::check(&got, &refs);
            // Sequence 0 token 0 and sequence 2 tokens 0..=2 see nothing.
            let row = |b: usize, t: usize| (b * s_q + t) * heads;
            let mut blank = true;
            for (b, t) in [(0, 0), (0, 1), (2, 0), (2, 1), (2, 2)] {
                let r = row(b, t);
                blank &= got.1[r..r + heads].iter().all(|&l| l == f32::NEG_INFINITY);
                blank &= got.0[r * 512..(r + heads) * 512].iter().all(|&v| v == 0.0);
            }
            if !c.ok() || !blank {
                failures.push(format!(
                    "{} H={heads} tactic {tactic}: blank rows {blank}: {} | {}",
                    d.name(),
                    c.out,
                    c.lse
                ));
            }
        }
    }
    let summary = format!("{} failed (seed {seed})", failures.len());
    report(test, &summary, &failures);
}

/// Per-step scheduling: one plan, one `schedule_step` per step, then `run_layer` on many
/// layers (each its own cache and page order, the lengths shared), eager and inside one
/// captured graph of the whole step (schedule + every layer), every layer against the
/// oracle; for every kernel case, and 61 layers (a DeepSeek-V3 model's) on the TMA decode.
/// Between the schedule and the layers an eager `run` of the same plan on an all-padding
/// batch (every length 0: its schedule writes 0 splits, which would make the layers skip
/// every sequence if they shared the run's counts); then two micro-batches, that one and
/// the real one, scheduled into step slots 1 and 2 before their interleaved layers.
#[test]
fn one_schedule_serves_every_layer_of_a_step() {
    let test = "step_layers";
    let seed = common::seed(test);
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let mut rng = SplitMix64::new(seed);
    let mut cases: Vec<(KernelCase, usize)> =
        kernel_cases(&rt).into_iter().map(|c| (c, 3)).collect();
    cases.push((
        KernelCase {
            dtypes: DecodeDtypes::Bf16,
            heads: 128,
            s_q: 1,
            page: 64,
            tile: Tile::Wg64N64,
            backend: None,
            batch: 4,
        },
        61,
    ));
    let mut failures = Vec::new();
    let mut layers_checked = 0;
    for (case, layers) in &cases {
        if case.tile.check(rt.backend(), case.dtypes).is_err() {
            continue;
        }
        let spec = case.spec(&mut rng);
        let specs = vec![spec; *layers];
        let prepared = common::prepare(&specs, seed ^ rng.range(0, 1 << 30) as u64);
        let max_pages = prepared.iter().map(|p| p.0.max_pages).max().unwrap_or(1);
        let num_pages = prepared.iter().map(|p| p.0.num_pages).max().unwrap_or(1);
        let hosts: Vec<HostCase> = prepared
            .iter()
            .map(|p| p.0.pad_to(num_pages, max_pages))
            .collect();
        let mut devs: Vec<DeviceCase> = hosts
            .iter()
            .map(|h| DeviceCase::upload(&stream, h).unwrap())
            .collect();
        let plan = case.plan(&rt, &stream, &hosts[0], false);
        let reqs: Vec<_> = hosts
            .iter()
            .zip(&devs)
            .map(|(h, d)| d.request(&stream, h))
            .collect();
        let lens = reqs[0].seq_lens;
        let cap = max_pages * case.page;
        let batch = hosts[0].spec.lens.len();
        let zero_lens = stream.alloc_zeros::<i32>(batch).unwrap();
        let padding = mla::DecodeRequest {
            seq_lens: mla::TensorView::contiguous(
                zero_lens.device_ptr(&stream).0,
                mla::abi::ElemType::I32,
                [batch],
            ),
            ..reqs[0]
        };
        let check_all = |devs: &[DeviceCase], what: &str, failures: &mut Vec<String>| {
            for (l, (p, d)) in prepared.iter().zip(devs).enumerate() {
                let got = d.download(&stream, p.0.spec.dtypes.out()).unwrap();
                let c = harness::check(&got, &p.1);
                if !c.ok() {
                    failures.push(format!(
                        "{}: {what}, layer {l}: {} | {}",
                        case.label(),
                        c.out,
                        c.lse
                    ));
                }
            }
        };
        // Eager: one schedule, every layer.
        for d in devs.iter_mut() {
            d.poison_outputs(&stream).unwrap();
        }
        plan.schedule_step(&rt, &stream, &lens, cap).unwrap();
        plan.run(&rt, &stream, &padding).unwrap();
        for r in &reqs {
            plan.run_layer(&rt, &stream, r).unwrap();
        }
        stream.synchronize().unwrap();
        check_all(&devs, "eager step", &mut failures);
        if case.backend != Some(Backend::Reference) {
            let step = plan.read_step_splits(&stream, batch).unwrap();
            let runs = plan.read_splits(&stream, batch).unwrap();
            // The layers read the step's counts and leave the run's as the padding run
            // wrote them (zeros), but where they take the work list: that writes the run's
            // counts of live sequences itself (the last layer's, which the host twin gives).
            let host_lens: Vec<i32> = hosts[0].spec.lens.iter().map(|&l| l as i32).collect();
            let list = plan.takes_list(&rt, &reqs[0]).unwrap();
            let want: Vec<i32> = if list {
                let last = reqs.last().unwrap_or(&reqs[0]);
                plan.run_split_twin(&rt, last, &host_lens).unwrap()
            } else {
                vec![0; batch]
            };
            let wrong = (0..batch).any(|i| runs[i] != want[i] && !(list && host_lens[i] <= 0));
            if step.iter().any(|&n| n < 1) || wrong {
                failures.push(format!(
                    "{}: step counts {step:?} (want >= 1), run counts {runs:?} (want {want:?})",
                    case.label()
                ));
            }
        }
        // Two micro-batches of one size scheduled ahead of their layers in two step slots
        // (the first all padding: zero counts), each layer reading its own slot.
        for d in devs.iter_mut() {
            d.poison_outputs(&stream).unwrap();
        }
        plan.schedule_step_slot(&rt, &stream, 1, &padding.seq_lens, cap)
            .unwrap();
        plan.schedule_step_slot(&rt, &stream, 2, &lens, cap)
            .unwrap();
        for r in &reqs {
            plan.run_layer_slot(&rt, &stream, 1, &padding).unwrap();
            plan.run_layer_slot(&rt, &stream, 2, r).unwrap();
        }
        stream.synchronize().unwrap();
        check_all(&devs, "two micro-batches in step slots", &mut failures);
        let slot_errors = [
            plan.schedule_step_slot(&rt, &stream, STEP_SLOTS, &lens, cap)
                .err(),
            plan.run_layer_slot(&rt, &stream, STEP_SLOTS, &reqs[0])
                .err(),
            plan.run_layer_slot(&rt, &stream, 3, &reqs[0]).err(),
        ];
        for (what, e) in [
            "slot past the end",
            "layer past the end",
            "unscheduled slot",
        ]
        .iter()
        .zip(slot_errors)
        {
            match e {
                Some(MlaError::InvalidShape { field, .. })
                    if field == "slot" || field == "schedule_step" => {}
                other => failures.push(format!("{}: {what}: {other:?}", case.label())),
            }
        }
        // The whole step in one graph, replayed twice.
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .unwrap();
        plan.schedule_step(&rt, &stream, &lens, cap).unwrap();
        plan.run(&rt, &stream, &padding).unwrap();
        for r in &reqs {
            plan.run_layer(&rt, &stream, r).unwrap();
        }
        let graph = stream
            .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
            .unwrap()
            .expect("a captured graph");
        for rep in 0..2 {
            for d in devs.iter_mut() {
                d.poison_outputs(&stream).unwrap();
            }
            graph.launch().unwrap();
            stream.synchronize().unwrap();
            check_all(&devs, &format!("graph replay {rep}"), &mut failures);
        }
        layers_checked += 3 * layers;
    }
    let summary = format!(
        "{} kernel cases, {layers_checked} layer decodes checked, {} failed (seed {seed})",
        cases.len(),
        failures.len()
    );
    report(test, &summary, &failures);
}
