//! The one error type of the library: every failure is a variant carrying what a caller
//! needs to fix it (the field, what was expected, what was received), never a panic.

use cudarc::driver::DriverError;

#[derive(Debug, thiserror::Error)]
pub enum MlaError {
    /// The CUDA driver library could not be loaded (no NVIDIA driver on this machine).
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    /// The driver loaded but there is no usable device.
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// A tensor's rank, dimension, stride or a scalar is wrong.
    #[error("invalid {field}: expected {expected}, got {got}")]
    InvalidShape {
        field: &'static str,
        expected: String,
        got: String,
    },
    /// A tensor's element type is not the one this request needs.
    #[error("invalid dtype of {field}: expected {expected}, got {got}")]
    DtypeMismatch {
        field: &'static str,
        expected: String,
        got: String,
    },
    /// A valid request this library does not implement (with the reason).
    #[error("unsupported {what}: {got} ({why})")]
    Unsupported {
        what: &'static str,
        got: String,
        why: String,
    },
    /// A device pointer is null where it may not be.
    #[error("{field} is a null device pointer")]
    NullPointer { field: &'static str },
    /// A handle passed to the C ABI (a runtime or a plan) is null.
    #[error("{field} is a null handle")]
    NullHandle { field: &'static str },
    /// A host pointer argument of the C ABI (a config, args or out pointer) is null.
    #[error("{field} is a null pointer argument")]
    NullArgument { field: &'static str },
    /// A device pointer or row stride breaks the alignment the kernels load with.
    #[error(
        "{field} is misaligned: {addr:#x} is not a multiple of {align} bytes (for a tensor its address, for a stride field the stride in bytes)"
    )]
    Misaligned {
        field: &'static str,
        /// The tensor's address, or, where `field` names a stride, that stride in bytes.
        addr: u64,
        align: u64,
    },
    /// An output overlaps an input or another output.
    #[error("{a} overlaps {b}: outputs must not alias any other tensor")]
    Aliasing { a: &'static str, b: &'static str },
    /// A host-visible index is out of range.
    #[error("{field}[{index}] = {got} is out of range: expected {expected}")]
    OutOfRange {
        field: &'static str,
        index: usize,
        expected: String,
        got: i64,
    },
    /// Loading a kernel module (or resolving a symbol in it) failed.
    #[error("loading the {variant} kernel image failed: {detail}")]
    Load { variant: String, detail: String },
    /// A launch (or a kernel attribute call) failed.
    #[error("kernel {kernel}: {source}")]
    Launch {
        kernel: &'static str,
        #[source]
        source: DriverError,
    },
    /// A device allocation failed (typically out of memory).
    #[error("allocating {what} ({bytes} bytes) failed: {source}")]
    Alloc {
        what: &'static str,
        bytes: u64,
        #[source]
        source: DriverError,
    },
    /// Any other driver call failed.
    /// A collective of the context-parallel transport failed, or did not finish in time
    /// (a lost peer): the communicator was aborted.
    #[error("NCCL {op} failed: {detail}")]
    Comm { op: &'static str, detail: String },
    #[error("CUDA driver call failed: {0}")]
    Driver(#[from] DriverError),
}

pub type Result<T, E = MlaError> = std::result::Result<T, E>;

impl MlaError {
    /// An [`MlaError::InvalidShape`] from anything printable.
    pub fn shape(field: &'static str, expected: impl ToString, got: impl ToString) -> Self {
        MlaError::InvalidShape {
            field,
            expected: expected.to_string(),
            got: got.to_string(),
        }
    }
}
