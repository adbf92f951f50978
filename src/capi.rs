//! The C ABI (`libmla.so`, header `src/mla.h`): device pointers, shapes, scales and a
//! `CUstream` in; a status code and a thread-local last-error text out. For C/C++ and
//! Python stacks (the peers' benchmark plugin `benches/peer_plugin.py` uses it via ctypes).
//!
//! Every function returns `MLA_OK` (0) or a negative status; nothing panics across the
//! boundary (a panic is caught and reported as `MLA_ERR_INTERNAL`; the destroy functions
//! catch and drop theirs). A call that succeeds leaves `mla_last_error()` empty.

use std::cell::RefCell;
use std::ffi::{CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use mla_abi::{D_QK, D_V, ElemType};

use crate::{
    AppendRequest, DecodeConfig, DecodeDtypes, DecodeFault, DecodePlan, DecodeRequest,
    GatherRequest, HostMirror, MergeRequest, MlaError, Runtime, Scales, SplitParts, TensorView,
};

/// The C header of this ABI (`src/mla.h`), as shipped.
pub const HEADER: &str = include_str!("mla.h");

pub const MLA_OK: c_int = 0;
/// A request, config or argument was invalid, including a null handle (see
/// `mla_last_error`).
pub const MLA_ERR_INVALID: c_int = -1;
/// Valid but unsupported here (arch, dtype pair, backend).
pub const MLA_ERR_UNSUPPORTED: c_int = -2;
/// No driver or no device.
pub const MLA_ERR_NO_DEVICE: c_int = -3;
/// A CUDA driver call, allocation or launch failed.
pub const MLA_ERR_CUDA: c_int = -4;
/// A panic inside the library (a bug).
pub const MLA_ERR_INTERNAL: c_int = -5;

/// `MlaFault::kind` values (`mla_abi::fault`).
pub const MLA_FAULT_NONE: i32 = mla_abi::fault::NONE;
pub const MLA_FAULT_PAGE_ID: i32 = mla_abi::fault::PAGE_ID;
pub const MLA_FAULT_SEQ_LEN: i32 = mla_abi::fault::SEQ_LEN;

/// Element type codes of the C ABI (the values of `mla_abi::ElemType`).
pub const MLA_BF16: u32 = ElemType::Bf16 as u32;
pub const MLA_FP16: u32 = ElemType::Fp16 as u32;
pub const MLA_FP8_E4M3: u32 = ElemType::Fp8E4m3 as u32;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Sets this thread's last-error text. A call during the thread's exit, after its
/// thread-locals were destroyed (a C++ `thread_local` destructor calling in), keeps only
/// the status: `with` would panic there, and a panic cannot leave an `extern "C"` call.
fn set_error(msg: String) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|e| *e.borrow_mut() = c);
}

fn status_of(e: &MlaError) -> c_int {
    match e {
        MlaError::NoDriver(_) | MlaError::NoDevice(_) => MLA_ERR_NO_DEVICE,
        MlaError::Unsupported { .. } => MLA_ERR_UNSUPPORTED,
        MlaError::Load { .. }
        | MlaError::Launch { .. }
        | MlaError::Alloc { .. }
        | MlaError::Comm { .. }
        | MlaError::Driver(_) => MLA_ERR_CUDA,
        _ => MLA_ERR_INVALID,
    }
}

/// Runs `f`, turning errors and panics into a status and the last-error text (emptied on
/// success).
fn guard(f: impl FnOnce() -> Result<(), MlaError>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => {
            set_error(String::new());
            MLA_OK
        }
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
    /// 0: the default tile for the plan (`Tile::default_for_plan` of the rows, dtypes,
    /// `max_batch`, `max_seq_len` and `page_size`); 1: the 16-row tile; 2: the 64-row
    /// `mma.sync` tile; 3: the `wgmma` tile (sm_90a, not fp16); 4: the 32-row tile (sm_90a,
    /// fp8 cache).
    pub tile: u32,
}

/// What a plan chose (C layout; `DecodePlan::info`). Strings are NUL-terminated and cut to
/// fit.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MlaPlanInfo {
    /// `sm90a`, `portable` or `reference`.
    pub backend: [c_char; 16],
    /// The tactic's canonical string.
    pub tactic: [c_char; 64],
    /// The kernels a run may launch, comma-separated, in launch order.
    pub kernels: [c_char; 256],
    /// Device bytes of the plan's workspace.
    pub workspace_bytes: u64,
    /// 1 when the plan runs in checked mode.
    pub checked: u32,
    pub _pad: u32,
}

/// A checked decode's first fault (C layout; `DecodeFault`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MlaFault {
    /// `MLA_FAULT_NONE`, `MLA_FAULT_PAGE_ID` or `MLA_FAULT_SEQ_LEN`.
    pub kind: i32,
    /// The sequence (batch index).
    pub sequence: i32,
    /// The page-table column of a page-id fault; -1 for a length fault.
    pub column: i32,
    /// The page id or the length met.
    pub value: i32,
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

