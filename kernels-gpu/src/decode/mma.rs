//! The `mma.sync` decode kernel body (64-row and 16-row tiles, every arch): the grid,
//! block, shared memory and pipeline are described in [`super`]; the helpers it shares with
//! the other decode kernels live there too.

use super::*;

/// Converts a landed raw fp8 stage into the swizzled 16-bit KV tile.
#[inline(always)]
unsafe fn convert_fp8_stage<K: DecodeKind>(raw_stage: u32, tile: u32) {
    let mut c = arch::thread_idx_x();
    while c < BLOCK_N * FP8_ROW_CHUNKS {
        let r = c / FP8_ROW_CHUNKS;
        let k = c % FP8_ROW_CHUNKS;
        // SAFETY: inside the raw stage and the tile (both sized by decode_tile).
        unsafe {
            let v = smem::ld_shared_v4(raw_stage + r * D_QK as u32 + (k << 4));
            smem::st_shared_v4(
                tile + qk_off(r, 2 * k),
                fp8x8_to_half::<K::Mma>([v[0], v[1]]),
            );
            smem::st_shared_v4(
                tile + qk_off(r, 2 * k + 1),
                fp8x8_to_half::<K::Mma>([v[2], v[3]]),
            );
        }
        c += THREADS;
    }
}

/// S (16 rows x 64/CS tokens) = Q[rows of rg] . K[tokens of ch]^T over all 576 dims.
/// `kv` holds the warp's tokens; with one 8-token tile per warp (`S_TILES == 1`) they start at
/// row `tok_row` of `kv` (a ring slot holds 32 tokens, a stage all 64).
#[inline(always)]
unsafe fn qk_tile_gemm<H: Half16, L: Layout>(
    q_smem: u32,
    kv: u32,
    tok_row: u32,
    rg: u32,
    ch: u32,
    lane: u32,
) -> [[f32; 4]; 4] {
    let mut s = [[0.0f32; 4]; 4];
    let a_row = rg * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
    let a_half = lane / 16;
    if L::S_TILES >= 4 {
        // Two pairs of 8-token tiles per k-step: ldmatrix.x4 gives (tile, k-half) x 2.
        let b_row0 = ch * 32 + (lane % 8) + (lane / 16) * 8;
        let b_half = (lane / 8) % 2;
        for ks in 0..(D_QK / 16) as u32 {
            // SAFETY: rows < 64 and chunks < 72 address the Q and KV tiles; warp converged.
            unsafe {
                let a = ldmatrix::ldmatrix_x4(q_smem + qk_off(a_row, ks * 2 + a_half));
                let b0 = ldmatrix::ldmatrix_x4(kv + qk_off(b_row0, ks * 2 + b_half));
                let b1 = ldmatrix::ldmatrix_x4(kv + qk_off(b_row0 + 16, ks * 2 + b_half));
                H::mma(&mut s[0], a, [b0[0], b0[1]]);
                H::mma(&mut s[1], a, [b0[2], b0[3]]);
                H::mma(&mut s[2], a, [b1[0], b1[1]]);
                H::mma(&mut s[3], a, [b1[2], b1[3]]);
            }
        }
    } else {
        // One 8-token tile: ldmatrix.x4 gives the four 8-dim chunks of two k-steps. Four
        // accumulators (one per k-step mod 4) keep the dependent MMA chain 9 deep, not 36.
        let b_row = tok_row + (lane % 8);
        let b_chunk = lane / 8;
        for kq in 0..(D_QK / 64) as u32 {
            unroll!(h in [0, 1] {
                let kp = 2 * kq + h as u32;
                // SAFETY: as above.
                unsafe {
                    let a0 = ldmatrix::ldmatrix_x4(q_smem + qk_off(a_row, kp * 4 + a_half));
                    let a1 = ldmatrix::ldmatrix_x4(q_smem + qk_off(a_row, kp * 4 + 2 + a_half));
                    let b = ldmatrix::ldmatrix_x4(kv + qk_off(b_row, kp * 4 + b_chunk));
                    H::mma(&mut s[2 * h], a0, [b[0], b[1]]);
                    H::mma(&mut s[2 * h + 1], a1, [b[2], b[3]]);
                }
            });
        }
        unroll!(e in [0, 1, 2, 3] {
            s[0][e] = (s[0][e] + s[1][e]) + (s[2][e] + s[3][e]);
        });
    }
    s
}

