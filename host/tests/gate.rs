//! Gating rules and the backend registry (CPU only: devices are described by hand).

use mla_abi::{MAX_HEADS, MAX_PAGE_SIZE, MAX_S_Q};
use mla_host::gate::{Backend, Decline, Geometry, Registry, is_available, is_supported};
use mla_host::{DecodeDtypes, DecodeShape, DeviceInfo, MlaError, Variant};

fn device(name: &str, cc: (i32, i32), sm_count: u32) -> DeviceInfo {
    DeviceInfo {
        ordinal: 0,
        name: name.into(),
        compute_capability: cc,
        sm_count,
        smem_per_block_optin: 227 * 1024,
        smem_per_sm: 228 * 1024,
        l2_bytes: 50 * 1024 * 1024,
        driver_version: 12080,
    }
}

fn h200() -> DeviceInfo {
    device("NVIDIA H200", (9, 0), 132)
}

fn a100() -> DeviceInfo {
    device("NVIDIA A100-SXM4-80GB", (8, 0), 108)
}

fn blackwell() -> DeviceInfo {
    device("NVIDIA B200", (10, 0), 148)
}

fn turing() -> DeviceInfo {
    device("NVIDIA T4", (7, 5), 40)
}

/// A DeepSeek-shaped geometry every backend accepts on a capable device.
fn geometry() -> Geometry {
    Geometry {
        heads: 128,
        s_q: 1,
        page_size: 64,
        dtypes: DecodeDtypes::Bf16,
        max_batch: 64,
        max_seq_len: 32_768,
    }
}

fn declined_by(r: Result<(), Decline>) -> Decline {
    match r {
        Ok(()) => panic!("expected a decline, got Ok"),
        Err(d) => d,
    }
}

/// Runs `check` against every backend on an H200 (where the arch rule passes for all).
fn every_backend(g: &Geometry, check: impl Fn(Backend, Decline)) {
    for backend in Backend::ALL {
        let d = declined_by(is_available(backend, &h200(), g));
        assert_eq!(d.backend(), backend, "{d}");
        assert!(d.to_string().starts_with(backend.name()), "{d}");
        check(backend, d);
    }
}

#[test]
fn backend_names_round_trip() {
    let names: Vec<&str> = Backend::ALL.iter().map(|b| b.name()).collect();
    assert_eq!(names, ["sm90a", "portable", "reference"]);
    for backend in Backend::ALL {
        assert_eq!(Backend::from_name(backend.name()), Some(backend));
        assert_eq!(backend.to_string(), backend.name());
    }
    for bad in ["", "SM90A", "sm_90a", " portable", "ref", "sm100a"] {
        assert_eq!(Backend::from_name(bad), None, "{bad:?}");
    }
}

#[test]
fn backend_variants() {
    assert_eq!(Backend::Sm90a.variant(), Variant::Sm90a);
    assert_eq!(Backend::Portable.variant(), Variant::Portable);
    assert_eq!(Backend::Reference.variant(), Variant::Portable);
}

#[test]
fn arch_rules() {
    let g = geometry();
    let accepts = |b, dev: &DeviceInfo| is_available(b, dev, &g).is_ok();
    // sm90a: exactly 9.0.
    assert!(accepts(Backend::Sm90a, &h200()));
    for dev in [a100(), blackwell(), turing(), device("sm_89", (8, 9), 128)] {
        match declined_by(is_available(Backend::Sm90a, &dev, &g)) {
            Decline::Arch {
                backend,
                have,
                need,
            } => {
                assert_eq!(backend, Backend::Sm90a);
                assert_eq!(have, dev.compute_capability);
                assert!(need.contains("9.0"), "{need}");
            }
            other => panic!("expected Arch, got {other:?}"),
        }
    }
    // portable and reference: major >= 8.
    for backend in [Backend::Portable, Backend::Reference] {
        for dev in [h200(), a100(), blackwell(), device("sm_86", (8, 6), 84)] {
            assert!(accepts(backend, &dev), "{backend} on {dev}");
        }
        let d = declined_by(is_available(backend, &turing(), &g));
        assert!(matches!(d, Decline::Arch { have: (7, 5), .. }), "{d:?}");
        let text = d.to_string();
        assert!(text.contains("sm_75") && text.contains("8.0"), "{text}");
    }
}

#[test]
fn every_dtype_runs_everywhere_it_runs_at_all() {
    for dtypes in DecodeDtypes::ALL {
        let g = Geometry {
            dtypes,
            ..geometry()
        };
        for backend in Backend::ALL {
            assert_eq!(
                is_available(backend, &h200(), &g),
                Ok(()),
                "{backend} {dtypes:?}"
            );
        }
    }
}

