//! Gating: which decode backend can run a given geometry on a given device, with a typed
//! reason for every refusal, and the ordered registry that picks the first one that accepts.
//!
//! Two questions are asked. [`is_available`] is asked once per plan: can this backend run
//! on this device, for the largest shapes the plan allows ([`Geometry`])? [`is_supported`]
//! is asked per request, for a shape that already passed [`crate::validate`]; it applies
//! the same rules, since a request never exceeds what its plan allowed.
//!
//! Every backend has its own arm in [`Backend::limits`] and in the arch rule even where the
//! numbers agree today, so one backend's limits can change without touching the others.
//!
//! The order of preference is [`Backend::ALL`]; the `MLA_BACKENDS` environment variable
//! replaces or edits it (see [`Registry::parse`]).

use std::fmt;

use mla_abi::{MAX_HEADS, MAX_PAGE_SIZE, MAX_S_Q};

use crate::error::MlaError;
use crate::module::{DeviceInfo, Variant};
use crate::request::{DecodeDtypes, DecodeShape};

/// The environment variable that overrides the order of backends.
pub const ENV_BACKENDS: &str = "MLA_BACKENDS";

/// Largest `gridDim.y` / `gridDim.z` a launch may use; the decode grid puts the batch on y.
const GRID_Z_MAX: usize = 65_535;

/// A decode implementation. The order of preference is the order of [`Backend::ALL`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The `sm_90a` image: Hopper only.
    Sm90a,
    /// The `sm_80` PTX, JIT-compiled by the driver on any GPU of compute capability >= 8.0.
    Portable,
    /// The last resort; it launches the portable image.
    Reference,
}

impl Backend {
    /// Every backend, most preferred first.
    pub const ALL: [Backend; 3] = [Backend::Sm90a, Backend::Portable, Backend::Reference];

    /// The canonical name, as written in `MLA_BACKENDS` and in logs.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sm90a => "sm90a",
            Backend::Portable => "portable",
            Backend::Reference => "reference",
        }
    }

    /// The backend of a canonical name (exact match).
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|b| b.name() == s)
    }

    /// The kernel image this backend launches.
    pub fn variant(self) -> Variant {
        match self {
            Backend::Sm90a => Variant::Sm90a,
            Backend::Portable | Backend::Reference => Variant::Portable,
        }
    }

    /// The shape limits of this backend.
    pub const fn limits(self) -> Limits {
        match self {
            Backend::Sm90a => Limits::KERNELS,
            Backend::Portable => Limits::KERNELS,
            Backend::Reference => Limits::KERNELS,
        }
    }

    /// The devices this backend runs on, and that rule in words (for [`Decline::Arch`]).
    fn arch(self) -> (ArchRule, &'static str) {
        match self {
            Backend::Sm90a => (ArchRule::Exactly(9, 0), "compute capability 9.0 exactly"),
            Backend::Portable => (ArchRule::MajorAtLeast(8), "compute capability 8.0 or newer"),
            Backend::Reference => (ArchRule::MajorAtLeast(8), "compute capability 8.0 or newer"),
        }
    }

    fn runs_dtypes(self, dtypes: DecodeDtypes) -> bool {
        match self {
            Backend::Sm90a | Backend::Portable | Backend::Reference => {
                DecodeDtypes::ALL.contains(&dtypes)
            }
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Upper limits of one backend; every lower limit is 1 (except `max_seq_len`, which may be 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_heads: usize,
    pub max_s_q: usize,
    /// Page sizes are powers of two up to this.
    pub max_page_size: usize,
    pub max_batch: usize,
    pub max_seq_len: usize,
}

impl Limits {
    /// What the `mma.sync` decode kernels take: the ABI limits, the grid's z extent for the
    /// batch, and lengths that fit the kernels' `i32` positions.
    pub const KERNELS: Limits = Limits {
        max_heads: MAX_HEADS as usize,
        max_s_q: MAX_S_Q as usize,
        max_page_size: MAX_PAGE_SIZE as usize,
        max_batch: GRID_Z_MAX,
        max_seq_len: i32::MAX as usize,
    };
}

/// The compute capabilities a backend runs on.
#[derive(Clone, Copy, Debug)]
enum ArchRule {
    /// This capability and no other (arch-specific `a` images).
    Exactly(i32, i32),
    /// Any capability of at least this major version.
    MajorAtLeast(i32),
}

impl ArchRule {
    fn admits(self, have: (i32, i32)) -> bool {
        match self {
            ArchRule::Exactly(major, minor) => have == (major, minor),
            ArchRule::MajorAtLeast(major) => have.0 >= major,
        }
    }
}

/// What a plan or request needs, at the level of shapes: the largest batch and sequence
/// it may carry, and the fixed geometry of the model and the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub heads: usize,
    pub s_q: usize,
    pub page_size: usize,
    pub dtypes: DecodeDtypes,
    pub max_batch: usize,
    pub max_seq_len: usize,
}

impl From<&DecodeShape> for Geometry {
    fn from(shape: &DecodeShape) -> Self {
        Geometry {
            heads: shape.heads,
            s_q: shape.s_q,
            page_size: shape.page_size,
            dtypes: shape.dtypes,
            max_batch: shape.batch,
            // Saturates so an absurd table width is refused as a capacity, not a panic.
            // Lengths are i32 and the kernels clamp them to the table's capacity: a table
            // wider than i32::MAX tokens is not a longer sequence.
            max_seq_len: shape
                .max_pages
                .saturating_mul(shape.page_size)
                .min(i32::MAX as usize),
        }
    }
}

impl fmt::Display for Geometry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} heads={} s_q={} page_size={} max_batch={} max_seq_len={}",
            self.dtypes.name(),
            self.heads,
            self.s_q,
            self.page_size,
            self.max_batch,
            self.max_seq_len
        )
    }
}

