//! The C ABI (`libmla.so`, header `src/mla.h`): device pointers, shapes, scales and a
//! `CUstream` in; a status code and a thread-local last-error text out. For C/C++ and
//! Python stacks (the peers' benchmark plugin `benches/peer_plugin.py` uses it via ctypes).
//!
//! Every function returns `MLA_OK` (0) or a negative status; nothing panics across the
//! boundary (a panic is caught and reported as `MLA_ERR_INTERNAL`).

use std::cell::RefCell;
use std::ffi::{CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use mla_abi::{D_QK, D_V, ElemType};

use crate::tactic::Tactic;
use crate::{
    DecodeConfig, DecodeDtypes, DecodePlan, DecodeRequest, HostMirror, MlaError, Runtime, Scales,
    TensorView,
};

pub const MLA_OK: c_int = 0;
/// A request or config was invalid (see `mla_last_error`).
pub const MLA_ERR_INVALID: c_int = -1;
/// Valid but unsupported here (arch, dtype pair, backend).
pub const MLA_ERR_UNSUPPORTED: c_int = -2;
/// No driver or no device.
pub const MLA_ERR_NO_DEVICE: c_int = -3;
/// A CUDA driver call, allocation or launch failed.
pub const MLA_ERR_CUDA: c_int = -4;
/// A null handle or a panic inside the library.
pub const MLA_ERR_INTERNAL: c_int = -5;

/// Element type codes of the C ABI (the values of `mla_abi::ElemType`).
pub const MLA_BF16: u32 = ElemType::Bf16 as u32;
pub const MLA_FP16: u32 = ElemType::Fp16 as u32;
pub const MLA_FP8_E4M3: u32 = ElemType::Fp8E4m3 as u32;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: String) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

fn status_of(e: &MlaError) -> c_int {
    match e {
        MlaError::NoDriver(_) | MlaError::NoDevice(_) => MLA_ERR_NO_DEVICE,
        MlaError::Unsupported { .. } => MLA_ERR_UNSUPPORTED,
        MlaError::Load { .. }
        | MlaError::Launch { .. }
        | MlaError::Alloc { .. }
        | MlaError::Driver(_) => MLA_ERR_CUDA,
        _ => MLA_ERR_INVALID,
    }
}

/// Runs `f`, turning errors and panics into a status and the last-error text.
fn guard(f: impl FnOnce() -> Result<(), MlaError>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => MLA_OK,
        Ok(Err(e)) => {
            let s = status_of(&e);
            set_error(e.to_string());
            s
        }
        Err(_) => {
            set_error("internal error: a panic was caught at the C boundary".into());
            MLA_ERR_INTERNAL
        }
    }
}

fn elem(code: u32, field: &'static str) -> Result<ElemType, MlaError> {
    match code {
        MLA_BF16 => Ok(ElemType::Bf16),
        MLA_FP16 => Ok(ElemType::Fp16),
        MLA_FP8_E4M3 => Ok(ElemType::Fp8E4m3),
        other => Err(MlaError::shape(
            field,
            "0 (bf16), 1 (fp16) or 2 (fp8 e4m3)",
            other,
        )),
    }
}

fn dtypes(q: u32, kv: u32) -> Result<DecodeDtypes, MlaError> {
    let (q, kv) = (elem(q, "q_dtype")?, elem(kv, "kv_dtype")?);
    DecodeDtypes::from_types(q, kv).ok_or_else(|| MlaError::Unsupported {
        what: "dtype pair",
        got: format!("q {}, kv {}", q.name(), kv.name()),
        why: "supported: bf16/bf16, fp16/fp16, bf16/fp8, fp8/fp8".into(),
    })
}

/// Opaque runtime handle.
pub struct MlaRuntime {
    rt: Runtime,
}

/// Opaque plan handle.
pub struct MlaPlan {
    plan: DecodePlan,
}

/// What a plan serves (C layout).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MlaPlanConfig {
    pub max_batch: u32,
    pub heads: u32,
    pub s_q: u32,
    pub page_size: u32,
    pub max_seq_len: u32,
    pub q_dtype: u32,
    pub kv_dtype: u32,
    /// 0: the default tactic; otherwise waves (1..=4) of the split schedule.
    pub waves: u32,
    /// 0: the default tile for the shape (`Tile::default_on`: 16 rows when
    /// `s_q * heads <= 16` or, on sm_90a, an fp8 cache with up to 32 rows; else the `wgmma`
    /// tile on sm_90a for bf16 Q, else the 64-row tile); 1: the 16-row tile; 2: the 64-row
    /// `mma.sync` tile; 3: the `wgmma` tile (sm_90a, bf16 Q).
    pub tile: u32,
}

/// One decode step (C layout). Tensors are contiguous row-major except where a stride is
/// given (in elements; 0 means contiguous).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MlaDecodeArgs {
    /// `[batch, s_q, heads, 576]` of `q_dtype`.
    pub q: u64,
    /// `[num_pages, page_size, 576]` of `kv_dtype`.
    pub kv_cache: u64,
    /// `[batch, max_pages]` i32.
    pub page_table: u64,
    /// `[batch]` i32.
    pub seq_lens: u64,
    /// `[batch, s_q, heads, 512]` bf16 (fp16 for fp16 q/kv).
    pub out: u64,
    /// `[batch, s_q, heads]` f32.
    pub lse: u64,
    pub batch: u32,
    pub num_pages: u32,
    pub max_pages: u32,
    pub _pad: u32,
    /// Row stride of the page table (0: `max_pages`).
    pub page_table_stride: u64,
    /// Page stride of the cache (0: `page_size * 576`).
    pub kv_page_stride: u64,
    pub softmax_scale: f32,
    pub output_scale: f32,
    pub q_scale: f32,
    pub kv_scale: f32,
}

