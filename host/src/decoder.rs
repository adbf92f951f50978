//! The two-phase serving API.
//!
//! - [`Runtime::plan_decode`] (once per batch-shape bucket, outside graph capture): checks
//!   the geometry against the backend, fixes the tactic, allocates the workspace for the
//!   bucket's capacity (not the live batch). The capacity bounds the splits per sequence
//!   too ([`crate::plan::split_cap`]): a batch far below `max_batch`, or a bucket padded
//!   with zero lengths, gets the bucket's split cap, not a small plan's, so plan per bucket.
//! - [`DecodePlan::run`] (every step): validates the request, then launches on the caller's
//!   stream only: the schedule kernel (split counts from the device-resident `seq_lens`),
//!   the decode kernel and the combine kernel. No allocation, no host synchronisation, no
//!   device-to-host copy, so a captured CUDA graph of `run` stays correct while lengths,
//!   page tables and data change between replays.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaStream;
use cudarc::driver::sys::{CUstream, CUstreamCaptureStatus};
use mla_abi::{ScheduleParams, Shard, names};

use crate::autotune::{Autotuner, DeviceKey, ShapeKey, TuneMode};
use crate::choice::DecodeKernels;
use crate::error::{MlaError, Result};
use crate::gate::{Backend, Geometry, Registry, is_available, is_supported};
use crate::launch::{Counts, DecodeWorkspace, LaunchShape, STEP_SLOTS, check_workspace, launch};
use crate::module::Runtime;
use crate::plan::{self, ScheduleConfig, WorkspaceCapacity};
use crate::request::{DecodeDtypes, DecodeRequest, DecodeShape, SplitParts};
use crate::tactic::Tactic;
use crate::tensor::TensorView;
use crate::validate::validate_decode;

/// What a plan serves: every request run with it must have these heads, query tokens,
/// dtypes and page size, and at most `max_batch` sequences.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeConfig {
    pub max_batch: usize,
    pub heads: usize,
    pub s_q: usize,
    pub dtypes: DecodeDtypes,
    pub page_size: usize,
    /// Longest sequence the plan is tuned for (lengths beyond it still run correctly; 0
    /// and any value from `i32::MAX`, the longest length, mean "unknown" and plan as
    /// `i32::MAX`: [`DecodeConfig::planned_len`]). Plans of several row tiles may size
    /// their split grid and partials for a full batch of this length (at most 8192 split
    /// cells, 1 GiB of partials in 64-row tiles; "unknown" takes none of that);
    /// [`DecodePlan::info`] reports the workspace.
    pub max_seq_len: usize,
}

impl DecodeConfig {
    /// Query rows per sequence, `s_q * heads` (what the tile choice depends on).
    pub fn rows(&self) -> usize {
        self.s_q * self.heads
    }

    /// `max_seq_len` as planning reads it: 0 and values from `i32::MAX` ("unknown") as
    /// `i32::MAX`, the longest length there is; any other value as it is. A plan tuned for
    /// "unknown" gets the tile, split grid and work-list model of the longest sequences,
    /// not of empty ones.
    pub fn planned_len(&self) -> usize {
        if self.max_seq_len == 0 {
            i32::MAX as usize
        } else {
            self.max_seq_len.min(i32::MAX as usize)
        }
    }

    /// The plan's extent as the tile choice reads it (the length: [`Self::planned_len`]).
    pub fn plan_size(&self) -> crate::tactic::PlanSize {
        crate::tactic::PlanSize {
            max_batch: self.max_batch,
            max_seq_len: self.planned_len(),
            page_size: self.page_size,
        }
    }

    /// A typed error naming the first field outside what any plan accepts: `max_batch`
    /// `1..=65535`, `heads` `1..=128`, `s_q` `1..=8`, `page_size` a power of two in
    /// `1..=256`. (A valid config that no backend on this device runs is
    /// [`MlaError::Unsupported`] from planning instead.)
    pub fn validate(&self) -> Result<()> {
        let check = |ok: bool, field: &'static str, expected: &str, got: usize| {
            if ok {
                Ok(())
            } else {
                Err(MlaError::shape(field, expected, got))
            }
        };
        check(
            (1..=crate::launch::MAX_GRID_YZ).contains(&self.max_batch),
            "max_batch",
            "1..=65535",
            self.max_batch,
        )?;
        check(
            (1..=mla_abi::MAX_HEADS as usize).contains(&self.heads),
            "heads",
            "1..=128",
            self.heads,
        )?;
        check(
            (1..=mla_abi::MAX_S_Q as usize).contains(&self.s_q),
            "s_q",
            "1..=8",
            self.s_q,
        )?;
        check(
            self.page_size.is_power_of_two() && self.page_size <= mla_abi::MAX_PAGE_SIZE as usize,
            "page_size",
            "a power of two in 1..=256",
            self.page_size,
        )
    }

    /// Whether a validated request `shape` fits this config: the same heads, query tokens,
    /// dtypes and page size, and at most `max_batch` sequences. A typed error naming the
    /// first field that does not (what every run of a plan, and a tuning sample, checks).
    pub fn check_shape(&self, shape: &DecodeShape) -> Result<()> {
        let c = self;
        let mismatch = |field: &'static str, want: String, got: String| {
            Err(MlaError::InvalidShape {
                field,
                expected: format!("{want} (as planned)"),
                got,
            })
        };
        if shape.heads != c.heads {
            return mismatch(
                "q.shape[2] (heads)",
                c.heads.to_string(),
                shape.heads.to_string(),
            );
        }
        if shape.s_q != c.s_q {
            return mismatch("q.shape[1] (s_q)", c.s_q.to_string(), shape.s_q.to_string());
        }
        if shape.dtypes != c.dtypes {
            return mismatch("dtypes", c.dtypes.name().into(), shape.dtypes.name().into());
        }
        if shape.page_size != c.page_size {
            return mismatch(
                "kv_cache.shape[1] (page_size)",
                c.page_size.to_string(),
                shape.page_size.to_string(),
            );
        }
        if shape.batch > c.max_batch {
            return mismatch(
                "q.shape[0] (batch)",
                format!("<= {}", c.max_batch),
                shape.batch.to_string(),
            );
        }
        Ok(())
    }
}

