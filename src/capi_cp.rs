//! The C functions of the context-parallel group (`ContextParallel`), feature `nccl`.

use super::*;
use crate::ContextParallel;

/// Opaque handle of one rank's end of a context-parallel group (`ContextParallel`).
pub struct MlaCp {
    cp: ContextParallel,
}

/// A new group identity: 128 bytes to hand to every rank's `mla_cp_create`.
/// `MLA_ERR_UNSUPPORTED` when no NCCL library is found.
///
/// # Safety
/// `id` points to 128 writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_cp_unique_id(id: *mut u8) -> c_int {
    guard(|| {
        if id.is_null() {
            return Err(MlaError::NullArgument { field: "id" });
        }
        let made = ContextParallel::unique_id()?;
        // SAFETY: the caller's 128 bytes.
        unsafe { std::ptr::copy_nonoverlapping(made.0.as_ptr(), id, 128) };
        Ok(())
    })
}

/// Joins group `id` as `rank` of `ranks` on the runtime's device, for combines of up to
/// `max_rows` query rows of `dtype` outputs (`MLA_BF16` or `MLA_FP16`); waits for every
/// rank, at most `timeout_ms`, and checks that every rank passed the same `ranks`,
/// `max_rows` and `dtype`. Errors name the field; a timeout is `MLA_ERR_CUDA`.
///
/// # Safety
/// `rt` a live runtime handle, `id` 128 readable bytes, `out` a valid pointer.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mla_cp_create(
    rt: *const MlaRuntime,
    rank: u32,
    ranks: u32,
    id: *const u8,
    max_rows: u32,
    dtype: u32,
    timeout_ms: u32,
    out: *mut *mut MlaCp,
) -> c_int {
    guard(|| {
        if rt.is_null() {
            return Err(MlaError::NullHandle { field: "rt" });
        }
        if id.is_null() {
            return Err(MlaError::NullArgument { field: "id" });
        }
        if out.is_null() {
            return Err(MlaError::NullArgument { field: "out" });
        }
        let dtype = match dtype {
            MLA_BF16 => ElemType::Bf16,
            MLA_FP16 => ElemType::Fp16,
            other => return Err(MlaError::shape("dtype", "MLA_BF16 or MLA_FP16", other)),
        };
        let mut bytes = [0u8; 128];
        // SAFETY: the caller's 128 bytes.
        unsafe { std::ptr::copy_nonoverlapping(id, bytes.as_mut_ptr(), 128) };
        // SAFETY: checked non-null; the caller guarantees it is live.
        let rt = unsafe { &(*rt).rt };
        let cp = ContextParallel::new(
            rt,
            rank as usize,
            ranks as usize,
            &crate::NcclId(bytes),
            max_rows as usize,
            dtype,
            std::time::Duration::from_millis(u64::from(timeout_ms)),
        )?;
        // SAFETY: checked non-null.
        unsafe { *out = Box::into_raw(Box::new(MlaCp { cp })) };
        Ok(())
    })
}

/// One context-parallel decode step on this rank (`ContextParallel::decode_raw`): `plan`
/// (sharded for this rank of the group, `mla_plan_set_shard`) decodes `args` into
/// `args->out` / `args->lse`, then every rank's are gathered and merged into `out`
/// (`[batch, s_q, heads, 512]` row-major, the plan's output dtype) and `lse`
/// (`[batch, s_q, heads]` f32) on `stream`. Capturable; `mla_cp_wait` bounds the wait.
///
/// # Safety
/// As `mla_decode_run`; `cp` a live group handle made on the same runtime; `out` and
/// `lse` valid for the shapes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_cp_decode(
    rt: *const MlaRuntime,
    cp: *mut MlaCp,
    plan: *const MlaPlan,
    args: *const MlaDecodeArgs,
    out: u64,
    lse: u64,
    stream: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: forwarded from the caller.
        let (rt, plan) = unsafe { handles(rt, plan)? };
        if cp.is_null() {
            return Err(MlaError::NullHandle { field: "cp" });
        }
        if args.is_null() {
            return Err(MlaError::NullArgument { field: "args" });
        }
        // SAFETY: checked non-null; the caller guarantees validity.
        let req = request_of(plan, unsafe { &*args });
        let [b, s, h, _] = req.out.shape;
        let out_v = TensorView::contiguous(out, req.out.dtype, [b, s, h, D_V]);
        let lse_v = TensorView::contiguous(lse, ElemType::F32, [b, s, h]);
        // SAFETY: forwarded from the caller; cp checked non-null and not shared.
        unsafe {
            (*cp).cp.decode_raw(
                rt,
                stream as cudarc::driver::sys::CUstream,
                plan,
                &req,
                &out_v,
                &lse_v,
            )?
        };
        Ok(())
    })
}

/// Waits for `stream`'s work at most the group's timeout; an NCCL error or a peer that did
/// not take part aborts the group (`MLA_ERR_CUDA`; later calls on it fail).
///
/// # Safety
/// `cp` a live group handle, `stream` a stream of its runtime's context (null: legacy).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_cp_wait(cp: *mut MlaCp, stream: *mut c_void) -> c_int {
    guard(|| {
        if cp.is_null() {
            return Err(MlaError::NullHandle { field: "cp" });
        }
        // SAFETY: checked non-null; forwarded from the caller.
        unsafe { (*cp).cp.wait_raw(stream as cudarc::driver::sys::CUstream) }
    })
}

/// # Safety
/// `cp` is null or a handle from `mla_cp_create`, not used afterwards (its last eager
/// combine is waited for, at most the group's timeout).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mla_cp_destroy(cp: *mut MlaCp) {
    destroy(cp);
}

/// The decode request the C args describe for `plan` (shapes from the plan's config).
fn request_of(plan: &DecodePlan, a: &MlaDecodeArgs) -> DecodeRequest<'static> {
    request_split_of(plan, a, &MlaSplitArgs::default()).0
}
