//! The rank merge of context-parallel decode on the GPU: each sequence's KV cut into
//! `ranks` contiguous shares (some ranks holding none of a sequence, some sequences held
//! by no rank at all), each rank's `(out, lse)` computed by the f64 oracle over its share
//! and rounded to the output dtype, rows that saw nothing poisoned with NaN; the merge
//! must equal the f64 decode over the whole KV (the emulated reference merges the rounded
//! shares and rounds the result to the output dtype), never NaN there; one row whose part on
//! rank 0 is NaN must come out NaN (a poisoned part is not dropped); through the Rust API and
//! the C ABI, eager and in a captured graph.

mod common;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use mla::abi::{D_V, ElemType};
use mla::{DecodeDtypes, MergeRequest, TensorView};
use mla_dev::harness::{CaseSpec, HostCase, LSE_ATOL, OUT_ATOL};
use mla_dev::numeric;
use mla_dev::oracle;
use mla_dev::rng::SplitMix64;

/// One merge case: its inputs as the device gets them and both references.
struct Case {
    label: String,
    ranks: usize,
    dims: [usize; 3],
    dtype: ElemType,
    outs: Vec<u8>,
    lses: Vec<f32>,
    exact: (Vec<f64>, Vec<f64>),
    emulated: (Vec<f64>, Vec<f64>),
}

fn make_case(
    rng: &mut SplitMix64,
    d: DecodeDtypes,
    ranks: usize,
    heads: usize,
    s_q: usize,
) -> Case {
    let b = 4;
    // The last sequence is held by no rank (every rank's share of it is empty).
    let mut lens: Vec<usize> = (0..b - 1).map(|_| rng.range(s_q, 700)).collect();
    lens.push(s_q);
    let h = HostCase::random(&CaseSpec::new(d, 16, heads, s_q, lens.clone()), rng);
    let inp = h.oracle_input();
    let rows_per_seq = s_q * heads;
    let rows = b * rows_per_seq;
    let dtype = d.out();
    let mut outs = vec![0f32; ranks * rows * D_V];
    let mut lses = vec![f32::NEG_INFINITY; ranks * rows];
    let mut exact_parts = vec![(vec![0.0; rows * D_V], vec![f64::NEG_INFINITY; rows]); ranks];
    for (s, &len) in lens.iter().enumerate() {
        // Rank r holds [cut[r], cut[r + 1]); the last sequence no rank holds.
        let held = if s == b - 1 { 0 } else { len };
        let mut cut: Vec<usize> = (0..ranks - 1).map(|_| rng.range(0, held)).collect();
        cut.push(0);
        cut.push(held);
        cut.sort_unstable();
        for r in 0..ranks {
            let (o, l) = oracle::decode_partial(&inp, s, cut[r]..cut[r + 1]);
            let row0 = s * rows_per_seq;
            let (eo, el) = &mut exact_parts[r];
            eo[row0 * D_V..(row0 + rows_per_seq) * D_V].copy_from_slice(&o);
            el[row0..row0 + rows_per_seq].copy_from_slice(&l);
            for i in 0..rows_per_seq {
                let dst = r * rows + row0 + i;
                lses[dst] = l[i] as f32;
                for k in 0..D_V {
                    // A row this rank did not see holds NaN: the merge must not read it.
                    outs[dst * D_V + k] = if l[i] == f64::NEG_INFINITY {
                        f32::NAN
                    } else {
                        o[i * D_V + k] as f32
                    };
                }
            }
        }
    }
    // Row 0 (sequence 0) of rank 0 is NaN, lse and out: a poisoned part makes the merged row
    // NaN, never zeros (the NaN-propagating oracle merge says the same).
    lses[0] = f32::NAN;
    outs[..D_V].fill(f32::NAN);
    exact_parts[0].1[0] = f64::NAN;
    exact_parts[0].0[..D_V].fill(f64::NAN);
    let outs = numeric::from_f32(dtype, &outs);
    let rounded = numeric::to_f32(dtype, &outs);
    let emulated_parts: Vec<(Vec<f64>, Vec<f64>)> = (0..ranks)
        .map(|r| {
            let o = rounded[r * rows * D_V..(r + 1) * rows * D_V]
                .iter()
                .map(|&v| if v.is_nan() { 0.0 } else { f64::from(v) })
                .collect();
            let l = lses[r * rows..(r + 1) * rows]
                .iter()
                .map(|&v| f64::from(v))
                .collect();
            (o, l)
        })
        .collect();
    Case {
        label: format!("{} R={ranks} H={heads} S_q={s_q}", d.name()),
        ranks,
        dims: [b, s_q, heads],
        dtype,
        outs,
        lses,
        exact: oracle::combine(&exact_parts),
        emulated: {
            // The kernel's arithmetic: the merge of the rounded shares, rounded to the
            // output dtype.
            let (o, l) = oracle::combine(&emulated_parts);
            (
                o.into_iter().map(|v| numeric::round_to(dtype, v)).collect(),
                l,
            )
        },
    }
}

struct DeviceMerge {
    outs: CudaSlice<u8>,
    lses: CudaSlice<f32>,
    out: CudaSlice<u16>,
    lse: CudaSlice<f32>,
}

