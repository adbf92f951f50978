//! Which kernels a decode runs (`mla_host::choice`), on the CPU: the plan-time choice for
//! each backend and tile, the TMA decode's request-time rule, the schedule fold and the
//! combine, and the kernel table they come from.

use mla_abi::kernels::{self, Images, Params};
use mla_abi::{D_QK, D_V, ElemType, names};
use mla_host::choice::{DecodeKernels, E4M3_MAP_MIN_PAGE, TmaForm, tile_kernel};
use mla_host::gate::Backend;
use mla_host::request::*;
use mla_host::tactic::{Switches, Tile};
use mla_host::tensor::TensorView;
use mla_host::{DecodeFault, Variant};

fn kernels(
    backend: Backend,
    tile: Tile,
    d: DecodeDtypes,
    page: usize,
    splits: usize,
) -> DecodeKernels {
    let variant = match backend {
        Backend::Sm90a => Variant::Sm90a,
        _ => Variant::Portable,
    };
    DecodeKernels::new(backend, variant, tile, Switches::ON, d, page, splits)
}

fn request(
    d: DecodeDtypes,
    page: usize,
    max_pages: usize,
) -> (DecodeRequest<'static>, DecodeShape) {
    request_rows(d, page, max_pages, 2, 64)
}

/// [`request`] with `s` query tokens of `h` heads.
fn request_rows(
    d: DecodeDtypes,
    page: usize,
    max_pages: usize,
    s: usize,
    h: usize,
) -> (DecodeRequest<'static>, DecodeShape) {
    let (b, pages) = (2, 64);
    let req = DecodeRequest {
        q: TensorView::contiguous(0x1000_0000, d.q(), [b, s, h, D_QK]),
        kv_cache: TensorView::contiguous(0x2000_0000, d.kv(), [pages, page, D_QK]),
        page_table: TensorView::contiguous(0x3000_0000, ElemType::I32, [b, max_pages]),
        seq_lens: TensorView::contiguous(0x4000_0000, ElemType::I32, [b]),
        out: TensorView::contiguous(0x5000_0000, d.out(), [b, s, h, D_V]),
        lse: TensorView::contiguous(0x6000_0000, ElemType::F32, [b, s, h]),
        scales: Scales::default_for_mla(),
        host: HostMirror::default(),
    };
    let shape = DecodeShape {
        batch: b,
        s_q: s,
        heads: h,
        page_size: page,
        num_pages: pages,
        max_pages,
        dtypes: d,
    };
    (req, shape)
}

/// The module's worked example: bf16, H=64, S_q=2, page 16 on sm_90a.
#[test]
fn bf16_h64_sq2_page16_on_sm90a() {
    let k = kernels(Backend::Sm90a, Tile::Wg64N64, DecodeDtypes::Bf16, 16, 32);
    assert_eq!(k.decode.symbol, names::DECODE_WG_BF16);
    assert_eq!(k.tma.map(|t| t.symbol), Some(names::DECODE_TMA_BF16));
    assert!(k.pdl && !k.reference);
    // Long enough that a split holds two blocks: the TMA decode; one block: the cp.async one.
    let (req, shape) = request(DecodeDtypes::Bf16, 16, 256);
    assert_eq!(k.decode_for(&req, &shape).symbol, names::DECODE_TMA_BF16);
    let (req, shape) = request(DecodeDtypes::Bf16, 16, 4);
    assert_eq!(k.decode_for(&req, &shape).symbol, names::DECODE_WG_BF16);
    // A padded (non-contiguous) cache takes the TMA decode's `cp.async` form at 128 rows
    // (with `MLA_TMA_CP=0` the `cp.async` decode).
    let (mut req, shape) = request(DecodeDtypes::Bf16, 16, 256);
    req.kv_cache.strides[0] += D_QK;
    let over = mla_host::choice::Overrides::get();
    let padded = if over.tma_cp && over.tma {
        names::DECODE_TMA_BF16_CP
    } else {
        names::DECODE_WG_BF16
    };
    assert_eq!(k.decode_for(&req, &shape).symbol, padded);
}