/// A fault a checked decode met ([`DecodePlan::set_checked`]): the first one any CTA
/// recorded since the plan was made or its record was cleared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeFault {
    /// `page_table[sequence][column]` holds `page`, outside `0..num_pages`, and the
    /// sequence's length reaches that column.
    PageId {
        sequence: usize,
        column: usize,
        page: i32,
    },
    /// `seq_lens[sequence]` is `len`, past what the sequence's page-table row addresses
    /// (`max_pages * page_size`). On a sharded plan `len` is this rank's share of the
    /// global length (the part its table must hold).
    SeqLen { sequence: usize, len: i32 },
}

impl std::fmt::Display for DecodeFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeFault::PageId {
                sequence,
                column,
                page,
            } => write!(
                f,
                "page_table[{sequence}][{column}] = {page} is outside 0..num_pages"
            ),
            DecodeFault::SeqLen { sequence, len } => write!(
                f,
                "seq_lens[{sequence}] = {len} is past the page table's max_pages * page_size"
            ),
        }
    }
}

impl DecodeFault {
    /// The fault a record holds (`mla_abi::fault` words), `None` for an empty record.
    pub fn from_record(words: [i32; mla_abi::fault::WORDS]) -> Option<Self> {
        use mla_abi::fault;
        let sequence = words[fault::SEQUENCE].max(0) as usize;
        match words[fault::KIND] {
            fault::PAGE_ID => Some(DecodeFault::PageId {
                sequence,
                column: words[fault::COLUMN].max(0) as usize,
                page: words[fault::VALUE],
            }),
            fault::SEQ_LEN => Some(DecodeFault::SeqLen {
                sequence,
                len: words[fault::VALUE],
            }),
            _ => None,
        }
    }
}

/// What a plan chose ([`DecodePlan::info`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanInfo {
    /// The backend (`sm90a`, `portable` or `reference`).
    pub backend: &'static str,
    /// The tactic's canonical string.
    pub tactic: String,
    /// Every kernel a run of the plan may launch, in launch order: the schedule (batches
    /// past the fold), the decode (on sm_90a with a bf16 or fp8 cache both the TMA decode,
    /// taken by requests whose cache and lengths suit it, and the `cp.async` one), the
    /// combine.
    pub kernels: Vec<&'static str>,
    /// Device bytes the plan's workspace holds.
    pub workspace_bytes: usize,
    /// Whether decodes run in checked mode.
    pub checked: bool,
}

/// A decode planned for one batch-shape bucket. One plan per stream at a time: its
/// workspace holds the partials of the run in flight. Graphs captured with the plan use
/// its workspace: do not launch them after the plan is dropped. Dropping it synchronises
/// the device's context (its buffers may still be in use on any stream), so not while any
/// stream of the device captures a graph. It runs with any runtime of its device (a typed
/// error for another device's).
pub struct DecodePlan {
    config: DecodeConfig,
    backend: Backend,
    tactic: Tactic,
    schedule: ScheduleConfig,
    /// Every kernel a run may launch, chosen at plan time ([`crate::choice`]).
    kernels: DecodeKernels,
    ws: DecodeWorkspace,
    /// The batch of each step slot's last [`DecodePlan::schedule_step_slot`] (0: none
    /// yet), which [`DecodePlan::run_layer_slot`] checks its request against.
    step_batch: [AtomicUsize; STEP_SLOTS],
    /// The launch model's last answer ([`plan::list_pays`]) and what it was asked: batch,
    /// KV blocks, CTAs, the cells' form. The same for every run of one shape, and a run's
    /// host path must not rebuild a batch's piece list each launch.
    list_memo: Mutex<Option<(ListKey, bool)>>,
}

/// What [`plan::list_pays`] is asked for one shape: batch, KV blocks, CTAs, and whether the
/// cells would run an e4m3 tensor-map form.
type ListKey = (usize, usize, usize, bool);

impl std::fmt::Debug for DecodePlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodePlan")
            .field("config", &self.config)
            .field("backend", &self.backend.name())
            .field("tactic", &self.tactic.to_string())
            .field("schedule", &self.schedule)
            .finish()
    }
}

impl Runtime {
    /// The tactic the library picks for `config` on this runtime's backend when not
    /// tuning ([`Tactic::default_on`]): the measured default path.
    pub fn default_tactic(&self, config: &DecodeConfig) -> Tactic {
        Tactic::default_for_plan(
            config.rows(),
            config.plan_size(),
            self.backend(),
            config.dtypes,
        )
    }

    /// Plans a decode for `config` with `tactic` ([`Runtime::default_tactic`] when not
    /// tuning).
    /// Allocates the workspace; call it outside graph capture.
    pub fn plan_decode(
        &self,
        stream: &Arc<CudaStream>,
        config: DecodeConfig,
        tactic: Tactic,
    ) -> Result<DecodePlan> {
        self.plan_decode_on(stream, config, tactic, None)
    }

