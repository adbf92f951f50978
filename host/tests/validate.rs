//! Request validation, CPU only. First one test per rule: each takes a valid request,
//! breaks one thing and checks the error variant and its field. Then randomised requests
//! (mutations of valid ones) are judged by the validator and by `*_by_spec`, a plain
//! restatement of the rules written here independently: the two must agree on every one,
//! and the validator must never panic.

use std::fmt::Debug;
use std::panic::{AssertUnwindSafe, catch_unwind};

use mla_abi::{D_QK, D_V, ElemType};
use mla_dev::rng::SplitMix64;
use mla_host::MlaError;
use mla_host::request::*;
use mla_host::tensor::TensorView;
use mla_host::validate::*;

// ---- a valid fixture -------------------------------------------------------------------

const GIB: u64 = 1 << 30;
const B: usize = 3;
const S_Q: usize = 2;
const H: usize = 16;
const P: usize = 16;
const PAGES: usize = 10;
const MAX_PAGES: usize = 4;
/// Gather output rows per sequence.
const MAX_LEN: usize = 64;

/// One page, two pages, every page.
static LENS: [i32; B] = [2, 17, 64];
/// Used entries hold valid ids; the unused ones (row 0 from 1, row 1 from 2) hold poison.
static TABLE: [i32; B * MAX_PAGES] = [0, -1, 77, i32::MIN, 3, 4, 10, -5, 9, 8, 7, 6];

/// Fake device addresses, 256-byte aligned and a GiB apart.
fn region(i: u64) -> u64 {
    0x1000_0000 + i * GIB
}

fn full_host() -> HostMirror<'static> {
    HostMirror {
        seq_lens: Some(&LENS),
        page_table: Some(&TABLE),
    }
}

fn decode_req(d: DecodeDtypes) -> DecodeRequest<'static> {
    let fp8_scale = |t: ElemType, s: f32| if t == ElemType::Fp8E4m3 { s } else { 1.0 };
    DecodeRequest {
        q: TensorView::contiguous(region(0), d.q(), [B, S_Q, H, D_QK]),
        kv_cache: TensorView::contiguous(region(1), d.kv(), [PAGES, P, D_QK]),
        page_table: TensorView::contiguous(region(2), ElemType::I32, [B, MAX_PAGES]),
        seq_lens: TensorView::contiguous(region(3), ElemType::I32, [B]),
        out: TensorView::contiguous(region(4), d.out(), [B, S_Q, H, D_V]),
        lse: TensorView::contiguous(region(5), ElemType::F32, [B, S_Q, H]),
        scales: Scales {
            q_scale: fp8_scale(d.q(), 0.25),
            kv_scale: fp8_scale(d.kv(), 0.5),
            ..Scales::default_for_mla()
        },
        host: full_host(),
    }
}

fn bf16_req() -> DecodeRequest<'static> {
    decode_req(DecodeDtypes::Bf16)
}

/// Sets batch, s_q and heads consistently on q, out and lse.
fn reshape(r: &mut DecodeRequest, batch: usize, s_q: usize, heads: usize) {
    r.q = TensorView::contiguous(r.q.ptr, r.q.dtype, [batch, s_q, heads, D_QK]);
    r.out = TensorView::contiguous(r.out.ptr, r.out.dtype, [batch, s_q, heads, D_V]);
    r.lse = TensorView::contiguous(r.lse.ptr, r.lse.dtype, [batch, s_q, heads]);
}

fn append_req(cache: ElemType, new: ElemType) -> AppendRequest<'static> {
    AppendRequest {
        new_kv: TensorView::contiguous(region(0), new, [B, S_Q, D_QK]),
        kv_cache: TensorView::contiguous(region(1), cache, [PAGES, P, D_QK]),
        page_table: TensorView::contiguous(region(2), ElemType::I32, [B, MAX_PAGES]),
        seq_lens: TensorView::contiguous(region(3), ElemType::I32, [B]),
        kv_scale: if cache == ElemType::Fp8E4m3 { 0.5 } else { 1.0 },
        host: full_host(),
    }
}

fn gather_req(cache: ElemType, out: ElemType) -> GatherRequest<'static> {
    GatherRequest {
        kv_cache: TensorView::contiguous(region(1), cache, [PAGES, P, D_QK]),
        page_table: TensorView::contiguous(region(2), ElemType::I32, [B, MAX_PAGES]),
        seq_lens: TensorView::contiguous(region(3), ElemType::I32, [B]),
        out: TensorView::contiguous(region(4), out, [B, MAX_LEN, D_QK]),
        kv_scale: if cache == ElemType::Fp8E4m3 { 0.5 } else { 1.0 },
        host: full_host(),
    }
}

// ---- error matchers --------------------------------------------------------------------

/// The (expected, got) of an `InvalidShape` on `field`; panics on anything else.
fn invalid_shape<T: Debug>(r: Result<T, MlaError>, field: &str) -> (String, String) {
    match r {
        Err(MlaError::InvalidShape {
            field: f,
            expected,
            got,
        }) if f == field => (expected, got),
        other => panic!("expected InvalidShape on {field:?}, got {other:?}"),
    }
}

/// The (expected, got) of an `OutOfRange` on `field[index]`.
fn out_of_range<T: Debug>(r: Result<T, MlaError>, field: &str, index: usize) -> (String, i64) {
    match r {
        Err(MlaError::OutOfRange {
            field: f,
            index: i,
            expected,
            got,
        }) if f == field && i == index => (expected, got),
        other => panic!("expected OutOfRange on {field}[{index}], got {other:?}"),
    }
}

fn aliasing<T: Debug>(r: Result<T, MlaError>, a: &str, b: &str) {
    match r {
        Err(MlaError::Aliasing { a: x, b: y }) if x == a && y == b => {}
        other => panic!("expected Aliasing {{ {a}, {b} }}, got {other:?}"),
    }
}

fn misaligned<T: Debug>(r: Result<T, MlaError>, field: &str, addr: u64) {
    match r {
        Err(MlaError::Misaligned {
            field: f,
            addr: a,
            align: 16,
        }) if f == field && a == addr => {}
        other => panic!("expected Misaligned {field} at {addr:#x} (16), got {other:?}"),
    }
}

fn dtype_mismatch<T: Debug>(r: Result<T, MlaError>, field: &str) -> (String, String) {
    match r {
        Err(MlaError::DtypeMismatch {
            field: f,
            expected,
            got,
        }) if f == field => (expected, got),
        other => panic!("expected DtypeMismatch on {field}, got {other:?}"),
    }
}

// ---- decode: one rule per test -----------------------------------------------------------

#[test]
fn merged_outputs_stay_apart_from_the_decode_inputs() {
    // A context-parallel step's merged out / lse (their own regions) pass; laid over a
    // decode input (the lengths, the cache) they are refused before any launch.
    let req = decode_req(DecodeDtypes::Bf16);
    let parts = SplitParts::default();
    let out = TensorView::contiguous(region(6), ElemType::Bf16, [B, S_Q, H, D_V]);
    let lse = TensorView::contiguous(region(7), ElemType::F32, [B, S_Q, H]);
    merged_outputs_apart(&req, &parts, &out, &lse).unwrap();
    let on_lens = TensorView::contiguous(region(3), ElemType::F32, [B, S_Q, H]);
    aliasing(
        merged_outputs_apart(&req, &parts, &out, &on_lens),
        "lse",
        "seq_lens",
    );
    let on_cache = TensorView::contiguous(region(1) + 64, ElemType::Bf16, [B, S_Q, H, D_V]);
    aliasing(
        merged_outputs_apart(&req, &parts, &on_cache, &lse),
        "out",
        "kv_cache",
    );
}

