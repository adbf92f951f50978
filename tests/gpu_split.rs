//! Split layouts on the GPU: the cache's rope part (dims 512..575) in a tensor of its own
//! (`[pages, page, 64]`, padded strides of its own, NaN in every pad), and q's rope part
//! likewise, decoded by every tile the image runs for every dtype (the reference backend
//! too) and checked against the f64 oracle of the same data fused; through the Rust API and
//! the C ABI. Then append and gather on a split cache, bit for bit against the fused cache,
//! the typed errors of malformed parts, and q and out as strided views of padded buffers.

mod common;

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use mla::abi::{D_QK, D_V, ElemType};
use mla::capi::{MlaDecodeArgs, MlaSplitArgs};
use mla::gate::Backend;
use mla::tactic::{Tactic, Tile};
use mla::{
    AppendRequest, DecodeDtypes, DecodePlan, DecodeRequest, GatherRequest, HostMirror, MlaError,
    Runtime, SplitParts, TensorView,
};
use mla_dev::harness::device_addr as ptr;
use mla_dev::harness::{self, CaseSpec, DeviceCase, HostCase};
use mla_dev::rng::SplitMix64;

const ROPE: usize = D_QK - D_V;

/// The NaN byte pattern of `t`.
fn nan_of(t: ElemType) -> Vec<u8> {
    match t {
        ElemType::Bf16 => 0x7fc0u16.to_le_bytes().to_vec(),
        ElemType::Fp16 => 0x7e00u16.to_le_bytes().to_vec(),
        _ => vec![0x7f],
    }
}

#[allow(clippy::too_many_arguments)]
/// `rows` rows of `width` elements from `src` (row `i` at `i * D_QK + first`), laid out
/// with `stride` elements per row (`>= width`) and `page_pad` extra elements after every
/// `page` rows, padding NaN. Returns the bytes and the (page, token) strides.
fn part(
    src: &[u8],
    w: usize,
    rows: usize,
    page: usize,
    first: usize,
    width: usize,
    stride: usize,
    page_pad: usize,
    nan: &[u8],
) -> (Vec<u8>, [usize; 3]) {
    let page_stride = page * stride + page_pad;
    let pages = rows / page;
    let mut out: Vec<u8> = nan
        .iter()
        .copied()
        .cycle()
        .take(pages * page_stride * w)
        .collect();
    for r in 0..rows {
        let (g, t) = (r / page, r % page);
        let dst = (g * page_stride + t * stride) * w;
        let s = (r * D_QK + first) * w;
        out[dst..dst + width * w].copy_from_slice(&src[s..s + width * w]);
    }
    (out, [page_stride, stride, 1])
}

/// A case's split tensors on the device.
struct Split {
    ckv: CudaSlice<u8>,
    ckv_strides: [usize; 3],
    kpe: CudaSlice<u8>,
    kpe_strides: [usize; 3],
    q_nope: CudaSlice<u8>,
    q_pe: CudaSlice<u8>,
}

fn upload_split(stream: &Arc<CudaStream>, h: &HostCase, pad: usize) -> Split {
    let kv_t = h.spec.dtypes.kv();
    let w = kv_t.size();
    let p = h.spec.page_size;
    let rows = h.num_pages * p;
    let nan = nan_of(kv_t);
    // Pads keep rows 16-byte aligned: multiples of 16 bytes.
    let pad_e = pad * 16 / w;
    let (ckv, ckv_strides) = part(&h.kv_bytes, w, rows, p, 0, D_V, D_V + pad_e, pad_e, &nan);
    let (kpe, kpe_strides) = part(
        &h.kv_bytes,
        w,
        rows,
        p,
        D_V,
        ROPE,
        ROPE + 2 * pad_e,
        3 * pad_e,
        &nan,
    );
    let qw = h.spec.dtypes.q().size();
    let nq = h.q_bytes.len() / (D_QK * qw);
    let mut q_nope = Vec::with_capacity(nq * D_V * qw);
    let mut q_pe = Vec::with_capacity(nq * ROPE * qw);
    for r in 0..nq {
        let row = &h.q_bytes[r * D_QK * qw..(r + 1) * D_QK * qw];
        q_nope.extend_from_slice(&row[..D_V * qw]);
        q_pe.extend_from_slice(&row[D_V * qw..]);
    }
    Split {
        ckv: stream.clone_htod(&ckv).unwrap(),
        ckv_strides,
        kpe: stream.clone_htod(&kpe).unwrap(),
        kpe_strides,
        q_nope: stream.clone_htod(&q_nope).unwrap(),
        q_pe: stream.clone_htod(&q_pe).unwrap(),
    }
}