#[test]
fn heads_limits() {
    let max = MAX_HEADS as usize;
    for heads in [1, 3, max] {
        let g = Geometry {
            heads,
            ..geometry()
        };
        for backend in Backend::ALL {
            assert_eq!(is_available(backend, &h200(), &g), Ok(()), "heads {heads}");
        }
    }
    for heads in [0, max + 1] {
        let g = Geometry {
            heads,
            ..geometry()
        };
        every_backend(&g, |backend, d| {
            assert_eq!(
                d,
                Decline::Heads {
                    backend,
                    got: heads,
                    max
                }
            );
            let text = d.to_string();
            assert!(text.contains(&format!("heads = {heads}")), "{text}");
            assert!(text.contains(&max.to_string()), "{text}");
        });
    }
}

#[test]
fn query_token_limits() {
    let max = MAX_S_Q as usize;
    for s_q in [1, 2, max] {
        let g = Geometry { s_q, ..geometry() };
        for backend in Backend::ALL {
            assert_eq!(is_available(backend, &h200(), &g), Ok(()), "s_q {s_q}");
        }
    }
    for s_q in [0, max + 1] {
        let g = Geometry { s_q, ..geometry() };
        every_backend(&g, |backend, d| {
            assert_eq!(
                d,
                Decline::QueryTokens {
                    backend,
                    got: s_q,
                    max
                }
            );
            let text = d.to_string();
            assert!(text.contains(&format!("= {s_q}")), "{text}");
            assert!(text.contains(&format!("1..={max}")), "{text}");
        });
    }
}

#[test]
fn page_size_limits() {
    let max = MAX_PAGE_SIZE as usize;
    let mut p = 1;
    while p <= max {
        let g = Geometry {
            page_size: p,
            ..geometry()
        };
        for backend in Backend::ALL {
            assert_eq!(is_available(backend, &h200(), &g), Ok(()), "page {p}");
        }
        p *= 2;
    }
    for page_size in [0, 3, 48, 100, max + 1, max * 2] {
        let g = Geometry {
            page_size,
            ..geometry()
        };
        every_backend(&g, |backend, d| {
            assert_eq!(
                d,
                Decline::PageSize {
                    backend,
                    got: page_size
                }
            );
            let text = d.to_string();
            assert!(text.contains(&format!("page size = {page_size}")), "{text}");
            assert!(text.contains(&format!("1..={max}")), "{text}");
        });
    }
}

#[test]
fn batch_capacity() {
    for max_batch in [1, 65_535] {
        let g = Geometry {
            max_batch,
            ..geometry()
        };
        assert_eq!(is_available(Backend::Sm90a, &h200(), &g), Ok(()));
    }
    for max_batch in [0, 65_536] {
        let g = Geometry {
            max_batch,
            ..geometry()
        };
        every_backend(&g, |backend, d| {
            assert_eq!(
                d,
                Decline::Capacity {
                    backend,
                    what: "max_batch",
                    got: max_batch,
                    max: 65_535
                }
            );
            let text = d.to_string();
            assert!(text.contains(&format!("max_batch = {max_batch}")), "{text}");
            assert!(text.contains("65535"), "{text}");
        });
    }
}

#[test]
fn sequence_length_capacity() {
    let limit = i32::MAX as usize;
    let g = Geometry {
        max_seq_len: limit,
        ..geometry()
    };
    assert_eq!(is_available(Backend::Portable, &h200(), &g), Ok(()));
    let g = Geometry {
        max_seq_len: limit + 1,
        ..geometry()
    };
    every_backend(&g, |backend, d| {
        assert_eq!(
            d,
            Decline::Capacity {
                backend,
                what: "max_seq_len",
                got: limit + 1,
                max: limit
            }
        );
        let text = d.to_string();
        assert!(text.contains(&(limit + 1).to_string()), "{text}");
        assert!(text.contains(&limit.to_string()), "{text}");
    });
}

#[test]
fn arch_is_reported_before_shape() {
    let g = Geometry {
        heads: 0,
        page_size: 3,
        ..geometry()
    };
    let d = declined_by(is_available(Backend::Sm90a, &a100(), &g));
    assert!(matches!(d, Decline::Arch { .. }), "{d:?}");
    let d = declined_by(is_available(Backend::Sm90a, &h200(), &g));
    assert!(matches!(d, Decline::Heads { got: 0, .. }), "{d:?}");
}