    /// [`Runtime::plan_decode`] on a chosen backend (`None`: the registry's choice). A
    /// forced backend must still accept the device and geometry, and be in this image.
    pub fn plan_decode_on(
        &self,
        stream: &Arc<CudaStream>,
        config: DecodeConfig,
        tactic: Tactic,
        backend: Option<Backend>,
    ) -> Result<DecodePlan> {
        config.validate()?;
        tactic.validate()?;
        // The environment's A/B overrides turn switches off here, in the plan's tactic, so
        // that the plan's canonical string names the launch it runs.
        let tactic = Tactic {
            switches: crate::choice::Overrides::get().apply(tactic.switches),
            ..tactic
        };
        // Lengths are i32: "unknown" (0, or a hint from i32::MAX such as u32::MAX) plans
        // as the longest length there is.
        let config = DecodeConfig {
            max_seq_len: config.planned_len(),
            ..config
        };
        let geometry = Geometry {
            heads: config.heads,
            s_q: config.s_q,
            page_size: config.page_size,
            dtypes: config.dtypes,
            max_batch: config.max_batch,
            max_seq_len: config.max_seq_len,
        };
        let backend = match backend {
            None => self.select_backend(&geometry)?,
            Some(b) => {
                if b != Backend::Reference && b != self.backend() {
                    return Err(MlaError::Unsupported {
                        what: "decode backend",
                        got: b.name().into(),
                        why: format!("this runtime loaded the {} image", self.backend().name()),
                    });
                }
                is_available(b, self.device(), &geometry).map_err(|d| MlaError::Unsupported {
                    what: "decode backend",
                    got: b.name().into(),
                    why: d.to_string(),
                })?;
                b
            }
        };
        tactic.tile.check(backend, config.dtypes)?;
        let rows = config.rows();
        let tiles = tactic.tile.row_tiles(rows);
        let sm_count = self.device().sm_count as usize;
        let base_ctas = tactic.target_ctas(sm_count);
        let target_ctas = plan::target_from_env().unwrap_or_else(|| {
            let target = plan::balanced_target(
                base_ctas,
                sm_count,
                tiles,
                config.max_batch,
                config.max_seq_len,
            );
            // bf16 on the 64-row TMA decode: no one-block splits (its `cp.async` form).
            // Measured only with the TMA decode on, so a tactic with it off keeps `target`.
            let tile_decode = crate::choice::tile_kernel(tactic.tile, config.dtypes);
            if crate::choice::tma_decode_for(tile_decode, tactic.switches, config.page_size)
                == Some(names::DECODE_TMA_BF16)
            {
                plan::two_block_target(target, tiles, config.max_batch, config.max_seq_len)
            } else {
                target
            }
        });
        let schedule = ScheduleConfig {
            tiles,
            target_ctas,
            // The tactic's bound, and the plan's: a grid sized for the batch, not for one
            // sequence taking every CTA (plan::split_cap, with the balanced target's count).
            max_splits: (tactic.max_splits as usize).min(plan::balanced_split_cap(
                base_ctas,
                target_ctas,
                tiles,
                config.max_batch,
            )),
            max_len: config.max_seq_len,
            step_log2: tactic.tile.step_log2(config.dtypes),
        };
        let grid_splits = schedule.grid_splits();
        let (list_fixed, list_always) = crate::choice::work_list_from_env();
        let ws = DecodeWorkspace::new(
            stream,
            WorkspaceCapacity {
                batch: config.max_batch,
                rows,
                max_splits: plan::list_capacity(
                    grid_splits,
                    list_fixed,
                    sm_count,
                    tiles,
                    config.max_batch,
                ),
            },
        )?;
        log::debug!(
            "mla plan: {config:?} on {}: backend {}, tactic {tactic}, grid splits {grid_splits}",
            self.device().name,
            backend.name(),
        );
        let kernels = DecodeKernels::new(
            backend,
            self.variant(),
            tactic.tile,
            tactic.switches,
            config.dtypes,
            config.page_size,
            grid_splits,
        )
        .with_wave_splits(target_ctas / tiles.max(1))
        .with_work_list(list_fixed, list_always)
        .with_tma32_form(crate::choice::Tma32Form::from_env())
        .with_tma_form(crate::choice::TmaForm::from_env());
        Ok(DecodePlan {
            config,
            backend,
            tactic,
            schedule,
            kernels,
            ws,
            step_batch: std::array::from_fn(|_| AtomicUsize::new(0)),
            list_memo: Mutex::new(None),
        })
    }
}

impl Runtime {
    /// The first backend of the registry (`MLA_BACKENDS` overrides the order) that this
    /// device accepts for `geometry` and whose kernels this runtime's image holds (the
    /// reference kernels are in every image).
    fn select_backend(&self, geometry: &Geometry) -> Result<Backend> {
        let loaded = self.backend();
        let registry = Registry::from_env()?;
        let usable: Vec<&str> = registry
            .order()
            .iter()
            .filter(|&&b| b == loaded || b == Backend::Reference)
            .map(|b| b.name())
            .collect();
        if usable.is_empty() {
            return Err(MlaError::Unsupported {
                what: "decode backend",
                got: format!("MLA_BACKENDS order {:?}", registry.order()),
                why: format!(
                    "this runtime loaded the {} image; allow it or `reference`",
                    loaded.name()
                ),
            });
        }
        let selection = Registry::parse(&usable.join(","))?.select(self.device(), geometry)?;
        log::debug!("mla: {selection}");
        Ok(selection.backend)
    }

