/* mla: MLA decode attention over a paged latent KV cache (C ABI of libmla.so).
 *
 * Every function returns MLA_OK (0) or a negative status; mla_last_error() gives the text
 * of this thread's last error (field, expected and received value for bad input).
 * Layouts: q [batch, s_q, heads, 576], kv_cache [num_pages, page_size, 576],
 * page_table [batch, max_pages] int32, seq_lens [batch] int32 (lengths including this
 * step's s_q tokens), out [batch, s_q, heads, 512] (bf16; fp16 for fp16 q/kv),
 * lse [batch, s_q, heads] float (natural log). Causal rule for s_q > 1: query token t sees
 * KV positions 0 .. seq_len - s_q + t. */
#ifndef MLA_H
#define MLA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MLA_OK 0
#define MLA_ERR_INVALID (-1)
#define MLA_ERR_UNSUPPORTED (-2)
#define MLA_ERR_NO_DEVICE (-3)
#define MLA_ERR_CUDA (-4)
#define MLA_ERR_INTERNAL (-5)

#define MLA_BF16 0u
#define MLA_FP16 1u
#define MLA_FP8_E4M3 2u

typedef struct MlaRuntime MlaRuntime;
typedef struct MlaPlan MlaPlan;

typedef struct MlaPlanConfig {
  uint32_t max_batch, heads, s_q, page_size, max_seq_len;
  uint32_t q_dtype, kv_dtype;
  uint32_t waves; /* 0: default tactic */
  uint32_t tile;  /* 0: the shape's default (16-row tile when s_q * heads <= 16 or, on sm_90a,
                     an fp8 cache with up to 32 rows; else the wgmma tile on sm_90a for bf16
                     Q, else 64-row); 1: 16-row; 2: 64-row mma.sync;
                     3: 64-row wgmma (sm_90a, bf16) */
} MlaPlanConfig;

typedef struct MlaDecodeArgs {
  uint64_t q, kv_cache, page_table, seq_lens, out, lse; /* device pointers */
  uint32_t batch, num_pages, max_pages, _pad;
  uint64_t page_table_stride; /* elements; 0: max_pages */
  uint64_t kv_page_stride;    /* elements; 0: page_size * 576 */
  float softmax_scale, output_scale, q_scale, kv_scale;
} MlaDecodeArgs;

/* Loads the kernels on device `ordinal` (its primary context). */
int mla_runtime_create(int ordinal, MlaRuntime **out);
void mla_runtime_destroy(MlaRuntime *rt);
/* Allocates the plan's workspace and synchronises: not during graph capture. */
int mla_plan_create(const MlaRuntime *rt, const MlaPlanConfig *cfg, MlaPlan **out);
void mla_plan_destroy(MlaPlan *plan);
/* One decode step on `stream` (a CUstream): launches only, capturable in a CUDA graph. */
int mla_decode_run(const MlaRuntime *rt, const MlaPlan *plan, const MlaDecodeArgs *args, void *stream);
const char *mla_last_error(void);

#ifdef __cplusplus
}
#endif
#endif /* MLA_H */
