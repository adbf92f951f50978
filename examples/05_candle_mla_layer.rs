//! Step 5: one decode step of a DeepSeek-V3-shaped MLA attention layer in candle, with the
//! attention through `mla` (feature `candle`), checked against the same layer computed with
//! candle's own ops.
//!
//! One tensor-parallel shard of the layer (16 of 128 heads), bf16 weights: the q down and
//! up projections, rope on q's and the new key's rope part, the absorbed q projection
//! (`q_nope . W_UK` into the 512-wide latent), the new token's latent and rope key appended
//! to the paged cache (`Runtime::append_kv`), the MLA decode (`mla::candle::decode`, writing
//! into preallocated `out` and `lse`), then `W_UV` and the output projection. The reference
//! gathers each sequence's cache rows and runs softmax attention in f32 with candle ops.
//!
//! `cargo run --release --no-default-features --features candle --example 05_candle_mla_layer`
//! (needs nvcc on PATH and `CUDA_COMPUTE_CAP`, see the README's support matrix).

use candle_core::{D, DType, Device, IndexOp, Tensor};
use mla::abi::{D_QK, D_V};
use mla::candle::CandleDecode;
use mla::{AppendRequest, DecodeConfig, DecodeDtypes, HostMirror, MlaError, Scales};

const HIDDEN: usize = 7168;
const Q_LORA: usize = 1536;
const HEADS: usize = 16;
const NOPE: usize = 128;
const ROPE: usize = D_QK - D_V;
const V_HEAD: usize = 128;
const PAGE: usize = 64;

fn cerr(e: candle_core::Error) -> MlaError {
    MlaError::Unsupported {
        what: "candle op",
        got: "an error".into(),
        why: e.to_string(),
    }
}

/// A bf16 weight `[rows, cols]` with entries of variance `1 / rows`.
fn weight(dev: &Device, rows: usize, cols: usize) -> candle_core::Result<Tensor> {
    (Tensor::randn(0f32, 1.0, (rows, cols), dev)? / (rows as f64).sqrt())?.to_dtype(DType::BF16)
}

/// Rotary embedding (rotate-half, base 10000) of `x` `[B, n, 64]` at position `pos[b]`.
fn rope(x: &Tensor, pos: &[usize], dev: &Device) -> candle_core::Result<Tensor> {
    let half = ROPE / 2;
    let mut cos = Vec::with_capacity(pos.len() * half);
    let mut sin = Vec::with_capacity(pos.len() * half);
    for &p in pos {
        for i in 0..half {
            let a = p as f32 / 10000f32.powf(2.0 * i as f32 / ROPE as f32);
            cos.push(a.cos());
            sin.push(a.sin());
        }
    }
    let cos = Tensor::from_vec(cos, (pos.len(), 1, half), dev)?;
    let sin = Tensor::from_vec(sin, (pos.len(), 1, half), dev)?;
    let x = x.to_dtype(DType::F32)?;
    let (x1, x2) = (
        x.narrow(D::Minus1, 0, half)?,
        x.narrow(D::Minus1, half, half)?,
    );
    let r1 = (x1.broadcast_mul(&cos)? - x2.broadcast_mul(&sin)?)?;
    let r2 = (x1.broadcast_mul(&sin)? + x2.broadcast_mul(&cos)?)?;
    Tensor::cat(&[r1, r2], D::Minus1)?.to_dtype(DType::BF16)
}

/// The layer's weights, the step's input and the paged cache.
struct Setup {
    q_full: Tensor,
    new_kv: Tensor,
    w_uv: Tensor,
    w_o: Tensor,
    cache: Tensor,
    table: Vec<i32>,
    table_t: Tensor,
    lens_t: Tensor,
    max_pages: usize,
}