fn shape(batch: usize, max_pages: usize, page_size: usize) -> DecodeShape {
    DecodeShape {
        batch,
        s_q: 2,
        heads: 16,
        page_size,
        num_pages: batch * max_pages,
        max_pages,
        dtypes: DecodeDtypes::Fp8,
    }
}

#[test]
fn geometry_of_a_shape() {
    let s = shape(7, 33, 64);
    let g = Geometry::from(&s);
    assert_eq!(
        g,
        Geometry {
            heads: 16,
            s_q: 2,
            page_size: 64,
            dtypes: DecodeDtypes::Fp8,
            max_batch: 7,
            max_seq_len: 33 * 64,
        }
    );
    // A table wider than the longest length (i32) is no longer sequence: it gates as one
    // of i32::MAX tokens (the kernels clamp lengths to the table's capacity).
    let g = Geometry::from(&shape(1, usize::MAX / 2, 64));
    assert_eq!(g.max_seq_len, i32::MAX as usize);
}

#[test]
fn per_request_support() {
    assert_eq!(
        is_supported(Backend::Sm90a, &h200(), &shape(8, 16, 64)),
        Ok(())
    );
    let d = declined_by(is_supported(Backend::Sm90a, &a100(), &shape(8, 16, 64)));
    assert!(matches!(d, Decline::Arch { have: (8, 0), .. }), "{d:?}");
    let d = declined_by(is_supported(
        Backend::Portable,
        &a100(),
        &shape(70_000, 1, 64),
    ));
    assert!(
        matches!(
            d,
            Decline::Capacity {
                what: "max_batch",
                got: 70_000,
                ..
            }
        ),
        "{d:?}"
    );
    // 2^25 pages of 64 tokens is 2^31 tokens, one past i32::MAX: lengths stay i32 and are
    // clamped to the table, so the table runs (lengths up to 2^31-1 at any page size).
    assert_eq!(
        is_supported(Backend::Portable, &a100(), &shape(1, 1 << 25, 64)),
        Ok(())
    );
    let d = declined_by(is_supported(Backend::Portable, &a100(), &shape(1, 4, 24)));
    assert!(matches!(d, Decline::PageSize { got: 24, .. }), "{d:?}");
}

#[test]
fn h200_selects_sm90a() {
    let sel = Registry::default_order()
        .select(&h200(), &geometry())
        .unwrap();
    assert_eq!(sel.backend, Backend::Sm90a);
    assert!(sel.declined.is_empty(), "{sel}");
    assert_eq!(sel.to_string(), "decode backend sm90a");
}

#[test]
fn a100_and_blackwell_select_portable() {
    for dev in [a100(), blackwell()] {
        let sel = Registry::default_order().select(&dev, &geometry()).unwrap();
        assert_eq!(sel.backend, Backend::Portable, "{dev}");
        assert_eq!(sel.declined.len(), 1, "{sel}");
        let (backend, reason) = &sel.declined[0];
        assert_eq!(*backend, Backend::Sm90a);
        assert!(
            matches!(reason, Decline::Arch { have, .. } if *have == dev.compute_capability),
            "{reason:?}"
        );
        let text = sel.to_string();
        assert!(text.starts_with("decode backend portable"), "{text}");
        assert!(text.contains(&reason.to_string()), "{text}");
    }
}

