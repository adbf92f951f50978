//! CPU tests of the tactic strings, the shape / device keys, the tune cache file and the
//! autotune policy (with fake timing tables in place of kernel launches).

use mla_abi::MAX_SPLITS;
use mla_host::autotune::{Autotuner, DeviceKey, ShapeKey, TuneCache, TuneMode, bucket};
use mla_host::tactic::{
    E4M3_32_ROW_MIN_LEN, E4M3_32_ROW_MIN_TOKENS, E4M3_32_ROW_MIN_TOKENS_FP8Q, M32_MIN_BATCH,
    MAX_WAVES, PlanSize, Switches, Tactic, Tile,
};
use mla_host::{DecodeDtypes, DeviceInfo, MlaError};
use std::cell::Cell;
use std::collections::HashMap;
use std::path::PathBuf;

/// A plan of `max_batch` sequences of up to `max_seq_len` tokens in pages of `page_size`.
fn size(max_batch: usize, max_seq_len: usize, page_size: usize) -> PlanSize {
    PlanSize {
        max_batch,
        max_seq_len,
        page_size,
    }
}

fn h200() -> DeviceKey {
    DeviceKey {
        name: "NVIDIA H200".to_owned(),
        compute_capability: (9, 0),
        driver_version: 13000,
    }
}

fn shape() -> ShapeKey {
    ShapeKey::new(DecodeDtypes::Bf16, 128, 1, 64, 64, 4096)
}

/// `shape()`'s default split cap: 128 rows are two 64-row tiles.
const D: u32 = MAX_SPLITS;

/// The untuned choice for `shape()` and the tuner's candidates for it.
fn shape_default() -> Tactic {
    Tactic::default_for(128)
}

fn shape_candidates() -> Vec<Tactic> {
    Tactic::candidates_for(128)
}

fn tactic(waves: u32, max_splits: u32) -> Tactic {
    Tactic {
        tile: Tile::M64N64,
        waves,
        max_splits,
        ..Tactic::default()
    }
}

/// A fresh directory under the system temp dir, unique per test and process.
fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mla-autotune-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn invalid_field(e: &MlaError) -> &'static str {
    match e {
        MlaError::InvalidShape { field, .. } => field,
        other => panic!("expected InvalidShape, got {other:?}"),
    }
}

// ---------------------------------------------------------------- tactic

#[test]
fn default_tactic_is_one_wave_full_splits() {
    let t = Tactic::default();
    assert_eq!(t, tactic(1, MAX_SPLITS));
    assert_eq!(t.to_string(), "tile=m64n64,waves=1,splits<=128");
    t.validate().unwrap();
}

#[test]
fn candidates_are_small_distinct_valid_and_default_first() {
    let c = Tactic::candidates();
    assert_eq!(
        c,
        vec![
            tactic(1, MAX_SPLITS),
            tactic(1, 16),
            tactic(2, MAX_SPLITS),
            tactic(2, 16),
            tactic(1, 1)
        ]
    );
    assert_eq!(c[0], Tactic::default());
    for t in &c {
        t.validate().unwrap();
    }
    assert_eq!(Tactic::candidates(), c, "deterministic");
}

#[test]
fn shape_defaults_and_candidates_follow_the_rows() {
    // One 16-row tile holds the rows: the small tile is the default and tried first.
    for rows in [1, 8, 16] {
        assert_eq!(Tile::default_for(rows), Tile::M16N64, "rows {rows}");
        let c = Tactic::candidates_for(rows);
        assert_eq!(c[0], Tactic::default_for(rows));
        assert_eq!(c.len(), 10);
        assert!(c[..5].iter().all(|t| t.tile == Tile::M16N64));
        assert!(c[5..].iter().all(|t| t.tile == Tile::M64N64));
    }
    // 17..=32 rows: the 64-row tile by default, the 16-row tile (two row tiles) a candidate.
    for rows in [17, 32] {
        assert_eq!(Tactic::default_for(rows), Tactic::default());
        let c = Tactic::candidates_for(rows);
        assert_eq!(c[..5], Tactic::candidates()[..]);
        assert!(c[5..].iter().all(|t| t.tile == Tile::M16N64));
    }
    // More rows: the 64-row tile only; from two row tiles on, splits capped at
    // MAX_SPLITS by default (and first among the candidates).
    for rows in [33, 64] {
        assert_eq!(Tactic::default_for(rows), Tactic::default());
        assert_eq!(Tactic::candidates_for(rows), Tactic::candidates());
    }
    for rows in [65, 128, 256, 1024] {
        assert_eq!(Tactic::default_for(rows), tactic(1, D));
        assert_eq!(
            Tactic::candidates_for(rows),
            vec![
                tactic(1, D),
                tactic(1, 16),
                tactic(2, D),
                tactic(2, 16),
                tactic(1, 1)
            ]
        );
    }
    // The tuner's untuned choice is the shape's default.
    let mut key = shape();
    key.heads = 16;
    key.s_q = 1;
    let off = Autotuner::new(TuneMode::Off);
    assert_eq!(off.choose(&h200(), &key).tile, Tile::M16N64);
}