/// The bf16 small-row decode's copy form where its map serves (`Tma32Form`): by default
/// the TMA form below `TMA32_CP_MIN_BATCH` sequences and the `cp.async` form from there;
/// `Cp` / `Tma` (`MLA_TMA32_FORM`) one form at every batch. Both forms are listed among
/// the plan's kernels where both may run, each once; fp8 caches and larger requests keep
/// their kernels.
#[test]
fn bf16_small_rows_take_their_copy_form_by_batch() {
    use mla_host::choice::{TMA32_CP_MIN_BATCH, Tma32Form};
    let over = mla_host::choice::Overrides::get();
    let cp_on = over.tma32_cp && over.small_row_tma();
    let plain = kernels(Backend::Sm90a, Tile::Wg64N64, DecodeDtypes::Bf16, 64, 32);
    assert_eq!(plain.tma32_form, Tma32Form::ByBatch);
    let with_batch = |batch: usize, s: usize, h: usize| {
        let (req, mut shape) = request_rows(DecodeDtypes::Bf16, 64, 64, s, h);
        shape.batch = batch;
        (req, shape)
    };
    for (form, batch, cp) in [
        (Tma32Form::ByBatch, 1, false),
        (Tma32Form::ByBatch, TMA32_CP_MIN_BATCH - 1, false),
        (Tma32Form::ByBatch, TMA32_CP_MIN_BATCH, true),
        (Tma32Form::ByBatch, 128, true),
        (Tma32Form::Cp, 1, true),
        (Tma32Form::Cp, 128, true),
        (Tma32Form::Tma, 1, false),
        (Tma32Form::Tma, 128, false),
    ] {
        assert_eq!(form.cp_at(batch), cp, "{form:?} B={batch}");
        let k = plain.with_tma32_form(form);
        for (s, h) in [(1, 16), (2, 16), (1, 3)] {
            // 4096 tokens: two blocks a split at the grid's 32 splits.
            let (req, shape) = with_batch(batch, s, h);
            let want = if !over.small_row_tma() {
                names::DECODE_TMA_BF16
            } else if cp && cp_on {
                names::DECODE_TMA32_BF16_CP
            } else {
                names::DECODE_TMA32_BF16
            };
            assert_eq!(
                k.decode_for(&req, &shape).symbol,
                want,
                "{form:?} B={batch} S_q={s} H={h}"
            );
        }
        // 64 rows: the 64-row TMA decode in every form.
        let (req, shape) = with_batch(batch, 2, 32);
        assert_eq!(k.decode_for(&req, &shape).symbol, names::DECODE_TMA_BF16);
        // Every kernel a plan of up to `batch` sequences may launch, each once.
        let all = k.all(batch, 32, 132);
        for (symbol, listed) in [
            (
                names::DECODE_TMA32_BF16,
                over.small_row_tma() && !(form.cp_at(1) && cp_on),
            ),
            (names::DECODE_TMA32_BF16_CP, cp_on),
        ] {
            let n = all.iter().filter(|&&s| s == symbol).count();
            assert_eq!(
                n,
                usize::from(listed),
                "{form:?} B={batch} {symbol}: {all:?}"
            );
        }
    }
    for d in [DecodeDtypes::Fp8KvBf16Q, DecodeDtypes::Fp8] {
        let plain = kernels(Backend::Sm90a, Tile::Wg64N64, d, 64, 32);
        let cp = plain.with_tma32_form(Tma32Form::Cp);
        let (req, mut shape) = request_rows(d, 64, 64, 2, 16);
        shape.batch = 128;
        assert_eq!(
            cp.decode_for(&req, &shape).symbol,
            plain.decode_for(&req, &shape).symbol
        );
        assert_ne!(
            cp.decode_for(&req, &shape).symbol,
            names::DECODE_TMA32_BF16_CP
        );
    }
}