/// The split layouts of `mla_decode_run_split` (`SplitParts`): each rope part in a tensor
/// of its own. Zero fields take their defaults.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MlaSplitArgs {
    /// `[num_pages, page_size, 64]` of `kv_dtype`, the cache's rope part; `kv_cache` is then
    /// `[num_pages, page_size, 512]`. 0: the cache is fused (576 wide).
    pub kpe_cache: u64,
    /// Page stride of `kpe_cache` (0: `page_size * kpe_token_stride`).
    pub kpe_page_stride: u64,
    /// Token stride of `kpe_cache` (0: 64).
    pub kpe_token_stride: u64,
    /// Token stride of `kv_cache` (0: its width, 512 split or 576 fused); `kv_page_stride` 0
    /// is then `page_size` times it.
    pub kv_token_stride: u64,
    /// `[batch, s_q, heads, 64]` row-major of `q_dtype`, q's rope part; `q` is then
    /// `[batch, s_q, heads, 512]` row-major. 0: q is fused (576 wide).
    pub q_pe: u64,
}

/// Loads the kernels on CUDA device `ordinal` (its primary context).
///
/// # Safety
/// `out` is a valid pointer to write the handle to.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_runtime_create(ordinal: c_int, out: *mut *mut MlaRuntime) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(MlaError::NullArgument { field: "out" });
        }
        if ordinal < 0 {
            return Err(MlaError::shape("ordinal", "a device index >= 0", ordinal));
        }
        let rt = crate::load(ordinal as usize)?;
        // SAFETY: out is non-null and the caller guarantees it is writable.
        unsafe { *out = Box::into_raw(Box::new(MlaRuntime { rt })) };
        Ok(())
    })
}

/// Drops a handle without letting a panic cross the boundary. The last error stays as it
/// was (a caller may clean up before reading it).
fn destroy<T>(handle: *mut T) {
    if !handle.is_null() {
        // SAFETY: the callers pass ownership of a handle made by Box::into_raw back.
        let dropped = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(handle) })));
        if dropped.is_err() {
            set_error("internal error: a panic while destroying a handle was caught".into());
        }
    }
}

/// # Safety
/// `rt` is null or a handle from `mla_runtime_create`, not used afterwards, and every plan
/// made from it is destroyed first.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_runtime_destroy(rt: *mut MlaRuntime) {
    destroy(rt);
}

/// The runtime and plan behind two handles, each refused by name when null.
///
/// # Safety
/// Non-null handles are live.
unsafe fn handles<'a>(
    rt: *const MlaRuntime,
    plan: *const MlaPlan,
) -> Result<(&'a Runtime, &'a DecodePlan), MlaError> {
    if rt.is_null() {
        return Err(MlaError::NullHandle { field: "rt" });
    }
    if plan.is_null() {
        return Err(MlaError::NullHandle { field: "plan" });
    }
    // SAFETY: checked non-null; the caller guarantees they are live.
    Ok(unsafe { (&(*rt).rt, &(*plan).plan) })
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
        if cfg.is_null() {
            return Err(MlaError::NullArgument { field: "cfg" });
        }
        // SAFETY: checked non-null; the caller guarantees validity.
        let cfg = unsafe { *cfg };
        let mut config = DecodeConfig {
            max_batch: cfg.max_batch as usize,
            heads: cfg.heads as usize,
            s_q: cfg.s_q as usize,
            dtypes: DecodeDtypes::Bf16,
            page_size: cfg.page_size as usize,
            max_seq_len: cfg.max_seq_len as usize,
        };
        // The config is checked first (it needs no device), then the handles: every field
        // range (MLA_ERR_INVALID) before the dtype pair (MLA_ERR_UNSUPPORTED, valid configs only).
        elem(cfg.q_dtype, "q_dtype")?;
        elem(cfg.kv_dtype, "kv_dtype")?;
        config.validate()?;
        let tile = match cfg.tile {
            0 => None,
            1 => Some(crate::tactic::Tile::M16N64),
            2 => Some(crate::tactic::Tile::M64N64),
            3 => Some(crate::tactic::Tile::Wg64N64),
            4 => Some(crate::tactic::Tile::M32N64),
            other => {
                return Err(MlaError::shape(
                    "tile",
                    "0 (shape default), 1 (m16n64), 2 (m64n64), 3 (wg64n64) or 4 (m32n64)",
                    other,
                ));
            }
        };
        if !(0..=crate::tactic::MAX_WAVES).contains(&cfg.waves) {
            return Err(MlaError::shape("waves", "0 (default) or 1..=4", cfg.waves));
        }
        config.dtypes = dtypes(cfg.q_dtype, cfg.kv_dtype)?;
        if rt.is_null() {
            return Err(MlaError::NullHandle { field: "rt" });
        }
        if out.is_null() {
            return Err(MlaError::NullArgument { field: "out" });
        }
        // SAFETY: checked non-null; the caller guarantees it is live.
        let rt = unsafe { &(*rt).rt };
        let mut tactic = rt.default_tactic(&config);
        if cfg.waves != 0 {
            tactic.waves = cfg.waves;
        }
        tactic.tile = match tile {
            Some(t) => t,
            None => tactic.tile,
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
    destroy(plan);
}

/// Copies `s` into `dst` NUL-terminated, cut to fit.
fn c_text<const N: usize>(s: &str) -> [c_char; N] {
    let mut dst = [0 as c_char; N];
    for (d, b) in dst.iter_mut().zip(s.bytes().take(N - 1)) {
        *d = b as c_char;
    }
    dst
}

/// What the plan chose: backend, tactic, the kernels a run may launch, workspace bytes.
///
/// # Safety
/// `rt` and `plan` are live handles (the plan made from `rt`), `out` a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_plan_info(
    rt: *const MlaRuntime,
    plan: *const MlaPlan,
    out: *mut MlaPlanInfo,
) -> c_int {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let (rt, plan) = unsafe { handles(rt, plan)? };
        if out.is_null() {
            return Err(MlaError::NullArgument { field: "out" });
        }
        let info = plan.info(rt);
        let v = MlaPlanInfo {
            backend: c_text(info.backend),
            tactic: c_text(&info.tactic),
            kernels: c_text(&info.kernels.join(",")),
            workspace_bytes: info.workspace_bytes as u64,
            checked: info.checked as u32,
            _pad: 0,
        };
        // SAFETY: out is non-null and writable.
        unsafe { *out = v };
        Ok(())
    })
}

