//! The launch choices the decode kernels expose, as one value with one canonical string.
//!
//! A [`Tactic`] names a tile, the split-KV schedule knobs and the launch switches
//! ([`Switches`]: programmatic dependent launch, the TMA decode, the folded schedule). Its
//! `Display` form (`tile=m64n64,waves=1,splits<=64`, then `,pdl=off`, `,tma=off`,
//! `,fold=off` for a switch that is off) is the only spelling used anywhere: logs, bench ids,
//! plan info and the autotune cache all print and parse exactly that string, so a string
//! names the launch it describes.

use crate::DecodeDtypes;
use crate::error::MlaError;
use crate::gate::Backend;
use crate::plan;
use mla_abi::{MAX_SPLITS, decode_tile};
use std::fmt;
use std::str::FromStr;

/// Fewest sequences a plan must admit for an fp8 cache with 17 to 32 rows to take the
/// 32-row tile ([`Tile::default_on`]). Below, two 16-row CTAs per sequence and split keep
/// twice the CTAs busy: H200, fp8 KV, H=16 S_q=2 L=4096, `mla bench` plan path, B=1 15.2
/// (16-row) against 19.2 us (32-row), B=8 27.3 against 29.5; from B=64 the 32-row tile
/// leads (B=128 182.8 against 215.0 us; docs/PERF.md, section 3.4).
pub const M32_MIN_BATCH: usize = 9;

/// Fewest tokens a plan must admit in all (`max_batch * max_seq_len`) for an fp8 cache
/// under bf16 Q with 17 to 32 rows to take the `wgmma` tile, whose TMA decode runs the e4m3
/// tensor cores (by default the small-row decode's two-consumer fp8 forms; measured below
/// with the rows padded to 64, which they beat by 1.11-1.26x at B=128, so the bound is
/// conservative), over the 16- and 32-row kernels that convert fp8 in registers; its
/// sequences must also admit [`E4M3_32_ROW_MIN_LEN`] tokens.
/// H200, peers' harness, H=16 S_q=2, page 64, us (the better of the 16- and 32-row tiles
/// against `wgmma`): at 65536 tokens the small tiles lead (B=1 L=65536 40.3 / 44.9, B=16
/// L=4096 38.2 / 41.4, B=256 L=256 49.6 / 51.9; B=32 L=2048 39.0 / 37.7), from 131072 the
/// `wgmma` tile (B=1 L=131072 63.5 / 60.4, B=2 L=65536 61.2 / 58.5, B=8 L=16384 62.1 / 56.1,
/// B=32 L=4096 58.7 / 53.9, B=128 L=1024 58.5 / 55.0, B=128 L=16384 652.4 / 544.0; page 16
/// at B=64 L=4096 99.1 / 100.0) (docs/PERF.md, section 3.4).
pub const E4M3_32_ROW_MIN_TOKENS: usize = 131072;
/// The longest sequence a plan must admit for [`E4M3_32_ROW_MIN_TOKENS`] to apply.
pub const E4M3_32_ROW_MIN_LEN: usize = 1024;
/// [`E4M3_32_ROW_MIN_TOKENS`] for fp8 Q (one Q part, half of S's `wgmma`s), at any length:
/// B=8 L=8192 38.1 / 36.3, B=32 L=2048 38.4 / 35.4, B=128 L=512 39.0 / 34.5, B=256 L=256
/// 49.7 / 42.5, B=1 L=65536 40.4 / 40.7; below, B=8 L=4096 26.7 / 32.6 (same runs).
pub const E4M3_32_ROW_MIN_TOKENS_FP8Q: usize = 65536;

/// Bf16 with 17 to 32 rows on sm_90a, pages of 16 or more: the most tokens in all
/// (`max_batch * max_seq_len`, sequences of at most 4096) for which two 16-row CTAs per split
/// beat the `wgmma` tile's small-row TMA decode. H200, peers' harness, H=16 S_q=2, page 64, us
/// (16-row against small-row TMA): B=1 L=1024 13.2 / 16.0, B=1 L=4096 16.6 / 18.6, B=8
/// L=1024 18.6 / 21.0 (two runs of one session); from 32768 the small-row kernel leads (one
/// run, two repeats each: B=8 L=4096 32.0 / 29.8, page 16 32.2 / 28.5, B=32 L=1024 32.0 /
/// 30.8, B=16 L=2048 32.0 / 31.1) (docs/PERF.md, section 3.12).
pub const TMA32_SMALL_PLAN_TOKENS: usize = 16384;

