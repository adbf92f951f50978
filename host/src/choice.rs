//! Which kernels a decode runs: the one place that decides it.
//!
//! A plan fixes the backend ([`crate::gate`]: the registry's first backend that the device
//! and the loaded image accept) and the tactic ([`crate::tactic::Tactic::default_for_plan`]
//! unless tuned or given: the tile, the waves, the split cap). From those, [`DecodeKernels::new`]
//! picks once, at plan time, every kernel a run may launch; at run time
//! [`DecodeKernels::decode_for`] only looks at what the request adds (its cache layout and
//! the longest length its page table can address), and [`DecodeKernels::combine_for`] at
//! the live batch. The kernels' launch shapes come from [`mla_abi::kernels::ALL`].
//!
//! Worked example, bf16, H=64, S_q=2 (128 query rows), page 16, on an H200 (sm_90a image):
//! 1. Backend `sm90a`: the device is sm_90, the image holds the `wgmma` kernels.
//! 2. Tile `wg64n64` (`Tile::default_for_plan`): more than 32 rows, bf16 Q, and the `wgmma`
//!    tile runs bf16 there (at 17-32 rows a small plan would take two 16-row tiles, and an
//!    fp8 cache the fp8 16- or 32-row tile in plans of few tokens or small pages); two row
//!    tiles, so a sequence takes at most 32 splits until each split would keep 8 KV blocks,
//!    then up to 128 (`mla_abi::split_bound`); the tile's step is one block
//!    (`Tile::step_log2`).
//! 3. Decode kernel: `mla_decode_wg_bf16`, and for a request whose bf16 cache is
//!    contiguous and 16-byte aligned, with pages of at least 16 tokens and splits of two or
//!    more 64-token blocks, the TMA decode `mla_decode_tma_bf16` instead (`decode_for`;
//!    `crate::tmap` says why each condition holds); an fp8 cache's TMA decodes
//!    (`mla_decode_tma_fp8kv_bf16q`, `mla_decode_tma_fp8`) under the same rule, from pages
//!    of [`E4M3_MAP_MIN_PAGE`] tokens (on 16-token pages their `cp.async` forms, below:
//!    [`TmaForm`]). A bf16
//!    request of at most 32 rows (H=16 at S_q=2, say) takes the small-row TMA decode
//!    `mla_decode_tma32_bf16` in its place. A bf16 cache the map does not take (pages under
//!    16 tokens, strided) with splits of two or more blocks takes a `cp.async` form instead:
//!    `mla_decode_tma32_bf16_cp` up to 32 rows, `mla_decode_tma_bf16_cp` above; an fp8
//!    cache `mla_decode_tma_fp8kv_bf16q_cp` or `mla_decode_tma_fp8_cp`.
//! 4. Schedule: folded into the decode up to [`mla_abi::SCHED_FOLD_MAX_BATCH`] sequences,
//!    the `mla_schedule` kernel above (always the kernel with the tactic's `fold=off`).
//! 5. Combine: when the plan's grid has more than one split, the narrow or wide combine by
//!    chunk count and rows (`mla_abi::names::combine`).
//! 6. Programmatic dependent launch for the decode and combine on the sm_90a and sm_100a
//!    images (not with `pdl=off`; the TMA decode not with `tma=off`).
//!
//! The switches are the tactic's ([`Switches`]); [`Overrides`], the environment's A/B
//! switches, are read here and nowhere else, and a plan folds them into its tactic.

use mla_abi::kernels::{self, Kernel};
use mla_abi::{ElemType, names};

use crate::gate::Backend;
use crate::module::Variant;
use crate::request::{DecodeDtypes, DecodeRequest, DecodeShape, SplitParts};
use crate::tactic::{Switches, Tile};