/// The request over `d` (page table, lengths, outputs) with the split cache and, with
/// `split_q`, the split q.
fn split_request<'a>(
    stream: &CudaStream,
    h: &'a HostCase,
    d: &DeviceCase,
    s: &Split,
    split_q: bool,
) -> (DecodeRequest<'a>, SplitParts) {
    let mut req = d.request(stream, h);
    let sp = &h.spec;
    let b = sp.lens.len();
    req.kv_cache = TensorView::strided(
        ptr(&s.ckv, stream),
        sp.dtypes.kv(),
        [h.num_pages, sp.page_size, D_V],
        s.ckv_strides,
    );
    let mut parts = SplitParts {
        kpe_cache: Some(TensorView::strided(
            ptr(&s.kpe, stream),
            sp.dtypes.kv(),
            [h.num_pages, sp.page_size, ROPE],
            s.kpe_strides,
        )),
        q_pe: None,
    };
    if split_q {
        req.q = TensorView::contiguous(
            ptr(&s.q_nope, stream),
            sp.dtypes.q(),
            [b, sp.s_q, sp.heads, D_V],
        );
        parts.q_pe = Some(TensorView::contiguous(
            ptr(&s.q_pe, stream),
            sp.dtypes.q(),
            [b, sp.s_q, sp.heads, ROPE],
        ));
    }
    (req, parts)
}

fn plan(
    rt: &Runtime,
    stream: &Arc<CudaStream>,
    h: &HostCase,
    tile: Option<Tile>,
    backend: Option<Backend>,
) -> DecodePlan {
    let config = h.decode_config();
    let tactic = match tile {
        Some(tile) => Tactic {
            tile,
            ..rt.default_tactic(&config)
        },
        None => rt.default_tactic(&config),
    };
    rt.plan_decode_on(stream, config, tactic, backend)
        .expect("plan")
}

/// The runs of a case: the default plan, every tile the image runs for `d` (the 16-row
/// tile up to 32 rows), and the reference backend.
fn runs_for(rt: &Runtime, d: DecodeDtypes, rows: usize) -> Vec<(Option<Tile>, Option<Backend>)> {
    let mut runs = vec![(None, None)];
    for tile in Tile::ALL {
        if tile.check(rt.backend(), d).is_ok() && (rows <= 32 || tile != Tile::M16N64) {
            runs.push((Some(tile), None));
        }
    }
    runs.push((None, Some(Backend::Reference)));
    runs
}

