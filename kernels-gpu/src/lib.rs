//! MLA decode kernels, written in Rust for `nvptx64-nvidia-cuda`.
//!
//! This file holds only the entry points: one `extern "ptx-kernel"` function per kernel
//! symbol of [`mla_abi::names`], each taking its params struct by value and forwarding to
//! the generic body in its role's module. Instructions live in [`arch`].
#![no_std]
#![feature(abi_ptx, asm_experimental_arch, stdarch_nvptx)]
#![deny(unsafe_op_in_unsafe_fn)]
#![allow(clippy::missing_safety_doc)]

/// Expands `$body` once per listed index, with `$i` bound to it: register arrays are then
/// indexed by constants only (a runtime index would send them to local memory).
macro_rules! unroll {
    ($i:ident in [$($n:literal),*] $body:block) => {
        $( { let $i: usize = $n; $body } )*
    };
}

pub mod arch;
pub mod combine;
pub mod decode;
pub mod elem;
pub mod merge;
pub mod paged;
#[cfg(mla_primitives)]
pub mod primitives;
pub mod schedule;

use decode::DecodeKind;
use elem::{Bf16, Fp16};
use mla_abi::{
    AppendParams, CombineParams, DecodeParams, GatherParams, ScheduleParams, combine_tile,
};
use paged::RowFormat;

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // Unreachable with -Cpanic=immediate-abort; present for the rlib to type-check.
    loop {}
}

macro_rules! combine_kernel {
    ($name:ident, $out:ty, $unroll:expr, $rows:expr) => {
        /// A combine entry point: see [`combine`].
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: CombineParams) {
            arch::grid_dep_wait();
            // SAFETY: launched by the host with the documented grid on validated params.
            unsafe { combine::combine::<$out, { $unroll }, { $rows }>(p) }
        }
    };
}

combine_kernel!(
    mla_combine_bf16,
    Bf16,
    combine_tile::UNROLL_NARROW,
    combine_tile::ROWS_NARROW
);
combine_kernel!(
    mla_combine_fp16,
    Fp16,
    combine_tile::UNROLL_NARROW,
    combine_tile::ROWS_NARROW
);
combine_kernel!(mla_combine_wide_bf16, Bf16, combine_tile::UNROLL_WIDE, 1);
combine_kernel!(mla_combine_wide_fp16, Fp16, combine_tile::UNROLL_WIDE, 1);

/// `mla_merge_bf16`: see [`merge`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn mla_merge_bf16(p: mla_abi::MergeParams) {
    // SAFETY: launched by the host with the documented grid on validated params.
    unsafe { merge::merge::<Bf16>(p) }
}

/// `mla_merge_fp16`: see [`merge`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn mla_merge_fp16(p: mla_abi::MergeParams) {
    // SAFETY: launched by the host with the documented grid on validated params.
    unsafe { merge::merge::<Fp16>(p) }
}

/// Every decode kernel's first step: the host launches decodes with programmatic
/// dependent launch (sm_90+), so the decode waits for the kernel before it (the split
/// schedule, or whatever the caller ran: Q and the cache may be its
/// output), then lets the combine after it start its CTAs on SMs this grid leaves free.
#[inline(always)]
fn decode_entry() {
    arch::grid_dep_wait();
    arch::grid_dep_launch_dependents();
}

macro_rules! decode_kernel {
    ($name:ident, $name16:ident, $ref_name:ident, $kind:ident, $mma:ty, $q_fp8:expr, $kv_fp8:expr) => {
        pub struct $kind;
        impl DecodeKind for $kind {
            type Mma = $mma;
            const Q_FP8: bool = $q_fp8;
            const KV_FP8: bool = $kv_fp8;
        }
        /// A decode entry point: see [`decode`].
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: DecodeParams) {
            decode_entry();
            // SAFETY: launched by the host with the documented grid on validated params.
            unsafe { decode::decode::<$kind, decode::M64>(p) }
        }
        /// The 16-row-tile decode of the same dtypes: see [`decode`].
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name16(p: DecodeParams) {
            decode_entry();
            // SAFETY: launched by the host with the documented grid on validated params.
            unsafe { decode::decode::<$kind, decode::M16>(p) }
        }
        /// The reference decode of the same dtypes: see [`decode::reference`].
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $ref_name(p: DecodeParams) {
            decode_entry();
            // SAFETY: launched by the host with the documented grid on validated params.
            unsafe { decode::reference::decode_reference::<$kind>(p) }
        }
    };
}