/// Checked mode: waits for `stream` (a `CUstream`; the one the plan runs on), then writes
/// the first fault a decode of the plan met since it was made or `mla_plan_clear_fault`
/// ran (`kind` `MLA_FAULT_NONE`: none). `MLA_ERR_INVALID` for a plan made with
/// checked mode off (`mla_plan_set_checked`). Never during graph capture.
///
/// # Safety
/// `rt` and `plan` are live handles (the plan made from `rt`), `out` a valid pointer,
/// `stream` a stream of the runtime's context (null: the legacy default stream).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_plan_fault(
    rt: *const MlaRuntime,
    plan: *const MlaPlan,
    stream: *mut c_void,
    out: *mut MlaFault,
) -> c_int {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let (rt, plan) = unsafe { handles(rt, plan)? };
        if out.is_null() {
            return Err(MlaError::NullArgument { field: "out" });
        }
        // SAFETY: forwarded from the caller.
        let fault = unsafe { plan.fault_raw(rt, stream as cudarc::driver::sys::CUstream)? };
        let v = match fault {
            None => MlaFault::default(),
            Some(DecodeFault::PageId {
                sequence,
                column,
                page,
            }) => MlaFault {
                kind: MLA_FAULT_PAGE_ID,
                sequence: sequence as i32,
                column: column as i32,
                value: page,
            },
            Some(DecodeFault::SeqLen { sequence, len }) => MlaFault {
                kind: MLA_FAULT_SEQ_LEN,
                sequence: sequence as i32,
                column: -1,
                value: len,
            },
        };
        // SAFETY: out is non-null and writable.
        unsafe { *out = v };
        Ok(())
    })
}

/// Checked mode on (`checked` = 1) or off (0) for the plan's runs launched from now on
/// (`DecodePlan::set_checked`); off when a plan is made. Not while the plan's work is in
/// flight; a graph captured before keeps the mode it was captured with.
///
/// # Safety
/// `rt` and `plan` are live handles (the plan made from `rt`), not used by another thread
/// during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_plan_set_checked(
    rt: *const MlaRuntime,
    plan: *mut MlaPlan,
    checked: c_int,
) -> c_int {
    guard(|| {
        // SAFETY: forwarded from the caller.
        unsafe { handles(rt, plan)? };
        let on = match checked {
            0 => false,
            1 => true,
            other => return Err(MlaError::shape("checked", "0 or 1", other)),
        };
        // SAFETY: non-null (handles) and not shared during the call (caller).
        unsafe { (*plan).plan.set_checked(on) };
        Ok(())
    })
}

/// Decode context parallelism: the plan's runs from now on decode rank `rank`'s share of
/// every sequence, which is spread over `ranks` ranks in runs of `interleave` consecutive
/// tokens (`mla::Shard`; `ranks` 0 or 1: off). `seq_lens` stay global.
///
/// # Safety
/// As [`mla_plan_set_checked`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_plan_set_shard(
    rt: *const MlaRuntime,
    plan: *mut MlaPlan,
    rank: u32,
    ranks: u32,
    interleave: u32,
) -> c_int {
    guard(|| {
        // SAFETY: forwarded from the caller.
        unsafe { handles(rt, plan)? };
        let shard = mla_abi::Shard {
            rank,
            ranks,
            interleave,
            _pad: 0,
        };
        // SAFETY: non-null (handles) and not shared during the call (caller).
        unsafe { (*plan).plan.set_shard(shard) }
    })
}

/// Empties the plan's fault record in stream order on `stream` (capturable).
///
/// # Safety
/// As `mla_plan_fault`, without `out`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_plan_clear_fault(
    rt: *const MlaRuntime,
    plan: *const MlaPlan,
    stream: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let (rt, plan) = unsafe { handles(rt, plan)? };
        // SAFETY: forwarded from the caller.
        unsafe { plan.clear_fault_raw(rt, stream as cudarc::driver::sys::CUstream) }
    })
}

/// A stride field of the C args: 0 stands for `default`.
fn or_default(v: u64, default: usize) -> usize {
    if v == 0 { default } else { v as usize }
}

/// A paged cache part `[num_pages, page_size, width]` of `dtype` at `ptr`: rows `token`
/// elements apart, pages `page_stride` apart (0: `page_size * token`, saturating: an absurd
/// stride is the validator's typed error, not an overflow here).
fn paged_part(
    ptr: u64,
    dtype: ElemType,
    (num_pages, page_size, width): (u32, usize, usize),
    token: usize,
    page_stride: u64,
) -> TensorView<3> {
    TensorView::strided(
        ptr,
        dtype,
        [num_pages as usize, page_size, width],
        [
            or_default(page_stride, page_size.saturating_mul(token)),
            token,
            1,
        ],
    )
}

