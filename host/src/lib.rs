//! Host runtime of the MLA decode kernels.
//!
//! - [`validate`]: every request is checked before any device pointer is touched.
//! - [`plan`]: pure functions (split counts, chunk ranges, workspace sizes); no CUDA types.
//! - [`module`]: device discovery, kernel image choice, module load, symbol resolution.
//! - [`launch`]: the only place that launches kernels.
//! - [`decoder`]: the plan / run serving API (on-device split scheduling, graph-safe runs).
//! - [`gate`], [`tactic`], [`autotune`]: what each backend supports, the tunable choices, and
//!   the tuner with its persistent cache.
//! - [`oracle`]: the naive f64 CPU reference everything is tested against.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod autotune;
pub mod choice;
#[cfg(feature = "nccl")]
pub mod cp;
pub mod decoder;
pub mod error;
pub mod gate;
pub mod launch;
pub mod module;
pub mod numeric;
pub mod oracle;
pub mod plan;
pub mod request;
pub mod rng;
pub mod tactic;
pub mod tensor;
pub mod tmap;
pub mod validate;

#[cfg(feature = "nccl")]
pub use cp::{ContextParallel, NcclId};
pub use decoder::{DecodeConfig, DecodeFault, DecodePlan, PlanInfo};
pub use error::{MlaError, Result};
pub use launch::DecodeWorkspace;
pub use mla_abi::Shard;
pub use module::{
    DeviceInfo, ImageForm, KernelImages, KernelResources, LoadOptions, Runtime, Variant,
};
pub use request::{
    AppendRequest, DecodeDtypes, DecodeRequest, DecodeShape, GatherRequest, HostMirror,
    MergeRequest, MergeShape, PagedShape, Scales, SplitParts,
};
pub use tensor::TensorView;
