//! Paged-KV append and gather.
//!
//! - Append — grid `(s_q, batch)`, block `paged_tile::THREADS`: CTA `(t, b)` writes new
//!   token `t` of sequence `b` (576 values) to position `seq_lens[b] - s_q + t` of its pages;
//!   thread `i < 72` moves values `8i .. 8i + 8`. fp8 caches store `saturate(x / kv_scale)`
//!   rounded to nearest even. A position whose page id is outside `0..num_pages`, or a length
//!   below `s_q`, writes nothing.
//! - Gather — grid `(out_rows, batch)`, same block: CTA `(j, b)` copies row `j` of sequence
//!   `b` (if `j < min(seq_lens[b], out_rows)`) to `out[b, j, :]`, optionally dequantising fp8
//!   to bf16 (`x * kv_scale`). A row on an invalid page id is written as zeros.
//! - Shared memory: none. Reads [`AppendParams`] / [`GatherParams`].

use crate::arch::{self, cvt, smem};
use crate::elem::{Bf16, Half16};
use mla_abi::{AppendParams, D_QK, D_V, GatherParams, paged_tile};

/// How rows are stored and moved.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum RowFormat {
    /// 16-bit in, 16-bit out (bf16 or fp16; bytes are copied).
    Half,
    /// fp8 e4m3 bytes copied as they are.
    Fp8,
    /// bf16 in, fp8 e4m3 out (append to an fp8 cache).
    Bf16ToFp8,
    /// fp8 e4m3 in, bf16 out (dequantising gather).
    Fp8ToBf16,
}

impl RowFormat {
    const fn src_bytes(self) -> usize {
        match self {
            RowFormat::Half | RowFormat::Bf16ToFp8 => 2,
            RowFormat::Fp8 | RowFormat::Fp8ToBf16 => 1,
        }
    }
    const fn dst_bytes(self) -> usize {
        match self {
            RowFormat::Half | RowFormat::Fp8ToBf16 => 2,
            RowFormat::Fp8 | RowFormat::Bf16ToFp8 => 1,
        }
    }
}

/// Moves this thread's 8 values of one row from `src` to `dst` (row starts), converting.
///
/// A row of `D_QK` values in two parts: dims `0..D_V` at `main`, `D_V..D_QK` at `rope`
/// (for a contiguous row, `rope = main + D_V` elements).
#[derive(Clone, Copy)]
struct Parts<P> {
    main: P,
    rope: P,
}

/// Moves this thread's 8 values of a row, converting as `fmt` says: to fp8 as
/// `saturate(x / scale)` (a correctly rounded division, then one rounding to e4m3; the
/// product with `1 / scale` rounded twice and missed the nearest e4m3 value on some inputs),
/// from fp8 as `x * scale`.
///
/// # Safety
/// Both rows hold D_QK values of their format in their parts, each part 16-byte aligned.
#[inline(always)]
unsafe fn move_8(fmt: RowFormat, src: Parts<*const u8>, dst: Parts<*mut u8>, scale: f32) {
    let i = arch::thread_idx_x() as usize;
    if i >= paged_tile::ACTIVE_THREADS {
        return;
    }
    let e = i * paged_tile::ELEMS_PER_THREAD;
    // SAFETY: e + 8 <= D_QK, in one part (D_V is a multiple of 8); offsets are multiples of
    // 8 elements, so aligned.
    unsafe {
        let (s, d) = if e < D_V {
            (
                src.main.add(e * fmt.src_bytes()),
                dst.main.add(e * fmt.dst_bytes()),
            )
        } else {
            (
                src.rope.add((e - D_V) * fmt.src_bytes()),
                dst.rope.add((e - D_V) * fmt.dst_bytes()),
            )
        };
        match fmt {
            RowFormat::Half => smem::st_global_v4(d, *(s as *const [u32; 4])),
            RowFormat::Fp8 => *(d as *mut [u32; 2]) = *(s as *const [u32; 2]),
            RowFormat::Bf16ToFp8 => {
                let v = *(s as *const [u32; 4]);
                let mut w = [0u32; 2];
                unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7] {
                    let bits = (v[k / 2] >> (16 * (k % 2))) & 0xffff;
                    let q = cvt::f32_to_e4m3_sat(Bf16::to_f32(bits as u16) / scale);
                    w[k / 4] |= q << (8 * (k % 4));
                });
                *(d as *mut [u32; 2]) = w;
            }
            RowFormat::Fp8ToBf16 => {
                let v = *(s as *const [u32; 2]);
                let mut w = [0u32; 4];
                unroll!(k in [0, 1, 2, 3] {
                    let (lo, hi) = cvt::e4m3x2_to_f32x2(v[k / 2] >> (16 * (k % 2)));
                    w[k] = Bf16::pack2(lo * scale, hi * scale);
                });
                smem::st_global_v4(d, w);
            }
        }
    }
}