/// The `[batch, max_pages]` int32 page table at `ptr`, rows `stride` elements apart (0:
/// `max_pages`).
fn table_view(ptr: u64, batch: usize, max_pages: u32, stride: u64) -> TensorView<2> {
    TensorView::strided(
        ptr,
        ElemType::I32,
        [batch, max_pages as usize],
        [or_default(stride, max_pages as usize), 1],
    )
}

/// The rope part's strides describe `kpe_cache`: with no rope part (`kpe_cache` 0, a fused
/// cache) a nonzero one would be silently ignored, so it is refused by name.
fn rope_strides_need_a_part(sp: &MlaSplitArgs) -> Result<(), MlaError> {
    if sp.kpe_cache != 0 {
        return Ok(());
    }
    for (field, v) in [
        ("split.kpe_page_stride", sp.kpe_page_stride),
        ("split.kpe_token_stride", sp.kpe_token_stride),
    ] {
        if v != 0 {
            return Err(MlaError::shape(
                field,
                "0 (split.kpe_cache is 0: the cache is fused, it has no rope part)",
                v,
            ));
        }
    }
    Ok(())
}

/// The request and split parts of the C args (fused where `sp`'s pointers are 0).
fn request_split_of(
    plan: &DecodePlan,
    a: &MlaDecodeArgs,
    sp: &MlaSplitArgs,
) -> (DecodeRequest<'static>, SplitParts) {
    let c = plan.config();
    let (b, s, h) = (a.batch as usize, c.s_q, c.heads);
    let d = c.dtypes;
    let page = c.page_size;
    let kv_width = if sp.kpe_cache == 0 { D_QK } else { D_V };
    let q_width = if sp.q_pe == 0 { D_QK } else { D_V };
    let kv_token = or_default(sp.kv_token_stride, kv_width);
    let rope = D_QK - D_V;
    let kpe_token = or_default(sp.kpe_token_stride, rope);
    let parts = SplitParts {
        kpe_cache: (sp.kpe_cache != 0).then(|| {
            paged_part(
                sp.kpe_cache,
                d.kv(),
                (a.num_pages, page, rope),
                kpe_token,
                sp.kpe_page_stride,
            )
        }),
        q_pe: (sp.q_pe != 0).then(|| TensorView::contiguous(sp.q_pe, d.q(), [b, s, h, rope])),
    };
    let req = DecodeRequest {
        q: TensorView::contiguous(a.q, d.q(), [b, s, h, q_width]),
        kv_cache: paged_part(
            a.kv_cache,
            d.kv(),
            (a.num_pages, page, kv_width),
            kv_token,
            a.kv_page_stride,
        ),
        page_table: table_view(a.page_table, b, a.max_pages, a.page_table_stride),
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
    (req, parts)
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
    // SAFETY: forwarded from the caller.
    unsafe { decode_c(rt, plan, args, stream, None) }
}

/// `mla_decode_run` on split layouts (`MlaSplitArgs`; `DecodePlan::run_split`).
///
/// # Safety
/// As `mla_decode_run`; `split` valid, its pointers valid for the described shapes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_decode_run_split(
    rt: *const MlaRuntime,
    plan: *const MlaPlan,
    args: *const MlaDecodeArgs,
    split: *const MlaSplitArgs,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: forwarded from the caller.
    unsafe { decode_split_c(rt, plan, args, split, stream, None) }
}

/// `mla_decode_run_layer` on split layouts.
///
/// # Safety
/// As `mla_decode_run_split`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_decode_run_layer_split(
    rt: *const MlaRuntime,
    plan: *const MlaPlan,
    args: *const MlaDecodeArgs,
    split: *const MlaSplitArgs,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: forwarded from the caller.
    unsafe { decode_split_c(rt, plan, args, split, stream, Some(0)) }
}

/// `mla_decode_run_layer_split` with the counts of step slot `slot`.
///
/// # Safety
/// As `mla_decode_run_split`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_decode_run_layer_split_slot(
    rt: *const MlaRuntime,
    plan: *const MlaPlan,
    slot: u32,
    args: *const MlaDecodeArgs,
    split: *const MlaSplitArgs,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: forwarded from the caller.
    unsafe { decode_split_c(rt, plan, args, split, stream, Some(slot as usize)) }
}

/// # Safety
/// As `mla_decode_run_split`.
unsafe fn decode_split_c(
    rt: *const MlaRuntime,
    plan: *const MlaPlan,
    args: *const MlaDecodeArgs,
    split: *const MlaSplitArgs,
    stream: *mut c_void,
    slot: Option<usize>,
) -> c_int {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let (rt, plan) = unsafe { handles(rt, plan)? };
        if args.is_null() {
            return Err(MlaError::NullArgument { field: "args" });
        }
        if split.is_null() {
            return Err(MlaError::NullArgument { field: "split" });
        }
        // SAFETY: checked non-null; the caller guarantees validity.
        let sp = unsafe { &*split };
        rope_strides_need_a_part(sp)?;
        // SAFETY: checked non-null; the caller guarantees validity.
        let (req, parts) = request_split_of(plan, unsafe { &*args }, sp);
        // SAFETY: forwarded from the caller.
        unsafe {
            plan.run_split_slot_raw(
                rt,
                stream as cudarc::driver::sys::CUstream,
                &req,
                &parts,
                slot,
            )?
        };
        Ok(())
    })
}