#[test]
fn turing_is_unsupported_with_every_reason() {
    let err = Registry::default_order()
        .select(&turing(), &geometry())
        .unwrap_err();
    match &err {
        MlaError::Unsupported { what, got, why } => {
            assert_eq!(*what, "decode backend");
            assert!(got.contains("heads=128") && got.contains("sm_75"), "{got}");
            for backend in Backend::ALL {
                assert!(why.contains(&format!("{}: needs", backend.name())), "{why}");
            }
            assert_eq!(why.matches("sm_75").count(), 3, "{why}");
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

#[test]
fn shape_refusal_falls_through_every_backend() {
    let g = Geometry {
        heads: MAX_HEADS as usize + 1,
        ..geometry()
    };
    let err = Registry::default_order().select(&h200(), &g).unwrap_err();
    let MlaError::Unsupported { why, .. } = &err else {
        panic!("expected Unsupported, got {err:?}");
    };
    assert_eq!(why.matches("heads = 129").count(), 3, "{why}");
}

#[test]
fn parse_exact_list() {
    let r = Registry::parse("portable,reference").unwrap();
    assert_eq!(r.order(), [Backend::Portable, Backend::Reference]);
    assert_eq!(r.source(), "portable,reference");
    let r = Registry::parse("reference").unwrap();
    assert_eq!(r.order(), [Backend::Reference]);
    let r = Registry::parse("reference,sm90a,portable").unwrap();
    assert_eq!(
        r.order(),
        [Backend::Reference, Backend::Sm90a, Backend::Portable]
    );
}

#[test]
fn parse_deltas() {
    let r = Registry::parse("-sm90a").unwrap();
    assert_eq!(r.order(), [Backend::Portable, Backend::Reference]);
    let r = Registry::parse("-sm90a,+reference").unwrap();
    assert_eq!(r.order(), [Backend::Portable, Backend::Reference]);
    let r = Registry::parse("-reference,-portable").unwrap();
    assert_eq!(r.order(), [Backend::Sm90a]);
    // Removing a backend twice (or one already gone) is harmless.
    let r = Registry::parse("-portable,-portable").unwrap();
    assert_eq!(r.order(), [Backend::Sm90a, Backend::Reference]);
}

#[test]
fn parse_append_moves_to_the_end() {
    let r = Registry::parse("+sm90a").unwrap();
    assert_eq!(
        r.order(),
        [Backend::Portable, Backend::Reference, Backend::Sm90a]
    );
    let r = Registry::parse("+portable").unwrap();
    assert_eq!(
        r.order(),
        [Backend::Sm90a, Backend::Reference, Backend::Portable]
    );
    // Already last: unchanged.
    let r = Registry::parse("+reference").unwrap();
    assert_eq!(r.order(), Backend::ALL);
    // Removed then appended again.
    let r = Registry::parse("-sm90a,+sm90a").unwrap();
    assert_eq!(
        r.order(),
        [Backend::Portable, Backend::Reference, Backend::Sm90a]
    );
}

#[test]
fn parse_tolerates_whitespace() {
    let r = Registry::parse("  portable ,\treference  ").unwrap();
    assert_eq!(r.order(), [Backend::Portable, Backend::Reference]);
    let r = Registry::parse(" - sm90a , +portable ").unwrap();
    assert_eq!(r.order(), [Backend::Reference, Backend::Portable]);
}

fn parse_error(spec: &str) -> String {
    match Registry::parse(spec) {
        Ok(r) => panic!("{spec:?} parsed to {:?}", r.order()),
        Err(MlaError::InvalidShape {
            field,
            expected,
            got,
        }) => {
            assert_eq!(field, "MLA_BACKENDS");
            assert!(
                expected.contains("sm90a, portable, reference"),
                "{expected}"
            );
            assert!(got.contains(&format!("{spec:?}")), "{got}");
            got
        }
        Err(other) => panic!("{spec:?}: expected InvalidShape, got {other:?}"),
    }
}

#[test]
fn parse_rejects_bad_specs() {
    assert!(parse_error("portable,cuda").contains("unknown backend \"cuda\""));
    assert!(parse_error("-sm100a").contains("unknown backend \"sm100a\""));
    assert!(parse_error("Portable").contains("unknown backend"));
    assert!(parse_error("portable,-sm90a").contains("mixes"));
    assert!(parse_error("+reference,sm90a").contains("mixes"));
    assert!(parse_error("portable,,reference").contains("empty entry"));
    assert!(parse_error("portable,").contains("empty entry"));
    assert!(parse_error("-sm90a,").contains("mixes"));
    assert!(parse_error("").contains("empty entry"));
    assert!(parse_error("+").contains("empty entry"));
    assert!(parse_error("-sm90a,-portable,-reference").contains("no backend left"));
    assert!(parse_error("portable,portable").contains("twice"));
}

#[test]
fn removed_backends_are_reported_disabled() {
    let r = Registry::parse("-sm90a").unwrap();
    let sel = r.select(&h200(), &geometry()).unwrap();
    assert_eq!(sel.backend, Backend::Portable);
    assert_eq!(
        sel.declined,
        [(
            Backend::Sm90a,
            Decline::Disabled {
                backend: Backend::Sm90a,
                by: "MLA_BACKENDS=-sm90a".into()
            }
        )]
    );
    assert!(
        sel.to_string()
            .contains("sm90a: disabled by MLA_BACKENDS=-sm90a"),
        "{sel}"
    );

    // Declined by the device first, then the ones the order leaves out.
    let r = Registry::parse("sm90a,reference").unwrap();
    let sel = r.select(&a100(), &geometry()).unwrap();
    assert_eq!(sel.backend, Backend::Reference);
    let reasons: Vec<(Backend, bool)> = sel
        .declined
        .iter()
        .map(|(b, d)| (*b, matches!(d, Decline::Disabled { .. })))
        .collect();
    assert_eq!(
        reasons,
        [(Backend::Sm90a, false), (Backend::Portable, true)]
    );

    // Nothing left that runs: the disabled ones are part of the reason.
    let r = Registry::parse("sm90a").unwrap();
    let err = r.select(&a100(), &geometry()).unwrap_err();
    let MlaError::Unsupported { why, .. } = &err else {
        panic!("expected Unsupported, got {err:?}");
    };
    assert!(why.contains("sm90a: needs"), "{why}");
    assert!(
        why.contains("portable: disabled by MLA_BACKENDS=sm90a"),
        "{why}"
    );
    assert!(
        why.contains("reference: disabled by MLA_BACKENDS=sm90a"),
        "{why}"
    );
}

#[test]
fn order_decides_among_available_backends() {
    let r = Registry::parse("reference,portable,sm90a").unwrap();
    let sel = r.select(&h200(), &geometry()).unwrap();
    assert_eq!(sel.backend, Backend::Reference);
    assert!(sel.declined.is_empty(), "{sel}");
}

#[test]
fn default_registry() {
    let r = Registry::default_order();
    assert_eq!(r.order(), Backend::ALL);
    assert_eq!(r.source(), "default");
}

/// The only test that touches the process environment.
#[test]
fn from_env_reads_mla_backends() {
    let set = |v: Option<&str>| {
        // SAFETY: no other test of this binary reads or writes the environment.
        unsafe {
            match v {
                Some(v) => std::env::set_var("MLA_BACKENDS", v),
                None => std::env::remove_var("MLA_BACKENDS"),
            }
        }
    };
    set(None);
    assert_eq!(Registry::from_env().unwrap(), Registry::default_order());
    set(Some("  "));
    assert_eq!(Registry::from_env().unwrap(), Registry::default_order());
    set(Some("-sm90a"));
    let r = Registry::from_env().unwrap();
    assert_eq!(r.order(), [Backend::Portable, Backend::Reference]);
    assert_eq!(r.source(), "-sm90a");
    set(Some("cuda"));
    assert!(matches!(
        Registry::from_env(),
        Err(MlaError::InvalidShape {
            field: "MLA_BACKENDS",
            ..
        })
    ));
    set(None);
}

/// The combine's build (`names::combine`): wide only where a launch allows more than 8
/// chunks and it takes fewer rounds (memory trips times waves) than narrow; by output type
/// either way.
#[test]
fn combine_build_by_chunks_and_rows() {
    use mla_abi::names::{
        COMBINE_BF16, COMBINE_FP16, COMBINE_WIDE_BF16, COMBINE_WIDE_FP16, combine,
        combine_expecting,
    };
    // B = 1, H = 16 and 128 with 64 chunks: wide.
    assert_eq!(combine_expecting(false, 64, 64, 16, 132), COMBINE_WIDE_BF16);
    assert_eq!(combine_expecting(true, 64, 64, 128, 132), COMBINE_WIDE_FP16);
    assert_eq!(combine_expecting(false, 9, 9, 264, 132), COMBINE_WIDE_BF16);
    // B = 8, H = 16, S_q = 4: 512 rows of 16 chunks, one trip in two waves against eight.
    assert_eq!(
        combine_expecting(false, 66, 16, 512, 132),
        COMBINE_WIDE_BF16
    );
    // At most 8 chunks allowed: narrow.
    assert_eq!(combine_expecting(false, 8, 8, 16, 132), COMBINE_BF16);
    // Many rows of few expected chunks (B = 32, H = 128: two each): narrow.
    assert_eq!(combine_expecting(false, 9, 2, 4096, 132), COMBINE_BF16);
    assert_eq!(combine_expecting(true, 33, 2, 1024, 132), COMBINE_FP16);
    // B = 8, H = 128: 1024 rows of 8 chunks, four trips either way: narrow.
    assert_eq!(combine_expecting(false, 33, 8, 1024, 132), COMBINE_BF16);
    // The expected count is clamped to the bound.
    assert_eq!(
        combine_expecting(false, 9, 1000, 264, 132),
        COMBINE_WIDE_BF16
    );
    // Without an expected count every sequence may take the bound.
    assert_eq!(combine(false, 64, 16, 132), COMBINE_WIDE_BF16);
    assert_eq!(combine(false, 8, 4096, 132), COMBINE_BF16);
    assert_eq!(combine(true, 9, 4096, 132), COMBINE_WIDE_FP16);
}