/// Page id of position `pos` of sequence `b`, if it is a valid page.
#[inline(always)]
unsafe fn page_of(
    table: *const i32,
    stride: u32,
    shift: u32,
    num_pages: u32,
    b: u32,
    pos: u32,
) -> Option<u64> {
    // SAFETY: the caller keeps pos < max_pages << shift, so the slot is inside row b.
    let page = unsafe { *table.add(b as usize * stride as usize + (pos >> shift) as usize) };
    if page < 0 || page as u32 >= num_pages {
        None
    } else {
        Some(page as u64)
    }
}

/// # Safety
/// Launched with the grid and block above on params the host validated.
#[inline(always)]
pub unsafe fn append(p: AppendParams, fmt: RowFormat) {
    let t = arch::block_idx_x();
    let b = arch::block_idx_y();
    if t >= p.s_q || b >= p.batch {
        return;
    }
    // SAFETY: b < batch entries.
    let len = unsafe { *p.seq_lens.ptr().add(b as usize) };
    if len < p.s_q as i32 {
        return;
    }
    let pos = len as u32 - p.s_q + t;
    if pos >= p.max_pages.saturating_mul(p.page_size) {
        return;
    }
    // SAFETY: pos is inside the table row (checked above).
    let Some(page) = (unsafe {
        page_of(
            p.page_table.ptr(),
            p.page_table_stride,
            p.page_shift,
            p.num_pages,
            b,
            pos,
        )
    }) else {
        return;
    };
    let tok = (pos & (p.page_size - 1)) as u64;
    let dst_off = (page * p.kv_stride_page + tok * p.kv_stride_token) as usize;
    let dst_pe = (page * p.kpe_stride_page + tok * p.kpe_stride_token) as usize;
    let src_off = (b as u64 * p.new_stride_b + t as u64 * p.new_stride_s) as usize;
    // SAFETY: validated rows of new_kv and of the cache (and its rope part).
    unsafe {
        let src = p.new_kv.ptr().add(src_off * fmt.src_bytes()) as *const u8;
        let src = Parts {
            main: src,
            rope: src.add(D_V * fmt.src_bytes()),
        };
        let dst = Parts {
            main: p.kv_cache.ptr().add(dst_off * fmt.dst_bytes()),
            rope: p.kpe.ptr().add(dst_pe * fmt.dst_bytes()),
        };
        move_8(fmt, src, dst, p.kv_scale);
    }
}

/// # Safety
/// Launched with the grid and block above on params the host validated.
#[inline(always)]
pub unsafe fn gather(p: GatherParams, fmt: RowFormat) {
    let j = arch::block_idx_x();
    let b = arch::block_idx_y();
    if b >= p.batch || j >= p.out_rows {
        return;
    }
    // SAFETY: b < batch entries.
    let len = unsafe { *p.seq_lens.ptr().add(b as usize) };
    let len = mla_abi::clamp_len(len, p.max_pages.saturating_mul(p.page_size));
    if j >= len {
        return;
    }
    // SAFETY: j < len, inside the out row block and the table row.
    unsafe {
        let dst = p
            .out
            .ptr()
            .add((b as u64 * p.out_stride_b + j as u64 * D_QK as u64) as usize * fmt.dst_bytes());
        match page_of(
            p.page_table.ptr(),
            p.page_table_stride,
            p.page_shift,
            p.num_pages,
            b,
            j,
        ) {
            Some(page) => {
                let tok = (j & (p.page_size - 1)) as u64;
                let off = (page * p.kv_stride_page + tok * p.kv_stride_token) as usize;
                let off_pe = (page * p.kpe_stride_page + tok * p.kpe_stride_token) as usize;
                let src = Parts {
                    main: p.kv_cache.ptr().add(off * fmt.src_bytes()) as *const u8,
                    rope: p.kpe.ptr().add(off_pe * fmt.src_bytes()) as *const u8,
                };
                let dst = Parts {
                    main: dst,
                    rope: dst.add(D_V * fmt.dst_bytes()),
                };
                move_8(fmt, src, dst, p.kv_scale);
            }
            None => {
                let i = arch::thread_idx_x() as usize;
                if i < paged_tile::ACTIVE_THREADS {
                    let n = paged_tile::ELEMS_PER_THREAD * fmt.dst_bytes();
                    for k in 0..n {
                        *dst.add(i * n + k) = 0;
                    }
                }
            }
        }
    }
}