/// Bf16 with at most 16 rows on sm_90a, pages of 16 or more: plans of at least
/// [`crate::choice::TMA32_CP_MIN_BATCH`] sequences, sequences of 4096 tokens or more and this
/// many tokens in all take the `wgmma` tile (its small-row decode in the `cp.async` form, rows
/// read whole) over the 16-row tile. H100, peers' harness, H=16 S_q=1, page 64, same run, us
/// (16-row against small-row `cp.async`): B=32 L=16384 235.7 / 232.6, B=64 L=16384 443.2 /
/// 435.5, B=128 L=4096 234.2 / 231.9, B=128 L=16384 854.5 / 832.4, B=8 L=131072 443.6 / 435.6;
/// below it the 16-row tile leads or is level: B=64 L=4096 126.5 / 126.3, B=8 L=16384 71.4 /
/// 72.3, B=128 L=1024 69.8 / 71.4, B=4 L=65536 127.2 / 128.2 (docs/PERF.md 3.18).
pub const TMA32_16ROW_MIN_TOKENS: usize = 1 << 19;

/// The extent of a plan that the tile choice reads: up to `max_batch` sequences of up to
/// `max_seq_len` tokens, in pages of `page_size` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanSize {
    pub max_batch: usize,
    pub max_seq_len: usize,
    pub page_size: usize,
}

impl PlanSize {
    /// A plan of unknown size: as many sequences, as long, with pages as large, as the ABI
    /// allows.
    pub const UNBOUNDED: PlanSize = PlanSize {
        max_batch: usize::MAX,
        max_seq_len: usize::MAX,
        page_size: usize::MAX,
    };

    /// Tokens in all, `max_batch * max_seq_len` (saturating).
    pub fn tokens(self) -> usize {
        self.max_batch.saturating_mul(self.max_seq_len)
    }
}

/// Whether a plan of up to `max_batch` sequences of up to `max_seq_len` tokens is small
/// enough that two 16-row CTAs per split beat one CTA for 17 to 32 rows: sequences of at
/// most 4096 tokens, 32768 in all. H200, peers' harness, H=16 S_q=2. bf16, same run
/// (16-row against `wgmma`, us): B=1 L=1024 15.6 / 18.8, B=8 L=4096 35.6 / 39.6, B=32
/// L=1024 35.5 / 38.8; outside, the `wgmma` tile leads: B=1 L=16384 33.1 / 31.1, B=32
/// L=4096 90.9 / 69.8 (docs/PERF.md, section 3.2). fp8 (16-row against 32-row, two runs):
/// B=32 L=1024 26.8 / 29.8, while B=32 L=4096 62.3 / 60.1 and B=64 L=4096 109.0 / 101.5
/// (section 3.4). Bf16 with pages of 16 or more takes [`TMA32_SMALL_PLAN_TOKENS`] instead.
pub fn small_plan(max_batch: usize, max_seq_len: usize) -> bool {
    max_seq_len <= 4096 && max_batch.saturating_mul(max_seq_len) <= 32768
}

/// Most waves of CTAs the split scheduler may aim for. Past a few waves the extra
/// partials cost more in the combine than they win in occupancy.
pub const MAX_WAVES: u32 = 4;

// The tile names below spell out the ABI's tile constants; a change there must show up here.
const _: () = assert!(
    decode_tile::BLOCK_M == 64 && decode_tile::BLOCK_M_SMALL == 16 && decode_tile::BLOCK_N == 64
);

/// What [`Tactic::from_str`] accepts, for error messages.
fn canonical_form() -> String {
    let tiles: Vec<&str> = Tile::ALL.iter().map(|t| t.name()).collect();
    format!(
        "tile={},waves=<1..={MAX_WAVES}>,splits<=<1..={MAX_SPLITS}>[,pdl=off][,tma=off][,fold=off]",
        tiles.join("|")
    )
}

