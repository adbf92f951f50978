//! Picking a [`Tactic`] per (device, shape), in the manner of cubecl's autotune: shapes are
//! bucketed into a small key, every candidate is timed once per key by the caller's
//! closure (real launches timed with CUDA events), the fastest is cached, and the cache
//! persists as a JSON file keyed by the canonical strings of device, shape and tactic.
//!
//! Nothing here touches CUDA: the timing closure is the only bridge to a device, so the
//! policy, the keys and the file format are all tested on the CPU.

use crate::error::MlaError;
use crate::gate::Backend;
use crate::module::DeviceInfo;
use crate::request::{DecodeDtypes, DecodeShape};
use crate::tactic::Tactic;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The cache file format this module writes and accepts.
pub const CACHE_VERSION: u32 = 1;

/// The environment variable that turns tuning on (`MLA_AUTOTUNE=1`).
pub const ENV_AUTOTUNE: &str = "MLA_AUTOTUNE";

/// Next power of two `>= x` (`x = 0` gives 1). Saturates at `2^(usize::BITS - 1)` for
/// larger `x`, which no real shape reaches; the result is always a power of two.
pub fn bucket(x: usize) -> usize {
    x.checked_next_power_of_two()
        .unwrap_or(1 << (usize::BITS - 1))
}

/// The reverse of [`DecodeDtypes::name`].
fn dtypes_from_name(name: &str) -> Option<DecodeDtypes> {
    DecodeDtypes::ALL.into_iter().find(|d| d.name() == name)
}

/// Bucketed shape key: batch and length in powers of two, everything that picks a kernel
/// (dtypes, heads, query tokens, page size) exact.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShapeKey {
    pub dtypes: DecodeDtypes,
    pub heads: usize,
    pub s_q: usize,
    pub page_size: usize,
    /// Bucketed batch size.
    pub batch: usize,
    /// Bucketed longest sequence length.
    pub seq_len: usize,
}

impl ShapeKey {
    /// The key of a decode of `batch` sequences, the longest `max_seq_len` tokens; batch and
    /// length are bucketed with [`bucket`].
    pub fn new(
        dtypes: DecodeDtypes,
        heads: usize,
        s_q: usize,
        page_size: usize,
        batch: usize,
        max_seq_len: usize,
    ) -> Self {
        ShapeKey {
            dtypes,
            heads,
            s_q,
            page_size,
            batch: bucket(batch),
            seq_len: bucket(max_seq_len),
        }
    }

    /// The plan extent of this key (bucketed batch and length) as the tile choice reads it.
    pub fn plan_size(&self) -> crate::tactic::PlanSize {
        crate::tactic::PlanSize {
            max_batch: self.batch,
            max_seq_len: self.seq_len,
            page_size: self.page_size,
        }
    }

    /// The key of a validated decode whose longest sequence has `max_seq_len` tokens (the
    /// caller's host lengths; the page table's capacity would overstate it).
    pub fn for_decode(shape: &DecodeShape, max_seq_len: usize) -> Self {
        Self::new(
            shape.dtypes,
            shape.heads,
            shape.s_q,
            shape.page_size,
            shape.batch,
            max_seq_len,
        )
    }
}

impl fmt::Display for ShapeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/h{}/sq{}/p{}/b{}/l{}",
            self.dtypes.name(),
            self.heads,
            self.s_q,
            self.page_size,
            self.batch,
            self.seq_len
        )
    }
}

impl FromStr for ShapeKey {
    type Err = MlaError;

    /// Accepts exactly the canonical form `dtype/h<heads>/sq<s_q>/p<page>/b<batch>/l<len>`:
    /// a known dtype name, heads and s_q at least 1, page size, batch and length powers of
    /// two (as [`ShapeKey::new`] makes them), no signs or leading zeros.
    fn from_str(s: &str) -> Result<Self, MlaError> {
        let bad = |why: &str| {
            MlaError::shape(
                "shape key",
                "dtype/h<heads>/sq<s_q>/p<page size>/b<batch>/l<length>",
                format!("{s:?} ({why})"),
            )
        };
        let parts: Vec<&str> = s.split('/').collect();
        let [dtype, heads, s_q, page, batch, len] = parts[..] else {
            return Err(bad("not six '/'-separated fields"));
        };
        let num = |field: &str, prefix: &str| -> Result<usize, MlaError> {
            field
                .strip_prefix(prefix)
                .and_then(|v| v.parse::<usize>().ok())
                .ok_or_else(|| bad(&format!("field {field:?} is not {prefix}<number>")))
        };
        let key = ShapeKey {
            dtypes: dtypes_from_name(dtype).ok_or_else(|| bad("unknown dtype"))?,
            heads: num(heads, "h")?,
            s_q: num(s_q, "sq")?,
            page_size: num(page, "p")?,
            batch: num(batch, "b")?,
            seq_len: num(len, "l")?,
        };
        if key.heads == 0 || key.s_q == 0 {
            return Err(bad("heads and s_q must be at least 1"));
        }
        if ![key.page_size, key.batch, key.seq_len]
            .iter()
            .all(|v| v.is_power_of_two())
        {
            return Err(bad("page size, batch and length must be powers of two"));
        }
        if key.to_string() != s {
            return Err(bad("not in canonical form"));
        }
        Ok(key)
    }
}