/// Where the map cannot serve (pages of fewer than `TMA_MIN_PAGE` tokens, a padded cache), a
/// bf16 request whose splits hold two or more blocks takes a `cp.async` form of the TMA
/// decode: the small-row decode's at most 32 rows (`MLA_TMA32_CP=0`, or with `MLA_TMA32=0`:
/// the `cp.async` decode), the 64-row decode's above (`MLA_TMA_CP=0`: the `cp.async`
/// decode); an fp8 cache on the `wgmma` tile the e4m3 decode's form at any rows; one-block
/// splits and split caches do not.
#[test]
fn small_pages_take_the_tma_decodes_cp_async_forms() {
    let over = mla_host::choice::Overrides::get();
    let cp_on = over.tma32_cp && over.small_row_tma();
    let cp = if cp_on {
        names::DECODE_TMA32_BF16_CP
    } else {
        names::DECODE_WG_BF16
    };
    let cp64_on = over.tma_cp && over.tma;
    let cp64 = if cp64_on {
        names::DECODE_TMA_BF16_CP
    } else {
        names::DECODE_WG_BF16
    };
    for page in [1, 2, 4, 8] {
        let k = kernels(Backend::Sm90a, Tile::Wg64N64, DecodeDtypes::Bf16, page, 32);
        assert_eq!(k.tma, None, "page {page}");
        assert_eq!(
            k.tma32_cp.map(|t| t.symbol),
            cp_on.then_some(names::DECODE_TMA32_BF16_CP)
        );
        // 4096 tokens: 64 blocks, two a split at the grid's 32 splits.
        let (req, shape) = request_rows(DecodeDtypes::Bf16, page, 4096 / page, 2, 16);
        assert_eq!(k.decode_for(&req, &shape).symbol, cp, "page {page}");
        assert_eq!(
            k.all(8, 32, 132).contains(&names::DECODE_TMA32_BF16_CP),
            cp_on
        );
        // More than 32 rows: the 64-row TMA decode's `cp.async` form.
        let (req, shape) = request_rows(DecodeDtypes::Bf16, page, 4096 / page, 2, 64);
        assert_eq!(k.decode_for(&req, &shape).symbol, cp64, "page {page}");
        assert!(!k.all(8, 128, 132).contains(&names::DECODE_TMA32_BF16_CP));
        assert_eq!(
            k.all(8, 128, 132).contains(&names::DECODE_TMA_BF16_CP),
            cp64_on
        );
        assert!(!k.all(8, 32, 132).contains(&names::DECODE_TMA_BF16_CP));
        // Splits of one block: the `cp.async` `wgmma` decode, at any row count.
        let (req, shape) = request_rows(DecodeDtypes::Bf16, page, 4, 2, 16);
        assert_eq!(k.decode_for(&req, &shape).symbol, names::DECODE_WG_BF16);
        let (req, shape) = request_rows(DecodeDtypes::Bf16, page, 4, 2, 64);
        assert_eq!(k.decode_for(&req, &shape).symbol, names::DECODE_WG_BF16);
        // An fp8 cache on the `wgmma` tile: the e4m3 decode's `cp.async` form at any rows
        // (there is no small-row form).
        for (d, form) in [
            (DecodeDtypes::Fp8KvBf16Q, names::DECODE_TMA_FP8KV_BF16Q_CP),
            (DecodeDtypes::Fp8, names::DECODE_TMA_FP8_CP),
        ] {
            let f = kernels(Backend::Sm90a, Tile::Wg64N64, d, page, 32);
            let wg = f.decode.symbol;
            let want = if cp64_on { form } else { wg };
            assert_eq!(f.tma32_cp, None);
            assert_eq!(f.tma_cp.map(|t| t.symbol), cp64_on.then_some(form));
            for heads in [16, 64] {
                let (req, shape) = request_rows(d, page, 4096 / page, 2, heads);
                assert_eq!(f.decode_for(&req, &shape).symbol, want, "page {page} {d:?}");
            }
            assert_eq!(f.all(8, 128, 132).contains(&form), cp64_on);
            assert_eq!(f.all(8, 32, 132).contains(&form), cp64_on);
            let (req, shape) = request_rows(d, page, 4096 / page, 2, 64);
            let parts = mla_host::request::SplitParts {
                kpe_cache: Some(req.kv_cache),
                ..Default::default()
            };
            assert_eq!(f.decode_for_parts(&req, &parts, &shape).symbol, wg);
        }
    }
    let k = kernels(Backend::Sm90a, Tile::Wg64N64, DecodeDtypes::Bf16, 64, 32);
    let (mut req, shape) = request_rows(DecodeDtypes::Bf16, 64, 64, 2, 16);
    req.kv_cache.strides[0] += D_QK;
    assert_eq!(k.decode_for(&req, &shape).symbol, cp);
    let (mut req64, shape64) = request_rows(DecodeDtypes::Bf16, 64, 64, 2, 64);
    req64.kv_cache.strides[0] += D_QK;
    assert_eq!(k.decode_for(&req64, &shape64).symbol, cp64);
    let parts = mla_host::request::SplitParts {
        kpe_cache: Some(req.kv_cache),
        ..Default::default()
    };
    assert_eq!(
        k.decode_for_parts(&req, &parts, &shape).symbol,
        names::DECODE_WG_BF16
    );
}