#[test]
fn split_layouts_match_the_oracle() {
    let Some((rt, stream)) = common::gpu("split_layouts_match_the_oracle") else {
        return;
    };
    let seed = common::seed("split_layouts_match_the_oracle");
    let mut rng = SplitMix64::new(seed);
    let mut failed = 0;
    let mut n = 0;
    for d in DecodeDtypes::ALL {
        for &(heads, s_q, page) in &[
            (16usize, 1usize, 64usize),
            (16, 2, 16),
            (128, 1, 64),
            (4, 3, 1),
        ] {
            let lens = vec![
                rng.range(1200, 2400),
                rng.range(s_q, 300),
                rng.range(s_q, 900),
            ];
            let h = HostCase::random(&CaseSpec::new(d, page, heads, s_q, lens), &mut rng);
            let refs = h.references();
            let sp = upload_split(&stream, &h, n % 3);
            let mut dev = DeviceCase::upload(&stream, &h).unwrap();
            let runs = runs_for(&rt, d, s_q * heads);
            for (i, &(tile, backend)) in runs.iter().enumerate() {
                let split_q = (i + n) % 2 == 0;
                let pl = plan(&rt, &stream, &h, tile, backend);
                dev.poison_outputs(&stream).unwrap();
                let (req, parts) = split_request(&stream, &h, &dev, &sp, split_q);
                pl.run_split(&rt, &stream, &req, &parts).expect("split run");
                stream.synchronize().unwrap();
                let got = dev.download(&stream, d.out()).unwrap();
                let c = harness::check(&got, &refs);
                let label = format!(
                    "{} H={heads} S_q={s_q} page {page} {tile:?} {backend:?} split q {split_q}",
                    d.name()
                );
                n += 1;
                if c.ok() {
                    eprintln!("ok {label}");
                } else {
                    failed += 1;
                    eprintln!("FAIL {label}: out {} lse {}", c.out, c.lse);
                }
            }
            // The C ABI on the same buffers (split cache and q, default tactic).
            let pl = plan(&rt, &stream, &h, None, None);
            dev.poison_outputs(&stream).unwrap();
            let b = h.spec.lens.len();
            let args = MlaDecodeArgs {
                q: ptr(&sp.q_nope, &stream),
                kv_cache: ptr(&sp.ckv, &stream),
                page_table: ptr(&dev.table, &stream),
                seq_lens: ptr(&dev.lens, &stream),
                out: ptr(&dev.out, &stream),
                lse: ptr(&dev.lse, &stream),
                batch: b as u32,
                num_pages: h.num_pages as u32,
                max_pages: h.max_pages as u32,
                _pad: 0,
                page_table_stride: 0,
                kv_page_stride: sp.ckv_strides[0] as u64,
                softmax_scale: h.scales.softmax_scale,
                output_scale: h.scales.output_scale,
                q_scale: h.scales.q_scale,
                kv_scale: h.scales.kv_scale,
            };
            let split = MlaSplitArgs {
                kpe_cache: ptr(&sp.kpe, &stream),
                kpe_page_stride: sp.kpe_strides[0] as u64,
                kpe_token_stride: sp.kpe_strides[1] as u64,
                kv_token_stride: sp.ckv_strides[1] as u64,
                q_pe: ptr(&sp.q_pe, &stream),
            };
            drop(pl);
            let code = |t: ElemType| match t {
                ElemType::Bf16 => mla::capi::MLA_BF16,
                ElemType::Fp16 => mla::capi::MLA_FP16,
                _ => mla::capi::MLA_FP8_E4M3,
            };
            let cfg = mla::capi::MlaPlanConfig {
                max_batch: b as u32,
                heads: heads as u32,
                s_q: s_q as u32,
                page_size: page as u32,
                max_seq_len: (h.max_pages * page) as u32,
                q_dtype: code(d.q()),
                kv_dtype: code(d.kv()),
                waves: 0,
                tile: 0,
            };
            // SAFETY: valid out-pointers and config; the handles are destroyed below, and
            // the stream is the runtime's context's (one primary context per device).
            let rc = unsafe {
                let mut crt = std::ptr::null_mut();
                let mut cplan = std::ptr::null_mut();
                assert_eq!(mla::capi::mla_runtime_create(0, &mut crt), 0);
                assert_eq!(mla::capi::mla_plan_create(crt, &cfg, &mut cplan), 0);
                let rc = mla::capi::mla_decode_run_split(
                    crt,
                    cplan,
                    &args,
                    &split,
                    stream.cu_stream() as *mut std::ffi::c_void,
                );
                stream.synchronize().unwrap();
                mla::capi::mla_plan_destroy(cplan);
                mla::capi::mla_runtime_destroy(crt);
                rc
            };
            stream.synchronize().unwrap();
            let got = dev.download(&stream, d.out()).unwrap();
            let c = harness::check(&got, &refs);
            n += 1;
            if rc == 0 && c.ok() {
                eprintln!("ok C ABI {} H={heads} S_q={s_q}", d.name());
            } else {
                failed += 1;
                eprintln!(
                    "FAIL C ABI {} rc {rc}: out {} lse {}",
                    d.name(),
                    c.out,
                    c.lse
                );
            }
        }
    }
    eprintln!("[split] {n} decodes checked, {failed} failed (seed {seed})");
    assert_eq!(
        failed, 0,
        "{failed} of {n} split decodes failed (seed {seed})"
    );
}