/// Device identity for the cache: a winner measured on one GPU, arch or driver is not
/// trusted on another.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DeviceKey {
    pub name: String,
    pub compute_capability: (i32, i32),
    pub driver_version: i32,
}

impl From<&DeviceInfo> for DeviceKey {
    fn from(info: &DeviceInfo) -> Self {
        DeviceKey {
            name: info.name.clone(),
            compute_capability: info.compute_capability,
            driver_version: info.driver_version,
        }
    }
}

impl fmt::Display for DeviceKey {
    /// `NVIDIA H200/sm_90/drv13000`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (major, minor) = self.compute_capability;
        write!(
            f,
            "{}/sm_{major}{minor}/drv{}",
            self.name, self.driver_version
        )
    }
}

/// One row of the cache file.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileEntry {
    device: String,
    shape: String,
    tactic: String,
    us: f64,
}

#[derive(Serialize)]
struct FileOut {
    version: u32,
    entries: Vec<FileEntry>,
}

/// The winners, keyed by (device, shape) through their canonical strings.
///
/// Persisted as JSON, `{"version": 1, "entries": [{"device", "shape", "tactic", "us"}]}`,
/// entries sorted by (device, shape) so the same winners always give the same file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TuneCache {
    entries: BTreeMap<(String, String), (Tactic, f64)>,
}