/// With the small-row TMA decode on (the default), a request of at most 32 rows that takes
/// the TMA decode takes its small-row form (fp8 caches with `fp8`, also the default); more
/// rows and bf16 splits of one block do not. Off, nothing takes it.
#[test]
fn bf16_small_rows_take_the_small_row_tma_decode() {
    let env = std::env::var("MLA_TMA32");
    let over = mla_host::choice::Overrides::get();
    assert_eq!(over.tma32, env.as_deref() != Ok("0"), "MLA_TMA32={env:?}");
    assert_eq!(
        over.tma32_fp8,
        !matches!(env.as_deref(), Ok("0") | Ok("bf16")),
        "MLA_TMA32={env:?}"
    );
    let off =
        kernels(Backend::Sm90a, Tile::Wg64N64, DecodeDtypes::Bf16, 64, 32).small_rows(false, false);
    let (req, shape) = request_rows(DecodeDtypes::Bf16, 64, 256, 2, 16);
    assert_eq!(off.tma32, None);
    assert_eq!(off.decode_for(&req, &shape).symbol, names::DECODE_TMA_BF16);
    let k =
        kernels(Backend::Sm90a, Tile::Wg64N64, DecodeDtypes::Bf16, 64, 32).small_rows(true, false);
    assert_eq!(k.tma32.map(|t| t.symbol), Some(names::DECODE_TMA32_BF16));
    for (s, h, want) in [
        (1, 16, names::DECODE_TMA32_BF16),
        (2, 16, names::DECODE_TMA32_BF16),
        (1, 32, names::DECODE_TMA32_BF16),
        (1, 3, names::DECODE_TMA32_BF16),
        (3, 16, names::DECODE_TMA_BF16),
        (1, 33, names::DECODE_TMA_BF16),
    ] {
        let (req, shape) = request_rows(DecodeDtypes::Bf16, 64, 256, s, h);
        assert_eq!(k.decode_for(&req, &shape).symbol, want, "S_q={s} H={h}");
    }
    let (req, shape) = request_rows(DecodeDtypes::Bf16, 64, 4, 1, 16);
    assert_eq!(k.decode_for(&req, &shape).symbol, names::DECODE_WG_BF16);
    assert!(k.all(8, 16, 132).contains(&names::DECODE_TMA32_BF16));
    assert!(!k.all(8, 64, 132).contains(&names::DECODE_TMA32_BF16));
    // fp8 caches take the small-row forms only with `fp8`.
    for (d, tma, small) in [
        (
            DecodeDtypes::Fp8KvBf16Q,
            names::DECODE_TMA_FP8KV_BF16Q,
            names::DECODE_TMA32_FP8KV_BF16Q,
        ),
        (
            DecodeDtypes::Fp8,
            names::DECODE_TMA_FP8,
            names::DECODE_TMA32_FP8,
        ),
    ] {
        let (req, shape) = request_rows(d, 64, 256, 2, 16);
        let k = kernels(Backend::Sm90a, Tile::Wg64N64, d, 64, 32).small_rows(true, false);
        assert_eq!(k.tma32, None);
        assert_eq!(k.decode_for(&req, &shape).symbol, tma);
        let k = k.small_rows(true, true);
        assert_eq!(k.decode_for(&req, &shape).symbol, small);
    }
    let k =
        kernels(Backend::Sm90a, Tile::Wg64N64, DecodeDtypes::Bf16, 8, 32).small_rows(true, true);
    assert_eq!(k.tma32, None);
}

/// An fp8 cache with bf16 Q takes its TMA decode under the bf16 rule (two or more blocks
/// per split; splits of one plan grid, H=128: 32 at most).
#[test]
fn fp8_cache_tma_takes_two_blocks_per_split() {
    let fp8 = DecodeDtypes::Fp8KvBf16Q;
    let k = kernels(Backend::Sm90a, Tile::Wg64N64, fp8, 64, 32).with_wave_splits(66);
    assert_eq!(k.tma.map(|t| t.symbol), Some(names::DECODE_TMA_FP8KV_BF16Q));
    // The request helper's batch is 2: 33 splits each, capped at the grid's 32. L=4096 (64
    // blocks): 2 per split, the TMA decode; L=2048: 1, the cp.async decode.
    let (req, shape) = request(fp8, 64, 64);
    assert_eq!(
        k.decode_for(&req, &shape).symbol,
        names::DECODE_TMA_FP8KV_BF16Q
    );
    let (req, shape) = request(fp8, 64, 32);
    assert_eq!(
        k.decode_for(&req, &shape).symbol,
        names::DECODE_WG_FP8KV_BF16Q
    );
}