    /// Picks the tactic for `config` with `tuner`: the cached winner, the default when
    /// tuning is off ([`Runtime::default_tactic`] of `config`, as if not tuning), else every
    /// candidate planned and timed on real launches of `sample`
    /// (CUDA events, median of `reps`) on `stream`. Refuses to run while `stream` is
    /// capturing a graph; not while any other stream of the device captures either (each
    /// candidate's plan is dropped, which synchronises the context). `sample` must fit
    /// `config` (it is run, so its buffers are written).
    pub fn tune_decode(
        &self,
        stream: &Arc<CudaStream>,
        config: DecodeConfig,
        sample: &DecodeRequest,
        tuner: &mut Autotuner,
        reps: usize,
    ) -> Result<Tactic> {
        let status = stream.capture_status()?;
        if status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Err(MlaError::Unsupported {
                what: "autotuning",
                got: format!("{status:?}"),
                why: "tuning launches and synchronises; it never runs during graph capture".into(),
            });
        }
        let shape = validate_decode(sample)?;
        // Before the tuner's cache: a hit keyed by a sample of another geometry would
        // hand back a tactic tuned for that geometry, not for `config`.
        config.check_shape(&shape)?;
        if tuner.mode == TuneMode::Off {
            // The plan's own default, for its exact size: the tuner's key rounds the batch
            // and length up to powers of two, and its default for that size may differ.
            return Ok(self.default_tactic(&config));
        }
        let device = DeviceKey::from(self.device());
        let key = ShapeKey::for_decode(&shape, config.planned_len());
        tuner.choose_or_tune(&device, &key, |tactic| {
            let plan = self.plan_decode(stream, config, *tactic)?;
            let (e0, e1) = self.timing_events()?;
            plan.run(self, stream, sample)?;
            let mut times = Vec::with_capacity(reps.max(1));
            for _ in 0..reps.max(1) {
                e0.record(stream)?;
                plan.run(self, stream, sample)?;
                e1.record(stream)?;
                e1.synchronize()?;
                times.push(e0.elapsed_ms(&e1)? as f64 * 1e3);
            }
            times.sort_by(f64::total_cmp);
            Ok(times[times.len() / 2])
        })
    }
}

impl DecodePlan {
    pub fn config(&self) -> &DecodeConfig {
        &self.config
    }

    pub fn tactic(&self) -> Tactic {
        self.tactic
    }

    /// The backend the plan runs.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The schedule the plan runs with (the split rule's inputs).
    pub fn schedule(&self) -> ScheduleConfig {
        self.schedule
    }

    /// What the plan chose: backend, tactic, the kernels its runs may launch, and the
    /// workspace's device bytes.
    pub fn info(&self, rt: &Runtime) -> PlanInfo {
        let c = &self.config;
        let kernels = self
            .kernels
            .all(c.max_batch, c.rows(), rt.device().sm_count);
        PlanInfo {
            backend: self.backend.name(),
            tactic: self.tactic.to_string(),
            kernels,
            workspace_bytes: self.ws.device_bytes(),
            checked: self.ws.checked,
        }
    }

    /// Checked mode: the first fault a decode of this plan met since it was made or
    /// [`DecodePlan::clear_fault`] ran (`None`: none). Waits for `stream` (the one the
    /// plan runs on) first, so it sees every decode launched there; never in a capture.
    /// An error for a plan not in checked mode ([`DecodePlan::set_checked`]).
    pub fn fault(&self, rt: &Runtime, stream: &CudaStream) -> Result<Option<DecodeFault>> {
        // SAFETY: a cudarc stream is a live stream of its context.
        unsafe { self.fault_raw(rt, stream.cu_stream()) }
    }

    /// [`DecodePlan::fault`] on a raw `CUstream`.
    ///
    /// # Safety
    /// `stream` is a live stream (or null, the legacy default stream) of `rt`'s context.
    pub unsafe fn fault_raw(&self, rt: &Runtime, stream: CUstream) -> Result<Option<DecodeFault>> {
        self.check_runtime(rt)?;
        self.check_checked()?;
        crate::module::make_current(rt.context())?;
        // The read copies to the host and synchronises.
        // SAFETY: a live stream of this context, now current (forwarded).
        unsafe {
            crate::module::refuse_capture(
                stream,
                "reading the fault record",
                "it copies to the host and synchronises; call it outside graph capture",
            )?
        };
        // SAFETY: forwarded from the caller.
        let words = unsafe { self.ws.read_fault(rt, stream)? };
        Ok(DecodeFault::from_record(words))
    }

    /// Empties the fault record, in stream order on `stream` (capturable).
    pub fn clear_fault(&self, rt: &Runtime, stream: &CudaStream) -> Result<()> {
        // SAFETY: a cudarc stream is a live stream of its context.
        unsafe { self.clear_fault_raw(rt, stream.cu_stream()) }
    }

    /// [`DecodePlan::clear_fault`] on a raw `CUstream`.
    ///
    /// # Safety
    /// As [`DecodePlan::fault_raw`].
    pub unsafe fn clear_fault_raw(&self, rt: &Runtime, stream: CUstream) -> Result<()> {
        self.check_runtime(rt)?;
        self.check_checked()?;
        // SAFETY: forwarded from the caller.
        unsafe { self.ws.clear_fault(rt, stream) }
    }

    /// `rt` is a runtime of the device the plan's workspace lives on (two runtimes of one
    /// device share its primary context), or a typed error before any launch: another
    /// device's kernels would write this workspace through addresses of no use to them.
    fn check_runtime(&self, rt: &Runtime) -> Result<()> {
        if **self.ws.context() == **rt.context() {
            Ok(())
        } else {
            Err(MlaError::shape(
                "rt",
                format!(
                    "a runtime of device {} (the plan's)",
                    self.ws.context().ordinal()
                ),
                format!("device {}", rt.context().ordinal()),
            ))
        }
    }

    fn check_checked(&self) -> Result<()> {
        if self.ws.checked {
            Ok(())
        } else {
            Err(MlaError::shape(
                "checked",
                "a plan in checked mode (DecodePlan::set_checked)",
                "a plan with checked mode off",
            ))
        }
    }

    /// Checked mode on or off for the runs launched from now on (off when a plan is
    /// made). On, each decode also checks the page-table entries it reads and the length
    /// of each sequence, and records the first page id outside `0..num_pages` or length
    /// past the page table's capacity (`max_pages * page_size`) in the plan's workspace,
    /// for [`DecodePlan::fault`]. Off: no check and no cost; such entries read as zeros and
    /// such lengths are cut at the table's capacity, silently. A graph captured before the
    /// switch keeps the mode it was captured with.
    pub fn set_checked(&mut self, on: bool) {
        self.ws.checked = on;
    }