/// The launch switches of a [`Tactic`], each on unless turned off (for A/B measurements;
/// the results are the same either way):
/// - `pdl`: the decode and combine launch with programmatic dependent launch (on the images
///   whose kernels wait for their predecessor: sm_90a and sm_100a);
/// - `tma`: the bf16 `wgmma` tile runs the TMA-fed decode where a request suits it
///   (`DecodeKernels::decode_for`);
/// - `fold`: batches of up to `mla_abi::SCHED_FOLD_MAX_BATCH` sequences compute the split
///   schedule inside the decode instead of launching the schedule kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Switches {
    pub pdl: bool,
    pub tma: bool,
    pub fold: bool,
}

impl Switches {
    /// Every switch on: the default launch.
    pub const ON: Switches = Switches {
        pdl: true,
        tma: true,
        fold: true,
    };

    /// The switches in canonical order with their names.
    fn named(self) -> [(&'static str, bool); 3] {
        [("pdl", self.pdl), ("tma", self.tma), ("fold", self.fold)]
    }
}

impl Default for Switches {
    fn default() -> Self {
        Switches::ON
    }
}

/// The decode tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tile {
    /// `decode_tile::BLOCK_M` = 64 query rows x `decode_tile::BLOCK_N` = 64 KV tokens per
    /// step, `mma.sync` on every arch (4 row groups x 2 column halves of warps).
    M64N64,
    /// `decode_tile::BLOCK_M_SMALL` = 16 query rows x 64 tokens (1 row group x 8 column
    /// splits): a quarter of the MMA work of `M64N64` when `s_q * heads <= 16`; the default
    /// there ([`Tile::default_for`]) and, on sm_90a, for fp8 caches up to 32 rows
    /// ([`Tile::default_on`]); a tuner candidate up to 32 rows.
    M16N64,
    /// 32 rows x 64 tokens with an fp8 cache (sm_90a image): the fp8 16-row kernel with two
    /// row groups per warp, so each fp8 block is read and converted once for 32 rows; the
    /// default there for 17..=32 rows in mid-sized plans ([`Tile::default_for_plan`]).
    M32N64,
    /// 64 rows x 64 tokens with `wgmma` (two warpgroups, accumulators in registers): sm_90a
    /// image, bf16 Q with a bf16 or fp8 cache ([`Tile::check`]); the default there for more
    /// than 16 rows ([`Tile::default_on`]).
    Wg64N64,
}

impl Tile {
    pub const ALL: [Tile; 4] = [Tile::M64N64, Tile::M16N64, Tile::M32N64, Tile::Wg64N64];

    /// [`Tile::default_for_plan`] for a plan of unknown size ([`PlanSize::UNBOUNDED`]).
    pub fn default_on(rows: usize, backend: Backend, dtypes: DecodeDtypes) -> Tile {
        Tile::default_for_plan(rows, PlanSize::UNBOUNDED, backend, dtypes)
    }