/// Why a backend declines a device or a geometry.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Decline {
    #[error("{backend}: needs {need}, the device is sm_{}{}", have.0, have.1)]
    Arch {
        backend: Backend,
        need: &'static str,
        have: (i32, i32),
    },
    #[error("{backend}: does not run the {} dtypes", got.name())]
    Dtypes { backend: Backend, got: DecodeDtypes },
    #[error("{backend}: heads = {got}, supported 1..={max}")]
    Heads {
        backend: Backend,
        got: usize,
        max: usize,
    },
    #[error("{backend}: query tokens (s_q) = {got}, supported 1..={max}")]
    QueryTokens {
        backend: Backend,
        got: usize,
        max: usize,
    },
    #[error("{backend}: page size = {got}, supported: a power of two in 1..={}", backend.limits().max_page_size)]
    PageSize { backend: Backend, got: usize },
    #[error("{backend}: {what} = {got}, limit {max}")]
    Capacity {
        backend: Backend,
        what: &'static str,
        got: usize,
        max: usize,
    },
    #[error("{backend}: disabled by {by}")]
    Disabled { backend: Backend, by: String },
}

impl Decline {
    /// The backend that declined.
    pub fn backend(&self) -> Backend {
        match self {
            Decline::Arch { backend, .. }
            | Decline::Dtypes { backend, .. }
            | Decline::Heads { backend, .. }
            | Decline::QueryTokens { backend, .. }
            | Decline::PageSize { backend, .. }
            | Decline::Capacity { backend, .. }
            | Decline::Disabled { backend, .. } => *backend,
        }
    }
}

/// Can `backend` run on this device at all, for this geometry? The first rule broken is
/// reported: arch, dtypes, heads, query tokens, page size, batch, sequence length.
pub fn is_available(
    backend: Backend,
    device: &DeviceInfo,
    geometry: &Geometry,
) -> Result<(), Decline> {
    let (arch, need) = backend.arch();
    if !arch.admits(device.compute_capability) {
        return Err(Decline::Arch {
            backend,
            need,
            have: device.compute_capability,
        });
    }
    if !backend.runs_dtypes(geometry.dtypes) {
        return Err(Decline::Dtypes {
            backend,
            got: geometry.dtypes,
        });
    }
    let limits = backend.limits();
    if !(1..=limits.max_heads).contains(&geometry.heads) {
        return Err(Decline::Heads {
            backend,
            got: geometry.heads,
            max: limits.max_heads,
        });
    }
    if !(1..=limits.max_s_q).contains(&geometry.s_q) {
        return Err(Decline::QueryTokens {
            backend,
            got: geometry.s_q,
            max: limits.max_s_q,
        });
    }
    if !geometry.page_size.is_power_of_two() || geometry.page_size > limits.max_page_size {
        return Err(Decline::PageSize {
            backend,
            got: geometry.page_size,
        });
    }
    if !(1..=limits.max_batch).contains(&geometry.max_batch) {
        return Err(Decline::Capacity {
            backend,
            what: "max_batch",
            got: geometry.max_batch,
            max: limits.max_batch,
        });
    }
    if geometry.max_seq_len > limits.max_seq_len {
        return Err(Decline::Capacity {
            backend,
            what: "max_seq_len",
            got: geometry.max_seq_len,
            max: limits.max_seq_len,
        });
    }
    Ok(())
}

/// Per-request check of a validated shape: the rules of [`is_available`], applied to the
/// request's own batch and page-table reach.
pub fn is_supported(
    backend: Backend,
    device: &DeviceInfo,
    shape: &DecodeShape,
) -> Result<(), Decline> {
    is_available(backend, device, &Geometry::from(shape))
}

/// The ordered list of backends to try, and where that order came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registry {
    order: Vec<Backend>,
    /// `"default"`, or the `MLA_BACKENDS` value the order was parsed from.
    source: String,
}

impl Default for Registry {
    fn default() -> Self {
        Self::default_order()
    }
}

/// What a malformed `MLA_BACKENDS` is checked against.
const SPEC_EXPECTED: &str = "a comma list of backend names (sm90a, portable, reference), each at \
    most once, or a comma list of +name / -name edits of the default order, not both, leaving \
    at least one backend";

