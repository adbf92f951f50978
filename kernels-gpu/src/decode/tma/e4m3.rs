//! The TMA decode's e4m3 path (fp8 Q with an fp8 cache: `names::DECODE_TMA_FP8`): both
//! products on the e4m3 tensor cores, no widening.
//!
//! - Q lands raw with `cp.async` in nine 4 KB tiles of 64 rows x 64 bytes (64-byte swizzle,
//!   `decode_tile::TMA_E4_SLAB` apart); each box of the cache lands the same way through the
//!   map's 64-byte swizzle. S of a block is 18 `m64n64k32` e4m3 steps, two per slab.
//! - e4m3 `wgmma` reads B only K-major, so V is transposed into each stage's V^T (512 dim
//!   rows of 64 tokens, `TMA_E4_VT`), two tokens' bytes paired per dim by `prmt` and stored
//!   transposed by `stmatrix`: in the tensor-map forms by a third warpgroup
//!   (`tma::xpose_cell`, tokens past the sequence end entering as zeros through the
//!   transpose's mask), in the `cp.async` forms by the warpgroup that computes the block's S,
//!   while S runs (those forms' copies land rows past the end as zeros). V^T's k-positions
//!   are in [`vt_token`] order, the order in which a lane's S accumulators sit, so P packs
//!   from the accumulators into the A registers of `m64n256k32` in place.
//! - P is quantised per row with the row's running max at `2^8` (`exp2(S - m + 8)`, at most
//!   256 of e4m3's 448): the row sums carry the same factor, so the normalised output needs
//!   nothing and the log-sum-exp subtracts 8 (log2) once, in the epilogue.
//! - bf16 Q (with an fp8 cache) enters S as two e4m3 parts, `hi` and `lo`
//!   ([`split_q_row`]): each k-step runs twice against the same K.
//! - The e4m3 `wgmma` sums into O with about 13 bits below the largest addend, so a long
//!   split moves O into an f32 scratch every `E4M3_PROMOTE_PAIRS` pairs ([`Cta::promote`]).
//! - The `cp.async` form (`K::KV_CP`: pages under `TMA_MIN_PAGE` tokens, strided fused
//!   caches) keeps the pair loop; each warpgroup copies its own stage from the page table
//!   where the tensor-map form's issuer reloads it ([`Cta::copy_stage`]), and rows past the
//!   end land as zeros, so no tail is zeroed.

use super::math::slab_order;
use super::{BLOCK_N, Cta};
use crate::arch::{self, cp_async, cvt, ldmatrix, smem, sync, wgmma};
use crate::decode::wg::{sw64_off, vt_token};
use crate::decode::{self, DecodeKind};
use crate::elem::Bf16;
use mla_abi::decode_tile as T;

/// log2 of the factor P is quantised with (P <= 1 before it).
pub(crate) const P_LOG2_SCALE: f32 = 8.0;

const E4_SLAB: u32 = T::TMA_E4_SLAB as u32;
const E4_VT: u32 = T::TMA_E4_VT as u32;
/// Floats between a thread's promotion slots of consecutive O fragments.
const ACC_ROW: usize = 4 * T::THREADS;
/// bf16 Q's `lo` tiles ([`Cta::load_q_split`]), past the nine `hi` tiles in Q's 72 KB.
pub(super) const Q_LO: u32 = 9 * E4_SLAB;

/// [`decode::pow2_row_scale`] into `[2^7, 2^8)`, so that a bf16 row's e4m3 `hi` part stays
/// below 448; a row holding Inf or NaN gets `up = NaN` (its logits are NaN, as the
/// reference's are).
#[inline(always)]
fn e4m3_row_scale(m: u32) -> (f32, f32) {
    let (up, down) = decode::pow2_row_scale(m, 7);
    if m >= 0x7f80 {
        (f32::NAN, down)
    } else {
        (up, down)
    }
}