    /// The 64-row TMA decodes' work list for the runs launched from now on: `Some(true)` on
    /// wherever a launch allows it, `Some(false)` off (the schedule's cells), `None` where
    /// the launch model picks it (the default; `MLA_WORK_LIST` sets a plan's start). For
    /// tests and A/Bs; outputs agree either way within the kernels' rounding.
    #[doc(hidden)]
    pub fn set_work_list(&mut self, force: Option<bool>) {
        let fixed = if force == Some(false) {
            0
        } else {
            crate::choice::WORK_LIST_FIXED
        };
        self.kernels = self.kernels.with_work_list(fixed, force == Some(true));
        // The launch model's answer depends on the list's fixed cost.
        if let Ok(memo) = self.list_memo.get_mut() {
            *memo = None;
        }
    }

    /// Decode context parallelism for the runs launched from now on: this plan decodes
    /// rank `shard.rank`'s share of every sequence ([`Shard`]: which global tokens the
    /// rank's cache holds, and where). Requests keep the global `seq_lens` (the same
    /// tensor on every rank); each rank's local lengths and the causal rule across ranks
    /// follow from them on the device. Every row of a sequence with a positive length is
    /// written, `(0, -inf)` where the rank holds none of the keys it sees, so that
    /// [`crate::Runtime::merge`] of the ranks' `(out, lse)` gives the exact result.
    /// [`Shard::OFF`] (the default) turns it off. A graph captured before the switch keeps
    /// the shard it was captured with. Errors name the field: `ranks` above
    /// `MAX_MERGE_RANKS`, `rank >= ranks`, `interleave == 0`.
    pub fn set_shard(&mut self, shard: Shard) -> Result<()> {
        crate::validate::shard_fields(&shard)?;
        self.ws.shard = shard;
        Ok(())
    }

    /// The shard runs decode ([`DecodePlan::set_shard`]).
    pub fn shard(&self) -> Shard {
        self.ws.shard
    }

    /// Whether checked mode is on ([`DecodePlan::set_checked`]).
    pub fn checked(&self) -> bool {
        self.ws.checked
    }

    /// Whether a run of `req` takes the 64-row TMA decodes' work list: its decode then cuts
    /// the batch itself and writes the run's split counts ([`DecodePlan::read_splits`]), a
    /// scheduled layer's too, whatever counts [`DecodePlan::schedule_step`] wrote. The same
    /// for every request of one shape. For tests and inspection.
    #[doc(hidden)]
    pub fn takes_list(&self, rt: &Runtime, req: &DecodeRequest) -> Result<bool> {
        let parts = SplitParts::default();
        let shape = self.check_run(rt, req, &parts)?;
        Ok(self.work_list_fixed(rt, req, &parts, &shape) > 0)
    }

    /// The split counts a run of `req` writes ([`DecodePlan::read_splits`]) for its lengths
    /// `seq_lens` (the device's, on the host), computed on the host: the work list's piece
    /// counts where the run takes it (0 for padding, whose entries it leaves as they were),
    /// else the schedule's ([`plan::schedule_shard`]), the lengths cut to what the page
    /// table addresses. For tests and inspection.
    pub fn run_split_twin(
        &self,
        rt: &Runtime,
        req: &DecodeRequest,
        seq_lens: &[i32],
    ) -> Result<Vec<i32>> {
        let parts = SplitParts::default();
        let shape = self.check_run(rt, req, &parts)?;
        if seq_lens.len() != shape.batch {
            return Err(MlaError::shape(
                "seq_lens (host copy)",
                format!("{} entries (the batch)", shape.batch),
                seq_lens.len(),
            ));
        }
        let cap_tokens = shape.max_seq_len().min(u32::MAX as usize);
        if self.work_list_fixed(rt, req, &parts, &shape) > 0 {
            let ctas = self.ws.list_ctas(rt.device().sm_count);
            let parts = (ctas / self.schedule.tiles.max(1)).max(1) as u32;
            let pieces = plan::work_list(
                seq_lens,
                cap_tokens as u32,
                &self.ws.shard,
                self.kernels.list_fixed,
                parts,
                self.ws.capacity().max_splits as u32,
            )
            .unwrap_or_default();
            return Ok(plan::list_counts(shape.batch, &pieces));
        }
        let mut cfg = self.schedule;
        cfg.max_len = cap_tokens;
        Ok(plan::schedule_shard(seq_lens, &cfg, &self.ws.shard))
    }

    /// The split counts the last run's schedule wrote for its first `n` sequences (waits
    /// for `stream`; for tests and inspection).
    pub fn read_splits(&self, stream: &Arc<CudaStream>, n: usize) -> Result<Vec<i32>> {
        self.ws.read_splits(stream, n, Counts::Runs)
    }

    /// The split counts the last [`DecodePlan::schedule_step`] wrote for its first `n`
    /// sequences: step slot 0's, not the other slots of
    /// [`DecodePlan::schedule_step_slot`] (waits for `stream`; for tests and inspection).
    pub fn read_step_splits(&self, stream: &Arc<CudaStream>, n: usize) -> Result<Vec<i32>> {
        self.ws.read_splits(stream, n, Counts::Step(0))
    }

    /// Step slot `slot` (`0..STEP_SLOTS`), or a typed error naming it.
    pub fn step_slot(slot: usize) -> Result<usize> {
        if slot < STEP_SLOTS {
            Ok(slot)
        } else {
            Err(MlaError::shape("slot", format!("0..{STEP_SLOTS}"), slot))
        }
    }

