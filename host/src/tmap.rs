//! The tensor map the TMA decodes (`names::DECODE_TMA_BF16`, `DECODE_TMA_FP8KV_BF16Q`,
//! `DECODE_TMA_FP8`) copy the cache through: a 3-D view `{576 dims, page_size tokens,
//! num_pages pages}` of a paged cache with the cache's own strides and box `{64 dims,
//! min(page_size, 64) tokens, 1 page}`. A bf16 cache's map has the 128-byte swizzle, so one
//! box lands as the rows of one 64-dim slab (`decode_tile::TMA_*`); an fp8 cache's has the
//! 64-byte swizzle (its rows are the e4m3 `wgmma`'s operands). Coordinates outside
//! the view (pages past `num_pages`, negative entries) read as zeros.
//!
//! The map is encoded on the host (`cuTensorMapEncodeTiled`, no device work) at each
//! launch and passed by value as the kernel's second parameter ([`mla_abi::TensorMap`]):
//! the launch, or the graph node a capture records, holds its own copy, so no launch can
//! see another cache's map.

use std::ffi::c_void;

use cudarc::driver::sys;
use mla_abi::{D_QK, ElemType, TensorMap, decode_tile};

use crate::error::{MlaError, Result};
use crate::request::{DecodeDtypes, DecodeRequest, DecodeShape};

/// Why this request cannot take the TMA decode (`None`: it can). Checked after validation;
/// the `wgmma` decode with `cp.async` copies takes the rest.
pub fn tma_unsupported(req: &DecodeRequest, shape: &DecodeShape) -> Option<&'static str> {
    let [stride_page, stride_token, _] = req.kv_cache.strides;
    let bf16 = shape.dtypes == DecodeDtypes::Bf16 && req.kv_cache.dtype == ElemType::Bf16;
    let fp8 = shape.dtypes.kv() == ElemType::Fp8E4m3 && req.kv_cache.dtype == ElemType::Fp8E4m3;
    if !bf16 && !fp8 {
        Some("the TMA decode reads bf16 caches, or fp8 caches with bf16 or fp8 q, only")
    } else if shape.page_size < decode_tile::TMA_MIN_PAGE {
        Some("pages of fewer than 16 tokens (TMA_MIN_PAGE)")
    } else if !req.kv_cache.ptr.is_multiple_of(16) {
        Some("TMA needs a 16-byte aligned cache")
    } else if stride_token != D_QK || stride_page != shape.page_size * D_QK {
        // The map takes any 16-byte strides, but the GPU tests cover contiguous caches
        // only. Contiguous strides (1152 or 576 bytes a row, at most 256 rows a page) are 16-byte
        // multiples far inside a tensor map's 2^40-byte limit, and validation keeps
        // `num_pages` within u32.
        Some("the TMA decode is checked on contiguous caches only")
    } else {
        None
    }
}

/// Whether the TMA decode pays for a launch of `dtypes` whose longest sequence can hold
/// `max_seq_len` tokens, cut into `splits` chunks (the schedule's even share): fp8 Q always
/// (its `cp.async` decode widens Q and converts every block through shared memory: H200,
/// H=128, one-block splits, B=1 L=1024 21.7 -> 18.3 us, B=8 L=512 27.1 -> 23.8), the other
/// dtypes only when a chunk can hold more than one 64-token block. The TMA decode works on
/// blocks in pairs, one per warpgroup, so with one block per CTA half of it idles, and under
/// a CUDA graph it adds the map's store; the `cp.async` decode was faster there on the H200
/// for bf16 (`mla bench` B=1 L=4096 H=128, 64 splits: 35.8 us against 37.0; 8 splits of 8
/// blocks: 57.5 against 55.8, at `9ca7cf4`) and for an fp8 cache under bf16 Q (B=1 L=1024
/// 19.2 against 20.3 us; docs/PERF.md).
pub fn tma_pays(dtypes: DecodeDtypes, max_seq_len: usize, splits: usize) -> bool {
    dtypes == DecodeDtypes::Fp8
        || max_seq_len
            .div_ceil(decode_tile::BLOCK_N)
            .div_ceil(splits.max(1))
            >= 2
}

/// How a map's boxes land in shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapLayout {
    /// bf16 rows of 128 bytes with the 128-byte swizzle: one box is one slab's rows.
    Bf16Swizzle128,
    /// fp8 e4m3 rows of 64 bytes with the 64-byte swizzle: the K-major operand layout of
    /// the e4m3 `wgmma` (the decodes of an fp8 cache).
    Fp8Swizzle64,
}

impl MapLayout {
    /// The layout the TMA decode of these dtypes reads.
    pub fn of(dtypes: DecodeDtypes) -> Self {
        match dtypes {
            DecodeDtypes::Fp8 | DecodeDtypes::Fp8KvBf16Q => Self::Fp8Swizzle64,
            DecodeDtypes::Bf16 | DecodeDtypes::Fp16 => Self::Bf16Swizzle128,
        }
    }
}

/// The map of the request's cache (the TMA decode's second parameter).
pub fn encode_kv_map(req: &DecodeRequest, shape: &DecodeShape) -> Result<TensorMap> {
    let [stride_page, stride_token, _] = req.kv_cache.strides;
    encode_paged_map(
        req.kv_cache.ptr,
        MapLayout::of(shape.dtypes),
        shape.page_size,
        shape.num_pages,
        stride_token,
        stride_page,
    )
}

/// [`encode_kv_map`] from the cache's parts: a bf16 (or, for the fp8 layouts, an fp8
/// e4m3) cache at device address `ptr` of `num_pages` pages of `page_size` token rows of 576
/// elements, `stride_token` and `stride_page` elements apart, landing as `layout` says.
/// Also what the TMA primitive's GPU test lands boxes with.
pub fn encode_paged_map(
    ptr: u64,
    layout: MapLayout,
    page_size: usize,
    num_pages: usize,
    stride_token: usize,
    stride_page: usize,
) -> Result<TensorMap> {
    use sys::CUtensorMapDataType as Ty;
    use sys::CUtensorMapSwizzle as Sw;
    let (elem, data_type, swizzle) = match layout {
        MapLayout::Fp8Swizzle64 => (
            1u64,
            Ty::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            Sw::CU_TENSOR_MAP_SWIZZLE_64B,
        ),
        MapLayout::Bf16Swizzle128 => (
            2u64,
            Ty::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            Sw::CU_TENSOR_MAP_SWIZZLE_128B,
        ),
    };
    let rows = page_size.min(decode_tile::BLOCK_N) as u32;
    let dims: [u64; 3] = [D_QK as u64, page_size as u64, num_pages as u64];
    let strides: [u64; 2] = [stride_token as u64 * elem, stride_page as u64 * elem];
    let boxes: [u32; 3] = [64, rows, 1];
    let elem_strides: [u32; 3] = [1, 1, 1];
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    // SAFETY: every array has the rank's length; the driver only encodes the address (it
    // reads no device memory).
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            data_type,
            3,
            ptr as *mut c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elem_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(MlaError::Unsupported {
            what: "kv_cache tensor map",
            got: format!("dims {dims:?}, byte strides {strides:?}, box {boxes:?} at {ptr:#x}"),
            why: format!("cuTensorMapEncodeTiled returned {r:?}"),
        });
    }
    // SAFETY: encoded above.
    let map = unsafe { map.assume_init() };
    Ok(TensorMap { words: map.opaque })
}
