//! Host runtime of the MLA decode kernels.
//!
//! The API is what the crate root re-exports: [`Runtime`] (load, streams, append/gather,
//! merge), [`DecodeConfig`] -> [`DecodePlan`] (`run`, `schedule_step` + `run_layer`,
//! `run_split`, `set_shard`, checked mode), [`DecodeRequest`] and [`TensorView`], [`Tactic`]
//! (`Runtime::default_tactic` is the measured choice), [`Shard`] and `ContextParallel` (feature `nccl`),
//! [`MlaError`]. The modules are public for the `mla` crate, its tests and tools; they are
//! hidden from the docs and are not part of the API:
//! - `validate`: every request is checked before any device pointer is touched.
//! - `plan`: pure functions (split counts, chunk ranges, workspace sizes); no CUDA types.
//! - `choice`: which kernels a plan runs, decided once at plan time (the worked example
//!   there answers "which kernel runs for this shape, and why").
//! - `module`: device discovery, kernel image choice, module load, symbol resolution.
//! - `launch`: the only place that launches kernels.
//! - `decoder`: the plan / run serving API (on-device split scheduling, graph-safe runs).
//! - `gate`, `tactic`, `autotune`: what each backend supports, the tunable choices, and the
//!   tuner with its persistent cache.
//!
//! The test support (the f64 oracle, element conversions, the seeded generator) is the
//! workspace's dev-only crate `mla-dev`, not part of this one.
#![deny(unsafe_op_in_unsafe_fn)]

#[doc(hidden)]
pub mod autotune;
#[doc(hidden)]
pub mod choice;
#[cfg(feature = "nccl")]
#[doc(hidden)]
pub mod cp;
#[doc(hidden)]
pub mod decoder;
#[doc(hidden)]
pub mod error;
#[doc(hidden)]
pub mod gate;
#[doc(hidden)]
pub mod launch;
#[doc(hidden)]
pub mod module;
#[doc(hidden)]
pub mod plan;
#[doc(hidden)]
pub mod request;
#[doc(hidden)]
pub mod tactic;
#[doc(hidden)]
pub mod tensor;
#[doc(hidden)]
pub mod tmap;
#[doc(hidden)]
pub mod validate;

#[cfg(feature = "nccl")]
pub use cp::{ContextParallel, NcclId};
pub use decoder::{DecodeConfig, DecodeFault, DecodePlan, PlanInfo};
pub use error::{MlaError, Result};
pub use gate::Backend;
pub use launch::{DecodeWorkspace, STEP_SLOTS};
pub use mla_abi::Shard;
pub use module::{
    DeviceInfo, ImageForm, KernelImages, KernelResources, LoadOptions, Runtime, Variant,
};
pub use request::{
    AppendRequest, DecodeDtypes, DecodeRequest, DecodeShape, GatherRequest, HostMirror,
    MergeRequest, MergeShape, PagedShape, Scales, SplitParts,
};
pub use tactic::{Switches, Tactic, Tile};
pub use tensor::TensorView;