// The context-parallel group's C functions (feature `nccl`, on by default).
#[cfg(feature = "nccl")]
#[path = "capi_cp.rs"]
mod cp;
#[cfg(feature = "nccl")]
pub use cp::*;

/// `mla_decode_run` (`slot` none) or `mla_decode_run_layer_slot` (a step slot): fused
/// layouts.
///
/// # Safety
/// As `mla_decode_run`.
unsafe fn decode_c(
    rt: *const MlaRuntime,
    plan: *const MlaPlan,
    args: *const MlaDecodeArgs,
    stream: *mut c_void,
    slot: Option<usize>,
) -> c_int {
    // SAFETY: forwarded from the caller; the split args are a local.
    unsafe { decode_split_c(rt, plan, args, &MlaSplitArgs::default(), stream, slot) }
}

/// Per-step scheduling (`DecodePlan::schedule_step`): the split counts of a batch of
/// `batch` sequences whose lengths are at `seq_lens` (`[batch]` int32, device), computed on
/// the device into the plan's workspace in stream order on `stream` (capturable); lengths
/// are cut at `max_pages * page_size`, as the decode cuts them, into step slot 0 (see
/// `mla_schedule_step_slot`); `mla_decode_run` keeps counts of its own.
///
/// # Safety
/// `rt` and `plan` are live handles (the plan made from `rt`), `seq_lens` a device pointer
/// to `batch` int32 valid until the kernel completes, `stream` a stream of the runtime's
/// context (null: the legacy default stream).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_schedule_step(
    rt: *const MlaRuntime,
    plan: *const MlaPlan,
    seq_lens: u64,
    batch: u32,
    max_pages: u32,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: forwarded from the caller.
    unsafe { mla_schedule_step_slot(rt, plan, 0, seq_lens, batch, max_pages, stream) }
}

/// `mla_schedule_step` into step slot `slot` (`0..STEP_SLOTS`, else `MLA_ERR_INVALID`
/// naming it), which `mla_decode_run_layer_slot` of the same slot reads: up to
/// `STEP_SLOTS` steps scheduled ahead of their layers on one plan (micro-batches).
///
/// # Safety
/// As `mla_schedule_step`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_schedule_step_slot(
    rt: *const MlaRuntime,
    plan: *const MlaPlan,
    slot: u32,
    seq_lens: u64,
    batch: u32,
    max_pages: u32,
    stream: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let (rt, plan) = unsafe { handles(rt, plan)? };
        let lens = TensorView::contiguous(seq_lens, ElemType::I32, [batch as usize]);
        // The slot before the other arguments: a bad slot is named first.
        DecodePlan::step_slot(slot as usize)?;
        if max_pages == 0 {
            return Err(MlaError::shape(
                "max_pages",
                ">= 1 (the layers' page-table columns)",
                0,
            ));
        }
        let capacity = max_pages as usize * plan.config().page_size;
        // SAFETY: forwarded from the caller.
        unsafe {
            plan.schedule_step_slot_raw(
                rt,
                stream as cudarc::driver::sys::CUstream,
                slot as usize,
                &lens,
                capacity,
            )
        }
    })
}

/// One layer of a scheduled step (`DecodePlan::run_layer`): validation, then the decode
/// and combine with the split counts of step slot 0; the args' batch and `seq_lens`
/// contents must be the scheduled ones (a slot with no schedule yet, or another batch, is
/// `MLA_ERR_INVALID`). Capturable.
///
/// # Safety
/// As `mla_decode_run`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_decode_run_layer(
    rt: *const MlaRuntime,
    plan: *const MlaPlan,
    args: *const MlaDecodeArgs,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: forwarded from the caller.
    unsafe { decode_c(rt, plan, args, stream, Some(0)) }
}

/// `mla_decode_run_layer` with the counts of step slot `slot` (`mla_schedule_step_slot`).
///
/// # Safety
/// As `mla_decode_run`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_decode_run_layer_slot(
    rt: *const MlaRuntime,
    plan: *const MlaPlan,
    slot: u32,
    args: *const MlaDecodeArgs,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: forwarded from the caller.
    unsafe { decode_c(rt, plan, args, stream, Some(slot as usize)) }
}

/// The runtime of a live handle and a copy of the args, or the typed error of a null one.
///
/// # Safety
/// Each pointer is null or valid.
unsafe fn rt_and_args<'a, A: Copy>(
    rt: *const MlaRuntime,
    args: *const A,
) -> Result<(&'a Runtime, A), MlaError> {
    if rt.is_null() {
        return Err(MlaError::NullHandle { field: "rt" });
    }
    if args.is_null() {
        return Err(MlaError::NullArgument { field: "args" });
    }
    // SAFETY: checked non-null; the caller guarantees validity.
    Ok(unsafe { (&(*rt).rt, *args) })
}

/// A rank merge (C layout; `MergeRequest`): `ranks` results of the same query rows.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MlaMergeArgs {
    /// `[ranks][batch, s_q, heads, 512]` of `dtype`, device.
    pub outs: u64,
    /// `[ranks][batch, s_q, heads]` f32, device.
    pub lses: u64,
    /// `[batch, s_q, heads, 512]` of `dtype`, device.
    pub out: u64,
    /// `[batch, s_q, heads]` f32, device.
    pub lse: u64,
    pub ranks: u32,
    pub batch: u32,
    pub s_q: u32,
    pub heads: u32,
    /// `MLA_BF16` or `MLA_FP16`: `outs` and `out`.
    pub dtype: u32,
    pub _pad: u32,
    /// Elements from one rank's `outs` to the next (0: `batch * s_q * heads * 512`).
    pub outs_rank_stride: u64,
    /// Elements from one rank's `lses` to the next (0: `batch * s_q * heads`).
    pub lses_rank_stride: u64,
}

