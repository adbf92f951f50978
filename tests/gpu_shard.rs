//! Decode context parallelism on one GPU, ranks simulated: each sequence's KV spread over
//! `ranks` caches by [`Shard`] (round-robin tokens, whole pages, an odd run length, one
//! contiguous range per rank), every rank's cache decoded by a plan set to its shard with
//! the global lengths (ranks holding none of a sequence, or none of the keys a query row
//! sees, among them), the ranks' `(out, lse)` merged by `Runtime::merge`: the result must
//! match the f64 decode over the whole KV, for every dtype and kernel family, S_q up to 4
//! (the causal rule across ranks), eager and replayed from a captured graph. Then the NCCL
//! path with a communicator of one (`ContextParallel`), and the typed errors: shard fields,
//! a global length whose share overflows the rank's page table, a plan sharded for another
//! group.

mod common;

use std::sync::Arc;

use cudarc::driver::CudaStream;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use mla::abi::{D_V, ElemType};
use mla::{DecodeDtypes, DecodePlan, MergeRequest, MlaError, Runtime, Shard, TensorView};
use mla_dev::harness::device_addr as ptr;
use mla_dev::harness::{CaseSpec, DeviceCase, HostCase, LSE_ATOL, OUT_ATOL};
use mla_dev::rng::SplitMix64;
use mla_dev::{numeric, oracle};

fn plan_for(rt: &Runtime, stream: &Arc<CudaStream>, h: &HostCase, shard: Shard) -> DecodePlan {
    let config = h.decode_config();
    let mut plan = rt
        .plan_decode(stream, config, rt.default_tactic(&config))
        .expect("plan");
    plan.set_shard(shard).expect("shard");
    plan
}

/// The rank-merged result against both references: the 16-bit rank outputs add one
/// rounding of each (2^-9 relative for bf16) that a single decode does not have.
fn check(
    label: &str,
    got: &(Vec<f32>, Vec<f32>),
    refs: &(oracle::OracleOutput, oracle::OracleOutput),
) -> bool {
    let co = oracle::compare(&got.0, &refs.0.out, &refs.1.out, OUT_ATOL);
    let cl = oracle::compare(&got.1, &refs.0.lse, &refs.1.lse, LSE_ATOL);
    let ref_max = refs
        .0
        .out
        .iter()
        .filter(|x| x.is_finite())
        .fold(0f64, |m, x| m.max(x.abs()));
    let out_ok = co.nan_mismatch.is_none() && co.max_abs_err <= co.allowed + ref_max / 128.0;
    let ok = out_ok && cl.ok && got.0.iter().all(|x| !x.is_nan());
    if !ok {
        eprintln!("FAIL {label}: out {co:?}\n lse {cl:?}");
    }
    ok
}

struct Case {
    dtypes: DecodeDtypes,
    heads: usize,
    s_q: usize,
    page: usize,
    ranks: u32,
    interleave: u32,
}

impl Case {
    fn label(&self) -> String {
        format!(
            "{} H={} S_q={} page {} ranks {} interleave {}",
            self.dtypes.name(),
            self.heads,
            self.s_q,
            self.page,
            self.ranks,
            self.interleave
        )
    }
}

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for d in DecodeDtypes::ALL {
        for &(heads, s_q) in &[(16usize, 1usize), (16, 4), (128, 2)] {
            for &(ranks, interleave, page) in &[(2u32, 1u32, 16usize), (3, 64, 64), (4, 7, 64)] {
                v.push(Case {
                    dtypes: d,
                    heads,
                    s_q,
                    page,
                    ranks,
                    interleave,
                });
            }
        }
        // One contiguous range per rank.
        v.push(Case {
            dtypes: d,
            heads: 128,
            s_q: 1,
            page: 64,
            ranks: 2,
            interleave: 2048,
        });
    }
    v
}