/// `MLA_TMA_CP=all` / `map` ([`TmaForm`]): the 64-row TMA decodes' `cp.async` forms on every
/// cache their map serves, or on none, every dtype, pages 16 and 64; by default fp8 caches
/// below `E4M3_MAP_MIN_PAGE` take the `cp.async` form and the rest the map. The small-row
/// decode keeps its own rule. The work list (the map form's) is checked against the map form
/// where the page size alone gave the `cp.async` form, and is off under `MLA_TMA_CP=all`.
#[test]
fn tma_form_picks_the_copy_form_on_mapped_caches() {
    let cases = [
        (DecodeDtypes::Bf16, names::DECODE_TMA_BF16_CP),
        (DecodeDtypes::Fp8KvBf16Q, names::DECODE_TMA_FP8KV_BF16Q_CP),
        (DecodeDtypes::Fp8, names::DECODE_TMA_FP8_CP),
    ];
    let cap = mla_host::plan::WorkspaceCapacity {
        batch: 2,
        rows: 128,
        max_splits: 32,
    };
    for (d, cp) in cases {
        for page in [16, 32, 64] {
            let by_page = kernels(Backend::Sm90a, Tile::Wg64N64, d, page, 32)
                .with_work_list(mla_host::choice::WORK_LIST_FIXED, true);
            assert_eq!(by_page.tma_form, TmaForm::ByPage, "the default");
            let map = by_page.with_tma_form(TmaForm::Map);
            let all = by_page.with_tma_form(TmaForm::Cp);
            // 128 rows, 4096 tokens a sequence.
            let (req, shape) = request(d, page, 4096 / page);
            let tma = map.decode_for(&req, &shape);
            assert_eq!(
                Some(tma.symbol),
                map.tma.map(|t| t.symbol),
                "{d:?} page {page}"
            );
            assert!(
                map.list_fixed_for(tma, &shape, cap) > 0,
                "{d:?} page {page}"
            );
            let parts = SplitParts::default();
            let k = all.decode_for(&req, &shape);
            assert_eq!(k.symbol, cp, "{d:?} page {page}");
            // Everywhere `cp.async`: the list's base is that form, so the list is off.
            let base = all.list_base_for(
                all.decode_for_parts(&req, &parts, &shape),
                &req,
                &parts,
                &shape,
            );
            assert_eq!(base.symbol, cp, "{d:?} page {page}");
            assert_eq!(
                all.list_fixed_for(base, &shape, cap),
                0,
                "{d:?} page {page}"
            );
            assert_eq!(
                map.list_base_for(
                    map.decode_for_parts(&req, &parts, &shape),
                    &req,
                    &parts,
                    &shape
                )
                .symbol,
                tma.symbol
            );
            let want_cp = d != DecodeDtypes::Bf16 && page < E4M3_MAP_MIN_PAGE;
            let k = by_page.decode_for(&req, &shape);
            assert_eq!(
                k.symbol,
                if want_cp { cp } else { tma.symbol },
                "{d:?} page {page}"
            );
            // By page, the list is checked against the map form the page size displaced:
            // a run the list pays for takes it.
            let base = by_page.list_base_for(
                by_page.decode_for_parts(&req, &parts, &shape),
                &req,
                &parts,
                &shape,
            );
            assert_eq!(base.symbol, tma.symbol, "{d:?} page {page}");
            assert!(
                by_page.list_fixed_for(base, &shape, cap) > 0,
                "{d:?} page {page}"
            );
        }
    }
    // Where the map cannot serve (pages under 16 tokens), the list's base is the `cp.async`
    // form the request takes anyway, and the list is off.
    for (d, cp) in cases {
        let k = kernels(Backend::Sm90a, Tile::Wg64N64, d, 8, 32)
            .with_work_list(mla_host::choice::WORK_LIST_FIXED, true);
        let (req, shape) = request(d, 8, 4096 / 8);
        let base = k.list_base_for(
            k.decode_for_parts(&req, &SplitParts::default(), &shape),
            &req,
            &SplitParts::default(),
            &shape,
        );
        if k.tma_cp.is_some() {
            assert_eq!(base.symbol, cp, "{d:?} page 8");
        }
        assert_eq!(k.list_fixed_for(base, &shape, cap), 0, "{d:?} page 8");
    }
    // Without the `cp.async` forms (`MLA_TMA_CP=0`) an fp8 cache on 16-token pages keeps
    // the map form.
    for d in [DecodeDtypes::Fp8KvBf16Q, DecodeDtypes::Fp8] {
        let k = DecodeKernels {
            tma_cp: None,
            ..kernels(Backend::Sm90a, Tile::Wg64N64, d, 16, 32)
        };
        let (req, shape) = request(d, 16, 4096 / 16);
        assert_eq!(
            Some(k.decode_for(&req, &shape).symbol),
            k.tma.map(|t| t.symbol),
            "{d:?}"
        );
    }
    // 32 rows of bf16: the small-row decode, as without the switch.
    let k = kernels(Backend::Sm90a, Tile::Wg64N64, DecodeDtypes::Bf16, 64, 32);
    let (req, shape) = request_rows(DecodeDtypes::Bf16, 64, 64, 2, 16);
    assert_eq!(
        k.with_tma_form(TmaForm::Cp).decode_for(&req, &shape).symbol,
        k.decode_for(&req, &shape).symbol
    );
}

/// fp8 Q with an fp8 cache runs its own `cp.async` `wgmma` decode (Q widened to bf16 as it
/// loads) and its e4m3 TMA decode (or, on small pages, that decode's `cp.async` form), the
/// TMA one at any split length.
#[test]
fn fp8_q_takes_the_wgmma_and_tma_decodes() {
    let fp8 = DecodeDtypes::Fp8;
    assert_eq!(tile_kernel(Tile::Wg64N64, fp8).symbol, names::DECODE_WG_FP8);
    let k = kernels(Backend::Sm90a, Tile::Wg64N64, fp8, 64, 32).with_wave_splits(66);
    assert_eq!(k.decode.symbol, names::DECODE_WG_FP8);
    assert_eq!(k.tma.map(|t| t.symbol), Some(names::DECODE_TMA_FP8));
    let (req, shape) = request(fp8, 64, 128);
    assert_eq!(k.decode_for(&req, &shape).symbol, names::DECODE_TMA_FP8);
    // Two blocks per split, one, or a single block in all: the TMA decode.
    for pages in [64, 32, 1] {
        let (req, shape) = request(fp8, 64, pages);
        assert_eq!(k.decode_for(&req, &shape).symbol, names::DECODE_TMA_FP8);
    }
    // Pages under 16 take the TMA decode's `cp.async` form (with `MLA_TMA_CP=0` the
    // `cp.async` decode).
    let over = mla_host::choice::Overrides::get();
    let small = if over.tma_cp && over.tma {
        names::DECODE_TMA_FP8_CP
    } else {
        names::DECODE_WG_FP8
    };
    let k16 = kernels(Backend::Sm90a, Tile::Wg64N64, fp8, 8, 32).with_wave_splits(66);
    let (req, shape) = request(fp8, 8, 128);
    assert_eq!(k16.decode_for(&req, &shape).symbol, small);
    // A cache that is not fp8 never takes it (validation rejects that request anyway).
    let (mut req, shape) = request(fp8, 64, 128);
    req.kv_cache.dtype = ElemType::Bf16;
    assert!(mla_host::tmap::tma_unsupported(&req, &shape).is_some());
    let k = kernels(Backend::Sm90a, Tile::Wg64N64, fp8, 8, 32);
    assert_eq!(k.tma, None);
}