/// P of a block as the A fragments of its two `k32` steps (the other two words unused):
/// k-step `kk` packs 8-column groups `4 kk .. 4 kk + 4` of the accumulators; words 0 and 2
/// hold row `g`, 1 and 3 row `g + 8`, each four positions of [`vt_token`] order.
#[inline(always)]
pub(super) fn frags_e4m3(s: &[f32; 32]) -> [[u32; 4]; 4] {
    let mut a = [[0u32; 4]; 4];
    unroll!(kk in [0, 1] {
        let q = |j: usize, e: usize| s[4 * (4 * kk + j) + e];
        a[kk] = [
            cvt::pack_e4m3x4([q(0, 0), q(0, 1), q(1, 0), q(1, 1)]),
            cvt::pack_e4m3x4([q(0, 2), q(0, 3), q(1, 2), q(1, 3)]),
            cvt::pack_e4m3x4([q(2, 0), q(2, 1), q(3, 0), q(3, 1)]),
            cvt::pack_e4m3x4([q(2, 2), q(2, 3), q(3, 2), q(3, 3)]),
        ];
    });
    a
}

/// [`frags_e4m3`] times a per-row factor (words 0 and 2: `f[0]`, 1 and 3: `f[1]`),
/// requantised (widened by the hardware conversion in every build: the software one's
/// registers made the consumers spill inside their `wgmma` loop).
#[inline(always)]
pub(super) fn scaled_e4m3(a: &[[u32; 4]; 4], f: [f32; 2]) -> [[u32; 4]; 4] {
    let mut out = [[0u32; 4]; 4];
    unroll!(kk in [0, 1] {
        unroll!(w in [0, 1, 2, 3] {
            let x = a[kk][w];
            let (v0, v1) = cvt::e4m3x2_to_f32x2_hw(x & 0xffff);
            let (v2, v3) = cvt::e4m3x2_to_f32x2_hw(x >> 16);
            let k = f[w % 2];
            out[kk][w] = cvt::pack_e4m3x4([v0 * k, v1 * k, v2 * k, v3 * k]);
        });
    });
    out
}

/// The V^T tiles of a block (512 dims x 64 tokens of e4m3 at `vt`) with each NaN replaced
/// by zero, for a block holding keys only the step's later tokens see
/// ([`decode::unseen_rows`] says why the whole tile may be cleaned); thread `tid` of
/// `threads` takes every `threads`-th 16-byte chunk. Rolled: cold code beside the block loop.
///
/// # Safety
/// Every part of the V^T is written, and nothing reads it before the writers'
/// `fence.proxy.async` and a barrier after this.
#[inline(always)]
pub(crate) unsafe fn clean_vt(vt: u32, tid: u32, threads: u32) {
    let mut i = tid;
    while i < 512 * 64 / 16 {
        let at = vt + 16 * i;
        // SAFETY: forwarded from the caller; chunk i of the 32 KB V^T.
        unsafe {
            arch::no_unroll();
            smem::st_shared_v4(at, decode::nan_to_zero_e4m3(smem::ld_shared_v4(at)));
        }
        i += threads;
    }
}