/// Every rank's sharded decode of `h`, merged on the device; with `graph`, each rank's
/// decode is captured once and replayed.
fn sharded(
    rt: &Runtime,
    stream: &Arc<CudaStream>,
    h: &HostCase,
    ranks: u32,
    interleave: u32,
    graph: bool,
    rng: &mut SplitMix64,
) -> (Vec<f32>, Vec<f32>) {
    let s = &h.spec;
    let rows = s.lens.len() * s.s_q * s.heads;
    let out_t = s.dtypes.out();
    let mut outs = vec![0u16; ranks as usize * rows * D_V];
    let mut lses = vec![0f32; ranks as usize * rows];
    for r in 0..ranks {
        let shard = Shard {
            rank: r,
            ranks,
            interleave,
            _pad: 0,
        };
        let hr = h.shard(&shard, rng);
        let mut d = DeviceCase::upload(stream, &hr).expect("upload");
        d.poison_outputs(stream).expect("poison");
        let plan = plan_for(rt, stream, &hr, shard);
        let req = d.request(stream, &hr);
        if graph {
            stream
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .expect("capture");
            plan.run(rt, stream, &req).expect("captured run");
            let g = stream
                .end_capture(
                    CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
                )
                .expect("end capture")
                .expect("graph");
            g.launch().expect("replay");
        } else {
            plan.run(rt, stream, &req).expect("run");
        }
        stream.synchronize().expect("sync");
        let o: Vec<u16> = stream.clone_dtoh(&d.out).expect("out");
        let l: Vec<f32> = stream.clone_dtoh(&d.lse).expect("lse");
        assert!(
            l.iter().all(|x| !x.is_nan()),
            "rank {r}: an lse row was not written"
        );
        outs[r as usize * rows * D_V..][..rows * D_V].copy_from_slice(&o);
        lses[r as usize * rows..][..rows].copy_from_slice(&l);
    }
    let d_outs = stream.clone_htod(&outs).expect("outs");
    let d_lses = stream.clone_htod(&lses).expect("lses");
    let mut d_out = stream
        .clone_htod(&vec![0xffffu16; rows * D_V])
        .expect("out");
    let mut d_lse = stream.clone_htod(&vec![f32::NAN; rows]).expect("lse");
    let (b, sq, hh) = (s.lens.len(), s.s_q, s.heads);
    let req = MergeRequest {
        outs: TensorView::contiguous(
            ptr(&d_outs, stream),
            out_t,
            [ranks as usize, b, sq, hh, D_V],
        ),
        lses: TensorView::contiguous(
            ptr(&d_lses, stream),
            ElemType::F32,
            [ranks as usize, b, sq, hh],
        ),
        out: TensorView::contiguous(ptr(&d_out, stream), out_t, [b, sq, hh, D_V]),
        lse: TensorView::contiguous(ptr(&d_lse, stream), ElemType::F32, [b, sq, hh]),
    };
    rt.merge(stream, &req).expect("merge");
    stream.synchronize().expect("sync");
    let o: Vec<u16> = stream.clone_dtoh(&d_out).expect("out");
    let l: Vec<f32> = stream.clone_dtoh(&d_lse).expect("lse");
    let _ = (&mut d_out, &mut d_lse);
    let bytes: Vec<u8> = o.iter().flat_map(|v| v.to_le_bytes()).collect();
    (numeric::to_f32(out_t, &bytes), l)
}

#[test]
fn sharded_decode_merges_to_the_whole() {
    let Some((rt, stream)) = common::gpu("sharded_decode_merges_to_the_whole") else {
        return;
    };
    let seed = common::seed("sharded_decode_merges_to_the_whole");
    let mut rng = SplitMix64::new(seed);
    let mut failed = 0;
    let all = cases();
    for (i, c) in all.iter().enumerate() {
        // A long sequence (several blocks on every rank), a mid one, and one shorter than
        // ranks x interleave (some ranks hold none of it).
        let short = (c.ranks as usize * c.interleave as usize / 2)
            .max(c.s_q)
            .min(100);
        let lens = vec![rng.range(1500, 2600), rng.range(c.s_q, 700), short];
        let h = HostCase::random(
            &CaseSpec::new(c.dtypes, c.page, c.heads, c.s_q, lens),
            &mut rng,
        );
        let refs = h.references();
        let graph = i % 3 == 1;
        let got = sharded(&rt, &stream, &h, c.ranks, c.interleave, graph, &mut rng);
        let label = format!("{}{}", c.label(), if graph { " (graph)" } else { "" });
        if check(&label, &got, &refs) {
            eprintln!("ok {label}");
        } else {
            failed += 1;
        }
    }
    assert_eq!(
        failed,
        0,
        "{failed} of {} sharded cases failed (seed {seed})",
        all.len()
    );
}