/// O (16 rows x 512/CS dims of ch) += P[rows of rg, 64 tokens] . V[64 tokens, dims of ch].
///
/// V tile n-pair `np` (16 dims) of lane `l` sits in swizzled chunk
/// `ch*64/CS + 8*(np/4) + ((2*(np%4) + l/16) ^ (row % 8))`: four per-lane column offsets plus
/// a constant 128 bytes per `np / 4`, so the addresses fold into immediates.
///
/// Tokens 0..32 are rows of `kv`, tokens 32..64 rows of `kv + hi_delta` (wrapping): two
/// ring slots, or with `hi_delta = 32 rows` the two halves of one stage.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_tile_gemm<H: Half16, L: Layout>(
    o: &mut [[f32; 4]; O_TILES_MAX],
    p_smem: u32,
    kv: u32,
    hi_delta: u32,
    rg: u32,
    ch: u32,
    lane: u32,
) {
    let a_row = rg * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
    let a_half = lane / 16;
    let v_row = (lane % 8) + ((lane / 8) % 2) * 8;
    let sw = v_row & 7;
    let col = |q: u32| (ch * (L::O_TILES as u32) + ((2 * q + lane / 16) ^ sw)) << 4;
    let vcol = [col(0), col(1), col(2), col(3)];
    for kk in 0..(BLOCK_N / 16) {
        // SAFETY: P rows < 64, chunks < 8; V rows < 64, chunks < 64 (of 72); converged.
        unsafe {
            let a = ldmatrix::ldmatrix_x4(p_smem + p_off(a_row, kk * 2 + a_half));
            // Branch-free, so the k-step loop keeps its shape.
            let half = kv.wrapping_add((kk / (HALF_N / 16)).wrapping_mul(hi_delta));
            let vbase = half + ((kk % (HALF_N / 16)) * 16 + v_row) * ROW_BYTES;
            unroll!(np in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                if np < L::O_TILES / 2 {
                    let v = ldmatrix::ldmatrix_x4_trans(vbase + vcol[np % 4] + (np as u32 / 4) * 128);
                    H::mma(&mut o[2 * np], a, [v[0], v[1]]);
                    H::mma(&mut o[2 * np + 1], a, [v[2], v[3]]);
                }
            });
        }
    }
}