impl Registry {
    /// Every backend, in the order of [`Backend::ALL`].
    pub fn default_order() -> Self {
        Registry {
            order: Backend::ALL.to_vec(),
            source: "default".into(),
        }
    }

    /// Parses an `MLA_BACKENDS` value. Two forms, never mixed:
    ///
    /// - names, `"portable,reference"`: exactly this order; a name may appear once;
    /// - edits of the default order, `"-sm90a"`, `"+reference"`, `"-sm90a,+reference"`,
    ///   applied left to right: `-name` removes it, `+name` appends it (moving it to the end
    ///   when present).
    ///
    /// Whitespace around entries (and after the sign) is ignored. Unknown names, empty
    /// entries, a mix of the two forms, or an empty result are [`MlaError::InvalidShape`].
    pub fn parse(spec: &str) -> Result<Self, MlaError> {
        let bad = |why: String| MlaError::InvalidShape {
            field: ENV_BACKENDS,
            expected: SPEC_EXPECTED.into(),
            got: format!("{spec:?} ({why})"),
        };
        let name = |entry: &str| {
            Backend::from_name(entry.trim()).ok_or_else(|| {
                if entry.trim().is_empty() {
                    bad("an empty entry".into())
                } else {
                    bad(format!("unknown backend {:?}", entry.trim()))
                }
            })
        };

        let entries: Vec<&str> = spec.split(',').map(str::trim).collect();
        let is_edit = |e: &str| e.starts_with('+') || e.starts_with('-');
        let edits = entries.iter().filter(|e| is_edit(e)).count();
        if edits != 0 && edits != entries.len() {
            return Err(bad("mixes plain names with +/- edits".into()));
        }

        let mut order = Vec::new();
        if edits == 0 {
            for entry in &entries {
                let backend = name(entry)?;
                if order.contains(&backend) {
                    return Err(bad(format!("{backend} appears twice")));
                }
                order.push(backend);
            }
        } else {
            order.extend(Backend::ALL);
            for entry in &entries {
                let (sign, rest) = entry.split_at(1);
                let backend = name(rest)?;
                order.retain(|&b| b != backend);
                if sign == "+" {
                    order.push(backend);
                }
            }
        }
        if order.is_empty() {
            return Err(bad("no backend left".into()));
        }
        Ok(Registry {
            order,
            source: spec.trim().into(),
        })
    }

    /// The order from `MLA_BACKENDS`; unset or blank means [`Registry::default_order`].
    pub fn from_env() -> Result<Self, MlaError> {
        match std::env::var(ENV_BACKENDS) {
            Ok(spec) if spec.trim().is_empty() => Ok(Self::default_order()),
            Ok(spec) => Self::parse(&spec),
            Err(std::env::VarError::NotPresent) => Ok(Self::default_order()),
            Err(std::env::VarError::NotUnicode(raw)) => Err(MlaError::InvalidShape {
                field: ENV_BACKENDS,
                expected: SPEC_EXPECTED.into(),
                got: format!("{raw:?} (not UTF-8)"),
            }),
        }
    }

    /// The backends to try, most preferred first.
    pub fn order(&self) -> &[Backend] {
        &self.order
    }

    /// `"default"`, or the `MLA_BACKENDS` value the order came from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The first backend of the order that is available for `geometry` on `device`. The
    /// backends tried before it are kept with their reasons, followed by those the order
    /// leaves out (as [`Decline::Disabled`]); backends after the winner are not tried.
    /// Logs one `debug` line, the [`Selection`]'s display.
    pub fn select(&self, device: &DeviceInfo, geometry: &Geometry) -> Result<Selection, MlaError> {
        let mut declined = Vec::new();
        let mut chosen = None;
        for &backend in &self.order {
            match is_available(backend, device, geometry) {
                Ok(()) => {
                    chosen = Some(backend);
                    break;
                }
                Err(reason) => declined.push((backend, reason)),
            }
        }
        for backend in Backend::ALL {
            if !self.order.contains(&backend) {
                let by = format!("{ENV_BACKENDS}={}", self.source);
                declined.push((backend, Decline::Disabled { backend, by }));
            }
        }

        let Some(backend) = chosen else {
            let (major, minor) = device.compute_capability;
            return Err(MlaError::Unsupported {
                what: "decode backend",
                got: format!("{geometry} on {} (sm_{major}{minor})", device.name),
                why: join_reasons(&declined),
            });
        };
        let selection = Selection { backend, declined };
        log::debug!("{selection}");
        Ok(selection)
    }
}

/// The outcome of [`Registry::select`]: the backend that runs, and why the others did not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection {
    pub backend: Backend,
    pub declined: Vec<(Backend, Decline)>,
}

impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "decode backend {}", self.backend)?;
        if self.declined.is_empty() {
            Ok(())
        } else {
            write!(f, "; declined: {}", join_reasons(&self.declined))
        }
    }
}

fn join_reasons(declined: &[(Backend, Decline)]) -> String {
    declined
        .iter()
        .map(|(_, reason)| reason.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}