/// Part `w` (`< 4`) of a block's V^T, by one warp (lane `l`): from raw slabs 0-7 at `raw`
/// (64 tokens x 64 bytes each, 64-byte swizzle, [`T::TMA_E4_SLAB`] apart) into V^T tiles
/// 0-7 at `vt` (tile `s`: slab `s`'s 64 dims as rows of 64 tokens, same swizzle and
/// spacing), as 8 x 8 matrices of 16-bit elements (two tokens of one dim) stored transposed
/// by `stmatrix`. Lane `l = 4 p + c` takes token group `c` (16 tokens), its `p`-th pair in
/// [`vt_token`] order (tokens `16 c + 2 (p / 2) + 8 (p % 2)` and `+ 1`) and 16-byte dim chunk
/// `(c + w) % 4` of every slab: two 16-byte loads (the odd-`p` lanes load the odd token
/// first, so each 8-lane phase meets every bank once), eight `prmt` pairing the two tokens'
/// bytes per dim, two `stmatrix.x4.trans` whose stored rows are V^T rows' 16-byte token
/// chunks. Matrix `i` of store `a` holds dims `16 ((j / 2 + w) % 4) + 8 a + 2 i + j % 2` (row
/// `j`), whose 64-byte swizzle is `i`, so its eight rows meet every bank once. With `MASK`,
/// tokens from `valid` on enter V^T as zeros (their raw rows are not read). `WIDE` has two
/// slabs' loads in flight before their `prmt`s, else one (fewer registers). The four parts
/// make the whole V^T; the caller fences and synchronises.
///
/// # Safety
/// A converged warp; slabs 0-7 landed; no `wgmma` still reads the V^T tiles.
#[inline(always)]
pub(crate) unsafe fn transpose_vt_part<const MASK: bool, const WIDE: bool>(
    raw: u32,
    vt: u32,
    w: u32,
    l: u32,
    valid: u32,
) {
    let (p, c) = (l / 4, l % 4);
    let chunk = 16 * ((c + w) % 4);
    let odd = p % 2;
    let t0 = vt_token(16 * c + 2 * p);
    let (tok0, tok1) = (t0 + odd, t0 + 1 - odd);
    let (ld0, ld1) = (raw + sw64_off(tok0, chunk), raw + sw64_off(tok1, chunk));
    // Bytes (t0 d, t0 + 1 d, t0 d + 1, t0 + 1 d + 1) for d = 4 k and 4 k + 2 of word k,
    // whichever of the two loads holds t0.
    let (sel_lo, sel_hi) = if odd == 0 {
        (0x5140, 0x7362)
    } else {
        (0x1504, 0x3726)
    };
    let (i, j) = (l / 8, l % 8);
    let n = 16 * ((j / 2 + w) % 4) + 2 * i + j % 2;
    let vt = vt + n * 64 + (((j / 2) ^ i) << 4);
    let ld = |addr: u32, tok: u32| {
        if !MASK || tok < valid {
            // SAFETY: a 16-byte chunk < 64 of a token < 64's row of a raw slab < 8 (the
            // caller's).
            unsafe { smem::ld_shared_v4(addr) }
        } else {
            [0; 4]
        }
    };
    // The `prmt`s and stores of slab `2 h + e`, from its two tokens' loads.
    let store = |x: [u32; 4], y: [u32; 4], at: u32| {
        unroll!(a in [0, 1] {
            let r = [0, 1, 2, 3].map(|m| {
                let k = 2 * a + m / 2;
                cvt::prmt(x[k], y[k], if m % 2 == 0 { sel_lo } else { sel_hi })
            });
            // SAFETY: V^T rows n + 8 a < 64 of the slab's tile, 16-byte chunks < 4; the
            // warp is converged (the caller's).
            unsafe { ldmatrix::stmatrix_x4_trans(vt + at + 512 * a as u32, r) };
        });
    };
    if WIDE {
        // Two slabs at a time: both slabs' loads are in flight before the first `prmt`.
        unroll!(h in [0, 1, 2, 3] {
            let at = 2 * h as u32 * E4_SLAB;
            let x = [0, 1].map(|e| ld(ld0 + at + e * E4_SLAB, tok0));
            let y = [0, 1].map(|e| ld(ld1 + at + e * E4_SLAB, tok1));
            unroll!(e in [0, 1] {
                store(x[e], y[e], at + e as u32 * E4_SLAB);
            });
        });
    } else {
        // One slab at a time (fewer registers: the transposer warpgroup's form).
        unroll!(h in [0, 1, 2, 3, 4, 5, 6, 7] {
            let at = h as u32 * E4_SLAB;
            store(ld(ld0 + at, tok0), ld(ld1 + at, tok1), at);
        });
    }
}