#[test]
fn split_append_and_gather_match_the_fused_cache() {
    let Some((rt, stream)) = common::gpu("split_append_and_gather_match_the_fused_cache") else {
        return;
    };
    let mut rng = SplitMix64::new(common::seed("split_append_and_gather"));
    for d in [
        DecodeDtypes::Bf16,
        DecodeDtypes::Fp16,
        DecodeDtypes::Fp8KvBf16Q,
    ] {
        let (s_q, page) = (2usize, 16usize);
        let h = HostCase::random(&CaseSpec::new(d, page, 1, s_q, vec![40, 130, 2]), &mut rng);
        let kv_t = d.kv();
        let src_t = if kv_t == ElemType::Fp8E4m3 {
            ElemType::Bf16
        } else {
            kv_t
        };
        let b = h.spec.lens.len();
        let fused = DeviceCase::upload(&stream, &h).unwrap();
        let sp = upload_split(&stream, &h, 1);
        let new: Vec<u8> = (0..b * s_q * D_QK * src_t.size())
            .map(|i| (i * 37 % 113) as u8 & 0x3f)
            .collect();
        let new_d = stream.clone_htod(&new).unwrap();
        let new_v = TensorView::contiguous(ptr(&new_d, &stream), src_t, [b, s_q, D_QK]);
        let fused_req = fused.request(&stream, &h);
        let (split_req, parts) = split_request(&stream, &h, &fused, &sp, false);
        let kpe = parts.kpe_cache.unwrap();
        let append = |kv: TensorView<3>| AppendRequest {
            new_kv: new_v,
            kv_cache: kv,
            page_table: fused_req.page_table,
            seq_lens: fused_req.seq_lens,
            kv_scale: h.scales.kv_scale,
            host: HostMirror::default(),
        };
        rt.append_kv(&stream, &append(fused_req.kv_cache))
            .expect("fused append");
        rt.append_kv_split(&stream, &append(split_req.kv_cache), &kpe)
            .expect("split append");
        // The latent and rope views of one fused cache (interleaved spans, disjoint bytes)
        // take the split append too, and end up as the fused append's bytes.
        let views = DeviceCase::upload(&stream, &h).unwrap();
        let fk = fused_req.kv_cache;
        let at = ptr(&views.kv, &stream);
        let latent = TensorView::strided(at, kv_t, [fk.shape[0], fk.shape[1], D_V], fk.strides);
        let rope = TensorView::strided(
            at + (D_V * kv_t.size()) as u64,
            kv_t,
            [fk.shape[0], fk.shape[1], D_QK - D_V],
            fk.strides,
        );
        rt.append_kv_split(&stream, &append(latent), &rope)
            .expect("split append into one fused cache's views");
        stream.synchronize().unwrap();
        assert!(
            stream.clone_dtoh(&views.kv).unwrap() == stream.clone_dtoh(&fused.kv).unwrap(),
            "{}: the split append into a fused cache's views differs from the fused append",
            d.name()
        );
        let max_len = h.max_pages * page;
        let out_t = if kv_t == ElemType::Fp8E4m3 {
            ElemType::Bf16
        } else {
            kv_t
        };
        let n_out = b * max_len * D_QK * out_t.size();
        let o1 = stream.clone_htod(&vec![0u8; n_out]).unwrap();
        let o2 = stream.clone_htod(&vec![0u8; n_out]).unwrap();
        let gather = |kv: TensorView<3>, o: &CudaSlice<u8>| GatherRequest {
            kv_cache: kv,
            page_table: fused_req.page_table,
            seq_lens: fused_req.seq_lens,
            out: TensorView::contiguous(ptr(o, &stream), out_t, [b, max_len, D_QK]),
            kv_scale: h.scales.kv_scale,
            host: HostMirror::default(),
        };
        rt.gather_kv(&stream, &gather(fused_req.kv_cache, &o1))
            .expect("fused gather");
        rt.gather_kv_split(&stream, &gather(split_req.kv_cache, &o2), &kpe)
            .expect("split gather");
        stream.synchronize().unwrap();
        let (a, c) = (
            stream.clone_dtoh(&o1).unwrap(),
            stream.clone_dtoh(&o2).unwrap(),
        );
        assert!(
            a == c,
            "{}: split append + gather differ from the fused cache's",
            d.name()
        );
        eprintln!("ok append + gather {}", d.name());
    }
}

