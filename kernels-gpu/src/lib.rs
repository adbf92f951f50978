//! MLA decode kernels, written in Rust for `nvptx64-nvidia-cuda`.
//!
//! This file holds only the entry points: one `extern "ptx-kernel"` function per kernel
//! symbol of [`mla_abi::names`], each taking its params struct by value and forwarding to
//! the generic body in its role's module. Instructions live in [`arch`].
#![no_std]
#![feature(abi_ptx, asm_experimental_arch, stdarch_nvptx)]
#![deny(unsafe_op_in_unsafe_fn)]
#![allow(clippy::missing_safety_doc)]

pub mod arch;
pub mod combine;
pub mod elem;

use elem::{Bf16, Fp16};
use mla_abi::CombineParams;

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // Unreachable with -Cpanic=immediate-abort; present for the rlib to type-check.
    loop {}
}

/// `mla_combine_bf16`: see [`combine`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn mla_combine_bf16(p: CombineParams) {
    // SAFETY: launched by the host with the documented grid on validated params.
    unsafe { combine::combine::<Bf16>(p) }
}

/// `mla_combine_fp16`: see [`combine`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn mla_combine_fp16(p: CombineParams) {
    // SAFETY: launched by the host with the documented grid on validated params.
    unsafe { combine::combine::<Fp16>(p) }
}