/// fp8 Q rows `row0 .. row0 + n` of sequence `b` into nine 64-byte-swizzled tiles with
/// `cp.async`, 16 bytes (16 dims) at a time: thread `t` of `threads` takes chunks `t, t +
/// threads, ..` of the `n x 36`; chunk `k` of row `r` goes to `dst(r, k)`. Rows past the
/// last query row land as zeros. The caller commits and waits.
///
/// # Safety
/// `dst` gives 16-byte aligned shared addresses the caller owns; `b < batch`.
#[inline(always)]
pub(crate) unsafe fn load_q_e4m3_rows(
    p: &mla_abi::DecodeParams,
    b: u32,
    (row0, n): (u32, u32),
    (t, threads): (u32, u32),
    dst: impl Fn(u32, u32) -> u32,
) {
    let rows = p.s_q * p.heads;
    let mut c = t;
    while c < n * 36 {
        let (r, k) = (c / 36, c % 36);
        let gr = row0 + r;
        let (src, len) = if gr < rows {
            let (t, h) = (gr / p.heads, gr % p.heads);
            let b = b as u64;
            let (base, off, kc) = if k < 32 {
                let off = p.q_row(b, t as u64, h as u64);
                (p.q.ptr() as *const u8, off, k)
            } else {
                let off = p.q_pe_row(b, t as u64, h as u64);
                (p.q_pe.ptr() as *const u8, off, k - 32)
            };
            // SAFETY: bytes 16 kc .. +16 of a validated fp8 q (or q_pe) row, 16-byte
            // aligned (validation: rows and bases at 16 bytes).
            (unsafe { base.add((off + 16 * kc as u64) as usize) }, 16)
        } else {
            (p.q.ptr() as *const u8, 0)
        };
        // SAFETY: dst is the caller's; src is read only when len == 16.
        unsafe { cp_async::cp_async_cg_16(dst(r, k), src, len) };
        c += threads;
    }
}