fn setup(dev: &Device, lens: &[usize]) -> candle_core::Result<Setup> {
    let b = lens.len();
    let pos: Vec<usize> = lens.iter().map(|l| l - 1).collect();
    // Weights of one shard.
    let w_dq = weight(dev, HIDDEN, Q_LORA)?;
    let w_uq = weight(dev, Q_LORA, HEADS * (NOPE + ROPE))?;
    let w_dkv = weight(dev, HIDDEN, D_QK)?;
    let w_uk = (Tensor::randn(0f32, 1.0, (HEADS, NOPE, D_V), dev)? / (NOPE as f64).sqrt())?
        .to_dtype(DType::BF16)?;
    let w_uv = (Tensor::randn(0f32, 1.0, (HEADS, D_V, V_HEAD), dev)? / (D_V as f64).sqrt())?
        .to_dtype(DType::BF16)?;
    let w_o = weight(dev, HEADS * V_HEAD, HIDDEN)?;
    let x = Tensor::randn(0f32, 1.0, (b, HIDDEN), dev)?.to_dtype(DType::BF16)?;

    // q: down, up, split, rope, absorbed into the latent.
    let q = x
        .matmul(&w_dq)?
        .matmul(&w_uq)?
        .reshape((b, HEADS, NOPE + ROPE))?;
    let q_nope = q.narrow(2, 0, NOPE)?.contiguous()?;
    let q_pe = rope(&q.narrow(2, NOPE, ROPE)?.contiguous()?, &pos, dev)?;
    let q_lat = q_nope
        .transpose(0, 1)?
        .contiguous()?
        .matmul(&w_uk)?
        .transpose(0, 1)?;
    let q_full = Tensor::cat(&[q_lat, q_pe], D::Minus1)?
        .reshape((b, 1, HEADS, D_QK))?
        .contiguous()?;

    // The cache: earlier tokens random, pages in a scrambled order.
    let pages_of: Vec<usize> = lens.iter().map(|l| l.div_ceil(PAGE)).collect();
    let max_pages = pages_of.iter().copied().max().unwrap_or(1);
    let num_pages: usize = pages_of.iter().sum::<usize>() + 2;
    let mut table = vec![-1i32; b * max_pages];
    let mut next = 0usize;
    for s in 0..b {
        for j in 0..pages_of[s] {
            // 7 and num_pages are coprime unless 7 divides num_pages: then step by 1.
            let step = if num_pages.is_multiple_of(7) { 1 } else { 7 };
            table[s * max_pages + j] = ((next * step + 3) % num_pages) as i32;
            next += 1;
        }
    }
    let cache = Tensor::randn(0f32, 1.0, (num_pages, PAGE, D_QK), dev)?.to_dtype(DType::BF16)?;
    let table_t = Tensor::from_vec(table.clone(), (b, max_pages), dev)?;
    let lens_i: Vec<i32> = lens.iter().map(|&l| l as i32).collect();
    let lens_t = Tensor::from_vec(lens_i, b, dev)?;

    // The new token's latent and rope key (appended at position len - 1 below).
    let kv_new = x.matmul(&w_dkv)?;
    let k_pe = rope(
        &kv_new.narrow(1, D_V, ROPE)?.reshape((b, 1, ROPE))?,
        &pos,
        dev,
    )?;
    let new_kv =
        Tensor::cat(&[kv_new.narrow(1, 0, D_V)?.reshape((b, 1, D_V))?, k_pe], 2)?.contiguous()?;
    Ok(Setup {
        q_full,
        new_kv,
        w_uv,
        w_o,
        cache,
        table,
        table_t,
        lens_t,
        max_pages,
    })
}