#[test]
fn combine_sources_ignore_the_strides_of_unit_dims() {
    // A combine's local out / lse go to the all-gather as one block from their base: any
    // view whose dims longer than 1 are row-major is one, whatever its unit dims' strides
    // (s_q = 1 here, as a transposed [B, H, 1, 512] buffer reports it; a batch of one).
    let canonical = TensorView::contiguous(region(6), ElemType::Bf16, [B, 1, H, D_V]);
    block_source("local_out", "local_out.strides", &canonical).unwrap();
    let transposed = TensorView::strided(
        region(6),
        ElemType::Bf16,
        [B, 1, H, D_V],
        [H * D_V, D_V, D_V, 1],
    );
    block_source("local_out", "local_out.strides", &transposed).unwrap();
    let lse = TensorView::strided(region(7), ElemType::F32, [1, S_Q, H], [7, H, 1]);
    block_source("local_lse", "local_lse.strides", &lse).unwrap();

    // Rows apart (padded), a null base and a base off the element size are refused by name.
    let padded = TensorView::strided(
        region(6),
        ElemType::Bf16,
        [B, S_Q, H, D_V],
        [S_Q * H * 2 * D_V, H * 2 * D_V, 2 * D_V, 1],
    );
    invalid_shape(
        block_source("local_out", "local_out.strides", &padded),
        "local_out.strides",
    );
    // A row-major block whose elements overflow the address space.
    let huge = TensorView::strided(
        region(6),
        ElemType::Bf16,
        [1 << 62, 1, 1, D_V],
        [D_V, D_V, D_V, 1],
    );
    invalid_shape(
        block_source("local_out", "local_out.strides", &huge),
        "local_out",
    );
    let null = TensorView {
        ptr: 0,
        ..canonical
    };
    match block_source("local_out", "local_out.strides", &null) {
        Err(MlaError::NullPointer { field }) => assert_eq!(field, "local_out"),
        other => panic!("{other:?}"),
    }
    let odd = TensorView {
        ptr: region(7) + 2,
        ..lse
    };
    match block_source("local_lse", "local_lse.strides", &odd) {
        Err(MlaError::Misaligned { field, addr, align }) => {
            assert_eq!((field, addr, align), ("local_lse", region(7) + 2, 4));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn decode_accepts_every_dtype() {
    for d in DecodeDtypes::ALL {
        let want = DecodeShape {
            batch: B,
            s_q: S_Q,
            heads: H,
            page_size: P,
            num_pages: PAGES,
            max_pages: MAX_PAGES,
            dtypes: d,
        };
        assert_eq!(validate_decode(&decode_req(d)).unwrap(), want, "{d:?}");
        let mut r = decode_req(d);
        r.host = HostMirror::default();
        assert_eq!(
            validate_decode(&r).unwrap(),
            want,
            "{d:?} without host mirror"
        );
    }
}

#[test]
fn decode_accepts_padded_permuted_and_unit_dim_layouts() {
    let mut r = bf16_req();
    // q and out padded per head; out stored heads-major ([h][b][s] rows).
    r.q.strides = [S_Q * H * 640, H * 640, 640, 1];
    r.out.strides = [S_Q * D_V, D_V, B * S_Q * D_V, 1];
    // Pages padded; the page table padded per row.
    r.kv_cache.strides = [P * 600 + 64, 600, 1];
    r.page_table.strides = [MAX_PAGES + 4, 1];
    let padded: Vec<i32> = TABLE
        .chunks(MAX_PAGES)
        .flat_map(|row| row.iter().copied().chain([-7; 4]))
        .collect();
    r.host.page_table = Some(&padded);
    validate_decode(&r).unwrap();

    // Strides of dims of extent 1 are never used.
    let mut r = bf16_req();
    reshape(&mut r, B, 1, H);
    r.q.strides[1] = 3;
    r.out.strides[1] = 5;
    r.lse.strides[1] = 7;
    validate_decode(&r).unwrap();
}

#[test]
fn decode_rejects_zero_heads() {
    let mut r = bf16_req();
    reshape(&mut r, B, S_Q, 0);
    let (expected, got) = invalid_shape(validate_decode(&r), "q.shape[2] (heads)");
    assert_eq!((expected.as_str(), got.as_str()), ("1..=128", "0"));
}

#[test]
fn decode_rejects_too_many_heads() {
    let mut r = bf16_req();
    reshape(&mut r, B, S_Q, 129);
    let err = validate_decode(&r).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("1..=128") && text.contains("129"), "{text}");
    invalid_shape(Err::<(), _>(err), "q.shape[2] (heads)");
}

#[test]
fn decode_rejects_zero_query_tokens() {
    let mut r = bf16_req();
    reshape(&mut r, B, 0, H);
    invalid_shape(validate_decode(&r), "q.shape[1] (s_q)");
}

#[test]
fn decode_rejects_too_many_query_tokens() {
    let mut r = bf16_req();
    reshape(&mut r, B, 9, H);
    let (expected, got) = invalid_shape(validate_decode(&r), "q.shape[1] (s_q)");
    assert_eq!((expected.as_str(), got.as_str()), ("1..=8", "9"));
}

#[test]
fn decode_rejects_page_size_not_power_of_two() {
    let mut r = bf16_req();
    r.kv_cache = TensorView::contiguous(region(1), ElemType::Bf16, [PAGES, 3, D_QK]);
    r.host = HostMirror::default();
    let (_, got) = invalid_shape(validate_decode(&r), "kv_cache.shape[1] (page_size)");
    assert_eq!(got, "3");
}

#[test]
fn decode_rejects_page_size_over_max() {
    let mut r = bf16_req();
    r.kv_cache = TensorView::contiguous(region(1), ElemType::Bf16, [PAGES, 512, D_QK]);
    let (expected, got) = invalid_shape(validate_decode(&r), "kv_cache.shape[1] (page_size)");
    assert!(expected.contains("256"), "{expected}");
    assert_eq!(got, "512");
}

#[test]
fn decode_host_lengths_allow_padding_and_short_sequences() {
    // <= 0 is padding (no page used, rows not written); below s_q a query token may see
    // no key (zeros, lse -inf): both valid, with or without the host mirror. Row 0's
    // table entries are junk past its (empty) pages.
    let mut table = TABLE;
    table[0] = -1;
    for lens in [[0, 1, 64], [-5, 17, 2], [i32::MIN, 0, 0]] {
        let mut r = bf16_req();
        r.host.seq_lens = Some(&lens);
        r.host.page_table = Some(&table);
        validate_decode(&r).unwrap();
        assert_eq!(decode_by_spec(&r), Ok(()), "{lens:?}");
    }
}

#[test]
fn decode_rejects_seq_len_over_capacity() {
    let lens = [2, 17, 65];
    let mut r = bf16_req();
    r.host.seq_lens = Some(&lens);
    let (expected, got) = out_of_range(validate_decode(&r), "seq_lens", 2);
    assert!(expected.contains("<= 64"), "{expected}");
    assert_eq!(got, 65);
}

#[test]
fn decode_rejects_negative_page_id_in_used_entry() {
    let mut table = TABLE;
    table[MAX_PAGES + 1] = -1;
    let mut r = bf16_req();
    r.host.page_table = Some(&table);
    let (_, got) = out_of_range(validate_decode(&r), "page_table", MAX_PAGES + 1);
    assert_eq!(got, -1);
}

#[test]
fn decode_rejects_page_id_equal_to_page_count_in_used_entry() {
    let mut table = TABLE;
    table[2 * MAX_PAGES + 3] = PAGES as i32;
    let mut r = bf16_req();
    r.host.page_table = Some(&table);
    let (expected, got) = out_of_range(validate_decode(&r), "page_table", 2 * MAX_PAGES + 3);
    assert!(expected.contains(&format!("0..{PAGES}")), "{expected}");
    assert_eq!(got, PAGES as i64);
}

#[test]
fn decode_ignores_bad_page_ids_in_unused_entries() {
    let mut table = TABLE;
    // Row 0 uses one page, row 1 two: everything after them is never read.
    table[1] = PAGES as i32;
    table[2] = -1;
    table[MAX_PAGES + 2] = i32::MAX;
    let mut r = bf16_req();
    r.host.page_table = Some(&table);
    validate_decode(&r).unwrap();
}

#[test]
fn decode_checks_every_page_id_without_host_lengths() {
    let mut r = bf16_req();
    r.host.seq_lens = None;
    let (_, got) = out_of_range(validate_decode(&r), "page_table", 1);
    assert_eq!(got, -1);
}

#[test]
fn decode_rejects_short_host_table() {
    let mut r = bf16_req();
    r.host.page_table = Some(&TABLE[..TABLE.len() - 1]);
    invalid_shape(validate_decode(&r), "host.page_table.len()");
}

#[test]
fn decode_rejects_unsupported_dtype_pair() {
    let mut r = bf16_req();
    r.q.dtype = ElemType::Fp16;
    match validate_decode(&r) {
        Err(MlaError::Unsupported { got, why, .. }) => {
            assert_eq!(got, "(fp16, bf16)");
            assert!(why.contains("(bf16, fp8_e4m3)"), "{why}");
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

#[test]
fn decode_rejects_wrong_out_dtype() {
    let mut r = bf16_req();
    r.out.dtype = ElemType::Fp16;
    let (expected, got) = dtype_mismatch(validate_decode(&r), "out");
    assert_eq!((expected.as_str(), got.as_str()), ("bf16", "fp16"));
}

#[test]
fn decode_rejects_lse_not_f32() {
    let mut r = bf16_req();
    r.lse.dtype = ElemType::Bf16;
    dtype_mismatch(validate_decode(&r), "lse");
}

#[test]
fn decode_rejects_misaligned_q_pointer() {
    let mut r = bf16_req();
    r.q.ptr += 8;
    misaligned(validate_decode(&r), "q", region(0) + 8);
}

#[test]
fn decode_rejects_misaligned_kv_token_stride() {
    let mut r = bf16_req();
    r.kv_cache.strides = [P * 584, 577, 1];
    misaligned(validate_decode(&r), "kv_cache.strides[1] (token)", 577 * 2);
}

#[test]
fn decode_rejects_overlapping_kv_rows() {
    let mut r = bf16_req();
    r.kv_cache.strides = [P * D_QK, 568, 1];
    invalid_shape(validate_decode(&r), "kv_cache.strides[1] (token)");
    r.kv_cache.strides = [P * D_QK - 8, D_QK, 1];
    invalid_shape(validate_decode(&r), "kv_cache.strides[0] (page)");
}

#[test]
fn decode_rejects_null_pointer() {
    let mut r = bf16_req();
    r.seq_lens.ptr = 0;
    match validate_decode(&r) {
        Err(MlaError::NullPointer { field: "seq_lens" }) => {}
        other => panic!("expected NullPointer on seq_lens, got {other:?}"),
    }
}

#[test]
fn decode_rejects_out_aliasing_q() {
    let mut r = bf16_req();
    r.out.ptr = region(0) + 256;
    aliasing(validate_decode(&r), "out", "q");
}

#[test]
fn decode_rejects_lse_aliasing_out() {
    let mut r = bf16_req();
    r.lse.ptr = region(4) + 1024;
    aliasing(validate_decode(&r), "lse", "out");
}

#[test]
fn decode_rejects_out_overlapping_itself() {
    let mut r = bf16_req();
    r.out.strides = [S_Q * H * D_V, H * D_V, 256, 1];
    invalid_shape(validate_decode(&r), "out.strides");
}

#[test]
fn decode_rejects_lse_not_row_major() {
    let mut r = bf16_req();
    r.lse.strides = [S_Q * H * 2, H * 2, 1];
    invalid_shape(validate_decode(&r), "lse.strides[1] (token)");
}

#[test]
fn decode_rejects_span_overflow() {
    let mut r = bf16_req();
    r.q.strides[0] = 1 << 62;
    invalid_shape(validate_decode(&r), "q");
}

#[test]
fn decode_rejects_batch_mismatch_between_q_and_seq_lens() {
    let mut r = bf16_req();
    r.seq_lens.shape = [B - 1];
    let (expected, got) = invalid_shape(validate_decode(&r), "seq_lens.shape[0] (batch)");
    assert_eq!(expected, format!("{B} (as q.shape[0] (batch))"));
    assert_eq!(got, (B - 1).to_string());
}

#[test]
fn decode_rejects_non_finite_softmax_scale() {
    for bad in [f32::NAN, f32::INFINITY, 0.0, -1.0] {
        let mut r = bf16_req();
        r.scales.softmax_scale = bad;
        invalid_shape(validate_decode(&r), "scales.softmax_scale");
    }
}

#[test]
fn decode_rejects_q_scale_for_bf16_q() {
    let mut r = bf16_req();
    r.scales.q_scale = 0.5;
    let (expected, _) = invalid_shape(validate_decode(&r), "scales.q_scale");
    assert!(expected.starts_with('1'), "{expected}");
}

#[test]
fn decode_rejects_kv_scale_for_fp16_kv_and_bad_fp8_scales() {
    let mut r = decode_req(DecodeDtypes::Fp16);
    r.scales.kv_scale = 2.0;
    invalid_shape(validate_decode(&r), "scales.kv_scale");
    let mut r = decode_req(DecodeDtypes::Fp8);
    r.scales.q_scale = 0.0;
    invalid_shape(validate_decode(&r), "scales.q_scale");
    let mut r = decode_req(DecodeDtypes::Fp8);
    r.scales.output_scale = f32::NEG_INFINITY;
    invalid_shape(validate_decode(&r), "scales.output_scale");
}

#[test]
fn append_takes_any_positive_finite_kv_scale() {
    // The kernel divides by the scale (a subnormal one saturates nonzero values, keeps
    // zeros): every positive finite scale is valid, zero and the rest are not.
    let mut r = append_req(ElemType::Fp8E4m3, ElemType::Bf16);
    r.kv_scale = 1e-40;
    validate_append(&r).unwrap();
    r.kv_scale = 1e-30;
    validate_append(&r).unwrap();
    for bad in [0.0, -1.0, f32::INFINITY, f32::NAN] {
        r.kv_scale = bad;
        invalid_shape(validate_append(&r), "kv_scale");
    }
}

#[test]
fn decode_rejects_scale_products_the_kernels_cannot_hold() {
    // Each factor finite, the logits' factor not: refused, not a NaN output.
    let mut r = decode_req(DecodeDtypes::Fp8);
    (r.scales.q_scale, r.scales.kv_scale) = (1e20, 1e20);
    invalid_shape(
        validate_decode(&r),
        "scales.softmax_scale * q_scale * kv_scale * log2(e)",
    );
    // Underflow to zero is refused too.
    let mut r = decode_req(DecodeDtypes::Fp8);
    (r.scales.softmax_scale, r.scales.q_scale, r.scales.kv_scale) = (1e-20, 1e-20, 1e-20);
    invalid_shape(
        validate_decode(&r),
        "scales.softmax_scale * q_scale * kv_scale * log2(e)",
    );
    // bf16: softmax_scale * log2(e) past f32::MAX.
    let mut r = bf16_req();
    r.scales.softmax_scale = f32::MAX;
    invalid_shape(
        validate_decode(&r),
        "scales.softmax_scale * q_scale * kv_scale * log2(e)",
    );
    let mut r = decode_req(DecodeDtypes::Fp8);
    (r.scales.output_scale, r.scales.kv_scale) = (1e30, 1e30);
    r.scales.softmax_scale = 1e-35;
    invalid_shape(validate_decode(&r), "scales.output_scale * kv_scale");
    // Large but representable products pass.
    let mut r = decode_req(DecodeDtypes::Fp8);
    (r.scales.q_scale, r.scales.kv_scale, r.scales.output_scale) = (1e10, 1e10, 1e10);
    validate_decode(&r).unwrap();
}

// ---- append and gather -------------------------------------------------------------------

#[test]
fn append_accepts_supported_types() {
    for (cache, new) in [
        (ElemType::Bf16, ElemType::Bf16),
        (ElemType::Fp16, ElemType::Fp16),
        (ElemType::Fp8E4m3, ElemType::Bf16),
    ] {
        let shape = validate_append(&append_req(cache, new)).unwrap();
        assert_eq!(
            shape,
            PagedShape {
                batch: B,
                rows: S_Q,
                page_size: P,
                num_pages: PAGES,
                max_pages: MAX_PAGES,
                cache,
                other: new,
            }
        );
    }
}

#[test]
fn append_rejects_wrong_new_kv_dtype() {
    for (cache, new) in [
        (ElemType::Fp8E4m3, ElemType::Fp8E4m3),
        (ElemType::Bf16, ElemType::Fp16),
    ] {
        dtype_mismatch(validate_append(&append_req(cache, new)), "new_kv");
    }
    let r = append_req(ElemType::F32, ElemType::F32);
    assert!(matches!(
        validate_append(&r),
        Err(MlaError::Unsupported { .. })
    ));
}

#[test]
fn append_rejects_bad_rows_scale_and_aliasing() {
    let mut r = append_req(ElemType::Bf16, ElemType::Bf16);
    r.new_kv.shape[1] = 0;
    invalid_shape(validate_append(&r), "new_kv.shape[1] (s_q)");
    // A prefill chunk: any count the page table holds (64 tokens here), none past it.
    for (n, fits) in [(9, true), (64, true), (65, false)] {
        let mut r = append_req(ElemType::Bf16, ElemType::Bf16);
        r.new_kv = TensorView::contiguous(region(0), ElemType::Bf16, [B, n, D_QK]);
        r.host = HostMirror::default();
        let got = validate_append(&r);
        if fits {
            assert_eq!(got.map(|s| s.rows).ok(), Some(n), "{n} rows");
        } else {
            invalid_shape(got, "page_table.shape[1] (max_pages)");
        }
    }

    let mut r = append_req(ElemType::Bf16, ElemType::Bf16);
    r.kv_scale = 0.5;
    invalid_shape(validate_append(&r), "kv_scale");

    let mut r = append_req(ElemType::Bf16, ElemType::Bf16);
    r.new_kv.ptr = region(1) + (PAGES * P * D_QK * 2 - 16) as u64;
    aliasing(validate_append(&r), "kv_cache", "new_kv");

    let lens = [1, 17, 64];
    let mut r = append_req(ElemType::Bf16, ElemType::Bf16);
    r.host.seq_lens = Some(&lens);
    let (expected, got) = out_of_range(validate_append(&r), "seq_lens", 0);
    assert!(expected.contains("<= 0 is padding"), "{expected}");
    assert_eq!(got, 1);
}

#[test]
fn append_into_the_two_parts_of_one_fused_cache() {
    // The latent and rope views of one [PAGES, P, 576] cache interleave row by row: their
    // spans overlap, their bytes do not (the decode takes the same pair).
    for cache in [ElemType::Bf16, ElemType::Fp8E4m3] {
        let new = if cache == ElemType::Fp8E4m3 {
            ElemType::Bf16
        } else {
            cache
        };
        let base = append_req(cache, new);
        let strides = base.kv_cache.strides;
        let mut r = base;
        r.kv_cache = TensorView::strided(region(1), cache, [PAGES, P, D_V], strides);
        let rope_at = |bytes: u64| {
            TensorView::strided(region(1) + bytes, cache, [PAGES, P, D_QK - D_V], strides)
        };
        let d_v = (D_V * cache.size()) as u64;
        validate_append_split(&r, Some(&rope_at(d_v))).unwrap();
        // Rope one 16-byte chunk into the latent part, or the views swapped over a row
        // boundary: shared bytes.
        aliasing(
            validate_append_split(&r, Some(&rope_at(d_v - 16))),
            "kpe_cache",
            "kv_cache",
        );
        let row = (D_QK * cache.size()) as u64;
        aliasing(
            validate_append_split(&r, Some(&rope_at(row - 32))),
            "kpe_cache",
            "kv_cache",
        );
    }
}

#[test]
fn append_and_gather_take_padding() {
    // <= 0 writes (or copies) nothing, as in a decode, with or without host copies.
    for lens in [[0, 17, 64], [-5, 17, i32::MIN]] {
        let mut r = append_req(ElemType::Bf16, ElemType::Bf16);
        r.host.seq_lens = Some(&lens);
        validate_append(&r).unwrap();
        assert_eq!(append_by_spec(&r), Ok(()), "{lens:?}");
        let mut r = gather_req(ElemType::Bf16, ElemType::Bf16);
        r.host.seq_lens = Some(&lens);
        validate_gather(&r).unwrap();
        assert_eq!(gather_by_spec(&r), Ok(()), "{lens:?}");
    }
}

#[test]
fn append_rejects_two_rows_on_one_slot() {
    // Sequence 1 writes positions 15, 16 (page 3 slot 15, page 4 slot 0); pointing
    // sequence 2's last page (positions 62, 63: slots 14, 15) at page 3 collides.
    let mut table = TABLE;
    table[2 * MAX_PAGES + 3] = 3;
    let mut r = append_req(ElemType::Bf16, ElemType::Bf16);
    r.host.page_table = Some(&table);
    let (expected, got) = out_of_range(validate_append(&r), "page_table", 2 * MAX_PAGES + 3);
    assert!(expected.contains("sequence 1"), "{expected}");
    assert_eq!(got, 3);
}

#[test]
fn gather_accepts_supported_types() {
    for (cache, out) in [
        (ElemType::Bf16, ElemType::Bf16),
        (ElemType::Fp16, ElemType::Fp16),
        (ElemType::Fp8E4m3, ElemType::Fp8E4m3),
        (ElemType::Fp8E4m3, ElemType::Bf16),
    ] {
        let shape = validate_gather(&gather_req(cache, out)).unwrap();
        assert_eq!(
            (shape.rows, shape.cache, shape.other),
            (MAX_LEN, cache, out)
        );
    }
    // Empty sequences are fine for a gather.
    let lens = [0, 0, 64];
    let mut r = gather_req(ElemType::Bf16, ElemType::Bf16);
    r.host.seq_lens = Some(&lens);
    validate_gather(&r).unwrap();
}

#[test]
fn gather_rejects_bad_out() {
    let r = gather_req(ElemType::Bf16, ElemType::Fp16);
    dtype_mismatch(validate_gather(&r), "out");

    let mut r = gather_req(ElemType::Bf16, ElemType::Bf16);
    r.out.strides = [MAX_LEN * 600, 600, 1];
    let (expected, _) = invalid_shape(validate_gather(&r), "out.strides[1] (row)");
    assert!(expected.contains("576"), "{expected}");

    let mut r = gather_req(ElemType::Bf16, ElemType::Bf16);
    r.out.strides[0] = (MAX_LEN - 1) * D_QK;
    invalid_shape(validate_gather(&r), "out.strides");

    let mut r = gather_req(ElemType::Bf16, ElemType::Bf16);
    r.out.ptr = region(3);
    aliasing(validate_gather(&r), "out", "seq_lens");
}

#[test]
fn gather_rejects_length_over_out_rows() {
    let mut r = gather_req(ElemType::Bf16, ElemType::Bf16);
    r.out.shape[1] = 32;
    r.out.strides[0] = 32 * D_QK;
    let (expected, got) = out_of_range(validate_gather(&r), "seq_lens", 2);
    assert!(expected.contains("<= 32"), "{expected}");
    assert_eq!(got, 64);
}

// ---- the spec, restated independently ---------------------------------------------------

const U32: u128 = u32::MAX as u128;

macro_rules! rule {
    ($ok:expr, $($why:tt)+) => {
        if !$ok {
            return Err(format!($($why)+));
        }
    };
}

/// `[start, end)` in bytes of a view, if every extent is positive and it fits `u64`.
fn spec_span(
    ptr: u64,
    dtype: ElemType,
    shape: &[usize],
    strides: &[usize],
) -> Option<(u128, u128)> {
    let mut last: u128 = 0;
    for (&n, &s) in shape.iter().zip(strides) {
        if n == 0 {
            return None;
        }
        last = last.checked_add((n as u128 - 1).checked_mul(s as u128)?)?;
    }
    let end = (last + 1).checked_mul(dtype.size() as u128)? + ptr as u128;
    (end <= u64::MAX as u128).then_some((ptr as u128, end))
}

fn disjoint(a: (u128, u128), b: (u128, u128)) -> bool {
    a.1 <= b.0 || b.1 <= a.0
}

/// Base and every stepped-over stride (dims of extent > 1 but the last) 16-byte aligned.
fn aligned16(ptr: u64, dtype: ElemType, shape: &[usize], strides: &[usize]) -> bool {
    let outer = shape.len() - 1;
    ptr.is_multiple_of(16)
        && (0..outer).all(|i| {
            shape[i] <= 1 || (strides[i] as u128 * dtype.size() as u128).is_multiple_of(16)
        })
}

/// Some order of the outer dims (extent > 1) nests: each stride clears all the elements
/// of the dims placed inside it, starting from a contiguous row of `row` elements.
fn nests(shape: &[usize], strides: &[usize], row: usize) -> bool {
    let dims: Vec<(u128, u128)> = (0..shape.len() - 1)
        .filter(|&i| shape[i] > 1)
        .map(|i| (shape[i] as u128, strides[i] as u128))
        .collect();
    fn place(left: &[(u128, u128)], inner: u128) -> bool {
        if left.is_empty() {
            return true;
        }
        (0..left.len()).any(|k| {
            let (n, s) = left[k];
            let mut rest = left.to_vec();
            rest.remove(k);
            s >= inner && place(&rest, inner + (n - 1) * s)
        })
    }
    place(&dims, row as u128)
}

fn scale_ok(v: f32) -> bool {
    v.is_finite() && v > 0.0
}

/// The cache, page-table and length rules every request shares.
fn paged_by_spec(
    kv: &TensorView<3>,
    pt: &TensorView<2>,
    sl: &TensorView<1>,
    batch: usize,
) -> Result<(), String> {
    let [np, p, dk] = kv.shape;
    rule!(np >= 1 && np as u128 <= U32, "num_pages {np}");
    rule!(p.is_power_of_two() && p <= 256, "page size {p}");
    rule!(dk == 576, "kv row {dk}");
    rule!(kv.strides[2] == 1, "kv last stride");
    let token = if p > 1 { kv.strides[1] } else { 576 };
    rule!(token >= 576, "kv token stride {token}");
    rule!(
        np == 1 || kv.strides[0] as u128 >= p as u128 * token as u128,
        "kv page stride"
    );
    rule!(pt.shape[0] == batch, "page table batch");
    rule!(pt.shape[1] >= 1 && pt.shape[1] as u128 <= U32, "max_pages");
    rule!(
        pt.shape[1] == 1 || pt.strides[1] == 1,
        "page table last stride"
    );
    rule!(
        batch == 1 || pt.strides[0] as u128 <= U32,
        "page table row stride"
    );
    rule!(sl.shape[0] == batch, "seq_lens batch");
    rule!(batch == 1 || sl.strides[0] == 1, "seq_lens stride");
    rule!(
        pt.dtype == ElemType::I32 && sl.dtype == ElemType::I32,
        "index dtypes"
    );
    rule!(
        kv.ptr != 0 && pt.ptr != 0 && sl.ptr != 0,
        "null index/cache pointer"
    );
    rule!(
        aligned16(kv.ptr, kv.dtype, &kv.shape, &kv.strides),
        "kv alignment"
    );
    rule!(
        pt.ptr.is_multiple_of(4) && sl.ptr.is_multiple_of(4),
        "index alignment"
    );
    Ok(())
}

fn host_by_spec(
    host: &HostMirror,
    batch: usize,
    kv: &TensorView<3>,
    pt: &TensorView<2>,
    lens: (i64, i64),
) -> Result<(), String> {
    let (np, p, mp, rs) = (kv.shape[0], kv.shape[1], pt.shape[1], pt.strides[0]);
    if let Some(l) = host.seq_lens {
        rule!(l.len() == batch, "host lens length");
        // Lengths <= 0 are padding everywhere.
        for &x in l {
            rule!(
                x <= 0 || (lens.0 <= x as i64 && x as i64 <= lens.1),
                "length {x} outside {lens:?}"
            );
        }
    }
    if let Some(t) = host.page_table {
        rule!(
            t.len() as u128 >= (batch as u128 - 1) * rs as u128 + mp as u128,
            "host table length"
        );
        for b in 0..batch {
            let used = match host.seq_lens {
                Some(l) => (l[b].max(0) as usize).div_ceil(p),
                None => mp,
            };
            for j in 0..used {
                let id = t[b * rs + j];
                rule!(id >= 0 && (id as usize) < np, "page id {id} at {b},{j}");
            }
        }
    }
    Ok(())
}

fn decode_by_spec(r: &DecodeRequest) -> Result<(), String> {
    let (q, kv, pt, sl, out, lse) = (
        &r.q,
        &r.kv_cache,
        &r.page_table,
        &r.seq_lens,
        &r.out,
        &r.lse,
    );
    let [b, s_q, h, dq] = q.shape;
    rule!(b >= 1 && b as u128 <= U32, "batch {b}");
    rule!((1..=8).contains(&s_q), "s_q {s_q}");
    rule!((1..=128).contains(&h), "heads {h}");
    rule!(dq == 576 && q.strides[3] == 1, "q row");
    paged_by_spec(kv, pt, sl, b)?;
    let cap = pt.shape[1] as u128 * kv.shape[1] as u128;
    rule!(cap >= s_q as u128, "pages for s_q");
    rule!(
        out.shape == [b, s_q, h, 512] && out.strides[3] == 1,
        "out shape"
    );
    rule!(lse.shape == [b, s_q, h], "lse shape");
    rule!(h == 1 || lse.strides[2] == 1, "lse stride 2");
    rule!(s_q == 1 || lse.strides[1] == h, "lse stride 1");
    rule!(b == 1 || lse.strides[0] == s_q * h, "lse stride 0");

    use ElemType::*;
    let want_out = match (q.dtype, kv.dtype) {
        (Bf16, Bf16) | (Bf16, Fp8E4m3) | (Fp8E4m3, Fp8E4m3) => Bf16,
        (Fp16, Fp16) => Fp16,
        pair => return Err(format!("dtype pair {pair:?}")),
    };
    rule!(out.dtype == want_out && lse.dtype == F32, "out/lse dtype");

    rule!(q.ptr != 0 && out.ptr != 0 && lse.ptr != 0, "null pointer");
    rule!(
        aligned16(q.ptr, q.dtype, &q.shape, &q.strides),
        "q alignment"
    );
    rule!(
        aligned16(out.ptr, out.dtype, &out.shape, &out.strides),
        "out alignment"
    );
    rule!(lse.ptr.is_multiple_of(4), "lse alignment");
    let spans = [
        spec_span(q.ptr, q.dtype, &q.shape, &q.strides),
        spec_span(kv.ptr, kv.dtype, &kv.shape, &kv.strides),
        spec_span(pt.ptr, pt.dtype, &pt.shape, &pt.strides),
        spec_span(sl.ptr, sl.dtype, &sl.shape, &sl.strides),
        spec_span(out.ptr, out.dtype, &out.shape, &out.strides),
        spec_span(lse.ptr, lse.dtype, &lse.shape, &lse.strides),
    ];
    rule!(spans.iter().all(Option::is_some), "span overflow");
    let s: Vec<(u128, u128)> = spans.iter().flatten().copied().collect();
    rule!(nests(&out.shape, &out.strides, 512), "out overlaps itself");
    for o in [4, 5] {
        for other in 0..6 {
            rule!(o == other || disjoint(s[o], s[other]), "alias {o} {other}");
        }
    }

    let sc = &r.scales;
    rule!(
        scale_ok(sc.softmax_scale) && sc.output_scale.is_finite(),
        "scales"
    );
    rule!(scale_ok(sc.q_scale) && scale_ok(sc.kv_scale), "fp8 scales");
    rule!(
        q.dtype == Fp8E4m3 || sc.q_scale == 1.0,
        "q_scale for 16-bit q"
    );
    rule!(
        kv.dtype == Fp8E4m3 || sc.kv_scale == 1.0,
        "kv_scale for 16-bit kv"
    );
    rule!(
        scale_ok(sc.softmax_scale * sc.q_scale * sc.kv_scale * std::f32::consts::LOG2_E),
        "the kernels' logit scale"
    );
    rule!(
        (sc.output_scale * sc.kv_scale).is_finite(),
        "the kernels' output factor"
    );

    let hi = cap.min(i32::MAX as u128) as i64;
    // Padding (<= 0) and short lengths are valid.
    host_by_spec(&r.host, b, kv, pt, (i64::MIN, hi))
}

fn append_by_spec(r: &AppendRequest) -> Result<(), String> {
    let (n, kv, pt, sl) = (&r.new_kv, &r.kv_cache, &r.page_table, &r.seq_lens);
    let [b, s_q, d] = n.shape;
    rule!(b >= 1 && b as u128 <= U32, "batch");
    rule!(s_q >= 1 && s_q as u128 <= U32, "s_q");
    rule!(d == 576 && n.strides[2] == 1, "new row");
    paged_by_spec(kv, pt, sl, b)?;
    let cap = pt.shape[1] as u128 * kv.shape[1] as u128;
    rule!(cap >= s_q as u128, "pages for s_q");
    let want = match kv.dtype {
        ElemType::Bf16 | ElemType::Fp8E4m3 => ElemType::Bf16,
        ElemType::Fp16 => ElemType::Fp16,
        ElemType::F32 | ElemType::I32 => return Err("f32 cache".into()),
    };
    rule!(n.dtype == want, "new_kv dtype");
    rule!(
        n.ptr != 0 && aligned16(n.ptr, n.dtype, &n.shape, &n.strides),
        "new_kv pointer"
    );
    let spans = [
        spec_span(kv.ptr, kv.dtype, &kv.shape, &kv.strides),
        spec_span(n.ptr, n.dtype, &n.shape, &n.strides),
        spec_span(pt.ptr, pt.dtype, &pt.shape, &pt.strides),
        spec_span(sl.ptr, sl.dtype, &sl.shape, &sl.strides),
    ];
    rule!(spans.iter().all(Option::is_some), "span overflow");
    let s: Vec<(u128, u128)> = spans.iter().flatten().copied().collect();
    rule!((1..4).all(|i| disjoint(s[0], s[i])), "cache aliasing");
    rule!(scale_ok(r.kv_scale), "kv_scale");
    rule!(
        kv.dtype == ElemType::Fp8E4m3 || r.kv_scale == 1.0,
        "kv_scale 16-bit"
    );
    let hi = cap.min(i32::MAX as u128) as i64;
    host_by_spec(&r.host, b, kv, pt, (s_q as i64, hi))?;

    // New rows land on distinct (page, slot) pairs.
    if let (Some(l), Some(t)) = (r.host.seq_lens, r.host.page_table) {
        let p = kv.shape[1];
        let mut slots = Vec::new();
        for (bi, &len) in l.iter().enumerate().filter(|(_, l)| **l > 0) {
            for pos in len as usize - s_q..len as usize {
                slots.push((t[bi * pt.strides[0] + pos / p], pos % p));
            }
        }
        for i in 0..slots.len() {
            rule!(!slots[..i].contains(&slots[i]), "slot written twice");
        }
    }
    Ok(())
}

fn gather_by_spec(r: &GatherRequest) -> Result<(), String> {
    let (o, kv, pt, sl) = (&r.out, &r.kv_cache, &r.page_table, &r.seq_lens);
    let [b, rows, d] = o.shape;
    rule!(b >= 1 && b as u128 <= U32, "batch");
    rule!(rows >= 1 && rows as u128 <= U32, "rows");
    rule!(d == 576 && o.strides[2] == 1, "out row");
    rule!(rows == 1 || o.strides[1] == 576, "out row stride");
    paged_by_spec(kv, pt, sl, b)?;
    let ok_types: &[ElemType] = match kv.dtype {
        ElemType::Bf16 => &[ElemType::Bf16],
        ElemType::Fp16 => &[ElemType::Fp16],
        ElemType::Fp8E4m3 => &[ElemType::Fp8E4m3, ElemType::Bf16],
        ElemType::F32 | ElemType::I32 => &[],
    };
    rule!(ok_types.contains(&o.dtype), "out dtype");
    rule!(
        o.ptr != 0 && aligned16(o.ptr, o.dtype, &o.shape, &o.strides),
        "out pointer"
    );
    let spans = [
        spec_span(o.ptr, o.dtype, &o.shape, &o.strides),
        spec_span(kv.ptr, kv.dtype, &kv.shape, &kv.strides),
        spec_span(pt.ptr, pt.dtype, &pt.shape, &pt.strides),
        spec_span(sl.ptr, sl.dtype, &sl.shape, &sl.strides),
    ];
    rule!(spans.iter().all(Option::is_some), "span overflow");
    let s: Vec<(u128, u128)> = spans.iter().flatten().copied().collect();
    rule!(nests(&o.shape, &o.strides, 576), "out overlaps itself");
    rule!((1..4).all(|i| disjoint(s[0], s[i])), "out aliasing");
    rule!(scale_ok(r.kv_scale), "kv_scale");
    rule!(
        kv.dtype == ElemType::Fp8E4m3 || r.kv_scale == 1.0,
        "kv_scale 16-bit"
    );
    let cap = pt.shape[1] as u128 * kv.shape[1] as u128;
    let hi = cap.min(rows as u128).min(i32::MAX as u128) as i64;
    host_by_spec(&r.host, b, kv, pt, (0, hi))
}

// ---- random requests -------------------------------------------------------------------

/// A request's tensors with owned host mirrors.
#[derive(Clone, Debug)]
struct Case {
    /// q (decode) or new_kv (append) or out (gather), as rank 4 (`[b, s, h, d]`; the
    /// rank-3 ones use `h = 1` and drop that dim when built).
    main: TensorView<4>,
    kv: TensorView<3>,
    pt: TensorView<2>,
    sl: TensorView<1>,
    out: TensorView<4>,
    lse: TensorView<3>,
    scales: Scales,
    kv_scale: f32,
    lens: Option<Vec<i32>>,
    table: Option<Vec<i32>>,
}

fn pick<T: Copy>(rng: &mut SplitMix64, xs: &[T]) -> T {
    xs[rng.range(0, xs.len() - 1)]
}

/// Row-major strides for `shape`, each outer one padded by a 16-byte multiple sometimes.
fn padded<const R: usize>(rng: &mut SplitMix64, dtype: ElemType, shape: [usize; R]) -> [usize; R] {
    let unit = 16 / dtype.size();
    let mut strides = [1; R];
    for i in (0..R - 1).rev() {
        let pad = if rng.range(0, 2) == 0 {
            rng.range(1, 3) * unit
        } else {
            0
        };
        strides[i] = strides[i + 1] * shape[i + 1] + pad;
    }
    strides
}

/// A fake device address in region `i`, 16-byte aligned.
fn addr(rng: &mut SplitMix64, i: u64) -> u64 {
    region(i) + rng.range(0, 4095) as u64 * 16
}

/// A valid case; `kind` 0 = decode, 1 = append, 2 = gather.
fn valid_case(rng: &mut SplitMix64, kind: usize) -> Case {
    let b = rng.range(1, 4);
    let s_q = if kind == 2 { 1 } else { rng.range(1, 8) };
    let h = if kind == 0 {
        let any = rng.range(1, 128);
        pick(rng, &[1, 2, 16, 128, any])
    } else {
        1
    };
    // Small pages and the fewest pages that hold s_q often: the capacity limits are near.
    let any_p = rng.range(0, 8);
    let p = 1 << pick(rng, &[0, 1, 2, any_p, any_p]);
    let np = rng.range(1, 12);
    let fewest = s_q.div_ceil(p);
    let any_mp = rng.range(fewest, fewest.max(6));
    let mp = pick(rng, &[fewest, any_mp, any_mp]);
    let cap = mp * p;
    let (q_t, kv_t, out_t) = match kind {
        0 => {
            let d = pick(rng, &DecodeDtypes::ALL);
            (d.q(), d.kv(), d.out())
        }
        1 => match rng.range(0, 2) {
            0 => (ElemType::Bf16, ElemType::Bf16, ElemType::Bf16),
            1 => (ElemType::Fp16, ElemType::Fp16, ElemType::Fp16),
            _ => (ElemType::Bf16, ElemType::Fp8E4m3, ElemType::Bf16),
        },
        _ => match rng.range(0, 3) {
            0 => (ElemType::Bf16, ElemType::Bf16, ElemType::Bf16),
            1 => (ElemType::Fp16, ElemType::Fp16, ElemType::Fp16),
            2 => (ElemType::Fp8E4m3, ElemType::Fp8E4m3, ElemType::Fp8E4m3),
            _ => (ElemType::Bf16, ElemType::Fp8E4m3, ElemType::Fp8E4m3),
        },
    };
    // Gather: `main` is the output [b, rows, 1, 576] with contiguous rows.
    let (main_t, main_shape) = match kind {
        2 => {
            let rows = rng.range(1, cap + 2);
            (out_t, [b, rows, 1, D_QK])
        }
        _ => (q_t, [b, s_q, h, D_QK]),
    };
    let mut main_strides = padded(rng, main_t, main_shape);
    if kind == 2 {
        main_strides = [main_strides[0], D_QK, D_QK, 1];
        main_strides[0] = main_strides[0].max(main_shape[1] * D_QK);
    }
    let kv_shape = [np, p, D_QK];
    // Page-table rows padded, or overlapping (shared entries are fine for an input).
    let (pad, overlap) = (mp + rng.range(1, 3), rng.range(0, mp - 1));
    let row_stride = pick(rng, &[mp, mp, pad, overlap]);
    let lens: Vec<i32> = (0..b)
        .map(|_| {
            let lo = if kind == 2 { 0 } else { s_q };
            let hi = if kind == 2 {
                cap.min(main_shape[1])
            } else {
                cap
            };
            let any = rng.range(lo, hi);
            pick(rng, &[lo, hi, any]) as i32
        })
        .collect();
    let table_len = (b - 1) * row_stride + mp + rng.range(0, 2);
    let mut table: Vec<i32> = (0..table_len)
        .map(|_| match rng.range(0, 3) {
            0 => rng.next_u64() as i32,
            _ => rng.range(0, np - 1) as i32,
        })
        .collect();
    for (bi, &l) in lens.iter().enumerate() {
        for j in 0..(l as usize).div_ceil(p) {
            table[bi * row_stride + j] = rng.range(0, np - 1) as i32;
        }
    }
    if kind == 1 {
        // Distinct pages for the new rows: sequence b writes into page ids b*mp.. when
        // there are enough pages, else drop the table mirror.
        if np >= b * mp {
            for (bi, _) in lens.iter().enumerate() {
                for j in 0..mp {
                    table[bi * row_stride + j] = (bi * mp + j) as i32;
                }
            }
        } else {
            table.clear();
        }
    }
    let scale = |rng: &mut SplitMix64, t: ElemType| {
        if t == ElemType::Fp8E4m3 {
            rng.uniform(0.01, 4.0) as f32
        } else {
            1.0
        }
    };
    let scales = Scales {
        softmax_scale: rng.uniform(0.01, 1.0) as f32,
        output_scale: rng.uniform(-2.0, 2.0) as f32,
        q_scale: scale(rng, q_t),
        kv_scale: scale(rng, kv_t),
    };
    let kv_scale = scale(rng, kv_t);
    let out_shape = [b, s_q, h, D_V];
    Case {
        main: TensorView::strided(addr(rng, 0), main_t, main_shape, main_strides),
        kv: TensorView::strided(addr(rng, 1), kv_t, kv_shape, {
            let mut s = padded(rng, kv_t, kv_shape);
            s[0] = s[0].max(p * s[1]);
            s
        }),
        pt: TensorView::strided(addr(rng, 2), ElemType::I32, [b, mp], [row_stride, 1]),
        sl: TensorView::contiguous(addr(rng, 3), ElemType::I32, [b]),
        out: TensorView::strided(
            addr(rng, 4),
            out_t,
            out_shape,
            padded(rng, out_t, out_shape),
        ),
        lse: TensorView::contiguous(addr(rng, 5), ElemType::F32, [b, s_q, h]),
        scales,
        kv_scale,
        lens: (rng.range(0, 3) > 0).then_some(lens),
        table: (rng.range(0, 3) > 0 && !table.is_empty()).then_some(table),
    }
}

/// Extents and strides at or next to a limit somewhere in the rules.
#[rustfmt::skip]
const SPECIAL: [usize; 22] = [
    0, 1, 2, 3, 7, 8, 9, 16, 127, 128, 129, 255, 256, 257, 512, 575, 576, 577,
    u32::MAX as usize, u32::MAX as usize + 1, 1 << 40, usize::MAX,
];

/// Changes one thing of a case, often into something invalid, sometimes harmlessly.
fn mutate(rng: &mut SplitMix64, c: &mut Case) {
    // Every tensor's byte span, to place pointers right at or just across the edges.
    let spans = [
        c.main.byte_span(),
        c.kv.byte_span(),
        c.pt.byte_span(),
        c.sl.byte_span(),
        c.out.byte_span(),
        c.lse.byte_span(),
    ]
    .map(|s| s.unwrap_or((1 << 40, 1 << 40)));
    let t = rng.range(0, 5);
    let len = spans[t].1 - spans[t].0;
    let (shape, strides, ptr, dtype): (&mut [usize], &mut [usize], &mut u64, &mut ElemType) =
        match t {
            0 => (
                &mut c.main.shape,
                &mut c.main.strides,
                &mut c.main.ptr,
                &mut c.main.dtype,
            ),
            1 => (
                &mut c.kv.shape,
                &mut c.kv.strides,
                &mut c.kv.ptr,
                &mut c.kv.dtype,
            ),
            2 => (
                &mut c.pt.shape,
                &mut c.pt.strides,
                &mut c.pt.ptr,
                &mut c.pt.dtype,
            ),
            3 => (
                &mut c.sl.shape,
                &mut c.sl.strides,
                &mut c.sl.ptr,
                &mut c.sl.dtype,
            ),
            4 => (
                &mut c.out.shape,
                &mut c.out.strides,
                &mut c.out.ptr,
                &mut c.out.dtype,
            ),
            _ => (
                &mut c.lse.shape,
                &mut c.lse.strides,
                &mut c.lse.ptr,
                &mut c.lse.dtype,
            ),
        };
    let i = rng.range(0, shape.len() - 1);
    match rng.range(0, 9) {
        0 => {
            let (now, special) = (shape[i], pick(rng, &SPECIAL));
            let choices = [
                special,
                now.saturating_add(1),
                now.saturating_sub(1),
                now.saturating_mul(2),
            ];
            shape[i] = pick(rng, &choices);
        }
        1 => {
            let now = strides[i];
            let unit = 16 / dtype.size();
            let choices = [
                pick(rng, &SPECIAL),
                now.saturating_add(1),
                now.saturating_sub(1),
                now.saturating_add(unit),
                now.saturating_sub(unit),
                now.saturating_mul(2),
                rng.range(0, 4096),
                1 << 62,
            ];
            strides[i] = pick(rng, &choices);
        }
        2 => {
            *dtype = pick(
                rng,
                &[
                    ElemType::Bf16,
                    ElemType::Fp16,
                    ElemType::Fp8E4m3,
                    ElemType::F32,
                ],
            )
        }
        3 => {
            let (start, end) = pick(rng, &spans);
            let below = start.wrapping_sub(len);
            let choices = [
                end,
                end.checked_next_multiple_of(16).unwrap_or(0),
                end.wrapping_sub(1) & !15,
                below,
                below & !15,
                below.wrapping_add(15) & !15,
                0,
                ptr.wrapping_add(2),
                ptr.wrapping_add(4),
                ptr.wrapping_add(8),
                ptr.wrapping_add(16),
                start.wrapping_add(rng.range(0, 64) as u64 * 16),
                start.saturating_sub(rng.range(1, 64) as u64 * 16),
                u64::MAX - 15,
                u64::MAX - (1 << 24) + 1,
                1 << 63,
            ];
            *ptr = pick(rng, &choices);
        }
        4 => {
            let v = pick(
                rng,
                &[
                    f32::NAN,
                    f32::INFINITY,
                    f32::NEG_INFINITY,
                    0.0,
                    -0.0,
                    -1.0,
                    0.5,
                    1.0,
                    2.0,
                    1e-40,
                    1e-30,
                    1e30,
                    3e38,
                ],
            );
            match rng.range(0, 4) {
                0 => c.scales.softmax_scale = v,
                1 => c.scales.output_scale = v,
                2 => c.scales.q_scale = v,
                3 => c.scales.kv_scale = v,
                _ => c.kv_scale = v,
            }
        }
        5 | 6 => {
            let s_q = c.main.shape[1].min(1 << 30) as i32;
            let cap = c.pt.shape[1].saturating_mul(c.kv.shape[1]).min(1 << 30) as i32;
            match (&mut c.lens, rng.range(0, 4)) {
                (l, 0) => *l = None,
                (Some(l), 1) => {
                    l.pop();
                }
                (Some(l), _) if !l.is_empty() => {
                    let j = rng.range(0, l.len() - 1);
                    let choices = [s_q - 1, s_q, cap, cap + 1, 0, -1, i32::MAX, i32::MIN];
                    l[j] = pick(rng, &choices);
                }
                _ => {}
            }
        }
        _ => {
            let np = c.kv.shape[0].min(1 << 30) as i32;
            match (&mut c.table, rng.range(0, 4)) {
                (t, 0) => *t = None,
                (Some(t), 1) => {
                    t.pop();
                }
                (Some(t), _) if !t.is_empty() => {
                    let j = rng.range(0, t.len() - 1);
                    t[j] = pick(rng, &[-1, np, np - 1, 0, i32::MIN, i32::MAX]);
                }
                _ => {}
            }
        }
    }
}

impl Case {
    fn host(&self) -> HostMirror<'_> {
        HostMirror {
            seq_lens: self.lens.as_deref(),
            page_table: self.table.as_deref(),
        }
    }

    fn decode(&self) -> DecodeRequest<'_> {
        DecodeRequest {
            q: self.main,
            kv_cache: self.kv,
            page_table: self.pt,
            seq_lens: self.sl,
            out: self.out,
            lse: self.lse,
            scales: self.scales,
            host: self.host(),
        }
    }

    /// Drops dim 2 of `main` (rank 4 with `h = 1` for append and gather).
    fn main3(&self) -> TensorView<3> {
        let m = &self.main;
        TensorView::strided(
            m.ptr,
            m.dtype,
            [m.shape[0], m.shape[1], m.shape[3]],
            [m.strides[0], m.strides[1], m.strides[3]],
        )
    }

    fn append(&self) -> AppendRequest<'_> {
        AppendRequest {
            new_kv: self.main3(),
            kv_cache: self.kv,
            page_table: self.pt,
            seq_lens: self.sl,
            kv_scale: self.kv_scale,
            host: self.host(),
        }
    }

    fn gather(&self) -> GatherRequest<'_> {
        GatherRequest {
            kv_cache: self.kv,
            page_table: self.pt,
            seq_lens: self.sl,
            out: self.main3(),
            kv_scale: self.kv_scale,
            host: self.host(),
        }
    }
}

/// Runs `iterations` random cases of `kind` through `validate` and `spec`; they must
/// agree, the validator must not panic, and both outcomes must occur often.
fn fuzz<T: Debug>(
    kind: usize,
    iterations: usize,
    validate: impl Fn(&Case) -> Result<T, MlaError>,
    spec: impl Fn(&Case) -> Result<(), String>,
) {
    // MLA_TEST_SEED (decimal or 0x-hex) replays a printed seed.
    let seed = std::env::var("MLA_TEST_SEED")
        .ok()
        .and_then(|s| match s.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => s.parse().ok(),
        })
        .unwrap_or_else(SplitMix64::fresh_seed);
    eprintln!("validate fuzz kind {kind}: seed {seed:#x} (set MLA_TEST_SEED to replay)");
    let mut rng = SplitMix64::new(seed);
    let mut accepted = 0;
    for it in 0..iterations {
        let mut case = valid_case(&mut rng, kind);
        for _ in 0..rng.range(0, 3) {
            mutate(&mut rng, &mut case);
        }
        let got = catch_unwind(AssertUnwindSafe(|| validate(&case)))
            .unwrap_or_else(|_| panic!("seed {seed:#x} case {it}: validator panicked on {case:?}"));
        let want = spec(&case);
        match (&got, &want) {
            (Ok(_), Ok(())) => accepted += 1,
            (Err(_), Err(_)) => {}
            (Ok(_), Err(why)) => {
                panic!("seed {seed:#x} case {it}: accepted, but the spec says {why}: {case:?}")
            }
            (Err(e), Ok(())) => {
                panic!("seed {seed:#x} case {it}: rejected ({e}), but the spec accepts: {case:?}")
            }
        }
    }
    eprintln!("  {accepted} of {iterations} accepted");
    assert!(
        accepted * 10 > iterations,
        "too few valid cases: {accepted}"
    );
    assert!(
        accepted * 10 < iterations * 9,
        "too few invalid cases: {accepted}"
    );
}

