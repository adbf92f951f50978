//! `mla-dev`: the test support of the `mla` workspace, never published. The `mla` crate's
//! tests, examples and benches take it as a dev-dependency, and so do `mla-host`'s tests
//! (for the seeded generator). Its binary is the `mla` CLI (`src/main.rs`: `mla info`,
//! `mla demo`, `mla bench`).
//!
//! - `oracle`: the naive f64 CPU reference of the decode, and the comparison rule the GPU
//!   tests judge kernels by.
//! - `numeric`: element conversions (bf16, fp16, fp8 e4m3 encode and decode, rounding).
//! - `rng`: the seeded generator (SplitMix64).
//! - `harness`: random paged cases, their upload, one decode through the public API, the
//!   check against the oracle.
//! - `bench`: the CUDA-event timings of `mla bench`.

pub mod bench;
pub mod harness;
pub mod numeric;
pub mod oracle;
pub mod rng;
