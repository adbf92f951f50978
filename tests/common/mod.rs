//! Shared setup of the GPU test files: the device (or a loud skip), the seed, and
//! references computed on all CPU cores.
#![allow(dead_code)]

use std::sync::Arc;

use cudarc::driver::CudaStream;
use mla::{MlaError, Runtime};
use mla_dev::harness::{CaseSpec, HostCase};
use mla_dev::oracle::OracleOutput;
use mla_dev::rng::SplitMix64;

/// The runtime on device 0, or `None` after printing why the GPU tests are skipped.
pub fn gpu(test: &str) -> Option<(Runtime, Arc<CudaStream>)> {
    match mla::load(0) {
        Ok(rt) => {
            let stream = rt.new_stream().expect("stream");
            eprintln!(
                "[{test}] {} -> {} ({:?})",
                rt.device(),
                rt.variant().name(),
                rt.form()
            );
            Some((rt, stream))
        }
        Err(e @ (MlaError::NoDriver(_) | MlaError::NoDevice(_))) => {
            loud(&format!("SKIPPED GPU test {test}: {e}"));
            None
        }
        Err(e) => panic!("[{test}] loading the kernels failed: {e}"),
    }
}

/// A fresh seed (or `MLA_SEED` to reproduce a run), printed.
pub fn seed(test: &str) -> u64 {
    let seed = std::env::var("MLA_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(SplitMix64::fresh_seed);
    eprintln!("[{test}] seed = {seed} (rerun with MLA_SEED={seed})");
    seed
}

/// Builds every case's inputs and references on all cores. Case `i` draws its data from
/// `SplitMix64::new(seed ^ i * K)` so that results do not depend on the thread count.
pub fn prepare(specs: &[CaseSpec], seed: u64) -> Vec<(HostCase, (OracleOutput, OracleOutput))> {
    prepare_with(specs, seed, &|_| {})
}

/// [`prepare`] with `edit` applied to each case's inputs before its references are computed.
pub fn prepare_with(
    specs: &[CaseSpec],
    seed: u64,
    edit: &(dyn Fn(&mut HostCase) + Sync),
) -> Vec<(HostCase, (OracleOutput, OracleOutput))> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mut slots: Vec<Option<(HostCase, (OracleOutput, OracleOutput))>> =
        (0..specs.len()).map(|_| None).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(&mut slots);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= specs.len() {
                        break;
                    }
                    let mut rng =
                        SplitMix64::new(seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                    let mut h = HostCase::random(&specs[i], &mut rng);
                    edit(&mut h);
                    let refs = h.references();
                    results.lock().unwrap()[i] = Some((h, refs));
                }
            });
        }
    });
    slots.into_iter().map(|s| s.unwrap()).collect()
}

/// Writes to the process's stderr directly, past libtest's capture of `eprintln!`, so a
/// skip is visible in a plain `cargo test` run.
/// Prints the failures of `test` (run with `seed`) and fails the test if there are any.
pub fn assert_no_failures(test: &str, seed: u64, failures: &[String]) {
    eprintln!("[{test}] {} failures (seed {seed})", failures.len());
    for f in failures {
        eprintln!("  FAIL {f}");
    }
    assert!(failures.is_empty());
}

pub fn loud(msg: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "\n!!! {msg} !!!");
}