/// Environment overrides of the tactic's launch switches ([`Switches`]), for A/B
/// measurements of builds that take no tactic string: each is on unless its variable is
/// `0`, and an override only turns a switch off. Read once per process, here only, and
/// applied when a plan is made (so the plan's tactic string names the launch).
/// - `MLA_PDL=0`: `pdl=off` (the decode and combine without programmatic dependent launch).
/// - `MLA_WG_TMA=0`: `tma=off` (the `cp.async` `wgmma` decode where the TMA decode would run).
/// - `MLA_SCHED_FOLD=0`: `fold=off` (the schedule kernel at every batch size).
///
/// One more picks a kernel, and is no tactic switch (the C ABI's 64-byte tactic string has
/// no room for it):
/// - `MLA_TMA32=0`: the 64-row TMA decode where a request of at most 32 rows takes the
///   small-row one by default ([`DecodeKernels::tma32`]; bf16 1.00-1.14x the 64-row one's
///   speed on the H200, fp8 caches 1.11-1.24x the padded 64-row e4m3 decode at 17-32 rows);
///   `MLA_TMA32=bf16`: the small-row decode for bf16 caches only (for A/Bs).
/// - `MLA_TMA32_CP=0`: the `cp.async` `wgmma` decode where a bf16 request of at most 32 rows
///   would take the small-row decode's `cp.async` form ([`DecodeKernels::tma32_cp`]; for
///   A/Bs).
/// - `MLA_TMA32_FORM=cp` / `tma`: the bf16 small-row decode in its `cp.async` form, or its
///   TMA form, at every batch where its tensor map serves ([`Tma32Form`]; for A/Bs). Read at
///   each plan's making, not once: one process can make plans of each form (the plugins
///   `mla_rs_wg` and `mla_rs_cp` do); the plan-free launches take the default.
/// - `MLA_TMA_CP=0`: no `cp.async` form of the 64-row TMA decode ([`DecodeKernels::tma_cp`]
///   `None`; for A/Bs): the `cp.async` `wgmma` decode where the map cannot serve, the map
///   form where it can (fp8 caches on 16-token pages too). `MLA_TMA_CP=all` / `map`: the
///   `cp.async` form on every cache the map serves, or on none ([`TmaForm`], read at each
///   plan's making; for A/Bs of the two copy forms on pages of 16 tokens or more).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overrides {
    pub pdl: bool,
    pub tma: bool,
    pub fold: bool,
    pub tma32: bool,
    pub tma32_fp8: bool,
    pub tma32_cp: bool,
    pub tma_cp: bool,
}

impl Overrides {
    /// The process's overrides.
    pub fn get() -> Overrides {
        static CELL: std::sync::OnceLock<Overrides> = std::sync::OnceLock::new();
        *CELL.get_or_init(|| {
            let on = |var: &str| std::env::var(var).as_deref() != Ok("0");
            let tma32 = std::env::var("MLA_TMA32");
            Overrides {
                pdl: on("MLA_PDL"),
                tma: on("MLA_WG_TMA"),
                fold: on("MLA_SCHED_FOLD"),
                tma32: tma32.as_deref() != Ok("0"),
                tma32_fp8: !matches!(tma32.as_deref(), Ok("0") | Ok("bf16")),
                tma32_cp: on("MLA_TMA32_CP"),
                tma_cp: on("MLA_TMA_CP"),
            }
        })
    }

    /// Whether a bf16 request of at most 32 rows on the `wgmma` tile may take the small-row
    /// TMA decode (neither it nor the TMA decode turned off).
    pub fn small_row_tma(self) -> bool {
        self.tma && self.tma32
    }

    /// `switches` with every switch this override turns off, off.
    pub fn apply(self, switches: Switches) -> Switches {
        Switches {
            pdl: switches.pdl && self.pdl,
            tma: switches.tma && self.tma,
            fold: switches.fold && self.fold,
        }
    }
}

/// The copy form of the bf16 small-row decode where its tensor map serves a request (pages
/// of `TMA_MIN_PAGE` tokens or more, a contiguous fused cache).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tma32Form {
    /// The `cp.async` form from [`TMA32_CP_MIN_BATCH`] sequences on, the TMA form below:
    /// the default. The `cp.async` form's producer warps read each row whole, which the
    /// DRAM streams faster at large batch (1.6-2.6% of the decode's time from B=32 at 32 rows,
    /// level at B=8, on an H100, docs/PERF.md 3.18); the TMA form starts its copies sooner, which pays where
    /// a CTA's split is short (B=1: 1-1.5 us).
    ByBatch,
    /// The `cp.async` form at every batch (`MLA_TMA32_FORM=cp`).
    Cp,
    /// The TMA form at every batch (`MLA_TMA32_FORM=tma`).
    Tma,
}

impl Tma32Form {
    /// The form `MLA_TMA32_FORM` names (`cp`, `tma`), else the default.
    pub fn from_env() -> Tma32Form {
        match std::env::var("MLA_TMA32_FORM").as_deref() {
            Ok("cp") => Tma32Form::Cp,
            Ok("tma") => Tma32Form::Tma,
            _ => Tma32Form::ByBatch,
        }
    }