decode_kernel!(
    mla_decode_mma_bf16,
    mla_decode_mma16_bf16,
    mla_decode_ref_bf16,
    DecodeBf16,
    Bf16,
    false,
    false
);
decode_kernel!(
    mla_decode_mma_fp16,
    mla_decode_mma16_fp16,
    mla_decode_ref_fp16,
    DecodeFp16,
    Fp16,
    false,
    false
);
decode_kernel!(
    mla_decode_mma_fp8kv_bf16q,
    mla_decode_mma16_fp8kv_bf16q,
    mla_decode_ref_fp8kv_bf16q,
    DecodeFp8KvBf16Q,
    Bf16,
    false,
    true
);
decode_kernel!(
    mla_decode_mma_fp8,
    mla_decode_mma16_fp8,
    mla_decode_ref_fp8,
    DecodeFp8,
    Bf16,
    true,
    true
);

macro_rules! paged_kernel {
    ($name:ident, $body:ident, $params:ty, $fmt:expr) => {
        /// A paged-KV entry point: see [`paged`].
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: $params) {
            // SAFETY: launched by the host with the documented grid on validated params.
            unsafe { paged::$body(p, $fmt) }
        }
    };
}

paged_kernel!(mla_append_bf16, append, AppendParams, RowFormat::Half);
paged_kernel!(mla_append_fp16, append, AppendParams, RowFormat::Half);
paged_kernel!(
    mla_append_fp8_from_bf16,
    append,
    AppendParams,
    RowFormat::Bf16ToFp8
);
paged_kernel!(mla_gather_bf16, gather, GatherParams, RowFormat::Half);
paged_kernel!(mla_gather_fp16, gather, GatherParams, RowFormat::Half);
paged_kernel!(mla_gather_fp8, gather, GatherParams, RowFormat::Fp8);
paged_kernel!(
    mla_gather_fp8_to_bf16,
    gather,
    GatherParams,
    RowFormat::Fp8ToBf16
);

/// `mla_decode_wg_bf16`: see [`decode::wg`] (sm_90a image only).
/// The 32-row fp8-cache decodes (`decode::f8` with two row groups): in the sm_90a image.
#[cfg(mla_wgmma)]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn mla_decode_mma32_fp8kv_bf16q(p: DecodeParams) {
    decode_entry();
    unsafe { decode::f8::decode_fp8::<DecodeFp8KvBf16Q, 2>(p) }
}

#[cfg(mla_wgmma)]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn mla_decode_mma32_fp8(p: DecodeParams) {
    decode_entry();
    unsafe { decode::f8::decode_fp8::<DecodeFp8, 2>(p) }
}

#[cfg(mla_wgmma)]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn mla_decode_wg_bf16(p: DecodeParams) {
    decode_entry();
    // SAFETY: launched by the host with the documented grid on validated bf16 params.
    unsafe { decode::wg::decode_wg::<DecodeBf16>(p) }
}

/// `mla_decode_wg_fp8kv_bf16q`: see [`decode::wg`] (sm_90a image only).
#[cfg(mla_wgmma)]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn mla_decode_wg_fp8kv_bf16q(p: DecodeParams) {
    decode_entry();
    // SAFETY: launched by the host with the documented grid on validated params (bf16 Q,
    // fp8 e4m3 cache).
    unsafe { decode::wg::decode_wg::<DecodeFp8KvBf16Q>(p) }
}