    /// The default tile for `rows` query rows in a plan of `size` on `backend` with
    /// `dtypes`: on sm_90a
    /// with an fp8 cache the 16-row tile up to 16 rows; up to 32 the `wgmma` tile (its e4m3
    /// TMA decode, the small-row fp8 forms by default) in plans of [`E4M3_32_ROW_MIN_TOKENS`]
    /// tokens or more
    /// ([`E4M3_32_ROW_MIN_TOKENS_FP8Q`] under fp8 Q) with pages the TMA decode takes, else
    /// the 32-row tile from [`M32_MIN_BATCH`] sequences on, unless the plan is small
    /// ([`small_plan`]; two 16-row tiles otherwise); with bf16 at 17-32 rows and pages of 16
    /// or more, the `wgmma` tile (its small-row TMA decode) outside plans of sequences of at
    /// most 4096 tokens and [`TMA32_SMALL_PLAN_TOKENS`] in all, else two 16-row tiles; the
    /// `wgmma` tile where it runs (sm_90a;
    /// any dtypes but fp16) and the rows fill more than a 16-row tile, except two 16-row
    /// tiles for up to 32 rows in a small plan; else [`Tile::default_for`].
    pub fn default_for_plan(
        rows: usize,
        size: PlanSize,
        backend: Backend,
        dtypes: DecodeDtypes,
    ) -> Tile {
        let PlanSize {
            max_batch,
            max_seq_len,
            page_size,
        } = size;
        // Rows that fit two 16-row tiles, in a plan small enough that two CTAs per split pay.
        let fits_two_16 = rows <= 2 * decode_tile::BLOCK_M_SMALL;
        let small = fits_two_16 && small_plan(max_batch, max_seq_len);
        // fp8 caches up to 32 rows: the sm_90a image's 16- and 32-row kernels convert fp8
        // in registers; they beat the `wgmma` tile at 16 rows and in small plans, and
        // wherever its decode would not be the TMA one (docs/PERF.md, section 3.4).
        if backend == Backend::Sm90a && dtypes.kv() == mla_abi::ElemType::Fp8E4m3 {
            let tokens = size.tokens();
            let e4m3_pays = page_size >= decode_tile::TMA_MIN_PAGE
                && if dtypes == DecodeDtypes::Fp8 {
                    tokens >= E4M3_32_ROW_MIN_TOKENS_FP8Q
                } else {
                    tokens >= E4M3_32_ROW_MIN_TOKENS && max_seq_len >= E4M3_32_ROW_MIN_LEN
                };
            if rows > decode_tile::BLOCK_M_SMALL && fits_two_16 && e4m3_pays {
                return Tile::Wg64N64;
            }
            if rows <= decode_tile::BLOCK_M_SMALL
                || small
                || (fits_two_16 && max_batch < M32_MIN_BATCH)
            {
                return Tile::M16N64;
            }
            if rows <= decode_tile::BLOCK_M_F8X2 {
                return Tile::M32N64;
            }
        }
        // bf16 at up to 32 rows where the `wgmma` tile's decode would be the small-row TMA one
        // (pages it takes, the kernel not turned off by `choice::Overrides`). At up to 16
        // rows only in large plans, where its `cp.async` form runs (TMA32_16ROW_MIN_TOKENS).
        let over = crate::choice::Overrides::get();
        if backend == Backend::Sm90a
            && dtypes == DecodeDtypes::Bf16
            && fits_two_16
            && page_size >= decode_tile::TMA_MIN_PAGE
            && over.small_row_tma()
        {
            let wgmma = if rows > decode_tile::BLOCK_M_SMALL {
                max_seq_len > 4096 || size.tokens() > TMA32_SMALL_PLAN_TOKENS
            } else {
                over.tma32_cp
                    && crate::choice::Tma32Form::ByBatch.cp_at(max_batch)
                    && max_seq_len >= 4096
                    && size.tokens() >= TMA32_16ROW_MIN_TOKENS
            };
            return if wgmma { Tile::Wg64N64 } else { Tile::M16N64 };
        }
        let portable = Tile::default_for(rows);
        if portable == Tile::M64N64 && Tile::Wg64N64.check(backend, dtypes).is_ok() {
            if small { Tile::M16N64 } else { Tile::Wg64N64 }
        } else {
            portable
        }
    }

    /// Whether `backend`'s image has this tile for `dtypes`: the `wgmma` tile needs the sm_90a
    /// image (`wgmma` is sm_90a only; the sm_100a image does not have it) and bf16 Q with a
    /// bf16 or fp8 cache, or fp8 Q with an fp8 cache (widened exactly as it loads).
    pub fn check(self, backend: Backend, dtypes: DecodeDtypes) -> Result<(), MlaError> {
        if self == Tile::M32N64 {
            return Self::check_m32(backend, dtypes);
        }
        if self != Tile::Wg64N64 {
            return Ok(());
        }
        if backend != Backend::Sm90a && backend != Backend::Reference {
            return Err(MlaError::Unsupported {
                what: "tile",
                got: self.name().into(),
                why: format!(
                    "needs the sm90a backend (wgmma), this plan runs on {}",
                    backend.name()
                ),
            });
        }
        if dtypes == DecodeDtypes::Fp16 {
            return Err(MlaError::Unsupported {
                what: "tile",
                got: self.name().into(),
                why: format!("bf16 or fp8 Q with a bf16 or fp8 cache only, got {dtypes:?}"),
            });
        }
        Ok(())
    }

