//! The dynamic shared-memory buffer and 32-bit shared-window accesses.

use core::arch::{asm, global_asm};

// The one `.extern` the PTX may hold: the driver resolves the dynamic shared buffer.
global_asm!(".extern .shared .align 128 .b8 mla_dyn_smem[];");

/// 32-bit shared-window address of the dynamic shared buffer's first byte.
#[inline(always)]
pub fn smem_base() -> u32 {
    let r: u32;
    // SAFETY: taking the address of a symbol has no side effect.
    unsafe { asm!("mov.u32 {r}, mla_dyn_smem;", r = out(reg32) r, options(nostack, pure, nomem)) }
    r
}

/// `st.shared.b32 [addr], v`.
///
/// # Safety
/// `addr` is 4-byte aligned and inside the launch's dynamic shared memory.
#[inline(always)]
pub unsafe fn st_shared_u32(addr: u32, v: u32) {
    // SAFETY: the caller guarantees the address is valid.
    unsafe {
        asm!("st.shared.b32 [{a}], {v};", a = in(reg32) addr, v = in(reg32) v, options(nostack))
    }
}

/// `st.shared.b16 [addr], v` (the low 16 bits of `v`).
///
/// # Safety
/// `addr` is 2-byte aligned and inside the launch's dynamic shared memory.
#[inline(always)]
pub unsafe fn st_shared_u16(addr: u32, v: u32) {
    let h = v as u16;
    // SAFETY: the caller guarantees the address is valid.
    unsafe {
        asm!("st.shared.b16 [{a}], {v};", a = in(reg32) addr, v = in(reg16) h, options(nostack))
    }
}

/// `st.shared.f32 [addr], v`.
///
/// # Safety
/// As [`st_shared_u32`].
#[inline(always)]
pub unsafe fn st_shared_f32(addr: u32, v: f32) {
    // SAFETY: the caller guarantees the address is valid.
    unsafe {
        asm!("st.shared.f32 [{a}], {v};", a = in(reg32) addr, v = in(reg32) v, options(nostack))
    }
}

/// `@p st.shared.f32 [addr], v` with `p = (pred != 0)`: a store made by some lanes only,
/// without a branch (so a barrier after it stays in converged code).
///
/// # Safety
/// As [`st_shared_u32`] (for the lanes that store).
#[inline(always)]
pub unsafe fn st_shared_f32_if(addr: u32, v: f32, pred: u32) {
    // SAFETY: the caller guarantees the address is valid where the store happens.
    unsafe {
        asm!(
            "{{",
            ".reg .pred p;",
            "setp.ne.b32 p, {c}, 0;",
            "@p st.shared.f32 [{a}], {v};",
            "}}",
            a = in(reg32) addr,
            v = in(reg32) v,
            c = in(reg32) pred,
            options(nostack)
        )
    }
}

/// `ld.shared.f32`.
///
/// # Safety
/// As [`st_shared_u32`].
#[inline(always)]
pub unsafe fn ld_shared_f32(addr: u32) -> f32 {
    let r: f32;
    // SAFETY: the caller guarantees the address is valid.
    unsafe {
        asm!("ld.shared.f32 {r}, [{a}];", r = out(reg32) r, a = in(reg32) addr, options(nostack, readonly))
    }
    r
}

/// `st.shared.u64 [addr], v`.
///
/// # Safety
/// `addr` is 8-byte aligned and inside the launch's dynamic shared memory.
#[inline(always)]
pub unsafe fn st_shared_u64(addr: u32, v: u64) {
    // SAFETY: the caller guarantees the address is valid.
    unsafe {
        asm!("st.shared.u64 [{a}], {v};", a = in(reg32) addr, v = in(reg64) v, options(nostack))
    }
}

/// `ld.shared.u64`.
///
/// # Safety
/// As [`st_shared_u64`].
#[inline(always)]
pub unsafe fn ld_shared_u64(addr: u32) -> u64 {
    let r: u64;
    // SAFETY: the caller guarantees the address is valid.
    unsafe {
        asm!("ld.shared.u64 {r}, [{a}];", r = out(reg64) r, a = in(reg32) addr, options(nostack, readonly))
    }
    r
}

/// `st.shared.v4.b32 [addr], {a, b, c, d}`.
///
/// # Safety
/// `addr` is 16-byte aligned and inside the launch's dynamic shared memory.
#[inline(always)]
pub unsafe fn st_shared_v4(addr: u32, v: [u32; 4]) {
    // SAFETY: the caller guarantees the address is valid.
    unsafe {
        asm!("st.shared.v4.b32 [{a}], {{{x}, {y}, {z}, {w}}};", a = in(reg32) addr,
            x = in(reg32) v[0], y = in(reg32) v[1], z = in(reg32) v[2], w = in(reg32) v[3], options(nostack))
    }
}

/// `@p st.shared.v4.b32 [addr], v` with `p = (pred != 0)`: [`st_shared_f32_if`]'s 16-byte
/// form.
///
/// # Safety
/// As [`st_shared_v4`] (for the lanes that store).
#[inline(always)]
pub unsafe fn st_shared_v4_if(addr: u32, v: [u32; 4], pred: u32) {
    // SAFETY: the caller guarantees the address is valid where the store happens.
    unsafe {
        asm!(
            "{{",
            ".reg .pred p;",
            "setp.ne.b32 p, {c}, 0;",
            "@p st.shared.v4.b32 [{a}], {{{x}, {y}, {z}, {w}}};",
            "}}",
            a = in(reg32) addr,
            x = in(reg32) v[0],
            y = in(reg32) v[1],
            z = in(reg32) v[2],
            w = in(reg32) v[3],
            c = in(reg32) pred,
            options(nostack)
        )
    }
}

