//! Step 3: a decode loop over a paged cache. Every step appends each sequence's new token
//! to its pages and decodes, as one CUDA graph captured once and replayed; only the
//! device buffers' contents change between replays (lengths, page table, new rows, q).
//! Every 64 steps the output is checked against the f64 oracle on a host mirror of the cache.
//!
//! `cargo run --release --example 03_decode_loop_graph`

use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaSlice, CudaStream};
use mla::abi::{D_QK, D_V, ElemType};
use mla::{
    AppendRequest, DecodeConfig, DecodeDtypes, DecodeRequest, HostMirror, MlaError, Scales,
    TensorView,
};
use mla_dev::numeric;
use mla_dev::oracle::{self, OracleInput};
use mla_dev::rng::SplitMix64;

const B: usize = 4;
const HEADS: usize = 16;
const PAGE: usize = 16;
const STEPS: usize = 320;
const MAX_PAGES: usize = STEPS.div_ceil(PAGE);
const NUM_PAGES: usize = B * MAX_PAGES;

use mla_dev::harness::device_addr as ptr;

fn main() -> Result<(), MlaError> {
    let Some(rt) = mla::load_or_skip(0)? else {
        return Ok(());
    };
    let stream: Arc<CudaStream> = rt.new_stream()?;
    let mut rng = SplitMix64::new(7);
    let bf16 = ElemType::Bf16;

    // Host state: lengths, a page allocator handing out pages in a shuffled order, the
    // page table, and a mirror of every cached value (for the oracle).
    let mut lens = vec![0i32; B];
    let mut free: Vec<usize> = rng.permutation(NUM_PAGES);
    let mut table = vec![-1i32; B * MAX_PAGES];
    let mut cache_mirror = vec![f32::NAN; NUM_PAGES * PAGE * D_QK];

    // Device buffers, fixed for the life of the graph.
    let cache: CudaSlice<u16> = stream.alloc_zeros(NUM_PAGES * PAGE * D_QK)?;
    let mut d_table = stream.clone_htod(&table)?;
    let mut d_lens = stream.clone_htod(&lens)?;
    let mut d_new: CudaSlice<u8> = stream.alloc_zeros(B * D_QK * 2)?;
    let mut d_q: CudaSlice<u8> = stream.alloc_zeros(B * HEADS * D_QK * 2)?;
    let d_out: CudaSlice<u16> = stream.alloc_zeros(B * HEADS * D_V)?;
    let d_lse: CudaSlice<f32> = stream.alloc_zeros(B * HEADS)?;

    let cache_view = TensorView::contiguous(ptr(&cache, &stream), bf16, [NUM_PAGES, PAGE, D_QK]);
    let table_view = TensorView::contiguous(ptr(&d_table, &stream), ElemType::I32, [B, MAX_PAGES]);
    let lens_view = TensorView::contiguous(ptr(&d_lens, &stream), ElemType::I32, [B]);
    let append = AppendRequest {
        new_kv: TensorView::contiguous(ptr(&d_new, &stream), bf16, [B, 1, D_QK]),
        kv_cache: cache_view,
        page_table: table_view,
        seq_lens: lens_view,
        kv_scale: 1.0,
        host: HostMirror::default(),
    };
    let decode = DecodeRequest {
        q: TensorView::contiguous(ptr(&d_q, &stream), bf16, [B, 1, HEADS, D_QK]),
        kv_cache: cache_view,
        page_table: table_view,
        seq_lens: lens_view,
        out: TensorView::contiguous(ptr(&d_out, &stream), bf16, [B, 1, HEADS, D_V]),
        lse: TensorView::contiguous(ptr(&d_lse, &stream), ElemType::F32, [B, 1, HEADS]),
        scales: Scales::default_for_mla(),
        host: HostMirror::default(),
    };
    let config = DecodeConfig {
        max_batch: B,
        heads: HEADS,
        s_q: 1,
        dtypes: DecodeDtypes::Bf16,
        page_size: PAGE,
        max_seq_len: MAX_PAGES * PAGE,
    };
    let plan = rt.plan_decode(&stream, config, rt.default_tactic(&config))?;

    let mut graph = None;
    for step in 0..STEPS {
        // Host side of the step: grow each sequence by one token, take a page when needed,
        // draw the new row and the query.
        let mut new_vals = vec![0f32; B * D_QK];
        for b in 0..B {
            let pos = lens[b] as usize;
            if pos.is_multiple_of(PAGE) {
                table[b * MAX_PAGES + pos / PAGE] =
                    free.pop().expect("cache sized for the loop") as i32;
            }
            lens[b] += 1;
            let page = table[b * MAX_PAGES + pos / PAGE] as usize;
            for c in 0..D_QK {
                let v = numeric::round_to(bf16, rng.normal()) as f32;
                new_vals[b * D_QK + c] = v;
                cache_mirror[(page * PAGE + pos % PAGE) * D_QK + c] = v;
            }
        }
        let q_vals: Vec<f32> = (0..B * HEADS * D_QK)
            .map(|_| numeric::round_to(bf16, rng.normal()) as f32)
            .collect();
        stream.memcpy_htod(&lens, &mut d_lens)?;
        stream.memcpy_htod(&table, &mut d_table)?;
        stream.memcpy_htod(&numeric::from_f32(bf16, &new_vals), &mut d_new)?;
        stream.memcpy_htod(&numeric::from_f32(bf16, &q_vals), &mut d_q)?;

        match &graph {
            None if step == 0 => {
                // First step eagerly (warm-up), the second one is captured.
                rt.append_kv(&stream, &append)?;
                plan.run(&rt, &stream, &decode)?;
            }
            None => {
                stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
                rt.append_kv(&stream, &append)?;
                plan.run(&rt, &stream, &decode)?;
                let g = stream.end_capture(
                    CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
                )?;
                let g = g.ok_or_else(|| {
                    MlaError::shape("graph capture", "a graph", "nothing captured")
                })?;
                g.launch()?;
                graph = Some(g);
            }
            Some(g) => g.launch()?,
        }

        if step % 64 == 63 || step + 1 == STEPS {
            stream.synchronize()?;
            let out: Vec<u16> = stream.clone_dtoh(&d_out)?;
            let out = numeric::to_f32(
                bf16,
                &out.iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<u8>>(),
            );
            let lse: Vec<f32> = stream.clone_dtoh(&d_lse)?;
            let inp = OracleInput {
                batch: B,
                s_q: 1,
                heads: HEADS,
                page_size: PAGE,
                q: &q_vals,
                kv_cache: &cache_mirror,
                page_table: &table,
                max_pages: MAX_PAGES,
                seq_lens: &lens,
                softmax_scale: Scales::default_for_mla().softmax_scale as f64,
                output_scale: 1.0,
                q_scale: 1.0,
                kv_scale: 1.0,
            };
            let reference = oracle::decode(&inp);
            let emulated = oracle::decode_emulated(&inp, bf16, bf16);
            let c = oracle::compare(&out, &reference.out, &emulated.out, 1e-5);
            let l = oracle::compare(&lse, &reference.lse, &reference.lse, 2e-4);
            println!(
                "step {:>3}: lengths {lens:?}, out {c}, lse ok {}",
                step + 1,
                l.ok
            );
            assert!(c.ok && l.ok, "step {step} disagrees with the oracle");
        }
    }
    println!(
        "{STEPS} steps: append + decode replayed from one captured graph, checked against the oracle"
    );
    Ok(())
}