/// `mla_decode_wg_fp8`: see [`decode::wg`] (sm_90a image only). fp8 Q widens exactly to
/// bf16 as it loads, then runs as the fp8-cache kernel with bf16 Q.
#[cfg(mla_wgmma)]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn mla_decode_wg_fp8(p: DecodeParams) {
    decode_entry();
    // SAFETY: launched by the host with the documented grid on validated params (fp8 e4m3
    // Q and cache).
    unsafe { decode::wg::decode_wg::<DecodeFp8>(p) }
}

/// A TMA decode entry (`decode::tma`, sm_90a image only) for kind `$kind`. `tmap` is the
/// cache's tensor map by value: the copies are issued from the parameter's own address
/// (generic, through `cvta.param`), as `__grid_constant__` parameters are in CUDA C++, so
/// the map is never copied to local or global memory.
macro_rules! tma_decode_kernel {
    ($name:ident, fn $body:path) => {
        /// A TMA decode entry point: see [`decode::tma`].
        #[cfg(mla_wgmma)]
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: DecodeParams, _tmap: mla_abi::TensorMap) {
            decode_entry();
            let tmap: u64;
            // SAFETY: names this entry's own second parameter (LLVM's `<entry>_param_1`;
            // ptxas rejects the image if it does not exist) and only takes its address.
            unsafe {
                core::arch::asm!(
                    concat!("mov.b64 {a}, ", stringify!($name), "_param_1;"),
                    "cvta.param.u64 {a}, {a};",
                    a = out(reg64) tmap,
                    options(pure, nomem, nostack),
                );
            }
            // SAFETY: launched by the host with the documented grid on validated params
            // (bf16 Q with a bf16 or fp8 e4m3 cache, or fp8 Q with an fp8 cache; pages of
            // at least TMA_MIN_PAGE tokens but in the `cp.async` form) and the cache's
            // tensor map (zeroed and unread in the `cp.async` form).
            unsafe { $body(p, tmap as *const u8) }
        }
    };
    ($name:ident, $kind:ty) => {
        tma_decode_kernel!($name, fn decode::tma::decode_tma::<$kind>);
    };
}

tma_decode_kernel!(mla_decode_tma_bf16, DecodeBf16);
tma_decode_kernel!(mla_decode_tma_fp8kv_bf16q, DecodeFp8KvBf16Q);
tma_decode_kernel!(mla_decode_tma_fp8, DecodeFp8);

