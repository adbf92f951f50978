//! The decode on candle tensors (feature `candle`): a Rust LLM server built on candle hands
//! its CUDA tensors as they are; the library reads their device pointers, shapes and
//! strides (candle's layout, start offset included), checks them like any request
//! ([`crate::validate`]: the same typed errors, naming the tensor) and launches on the
//! tensors' candle stream. `out` and `lse` are written in place (preallocated, so a step
//! stays capturable in a CUDA graph); nothing is allocated.
//!
//! The tensors must live on the CUDA device the [`Runtime`] was loaded on (candle and the
//! library both use the device's primary context). Element types: q and the cache as the
//! plan's dtypes (`BF16`, `F16`, `F8E4M3`), `page_table` and `seq_lens` `I32`, `out` the
//! plan's output dtype, `lse` `F32`.

use candle_core::cuda::CudaStorageSlice;
use candle_core::{Storage, Tensor};
use cudarc::driver::DevicePtr;
use mla_abi::ElemType;

use crate::{
    DecodePlan, DecodeRequest, DecodeShape, HostMirror, MlaError, Runtime, Scales, SplitParts,
    TensorView,
};

/// The tensors of one decode step (shapes as [`DecodeRequest`]'s and [`SplitParts`]').
#[derive(Clone, Copy, Debug)]
pub struct CandleDecode<'a> {
    pub q: &'a Tensor,
    pub kv_cache: &'a Tensor,
    pub page_table: &'a Tensor,
    pub seq_lens: &'a Tensor,
    pub out: &'a Tensor,
    pub lse: &'a Tensor,
    /// The split layouts' rope parts (`None`: the tensor is fused, 576 wide).
    pub kpe_cache: Option<&'a Tensor>,
    pub q_pe: Option<&'a Tensor>,
    pub scales: Scales,
}

/// A candle tensor as a view: its CUDA storage's address at the layout's start offset, its
/// element type, dims and strides. Errors name `field`.
pub fn view<const R: usize>(t: &Tensor, field: &'static str) -> Result<TensorView<R>, MlaError> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(cs) = &*storage else {
        return Err(MlaError::Unsupported {
            what: field,
            got: format!("a tensor on {:?}", t.device().location()),
            why: "the decode runs on CUDA tensors".into(),
        });
    };
    let dims = layout.dims();
    if dims.len() != R {
        return Err(MlaError::shape(
            field,
            format!("a rank-{R} tensor"),
            dims.len(),
        ));
    }
    let stream = cs.device.cuda_stream();
    let (addr, dtype) = match &cs.slice {
        CudaStorageSlice::BF16(s) => (s.device_ptr(&stream).0, ElemType::Bf16),
        CudaStorageSlice::F16(s) => (s.device_ptr(&stream).0, ElemType::Fp16),
        CudaStorageSlice::F8E4M3(s) => (s.device_ptr(&stream).0, ElemType::Fp8E4m3),
        CudaStorageSlice::F32(s) => (s.device_ptr(&stream).0, ElemType::F32),
        CudaStorageSlice::I32(s) => (s.device_ptr(&stream).0, ElemType::I32),
        _ => {
            return Err(MlaError::DtypeMismatch {
                field,
                expected: "bf16, f16, f8e4m3, f32 or i32".into(),
                got: format!("{:?}", t.dtype()),
            });
        }
    };
    let mut shape = [0usize; R];
    let mut strides = [0usize; R];
    shape.copy_from_slice(dims);
    strides.copy_from_slice(layout.stride());
    let ptr = addr + (layout.start_offset() * dtype.size()) as u64;
    Ok(TensorView::strided(ptr, dtype, shape, strides))
}

/// One decode step of `plan` on candle tensors, on q's candle stream: validated as
/// [`DecodePlan::run_split`] validates (the same errors), then launched. With `scheduled`,
/// the split counts of the plan's step scheduled from `seq_lens` are reused
/// ([`DecodePlan::run_layer`]).
pub fn decode(
    rt: &Runtime,
    plan: &DecodePlan,
    t: &CandleDecode,
    scheduled: bool,
) -> Result<DecodeShape, MlaError> {
    let req = DecodeRequest {
        q: view(t.q, "q")?,
        kv_cache: view(t.kv_cache, "kv_cache")?,
        page_table: view(t.page_table, "page_table")?,
        seq_lens: view(t.seq_lens, "seq_lens")?,
        out: view(t.out, "out")?,
        lse: view(t.lse, "lse")?,
        scales: t.scales,
        host: HostMirror::default(),
    };
    let parts = SplitParts {
        kpe_cache: t.kpe_cache.map(|k| view(k, "kpe_cache")).transpose()?,
        q_pe: t.q_pe.map(|q| view(q, "q_pe")).transpose()?,
    };
    let dev =
        t.q.device()
            .as_cuda_device()
            .map_err(|e| MlaError::Unsupported {
                what: "q",
                got: "a candle tensor".into(),
                why: e.to_string(),
            })?;
    same_device(rt, t)?;
    let stream = dev.cuda_stream();
    // SAFETY: candle's stream lives in the device's primary context, the runtime's; the
    // caller holds the tensors while the stream runs the launch.
    unsafe { plan.run_split_raw(rt, stream.cu_stream(), &req, &parts, scheduled) }
}

/// Every tensor of `t` on q's candle device (one device and its stream: the launch goes on
/// q's stream, which waits for no other device's or stream's writes), and that device the
/// runtime's: a typed error naming the first tensor that is not, before any launch.
fn same_device(rt: &Runtime, t: &CandleDecode) -> Result<(), MlaError> {
    let ordinal = rt.device().ordinal;
    match t.q.device().location() {
        candle_core::DeviceLocation::Cuda { gpu_id } if gpu_id == ordinal => {}
        other => {
            return Err(MlaError::shape(
                "q",
                format!("a tensor on CUDA device {ordinal} (the runtime's)"),
                format!("{other:?}"),
            ));
        }
    }
    let named = [
        ("kv_cache", Some(t.kv_cache)),
        ("page_table", Some(t.page_table)),
        ("seq_lens", Some(t.seq_lens)),
        ("out", Some(t.out)),
        ("lse", Some(t.lse)),
        ("kpe_cache", t.kpe_cache),
        ("q_pe", t.q_pe),
    ];
    for (field, x) in named.into_iter().filter_map(|(f, x)| x.map(|x| (f, x))) {
        if !x.device().same_device(t.q.device()) {
            return Err(MlaError::shape(
                field,
                "a tensor on q's candle device",
                format!("{:?}", x.device().location()),
            ));
        }
    }
    Ok(())
}