    /// Whether a batch of `batch` sequences takes the `cp.async` form.
    pub fn cp_at(self, batch: usize) -> bool {
        match self {
            Tma32Form::ByBatch => batch >= TMA32_CP_MIN_BATCH,
            Tma32Form::Cp => true,
            Tma32Form::Tma => false,
        }
    }
}

/// Where the 64-row TMA decodes give way to their `cp.async` forms on caches their tensor
/// map serves (pages of `TMA_MIN_PAGE` tokens or more, a contiguous fused cache). The small-row
/// decodes keep their own rule ([`Tma32Form`]). The work list is the map form's: where the
/// page size alone chose the `cp.async` form and the list pays, the list (a map form) runs
/// instead ([`DecodeKernels::list_base_for`]); under `Cp` the list is off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TmaForm {
    /// The `cp.async` form for fp8 caches on pages under [`E4M3_MAP_MIN_PAGE`] tokens, the
    /// map form elsewhere: the default. At page 16 the e4m3 map form's one issuing thread
    /// copies 36 boxes a block; the `cp.async` form, each consumer warpgroup copying its
    /// own block, took 0.91-0.97x its time at H=128 (S_q 1-2, B 32-128, L=4096; H100,
    /// docs/PERF.md 3.25). From page 32 the map form is faster there (1.15x at page 32,
    /// 1.07-1.51x at page 64). Where the work list pays (H=128 S_q=3 at B 8-32, say) the
    /// list runs, a map form: there it took 0.89-0.97x the `cp.async` form's time.
    ByPage,
    /// The `cp.async` form on every cache (`MLA_TMA_CP=all`).
    Cp,
    /// The map form on every cache it serves (`MLA_TMA_CP=map`).
    Map,
}

/// The page size from which the e4m3 64-row TMA decodes take their tensor map by default
/// ([`TmaForm::ByPage`]).
pub const E4M3_MAP_MIN_PAGE: usize = 32;

impl TmaForm {
    /// The form `MLA_TMA_CP` names (`all`, `map`), else the default; read at each plan's
    /// making, as [`Tma32Form::from_env`] is.
    pub fn from_env() -> TmaForm {
        match std::env::var("MLA_TMA_CP").as_deref() {
            Ok("all") => TmaForm::Cp,
            Ok("map") => TmaForm::Map,
            _ => TmaForm::ByPage,
        }
    }

    /// Whether a 64-row TMA decode of a `kv` cache on pages of `page_size` tokens takes its
    /// `cp.async` form where its map serves.
    pub fn cp_at(self, kv: ElemType, page_size: usize) -> bool {
        match self {
            TmaForm::ByPage => kv == ElemType::Fp8E4m3 && page_size < E4M3_MAP_MIN_PAGE,
            TmaForm::Cp => true,
            TmaForm::Map => false,
        }
    }
}

/// The batch from which the bf16 small-row decode takes its `cp.async` form where its map
/// serves ([`Tma32Form::ByBatch`]).
pub const TMA32_CP_MIN_BATCH: usize = 8;

/// The table entry of a kernel this crate names (every name is in the table).
pub(crate) fn spec(symbol: &'static str) -> &'static Kernel {
    match kernels::find(symbol) {
        Some(k) => k,
        None => unreachable!("{symbol} is not in mla_abi::kernels::ALL"),
    }
}

/// The TMA decode of `decode`, a `wgmma` tile's kernel (bf16 or fp8 cache, bf16 or fp8
/// Q), fed by tensor copies, where `switches` keep it on; pages of fewer than
/// `TMA_MIN_PAGE` tokens make boxes too small to pay. `None` for every other kernel.
pub(crate) fn tma_decode_for(
    decode: &Kernel,
    switches: Switches,
    page_size: usize,
) -> Option<&'static str> {
    let symbol = match decode.symbol {
        names::DECODE_WG_BF16 => names::DECODE_TMA_BF16,
        names::DECODE_WG_FP8KV_BF16Q => names::DECODE_TMA_FP8KV_BF16Q,
        names::DECODE_WG_FP8 => names::DECODE_TMA_FP8,
        _ => return None,
    };
    (switches.tma && page_size >= mla_abi::decode_tile::TMA_MIN_PAGE).then_some(symbol)
}