/// bf16 Q row `gr` of sequence `b` as two e4m3 parts by one of its four threads (`part`,
/// neighbouring lanes of a converged warp): the row scaled by the power of two `up` that puts
/// its largest magnitude in `[2^7, 2^8)`, `hi = e4m3(up q)` at `dst(k)` and `lo = e4m3(up q -
/// hi)` at `dst(k) + lo` for its 16-dim chunks `k = part + 4 i` (`i < 9`, read straight from
/// global memory). S takes both against the same K, so Q enters it to within about half a
/// bf16 ulp of each value (a value below `2^-3` of the row's largest to within `2^-10`
/// absolute of the scaled row, the reach of e4m3's subnormals). A row past the last query row
/// is zeros; one holding Inf or NaN turns to NaN. Returns the row's `1 / up`. With `TWO_PASS`
/// the chunks are read twice (for the row's largest magnitude, then for the parts) instead of
/// held in 72 registers between.
///
/// # Safety
/// `dst(k)` and `dst(k) + lo` are 16-byte aligned shared addresses the caller owns; `b <
/// batch`; the four threads of the row call it together.
#[inline(always)]
pub(crate) unsafe fn split_q_row<const TWO_PASS: bool>(
    p: &mla_abi::DecodeParams,
    b: u32,
    gr: u32,
    part: u32,
    lo: u32,
    dst: impl Fn(u32) -> u32,
) -> f32 {
    let rows = p.s_q * p.heads;
    let (t, h) = (gr / p.heads, gr % p.heads);
    let (off, off_pe) = if gr < rows {
        let b = b as u64;
        (
            p.q_row(b, t as u64, h as u64),
            p.q_pe_row(b, t as u64, h as u64),
        )
    } else {
        (0, 0)
    };
    // Chunk i of this thread's (zeros past the last row).
    let chunk = |i: u32| {
        let k = part + 4 * i;
        let (base, at) = if k < 32 {
            (p.q.ptr() as *const u16, off + 16 * k as u64)
        } else {
            (p.q_pe.ptr() as *const u16, off_pe + 16 * (k - 32) as u64)
        };
        if gr < rows {
            // SAFETY: dims 16 k' .. +16 of a validated bf16 q (or q_pe) row, 16-byte
            // aligned (validation: rows and bases at 16 bytes); q is read-only here.
            unsafe {
                let src = base.add(at as usize) as *const u8;
                let (x, y) = (
                    smem::ld_global_nc_v4(src),
                    smem::ld_global_nc_v4(src.add(16)),
                );
                [x[0], x[1], x[2], x[3], y[0], y[1], y[2], y[3]]
            }
        } else {
            [0; 8]
        }
    };
    let mut v = [[0u32; 8]; 9];
    let mut m = 0u32;
    unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
        let c = chunk(i as u32);
        unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7] {
            m = decode::bf16x2_max_mag(m, c[j]);
        });
        if !TWO_PASS {
            v[i] = c;
        }
    });
    // SAFETY: converged warps; a row's four threads are neighbouring lanes.
    unsafe {
        unroll!(x in [1, 2] {
            m = m.max(sync::shfl_xor_f32(f32::from_bits(m), x as u32).to_bits());
        });
    }
    let (up, down) = e4m3_row_scale(m);
    unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
        let k = part + 4 * i as u32;
        let c = if TWO_PASS { chunk(i as u32) } else { v[i] };
        let mut hi = [0u32; 4];
        let mut lw = [0u32; 4];
        unroll!(n in [0, 1, 2, 3] {
            let (w0, w1) = (c[2 * n], c[2 * n + 1]);
            let x = [w0 << 16, w0 & 0xffff_0000, w1 << 16, w1 & 0xffff_0000]
                .map(|b| f32::from_bits(b) * up);
            hi[n] = cvt::pack_e4m3x4(x);
            let (h0, h1) = cvt::e4m3x2_to_f32x2_hw(hi[n] & 0xffff);
            let (h2, h3) = cvt::e4m3x2_to_f32x2_hw(hi[n] >> 16);
            lw[n] = cvt::pack_e4m3x4([x[0] - h0, x[1] - h1, x[2] - h2, x[3] - h3]);
        });
        // SAFETY: forwarded from the caller.
        unsafe {
            smem::st_shared_v4(dst(k), hi);
            smem::st_shared_v4(dst(k) + lo, lw);
        }
    });
    down
}

impl<'a, K: DecodeKind<Mma = Bf16>> Cta<'a, K> {
    /// The exponent reference P is computed against: the row's max, lowered by
    /// [`P_LOG2_SCALE`] on the e4m3 path.
    #[inline(always)]
    pub(super) fn p_ref(m_ref: [f32; 2]) -> [f32; 2] {
        if Self::E4 {
            m_ref.map(|m| m - P_LOG2_SCALE)
        } else {
            m_ref
        }
    }

    /// Raw slab `s` (64 tokens x 64 bytes) of stage `st`.
    #[inline(always)]
    pub(super) fn raw_s(&self, st: u32, s: u32) -> u32 {
        self.kv_s(st) + s * E4_SLAB
    }