impl TuneCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// The cached winner and its time in microseconds.
    pub fn get(&self, device: &DeviceKey, shape: &ShapeKey) -> Option<(Tactic, f64)> {
        self.entries
            .get(&(device.to_string(), shape.to_string()))
            .copied()
    }

    /// Records (or replaces) the winner for `(device, shape)`. Refuses an invalid tactic or
    /// a time that is not finite and `>= 0`: either would make the file unloadable.
    pub fn insert(
        &mut self,
        device: &DeviceKey,
        shape: &ShapeKey,
        tactic: Tactic,
        us: f64,
    ) -> Result<(), MlaError> {
        tactic.validate()?;
        check_time(us)?;
        self.entries
            .insert((device.to_string(), shape.to_string()), (tactic, us));
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `(device, shape, tactic, us)` in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str, Tactic, f64)> {
        self.entries
            .iter()
            .map(|((d, s), &(t, us))| (d.as_str(), s.as_str(), t, us))
    }

    /// The file text: pretty JSON, entries sorted, a trailing newline.
    pub fn to_json(&self) -> String {
        let file = FileOut {
            version: CACHE_VERSION,
            entries: self
                .iter()
                .map(|(d, s, t, us)| FileEntry {
                    device: d.to_owned(),
                    shape: s.to_owned(),
                    tactic: t.to_string(),
                    us,
                })
                .collect(),
        };
        // Strings and floats cannot fail to serialize (serde_json only fails on non-string map
        // keys and failing Serialize impls), so the default is never taken.
        let mut text = serde_json::to_string_pretty(&file).unwrap_or_default();
        text.push('\n');
        text
    }

    /// Parses a cache file. A missing or different `version`, an entry that is not an
    /// object of exactly the four fields, an empty device, a shape or tactic that is not in
    /// canonical form, a bad time or a repeated (device, shape) is an error naming the entry.
    pub fn from_json(text: &str) -> Result<Self, MlaError> {
        let root: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| MlaError::shape("tune cache", "a JSON object", e.to_string()))?;
        let version = root.get("version").and_then(serde_json::Value::as_u64);
        if version != Some(u64::from(CACHE_VERSION)) {
            return Err(MlaError::shape(
                "tune cache",
                format!("\"version\": {CACHE_VERSION}"),
                root.get("version")
                    .map_or_else(|| "no version".to_owned(), |v| v.to_string()),
            ));
        }
        let Some(entries) = root.get("entries").and_then(serde_json::Value::as_array) else {
            return Err(MlaError::shape(
                "tune cache",
                "an \"entries\" array",
                root.get("entries")
                    .map_or_else(|| "no entries".to_owned(), |v| v.to_string()),
            ));
        };
        if let Some(obj) = root.as_object()
            && let Some(extra) = obj.keys().find(|k| *k != "version" && *k != "entries")
        {
            return Err(MlaError::shape(
                "tune cache",
                "only \"version\" and \"entries\"",
                format!("field {extra:?}"),
            ));
        }
        let mut cache = TuneCache::new();
        for (i, value) in entries.iter().enumerate() {
            let entry_err = |what: &str, got: String| {
                MlaError::shape("tune cache", format!("entries[{i}]: {what}"), got)
            };
            // serde's derived struct also takes a positional array; only objects are entries.
            let entry = value
                .as_object()
                .ok_or_else(|| serde::de::Error::custom("not an object"))
                .and_then(|_| FileEntry::deserialize(value))
                .map_err(|e: serde_json::Error| {
                    entry_err(
                        "{\"device\", \"shape\", \"tactic\", \"us\"}",
                        format!("{value} ({e})"),
                    )
                })?;
            if entry.device.is_empty() {
                return Err(entry_err("a device name", "\"\"".to_owned()));
            }
            let shape: ShapeKey = entry
                .shape
                .parse()
                .map_err(|e: MlaError| entry_err("a canonical shape key", e.to_string()))?;
            let tactic: Tactic = entry
                .tactic
                .parse()
                .map_err(|e: MlaError| entry_err("a canonical tactic", e.to_string()))?;
            check_time(entry.us).map_err(|e| entry_err("a time in us", e.to_string()))?;
            let key = (entry.device, shape.to_string());
            if cache.entries.contains_key(&key) {
                return Err(entry_err(
                    "one entry per (device, shape)",
                    format!("a repeat of {:?} {:?}", key.0, key.1),
                ));
            }
            cache.entries.insert(key, (tactic, entry.us));
        }
        Ok(cache)
    }

    /// Writes the file atomically: into a temporary file next to `path` (created with its
    /// parent directories), flushed to disk, then renamed over `path`.
    pub fn save(&self, path: &Path) -> Result<(), MlaError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir).map_err(|e| file_err(dir, &e))?;
        }
        let tmp = temp_path(path);
        let written = (|| {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(self.to_json().as_bytes())?;
            f.sync_all()?;
            fs::rename(&tmp, path)
        })();
        written.map_err(|e| {
            // Best effort: a leftover temporary file is harmless, the error is what matters.
            let _ = fs::remove_file(&tmp);
            file_err(path, &e)
        })
    }

    /// Reads and parses a cache file; a missing file is an error.
    pub fn load(path: &Path) -> Result<Self, MlaError> {
        let text = fs::read_to_string(path).map_err(|e| file_err(path, &e))?;
        Self::from_json(&text)
    }

    /// Like [`TuneCache::load`], but a file that does not exist yet is an empty cache
    /// (the first run on a machine).
    pub fn load_or_empty(path: &Path) -> Result<Self, MlaError> {
        match fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::new()),
            _ => Self::load(path),
        }
    }
}

/// `path` with `.tmp.<pid>` appended, in the same directory so the rename stays on one
/// file system.
fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".tmp.{}", std::process::id()));
    PathBuf::from(name)
}

fn file_err(path: &Path, e: &std::io::Error) -> MlaError {
    MlaError::shape(
        "tune cache file",
        "a readable and writable file",
        format!("{}: {e}", path.display()),
    )
}

fn check_time(us: f64) -> Result<(), MlaError> {
    if us.is_finite() && us >= 0.0 {
        Ok(())
    } else {
        Err(MlaError::shape(
            "autotune time",
            "a finite time >= 0 us",
            us,
        ))
    }
}

/// Tuning policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TuneMode {
    /// Always the default ([`Tactic::default_for_plan`] of the shape); nothing is measured
    /// (deterministic runs, tests).
    Off,
    /// The cached winner, else measure the candidates.
    On,
}

impl TuneMode {
    /// `MLA_AUTOTUNE=1` turns tuning on; any other value, or none, leaves it off.
    pub fn from_env() -> Self {
        Self::from_value(std::env::var(ENV_AUTOTUNE).ok().as_deref())
    }

    /// The mode for a value of `MLA_AUTOTUNE` (`None` when unset).
    pub fn from_value(value: Option<&str>) -> Self {
        match value {
            Some("1") => TuneMode::On,
            _ => TuneMode::Off,
        }
    }
}

/// The policy plus its cache.
#[derive(Clone, Debug)]
pub struct Autotuner {
    pub mode: TuneMode,
    pub cache: TuneCache,
    /// The backend whose tiles the tuner picks from ([`Tactic::default_on`],
    /// [`Tactic::candidates_on`]); [`Backend::Portable`] from [`Autotuner::new`].
    pub backend: Backend,
}