/// The decode kernel of `tile` for `dtypes` (the tile must pass `Tile::check`).
pub fn tile_kernel(tile: Tile, dtypes: DecodeDtypes) -> &'static Kernel {
    use DecodeDtypes::*;
    use names::*;
    spec(match (tile, dtypes) {
        (Tile::M64N64, Bf16) => DECODE_BF16,
        (Tile::M64N64, Fp16) => DECODE_FP16,
        (Tile::M64N64, Fp8KvBf16Q) => DECODE_FP8KV_BF16Q,
        (Tile::M64N64, Fp8) => DECODE_FP8,
        (Tile::M16N64, Bf16) => DECODE16_BF16,
        (Tile::M16N64, Fp16) => DECODE16_FP16,
        (Tile::M16N64, Fp8KvBf16Q) => DECODE16_FP8KV_BF16Q,
        (Tile::M16N64, Fp8) => DECODE16_FP8,
        // Only the fp8 caches pass Tile::check; the symbols are in the sm_90a image only.
        (Tile::M32N64, Fp8) => DECODE32_FP8,
        (Tile::M32N64, _) => DECODE32_FP8KV_BF16Q,
        // fp16 does not pass Tile::check; the symbols are in the sm_90a image only.
        (Tile::Wg64N64, Fp8KvBf16Q) => DECODE_WG_FP8KV_BF16Q,
        (Tile::Wg64N64, Fp8) => DECODE_WG_FP8,
        (Tile::Wg64N64, _) => DECODE_WG_BF16,
    })
}

/// The reference backend's decode kernel for `dtypes`.
pub fn reference_kernel(dtypes: DecodeDtypes) -> &'static Kernel {
    use DecodeDtypes::*;
    use names::*;
    spec(match dtypes {
        Bf16 => DECODE_REF_BF16,
        Fp16 => DECODE_REF_FP16,
        Fp8KvBf16Q => DECODE_REF_FP8KV_BF16Q,
        Fp8 => DECODE_REF_FP8,
    })
}

/// Every kernel a decode with one tactic may launch, fixed at plan time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeKernels {
    /// The decode kernel: the reference kernel on the reference backend, else the tile's.
    pub decode: &'static Kernel,
    /// The TMA decode that stands in for `decode` where a request suits it
    /// ([`DecodeKernels::decode_for`]); `None` where it never can.
    pub tma: Option<&'static Kernel>,
    /// `tma` on the work list (`names::DECODE_TMA_*_LIST`), launched in its place where a
    /// run takes the list ([`DecodeKernels::list_fixed_for`]); `None` where `tma` is.
    pub tma_list: Option<&'static Kernel>,
    /// The small-row TMA decode that stands in for `tma` where a request has at most
    /// `decode_tile::TMA32_ROWS` rows; `None` where it never can
    /// ([`DecodeKernels::small_rows`]).
    pub tma32: Option<&'static Kernel>,
    /// The bf16 small-row TMA decode's `cp.async` form, which stands in for `decode` where a
    /// request of at most `decode_tile::TMA32_ROWS` rows suits the TMA decode but not its
    /// tensor map (pages of fewer than `TMA_MIN_PAGE` tokens, strided caches:
    /// [`crate::tmap::tma_unsupported`]), and for the bf16 `tma32` where `tma32_form` says
    /// so; `None` where it never can.
    pub tma32_cp: Option<&'static Kernel>,
    /// Where the bf16 `tma32` gives way to `tma32_cp`.
    pub tma32_form: Tma32Form,
    /// The TMA decode's `cp.async` form, which stands in for `decode` where a request suits
    /// the TMA decode but not its tensor map, and for `tma` where `tma_form` says so (fp8
    /// caches on 16-token pages by default): bf16 above `decode_tile::TMA32_ROWS` rows
    /// (one warpgroup copies each block from the page table a block ahead), an fp8 cache
    /// at any rows (the e4m3 pair loop, each warpgroup copying its own block); `None` where
    /// it never can.
    pub tma_cp: Option<&'static Kernel>,
    /// Where the 64-row TMA decodes give way to their `cp.async` forms on caches their map
    /// serves.
    pub tma_form: TmaForm,
    /// Batches up to this many sequences fold the split schedule into the decode; larger
    /// ones launch the schedule kernel first. 0: never folded.
    pub fold_max_batch: usize,
    /// The largest split count (the decode grid's z extent); above 1 a combine follows.
    pub grid_splits: usize,
    /// The splits the schedule gives a lone sequence before its bound (the plan's target
    /// CTAs over its row tiles; `usize::MAX` where the host chose the splits): a batch of
    /// `n` even sequences gets about `wave_splits / n` each, at most `grid_splits`.
    pub wave_splits: usize,
    /// The combine writes fp16 (else bf16).
    pub combine_fp16: bool,
    /// The decode and combine launch with programmatic dependent launch.
    pub pdl: bool,
    /// Only the reference kernel runs (no schedule, no combine).
    pub reference: bool,
    /// The 64-row TMA decodes' work list ([`mla_abi::DecodeParams::list_fixed`]): each
    /// sequence's fixed cost in KV blocks, 0 off (they walk the schedule's cells). A plan
    /// takes it from [`work_list_from_env`]; [`DecodeKernels::list_fixed_for`] says where a
    /// launch uses it.
    pub list_fixed: u32,
    /// Every launch [`DecodeKernels::list_fixed_for`] allows takes the work list, not only
    /// those the launch model picks (`MLA_WORK_LIST=all`).
    pub list_always: bool,
}

