//! `mla`: MLA (DeepSeek multi-head latent attention) decode over a paged latent KV cache,
//! with GPU kernels written in Rust.
//!
//! This crate is what users depend on. It re-exports the host runtime ([`mla_host`]) and
//! embeds the kernel images that `build.rs` compiled: PTX for `sm_80` (portable, JIT-compiled
//! by the driver on any later GPU), `sm_90a` and `sm_100a`, plus `ptxas`-built cubins for the
//! last two when `ptxas` was available at build time.

pub use mla_abi as abi;
pub use mla_host::*;

#[cfg(feature = "candle")]
pub mod candle;

/// The kernel images built into this library.
pub mod images {
    include!(concat!(env!("OUT_DIR"), "/kernel_images.rs"));

    /// The embedded images in the form the runtime loads them.
    pub fn embedded() -> mla_host::KernelImages {
        mla_host::KernelImages {
            ptx_sm80: PTX_SM_80,
            ptx_sm90a: PTX_SM_90A,
            ptx_sm100a: PTX_SM_100A,
            cubin_sm90a: CUBIN_SM_90A,
            cubin_sm100a: CUBIN_SM_100A,
        }
    }
}

/// Loads the runtime on CUDA device `ordinal` from the embedded kernel images.
pub fn load(ordinal: usize) -> Result<Runtime, MlaError> {
    Runtime::load(ordinal, images::embedded())
}

/// [`load`], but `Ok(None)` after printing why when this machine has no driver or device
/// (for examples and tools that have nothing to do without a GPU).
pub fn load_or_skip(ordinal: usize) -> Result<Option<Runtime>, MlaError> {
    match load(ordinal) {
        Ok(rt) => Ok(Some(rt)),
        Err(e @ (MlaError::NoDriver(_) | MlaError::NoDevice(_))) => {
            println!("no GPU here ({e})");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

// Not API: the C ABI's Rust side (the C API is `src/mla.h`).
#[doc(hidden)]
pub mod capi;