/// The decode kernel body.
///
/// # Safety
/// Launched with the grid, block and shared memory documented above, on params that the
/// host validated (shapes, strides, alignment, workspace capacity).
#[inline(always)]
pub unsafe fn decode<K: DecodeKind, L: Layout>(p: DecodeParams) {
    // The 16-row tile with an fp8 cache converts in registers where the arch converts fp8
    // in hardware (super::f8); this body's shared-memory conversion pass elsewhere.
    #[cfg(mla_hw_fp8)]
    if K::KV_FP8 && L::RING {
        // SAFETY: forwarded from the caller (the 16-row layout, an fp8 cache).
        unsafe { super::f8::decode_fp8::<K, 1>(p) };
        return;
    }
    let (tile, b, split) = cta_coords();
    let Some(CtaWork {
        len,
        glen,
        nsplit,
        kb0,
        kb1,
    }) = cta_work(&p, split, b)
    else {
        return;
    };
    let row0 = tile * L::BM;

    let tid = arch::thread_idx_x();
    let warp = tid / 32;
    let lane = tid % 32;
    let rg = warp % L::RG;
    let ch = warp / L::RG;
    let g = lane / 4;
    let c4 = lane % 4;
    // The ring (16-row tile, 16-bit cache) or two full stages.
    let ring = L::RING && !K::KV_FP8;
    // The KV row this thread copies in every block (ring: in every half-block).
    let kv_r = if ring { tid / HALF_TPR } else { tid / KV_TPR };

    let base = smem::smem_base();
    let q_smem = base + if ring { T::SMEM_RING_Q } else { T::SMEM_Q } as u32;
    let kv_tile = |s: u32| base + T::SMEM_KV as u32 + s * T::QK_TILE_BYTES as u32;
    let raw_stage = |s: u32| base + T::SMEM_FP8_STAGE as u32 + s * T::FP8_STAGE_BYTES as u32;
    let stage_of = |s: u32| if K::KV_FP8 { raw_stage(s) } else { kv_tile(s) };
    // Ring slot of half-block `h` (counted from the chunk's first half-block).
    let slot = |h: u32| base + T::SMEM_RING as u32 + (h % RING_SLOTS) * HALF_TILE_BYTES;
    let p_smem = base + if ring { T::SMEM_RING_P } else { T::SMEM_P } as u32;
    let red = base + if ring { T::SMEM_RING_RED } else { T::SMEM_RED } as u32;

    // Causal visibility of this thread's two rows (g and g + 8 of its row group).
    let row_a = row0 + rg * 16 + g;
    let vis_r = [
        visible(&p, len, glen, row_a),
        visible(&p, len, glen, row_a + 8),
    ];
    let scale_log2 = p.softmax_scale * LOG2E;

    // Ring: half-blocks h = 0 .. 2 (kb1 - kb0) of the chunk, tokens kb0 * 64 + 32 h ..;
    // one commit group per half-block, empty past the chunk.
    let halves = 2 * (kb1 - kb0);
    let half_n0 = |h: u32| kb0 * BLOCK_N + h * HALF_N;
    let half_entry = |h: u32| {
        if h < halves {
            kv_row_page_entry(&p, b, half_n0(h) + kv_r, len)
        } else {
            -1
        }
    };

    // SAFETY (whole pipeline): every smem address below stays inside the regions of
    // decode_tile; every barrier is reached by all threads (loop bounds are CTA-uniform).
    unsafe {
        load_q_tile::<K, L>(&p, b, row0, q_smem, qk_off);
        if ring {
            // Half-blocks 0 .. RING_AHEAD (group 0 also holds Q).
            unroll!(h in [0, 1, 2, 3] {
                let h = h as u32;
                if h < RING_AHEAD {
                    if h < halves {
                        issue_kv_row::<K, HALF_TPR>(&p, half_entry(h), half_n0(h), slot(h));
                    }
                    cp_async::cp_async_commit_group();
                }
            });
        } else {
            if kb0 < kb1 {
                let page = kv_row_page_entry(&p, b, kb0 * BLOCK_N + kv_r, len);
                issue_kv_row::<K, KV_TPR>(&p, page, kb0 * BLOCK_N, stage_of(0));
            }
            cp_async::cp_async_commit_group();
        }
    }
    // This thread's KV row's page-table entries for the next issue, loaded one issue
    // ahead: the next block, or (ring) the next two half-blocks.
    let mut next_entry = if ring {
        [half_entry(RING_AHEAD), half_entry(RING_AHEAD + 1)]
    } else if kb0 + 1 < kb1 {
        [
            kv_row_page_entry(&p, b, (kb0 + 1) * BLOCK_N + kv_r, len),
            -1,
        ]
    } else {
        [-1, -1]
    };

    let mut o = [[0.0f32; 4]; O_TILES_MAX];
    let mut m_run = [f32::NEG_INFINITY; 2];
    let mut l_run = [0.0f32; 2];

    let mut kb = kb0;
    let mut stage = 0u32;
    while kb < kb1 {
        let hb = 2 * (kb - kb0);
        // SAFETY: see above.
        unsafe {
            if ring {
                // Wait for hb and hb + 1 (one newer half-block, hb + 2, may stay in
                // flight); once every thread is past the barrier, block kb - 1's slots, P
                // and the exchange are free (their last readers ran before it), so
                // half-blocks hb + RING_AHEAD and the next go there, leaving RING_AHEAD
                // half-blocks in flight, and no barrier is needed after the P.V.
                cp_async::cp_async_wait_group::<{ RING_AHEAD - 2 }>();
                sync::bar_sync();
                unroll!(i in [0, 1] {
                    let h = hb + RING_AHEAD + i as u32;
                    if h < halves {
                        issue_kv_row::<K, HALF_TPR>(&p, next_entry[i], half_n0(h), slot(h));
                    }
                    cp_async::cp_async_commit_group();
                });
                next_entry = [
                    half_entry(hb + RING_AHEAD + 2),
                    half_entry(hb + RING_AHEAD + 3),
                ];
            } else {
                if kb + 1 < kb1 {
                    issue_kv_row::<K, KV_TPR>(
                        &p,
                        next_entry[0],
                        (kb + 1) * BLOCK_N,
                        stage_of(stage ^ 1),
                    );
                    if kb + 2 < kb1 {
                        next_entry[0] = kv_row_page_entry(&p, b, (kb + 2) * BLOCK_N + kv_r, len);
                    }
                }
                cp_async::cp_async_commit_group();
                cp_async::cp_async_wait_group::<1>();
                sync::bar_sync();
            }
        }
        // Where this block's tokens 0..32 and 32..64 are.
        let (kv_lo, kv_hi) = if ring {
            (slot(hb), slot(hb + 1))
        } else {
            let kv = if K::KV_FP8 {
                // SAFETY: see above.
                unsafe {
                    convert_fp8_stage::<K>(raw_stage(stage), kv_tile(0));
                    sync::bar_sync();
                }
                kv_tile(0)
            } else {
                kv_tile(stage)
            };
            (kv, kv + HALF_N * ROW_BYTES)
        };
        // The warp's QK^T tokens: all 64 (row base 0 of kv_lo) with 4 tiles per warp, else
        // 8 tokens at ch * 8, in the half that holds them.
        let (kv_qk, tok_row) = if L::S_TILES >= 4 {
            (kv_lo, 0)
        } else if ch * 8 < HALF_N {
            (kv_lo, ch * 8)
        } else {
            (kv_hi, ch * 8 - HALF_N)
        };

        // SAFETY: see above.
        let mut s = unsafe { qk_tile_gemm::<K::Mma, L>(q_smem, kv_qk, tok_row, rg, ch, lane) };

        // Mask, scale to log2 units, local row maxima.
        let n_base = kb * BLOCK_N + ch * (BLOCK_N / L::CS) + 2 * c4;
        let mut m_loc = [f32::NEG_INFINITY; 2];
        unroll!(nt in [0, 1, 2, 3] {
            if nt < L::S_TILES {
                unroll!(e in [0, 1, 2, 3] {
                    let j = n_base + nt as u32 * 8 + (e % 2) as u32;
                    let x = if j < vis_r[e / 2] { s[nt][e] * scale_log2 } else { f32::NEG_INFINITY };
                    s[nt][e] = x;
                    m_loc[e / 2] = sync::fmax(m_loc[e / 2], x);
                });
            }
        });
        // SAFETY: converged warp; red holds [CS][BM] f32 (128 floats); barrier reached by
        // all threads.
        let m_new = unsafe {
            let m0 = quad_max(m_loc[0]);
            let m1 = quad_max(m_loc[1]);
            if c4 == 0 {
                smem::st_shared_f32(red + (ch * L::BM + rg * 16 + g) * 4, m0);
                smem::st_shared_f32(red + (ch * L::BM + rg * 16 + g + 8) * 4, m1);
            }
            sync::bar_sync();
            [
                sync::fmax(m_run[0], red_max::<L>(red, rg * 16 + g)),
                sync::fmax(m_run[1], red_max::<L>(red, rg * 16 + g + 8)),
            ]
        };
        let (m_ref, alpha) = rescale_rows(&mut m_run, &mut l_run, m_new);

        // Probabilities: to the P tile as 16-bit, row sums in f32.
        unroll!(nt in [0, 1, 2, 3] {
            if nt < L::S_TILES {
                let p0 = sync::ex2(s[nt][0] - m_ref[0]);
                let p1 = sync::ex2(s[nt][1] - m_ref[0]);
                let p2 = sync::ex2(s[nt][2] - m_ref[1]);
                let p3 = sync::ex2(s[nt][3] - m_ref[1]);
                l_run[0] += p0 + p1;
                l_run[1] += p2 + p3;
                let col_chunk = ch * L::S_TILES as u32 + nt as u32;
                let r_a = rg * 16 + g;
                // SAFETY: rows < BM, chunk < 8: inside the P tile.
                unsafe {
                    smem::st_shared_u32(p_smem + p_off(r_a, col_chunk) + 4 * c4, K::Mma::pack2(p0, p1));
                    smem::st_shared_u32(p_smem + p_off(r_a + 8, col_chunk) + 4 * c4, K::Mma::pack2(p2, p3));
                }
            }
        });
        unroll!(i in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
            if i < L::O_TILES {
                o[i][0] *= alpha[0];
                o[i][1] *= alpha[0];
                o[i][2] *= alpha[1];
                o[i][3] *= alpha[1];
            }
        });
        // SAFETY: see above.
        unsafe {
            sync::bar_sync();
            pv_tile_gemm::<K::Mma, L>(
                &mut o,
                p_smem,
                kv_lo,
                kv_hi.wrapping_sub(kv_lo),
                rg,
                ch,
                lane,
            );
            // Two stages: the next issue (before the top barrier) overwrites this block's
            // stage, P and the exchange, so every thread must be past this P.V first. The
            // ring issues after its top barrier and needs none here.
            if !ring {
                sync::bar_sync();
            }
        }
        kb += 1;
        stage ^= 1;
    }
    // Drain the (possibly empty) last group before the CTA may exit.
    cp_async::cp_async_wait_group::<0>();

    // Row sums: quad reduce, then add the other column splits' through shared memory.
    // SAFETY: converged warps; barriers reached by all threads; red holds [CS][BM] f32.
    let l_tot = unsafe {
        let l0 = quad_sum(l_run[0]);
        let l1 = quad_sum(l_run[1]);
        sync::bar_sync();
        if c4 == 0 {
            smem::st_shared_f32(red + (ch * L::BM + rg * 16 + g) * 4, l0);
            smem::st_shared_f32(red + (ch * L::BM + rg * 16 + g + 8) * 4, l1);
        }
        sync::bar_sync();
        [
            red_sum::<L>(red, rg * 16 + g),
            red_sum::<L>(red, rg * 16 + g + 8),
        ]
    };
    // SAFETY: the host sized out/lse and the workspace for these indices (validated).
    unsafe { write_rows::<K, L>(&p, &o, l_tot, m_run, b, row_a, split, nsplit, ch, c4) };
}