impl DeviceMerge {
    fn new(stream: &std::sync::Arc<CudaStream>, c: &Case) -> Self {
        let rows = c.dims.iter().product::<usize>();
        Self {
            outs: stream.clone_htod(&c.outs).unwrap(),
            lses: stream.clone_htod(&c.lses).unwrap(),
            out: stream.alloc_zeros(rows * D_V).unwrap(),
            lse: stream.alloc_zeros(rows).unwrap(),
        }
    }

    fn poison(&mut self, stream: &std::sync::Arc<CudaStream>) {
        stream
            .memcpy_htod(&vec![0xffffu16; self.out.len()], &mut self.out)
            .unwrap();
        stream
            .memcpy_htod(&vec![f32::NAN; self.lse.len()], &mut self.lse)
            .unwrap();
    }

    fn request(&self, stream: &CudaStream, c: &Case) -> MergeRequest {
        let [b, s, h] = c.dims;
        let (o, _g1) = self.outs.device_ptr(stream);
        let (l, _g2) = self.lses.device_ptr(stream);
        let (out, _g3) = self.out.device_ptr(stream);
        let (lse, _g4) = self.lse.device_ptr(stream);
        MergeRequest {
            outs: TensorView::contiguous(o, c.dtype, [c.ranks, b, s, h, D_V]),
            lses: TensorView::contiguous(l, ElemType::F32, [c.ranks, b, s, h]),
            out: TensorView::contiguous(out, c.dtype, [b, s, h, D_V]),
            lse: TensorView::contiguous(lse, ElemType::F32, [b, s, h]),
        }
    }

    fn check(&self, stream: &std::sync::Arc<CudaStream>, c: &Case, what: &str) -> Option<String> {
        let o: Vec<u16> = stream.clone_dtoh(&self.out).unwrap();
        let l: Vec<f32> = stream.clone_dtoh(&self.lse).unwrap();
        let bytes: Vec<u8> = o.iter().flat_map(|v| v.to_le_bytes()).collect();
        let got = numeric::to_f32(c.dtype, &bytes);
        let co = oracle::compare(&got, &c.exact.0, &c.emulated.0, OUT_ATOL);
        let cl = oracle::compare(&l, &c.exact.1, &c.emulated.1, LSE_ATOL);
        // NaN exactly where the exact merge has it (`compare` fails on any other): row 0.
        let nan_rows = l.iter().filter(|v| v.is_nan()).count();
        let bad = !co.ok || !cl.ok || nan_rows != 1 || !l[0].is_nan();
        bad.then(|| format!("{} {what}: NaN lse rows {nan_rows}: {co} | {cl}", c.label))
    }
}

#[test]
fn merge_matches_the_whole_kv_decode() {
    let test = "merge";
    let seed = common::seed(test);
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let mut rng = SplitMix64::new(seed);
    let mut failures = Vec::new();
    let mut n = 0;
    for (i, d) in DecodeDtypes::ALL.into_iter().enumerate() {
        for ranks in [1, 2, 3, 8, 64] {
            let (heads, s_q) = [(16, 1), (128, 2), (3, 4), (64, 1)][(i + ranks) % 4];
            let c = make_case(&mut rng, d, ranks, heads, s_q);
            let mut dm = DeviceMerge::new(&stream, &c);
            // Rust API, eager.
            dm.poison(&stream);
            let req = dm.request(&stream, &c);
            rt.merge(&stream, &req).unwrap();
            stream.synchronize().unwrap();
            failures.extend(dm.check(&stream, &c, "eager"));
            // A captured graph, replayed.
            dm.poison(&stream);
            stream.synchronize().unwrap();
            stream
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .unwrap();
            rt.merge(&stream, &req).unwrap();
            let g = stream
                .end_capture(
                    CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
                )
                .unwrap()
                .expect("a captured graph");
            g.launch().unwrap();
            stream.synchronize().unwrap();
            failures.extend(dm.check(&stream, &c, "graph replay"));
            // The C ABI.
            dm.poison(&stream);
            stream.synchronize().unwrap();
            let mut h: *mut mla::capi::MlaRuntime = std::ptr::null_mut();
            // SAFETY: valid out pointer.
            assert_eq!(
                unsafe { mla::capi::mla_runtime_create(0, &mut h) },
                mla::capi::MLA_OK
            );
            let [b, s, hh] = c.dims;
            let args = mla::capi::MlaMergeArgs {
                outs: req.outs.ptr,
                lses: req.lses.ptr,
                out: req.out.ptr,
                lse: req.lse.ptr,
                ranks: ranks as u32,
                batch: b as u32,
                s_q: s as u32,
                heads: hh as u32,
                dtype: c.dtype as u32,
                _pad: 0,
                outs_rank_stride: 0,
                lses_rank_stride: 0,
            };
            // SAFETY: live handle; the buffers outlive the synchronisation below.
            let st = unsafe { mla::capi::mla_merge(h, &args, stream.cu_stream() as *mut _) };
            assert_eq!(st, mla::capi::MLA_OK);
            stream.synchronize().unwrap();
            failures.extend(dm.check(&stream, &c, "C ABI"));
            // SAFETY: no work of the runtime in flight.
            unsafe { mla::capi::mla_runtime_destroy(h) };
            n += 3;
        }
    }
    eprintln!(
        "[{test}] {n} merges checked, {} failed (seed {seed})",
        failures.len()
    );
    for f in &failures {
        eprintln!("  FAIL {f}");
    }
    assert!(failures.is_empty());
}