/// Merges `ranks` results of the same query rows by their LSE (`Runtime::merge`), on
/// `stream`; capturable.
///
/// # Safety
/// `rt` is a live handle, `args` valid, its device pointers valid for the described
/// shapes until the merge completes, `stream` a stream of the runtime's context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_merge(
    rt: *const MlaRuntime,
    args: *const MlaMergeArgs,
    stream: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let (rt, a) = unsafe { rt_and_args(rt, args)? };
        let dtype = match elem(a.dtype, "dtype")? {
            t @ (ElemType::Bf16 | ElemType::Fp16) => t,
            other => {
                return Err(MlaError::DtypeMismatch {
                    field: "dtype",
                    expected: "bf16 or fp16".into(),
                    got: other.name().into(),
                });
            }
        };
        let (r, b, s, h) = (
            a.ranks as usize,
            a.batch as usize,
            a.s_q as usize,
            a.heads as usize,
        );
        // Products of caller fields: an overflow is a typed error, not a panic (the merge's
        // validation checks every view built from them).
        let rows = crate::validate::addressable_rows(b, s, h, "batch * s_q * heads")?;
        if a.outs_rank_stride % 4 != 0 {
            // mla.h: a multiple of 4 elements, MLA_ERR_INVALID otherwise (also at ranks = 1,
            // where the view's stride is never looked at).
            return Err(MlaError::shape(
                "outs_rank_stride",
                "0 or a multiple of 4 elements",
                a.outs_rank_stride,
            ));
        }
        let or = or_default(a.outs_rank_stride, rows * D_V);
        let lr = or_default(a.lses_rank_stride, rows);
        let req = MergeRequest {
            outs: TensorView::strided(
                a.outs,
                dtype,
                [r, b, s, h, D_V],
                [or, s * h * D_V, h * D_V, D_V, 1],
            ),
            lses: TensorView::strided(a.lses, ElemType::F32, [r, b, s, h], [lr, s * h, h, 1]),
            out: TensorView::contiguous(a.out, dtype, [b, s, h, D_V]),
            lse: TensorView::contiguous(a.lse, ElemType::F32, [b, s, h]),
        };
        // SAFETY: forwarded from the caller.
        unsafe { rt.merge_raw(stream as cudarc::driver::sys::CUstream, &req)? };
        Ok(())
    })
}

/// A paged cache and its page table (C layout), for `mla_append_kv` and `mla_gather_kv`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MlaPagedArgs {
    /// Append: the new rows `[batch, s_q, 576]` (the cache's type; bf16 for an fp8 cache).
    /// Gather: the output `[batch, rows, 576]` (the cache's type, or bf16 to dequantise an
    /// fp8 cache). Device.
    pub rows: u64,
    /// `[num_pages, page_size, 576]` of `kv_dtype`, device.
    pub kv_cache: u64,
    /// `[batch, max_pages]` int32, device.
    pub page_table: u64,
    /// `[batch]` int32, device.
    pub seq_lens: u64,
    pub batch: u32,
    /// Append: `s_q`, the new tokens per sequence. Gather: the output's rows per sequence.
    pub n: u32,
    pub num_pages: u32,
    pub max_pages: u32,
    pub page_size: u32,
    /// `MLA_BF16`, `MLA_FP16` or `MLA_FP8_E4M3`.
    pub kv_dtype: u32,
    /// Gather only: the output's type (`kv_dtype`, or `MLA_BF16` under an fp8 cache).
    pub rows_dtype: u32,
    pub _pad: u32,
    /// Elements (0: `max_pages`).
    pub page_table_stride: u64,
    /// Elements (0: `page_size * 576`).
    pub kv_page_stride: u64,
    /// fp8 caches: append stores `saturate(x / kv_scale)`, gather to bf16 multiplies by it;
    /// 1 otherwise.
    pub kv_scale: f32,
    pub _pad2: u32,
}

/// A paged call's views: the cache, its rope part (split caches), the page table, lengths.
type PagedViews = (
    TensorView<3>,
    Option<TensorView<3>>,
    TensorView<2>,
    TensorView<1>,
);

/// The paged views of `a`: the cache (fused, or its 512-wide part where `sp.kpe_cache` is
/// set, tokens `sp.kv_token_stride` apart), its rope part, the page table and lengths.
fn paged_views(a: &MlaPagedArgs, sp: &MlaSplitArgs) -> Result<PagedViews, MlaError> {
    let kv = elem(a.kv_dtype, "kv_dtype")?;
    rope_strides_need_a_part(sp)?;
    if sp.q_pe != 0 {
        return Err(MlaError::shape(
            "split.q_pe",
            "0 (the paged calls take no q)",
            sp.q_pe,
        ));
    }
    let b = a.batch as usize;
    let page = a.page_size as usize;
    let width = if sp.kpe_cache == 0 { D_QK } else { D_V };
    let rope = D_QK - D_V;
    let kv_cache = paged_part(
        a.kv_cache,
        kv,
        (a.num_pages, page, width),
        or_default(sp.kv_token_stride, width),
        a.kv_page_stride,
    );
    let kpe = (sp.kpe_cache != 0).then(|| {
        paged_part(
            sp.kpe_cache,
            kv,
            (a.num_pages, page, rope),
            or_default(sp.kpe_token_stride, rope),
            sp.kpe_page_stride,
        )
    });
    let page_table = table_view(a.page_table, b, a.max_pages, a.page_table_stride);
    let seq_lens = TensorView::contiguous(a.seq_lens, ElemType::I32, [b]);
    Ok((kv_cache, kpe, page_table, seq_lens))
}