#[test]
fn small_pages_and_other_backends_take_no_tma() {
    let k = kernels(Backend::Sm90a, Tile::Wg64N64, DecodeDtypes::Bf16, 8, 32);
    assert_eq!(k.tma, None);
    let k = kernels(
        Backend::Sm90a,
        Tile::Wg64N64,
        DecodeDtypes::Fp8KvBf16Q,
        64,
        32,
    );
    assert_eq!(k.decode.symbol, names::DECODE_WG_FP8KV_BF16Q);
    assert_eq!(k.tma.map(|t| t.symbol), Some(names::DECODE_TMA_FP8KV_BF16Q));
    let k = kernels(
        Backend::Sm90a,
        Tile::Wg64N64,
        DecodeDtypes::Fp8KvBf16Q,
        8,
        32,
    );
    assert_eq!(k.tma, None);
    let k = kernels(Backend::Portable, Tile::M64N64, DecodeDtypes::Bf16, 64, 32);
    assert_eq!(
        (k.decode.symbol, k.tma, k.pdl),
        (names::DECODE_BF16, None, false)
    );
    let k = kernels(Backend::Reference, Tile::M64N64, DecodeDtypes::Fp8, 64, 1);
    assert!(k.reference);
    assert_eq!(k.decode.symbol, names::DECODE_REF_FP8);
    assert_eq!(k.all(4, 16, 132), vec![names::DECODE_REF_FP8]);
    assert_eq!(k.combine_for_batch(4, 16, 132), None);
    assert_eq!(k.combine_for(64, 132), None);
}

/// The tactic's switches turn PDL, the TMA decode and the fold off, one at a time.
#[test]
fn switches_turn_pdl_tma_and_fold_off() {
    let on = Switches::ON;
    let with = |switches| {
        DecodeKernels::new(
            Backend::Sm90a,
            Variant::Sm90a,
            Tile::Wg64N64,
            switches,
            DecodeDtypes::Bf16,
            64,
            32,
        )
    };
    let all = with(on);
    assert!(all.pdl && all.tma.is_some() && all.folds(1));
    let k = with(Switches { pdl: false, ..on });
    assert!(!k.pdl && k.tma.is_some() && k.folds(1));
    let k = with(Switches { tma: false, ..on });
    assert!(k.pdl && k.tma.is_none() && k.folds(1));
    let (req, shape) = request(DecodeDtypes::Bf16, 64, 256);
    assert_eq!(k.decode_for(&req, &shape).symbol, names::DECODE_WG_BF16);
    let k = with(Switches { fold: false, ..on });
    assert!(k.pdl && k.tma.is_some() && !k.folds(1));
    assert_eq!(k.all(1, 128, 132)[0], names::SCHEDULE);
}

#[test]
fn fold_and_combine_follow_batch_and_splits() {
    // A plan whose schedule gives a lone sequence 132 splits, at most 64.
    let k = kernels(Backend::Sm90a, Tile::M16N64, DecodeDtypes::Fp16, 64, 64).with_wave_splits(132);
    assert!(k.folds(1) && k.folds(mla_abi::SCHED_FOLD_MAX_BATCH));
    assert!(!k.folds(mla_abi::SCHED_FOLD_MAX_BATCH + 1));
    // One sequence (64 chunks) of 16 rows: the wide combine; a large batch (one or two
    // chunks each) the narrow one.
    assert_eq!(
        k.combine_for_batch(1, 16, 132).map(|c| c.symbol),
        Some(names::COMBINE_WIDE_FP16)
    );
    assert_eq!(
        k.combine_for_batch(100_000, 1, 132).map(|c| c.symbol),
        Some(names::COMBINE_FP16)
    );
    // Any sequence may take all 64 chunks: wide over 100 000 rows as well (four trips a
    // wave against 32).
    assert_eq!(
        k.combine_for(100_000, 132).map(|c| c.symbol),
        Some(names::COMBINE_WIDE_FP16)
    );
    // Eight sequences of 64 rows (16 chunks each): 512 rows, wide in two waves.
    assert_eq!(
        k.combine_for_batch(8, 64, 132).map(|c| c.symbol),
        Some(names::COMBINE_WIDE_FP16)
    );
    assert_eq!(
        k.all(64, 16, 132),
        vec![
            names::SCHEDULE,
            names::DECODE16_FP16,
            names::COMBINE_WIDE_FP16,
            names::COMBINE_FP16
        ]
    );
    // One split: the decode writes the output, no combine.
    let k = kernels(Backend::Sm90a, Tile::M16N64, DecodeDtypes::Fp16, 64, 1);
    assert_eq!(k.combine_for_batch(1, 16, 132), None);
    assert_eq!(k.combine_for(16, 132), None);
    assert_eq!(k.all(4, 16, 132), vec![names::DECODE16_FP16]);
}