#[cfg(feature = "nccl")]
#[test]
fn one_rank_group_over_nccl() {
    let Some((rt, stream)) = common::gpu("one_rank_group_over_nccl") else {
        return;
    };
    let seed = common::seed("one_rank_group_over_nccl");
    let mut rng = SplitMix64::new(seed);
    use mla::ContextParallel;
    use std::time::Duration;
    let id = match ContextParallel::unique_id() {
        Ok(id) => id,
        Err(e @ MlaError::Unsupported { .. }) => {
            common::loud(&format!("SKIPPED one_rank_group_over_nccl: {e}"));
            return;
        }
        Err(e) => panic!("unique id: {e}"),
    };
    let spec = CaseSpec::new(DecodeDtypes::Bf16, 64, 16, 2, vec![rng.range(2, 3000), 900]);
    let h = HostCase::random(&spec, &mut rng);
    let refs = h.references();
    let rows = 2 * 2 * 16;
    let mut cp = ContextParallel::new(
        &rt,
        0,
        1,
        &id,
        rows,
        ElemType::Bf16,
        Duration::from_secs(20),
    )
    .expect("group of one");
    let plan = plan_for(&rt, &stream, &h, Shard::OFF);
    let mut d = DeviceCase::upload(&stream, &h).expect("upload");
    d.poison_outputs(&stream).expect("poison");
    let mut out = stream
        .clone_htod(&vec![0xffffu16; rows * D_V])
        .expect("out");
    let mut lse = stream.clone_htod(&vec![f32::NAN; rows]).expect("lse");
    let out_v = TensorView::contiguous(ptr(&out, &stream), ElemType::Bf16, [2, 2, 16, D_V]);
    let lse_v = TensorView::contiguous(ptr(&lse, &stream), ElemType::F32, [2, 2, 16]);
    let req = d.request(&stream, &h);
    // SAFETY: live stream; the buffers outlive the wait below.
    unsafe { cp.decode_raw(&rt, stream.cu_stream(), &plan, &req, &out_v, &lse_v) }
        .expect("decode + combine");
    cp.wait(&stream).expect("wait");
    let o: Vec<u16> = stream.clone_dtoh(&out).expect("out");
    let l: Vec<f32> = stream.clone_dtoh(&lse).expect("lse");
    let local: Vec<u16> = stream.clone_dtoh(&d.out).expect("local out");
    assert_eq!(o, local, "a group of one must return its own rows");
    let bytes: Vec<u8> = o.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert!(check(
        "nccl group of one",
        &(numeric::to_f32(ElemType::Bf16, &bytes), l),
        &refs
    ));

    // The same step captured in a CUDA graph and replayed: the same rows.
    stream
        .memcpy_htod(&vec![0xffffu16; rows * D_V], &mut out)
        .expect("poison");
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .expect("capture");
    // SAFETY: as above.
    unsafe { cp.decode_raw(&rt, stream.cu_stream(), &plan, &req, &out_v, &lse_v) }
        .expect("captured decode + combine");
    let g = stream
        .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
        .expect("end capture")
        .expect("graph");
    for _ in 0..3 {
        g.launch().expect("replay");
    }
    cp.wait(&stream).expect("wait after replays");
    let again: Vec<u16> = stream.clone_dtoh(&out).expect("out");
    assert_eq!(
        again, o,
        "graph replays of the NCCL step differ from the eager step"
    );

    // Sequence 1 as padding (device length 0): its rows of `out` and `lse` keep what they
    // held, as a plain decode leaves them (the merge skips them; no rank wrote them), and
    // sequence 0's rows are still the oracle's.
    let per_seq = rows / 2;
    stream
        .memcpy_htod(&[h.seq_lens[0], 0], &mut d.lens)
        .expect("lengths");
    stream
        .memcpy_htod(&vec![0x1234u16; rows * D_V], &mut out)
        .expect("sentinel out");
    stream
        .memcpy_htod(&vec![7.5f32; rows], &mut lse)
        .expect("sentinel lse");
    // SAFETY: as above.
    unsafe { cp.decode_raw(&rt, stream.cu_stream(), &plan, &req, &out_v, &lse_v) }
        .expect("decode + combine with a padding sequence");
    cp.wait(&stream).expect("wait");
    let o_pad: Vec<u16> = stream.clone_dtoh(&out).expect("out");
    let l_pad: Vec<f32> = stream.clone_dtoh(&lse).expect("lse");
    assert!(
        o_pad[per_seq * D_V..].iter().all(|&v| v == 0x1234),
        "a padding sequence's out rows were written by the context-parallel step"
    );
    assert!(
        l_pad[per_seq..].iter().all(|&v| v == 7.5),
        "a padding sequence's lse rows were written by the context-parallel step"
    );
    let bytes: Vec<u8> = o_pad[..per_seq * D_V]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let got0 = numeric::to_f32(ElemType::Bf16, &bytes);
    let co = oracle::compare(
        &got0,
        &refs.0.out[..per_seq * D_V],
        &refs.1.out[..per_seq * D_V],
        OUT_ATOL,
    );
    let cl = oracle::compare(
        &l_pad[..per_seq],
        &refs.0.lse[..per_seq],
        &refs.1.lse[..per_seq],
        LSE_ATOL,
    );
    assert!(
        co.ok && cl.ok,
        "sequence 0 beside a padding sequence: {co} | {cl}"
    );
    stream
        .memcpy_htod(&h.seq_lens, &mut d.lens)
        .expect("lengths back");

    // A local output of another dtype than the group's: typed, before any launch.
    let fp16_out = TensorView {
        dtype: ElemType::Fp16,
        ..req.out
    };
    let e = unsafe { cp.combine_raw(&rt, stream.cu_stream(), &fp16_out, &req.lse, &out_v, &lse_v) }
        .unwrap_err();
    assert!(
        matches!(
            e,
            MlaError::DtypeMismatch {
                field: "local_out",
                ..
            }
        ),
        "{e}"
    );

    // The same step through the C ABI (a group of one of its own): the same rows.
    drop(cp);
    stream
        .memcpy_htod(&vec![0xffffu16; rows * D_V], &mut out)
        .expect("poison");
    // SAFETY: valid handles, pointers and buffers; the stream is synchronised before reads.
    unsafe {
        use mla::capi::*;
        let mut id = [0u8; 128];
        assert_eq!(mla_cp_unique_id(id.as_mut_ptr()), MLA_OK);
        let mut crt = std::ptr::null_mut();
        assert_eq!(mla_runtime_create(0, &mut crt), MLA_OK);
        let cfg = MlaPlanConfig {
            max_batch: 2,
            heads: 16,
            s_q: 2,
            page_size: 64,
            max_seq_len: (h.max_pages * 64) as u32,
            q_dtype: MLA_BF16,
            kv_dtype: MLA_BF16,
            waves: 0,
            tile: 0,
        };
        let mut cplan = std::ptr::null_mut();
        assert_eq!(mla_plan_create(crt, &cfg, &mut cplan), MLA_OK);
        let mut ccp = std::ptr::null_mut();
        assert_eq!(
            mla_cp_create(
                crt,
                0,
                1,
                id.as_ptr(),
                rows as u32,
                MLA_BF16,
                20_000,
                &mut ccp
            ),
            MLA_OK
        );
        let args = MlaDecodeArgs {
            q: req.q.ptr,
            kv_cache: req.kv_cache.ptr,
            page_table: req.page_table.ptr,
            seq_lens: req.seq_lens.ptr,
            out: req.out.ptr,
            lse: req.lse.ptr,
            batch: 2,
            num_pages: h.num_pages as u32,
            max_pages: h.max_pages as u32,
            _pad: 0,
            page_table_stride: 0,
            kv_page_stride: 0,
            softmax_scale: h.scales.softmax_scale,
            output_scale: h.scales.output_scale,
            q_scale: 1.0,
            kv_scale: 1.0,
        };
        let st = stream.cu_stream() as *mut std::ffi::c_void;
        assert_eq!(
            mla_cp_decode(crt, ccp, cplan, &args, out_v.ptr, lse_v.ptr, st),
            MLA_OK
        );
        assert_eq!(mla_cp_wait(ccp, st), MLA_OK);
        mla_cp_destroy(ccp);
        mla_plan_destroy(cplan);
        mla_runtime_destroy(crt);
    }
    let via_c: Vec<u16> = stream.clone_dtoh(&out).expect("out");
    assert_eq!(via_c, o, "the C ABI's NCCL step differs from the Rust one");
    let id = ContextParallel::unique_id().expect("unique id");
    let mut cp = ContextParallel::new(
        &rt,
        0,
        1,
        &id,
        rows,
        ElemType::Bf16,
        Duration::from_secs(20),
    )
    .expect("group of one");

    // A plan sharded for two ranks does not fit a group of one: typed, before any launch.
    let mut two = plan_for(&rt, &stream, &h, Shard::OFF);
    two.set_shard(Shard {
        rank: 1,
        ranks: 2,
        interleave: 64,
        _pad: 0,
    })
    .expect("shard");
    // SAFETY: as above.
    let e =
        unsafe { cp.decode_raw(&rt, stream.cu_stream(), &two, &req, &out_v, &lse_v) }.unwrap_err();
    assert!(e.to_string().contains("shard.ranks"), "{e}");
    eprintln!("ok nccl group of one; mismatched plan: {e}");
}