/// Which paged call.
#[derive(Clone, Copy)]
enum Paged {
    Append,
    Gather,
}

/// `mla_append_kv` or `mla_gather_kv`: the handles checked, the views built from the args,
/// the Rust call on the raw stream, under [`guard`].
///
/// # Safety
/// Each pointer is null or valid (its device pointers valid for the described shapes until
/// the kernel completes); `stream` a stream of the runtime's context.
unsafe fn paged_c(
    rt: *const MlaRuntime,
    args: *const MlaPagedArgs,
    split: *const MlaSplitArgs,
    stream: *mut c_void,
    call: Paged,
) -> c_int {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let (rt, a) = unsafe { rt_and_args(rt, args)? };
        if split.is_null() {
            return Err(MlaError::NullArgument { field: "split" });
        }
        // SAFETY: checked non-null; the caller guarantees validity.
        let (kv_cache, kpe, page_table, seq_lens) = paged_views(&a, unsafe { &*split })?;
        let st = stream as cudarc::driver::sys::CUstream;
        let rows = |t| TensorView::contiguous(a.rows, t, [a.batch as usize, a.n as usize, D_QK]);
        let host = HostMirror::default();
        match call {
            Paged::Append => {
                let req = AppendRequest {
                    new_kv: rows(kv_cache.dtype.append_rows()),
                    kv_cache,
                    page_table,
                    seq_lens,
                    kv_scale: a.kv_scale,
                    host,
                };
                // SAFETY: forwarded from the caller.
                unsafe { rt.append_kv_raw(st, &req, kpe.as_ref()) }
            }
            Paged::Gather => {
                let req = GatherRequest {
                    out: rows(elem(a.rows_dtype, "rows_dtype")?),
                    kv_cache,
                    page_table,
                    seq_lens,
                    kv_scale: a.kv_scale,
                    host,
                };
                // SAFETY: forwarded from the caller.
                unsafe { rt.gather_kv_raw(st, &req, kpe.as_ref()) }
            }
        }
    })
}

/// Writes each sequence's `n` (= `s_q`) new rows into its pages at positions
/// `seq_lens[b] - n ..= seq_lens[b] - 1` (`Runtime::append_kv`) on `stream`; capturable.
///
/// # Safety
/// `rt` is a live handle, `args` valid, its device pointers valid for the described shapes
/// until the kernel completes, `stream` a stream of the runtime's context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_append_kv(
    rt: *const MlaRuntime,
    args: *const MlaPagedArgs,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: forwarded from the caller; the split args are a local.
    unsafe { paged_c(rt, args, &MlaSplitArgs::default(), stream, Paged::Append) }
}

/// `mla_append_kv` into a split or padded cache (`split`: the rope part and the strides, as
/// `mla_decode_run_split` reads them; `split.q_pe` must be 0); `Runtime::append_kv_split`.
///
/// # Safety
/// As `mla_append_kv`; `split` null or valid, its device pointers valid for the described
/// shapes until the kernel completes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_append_kv_split(
    rt: *const MlaRuntime,
    args: *const MlaPagedArgs,
    split: *const MlaSplitArgs,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: forwarded from the caller.
    unsafe { paged_c(rt, args, split, stream, Paged::Append) }
}

/// Copies each sequence's rows `0 .. min(seq_lens[b], n)` out of the pages into
/// `rows[b, 0.., :]` (`Runtime::gather_kv`), dequantising an fp8 cache when `rows_dtype` is
/// bf16, on `stream`; capturable.
///
/// # Safety
/// As `mla_append_kv`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_gather_kv(
    rt: *const MlaRuntime,
    args: *const MlaPagedArgs,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: forwarded from the caller; the split args are a local.
    unsafe { paged_c(rt, args, &MlaSplitArgs::default(), stream, Paged::Gather) }
}

/// `mla_gather_kv` from a split or padded cache (`split` as for `mla_append_kv_split`); the
/// output rows stay 576 wide; `Runtime::gather_kv_split`.
///
/// # Safety
/// As `mla_append_kv_split`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_gather_kv_split(
    rt: *const MlaRuntime,
    args: *const MlaPagedArgs,
    split: *const MlaSplitArgs,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: forwarded from the caller.
    unsafe { paged_c(rt, args, split, stream, Paged::Gather) }
}

/// The library's version (the `mla` crate's), for a caller to check the ABI it loaded.
///
/// # Safety
/// Each pointer is null (not written) or valid to write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_get_version(
    major: *mut u32,
    minor: *mut u32,
    patch: *mut u32,
) -> c_int {
    guard(|| {
        let part = |s: &str| s.parse::<u32>().unwrap_or(0);
        for (dst, v) in [
            (major, part(env!("CARGO_PKG_VERSION_MAJOR"))),
            (minor, part(env!("CARGO_PKG_VERSION_MINOR"))),
            (patch, part(env!("CARGO_PKG_VERSION_PATCH"))),
        ] {
            if !dst.is_null() {
                // SAFETY: non-null, valid to write (caller).
                unsafe { *dst = v };
            }
        }
        Ok(())
    })
}