/// Loads the kernels on CUDA device `ordinal` (its primary context).
///
/// # Safety
/// `out` is a valid pointer to write the handle to.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_runtime_create(ordinal: c_int, out: *mut *mut MlaRuntime) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(MlaError::NullPointer { field: "out" });
        }
        let rt = crate::load(ordinal.max(0) as usize)?;
        // SAFETY: out is non-null and the caller guarantees it is writable.
        unsafe { *out = Box::into_raw(Box::new(MlaRuntime { rt })) };
        Ok(())
    })
}

/// # Safety
/// `rt` is null or a handle from `mla_runtime_create`, not used afterwards, and every plan
/// made from it is destroyed first.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_runtime_destroy(rt: *mut MlaRuntime) {
    if !rt.is_null() {
        // SAFETY: the caller passes ownership back.
        drop(unsafe { Box::from_raw(rt) });
    }
}

/// Plans a decode (allocates its workspace; synchronises; never call it during capture).
///
/// # Safety
/// `rt` is a live runtime handle, `cfg` and `out` valid pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_plan_create(
    rt: *const MlaRuntime,
    cfg: *const MlaPlanConfig,
    out: *mut *mut MlaPlan,
) -> c_int {
    guard(|| {
        if rt.is_null() || cfg.is_null() || out.is_null() {
            return Err(MlaError::NullPointer {
                field: "rt, cfg or out",
            });
        }
        // SAFETY: checked non-null; the caller guarantees validity.
        let (rt, cfg) = unsafe { (&(*rt).rt, *cfg) };
        let config = DecodeConfig {
            max_batch: cfg.max_batch as usize,
            heads: cfg.heads as usize,
            s_q: cfg.s_q as usize,
            dtypes: dtypes(cfg.q_dtype, cfg.kv_dtype)?,
            page_size: cfg.page_size as usize,
            max_seq_len: cfg.max_seq_len as usize,
        };
        let mut tactic = Tactic::default_on(config.rows(), rt.backend(), config.dtypes);
        if cfg.waves != 0 {
            tactic.waves = cfg.waves;
        }
        tactic.tile = match cfg.tile {
            0 => tactic.tile,
            1 => crate::tactic::Tile::M16N64,
            2 => crate::tactic::Tile::M64N64,
            3 => crate::tactic::Tile::Wg64N64,
            other => {
                return Err(MlaError::shape(
                    "tile",
                    "0 (shape default), 1 (m16n64), 2 (m64n64) or 3 (wg64n64)",
                    other,
                ));
            }
        };
        let stream = rt.new_stream()?;
        let plan = rt.plan_decode(&stream, config, tactic)?;
        stream.synchronize()?;
        // SAFETY: out is non-null and writable.
        unsafe { *out = Box::into_raw(Box::new(MlaPlan { plan })) };
        Ok(())
    })
}

/// # Safety
/// `plan` is null or a handle from `mla_plan_create` whose work has completed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_plan_destroy(plan: *mut MlaPlan) {
    if !plan.is_null() {
        // SAFETY: the caller passes ownership back.
        drop(unsafe { Box::from_raw(plan) });
    }
}

/// One decode step on `stream` (a `CUstream`; null is the legacy default stream): schedule,
/// decode, combine. No allocation, no synchronisation: safe to capture in a CUDA graph.
///
/// # Safety
/// `rt` and `plan` are live handles (the plan made from `rt`), `args` valid, every device
/// pointer in it valid for the described shapes until the work completes, and `stream` a
/// stream of the runtime's context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_decode_run(
    rt: *const MlaRuntime,
    plan: *const MlaPlan,
    args: *const MlaDecodeArgs,
    stream: *mut c_void,
) -> c_int {
    guard(|| {
        if rt.is_null() || plan.is_null() || args.is_null() {
            return Err(MlaError::NullPointer {
                field: "rt, plan or args",
            });
        }
        // SAFETY: checked non-null; the caller guarantees validity.
        let (rt, plan, a) = unsafe { (&(*rt).rt, &(*plan).plan, *args) };
        let c = plan.config();
        let (b, s, h) = (a.batch as usize, c.s_q, c.heads);
        let d = c.dtypes;
        let page = c.page_size;
        let table_stride = if a.page_table_stride == 0 {
            a.max_pages as usize
        } else {
            a.page_table_stride as usize
        };
        let kv_page_stride = if a.kv_page_stride == 0 {
            page * D_QK
        } else {
            a.kv_page_stride as usize
        };
        let req = DecodeRequest {
            q: TensorView::contiguous(a.q, d.q(), [b, s, h, D_QK]),
            kv_cache: TensorView::strided(
                a.kv_cache,
                d.kv(),
                [a.num_pages as usize, page, D_QK],
                [kv_page_stride, D_QK, 1],
            ),
            page_table: TensorView::strided(
                a.page_table,
                ElemType::I32,
                [b, a.max_pages as usize],
                [table_stride, 1],
            ),
            seq_lens: TensorView::contiguous(a.seq_lens, ElemType::I32, [b]),
            out: TensorView::contiguous(a.out, d.out(), [b, s, h, D_V]),
            lse: TensorView::contiguous(a.lse, ElemType::F32, [b, s, h]),
            scales: Scales {
                softmax_scale: a.softmax_scale,
                output_scale: a.output_scale,
                q_scale: a.q_scale,
                kv_scale: a.kv_scale,
            },
            host: HostMirror::default(),
        };
        // SAFETY: forwarded from the caller.
        unsafe { plan.run_raw(rt, stream as cudarc::driver::sys::CUstream, &req)? };
        Ok(())
    })
}

/// The last error of this thread, as UTF-8 text (empty when none). Valid until the next
/// call into the library on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn mla_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}
