//! Every `asm!` and intrinsic of the kernels lives under this module: one small
//! `#[inline(always)]` wrapper per PTX instruction variant, named after it.
//!
//! Conventions: "smem address" means a 32-bit `.shared` window address (what
//! `cp.async`, `ldmatrix` and `ld.shared` take); "generic pointer" means a 64-bit generic
//! address (what plain Rust loads and stores use).

#[cfg(any(mla_primitives, mla_wgmma))]
pub mod bulk;
pub mod cp_async;
pub mod cvt;
pub mod ldmatrix;
pub mod mma;
pub mod smem;
pub mod sync;
#[cfg(any(mla_primitives, mla_wgmma))]
pub mod wgmma;

use core::arch::nvptx;

/// `trap;`: aborts the kernel; the launch's stream reports an error.
#[inline(always)]
pub fn trap() -> ! {
    // SAFETY: trap has no operands and does not return.
    unsafe { core::arch::asm!("trap;", options(nostack, noreturn)) }
}

/// Programmatic dependent launch, first half: waits until the grids this one depends on
/// (the previous kernel in the stream, when the host launched this one with the
/// programmatic-serialization attribute) have completed and their writes are visible.
/// Returns at once otherwise. Every kernel the host launches that way calls this before
/// its first global read or write. No-op on images without `--cfg mla_pdl` (sm_80).
#[inline(always)]
pub fn grid_dep_wait() {
    #[cfg(mla_pdl)]
    // SAFETY: a fence-like wait; touches no memory of ours.
    unsafe {
        core::arch::asm!("griddepcontrol.wait;", options(nostack))
    }
}

/// Programmatic dependent launch, second half: lets the next kernel in the stream (if
/// launched with the attribute) start its CTAs now; they still wait for this grid to
/// complete in [`grid_dep_wait`]. No-op on images without `--cfg mla_pdl`.
#[inline(always)]
pub fn grid_dep_launch_dependents() {
    #[cfg(mla_pdl)]
    // SAFETY: a scheduling hint; touches no memory.
    unsafe {
        core::arch::asm!("griddepcontrol.launch_dependents;", options(nostack))
    }
}

/// `%tid.x`.
#[inline(always)]
pub fn thread_idx_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_thread_idx_x() as u32 }
}

/// `%ctaid.x`.
#[inline(always)]
pub fn block_idx_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_block_idx_x() as u32 }
}

/// `%ctaid.y`.
#[inline(always)]
pub fn block_idx_y() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_block_idx_y() as u32 }
}

/// `%ctaid.z`.
#[inline(always)]
pub fn block_idx_z() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_block_idx_z() as u32 }
}

/// `%nctaid.x`.
#[inline(always)]
pub fn grid_dim_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_grid_dim_x() as u32 }
}

/// `%ntid.x`.
#[inline(always)]
pub fn block_dim_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_block_dim_x() as u32 }
}

/// `atom.global.cas.b32`: writes `new` to `*ptr` if it holds `expected`; returns the old
/// value.
///
/// # Safety
/// `ptr` is a 4-byte aligned global address.
#[inline(always)]
pub unsafe fn atomic_cas_global_i32(ptr: *mut i32, expected: i32, new: i32) -> i32 {
    let old: i32;
    // SAFETY: forwarded from the caller.
    unsafe {
        core::arch::asm!(
            "atom.global.cas.b32 {o}, [{p}], {e}, {n};",
            o = out(reg32) old,
            p = in(reg64) ptr,
            e = in(reg32) expected,
            n = in(reg32) new,
            options(nostack),
        )
    };
    old
}

/// `x`, through a `mov` the compiler may not move or merge: values computed from the result
/// inside a loop stay there instead of being hoisted out and held in registers across it
/// (shared-memory addresses in the `wgmma` decodes, where registers are scarce).
#[inline(always)]
pub fn opaque(x: u32) -> u32 {
    let y: u32;
    // SAFETY: a register move.
    unsafe {
        core::arch::asm!("mov.b32 {y}, {x};", x = in(reg32) x, y = out(reg32) y, options(nomem, nostack))
    };
    y
}

/// `.pragma "nounroll";` as the first statement of a loop body (its header block): ptxas
/// keeps that loop rolled. For cold loops inside a hot path, where unrolled copies only
/// spread the hot code over more instruction-cache lines.
///
/// # Safety
/// First statement of the loop body it is meant for (anywhere else it applies to whatever
/// loop's header it lands in, or nothing).
#[inline(always)]
pub unsafe fn no_unroll() {
    // SAFETY: a compiler directive, no instruction.
    unsafe {
        core::arch::asm!(
            ".pragma \"nounroll\";",
            options(nomem, nostack, preserves_flags)
        )
    };
}