#[test]
fn fuzz_decode_agrees_with_spec() {
    fuzz(
        0,
        20_000,
        |c| validate_decode(&c.decode()),
        |c| decode_by_spec(&c.decode()),
    );
}

#[test]
fn fuzz_append_agrees_with_spec() {
    fuzz(
        1,
        6_000,
        |c| validate_append(&c.append()),
        |c| append_by_spec(&c.append()),
    );
}

#[test]
fn fuzz_gather_agrees_with_spec() {
    fuzz(
        2,
        6_000,
        |c| validate_gather(&c.gather()),
        |c| gather_by_spec(&c.gather()),
    );
}

// ---- the lengths a step is scheduled from ----------------------------------------------

#[test]
fn step_lengths_follow_the_seq_lens_rules() {
    let ok = TensorView::contiguous(region(3), ElemType::I32, [5]);
    assert_eq!(validate_seq_lens(&ok).unwrap(), 5);
    let mut r = ok;
    r.shape[0] = 0;
    invalid_shape(validate_seq_lens(&r), "seq_lens.shape[0] (batch)");
    let mut r = ok;
    r.dtype = ElemType::F32;
    dtype_mismatch(validate_seq_lens(&r), "seq_lens");
    let mut r = ok;
    r.strides[0] = 2;
    invalid_shape(validate_seq_lens(&r), "seq_lens.strides[0] (batch)");
    let mut r = ok;
    r.ptr += 2;
    assert!(matches!(
        validate_seq_lens(&r),
        Err(MlaError::Misaligned {
            field: "seq_lens",
            align: 4,
            ..
        })
    ));
    let mut r = ok;
    r.ptr = 0;
    assert!(matches!(
        validate_seq_lens(&r),
        Err(MlaError::NullPointer { field: "seq_lens" })
    ));
}