    /// The 32-row tile: the sm_90a image (hardware fp8 conversion; the sm_100a image does
    /// not carry it) and an fp8 cache, with bf16 or fp8 Q.
    fn check_m32(backend: Backend, dtypes: DecodeDtypes) -> Result<(), MlaError> {
        let tile = Tile::M32N64.name();
        if backend != Backend::Sm90a && backend != Backend::Reference {
            return Err(MlaError::Unsupported {
                what: "tile",
                got: tile.into(),
                why: format!(
                    "needs the sm90a backend (its fp8 32-row kernel), this plan runs on {}",
                    backend.name()
                ),
            });
        }
        if dtypes.kv() != mla_abi::ElemType::Fp8E4m3 {
            return Err(MlaError::Unsupported {
                what: "tile",
                got: tile.into(),
                why: format!("an fp8 cache only, got {dtypes:?}"),
            });
        }
        Ok(())
    }

    /// The default tile for `rows = s_q * heads` query rows per sequence: the 16-row tile
    /// when one tile holds them all (measured on the H200: 1.6x faster at H = 16, docs/PERF.md),
    /// else the 64-row tile.
    pub fn default_for(rows: usize) -> Tile {
        if rows <= decode_tile::BLOCK_M_SMALL {
            Tile::M16N64
        } else {
            Tile::M64N64
        }
    }

    /// The canonical name (`m64n64`, `m16n64`, `m32n64`, `wg64n64`).
    pub fn name(self) -> &'static str {
        match self {
            Tile::M64N64 => "m64n64",
            Tile::M16N64 => "m16n64",
            Tile::M32N64 => "m32n64",
            Tile::Wg64N64 => "wg64n64",
        }
    }

    /// log2 of the KV blocks this tile's decode for `dtypes` computes per step: 1 for the
    /// fp8-cache 16- and 32-row kernels, which take blocks in pairs (a one-block split
    /// costs them a pair), else 0. The schedule cuts sequences into that many blocks at
    /// least ([`mla_abi::schedule_splits`]).
    pub fn step_log2(self, dtypes: DecodeDtypes) -> u32 {
        // The 32-row tile runs fp8 caches only (Tile::check).
        let pairs = self == Tile::M32N64
            || (self == Tile::M16N64 && dtypes.kv() == mla_abi::ElemType::Fp8E4m3);
        u32::from(pairs)
    }

    /// Query rows per CTA.
    pub fn block_m(self) -> usize {
        match self {
            Tile::M64N64 | Tile::Wg64N64 => decode_tile::BLOCK_M,
            Tile::M16N64 => decode_tile::BLOCK_M_SMALL,
            Tile::M32N64 => decode_tile::BLOCK_M_F8X2,
        }
    }

    /// KV tokens per pipeline step.
    pub fn block_n(self) -> usize {
        decode_tile::BLOCK_N
    }

    /// CTAs per (sequence, split): the query rows cut into tiles.
    pub fn row_tiles(self, rows: usize) -> usize {
        rows.div_ceil(self.block_m())
    }

    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }
}

impl fmt::Display for Tile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One way to run a decode: the tile, and how a batch's KV is cut into split-KV chunks.
///
/// The split rule (on-device scheduler, with [`Tactic::split_counts`] as its host twin):
/// sequence `b` gets `floor(blocks_b * target / total_blocks)` splits, where
/// `target = waves * sm_count` CTAs and `total_blocks` counts every row tile, clamped to
/// `1..=min(max_splits, blocks_b)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tactic {
    pub tile: Tile,
    /// Waves of CTAs the split rule aims for, `1..=MAX_WAVES`.
    pub waves: u32,
    /// Most chunks one sequence is cut into, `1..=MAX_SPLITS`; 1 turns split-KV off.
    pub max_splits: u32,
    /// The launch switches ([`Switches::ON`] unless measuring without one).
    pub switches: Switches,
}

impl Default for Tactic {
    /// The deterministic choice when tuning is off: one wave, splits up to the ABI limit
    /// (what [`plan::split_counts`] does with `MAX_SPLITS`).
    fn default() -> Self {
        Tactic {
            tile: Tile::M64N64,
            waves: 1,
            max_splits: MAX_SPLITS,
            switches: Switches::ON,
        }
    }
}

impl Tactic {
    /// [`Tactic::default`] with the tile for `rows = s_q * heads` ([`Tile::default_for`]):
    /// the deterministic choice for a shape when tuning is off. Its split cap is
    /// `MAX_SPLITS` for every shape: the schedule itself keeps short sequences to fewer
    /// splits ([`mla_abi::split_bound`]: 32 from two row tiles on, 64 below, more only at
    /// eight or more KV blocks per split), so the cap only matters to a long sequence.
    pub fn default_for(rows: usize) -> Tactic {
        Tactic {
            tile: Tile::default_for(rows),
            ..Tactic::default()
        }
    }