    /// One decode step on `stream` (see the module docs for what it does and does not do).
    pub fn run(
        &self,
        rt: &Runtime,
        stream: &CudaStream,
        req: &DecodeRequest,
    ) -> Result<DecodeShape> {
        // SAFETY: a cudarc stream is a live stream of its context.
        unsafe { self.run_raw(rt, stream.cu_stream(), req) }
    }

    /// [`DecodePlan::run`] on a raw `CUstream`, for stacks that use another cudarc version
    /// or none.
    ///
    /// # Safety
    /// `stream` is a live stream (or null, the legacy default stream) of `rt`'s context,
    /// and every device pointer in `req` stays valid until the launched work completes.
    pub unsafe fn run_raw(
        &self,
        rt: &Runtime,
        stream: CUstream,
        req: &DecodeRequest,
    ) -> Result<DecodeShape> {
        // SAFETY: forwarded from the caller.
        unsafe { self.run_split_raw(rt, stream, req, &SplitParts::default(), false) }
    }

    /// Per-step scheduling, for the layers of one decode step: the split counts of a batch
    /// whose lengths are `seq_lens` (`[batch]` i32 on the device), computed on the device by
    /// the schedule kernel into the plan's workspace, in stream order on `stream`
    /// (capturable). Each [`DecodePlan::run_layer`] after it reuses them, for every layer
    /// whose request has the same batch and the same `seq_lens` contents (the lengths the
    /// schedule read, in that tensor or another); as with any library's scheduling
    /// metadata, other lengths are not detected. The counts live in the plan's step slot 0,
    /// apart from the counts of its runs: a [`DecodePlan::run`] of the plan (eager or
    /// replayed) in between leaves them as they are; the slot's next `schedule_step` (on
    /// any stream) replaces them. [`DecodePlan::schedule_step_slot`] schedules into another
    /// slot (micro-batches whose steps are scheduled ahead of their layers). `max_seq_len`
    /// is the page table's capacity in tokens (`max_pages * page_size` of the layers'
    /// requests): lengths are clamped there, as the decode clamps them.
    pub fn schedule_step(
        &self,
        rt: &Runtime,
        stream: &CudaStream,
        seq_lens: &TensorView<1>,
        max_seq_len: usize,
    ) -> Result<()> {
        self.schedule_step_slot(rt, stream, 0, seq_lens, max_seq_len)
    }

    /// [`DecodePlan::schedule_step`] into step slot `slot` (`0..STEP_SLOTS`, a typed error
    /// otherwise): one plan serves up to [`STEP_SLOTS`] steps scheduled ahead of their
    /// layers, each read by [`DecodePlan::run_layer_slot`] of the same slot (two
    /// micro-batches: slots 0 and 1). Slot 0 is [`DecodePlan::schedule_step`]'s.
    pub fn schedule_step_slot(
        &self,
        rt: &Runtime,
        stream: &CudaStream,
        slot: usize,
        seq_lens: &TensorView<1>,
        max_seq_len: usize,
    ) -> Result<()> {
        // SAFETY: a cudarc stream is a live stream of its context.
        unsafe { self.schedule_step_slot_raw(rt, stream.cu_stream(), slot, seq_lens, max_seq_len) }
    }