/// The last error of this thread, as UTF-8 text (empty when none, and during the thread's
/// exit once its thread-locals are gone). Valid until the next call into the library on
/// this thread.
#[unsafe(no_mangle)]
pub extern "C" fn mla_last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|e| e.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread-local whose destructor calls into the library after `LAST_ERROR` is gone.
    /// Returning at all is the test: `with` panicked there, and the panic aborted the
    /// process at the `extern "C"` boundary.
    #[test]
    fn calls_during_thread_exit_keep_their_status() {
        struct CallsAtExit;
        impl Drop for CallsAtExit {
            fn drop(&mut self) {
                let null = std::ptr::null_mut();
                // SAFETY: null pointers, which both calls accept (the second refuses them).
                let (ok, bad) = unsafe {
                    (
                        mla_get_version(null, null, null),
                        mla_plan_info(std::ptr::null(), std::ptr::null(), std::ptr::null_mut()),
                    )
                };
                assert_eq!(ok, MLA_OK);
                assert_ne!(bad, MLA_OK);
                assert!(!mla_last_error().is_null());
            }
        }
        thread_local! {
            static AT_EXIT: CallsAtExit = const { CallsAtExit };
        }
        std::thread::spawn(|| {
            // AT_EXIT registered first: its destructor runs after LAST_ERROR's here (the
            // other order does not reach the case).
            AT_EXIT.with(|_| {});
            set_error("first".into());
        })
        .join()
        .expect("the thread's exit ran its destructors without a panic");
    }

    #[test]
    fn rope_strides_without_a_rope_part_are_refused_by_name() {
        assert!(rope_strides_need_a_part(&MlaSplitArgs::default()).is_ok());
        let with_part = MlaSplitArgs {
            kpe_cache: 0x1000,
            kpe_page_stride: 64 * 64,
            kpe_token_stride: 64,
            ..Default::default()
        };
        assert!(rope_strides_need_a_part(&with_part).is_ok());
        // The fused cache's own token stride is not a rope stride.
        let fused = MlaSplitArgs {
            kv_token_stride: 640,
            q_pe: 0x2000,
            ..Default::default()
        };
        assert!(rope_strides_need_a_part(&fused).is_ok());
        for (sp, name) in [
            (
                MlaSplitArgs {
                    kpe_page_stride: 4096,
                    ..Default::default()
                },
                "split.kpe_page_stride",
            ),
            (
                MlaSplitArgs {
                    kpe_token_stride: 64,
                    ..Default::default()
                },
                "split.kpe_token_stride",
            ),
        ] {
            match rope_strides_need_a_part(&sp) {
                Err(e @ MlaError::InvalidShape { field, .. }) => {
                    assert_eq!(field, name);
                    assert_eq!(status_of(&e), MLA_ERR_INVALID);
                }
                other => panic!("{sp:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn paged_views_take_the_split_layout() {
        let a = MlaPagedArgs {
            rows: 0x1000,
            kv_cache: 0x10000,
            page_table: 0x2000,
            seq_lens: 0x3000,
            batch: 3,
            n: 2,
            num_pages: 40,
            max_pages: 8,
            page_size: 16,
            kv_dtype: MLA_BF16,
            rows_dtype: MLA_BF16,
            _pad: 0,
            page_table_stride: 0,
            kv_page_stride: 0,
            kv_scale: 1.0,
            _pad2: 0,
        };
        // Fused: 576 wide, tokens 576 apart, no rope part.
        let (kv, kpe, table, lens) = paged_views(&a, &MlaSplitArgs::default()).unwrap();
        assert_eq!(kv.shape, [40, 16, D_QK]);
        assert_eq!(kv.strides, [16 * D_QK, D_QK, 1]);
        assert!(kpe.is_none());
        assert_eq!((table.shape, lens.shape), ([3, 8], [3]));
        // Split and padded: the 512-wide part with its own token stride, the rope part with
        // its own, a page stride of the page's tokens by default.
        let sp = MlaSplitArgs {
            kpe_cache: 0x80000,
            kpe_token_stride: 72,
            kv_token_stride: 520,
            ..Default::default()
        };
        let (kv, kpe, _, _) = paged_views(&a, &sp).unwrap();
        assert_eq!(kv.shape, [40, 16, D_V]);
        assert_eq!(kv.strides, [16 * 520, 520, 1]);
        let kpe = kpe.unwrap();
        assert_eq!((kpe.ptr, kpe.shape), (0x80000, [40, 16, D_QK - D_V]));
        assert_eq!(kpe.strides, [16 * 72, 72, 1]);
        // The paged calls take no q; rope strides need a rope part.
        let q = MlaSplitArgs {
            q_pe: 0x9000,
            ..Default::default()
        };
        match paged_views(&a, &q) {
            Err(MlaError::InvalidShape { field, .. }) => assert_eq!(field, "split.q_pe"),
            other => panic!("{other:?}"),
        }
        let stray = MlaSplitArgs {
            kpe_token_stride: 64,
            ..Default::default()
        };
        match paged_views(&a, &stray) {
            Err(MlaError::InvalidShape { field, .. }) => {
                assert_eq!(field, "split.kpe_token_stride")
            }
            other => panic!("{other:?}"),
        }
    }
}