#[test]
fn split_parts_errors_are_typed() {
    let Some((rt, stream)) = common::gpu("split_parts_errors_are_typed") else {
        return;
    };
    let mut rng = SplitMix64::new(common::seed("split_parts_errors_are_typed"));
    let h = HostCase::random(
        &CaseSpec::new(DecodeDtypes::Bf16, 16, 16, 1, vec![100, 7]),
        &mut rng,
    );
    let dev = DeviceCase::upload(&stream, &h).unwrap();
    let sp = upload_split(&stream, &h, 0);
    let pl = plan(&rt, &stream, &h, None, None);
    let (req, parts) = split_request(&stream, &h, &dev, &sp, true);
    let expect = |parts: SplitParts, req: &DecodeRequest, field: &str| {
        let e = pl.run_split(&rt, &stream, req, &parts).unwrap_err();
        assert!(e.to_string().contains(field), "{field}: {e}");
        eprintln!("ok {field}: {e}");
    };
    let mut bad = parts;
    bad.kpe_cache.as_mut().unwrap().shape[2] = 32;
    expect(bad, &req, "kpe_cache.shape[2]");
    let mut bad = parts;
    bad.q_pe.as_mut().unwrap().dtype = ElemType::Fp16;
    expect(bad, &req, "q_pe");
    let mut bad = parts;
    bad.kpe_cache.as_mut().unwrap().ptr += 8;
    expect(bad, &req, "kpe_cache");
    let mut bad = parts;
    bad.kpe_cache.as_mut().unwrap().shape[0] -= 1;
    expect(bad, &req, "kpe_cache.shape[0]");
    // A 576-wide cache with a rope part: the cache must be the latent part.
    let fused = dev.request(&stream, &h);
    let e = pl
        .run_split(&rt, &stream, &DecodeRequest { q: req.q, ..fused }, &parts)
        .unwrap_err();
    assert!(matches!(e, MlaError::InvalidShape { .. }), "{e}");
    eprintln!("ok fused cache with a rope part: {e}");
}