#[test]
fn canonical_strings_round_trip() {
    let mut all = Tactic::candidates();
    all.push(Tactic::default());
    all.push(tactic(MAX_WAVES, 1));
    all.push(tactic(3, 7));
    // Every combination of the launch switches.
    for bits in 0..8u32 {
        all.push(Tactic {
            switches: Switches {
                pdl: bits & 1 != 0,
                tma: bits & 2 != 0,
                fold: bits & 4 != 0,
            },
            ..tactic(2, 16)
        });
    }
    for t in all {
        let s = t.to_string();
        let back: Tactic = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(back, t, "{s}");
        assert_eq!(back.to_string(), s);
    }
}

#[test]
fn switches_are_named_only_when_off() {
    assert_eq!(
        Tactic::default().to_string(),
        format!("tile=m64n64,waves=1,splits<={MAX_SPLITS}")
    );
    let t: Tactic = "tile=wg64n64,waves=2,splits<=16,pdl=off,fold=off"
        .parse()
        .unwrap();
    assert_eq!(
        t.switches,
        Switches {
            pdl: false,
            tma: true,
            fold: false
        }
    );
    assert_eq!((t.tile, t.waves, t.max_splits), (Tile::Wg64N64, 2, 16));
    // The longest string fits the C ABI's 64-byte tactic field with its NUL.
    let longest = Tactic {
        switches: Switches {
            pdl: false,
            tma: false,
            fold: false,
        },
        ..tactic(MAX_WAVES, MAX_SPLITS)
    };
    assert!(longest.to_string().len() < 64, "{longest}");
}

#[test]
fn parse_rejects_everything_but_the_canonical_form() {
    let bad = [
        "",
        "tile=m128n64,waves=1,splits<=64",
        "tile=M64N64,waves=1,splits<=64",
        "tile=m64n64,waves=0,splits<=64",
        "tile=m64n64,waves=5,splits<=64",
        "tile=m64n64,waves=1,splits<=0",
        "tile=m64n64,waves=1,splits<=129",
        "tile=m64n64,waves=1,splits<=64,extra=1",
        "tile=m64n64,waves=1,splits<=64,",
        "waves=1,tile=m64n64,splits<=64",
        "tile=m64n64,splits<=64,waves=1",
        "tile=m64n64,waves=1",
        "tile=m64n64,waves=+1,splits<=64",
        "tile=m64n64,waves=01,splits<=64",
        "tile=m64n64,waves=-1,splits<=64",
        "tile=m64n64, waves=1,splits<=64",
        "tile=m64n64,waves=1,splits<=64 ",
        "tile=m64n64,waves=1,splits=64",
        "tile=m64n64;waves=1;splits<=64",
        "tile=m64n64,waves=99999999999,splits<=64",
        // Switches: named only when off, each once, in the order pdl, tma, fold.
        "tile=m64n64,waves=1,splits<=64,pdl=on",
        "tile=m64n64,waves=1,splits<=64,pdl=0",
        "tile=m64n64,waves=1,splits<=64,tma=off,pdl=off",
        "tile=m64n64,waves=1,splits<=64,fold=off,fold=off",
        "tile=m64n64,waves=1,splits<=64,pdl=off,",
        "tile=m64n64,waves=1,pdl=off,splits<=64",
    ];
    for s in bad {
        let e = s.parse::<Tactic>().expect_err(s);
        assert_eq!(invalid_field(&e), "tactic", "{s}");
        assert!(e.to_string().contains("tile=m64n64"), "{s}: {e}");
    }
}

#[test]
fn validate_rejects_out_of_range_fields() {
    for t in [tactic(0, 64), tactic(5, 64), tactic(1, 0), tactic(1, 129)] {
        let e = t.validate().expect_err(&format!("{t:?}"));
        assert_eq!(invalid_field(&e), "tactic");
    }
    for w in 1..=MAX_WAVES {
        for s in [1, 2, 63, 64, 127, 128] {
            tactic(w, s).validate().unwrap();
        }
    }
}

#[test]
fn split_counts_scale_the_target_by_waves() {
    let lens = [4096, 100, 20000, 1, 65];
    let rows = 128;
    let one = Tactic::default().split_counts(&lens, rows, 132);
    assert_eq!(
        one,
        mla_host::plan::split_counts(&lens, rows, 132, MAX_SPLITS as usize)
    );
    let two = tactic(2, 64).split_counts(&lens, rows, 132);
    assert_eq!(two, mla_host::plan::split_counts(&lens, rows, 264, 64));
    let none = tactic(2, 1).split_counts(&lens, rows, 132);
    assert!(none.iter().all(|&s| s == 1), "{none:?}");
    let capped = tactic(4, 16).split_counts(&[131072], 16, 132);
    assert_eq!(capped, vec![16]);
    // The fp8-cache 16- and 32-row kernels compute blocks in pairs: splits of two blocks.
    for tile in [Tile::M16N64, Tile::M32N64] {
        let t = Tactic {
            tile,
            ..Tactic::default()
        };
        assert_eq!(
            t.split_counts_for(&[4096], 32, DecodeDtypes::Fp8KvBf16Q, 132),
            vec![32]
        );
        assert_eq!(tile.step_log2(DecodeDtypes::Fp8), 1);
    }
    assert_eq!(Tile::M16N64.step_log2(DecodeDtypes::Bf16), 0);
    assert_eq!(Tile::Wg64N64.step_log2(DecodeDtypes::Fp8KvBf16Q), 0);
    // The unsized forms are the sized ones for a plan of unknown size.
    for rows in [16, 32, 64] {
        for d in [DecodeDtypes::Bf16, DecodeDtypes::Fp8KvBf16Q] {
            let b = mla_host::Backend::Sm90a;
            assert_eq!(
                Tactic::default_on(rows, b, d),
                Tactic::default_for_plan(rows, PlanSize::UNBOUNDED, b, d)
            );
            assert_eq!(
                Tactic::candidates_on(rows, b, d)[0],
                Tactic::default_on(rows, b, d)
            );
        }
    }
}

