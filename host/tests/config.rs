//! `DecodeConfig::check_shape`, CPU only: what every run of a plan and a tuning sample
//! (`Runtime::tune_decode`) are checked against before anything runs or the tuner's cache is
//! read.

use mla_host::request::{DecodeDtypes, DecodeShape};
use mla_host::{DecodeConfig, MlaError};

fn config() -> DecodeConfig {
    DecodeConfig {
        max_batch: 8,
        heads: 16,
        s_q: 2,
        dtypes: DecodeDtypes::Bf16,
        page_size: 64,
        max_seq_len: 4096,
    }
}

fn fitting() -> DecodeShape {
    DecodeShape {
        batch: 8,
        s_q: 2,
        heads: 16,
        page_size: 64,
        num_pages: 100,
        max_pages: 64,
        dtypes: DecodeDtypes::Bf16,
    }
}

fn field_of(r: Result<(), MlaError>) -> &'static str {
    match r {
        Err(MlaError::InvalidShape { field, .. }) => field,
        other => panic!("expected InvalidShape, got {other:?}"),
    }
}

#[test]
fn a_shape_of_the_config_fits_and_any_other_is_named() {
    let c = config();
    c.check_shape(&fitting()).unwrap();
    // A smaller batch fits (buckets); any other table or cache size does too.
    c.check_shape(&DecodeShape {
        batch: 1,
        num_pages: 1,
        max_pages: 1,
        ..fitting()
    })
    .unwrap();
    let cases = [
        (
            DecodeShape {
                heads: 128,
                ..fitting()
            },
            "q.shape[2] (heads)",
        ),
        (
            DecodeShape {
                s_q: 1,
                ..fitting()
            },
            "q.shape[1] (s_q)",
        ),
        (
            DecodeShape {
                dtypes: DecodeDtypes::Fp8,
                ..fitting()
            },
            "dtypes",
        ),
        (
            DecodeShape {
                page_size: 16,
                ..fitting()
            },
            "kv_cache.shape[1] (page_size)",
        ),
        (
            DecodeShape {
                batch: 9,
                ..fitting()
            },
            "q.shape[0] (batch)",
        ),
    ];
    for (shape, field) in cases {
        assert_eq!(field_of(c.check_shape(&shape)), field, "{shape:?}");
    }
}

/// 0 is "unknown" (the C ABI's `max_seq_len` documents it so), as any hint from `i32::MAX`:
/// all plan as the longest length, not as empty sequences; so the default tile of a bf16
/// plan of 32 rows is the one "unknown" gets, not the small-plan 16-row tile.
#[test]
fn an_unknown_length_hint_plans_as_the_longest() {
    use mla_host::Backend;
    use mla_host::tactic::Tile;
    let with = |max_seq_len| DecodeConfig {
        heads: 16,
        max_seq_len,
        ..config()
    };
    let longest = i32::MAX as usize;
    for hint in [0, longest, u32::MAX as usize, usize::MAX] {
        let c = with(hint);
        assert_eq!(c.planned_len(), longest, "hint {hint}");
        assert_eq!(c.plan_size(), with(longest).plan_size(), "hint {hint}");
    }
    for hint in [1, 4096, longest - 1] {
        assert_eq!(with(hint).planned_len(), hint);
    }
    let tile = |hint| {
        let c = with(hint);
        Tile::default_for_plan(c.rows(), c.plan_size(), Backend::Sm90a, c.dtypes)
    };
    assert_eq!(tile(0), tile(longest));
    // A real short hint still picks the small plan's tile.
    assert_ne!(tile(1024), tile(longest));
}