    /// [`DecodePlan::schedule_step`] on a raw `CUstream`.
    ///
    /// # Safety
    /// `stream` is a live stream (or null) of `rt`'s context and `seq_lens` stays valid
    /// until the schedule kernel completes.
    pub unsafe fn schedule_step_raw(
        &self,
        rt: &Runtime,
        stream: CUstream,
        seq_lens: &TensorView<1>,
        max_seq_len: usize,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.schedule_step_slot_raw(rt, stream, 0, seq_lens, max_seq_len) }
    }

    /// [`DecodePlan::schedule_step_slot`] on a raw `CUstream`.
    ///
    /// # Safety
    /// As [`DecodePlan::schedule_step_raw`].
    pub unsafe fn schedule_step_slot_raw(
        &self,
        rt: &Runtime,
        stream: CUstream,
        slot: usize,
        seq_lens: &TensorView<1>,
        max_seq_len: usize,
    ) -> Result<()> {
        let slot = Self::step_slot(slot)?;
        self.check_runtime(rt)?;
        let batch = crate::validate::validate_seq_lens(seq_lens)?;
        if batch > self.config.max_batch {
            return Err(MlaError::shape(
                "seq_lens.shape[0] (batch)",
                format!("1..={} (the plan's max_batch)", self.config.max_batch),
                batch,
            ));
        }
        if max_seq_len == 0 {
            // A clamp at 0 would give every sequence 0 splits: skipped, nothing written.
            return Err(MlaError::shape(
                "max_seq_len",
                ">= 1 (the page table's capacity in tokens, max_pages * page_size)",
                0,
            ));
        }
        let capacity = max_seq_len.min(u32::MAX as usize);
        if self.kernels.reference {
            // The reference decode has no splits.
            self.step_batch[slot].store(batch, Ordering::Relaxed);
            return Ok(());
        }
        let shape = DecodeShape {
            batch,
            s_q: self.config.s_q,
            heads: self.config.heads,
            page_size: self.config.page_size,
            num_pages: 0,
            max_pages: capacity.div_ceil(self.config.page_size),
            dtypes: self.config.dtypes,
        };
        // SAFETY: checked above: `batch` i32 at a 4-byte aligned non-null address;
        // the slot's num_splits holds max_batch >= batch entries.
        unsafe { self.launch_schedule(rt, stream, seq_lens.ptr, &shape, Counts::Step(slot))? };
        self.step_batch[slot].store(batch, Ordering::Relaxed);
        Ok(())
    }

    /// One layer of a scheduled step: validation, then the decode and combine only, with
    /// the split counts the plan's last [`DecodePlan::schedule_step`] wrote (step slot 0).
    /// The request's batch and `seq_lens` contents must be the ones scheduled: a slot with
    /// no `schedule_step` yet, or a request of another batch, is a typed error at the call
    /// (a graph replay checks nothing; the contents are on the device and are not checked).
    /// A `schedule_step` captured in a graph counts as made, though its counts reach the
    /// device only when the graph is launched: until then the slot's counts are the ones it
    /// held (zeros on a new plan), and a live sequence whose count is 0 is decoded in one
    /// split, still exact, rather than skipped.
    pub fn run_layer(
        &self,
        rt: &Runtime,
        stream: &CudaStream,
        req: &DecodeRequest,
    ) -> Result<DecodeShape> {
        self.run_layer_slot(rt, stream, 0, req)
    }

    /// [`DecodePlan::run_layer`] with the counts of step slot `slot`
    /// ([`DecodePlan::schedule_step_slot`]).
    pub fn run_layer_slot(
        &self,
        rt: &Runtime,
        stream: &CudaStream,
        slot: usize,
        req: &DecodeRequest,
    ) -> Result<DecodeShape> {
        // SAFETY: a cudarc stream is a live stream of its context.
        unsafe {
            self.run_split_slot_raw(
                rt,
                stream.cu_stream(),
                req,
                &SplitParts::default(),
                Some(slot),
            )
        }
    }

    /// [`DecodePlan::run_layer`] on a raw `CUstream`.
    ///
    /// # Safety
    /// As [`DecodePlan::run_raw`].
    pub unsafe fn run_layer_raw(
        &self,
        rt: &Runtime,
        stream: CUstream,
        req: &DecodeRequest,
    ) -> Result<DecodeShape> {
        // SAFETY: forwarded from the caller.
        unsafe { self.run_split_slot_raw(rt, stream, req, &SplitParts::default(), Some(0)) }
    }

    /// [`DecodePlan::run`] on split layouts ([`SplitParts`]): the cache's rope part in its
    /// own tensor (`req.kv_cache` then holds the latent part, 512 wide), q's likewise, or
    /// both. Validated as the fused layout is, each tensor with its own strides; every
    /// kernel and dtype (a split cache takes the `cp.async` decode where a fused one
    /// would take the TMA decode).
    pub fn run_split(
        &self,
        rt: &Runtime,
        stream: &CudaStream,
        req: &DecodeRequest,
        parts: &SplitParts,
    ) -> Result<DecodeShape> {
        // SAFETY: a cudarc stream is a live stream of its context.
        unsafe { self.run_split_raw(rt, stream.cu_stream(), req, parts, false) }
    }

    /// [`DecodePlan::run_split`] on a raw `CUstream`; `scheduled`: as
    /// [`DecodePlan::run_layer`] (the counts of step slot 0).
    ///
    /// # Safety
    /// As [`DecodePlan::run_raw`], for the parts' pointers too.
    pub unsafe fn run_split_raw(
        &self,
        rt: &Runtime,
        stream: CUstream,
        req: &DecodeRequest,
        parts: &SplitParts,
        scheduled: bool,
    ) -> Result<DecodeShape> {
        // SAFETY: forwarded from the caller.
        unsafe { self.run_split_slot_raw(rt, stream, req, parts, scheduled.then_some(0)) }
    }

    /// [`DecodePlan::run_split_raw`] with the counts of step slot `slot` where given (a
    /// scheduled layer), else of its own schedule. Every run: validation, then (with a step
    /// `slot`: the counts of its `schedule_step` are in the workspace) the schedule or its
    /// fold, the decode and the combine.
    ///
    /// # Safety
    /// As [`DecodePlan::run_split_raw`].
    pub unsafe fn run_split_slot_raw(
        &self,
        rt: &Runtime,
        stream: CUstream,
        req: &DecodeRequest,
        parts: &SplitParts,
        slot: Option<usize>,
    ) -> Result<DecodeShape> {
        let slot = slot.map(Self::step_slot).transpose()?;
        let shape = self.check_run(rt, req, parts)?;
        let scheduled = slot.is_some();
        let counts = match slot {
            None => Counts::Runs,
            Some(k) => match self.step_batch[k].load(Ordering::Relaxed) {
                0 => {
                    return Err(MlaError::shape(
                        "schedule_step",
                        format!("a schedule_step into step slot {k} of this plan before run_layer"),
                        "none",
                    ));
                }
                b if b != shape.batch => {
                    return Err(MlaError::shape(
                        "seq_lens.shape[0] (batch of run_layer)",
                        format!("{b} (the batch of step slot {k}'s last schedule_step)"),
                        shape.batch,
                    ));
                }
                _ => Counts::Step(k),
            },
        };
        if self.kernels.reference {
            // SAFETY: forwarded from the caller.
            return unsafe { self.launch_reference(rt, stream, req, parts, shape) };
        }
        // A scheduled layer reads the counts `schedule_step` wrote. Otherwise small batches:
        // every decode CTA runs the schedule's rule itself (SchedFold), so the decode does
        // not wait out a schedule kernel; larger ones launch it.
        // The 64-row TMA decodes' work list cuts the batch on the device itself.
        let list = self.work_list_fixed(rt, req, parts, &shape);
        let fold = if scheduled || list > 0 {
            mla_abi::SchedFold::default()
        } else if self.kernels.folds(shape.batch) {
            let p = self.schedule_params(req.seq_lens.ptr, &shape, Counts::Runs);
            mla_abi::SchedFold {
                tiles: p.tiles.max(1),
                target_ctas: p.target_ctas,
                max_len: p.max_len,
                step_log2: p.step_log2,
            }
        } else {
            // SAFETY: seq_lens holds `batch` i32 (validated); num_splits `max_batch`.
            unsafe { self.launch_schedule(rt, stream, req.seq_lens.ptr, &shape, Counts::Runs)? };
            mla_abi::SchedFold::default()
        };
        // SAFETY: the decode reads split counts in 1..=grid_splits, which the schedule
        // writes (or computes them by the same rule, folded).
        unsafe {
            rt.launch_decode(
                req,
                parts,
                &shape,
                &self.ws,
                &self.kernels,
                self.tactic.tile,
                fold,
                counts,
                list,
                stream,
            )?;
        }
        Ok(shape)
    }

    /// The work list's fixed cost a piece where a run of `req` (validated into `shape`)
    /// takes it, else 0 (the cells): its decode is a 64-row TMA one that may
    /// ([`DecodeKernels::list_fixed_for`]), and the launch model ([`plan::list_pays`]) gives
    /// it the win for a batch of even sequences as long as the page table and the plan's
    /// length hint allow (or `MLA_WORK_LIST=all`).
    fn work_list_fixed(
        &self,
        rt: &Runtime,
        req: &DecodeRequest,
        parts: &SplitParts,
        shape: &DecodeShape,
    ) -> u32 {
        let cells = self.kernels.decode_for_parts(req, parts, shape);
        let k = self.kernels.list_base_for(cells, req, parts, shape);
        let cap = self.ws.capacity();
        let fixed = self.kernels.list_fixed_for(k, shape, cap);
        if fixed == 0 || self.kernels.list_always {
            return fixed;
        }
        let len = shape.max_seq_len().min(self.config.max_seq_len);
        // The e4m3 margin is for cells in a tensor-map form ([`plan::list_margin_pct`]).
        let e4m3_map = self.config.dtypes.kv() == mla_abi::ElemType::Fp8E4m3
            && self.kernels.tma.is_some_and(|t| t.symbol == cells.symbol);
        let key = (
            shape.batch,
            len.div_ceil(mla_abi::decode_tile::BLOCK_N),
            self.ws.list_ctas(rt.device().sm_count),
            e4m3_map,
        );
        let memo = self.list_memo.lock().ok();
        if let Some((asked, pays)) = memo.as_deref().copied().flatten()
            && asked == key
        {
            return if pays { fixed } else { 0 };
        }
        let pays = plan::list_pays(
            &self.schedule,
            self.kernels.grid_splits,
            (key.0, key.1),
            key.2,
            self.kernels.list_fixed,
            cap.max_splits,
            key.3,
        );
        if let Some(mut m) = memo {
            *m = Some((key, pays));
        }
        if pays { fixed } else { 0 }
    }

    /// The schedule kernel's params for `shape`'s batch with lengths at `seq_lens`, writing
    /// the counts array `counts`.
    fn schedule_params(
        &self,
        seq_lens: u64,
        shape: &DecodeShape,
        counts: Counts,
    ) -> ScheduleParams {
        ScheduleParams {
            seq_lens: mla_abi::DevPtr::from_addr(seq_lens),
            num_splits: mla_abi::DevPtr::from_addr(self.ws.ptrs().splits(counts)),
            batch: shape.batch as u32,
            tiles: self.schedule.tiles as u32,
            target_ctas: self.schedule.target_ctas.min(u32::MAX as usize) as u32,
            max_splits: self.kernels.grid_splits as u32,
            max_len: shape.max_seq_len().min(u32::MAX as usize) as u32,
            step_log2: self.schedule.step_log2,
            shard: self.ws.shard,
        }
    }

    /// The schedule kernel on `shape.batch` lengths at `seq_lens`.
    ///
    /// # Safety
    /// `seq_lens` holds `shape.batch <= max_batch` i32; `stream` as in `run_raw`.
    unsafe fn launch_schedule(
        &self,
        rt: &Runtime,
        stream: CUstream,
        seq_lens: u64,
        shape: &DecodeShape,
        counts: Counts,
    ) -> Result<()> {
        let p = self.schedule_params(seq_lens, shape, counts);
        let k = crate::choice::spec(names::SCHEDULE);
        let grid = LaunchShape {
            grid: (1, 1, 1),
            block: k.block,
            smem: k.smem,
        };
        // SAFETY: forwarded from the caller.
        unsafe { launch(rt, k.symbol, grid, stream, &p) }
    }

    /// The reference backend's decode.
    ///
    /// # Safety
    /// `req` validated into `shape`; `stream` as in `run_raw`.
    unsafe fn launch_reference(
        &self,
        rt: &Runtime,
        stream: CUstream,
        req: &DecodeRequest,
        parts: &SplitParts,
        shape: DecodeShape,
    ) -> Result<DecodeShape> {
        let p = crate::launch::decode_params(req, parts, &shape, &self.ws);
        let kernel = self.kernels.decode;
        let grid = LaunchShape {
            grid: (shape.rows() as u32, shape.batch as u32, 1),
            block: kernel.block,
            smem: kernel.smem,
        };
        // SAFETY: validated request; the reference kernel reads q, the cache, the table
        // and the lengths, and writes out and lse only.
        unsafe { launch(rt, kernel.symbol, grid, stream, &p)? };
        Ok(shape)
    }

    /// Validation of a run's request against the request rules, the plan and the device.
    fn check_run(
        &self,
        rt: &Runtime,
        req: &DecodeRequest,
        parts: &SplitParts,
    ) -> Result<DecodeShape> {
        self.check_runtime(rt)?;
        let shape = crate::validate::validate_decode_parts(req, parts, &self.ws.shard)?;
        self.config.check_shape(&shape)?;
        is_supported(self.backend, rt.device(), &shape).map_err(|d| MlaError::Unsupported {
            what: "decode request",
            got: format!("{shape:?}"),
            why: d.to_string(),
        })?;
        check_workspace(&shape, self.ws.capacity())?;
        Ok(shape)
    }
}

// A runtime is shared between threads (one module, many streams); a plan moves to the
// thread that runs it.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<Runtime>();
    shared::<DecodePlan>();
};