/// The work list's fixed cost per sequence in KV blocks by default: a cell's prologue and
/// epilogue at H=128 on the H200 (`plan::balanced_target`'s `CELL_FIXED_BLOCKS`).
pub const WORK_LIST_FIXED: u32 = 4;

/// `MLA_WORK_LIST` (A/Bs of the work list): `0` off (the 64-row TMA decodes walk the
/// schedule's cells), `all` on wherever a launch allows it, else on where the launch model
/// says it pays; with the fixed cost [`WORK_LIST_FIXED`]. Returns (fixed cost or 0,
/// always).
pub fn work_list_from_env() -> (u32, bool) {
    match std::env::var("MLA_WORK_LIST").as_deref() {
        Ok("0") => (0, false),
        Ok("all") => (WORK_LIST_FIXED, true),
        _ => (WORK_LIST_FIXED, false),
    }
}

impl DecodeKernels {
    /// The kernels for `tile` with the launch `switches` on `backend` (whose image
    /// `variant` is loaded), `dtypes`, pages of `page_size` tokens and a grid of
    /// `grid_splits` splits.
    pub fn new(
        backend: Backend,
        variant: Variant,
        tile: Tile,
        switches: Switches,
        dtypes: DecodeDtypes,
        page_size: usize,
        grid_splits: usize,
    ) -> DecodeKernels {
        let reference = backend == Backend::Reference;
        let decode = if reference {
            reference_kernel(dtypes)
        } else {
            tile_kernel(tile, dtypes)
        };
        let tma = tma_decode_for(decode, switches, page_size).map(spec);
        let tma_list = tma.map(|t| {
            spec(match t.symbol {
                names::DECODE_TMA_FP8KV_BF16Q => names::DECODE_TMA_FP8KV_BF16Q_LIST,
                names::DECODE_TMA_FP8 => names::DECODE_TMA_FP8_LIST,
                _ => names::DECODE_TMA_BF16_LIST,
            })
        });
        let over = Overrides::get();
        // Its producer reads any fused cache the `cp.async` decode reads (bf16 only).
        let tma32_cp = (switches.tma
            && over.small_row_tma()
            && over.tma32_cp
            && decode.symbol == names::DECODE_WG_BF16)
            .then(|| spec(names::DECODE_TMA32_BF16_CP));
        let tma_cp = match decode.symbol {
            names::DECODE_WG_BF16 => Some(names::DECODE_TMA_BF16_CP),
            names::DECODE_WG_FP8KV_BF16Q => Some(names::DECODE_TMA_FP8KV_BF16Q_CP),
            names::DECODE_WG_FP8 => Some(names::DECODE_TMA_FP8_CP),
            _ => None,
        }
        .filter(|_| switches.tma && over.tma_cp)
        .map(spec);
        let kernels = DecodeKernels {
            decode,
            tma,
            tma_list,
            tma32: None,
            tma32_cp,
            tma32_form: Tma32Form::ByBatch,
            tma_cp,
            tma_form: TmaForm::ByPage,
            fold_max_batch: if switches.fold && !reference {
                mla_abi::SCHED_FOLD_MAX_BATCH
            } else {
                0
            },
            grid_splits: grid_splits.max(1),
            wave_splits: usize::MAX,
            combine_fp16: dtypes.out() == ElemType::Fp16,
            // The portable (sm_80) image's kernels have no `griddepcontrol.wait`.
            pdl: switches.pdl && variant != Variant::Portable,
            reference,
            list_fixed: 0,
            list_always: false,
        };
        kernels.small_rows(over.tma32, over.tma32_fp8)
    }