    /// [`Tactic::default_for_plan`] for a plan of unknown size.
    pub fn default_on(rows: usize, backend: Backend, dtypes: DecodeDtypes) -> Tactic {
        Tactic::default_for_plan(rows, PlanSize::UNBOUNDED, backend, dtypes)
    }

    /// [`Tactic::default_for`] with [`Tile::default_for_plan`]: the deterministic choice for
    /// a plan of `size` on `backend` when tuning is off ([`crate::Runtime::default_tactic`]
    /// of a `DecodeConfig`).
    pub fn default_for_plan(
        rows: usize,
        size: PlanSize,
        backend: Backend,
        dtypes: DecodeDtypes,
    ) -> Tactic {
        Tactic {
            tile: Tile::default_for_plan(rows, size, backend, dtypes),
            ..Tactic::default()
        }
    }

    /// [`Tactic::candidates_for_plan`] for a plan of unknown size.
    pub fn candidates_on(rows: usize, backend: Backend, dtypes: DecodeDtypes) -> Vec<Tactic> {
        Tactic::candidates_for_plan(rows, PlanSize::UNBOUNDED, backend, dtypes)
    }

    /// The candidates on `backend` for `dtypes` in a plan of `size`:
    /// [`Tile::default_for_plan`]'s tile first (so a tie keeps it), then the `wgmma` tile where `backend` runs it for `dtypes`
    /// and rows are more than 16, the 32-row tile likewise, the 64-row tile, and the 16-row
    /// tile up to 32 rows; each with waves {1, 2} x max_splits {`MAX_SPLITS`, 16}, then no
    /// split.
    /// Without the sm_90a tiles this is [`Tactic::candidates_for`].
    pub fn candidates_for_plan(
        rows: usize,
        size: PlanSize,
        backend: Backend,
        dtypes: DecodeDtypes,
    ) -> Vec<Tactic> {
        let first = Tile::default_for_plan(rows, size, backend, dtypes);
        let mut tiles = vec![first];
        for t in [Tile::Wg64N64, Tile::M32N64, Tile::M64N64, Tile::M16N64] {
            let fits = match t {
                Tile::Wg64N64 | Tile::M32N64 => {
                    rows > decode_tile::BLOCK_M_SMALL && t.check(backend, dtypes).is_ok()
                }
                Tile::M64N64 => true,
                Tile::M16N64 => rows <= 2 * decode_tile::BLOCK_M_SMALL,
            };
            if t != first && fits {
                tiles.push(t);
            }
        }
        Self::candidates_with(&tiles)
    }

    /// The small, fixed set the autotuner measures, the default first (so a tie keeps it):
    /// waves {1, 2} x max_splits {`MAX_SPLITS`, 16}, then max_splits 1 (no split; waves do not matter
    /// there, every sequence gets one chunk). 64-row tile only; see [`Tactic::candidates_for`].
    pub fn candidates() -> Vec<Tactic> {
        Self::candidates_with(&[Tile::M64N64])
    }

    /// The candidates for `rows = s_q * heads` query rows: [`Tactic::candidates`] per tile,
    /// the shape's default tile first (so `candidates_for(rows)[0] == default_for(rows)`);
    /// the 16-row tile joins for `rows <= 32` (two row tiles at most).
    pub fn candidates_for(rows: usize) -> Vec<Tactic> {
        // The portable backend has no `wgmma` tile and its default tile is `default_for`'s:
        // `candidates_on`'s list without the sm_90a entries.
        Self::candidates_on(rows, Backend::Portable, DecodeDtypes::Bf16)
    }

    /// Per tile: waves {1, 2} x max_splits {`MAX_SPLITS`, 16}, then no split.
    fn candidates_with(tiles: &[Tile]) -> Vec<Tactic> {
        let mut out = Vec::with_capacity(5 * tiles.len());
        for &tile in tiles {
            for waves in [1, 2] {
                for max_splits in [MAX_SPLITS, 16] {
                    out.push(Tactic {
                        tile,
                        waves,
                        max_splits,
                        switches: Switches::ON,
                    });
                }
            }
            out.push(Tactic {
                tile,
                waves: 1,
                max_splits: 1,
                switches: Switches::ON,
            });
        }
        out
    }