// ---------------------------------------------------------------- keys

#[test]
fn bucket_edges() {
    assert_eq!(bucket(0), 1);
    assert_eq!(bucket(1), 1);
    assert_eq!(bucket(2), 2);
    assert_eq!(bucket(3), 4);
    assert_eq!(bucket(4096), 4096);
    assert_eq!(bucket(4097), 8192);
    let top = 1usize << (usize::BITS - 1);
    assert_eq!(bucket(top), top);
    assert_eq!(bucket(usize::MAX), top);
}

#[test]
fn shape_key_buckets_and_prints_canonically() {
    let k = ShapeKey::new(DecodeDtypes::Bf16, 128, 1, 64, 37, 3000);
    assert_eq!((k.batch, k.seq_len), (64, 4096));
    assert_eq!(k.to_string(), "bf16/h128/sq1/p64/b64/l4096");
    assert_eq!(k, ShapeKey::new(DecodeDtypes::Bf16, 128, 1, 64, 64, 4096));
    assert_ne!(k, ShapeKey::new(DecodeDtypes::Bf16, 128, 1, 64, 65, 4096));
    let k = ShapeKey::new(DecodeDtypes::Fp8KvBf16Q, 3, 8, 1, 0, 1);
    assert_eq!(k.to_string(), "fp8kv_bf16q/h3/sq8/p1/b1/l1");
}

#[test]
fn shape_key_round_trips_for_every_dtype() {
    for dtypes in DecodeDtypes::ALL {
        for (heads, s_q, page, batch, len) in [
            (1, 1, 1, 1, 1),
            (128, 8, 256, 256, 131072),
            (100, 3, 16, 5, 4097),
        ] {
            let k = ShapeKey::new(dtypes, heads, s_q, page, batch, len);
            let s = k.to_string();
            let back: ShapeKey = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(back, k, "{s}");
        }
    }
}

#[test]
fn shape_key_parse_rejects_bad_strings() {
    for s in [
        "",
        "bf32/h128/sq1/p64/b64/l4096",
        "bf16/h128/sq1/p64/b63/l4096",
        "bf16/h128/sq1/p64/b64/l4097",
        "bf16/h128/sq1/p48/b64/l4096",
        "bf16/h0/sq1/p64/b64/l4096",
        "bf16/h128/sq0/p64/b64/l4096",
        "bf16/h128/sq1/p64/b064/l4096",
        "bf16/h128/sq1/p64/b64",
        "bf16/h128/sq1/p64/b64/l4096/x",
        "bf16/sq1/h128/p64/b64/l4096",
        "bf16/h128/sq1/p64/b64/l4096 ",
    ] {
        let e = s.parse::<ShapeKey>().expect_err(s);
        assert_eq!(invalid_field(&e), "shape key", "{s}");
    }
}

#[test]
fn device_key_from_device_info() {
    let info = DeviceInfo {
        ordinal: 3,
        name: "NVIDIA H200".to_owned(),
        compute_capability: (9, 0),
        sm_count: 132,
        smem_per_block_optin: 232448,
        smem_per_sm: 233472,
        l2_bytes: 60 << 20,
        driver_version: 13000,
    };
    let d = DeviceKey::from(&info);
    assert_eq!(d, h200());
    assert_eq!(d.to_string(), "NVIDIA H200/sm_90/drv13000");
}

// ---------------------------------------------------------------- cache file

fn sample_entries() -> Vec<(DeviceKey, ShapeKey, Tactic, f64)> {
    let a100 = DeviceKey {
        name: "NVIDIA A100-SXM4-80GB".to_owned(),
        compute_capability: (8, 0),
        driver_version: 12040,
    };
    vec![
        (h200(), shape(), tactic(2, 16), 41.5),
        (
            h200(),
            ShapeKey::new(DecodeDtypes::Fp8, 16, 2, 1, 1, 131072),
            tactic(1, 64),
            1234.0625,
        ),
        (a100, shape(), tactic(1, 1), 0.0),
        (
            h200(),
            ShapeKey::new(DecodeDtypes::Fp16, 128, 1, 256, 256, 1),
            Tactic::default(),
            7.25,
        ),
    ]
}