#[test]
fn shard_errors_are_typed() {
    let Some((rt, stream)) = common::gpu("shard_errors_are_typed") else {
        return;
    };
    let mut rng = SplitMix64::new(common::seed("shard_errors_are_typed"));
    let spec = CaseSpec::new(DecodeDtypes::Bf16, 16, 16, 1, vec![300, 40]);
    let h = HostCase::random(&spec, &mut rng);
    let mut plan = plan_for(&rt, &stream, &h, Shard::OFF);
    for (shard, field) in [
        (
            Shard {
                rank: 2,
                ranks: 2,
                interleave: 1,
                _pad: 0,
            },
            "shard.rank",
        ),
        (
            Shard {
                rank: 0,
                ranks: 65,
                interleave: 1,
                _pad: 0,
            },
            "shard.ranks",
        ),
        (
            Shard {
                rank: 0,
                ranks: 2,
                interleave: 0,
                _pad: 0,
            },
            "shard.interleave",
        ),
    ] {
        let e = plan.set_shard(shard).unwrap_err();
        assert!(e.to_string().contains(field), "{e}");
        eprintln!("ok {field}: {e}");
    }
    // Rank 0 of 2 with whole pages: its table holds its own pages; the unsharded case's
    // lengths on a rank's table would overflow it (the share is checked, not the global).
    let shard = Shard {
        rank: 0,
        ranks: 2,
        interleave: 16,
        _pad: 0,
    };
    let hr = h.shard(&shard, &mut rng);
    let d = DeviceCase::upload(&stream, &hr).expect("upload");
    let mut sp = plan_for(&rt, &stream, &hr, shard);
    sp.run(&rt, &stream, &d.request(&stream, &hr))
        .expect("valid sharded run");
    let mut longer = hr.clone();
    longer.seq_lens[0] += 4 * 16 * 2;
    let e = sp
        .run(&rt, &stream, &d.request(&stream, &longer))
        .unwrap_err();
    assert!(
        matches!(
            e,
            MlaError::OutOfRange {
                field: "seq_lens",
                index: 0,
                ..
            }
        ),
        "{e}"
    );
    eprintln!("ok overflowing share: {e}");
    sp.set_shard(Shard::OFF).expect("off");
    let _ = &mut sp;
}