    /// [`DecodeKernels`] whose bf16 small-row decode takes its copy form by `form` where its
    /// map serves (a plan reads [`Tma32Form::from_env`]).
    pub fn with_tma32_form(self, form: Tma32Form) -> DecodeKernels {
        DecodeKernels {
            tma32_form: form,
            ..self
        }
    }

    /// [`DecodeKernels`] whose 64-row TMA decodes take their `cp.async` forms by `form` where
    /// their map serves (a plan reads [`TmaForm::from_env`]).
    pub fn with_tma_form(self, form: TmaForm) -> DecodeKernels {
        DecodeKernels {
            tma_form: form,
            ..self
        }
    }

    /// [`DecodeKernels`] that run the small-row TMA decode (`on`) where a request of at most
    /// `decode_tile::TMA32_ROWS` rows takes the TMA decode: bf16, and fp8 caches with `fp8`.
    /// By default both (`MLA_TMA32`, [`Overrides`]).
    pub fn small_rows(self, on: bool, fp8: bool) -> DecodeKernels {
        let tma32 = self
            .tma
            .filter(|_| on)
            .and_then(|t| match t.symbol {
                names::DECODE_TMA_BF16 => Some(names::DECODE_TMA32_BF16),
                names::DECODE_TMA_FP8KV_BF16Q if fp8 => Some(names::DECODE_TMA32_FP8KV_BF16Q),
                names::DECODE_TMA_FP8 if fp8 => Some(names::DECODE_TMA32_FP8),
                _ => None,
            })
            .map(spec);
        DecodeKernels { tma32, ..self }
    }

    /// [`DecodeKernels`] whose 64-row TMA decodes may take the work list with a fixed cost
    /// of `fixed` blocks per sequence (0: off), wherever allowed with `always`.
    pub fn with_work_list(self, fixed: u32, always: bool) -> DecodeKernels {
        DecodeKernels {
            list_fixed: fixed,
            list_always: always,
            ..self
        }
    }

    /// The work list's fixed cost for a launch of `kernel` on `shape` with a workspace of
    /// `capacity`, or 0 where it walks the cells: on for the 64-row TMA decodes (`tma`;
    /// not their `cp.async` forms, not the small-row ones) of a plan that has it, where the
    /// grid has a combine and the workspace two splits or more, and the batch's cost fits
    /// the decode's 32-bit sums. Where on, `tma_list` runs in `kernel`'s place.
    pub fn list_fixed_for(
        &self,
        kernel: &Kernel,
        shape: &DecodeShape,
        capacity: crate::plan::WorkspaceCapacity,
    ) -> u32 {
        let blocks = (shape.max_pages as u64 * shape.page_size as u64)
            .div_ceil(mla_abi::decode_tile::BLOCK_N as u64);
        let cost = shape.batch as u64 * (blocks + self.list_fixed as u64 + 1);
        if self.list_fixed > 0
            && !self.reference
            && self.grid_splits > 1
            && capacity.max_splits > 1
            && self.tma_list.is_some()
            && self.tma.is_some_and(|t| t.symbol == kernel.symbol)
            && cost < 1 << 31
        {
            self.list_fixed
        } else {
            0
        }
    }

    /// [`DecodeKernels`] whose schedule gives a lone sequence `wave_splits` splits before
    /// its bound (see the field).
    pub fn with_wave_splits(self, wave_splits: usize) -> DecodeKernels {
        DecodeKernels {
            wave_splits: wave_splits.max(1),
            ..self
        }
    }

    /// The splits each of `batch` even sequences gets (the schedule's even share).
    fn even_splits(&self, batch: usize) -> usize {
        (self.wave_splits / batch.max(1)).clamp(1, self.grid_splits)
    }