#[test]
fn cache_get_insert_replace() {
    let mut c = TuneCache::new();
    assert!(c.is_empty());
    assert_eq!(c.get(&h200(), &shape()), None);
    c.insert(&h200(), &shape(), tactic(2, 16), 10.0).unwrap();
    assert_eq!(c.get(&h200(), &shape()), Some((tactic(2, 16), 10.0)));
    c.insert(&h200(), &shape(), tactic(1, 1), 9.0).unwrap();
    assert_eq!(c.len(), 1);
    assert_eq!(c.get(&h200(), &shape()), Some((tactic(1, 1), 9.0)));
    let other_driver = DeviceKey {
        driver_version: 12080,
        ..h200()
    };
    assert_eq!(c.get(&other_driver, &shape()), None);
    // Same bucket, different raw sizes: same entry.
    let same_bucket = ShapeKey::new(DecodeDtypes::Bf16, 128, 1, 64, 33, 2049);
    assert_eq!(c.get(&h200(), &same_bucket), Some((tactic(1, 1), 9.0)));
}

#[test]
fn cache_insert_refuses_what_the_file_could_not_hold() {
    let mut c = TuneCache::new();
    for us in [f64::NAN, f64::INFINITY, -1.0] {
        assert!(
            c.insert(&h200(), &shape(), Tactic::default(), us).is_err(),
            "{us}"
        );
    }
    assert!(c.insert(&h200(), &shape(), tactic(9, 64), 1.0).is_err());
    assert!(c.is_empty());
}