    /// Checks every field is in range (the fields are public, so a value can be built
    /// that no kernel accepts).
    pub fn validate(&self) -> Result<(), MlaError> {
        if !(1..=MAX_WAVES).contains(&self.waves) {
            return Err(MlaError::shape(
                "tactic",
                format!("waves in 1..={MAX_WAVES}"),
                format!("waves={}", self.waves),
            ));
        }
        if !(1..=MAX_SPLITS).contains(&self.max_splits) {
            return Err(MlaError::shape(
                "tactic",
                format!("max_splits in 1..={MAX_SPLITS}"),
                format!("max_splits={}", self.max_splits),
            ));
        }
        Ok(())
    }

    /// CTAs the split rule aims for on a device with `sm_count` SMs.
    pub fn target_ctas(&self, sm_count: usize) -> usize {
        sm_count.max(1).saturating_mul(self.waves as usize)
    }

    /// [`Tactic::split_counts_for`] a 16-bit cache (the 32-row tile's fp8 cache for it).
    pub fn split_counts(&self, seq_lens: &[i32], rows: usize, sm_count: usize) -> Vec<i32> {
        self.split_counts_for(seq_lens, rows, DecodeDtypes::Bf16, sm_count)
    }

    /// Split counts per sequence under this tactic for `dtypes`, on the host:
    /// [`plan::schedule`] with this tile's row tiles and step ([`Tile::step_log2`]) and
    /// [`Tactic::target_ctas`] (no length clamp).
    pub fn split_counts_for(
        &self,
        seq_lens: &[i32],
        rows: usize,
        dtypes: DecodeDtypes,
        sm_count: usize,
    ) -> Vec<i32> {
        plan::schedule(
            seq_lens,
            &plan::ScheduleConfig {
                tiles: self.tile.row_tiles(rows).max(1),
                target_ctas: self.target_ctas(sm_count),
                max_splits: self.max_splits as usize,
                max_len: u32::MAX as usize,
                step_log2: self.tile.step_log2(dtypes),
            },
        )
    }
}

impl fmt::Display for Tactic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tile={},waves={},splits<={}",
            self.tile, self.waves, self.max_splits
        )?;
        for (name, on) in self.switches.named() {
            if !on {
                write!(f, ",{name}=off")?;
            }
        }
        Ok(())
    }
}

impl FromStr for Tactic {
    type Err = MlaError;

    /// Accepts exactly the canonical form: fields in order, no spaces, no signs or leading
    /// zeros, every value in range, a switch named only when off.
    fn from_str(s: &str) -> Result<Self, MlaError> {
        let bad = || MlaError::shape("tactic", canonical_form(), format!("{s:?}"));
        let mut fields = s.split(',');
        let (Some(tile), Some(waves), Some(splits)) = (fields.next(), fields.next(), fields.next())
        else {
            return Err(bad());
        };
        let mut switches = Switches::ON;
        for field in fields {
            match field {
                "pdl=off" => switches.pdl = false,
                "tma=off" => switches.tma = false,
                "fold=off" => switches.fold = false,
                _ => return Err(bad()),
            }
        }
        let tile = tile
            .strip_prefix("tile=")
            .and_then(Tile::from_name)
            .ok_or_else(bad)?;
        let waves = waves
            .strip_prefix("waves=")
            .and_then(|v| v.parse::<u32>().ok())
            .ok_or_else(bad)?;
        let max_splits = splits
            .strip_prefix("splits<=")
            .and_then(|v| v.parse::<u32>().ok())
            .ok_or_else(bad)?;
        let tactic = Tactic {
            tile,
            waves,
            max_splits,
            switches,
        };
        tactic
            .validate()
            .map_err(|e| MlaError::shape("tactic", canonical_form(), format!("{s:?} ({e})")))?;
        // `u32::from_str` also takes "+1" and "01", and the switches could repeat or come out
        // of order; only the one spelling is canonical.
        if tactic.to_string() != s {
            return Err(bad());
        }
        Ok(tactic)
    }
}