#[test]
fn every_tile_and_dtype_names_a_kernel_of_the_table() {
    for tile in Tile::ALL {
        for d in DecodeDtypes::ALL {
            if tile.check(Backend::Sm90a, d).is_err() {
                continue;
            }
            let k = tile_kernel(tile, d);
            assert_eq!(k.params, Params::Decode, "{tile:?} {d:?}");
            assert_eq!(kernels::find(k.symbol), Some(k));
            // The portable image holds only what every image holds.
            if tile.check(Backend::Portable, d).is_ok() {
                assert_eq!(k.images, Images::All, "{}", k.symbol);
            }
        }
    }
    // Every kernel the host names by constant is in the table (choice::spec relies on it).
    for symbol in [
        names::SCHEDULE,
        names::DECODE_TMA_BF16,
        names::DECODE_TMA_FP8KV_BF16Q,
        names::DECODE_TMA_FP8,
        names::DECODE_TMA_BF16_LIST,
        names::DECODE_TMA_FP8KV_BF16Q_LIST,
        names::DECODE_TMA_FP8_LIST,
        names::DECODE_TMA32_BF16,
        names::DECODE_TMA32_FP8KV_BF16Q,
        names::DECODE_TMA32_FP8,
        names::DECODE_TMA32_BF16_CP,
        names::DECODE_TMA_BF16_CP,
        names::DECODE_TMA_FP8KV_BF16Q_CP,
        names::DECODE_TMA_FP8_CP,
        names::COMBINE_BF16,
        names::COMBINE_FP16,
        names::COMBINE_WIDE_BF16,
        names::COMBINE_WIDE_FP16,
        names::MERGE_BF16,
        names::MERGE_FP16,
        names::DECODE_REF_BF16,
        names::DECODE_REF_FP16,
        names::DECODE_REF_FP8KV_BF16Q,
        names::DECODE_REF_FP8,
    ] {
        assert!(kernels::find(symbol).is_some(), "{symbol}");
    }
    // Symbols are unique, and only the TMA decodes take a second parameter.
    for (i, a) in kernels::ALL.iter().enumerate() {
        assert!(
            kernels::ALL[i + 1..].iter().all(|b| b.symbol != a.symbol),
            "{}",
            a.symbol
        );
        assert_eq!(
            a.params.second().is_some(),
            [
                names::DECODE_TMA_BF16,
                names::DECODE_TMA_FP8KV_BF16Q,
                names::DECODE_TMA_FP8,
                names::DECODE_TMA_BF16_LIST,
                names::DECODE_TMA_FP8KV_BF16Q_LIST,
                names::DECODE_TMA_FP8_LIST,
                names::DECODE_TMA32_BF16,
                names::DECODE_TMA32_FP8KV_BF16Q,
                names::DECODE_TMA32_FP8,
                names::DECODE_TMA32_BF16_CP,
                names::DECODE_TMA_BF16_CP,
                names::DECODE_TMA_FP8KV_BF16Q_CP,
                names::DECODE_TMA_FP8_CP
            ]
            .contains(&a.symbol),
            "{}",
            a.symbol
        );
    }
}

#[test]
fn fault_records_read_back() {
    use mla_abi::fault::*;
    assert_eq!(DecodeFault::from_record([NONE, 0, 0, 0]), None);
    let f = DecodeFault::from_record([PAGE_ID, 3, 7, -2]).unwrap();
    assert_eq!(
        f,
        DecodeFault::PageId {
            sequence: 3,
            column: 7,
            page: -2
        }
    );
    assert_eq!(
        f.to_string(),
        "page_table[3][7] = -2 is outside 0..num_pages"
    );
    let f = DecodeFault::from_record([SEQ_LEN, 1, -1, 99_999]).unwrap();
    assert_eq!(
        f,
        DecodeFault::SeqLen {
            sequence: 1,
            len: 99_999
        }
    );
    assert!(f.to_string().contains("seq_lens[1] = 99999"));
}