impl Autotuner {
    /// A tuner with an empty cache, choosing among the portable tiles.
    pub fn new(mode: TuneMode) -> Self {
        Self::for_backend(mode, Backend::Portable)
    }

    /// A tuner with an empty cache for the plans of `backend` (`Runtime::backend`): on
    /// sm_90a its default and candidates include the `wgmma` tile.
    pub fn for_backend(mode: TuneMode, backend: Backend) -> Self {
        Autotuner {
            mode,
            cache: TuneCache::new(),
            backend,
        }
    }

    /// The tactic to use without measuring: the cached winner when the mode is `On` and one
    /// is cached that this backend can run, else [`Tactic::default_on`] the shape's rows,
    /// this backend and dtypes.
    pub fn choose(&self, device: &DeviceKey, shape: &ShapeKey) -> Tactic {
        let default = Tactic::default_for_plan(
            shape.heads * shape.s_q,
            shape.plan_size(),
            self.backend,
            shape.dtypes,
        );
        match self.mode {
            TuneMode::Off => default,
            TuneMode::On => self.cached(device, shape).unwrap_or(default),
        }
    }

    /// The cached winner for `(device, shape)` when this backend runs its tile. The cache
    /// keys name the device, not the backend: a file written where the `sm_90a` image loaded
    /// may hold a `wgmma` tile that a process on the portable image cannot plan (the same GPU
    /// with `MLA_IMAGE=ptx`, say); such an entry is passed over (and retuned by
    /// [`Autotuner::choose_or_tune`]), never handed to the planner to fail there.
    fn cached(&self, device: &DeviceKey, shape: &ShapeKey) -> Option<Tactic> {
        let (tactic, _) = self.cache.get(device, shape)?;
        match tactic.tile.check(self.backend, shape.dtypes) {
            Ok(()) => Some(tactic),
            Err(e) => {
                log::warn!("mla autotune: {device} {shape}: cached {tactic} passed over: {e}");
                None
            }
        }
    }

    /// Times every [`Tactic::candidates_on`] entry of the shape's rows with `time_us`
    /// (microseconds; the caller launches and times real kernels), caches the fastest and
    /// returns it. A candidate
    /// whose timing fails, or is not a finite time `>= 0`, is skipped and logged to stderr;
    /// if all fail, the first error is returned and nothing is cached. Ties keep the
    /// earlier candidate. With the mode `Off` it returns [`Tactic::default_on`] the shape's
    /// rows and never calls `time_us`.
    pub fn tune(
        &mut self,
        device: &DeviceKey,
        shape: &ShapeKey,
        mut time_us: impl FnMut(&Tactic) -> Result<f64, MlaError>,
    ) -> Result<Tactic, MlaError> {
        let rows = shape.heads * shape.s_q;
        if self.mode == TuneMode::Off {
            return Ok(Tactic::default_for_plan(
                rows,
                shape.plan_size(),
                self.backend,
                shape.dtypes,
            ));
        }
        let mut best: Option<(Tactic, f64)> = None;
        let mut first_err = None;
        for tactic in
            Tactic::candidates_for_plan(rows, shape.plan_size(), self.backend, shape.dtypes)
        {
            let timed = time_us(&tactic).and_then(|us| check_time(us).map(|()| us));
            match timed {
                Ok(us) => {
                    if best.is_none_or(|(_, b)| us < b) {
                        best = Some((tactic, us));
                    }
                }
                Err(e) => {
                    log::warn!("mla autotune: {device} {shape}: skipping {tactic}: {e}");
                    first_err.get_or_insert(e);
                }
            }
        }
        match (best, first_err) {
            (Some((tactic, us)), _) => {
                self.cache.insert(device, shape, tactic, us)?;
                Ok(tactic)
            }
            (None, Some(e)) => Err(e),
            (None, None) => Err(MlaError::shape(
                "autotune candidates",
                "at least one",
                "none",
            )),
        }
    }

    /// The cached winner when there is one this backend runs, else [`Autotuner::tune`]
    /// (which replaces the entry); with the mode `Off`,
    /// [`Tactic::default_for_plan`] of the shape.
    pub fn choose_or_tune(
        &mut self,
        device: &DeviceKey,
        shape: &ShapeKey,
        time_us: impl FnMut(&Tactic) -> Result<f64, MlaError>,
    ) -> Result<Tactic, MlaError> {
        match (self.mode, self.cached(device, shape)) {
            (TuneMode::On, Some(tactic)) => Ok(tactic),
            _ => self.tune(device, shape, time_us),
        }
    }
}
