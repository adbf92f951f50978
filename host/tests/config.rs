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