// ---- split layouts ---------------------------------------------------------------------

/// The fixture's cache and q split: latent parts 512 wide (padded strides), rope parts in
/// tensors of their own.
fn split_req() -> (DecodeRequest<'static>, SplitParts) {
    let mut r = bf16_req();
    r.kv_cache = TensorView::strided(
        region(1),
        ElemType::Bf16,
        [PAGES, P, D_V],
        [P * (D_V + 8), D_V + 8, 1],
    );
    r.q = TensorView::contiguous(region(0), ElemType::Bf16, [B, S_Q, H, D_V]);
    let parts = SplitParts {
        kpe_cache: Some(TensorView::strided(
            region(6),
            ElemType::Bf16,
            [PAGES, P, D_QK - D_V],
            [P * 72 + 8, 72, 1],
        )),
        q_pe: Some(TensorView::contiguous(
            region(7),
            ElemType::Bf16,
            [B, S_Q, H, D_QK - D_V],
        )),
    };
    (r, parts)
}

#[test]
fn split_layouts_are_checked() {
    let off = mla_abi::Shard::OFF;
    let (r, parts) = split_req();
    assert!(validate_decode_parts(&r, &parts, &off).is_ok());
    // The fused request with split parts: the cache must be the latent part.
    invalid_shape(
        validate_decode_parts(&bf16_req(), &parts, &off),
        "q.shape[3] (D_QK)",
    );
    let mut bad = parts;
    bad.kpe_cache.as_mut().unwrap().shape[2] = 65;
    invalid_shape(
        validate_decode_parts(&r, &bad, &off),
        "kpe_cache.shape[2] (D_ROPE)",
    );
    let mut bad = parts;
    bad.kpe_cache.as_mut().unwrap().shape[1] = 8;
    invalid_shape(
        validate_decode_parts(&r, &bad, &off),
        "kpe_cache.shape[1] (page_size)",
    );
    let mut bad = parts;
    bad.q_pe.as_mut().unwrap().dtype = ElemType::Fp16;
    dtype_mismatch(validate_decode_parts(&r, &bad, &off), "q_pe");
    let mut bad = parts;
    bad.kpe_cache.as_mut().unwrap().strides[1] = 60;
    invalid_shape(
        validate_decode_parts(&r, &bad, &off),
        "kpe_cache.strides[1] (token)",
    );
    let mut bad = parts;
    bad.kpe_cache.as_mut().unwrap().ptr += 4;
    misaligned(
        validate_decode_parts(&r, &bad, &off),
        "kpe_cache",
        region(6) + 4,
    );
    // An output on top of the rope part.
    let mut bad_r = r;
    bad_r.lse = TensorView::contiguous(region(6), ElemType::F32, [B, S_Q, H]);
    aliasing(
        validate_decode_parts(&bad_r, &parts, &off),
        "lse",
        "kpe_cache",
    );
    // Only the cache split, q fused.
    let mut fused_q = r;
    fused_q.q = bf16_req().q;
    let only_kv = SplitParts {
        q_pe: None,
        ..parts
    };
    assert!(validate_decode_parts(&fused_q, &only_kv, &off).is_ok());
}

#[test]
fn row_counts_from_caller_fields_never_overflow() {
    assert_eq!(addressable_rows(4, 2, 16, "f").unwrap(), 128);
    assert_eq!(addressable_rows(0, 8, 128, "f").unwrap(), 0);
    let big = u32::MAX as usize;
    for (b, s, h) in [(big, big, big), (0, big, big), (1, usize::MAX / 2, 3)] {
        invalid_shape(
            addressable_rows(b, s, h, "batch * s_q * heads"),
            "batch * s_q * heads",
        );
    }
}