    /// The `cp.async` form's copy of block `blk` into stage `st` by this warpgroup: two
    /// threads a row (one page entry each), each copying 32 bytes of every 64-byte slab row,
    /// so a warp's copy reads 16 whole 32-byte sectors; the raw slabs in this warpgroup's S
    /// order ([`slab_order`]), each completed on its mbarrier by the warpgroup's 128
    /// `.noinc` arrivals. Rows past the end, or with an entry outside `0..num_pages`, land
    /// as zeros. The copies join no `cp.async` group.
    ///
    /// # Safety
    /// The whole warpgroup, converged; `blk < kb1`; the stage's raw slabs are no longer read
    /// (its S completed, its transpose's warpgroup barrier passed); its mbarriers count 128
    /// arrivals and have no copy pending.
    #[inline(always)]
    pub(super) unsafe fn copy_stage(&self, blk: u32, st: u32) {
        let p = self.p;
        // Opaque: computed per copy, not held through the pair loop.
        let t = arch::opaque(arch::thread_idx_x() % 128);
        let (r, h) = (t / 2, t % 2);
        let tok = blk * BLOCK_N + r;
        let src = decode::kv_row_source(
            p,
            decode::kv_row_page_entry(p, self.b, tok, self.len),
            tok,
            1,
        );
        let (raw, bars) = (arch::opaque(self.raw_s(st, 0)), self.bars(st));
        // SAFETY: row r < 64, 16-byte chunks 2 i + h < 4 of raw slabs < 9; a row with n == 16
        // is 576 contiguous bytes of the fused cache (the host routes no split cache here),
        // else nothing is read.
        unsafe {
            unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
                let s = slab_order(self.wg, j as u32);
                unroll!(i in [0, 1] {
                    let c = 2 * i as u32 + h;
                    let dst = raw + s * E4_SLAB + sw64_off(r, 16 * c);
                    let a = src.main.add((64 * s + 16 * c) as usize);
                    cp_async::cp_async_cg_16(dst, a, src.n);
                });
                cp_async::cp_async_mbarrier_arrive_noinc(bars + 8 * s);
            });
        }
    }

    /// fp8 Q into its nine 64-byte-swizzled tiles with `cp.async` ([`load_q_e4m3_rows`]);
    /// rows past the last query row as zeros. The caller commits and waits.
    ///
    /// # Safety
    /// Every thread of the CTA; the Q tiles are free (the previous cell's epilogue barrier).
    #[inline(always)]
    pub(super) unsafe fn load_q_e4m3(&self) {
        let base = self.base;
        // SAFETY: forwarded from the caller; the offsets lie in the nine Q tiles.
        unsafe {
            load_q_e4m3_rows(
                self.p,
                self.b,
                (self.row0, BLOCK_N),
                (arch::thread_idx_x(), T::THREADS as u32),
                |r, k| base + (k / 4) * E4_SLAB + sw64_off(r, 16 * (k % 4)),
            )
        };
    }

    /// bf16 Q (with an fp8 cache) as two e4m3 tiles ([`split_q_row`]), `hi` at the Q tiles
    /// and `lo` at [`Q_LO`] past them (the same nine 64-byte-swizzled 4 KB tiles each), four
    /// threads per row; the row's `1 / up` is stored to exchange entry 2, which the caller
    /// reads after its CTA barrier into [`Cta::scale_r`]. Entry 2 (warpgroup 1's max in the
    /// pair loop) is read last in the previous cell's last pair, before its epilogue's CTA
    /// barrier, and written next by warpgroup 1 after the named barrier `BAR_SCALE0`, which
    /// warpgroup 0 reaches only after reading the scales; the row sums in entries 4 and 5,
    /// which the previous cell's epilogue may still be reading, stay untouched.
    ///
    /// # Safety
    /// Every thread of the CTA; the Q tiles and exchange entry 2 are free (the previous
    /// cell's epilogue barrier); a CTA barrier and a proxy fence follow before any read.
    #[inline(always)]
    pub(super) unsafe fn load_q_split(&self) {
        // Opaque: computed per cell, not held through the persistent loop.
        let tid = arch::opaque(arch::thread_idx_x());
        let (r, part) = (tid / 4, tid % 4);
        let base = self.base;
        // SAFETY: forwarded from the caller; row r < 64 of the hi and lo tiles.
        let down = unsafe {
            split_q_row::<false>(self.p, self.b, self.row0 + r, part, Q_LO, |k| {
                base + (k / 4) * E4_SLAB + sw64_off(r, 16 * (k % 4))
            })
        };
        // Predicated, not branched on the lane.
        // SAFETY: row r < 64 of the exchange.
        unsafe { smem::st_shared_f32_if(self.red(2, r), down, (part == 0) as u32) };
    }

    /// V^T of the block in stage `st` (all 512 dims) from its raw slabs 0-7
    /// ([`transpose_vt_part`], warp `w` of the warpgroup doing part `w`). Ends with a proxy
    /// fence and a warpgroup barrier: this warpgroup's P.V reads it next; the other's reads
    /// it after a named barrier this warpgroup arrives at later.
    ///
    /// # Safety
    /// The whole warpgroup, converged, after waiting for slabs 0-7 of the block (the
    /// `cp.async` forms': rows past the sequence end landed as zeros); no `wgmma` still reads the
    /// stage's V^T (its last P.V completed before the slabs were reissued).
    #[inline(always)]
    pub(super) unsafe fn transpose_vt(&self, st: u32, blk: u32) {
        // Opaque: computed where used, not held through the pair loop.
        let t = arch::opaque(arch::thread_idx_x() % 128);
        let raw = arch::opaque(self.raw_s(st, 0));
        // SAFETY: forwarded from the caller; the stage's raw slabs and V^T.
        unsafe { transpose_vt_part::<false, true>(raw, raw + E4_VT, t / 32, t % 32, BLOCK_N) };
        let (first, valid) = decode::unseen_rows(self.p, self.len, blk);
        if first < valid {
            // SAFETY: the whole warpgroup (forwarded); every part is written (the barrier).
            unsafe {
                self.wg_sync();
                clean_vt(raw + E4_VT, t, 128);
            }
        }
        wgmma::fence_proxy_async_shared();
        // SAFETY: the whole warpgroup (forwarded).
        unsafe { self.wg_sync() };
    }

    /// Stores P's e4m3 fragments ([`frags_e4m3`]) as the 64 x 64 byte K-major tile at `ps`
    /// (64-byte swizzle), the other warpgroup's shared-memory A.
    #[inline(always)]
    pub(super) fn store_p_e4m3(&self, a: &[[u32; 4]; 4], ps: u32) {
        let (r0, c) = (self.r_loc, self.c);
        let ps = arch::opaque(ps);
        unroll!(kk in [0, 1] {
            unroll!(w in [0, 1, 2, 3] {
                let r = r0 + 8 * (w % 2) as u32;
                let byte = 32 * kk as u32 + 16 * (w / 2) as u32 + 4 * c;
                // SAFETY: row < 64, bytes < 64 of the tile.
                unsafe { smem::st_shared_u32(ps + sw64_off(r, byte), a[kk][w]) };
            });
        });
        wgmma::fence_proxy_async_shared();
    }

    /// This thread's 16-byte slot of O fragment 0 in the CTA's promotion scratch
    /// ([`mla_abi::DecodeParams::acc`]); fragment `j`'s is [`ACC_ROW`] `j` floats on: `(CTA,
    /// j)` rows of 256 threads, so a warp's accesses are 512 contiguous bytes.
    #[inline(always)]
    fn acc_slot(&self) -> *mut f32 {
        let tid = arch::opaque(arch::thread_idx_x());
        let at =
            (arch::block_idx_x() as usize * (mla_abi::ACC_FLOATS_PER_CTA / 4) + tid as usize) * 4;
        // SAFETY: inside the launch's scratch (the host sizes it for grid.x CTAs).
        unsafe { self.p.acc.ptr().add(at) }
    }

    /// Whether this cell's split promotes O ([`Cta::promote`]): more than
    /// [`T::E4M3_PROMOTE_PAIRS`] pairs.
    #[inline(always)]
    pub(super) fn promotes(&self) -> bool {
        (self.kb1 - self.kb0).div_ceil(2) > T::E4M3_PROMOTE_PAIRS
    }

    /// Moves O into the f32 scratch and restarts it at zero (the e4m3 path, every
    /// [`T::E4M3_PROMOTE_PAIRS`] pairs of a long split; `first`: the cell's first): the
    /// e4m3 `wgmma`s add into O with about 13 bits below the largest addend, so a sum over
    /// many blocks drifts; the scratch sums the partial O's in f32. It holds each row
    /// against the max of its last promotion (exchange entry `4 + wg`, free in the pair
    /// loop): read, rescaled to the max O is against now, O added, written back, four
    /// fragments at a time (S's registers are free here). `red.add` instead, with no read,
    /// measured 4-8% slower at B=64-128 L=16384 H=128 (the L2's atomics).
    ///
    /// # Safety
    /// The whole warpgroup, converged, in a pair step with every `wgmma` on O complete and
    /// S dead; `m` is the max O's rows are against now.
    #[inline(always)]
    pub(super) unsafe fn promote(&mut self, m: [f32; 2], first: bool) {
        let acc = self.acc_slot();
        // SAFETY: this thread's own slots (32 fragments).
        unsafe {
            if first {
                unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
                    smem::st_global_v4_f32(acc.add(ACC_ROW * j), self.o[j]);
                });
            } else {
                let f = self.acc_factor(m);
                unroll!(q in [0, 1, 2, 3, 4, 5, 6, 7] {
                    let g = [0, 1, 2, 3]
                        .map(|i| smem::ld_global_v4_f32(acc.add(ACC_ROW * (4 * q + i))));
                    unroll!(i in [0, 1, 2, 3] {
                        let j = 4 * q + i;
                        let mut o = self.o[j];
                        unroll!(e in [0, 1, 2, 3] {
                            o[e] = sync::fma(g[i][e], f[e / 2], o[e]);
                        });
                        smem::st_global_v4_f32(acc.add(ACC_ROW * j), o);
                    });
                });
            }
        }
        self.o = [[0.0; 4]; 32];
        self.st_rows(4 + self.wg, m);
    }

    /// The factor that takes the scratch's rows (against the max of their last promotion,
    /// exchange entry `4 + wg`) to `m`: at most one, as the running max only rises; zero for
    /// a row that had seen nothing then (its scratch holds zeros).
    #[inline(always)]
    fn acc_factor(&self, m: [f32; 2]) -> [f32; 2] {
        let base = self.ld_rows(4 + self.wg);
        [0, 1].map(|h| {
            if base[h] == f32::NEG_INFINITY {
                0.0
            } else {
                sync::ex2(base[h] - m[h])
            }
        })
    }

    /// O plus the scratch rescaled to the running max, at the epilogue (before exchange
    /// entries 4 and 5 take the row sums): one last promotion against the running max, then
    /// O read back from the scratch. Reading the scratch into registers beside a live O, as
    /// a plain merge does, peaks at 253 registers and tipped ptxas into spilling the cell
    /// walk's state in the `cp.async` forms.
    ///
    /// # Safety
    /// As [`Cta::promote`]'s; this thread's scratch slots hold this cell's promotions
    /// ([`Cta::promotes`]).
    #[inline(always)]
    pub(super) unsafe fn merge_acc(&mut self) {
        // SAFETY: forwarded from the caller.
        unsafe { self.promote(self.m_run, false) };
        // The scratch now holds the rows against the running max.
        let acc = self.acc_slot();
        unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
            // SAFETY: this thread's own slot of fragment j, written above by this thread.
            self.o[j] = unsafe { smem::ld_global_v4_f32(acc.add(ACC_ROW * j)) };
        });
    }

    /// The descriptor of V^T's k-step `kk` (32 tokens) for this warpgroup's 256 dims.
    #[inline(always)]
    pub(super) fn vt_desc(&self, st: u32, kk: u32) -> u64 {
        let at = arch::opaque(self.raw_s(st, 0) + E4_VT + self.wg * 256 * 64);
        wgmma::Desc::new(at, 16, 512, wgmma::Swizzle::B64).at(32 * kk)
    }
}