/// A decode kind of the TMA decodes only: with `cp` its copies are made with `cp.async`
/// (`DecodeKind::KV_CP`: pages of fewer than `TMA_MIN_PAGE` tokens, and cache layouts the
/// tensor map does not take); with `list` its 64-row decode walks the work list
/// (`DecodeKind::LIST`).
macro_rules! tma_kind {
    ($(#[$doc:meta])* $kind:ident, q_fp8: $q_fp8:expr, kv_fp8: $kv_fp8:expr,
     cp: $cp:expr, list: $list:expr) => {
        $(#[$doc])*
        #[cfg(mla_wgmma)]
        pub struct $kind;
        #[cfg(mla_wgmma)]
        impl DecodeKind for $kind {
            type Mma = Bf16;
            const Q_FP8: bool = $q_fp8;
            const KV_FP8: bool = $kv_fp8;
            const KV_CP: bool = $cp;
            const LIST: bool = $list;
        }
    };
}

tma_kind!(
    /// bf16 on the work list.
    DecodeBf16List, q_fp8: false, kv_fp8: false, cp: false, list: true
);
tma_kind!(
    /// An fp8 e4m3 cache under bf16 Q on the work list.
    DecodeFp8KvBf16QList, q_fp8: false, kv_fp8: true, cp: false, list: true
);
tma_kind!(
    /// fp8 Q and an fp8 e4m3 cache on the work list.
    DecodeFp8List, q_fp8: true, kv_fp8: true, cp: false, list: true
);
tma_decode_kernel!(mla_decode_tma_bf16_list, DecodeBf16List);
tma_decode_kernel!(mla_decode_tma_fp8kv_bf16q_list, DecodeFp8KvBf16QList);
tma_decode_kernel!(mla_decode_tma_fp8_list, DecodeFp8List);

tma_kind!(
    /// bf16: the 64-row decode's block-ahead form, the small-row decode's producer warpgroup.
    DecodeBf16Cp, q_fp8: false, kv_fp8: false, cp: true, list: false
);
tma_kind!(
    /// An fp8 e4m3 cache under bf16 Q: the e4m3 path's pair loop, each warpgroup copying its
    /// own stage.
    DecodeFp8KvBf16QCp, q_fp8: false, kv_fp8: true, cp: true, list: false
);
tma_kind!(
    /// fp8 Q and an fp8 e4m3 cache, as [`DecodeFp8KvBf16QCp`].
    DecodeFp8Cp, q_fp8: true, kv_fp8: true, cp: true, list: false
);
tma_decode_kernel!(mla_decode_tma_bf16_cp, DecodeBf16Cp);
tma_decode_kernel!(mla_decode_tma_fp8kv_bf16q_cp, DecodeFp8KvBf16QCp);
tma_decode_kernel!(mla_decode_tma_fp8_cp, DecodeFp8Cp);
tma_decode_kernel!(mla_decode_tma32_bf16_cp, fn decode::tma32::decode_tma32::<DecodeBf16Cp>);
tma_decode_kernel!(mla_decode_tma32_bf16, fn decode::tma32::decode_tma32::<DecodeBf16>);
tma_decode_kernel!(
    mla_decode_tma32_fp8kv_bf16q,
    fn decode::tma32::decode_tma32::<DecodeFp8KvBf16Q>
);
tma_decode_kernel!(mla_decode_tma32_fp8, fn decode::tma32::decode_tma32::<DecodeFp8>);

/// `mla_schedule`: see [`schedule`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn mla_schedule(p: ScheduleParams) {
    // The decode after it may start its CTAs now (it waits for this grid's writes).
    arch::grid_dep_launch_dependents();
    // SAFETY: launched by the host with one CTA and the documented shared memory.
    unsafe { schedule::schedule(p) }
}

/// `mla_prim_wgmma_m64n64k16_bf16`: see [`primitives`] (primitives image only).
#[cfg(mla_primitives)]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn mla_prim_wgmma_m64n64k16_bf16(
    p: mla_abi::primitives::WgmmaPrimParams,
) {
    // SAFETY: launched by the primitive test with one warpgroup and 4 KB of shared memory.
    unsafe { primitives::wgmma_m64n64k16(p) }
}

macro_rules! prim_kernel {
    ($name:ident, $body:ident, $params:ty) => {
        /// A primitive test kernel: see [`primitives`] (primitives image only).
        #[cfg(mla_primitives)]
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: $params) {
            // SAFETY: launched by the primitive tests with the documented grid, block and
            // shared memory.
            unsafe { primitives::$body(p) }
        }
    };
}

prim_kernel!(
    mla_prim_wgmma_sw128_kmajor,
    wgmma_sw128_kmajor,
    mla_abi::primitives::WgmmaLayoutParams
);
prim_kernel!(
    mla_prim_wgmma_sw128_mn_b,
    wgmma_sw128_mn_b,
    mla_abi::primitives::WgmmaLayoutParams
);
prim_kernel!(
    mla_prim_wgmma_rs_mn_b,
    wgmma_rs_mn_b,
    mla_abi::primitives::WgmmaLayoutParams
);
prim_kernel!(
    mla_prim_wgmma_e4m3,
    wgmma_e4m3,
    mla_abi::primitives::E4m3PrimParams
);
prim_kernel!(
    mla_prim_bulk_copy,
    bulk_copy,
    mla_abi::primitives::BulkCopyParams
);
prim_kernel!(
    mla_prim_exchange,
    exchange,
    mla_abi::primitives::ExchangeParams
);
prim_kernel!(
    mla_prim_tma_slabs,
    tma_slabs,
    mla_abi::primitives::TmaSlabsParams
);