    /// The decode kernel for a validated request: the TMA decode where the request's cache
    /// suits it ([`crate::tmap::tma_unsupported`]) and the splits of its batch's even share
    /// hold two or more blocks, or at any length under fp8 Q ([`crate::tmap::tma_pays`]),
    /// else [`DecodeKernels::decode`]. The even share, not the grid's split bound: at
    /// H=128 B=8 L=1024 the bound (32) gave one block per split where the schedule gives
    /// two, and the `cp.async` decode ran (H200: bf16 28.0 -> 27.4 us, S_q=2 33.8 -> 30.1;
    /// fp8 Q 30.6 -> 24.5; docs/PERF.md). A sequence the schedule gives more than its
    /// share (its batch's others short) runs the TMA decode with shorter splits.
    pub fn decode_for(&self, req: &DecodeRequest, shape: &DecodeShape) -> &'static Kernel {
        self.decode_for_parts(req, &SplitParts::default(), shape)
    }

    /// [`DecodeKernels::decode_for`] with the split layouts of `parts`: a cache split in two
    /// tensors never takes the TMA decode (its one tensor map, and the `cp.async` form's
    /// one row address, span fused rows); a split q does not matter (q is loaded the same
    /// way by every decode).
    pub fn decode_for_parts(
        &self,
        req: &DecodeRequest,
        parts: &SplitParts,
        shape: &DecodeShape,
    ) -> &'static Kernel {
        let pays = crate::tmap::tma_pays(
            shape.dtypes,
            shape.max_seq_len(),
            self.even_splits(shape.batch),
        );
        if parts.kpe_cache.is_some() || !pays {
            return self.decode;
        }
        match self.tma {
            Some(tma) if crate::tmap::tma_unsupported(req, shape).is_none() => {
                let rows = shape.rows();
                self.small_row(rows, shape.batch).unwrap_or_else(|| {
                    if self.tma_form.cp_at(shape.dtypes.kv(), shape.page_size) {
                        self.cp_form(rows).unwrap_or(tma)
                    } else {
                        tma
                    }
                })
            }
            _ => self.cp_form(shape.rows()).unwrap_or(self.decode),
        }
    }

    /// The decode a run of `req` checks the work list against
    /// ([`DecodeKernels::list_fixed_for`]): `cells`, the run's
    /// [`DecodeKernels::decode_for_parts`], except
    /// where only [`TmaForm::ByPage`] gave an fp8 cache the `cp.async` form: there the map
    /// form it displaced, so that a run the list pays for takes the list (a map-form
    /// kernel). At page 16, H=128 S_q=3 (B 8-32, L 4096-16384; H100, docs/PERF.md 3.25) the
    /// list took 0.89-0.94x the `cp.async` form's time for the fp8 cache and 0.92-0.97x for
    /// fp8 Q; where the list does not pay, the `cp.async` form runs.
    pub fn list_base_for(
        &self,
        cells: &'static Kernel,
        req: &DecodeRequest,
        parts: &SplitParts,
        shape: &DecodeShape,
    ) -> &'static Kernel {
        if self.tma_form == TmaForm::ByPage {
            let map = DecodeKernels {
                tma_form: TmaForm::Map,
                ..*self
            }
            .decode_for_parts(req, parts, shape);
            if self.tma.is_some_and(|t| t.symbol == map.symbol) {
                return map;
            }
        }
        cells
    }

    /// The `cp.async` form of the TMA decode for `rows` query rows, where the plan has it:
    /// bf16 the small-row decode's up to `decode_tile::TMA32_ROWS` rows, the 64-row decode's
    /// above; an fp8 cache (no small-row form) the 64-row decode's at any rows.
    fn cp_form(&self, rows: usize) -> Option<&'static Kernel> {
        let e4m3 = self
            .tma_cp
            .is_some_and(|k| k.symbol != names::DECODE_TMA_BF16_CP);
        if rows <= mla_abi::decode_tile::TMA32_ROWS && !e4m3 {
            self.tma32_cp
        } else {
            self.tma_cp
        }
    }

    /// The small-row TMA decode where `rows` query rows fit it (at most
    /// `decode_tile::TMA32_ROWS`) and the plan has it, for a batch of `batch` sequences on
    /// pages its map serves: the bf16 one in the copy form `tma32_form` gives that batch.
    fn small_row(&self, rows: usize, batch: usize) -> Option<&'static Kernel> {
        let tma32 = self
            .tma32
            .filter(|_| rows <= mla_abi::decode_tile::TMA32_ROWS)?;
        let cp = self
            .tma32_cp
            .filter(|_| tma32.symbol == names::DECODE_TMA32_BF16 && self.tma32_form.cp_at(batch));
        Some(cp.unwrap_or(tma32))
    }

    /// Whether a batch of `batch` sequences folds the schedule into the decode.
    pub fn folds(&self, batch: usize) -> bool {
        batch <= self.fold_max_batch
    }

    /// The combine for `rows` query rows in all (`batch * s_q * heads`) on `sm_count` SMs
    /// when any sequence may take the grid's splits, or `None` when the grid has one split
    /// (the decode writes the output itself). A launch uses [`DecodeKernels::combine_for_batch`].
    pub fn combine_for(&self, rows: usize, sm_count: u32) -> Option<&'static Kernel> {
        self.combine_expecting(self.grid_splits, rows, sm_count)
    }

    /// The combine for a batch of `batch` sequences of `rows` query rows each on
    /// `sm_count` SMs, or `None` when the grid has one split (the decode writes the output
    /// itself). Chosen for the splits a batch of even sequences gets.
    pub fn combine_for_batch(
        &self,
        batch: usize,
        rows: usize,
        sm_count: u32,
    ) -> Option<&'static Kernel> {
        self.combine_expecting(self.even_splits(batch), batch * rows, sm_count)
    }

    /// [`names::combine_expecting`] for `splits` chunks a sequence over `rows` rows in all,
    /// or `None` when the grid has one split.
    fn combine_expecting(
        &self,
        splits: usize,
        rows: usize,
        sm_count: u32,
    ) -> Option<&'static Kernel> {
        (self.grid_splits > 1 && !self.reference).then(|| {
            spec(names::combine_expecting(
                self.combine_fp16,
                self.grid_splits as u32,
                splits as u32,
                rows as u64,
                sm_count,
            ))
        })
    }

    /// Every kernel a run may launch for up to `max_batch` sequences of `rows` query rows
    /// each, in launch order. Both copy forms of the 64-row TMA decode are listed where the
    /// plan has both, though on some page sizes only one of them runs ([`TmaForm`]): a
    /// request's cache layout picks between them too ([`crate::tmap::tma_unsupported`]).
    pub fn all(&self, max_batch: usize, rows: usize, sm_count: u32) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.reference {
            out.push(self.decode.symbol);
            return out;
        }
        if max_batch > self.fold_max_batch {
            out.push(names::SCHEDULE);
        }
        // The small-row decode's forms for the smallest and the largest batch (the form
        // changes once with the batch), each listed once.
        for batch in [1, max_batch.max(1)] {
            if let Some(t) = self.small_row(rows, batch)
                && !out.contains(&t.symbol)
            {
                out.push(t.symbol);
            }
        }
        if let Some(t) = self.tma {
            out.push(t.symbol);
        }
        // The work list's kernel, where a launch may take it (the launch model decides).
        if let Some(t) = self.tma_list
            && self.list_fixed > 0
            && self.grid_splits > 1
        {
            out.push(t.symbol);
        }
        if let Some(t) = self.cp_form(rows)
            && !out.contains(&t.symbol)
        {
            out.push(t.symbol);
        }
        out.push(self.decode.symbol);
        // The narrow or wide combine: the choice is not monotonic in the batch (its even
        // splits and its rows both move), so every batch the plan admits is asked, until
        // both builds are listed.
        let mut combines = 0;
        for batch in 1..=max_batch.max(1) {
            if let Some(c) = self.combine_for_batch(batch, rows, sm_count)
                && !out.contains(&c.symbol)
            {
                out.push(c.symbol);
                combines += 1;
                if combines == 2 {
                    break;
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `all` lists the combine of every batch up to the plan's: with a grid of 16 splits, a
    /// wave of 33 and 256 rows, batches 1 and 5 take one build and batch 4 the other (found
    /// by a sweep; so do the other rows here).
    #[test]
    fn all_lists_the_combine_of_every_batch() {
        for (grid, wave, rows, max_batch) in [
            (16, 33, 256, 5),
            (16, 66, 96, 12),
            (16, 66, 128, 9),
            (128, 4, 48, 23),
            (64, 8, 100, 200),
        ] {
            let k = DecodeKernels::new(
                Backend::Sm90a,
                Variant::Sm90a,
                Tile::Wg64N64,
                Switches::ON,
                DecodeDtypes::Bf16,
                1,
                grid,
            )
            .with_wave_splits(wave);
            let all = k.all(max_batch, rows, 132);
            for b in 1..=max_batch {
                if let Some(c) = k.combine_for_batch(b, rows, 132) {
                    assert!(
                        all.contains(&c.symbol),
                        "grid {grid} wave {wave} rows {rows}: batch {b} runs {} not in {all:?}",
                        c.symbol
                    );
                }
            }
        }
    }
}