/// The TMA rule counts blocks per split of the batch's even share, not of the grid's split
/// bound: a batch of 2 with 8 splits each on a grid of 32 takes the TMA decode at 16 blocks
/// (two per split), and without a wave share (host-chosen splits) the grid's splits count.
#[test]
fn tma_rule_takes_the_even_share() {
    for d in [DecodeDtypes::Bf16, DecodeDtypes::Fp8KvBf16Q] {
        let tma = if d == DecodeDtypes::Bf16 {
            names::DECODE_TMA_BF16
        } else {
            names::DECODE_TMA_FP8KV_BF16Q
        };
        let wg = tile_kernel(Tile::Wg64N64, d).symbol;
        let k = kernels(Backend::Sm90a, Tile::Wg64N64, d, 64, 32);
        let (req, shape) = request(d, 64, 16);
        // The request helper's batch is 2: a share of 16 / 2 = 8 splits, 2 blocks each.
        assert_eq!(k.with_wave_splits(16).decode_for(&req, &shape).symbol, tma);
        // 32 each (the grid's bound): one block per split.
        assert_eq!(k.with_wave_splits(66).decode_for(&req, &shape).symbol, wg);
        // Host-chosen splits (no wave share): the grid's 32.
        assert_eq!(k.decode_for(&req, &shape).symbol, wg);
        // 16 blocks at 8 splits: 2 per split.
        let k8 = kernels(Backend::Sm90a, Tile::Wg64N64, d, 64, 8);
        assert_eq!(k8.decode_for(&req, &shape).symbol, tma);
    }
}

/// The work list's kernels: each 64-row TMA decode has its list symbol, which a launch
/// takes only in the TMA decode's place (not its `cp.async` form, not the small-row
/// decode), with the list on, a combine and a workspace of two splits or more.
#[test]
fn work_list_kernels_stand_in_for_the_tma_decodes_only() {
    use mla_host::plan::WorkspaceCapacity;
    let cap = |max_splits| WorkspaceCapacity {
        batch: 2,
        rows: 128,
        max_splits,
    };
    for (d, tma, list) in [
        (
            DecodeDtypes::Bf16,
            names::DECODE_TMA_BF16,
            names::DECODE_TMA_BF16_LIST,
        ),
        (
            DecodeDtypes::Fp8KvBf16Q,
            names::DECODE_TMA_FP8KV_BF16Q,
            names::DECODE_TMA_FP8KV_BF16Q_LIST,
        ),
        (
            DecodeDtypes::Fp8,
            names::DECODE_TMA_FP8,
            names::DECODE_TMA_FP8_LIST,
        ),
    ] {
        let k = kernels(Backend::Sm90a, Tile::Wg64N64, d, 64, 32);
        assert_eq!(k.tma_list.map(|t| t.symbol), Some(list), "{d:?}");
        assert_eq!(
            kernels::find(list).map(|t| t.params),
            Some(Params::DecodeWithMap)
        );
        // The e4m3 forms (with the transposer warpgroup) keep their walk words in the P
        // slab's free half.
        let smem = if d == DecodeDtypes::Bf16 {
            mla_abi::decode_tile::TMA_LIST_SMEM_BYTES
        } else {
            mla_abi::decode_tile::TMA_E4_SMEM_BYTES
        };
        assert_eq!(kernels::find(list).map(|t| t.smem), Some(smem as u32));
        // Off until the plan turns it on.
        assert!(!k.all(2, 128, 132).contains(&list));
        let (req, shape) = request_rows(d, 64, 256, 2, 64);
        let t = k.decode_for(&req, &shape);
        assert_eq!(t.symbol, tma, "{d:?}");
        assert_eq!(k.list_fixed_for(t, &shape, cap(64)), 0);
        let on = k.with_work_list(4, false);
        assert!(on.all(2, 128, 132).contains(&list));
        assert_eq!(on.list_fixed_for(t, &shape, cap(64)), 4, "{d:?}");
        // One split in the workspace, or none in the grid: the cells.
        assert_eq!(on.list_fixed_for(t, &shape, cap(1)), 0);
        let one = kernels(Backend::Sm90a, Tile::Wg64N64, d, 64, 1).with_work_list(4, false);
        assert_eq!(one.list_fixed_for(t, &shape, cap(64)), 0);
        assert!(!one.all(2, 128, 132).contains(&list));
        // The cp.async form and the small-row decode never take it.
        for other in [on.tma_cp, on.tma32].into_iter().flatten() {
            assert_eq!(
                on.list_fixed_for(other, &shape, cap(64)),
                0,
                "{}",
                other.symbol
            );
        }
    }
    // No TMA decode (pages under 16 tokens, fp16): no list kernel.
    let k = kernels(Backend::Sm90a, Tile::Wg64N64, DecodeDtypes::Bf16, 8, 32);
    assert!(k.tma.is_none() && k.tma_list.is_none());
}