/// q and out as strided views of larger buffers (token rows padded, a gap after every
/// sequence, NaN in every pad): every tile the image runs and the reference backend, every
/// dtype, against the oracle; out's pads stay NaN (nothing is written outside the view).
#[test]
fn strided_q_and_out_views_match_the_oracle() {
    let test = "strided_q_out";
    let Some((rt, stream)) = common::gpu(test) else {
        return;
    };
    let seed = common::seed(test);
    let mut rng = SplitMix64::new(seed);
    let mut failures = Vec::new();
    let mut n = 0;
    for d in DecodeDtypes::ALL {
        for &(heads, s_q, page) in &[
            (16usize, 1usize, 64usize),
            (16, 2, 16),
            (128, 1, 64),
            (3, 3, 1),
        ] {
            let lens = vec![rng.range(700, 1500), rng.range(s_q, 200)];
            let h = HostCase::random(&CaseSpec::new(d, page, heads, s_q, lens), &mut rng);
            let refs = h.references();
            let b = h.spec.lens.len();
            let (qt, ot) = (d.q(), d.out());
            let (qw, ow) = (qt.size(), ot.size());
            // Row pads of 16-48 bytes and a gap of 32 bytes after every sequence.
            let q_row = D_QK + (16 + 16 * (n % 3)) / qw;
            let q_strides = [s_q * heads * q_row + 32 / qw, heads * q_row, q_row, 1];
            let o_row = D_V + (16 + 16 * ((n + 1) % 3)) / ow;
            let o_strides = [s_q * heads * o_row + 32 / ow, heads * o_row, o_row, 1];
            let at = |s: &[usize; 4], r: usize| {
                let (bi, t, hd) = (r / (s_q * heads), (r / heads) % s_q, r % heads);
                bi * s[0] + t * s[1] + hd * s[2]
            };
            let rows = b * s_q * heads;
            let (q_nan, o_nan) = (nan_of(qt), nan_of(ot));
            let mut q_pad: Vec<u8> = q_nan
                .iter()
                .copied()
                .cycle()
                .take(b * q_strides[0] * qw)
                .collect();
            for r in 0..rows {
                let dst = at(&q_strides, r) * qw;
                q_pad[dst..dst + D_QK * qw]
                    .copy_from_slice(&h.q_bytes[r * D_QK * qw..(r + 1) * D_QK * qw]);
            }
            let o_len = b * o_strides[0] * ow;
            let o_init: Vec<u8> = o_nan.iter().copied().cycle().take(o_len).collect();
            let q_dev = stream.clone_htod(&q_pad).unwrap();
            let mut o_dev = stream.clone_htod(&o_init).unwrap();
            let mut dev = DeviceCase::upload(&stream, &h).unwrap();
            let runs = runs_for(&rt, d, s_q * heads);
            for &(tile, backend) in &runs {
                let pl = plan(&rt, &stream, &h, tile, backend);
                dev.poison_outputs(&stream).unwrap();
                stream.memcpy_htod(&o_init, &mut o_dev).unwrap();
                let mut req = dev.request(&stream, &h);
                req.q =
                    TensorView::strided(ptr(&q_dev, &stream), qt, [b, s_q, heads, D_QK], q_strides);
                req.out =
                    TensorView::strided(ptr(&o_dev, &stream), ot, [b, s_q, heads, D_V], o_strides);
                pl.run(&rt, &stream, &req).expect("strided run");
                stream.synchronize().unwrap();
                let o_host: Vec<u8> = stream.clone_dtoh(&o_dev).unwrap();
                let lse: Vec<f32> = stream.clone_dtoh(&dev.lse).unwrap();
                let mut packed = Vec::with_capacity(rows * D_V * ow);
                let mut inside = vec![false; o_len / ow];
                for r in 0..rows {
                    let e = at(&o_strides, r);
                    packed.extend_from_slice(&o_host[e * ow..(e + D_V) * ow]);
                    inside[e..e + D_V].iter_mut().for_each(|x| *x = true);
                }
                let got = (mla_dev::numeric::to_f32(ot, &packed), lse);
                let c = harness::check(&got, &refs);
                let label = format!(
                    "{} H={heads} S_q={s_q} page {page} {tile:?} {backend:?}",
                    d.name()
                );
                n += 1;
                if !c.ok() {
                    failures.push(format!("{label}: out {} lse {}", c.out, c.lse));
                }
                let written_pad = inside
                    .iter()
                    .enumerate()
                    .filter(|&(i, &ins)| {
                        !ins && o_host[i * ow..(i + 1) * ow] != o_init[i * ow..(i + 1) * ow]
                    })
                    .count();
                if written_pad > 0 {
                    failures.push(format!(
                        "{label}: {written_pad} pad elements of out written"
                    ));
                }
            }
        }
    }
    for f in &failures {
        eprintln!("FAIL {f}");
    }
    eprintln!(
        "[{test}] {n} strided decodes checked, {} failed (seed {seed})",
        failures.len()
    );
    assert!(failures.is_empty());
}