#[test]
fn cache_json_round_trips_through_a_file() {
    let mut c = TuneCache::new();
    for (d, s, t, us) in sample_entries() {
        c.insert(&d, &s, t, us).unwrap();
    }
    let dir = temp_dir("round-trip");
    let path = dir.join("nested").join("tune.json");
    c.save(&path).unwrap();
    let back = TuneCache::load(&path).unwrap();
    assert_eq!(back, c);
    assert_eq!(back.len(), 4);
    for (d, s, t, us) in sample_entries() {
        assert_eq!(back.get(&d, &s), Some((t, us)));
    }
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text, c.to_json());
    assert!(text.contains("\"version\": 1"), "{text}");
    assert!(
        text.contains("\"tactic\": \"tile=m64n64,waves=2,splits<=16\""),
        "{text}"
    );
    assert!(
        text.contains("\"device\": \"NVIDIA H200/sm_90/drv13000\""),
        "{text}"
    );
    assert!(
        text.contains("\"shape\": \"bf16/h128/sq1/p64/b64/l4096\""),
        "{text}"
    );
    // Saving again over the file works and leaves only the file behind.
    back.save(&path).unwrap();
    let names: Vec<_> = std::fs::read_dir(dir.join("nested"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("tune.json")]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn cache_files_are_stable_under_insertion_order() {
    let entries = sample_entries();
    let mut a = TuneCache::new();
    for (d, s, t, us) in &entries {
        a.insert(d, s, *t, *us).unwrap();
    }
    let mut b = TuneCache::new();
    for (d, s, t, us) in entries.iter().rev() {
        b.insert(d, s, *t, *us).unwrap();
    }
    assert_eq!(a.to_json(), b.to_json());
    // And the order in the file is sorted by (device, shape).
    let parsed: serde_json::Value = serde_json::from_str(&a.to_json()).unwrap();
    let keys: Vec<(String, String)> = parsed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["device"].as_str().unwrap().to_owned(),
                e["shape"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    assert_eq!(keys.len(), 4);
}

#[test]
fn empty_cache_round_trips() {
    let c = TuneCache::new();
    let back = TuneCache::from_json(&c.to_json()).unwrap();
    assert!(back.is_empty());
}

#[test]
fn cache_version_mismatch_is_rejected() {
    for text in [
        r#"{"version": 2, "entries": []}"#,
        r#"{"version": 0, "entries": []}"#,
        r#"{"version": "1", "entries": []}"#,
        r#"{"entries": []}"#,
        r#"[]"#,
        r#"not json"#,
    ] {
        let e = TuneCache::from_json(text).expect_err(text);
        assert_eq!(invalid_field(&e), "tune cache", "{text}");
    }
    let e = TuneCache::from_json(r#"{"version": 2, "entries": []}"#).unwrap_err();
    assert!(e.to_string().contains("\"version\": 1"), "{e}");
    assert!(TuneCache::from_json(r#"{"version": 1}"#).is_err());
    assert!(TuneCache::from_json(r#"{"version": 1, "entries": [], "x": 0}"#).is_err());
}

#[test]
fn malformed_entries_are_rejected_with_their_index() {
    let good = r#"{"device": "NVIDIA H200/sm_90/drv13000", "shape": "bf16/h128/sq1/p64/b64/l4096", "tactic": "tile=m64n64,waves=1,splits<=128", "us": 3.5}"#;
    let bad_entries = [
        r#"{"device": "d", "shape": "bf16/h128/sq1/p64/b64/l4096", "tactic": "tile=m64n64,waves=1,splits<=128"}"#,
        r#"{"device": "d", "shape": "bf16/h128/sq1/p64/b64/l4096", "tactic": "tile=m64n64,waves=1,splits<=128", "us": 1, "x": 1}"#,
        r#"{"device": "d", "shape": "bf16/h128/sq1/p64/b64/l4096", "tactic": "tile=m64n64,waves=7,splits<=64", "us": 1}"#,
        r#"{"device": "d", "shape": "bf16/h128/sq1/p64/b63/l4096", "tactic": "tile=m64n64,waves=1,splits<=128", "us": 1}"#,
        r#"{"device": "d", "shape": "bf16/h128/sq1/p64/b64/l4096", "tactic": "tile=m64n64,waves=1,splits<=128", "us": -1}"#,
        r#"{"device": "d", "shape": "bf16/h128/sq1/p64/b64/l4096", "tactic": "tile=m64n64,waves=1,splits<=128", "us": "1"}"#,
        r#"{"device": "", "shape": "bf16/h128/sq1/p64/b64/l4096", "tactic": "tile=m64n64,waves=1,splits<=128", "us": 1}"#,
        r#"["NVIDIA H200", "bf16/h128/sq1/p64/b64/l4096", "tile=m64n64,waves=1,splits<=128", 1]"#,
        r#"null"#,
        // A repeat of entry 0's (device, shape).
        good,
    ];
    for bad in bad_entries {
        let text = format!(r#"{{"version": 1, "entries": [{good}, {bad}]}}"#);
        let e = TuneCache::from_json(&text).expect_err(bad);
        assert_eq!(invalid_field(&e), "tune cache", "{bad}");
        let msg = e.to_string();
        assert!(msg.contains("entries[1]"), "{bad}: {msg}");
        assert!(!msg.contains("entries[0]"), "{bad}: {msg}");
    }
    // The good entry alone loads.
    let c = TuneCache::from_json(&format!(r#"{{"version": 1, "entries": [{good}]}}"#)).unwrap();
    assert_eq!(c.get(&h200(), &shape()), Some((Tactic::default(), 3.5)));
}

#[test]
fn missing_files_are_errors_for_load_and_empty_for_load_or_empty() {
    let dir = temp_dir("missing");
    let path = dir.join("absent.json");
    let e = TuneCache::load(&path).unwrap_err();
    assert_eq!(invalid_field(&e), "tune cache file");
    assert!(e.to_string().contains("absent.json"), "{e}");
    assert!(TuneCache::load_or_empty(&path).unwrap().is_empty());
    std::fs::write(&path, "{").unwrap();
    assert!(
        TuneCache::load_or_empty(&path).is_err(),
        "a corrupt file is not empty"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------- policy

#[test]
fn tune_mode_from_env_value() {
    assert_eq!(TuneMode::from_value(Some("1")), TuneMode::On);
    for v in [None, Some("0"), Some(""), Some("true"), Some(" 1")] {
        assert_eq!(TuneMode::from_value(v), TuneMode::Off, "{v:?}");
    }
}

/// A timing table by canonical tactic string; tactics not in it fail.
fn table(rows: &[(Tactic, f64)]) -> HashMap<String, f64> {
    rows.iter().map(|(t, us)| (t.to_string(), *us)).collect()
}

fn timer<'a>(
    table: &'a HashMap<String, f64>,
    calls: &'a Cell<usize>,
) -> impl FnMut(&Tactic) -> Result<f64, MlaError> + 'a {
    move |t| {
        calls.set(calls.get() + 1);
        table
            .get(&t.to_string())
            .copied()
            .ok_or_else(|| MlaError::InvalidShape {
                field: "fake timing",
                expected: "a tactic in the table".to_owned(),
                got: t.to_string(),
            })
    }
}

/// Fake times of `shape()`'s candidates: `tactic(2, D)` the fastest, at 30.5 us.
fn shape_times() -> HashMap<String, f64> {
    table(&[
        (tactic(1, D), 50.0),
        (tactic(1, 16), 45.0),
        (tactic(2, D), 30.5),
        (tactic(2, 16), 31.0),
        (tactic(1, 1), 90.0),
    ])
}

#[test]
fn off_never_times_and_returns_the_default() {
    let mut tuner = Autotuner::new(TuneMode::Off);
    let calls = Cell::new(0);
    let t = tuner
        .tune(&h200(), &shape(), |_| {
            calls.set(calls.get() + 1);
            Ok(1.0)
        })
        .unwrap();
    assert_eq!(t, shape_default());
    assert_eq!(calls.get(), 0);
    assert!(tuner.cache.is_empty());
    // Even a cached winner is ignored when tuning is off.
    tuner
        .cache
        .insert(&h200(), &shape(), tactic(2, 16), 1.0)
        .unwrap();
    assert_eq!(tuner.choose(&h200(), &shape()), shape_default());
    let t = tuner
        .choose_or_tune(&h200(), &shape(), |_| {
            calls.set(calls.get() + 1);
            Ok(1.0)
        })
        .unwrap();
    assert_eq!(t, shape_default());
    assert_eq!(calls.get(), 0);
}

#[test]
fn on_picks_the_fastest_and_caches_it() {
    let times = shape_times();
    let calls = Cell::new(0);
    let mut tuner = Autotuner::new(TuneMode::On);
    assert_eq!(
        tuner.choose(&h200(), &shape()),
        shape_default(),
        "nothing cached yet"
    );
    let t = tuner
        .tune(&h200(), &shape(), timer(&times, &calls))
        .unwrap();
    assert_eq!(t, tactic(2, D));
    assert_eq!(calls.get(), shape_candidates().len());
    assert_eq!(
        tuner.cache.get(&h200(), &shape()),
        Some((tactic(2, D), 30.5))
    );
    // Cached: no more timing.
    assert_eq!(tuner.choose(&h200(), &shape()), tactic(2, D));
    let t = tuner
        .choose_or_tune(&h200(), &shape(), timer(&times, &calls))
        .unwrap();
    assert_eq!(t, tactic(2, D));
    assert_eq!(calls.get(), shape_candidates().len());
    // Another shape is not covered by that entry.
    let other = ShapeKey::new(DecodeDtypes::Fp8, 128, 1, 64, 64, 4096);
    assert_eq!(tuner.choose(&h200(), &other), shape_default());
    let t = tuner
        .choose_or_tune(&h200(), &other, timer(&times, &calls))
        .unwrap();
    assert_eq!(t, tactic(2, D));
    assert_eq!(calls.get(), 2 * shape_candidates().len());
    assert_eq!(tuner.cache.len(), 2);
}

#[test]
fn a_cached_tile_this_backend_cannot_run_is_retuned() {
    use mla_host::gate::Backend;
    // A winner tuned where the sm_90a image loaded: the wgmma tile.
    let wg = Tactic {
        tile: Tile::Wg64N64,
        ..shape_default()
    };
    wg.tile.check(Backend::Sm90a, DecodeDtypes::Bf16).unwrap();
    assert!(
        wg.tile
            .check(Backend::Portable, DecodeDtypes::Bf16)
            .is_err()
    );
    let mut tuner = Autotuner::for_backend(TuneMode::On, Backend::Portable);
    tuner.cache.insert(&h200(), &shape(), wg, 5.0).unwrap();
    // The same device on the portable image: the entry is passed over, not planned.
    assert_eq!(tuner.choose(&h200(), &shape()), shape_default());
    let times = shape_times();
    let calls = Cell::new(0);
    let t = tuner
        .choose_or_tune(&h200(), &shape(), timer(&times, &calls))
        .unwrap();
    assert_eq!(t, tactic(2, D));
    assert_eq!(calls.get(), shape_candidates().len(), "retuned");
    // The portable winner replaced the entry, and is used from then on.
    assert_eq!(
        tuner.cache.get(&h200(), &shape()),
        Some((tactic(2, D), 30.5))
    );
    assert_eq!(tuner.choose(&h200(), &shape()), tactic(2, D));
    // Where the sm_90a image loads, the wgmma winner is taken as cached.
    let mut sm90 = Autotuner::for_backend(TuneMode::On, Backend::Sm90a);
    sm90.cache.insert(&h200(), &shape(), wg, 5.0).unwrap();
    assert_eq!(sm90.choose(&h200(), &shape()), wg);
}

#[test]
fn ties_keep_the_earlier_candidate() {
    let calls = Cell::new(0);
    let flat = table(
        &shape_candidates()
            .iter()
            .map(|&t| (t, 10.0))
            .collect::<Vec<_>>(),
    );
    let mut tuner = Autotuner::new(TuneMode::On);
    let t = tuner.tune(&h200(), &shape(), timer(&flat, &calls)).unwrap();
    assert_eq!(t, shape_candidates()[0]);

    let later_tie = table(&[
        (tactic(1, D), 10.0),
        (tactic(1, 16), 8.0),
        (tactic(2, D), 10.0),
        (tactic(2, 16), 8.0),
        (tactic(1, 1), 8.0),
    ]);
    let t = tuner
        .tune(&h200(), &shape(), timer(&later_tie, &calls))
        .unwrap();
    assert_eq!(t, tactic(1, 16));
    assert_eq!(
        tuner.cache.get(&h200(), &shape()),
        Some((tactic(1, 16), 8.0))
    );
}

#[test]
fn a_failing_candidate_is_skipped() {
    // The would-be winner (2, 16) is missing from the table, so its timing fails.
    let times = table(&[
        (tactic(1, D), 50.0),
        (tactic(1, 16), 45.0),
        (tactic(2, D), 40.0),
        (tactic(1, 1), 90.0),
    ]);
    let calls = Cell::new(0);
    let mut tuner = Autotuner::new(TuneMode::On);
    let t = tuner
        .tune(&h200(), &shape(), timer(&times, &calls))
        .unwrap();
    assert_eq!(t, tactic(2, D));
    assert_eq!(
        calls.get(),
        shape_candidates().len(),
        "every candidate tried"
    );

    // A nonsense time is skipped the same way.
    let mut tuner = Autotuner::new(TuneMode::On);
    let t = tuner
        .tune(&h200(), &shape(), |t| {
            Ok(if *t == tactic(1, 1) {
                f64::NAN
            } else {
                5.0 + t.waves as f64
            })
        })
        .unwrap();
    assert_eq!(t, shape_default());
    assert_eq!(
        tuner.cache.get(&h200(), &shape()),
        Some((shape_default(), 6.0))
    );
}

#[test]
fn all_failing_returns_the_first_error_and_caches_nothing() {
    let empty = HashMap::new();
    let calls = Cell::new(0);
    let mut tuner = Autotuner::new(TuneMode::On);
    let e = tuner
        .tune(&h200(), &shape(), timer(&empty, &calls))
        .unwrap_err();
    assert_eq!(calls.get(), shape_candidates().len());
    match &e {
        MlaError::InvalidShape { field, got, .. } => {
            assert_eq!(*field, "fake timing");
            assert_eq!(*got, shape_candidates()[0].to_string());
        }
        other => panic!("{other:?}"),
    }
    assert!(tuner.cache.is_empty());
    assert_eq!(tuner.choose(&h200(), &shape()), shape_default());
}

#[test]
fn backend_defaults_and_candidates() {
    use mla_host::gate::Backend;
    let all = [
        DecodeDtypes::Bf16,
        DecodeDtypes::Fp16,
        DecodeDtypes::Fp8KvBf16Q,
        DecodeDtypes::Fp8,
    ];
    for backend in Backend::ALL {
        for dtypes in all {
            for rows in [1, 16, 17, 32, 33, 64, 128] {
                let d = Tactic::default_for_plan(rows, size(64, 4096, 64), backend, dtypes);
                let c = Tactic::candidates_for_plan(rows, size(64, 4096, 64), backend, dtypes);
                assert_eq!(c[0], d, "{backend:?} {dtypes:?} rows {rows}: default first");
                let tiles: Vec<Tile> = c.iter().map(|t| t.tile).collect();
                let has = |t| tiles.contains(&t);
                assert!(has(Tile::M64N64), "{backend:?} {dtypes:?} rows {rows}");
                assert_eq!(
                    has(Tile::M16N64),
                    rows <= 32,
                    "{backend:?} {dtypes:?} rows {rows}"
                );
                // Tile::check admits the wgmma tile on the reference backend too.
                let wg = backend != Backend::Portable && rows > 16 && dtypes != DecodeDtypes::Fp16;
                assert_eq!(has(Tile::Wg64N64), wg, "{backend:?} {dtypes:?} rows {rows}");
                // The 32-row tile: sm_90a (and the reference backend, as above), fp8 caches.
                let m32 = backend != Backend::Portable
                    && rows > 16
                    && matches!(dtypes, DecodeDtypes::Fp8KvBf16Q | DecodeDtypes::Fp8);
                assert_eq!(has(Tile::M32N64), m32, "{backend:?} {dtypes:?} rows {rows}");
            }
        }
    }
    // On sm_90a an fp8 cache takes the 16-row tile up to 16 rows; up to 32 the wgmma tile
    // (its e4m3 TMA decode) from E4M3_32_ROW_MIN_TOKENS tokens with pages of 16 or more,
    // else the 32-row tile (both 16- and 32-row kernels convert fp8 in registers); bf16
    // above 16 rows the wgmma tile; the portable image keeps the portable rule.
    // Below M32_MIN_BATCH sequences two 16-row tiles keep more CTAs busy than one 32-row.
    for dtypes in [DecodeDtypes::Fp8KvBf16Q, DecodeDtypes::Fp8] {
        let min = if dtypes == DecodeDtypes::Fp8 {
            E4M3_32_ROW_MIN_TOKENS_FP8Q
        } else {
            E4M3_32_ROW_MIN_TOKENS
        };
        for rows in [1, 16] {
            for (batch, len) in [(64, 4096), (128, 65536)] {
                assert_eq!(
                    Tile::default_for_plan(rows, size(batch, len, 64), Backend::Sm90a, dtypes),
                    Tile::M16N64
                );
            }
        }
        for rows in [17, 32] {
            for (batch, len, page, tile) in [
                (1, 4096, 64, Tile::M16N64),
                (1, min - 1, 64, Tile::M16N64),
                (1, min, 64, Tile::Wg64N64),
                (1, min, 8, Tile::M16N64),
                (M32_MIN_BATCH - 1, 4096, 64, Tile::M16N64),
                (M32_MIN_BATCH - 1, 16384, 64, Tile::Wg64N64),
                (M32_MIN_BATCH, 4096, 64, Tile::M32N64),
                (min / 4096, 4096, 16, Tile::Wg64N64),
                (min / 4096, 4096, 8, Tile::M32N64),
                (min / 4096 - 1, 4096, 64, Tile::M32N64),
                (128, 4096, 64, Tile::Wg64N64),
                (128, 4096, 8, Tile::M32N64),
                (128, 4096, 1, Tile::M32N64),
                // A small plan keeps two 16-row tiles at any batch.
                (32, 1024, 64, Tile::M16N64),
                (128, 1024, 64, Tile::Wg64N64),
                (128, 1024, 8, Tile::M32N64),
            ] {
                let got =
                    Tile::default_for_plan(rows, size(batch, len, page), Backend::Sm90a, dtypes);
                assert_eq!(got, tile, "rows {rows} B {batch} L {len} page {page}");
            }
            // Short sequences in a large plan: fp8 Q takes the wgmma tile at any length,
            // bf16 Q from E4M3_32_ROW_MIN_LEN tokens on.
            let short = E4M3_32_ROW_MIN_LEN / 2;
            let got = Tile::default_for_plan(
                rows,
                size(2 * min / short, short, 64),
                Backend::Sm90a,
                dtypes,
            );
            let want = if dtypes == DecodeDtypes::Fp8 {
                Tile::Wg64N64
            } else {
                Tile::M32N64
            };
            assert_eq!(got, want, "rows {rows} L {short}");
            // A plan of unknown size: as large as the ABI allows.
            assert_eq!(
                Tile::default_on(rows, Backend::Sm90a, dtypes),
                Tile::Wg64N64
            );
        }
        assert_eq!(Tile::M32N64.row_tiles(33), 2);
        assert!(Tile::M32N64.check(Backend::Portable, dtypes).is_err());
        assert!(Tile::M32N64.check(Backend::Sm90a, dtypes).is_ok());
    }
    for dtypes in [DecodeDtypes::Bf16, DecodeDtypes::Fp16] {
        let e = Tile::M32N64
            .check(Backend::Sm90a, dtypes)
            .unwrap_err()
            .to_string();
        assert!(e.contains("m32n64") && e.contains("fp8"), "{e}");
    }
    let tactic: Tactic = "tile=m32n64,waves=1,splits<=128".parse().unwrap();
    assert_eq!(tactic.tile, Tile::M32N64);
    for dtypes in [DecodeDtypes::Fp8KvBf16Q, DecodeDtypes::Fp8] {
        assert_eq!(
            Tile::default_for_plan(33, size(64, 4096, 64), Backend::Sm90a, dtypes),
            Tile::Wg64N64
        );
    }
    let e = Tile::Wg64N64
        .check(Backend::Sm90a, DecodeDtypes::Fp16)
        .unwrap_err()
        .to_string();
    assert!(e.contains("wg64n64") && e.contains("Fp16"), "{e}");
    assert_eq!(
        Tile::default_for_plan(32, size(64, 4096, 64), Backend::Sm90a, DecodeDtypes::Bf16),
        Tile::Wg64N64
    );
    assert_eq!(
        Tile::default_for_plan(
            32,
            size(64, 4096, 64),
            Backend::Portable,
            DecodeDtypes::Fp8KvBf16Q
        ),
        Tile::M64N64
    );
    // bf16 at 17..=32 rows with pages of 16 or more (the small-row TMA decode on): two
    // 16-row tiles in plans of sequences of at most 4096 tokens and TMA32_SMALL_PLAN_TOKENS in
    // all, the wgmma tile otherwise. Smaller pages (or the small-row decode off): two 16-row
    // tiles in a small plan (`small_plan`), the wgmma tile otherwise. Up to 16 rows the
    // 16-row tile, except in plans of TMA32_CP_MIN_BATCH sequences or more, of 4096 tokens or
    // more, TMA32_16ROW_MIN_TOKENS in all, with pages of 16 or more (the small-row decode and
    // its `cp.async` form on): the wgmma tile. Above 32 rows the wgmma tile.
    use mla_host::choice::TMA32_CP_MIN_BATCH;
    use mla_host::tactic::{TMA32_16ROW_MIN_TOKENS, TMA32_SMALL_PLAN_TOKENS};
    let over = mla_host::choice::Overrides::get();
    let t32 = over.small_row_tma();
    let t16 = t32 && over.tma32_cp;
    let min16 = TMA32_16ROW_MIN_TOKENS;
    let (wg, m16) = (Tile::Wg64N64, Tile::M16N64);
    for (rows, batch, len, page, on, off) in [
        (32, 1, 1024, 64, m16, m16),
        (32, TMA32_SMALL_PLAN_TOKENS / 4096, 4096, 64, m16, m16),
        (32, TMA32_SMALL_PLAN_TOKENS / 1024, 1024, 64, m16, m16),
        (32, TMA32_SMALL_PLAN_TOKENS / 1024 + 1, 1024, 64, wg, m16),
        (32, 8, 4096, 64, wg, m16),
        (17, 32, 1024, 16, wg, m16),
        (17, 32, 1024, 8, m16, m16),
        (32, 8, 4096, 8, m16, m16),
        (32, 1, 8192, 64, wg, wg),
        (32, 1, 16384, 64, wg, wg),
        (32, 9, 4096, 64, wg, wg),
        (32, 32, 4096, 64, wg, wg),
        (32, 32, 4096, 8, wg, wg),
        (33, 1, 1024, 64, wg, wg),
        (16, 128, 16384, 64, wg, m16),
        (1, 128, 131072, 64, wg, m16),
        (16, 8, 131072, 16, wg, m16),
        (16, min16 / 4096, 4096, 64, wg, m16),
        (16, min16 / 4096 - 1, 4096, 64, m16, m16),
        (16, TMA32_CP_MIN_BATCH - 1, 1 << 20, 64, m16, m16),
        (16, min16 / 2048, 2048, 64, m16, m16),
        (16, 128, 16384, 8, m16, m16),
        (8, 1, 1 << 20, 64, m16, m16),
    ] {
        let got = Tile::default_for_plan(
            rows,
            size(batch, len, page),
            Backend::Sm90a,
            DecodeDtypes::Bf16,
        );
        let want = if rows <= 16 { t16 } else { t32 };
        let want = if want { on } else { off };
        assert_eq!(
            got, want,
            "rows {rows} B {batch} L {len} page {page} small-row {t32}"
        );
    }
    assert!(mla_host::tactic::small_plan(8, 4096) && !mla_host::tactic::small_plan(8, 4097));
}