fn main() -> Result<(), MlaError> {
    let Some(rt) = mla::load_or_skip(0)? else {
        return Ok(());
    };
    let dev = Device::new_cuda(0).map_err(cerr)?;
    let stream = dev.as_cuda_device().map_err(cerr)?.cuda_stream();
    let lens = [3000usize, 517, 64, 1];
    let b = lens.len();
    let st = setup(&dev, &lens).map_err(cerr)?;

    rt.append_kv(
        &stream,
        &AppendRequest {
            new_kv: mla::candle::view::<3>(&st.new_kv, "new_kv")?,
            kv_cache: mla::candle::view::<3>(&st.cache, "kv_cache")?,
            page_table: mla::candle::view::<2>(&st.table_t, "page_table")?,
            seq_lens: mla::candle::view::<1>(&st.lens_t, "seq_lens")?,
            kv_scale: 1.0,
            host: HostMirror::default(),
        },
    )?;

    // The decode through mla, into preallocated out and lse.
    let config = DecodeConfig {
        max_batch: b,
        heads: HEADS,
        s_q: 1,
        dtypes: DecodeDtypes::Bf16,
        page_size: PAGE,
        max_seq_len: st.max_pages * PAGE,
    };
    let plan = rt.plan_decode(&stream, config, rt.default_tactic(&config))?;
    let out = Tensor::zeros((b, 1, HEADS, D_V), DType::BF16, &dev).map_err(cerr)?;
    let lse = Tensor::zeros((b, 1, HEADS), DType::F32, &dev).map_err(cerr)?;
    let scales = Scales {
        softmax_scale: 1.0 / ((NOPE + ROPE) as f32).sqrt(),
        ..Scales::default_for_mla()
    };
    mla::candle::decode(
        &rt,
        &plan,
        &CandleDecode {
            q: &st.q_full,
            kv_cache: &st.cache,
            page_table: &st.table_t,
            seq_lens: &st.lens_t,
            out: &out,
            lse: &lse,
            kpe_cache: None,
            q_pe: None,
            scales,
        },
        false,
    )?;

    // Output projections of the mla result and of the candle reference.
    let project = |o_lat: &Tensor| -> candle_core::Result<Tensor> {
        let o = o_lat
            .reshape((b, HEADS, D_V))?
            .transpose(0, 1)?
            .contiguous()?
            .matmul(&st.w_uv)?
            .transpose(0, 1)?
            .reshape((b, HEADS * V_HEAD))?;
        o.matmul(&st.w_o)?.to_dtype(DType::F32)
    };
    let reference = || -> candle_core::Result<Tensor> {
        let rows = st.cache.reshape((st.cache.dim(0)? * PAGE, D_QK))?;
        let mut outs = Vec::with_capacity(b);
        for (s, &len) in lens.iter().enumerate() {
            let idx: Vec<u32> = (0..len)
                .map(|t| (st.table[s * st.max_pages + t / PAGE] as usize * PAGE + t % PAGE) as u32)
                .collect();
            let keys = rows
                .index_select(&Tensor::from_vec(idx, len, &dev)?, 0)?
                .to_dtype(DType::F32)?;
            let qs = st.q_full.i((s, 0))?.to_dtype(DType::F32)?;
            let scores = (qs.matmul(&keys.t()?)? * f64::from(scales.softmax_scale))?;
            let p = scores.broadcast_sub(&scores.max_keepdim(1)?)?.exp()?;
            let p = p.broadcast_div(&p.sum_keepdim(1)?)?;
            outs.push(p.matmul(&keys.narrow(1, 0, D_V)?.contiguous()?)?);
        }
        Tensor::stack(&outs, 0)?.to_dtype(DType::BF16)
    };
    let y = project(&out).map_err(cerr)?;
    let y_ref = reference().and_then(|o| project(&o)).map_err(cerr)?;
    let max_abs = |t: candle_core::Result<Tensor>| -> candle_core::Result<f32> {
        t?.abs()?.max_all()?.to_scalar::<f32>()
    };
    let err = max_abs(&y - &y_ref).map_err(cerr)?;
    let scale = max_abs(Ok(y_ref.clone())).map_err(cerr)?;
    println!(
        "layer output [{b}, {HIDDEN}]: max |mla - candle| = {err:.3e} (max |candle| {scale:.3e}, relative {:.2e})",
        err / scale
    );
    assert!(
        err <= 2e-2 * scale,
        "the layer through mla strays from candle's"
    );
    Ok(())
}
