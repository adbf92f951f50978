//! The decode on candle tensors (feature `candle`): random cases as in the other GPU tests,
//! their inputs held in candle CUDA tensors (q as a narrowed view of a wider tensor whose
//! other columns are NaN: a start offset and a row stride of candle's layout), decoded by
//! `mla::candle::decode` into preallocated candle `out` / `lse` and checked against the f64
//! oracle; then the typed errors of a CPU tensor, a wrong dtype and a wrong shape.

mod common;

use candle_core::{DType, Device, Tensor};
use mla::abi::{D_QK, D_V};
use mla::candle::CandleDecode;
use mla::{DecodeDtypes, MlaError};
use mla_dev::harness::{self, CaseSpec, HostCase};
use mla_dev::rng::SplitMix64;

/// A candle tensor of `d`'s 16-bit type from little-endian bit patterns.
fn tensor16(bytes: &[u8], shape: &[usize], fp16: bool, dev: &Device) -> Tensor {
    let bits = bytes.chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]]));
    if fp16 {
        Tensor::from_vec(
            bits.map(half::f16::from_bits).collect::<Vec<_>>(),
            shape,
            dev,
        )
    } else {
        Tensor::from_vec(
            bits.map(half::bf16::from_bits).collect::<Vec<_>>(),
            shape,
            dev,
        )
    }
    .expect("tensor")
}

#[test]
fn candle_tensors_decode_like_the_oracle() {
    let Some((rt, _)) = common::gpu("candle_tensors_decode_like_the_oracle") else {
        return;
    };
    let seed = common::seed("candle_tensors_decode_like_the_oracle");
    let mut rng = SplitMix64::new(seed);
    let dev = Device::new_cuda(0).expect("candle device");
    let stream = dev.as_cuda_device().expect("cuda").cuda_stream();
    for d in [DecodeDtypes::Bf16, DecodeDtypes::Fp16] {
        let fp16 = d == DecodeDtypes::Fp16;
        let dt = if fp16 { DType::F16 } else { DType::BF16 };
        for &(heads, s_q, page) in &[(16usize, 2usize, 64usize), (128, 1, 16)] {
            let lens = vec![rng.range(900, 2000), rng.range(s_q, 200), s_q];
            let h = HostCase::random(&CaseSpec::new(d, page, heads, s_q, lens), &mut rng);
            let refs = h.references();
            let b = h.spec.lens.len();
            // q in the middle of rows 64 wider, the rest NaN.
            let nan = if fp16 { 0x7e00u16 } else { 0x7fc0u16 };
            let mut wide = Vec::with_capacity(h.q_bytes.len() / D_QK * (D_QK + 64));
            for row in h.q_bytes.chunks(2 * D_QK) {
                wide.extend(std::iter::repeat_n(nan.to_le_bytes(), 32).flatten());
                wide.extend_from_slice(row);
                wide.extend(std::iter::repeat_n(nan.to_le_bytes(), 32).flatten());
            }
            let q_wide = tensor16(&wide, &[b, s_q, heads, D_QK + 64], fp16, &dev);
            let q = q_wide.narrow(3, 32, D_QK).expect("narrow");
            let kv = tensor16(&h.kv_bytes, &[h.num_pages, page, D_QK], fp16, &dev);
            let table =
                Tensor::from_vec(h.page_table.clone(), (b, h.max_pages), &dev).expect("table");
            let lens_t = Tensor::from_vec(h.seq_lens.clone(), b, &dev).expect("lens");
            let out = Tensor::zeros((b, s_q, heads, D_V), dt, &dev).expect("out");
            let lse = Tensor::zeros((b, s_q, heads), DType::F32, &dev).expect("lse");
            let config = h.decode_config();
            let plan = rt
                .plan_decode(&stream, config, rt.default_tactic(&config))
                .expect("plan");
            let t = CandleDecode {
                q: &q,
                kv_cache: &kv,
                page_table: &table,
                seq_lens: &lens_t,
                out: &out,
                lse: &lse,
                kpe_cache: None,
                q_pe: None,
                scales: h.scales,
            };
            mla::candle::decode(&rt, &plan, &t, false).expect("candle decode");
            dev.synchronize().expect("sync");
            let got_out: Vec<f32> = out
                .to_dtype(DType::F32)
                .and_then(|t| t.flatten_all())
                .and_then(|t| t.to_vec1())
                .expect("out");
            let got_lse: Vec<f32> = lse.flatten_all().and_then(|t| t.to_vec1()).expect("lse");
            let c = harness::check(&(got_out, got_lse), &refs);
            assert!(
                c.ok(),
                "{} H={heads} S_q={s_q} page {page}: out {} lse {} (seed {seed})",
                d.name(),
                c.out,
                c.lse
            );
            eprintln!("ok {} H={heads} S_q={s_q} page {page}", d.name());
        }
    }
}

#[test]
fn candle_errors_are_typed() {
    let Some((_rt, _)) = common::gpu("candle_errors_are_typed") else {
        return;
    };
    let cpu = Tensor::zeros((1, 1, 16, D_QK), DType::BF16, &Device::Cpu).unwrap();
    let e = mla::candle::view::<4>(&cpu, "q").unwrap_err();
    assert!(matches!(e, MlaError::Unsupported { what: "q", .. }), "{e}");
    let dev = Device::new_cuda(0).unwrap();
    let wrong = Tensor::zeros((1, 1, 16, D_V), DType::F64, &dev).unwrap();
    let e = mla::candle::view::<4>(&wrong, "out").unwrap_err();
    assert!(
        matches!(e, MlaError::DtypeMismatch { field: "out", .. }),
        "{e}"
    );
    let flat = Tensor::zeros(D_V, DType::BF16, &dev).unwrap();
    let e = mla::candle::view::<4>(&flat, "out").unwrap_err();
    assert!(
        matches!(e, MlaError::InvalidShape { field: "out", .. }),
        "{e}"
    );
}