/// `ld.shared.v4.b32`.
///
/// # Safety
/// As [`st_shared_v4`].
#[inline(always)]
pub unsafe fn ld_shared_v4(addr: u32) -> [u32; 4] {
    let (x, y, z, w): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees the address is valid.
    unsafe {
        asm!("ld.shared.v4.b32 {{{x}, {y}, {z}, {w}}}, [{a}];", a = in(reg32) addr,
            x = out(reg32) x, y = out(reg32) y, z = out(reg32) z, w = out(reg32) w, options(nostack, readonly))
    }
    [x, y, z, w]
}

/// `ld.global.nc.v4.b32`: a 16-byte read-only global load.
///
/// # Safety
/// `ptr` is 16-byte aligned, readable, and not written during the kernel.
#[inline(always)]
pub unsafe fn ld_global_nc_v4(ptr: *const u8) -> [u32; 4] {
    let (x, y, z, w): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees the address is valid and read-only.
    unsafe {
        asm!("ld.global.nc.v4.b32 {{{x}, {y}, {z}, {w}}}, [{p}];", p = in(reg64) ptr,
            x = out(reg32) x, y = out(reg32) y, z = out(reg32) z, w = out(reg32) w, options(nostack, readonly))
    }
    [x, y, z, w]
}

/// `ld.global.nc.v2.b32`: an 8-byte read-only global load.
///
/// # Safety
/// `ptr` is 8-byte aligned, readable, and not written during the kernel.
#[inline(always)]
pub unsafe fn ld_global_nc_v2(ptr: *const u8) -> [u32; 2] {
    let (x, y): (u32, u32);
    // SAFETY: the caller guarantees the address is valid and read-only.
    unsafe {
        asm!("ld.global.nc.v2.b32 {{{x}, {y}}}, [{p}];", p = in(reg64) ptr,
            x = out(reg32) x, y = out(reg32) y, options(nostack, readonly))
    }
    [x, y]
}

/// `ld.global.nc.b32`: a 4-byte read-only global load.
///
/// # Safety
/// `ptr` is 4-byte aligned, readable, and not written during the kernel.
#[inline(always)]
pub unsafe fn ld_global_nc_b32(ptr: *const u8) -> u32 {
    let x: u32;
    // SAFETY: the caller guarantees the address is valid and read-only.
    unsafe {
        asm!("ld.global.nc.b32 {x}, [{p}];", p = in(reg64) ptr, x = out(reg32) x,
            options(nostack, readonly))
    }
    x
}

/// `st.global.v2.b32`: an 8-byte global store (a `[f32; 2]` store through a pointer is
/// only 4-byte aligned to the compiler, which then splits it in two).
///
/// # Safety
/// `ptr` is a valid, 8-byte aligned global address.
#[inline(always)]
pub unsafe fn st_global_v2(ptr: *mut u8, v: [u32; 2]) {
    // SAFETY: the caller guarantees the address is valid and aligned.
    unsafe {
        asm!("st.global.v2.b32 [{p}], {{{x}, {y}}};", p = in(reg64) ptr,
            x = in(reg32) v[0], y = in(reg32) v[1], options(nostack))
    }
}

/// `ld.volatile.global.v4.f32`: a 16-byte global load that sees this thread's earlier
/// stores and stays in program order with the other volatile accesses (a caller that
/// reads, updates and writes back in batches keeps one batch in registers at a time).
///
/// # Safety
/// `ptr` is 16-byte aligned and readable.
#[inline(always)]
pub unsafe fn ld_global_v4_f32(ptr: *const f32) -> [f32; 4] {
    let (x, y, z, w): (f32, f32, f32, f32);
    // SAFETY: the caller guarantees the address is valid.
    unsafe {
        asm!("ld.volatile.global.v4.f32 {{{x}, {y}, {z}, {w}}}, [{p}];", p = in(reg64) ptr,
            x = out(reg32) x, y = out(reg32) y, z = out(reg32) z, w = out(reg32) w, options(nostack, readonly))
    }
    [x, y, z, w]
}

/// `st.volatile.global.v4.f32`: a 16-byte global store, in program order with the other
/// volatile accesses ([`ld_global_v4_f32`]).
///
/// # Safety
/// `ptr` is 16-byte aligned and writable.
#[inline(always)]
pub unsafe fn st_global_v4_f32(ptr: *mut f32, v: [f32; 4]) {
    // SAFETY: the caller guarantees the address is valid.
    unsafe {
        asm!("st.volatile.global.v4.f32 [{p}], {{{x}, {y}, {z}, {w}}};", p = in(reg64) ptr,
            x = in(reg32) v[0], y = in(reg32) v[1], z = in(reg32) v[2], w = in(reg32) v[3], options(nostack))
    }
}

/// `st.global.v4.b32`: a 16-byte global store.
///
/// # Safety
/// `ptr` is 16-byte aligned and writable.
#[inline(always)]
pub unsafe fn st_global_v4(ptr: *mut u8, v: [u32; 4]) {
    // SAFETY: the caller guarantees the address is valid.
    unsafe {
        asm!("st.global.v4.b32 [{p}], {{{x}, {y}, {z}, {w}}};", p = in(reg64) ptr,
            x = in(reg32) v[0], y = in(reg32) v[1], z = in(reg32) v[2], w = in(reg32) v[3], options(nostack))
    }
}
