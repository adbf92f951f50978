/* mla: MLA decode attention over a paged latent KV cache (C ABI of libmla.so).
 *
 * Status: every function but the destroy functions returns MLA_OK (0) or a negative
 * status. mla_last_error() gives the text of this thread's last error (the field, the
 * expected and the received value for bad input); it is empty after a call that
 * succeeded, and the pointer is valid until this thread's next mla_* call. Bad input is refused before any device pointer is touched. Nothing unwinds
 * across this ABI: a panic inside the library is caught (MLA_ERR_INTERNAL; the destroy
 * functions catch and drop it). A handle is freed by its destroy function: using it after,
 * or destroying it twice, is undefined, as with free().
 *
 * Layouts: q [batch, s_q, heads, 576], kv_cache [num_pages, page_size, 576] (rows of 576
 * contiguous elements: 512 latent + 64 rope; pages kv_page_stride elements apart),
 * page_table [batch, max_pages] int32 (rows page_table_stride apart), seq_lens [batch]
 * int32 (lengths including this step's s_q tokens), out [batch, s_q, heads, 512] (bf16;
 * fp16 for fp16 q/kv), lse [batch, s_q, heads] float (natural log of the softmax
 * denominator, with the softmax scale applied to the logits).
 * Alignment (MLA_ERR_INVALID otherwise): q, q_pe, kv_cache, kpe_cache, out and the gather /
 * append rows 16-byte aligned, and so every stride of theirs in bytes (kv_page_stride,
 * kv_token_stride, kpe_*_stride: for an fp8 cache a multiple of 16 elements); page_table,
 * seq_lens and lse 4-byte aligned; merge outs and out 8-byte aligned. Outputs must not
 * overlap any input or each other.
 *
 * Semantics:
 * - Causal rule for s_q > 1: query token t sees KV positions 0 .. seq_len - s_q + t.
 * - A sequence with seq_len <= 0 is padding: none of its out or lse rows are written.
 * - A query token that sees no position (seq_len < s_q, token t < s_q - seq_len) gets an
 *   out row of zeros and lse -inf (a NaN in its query row included).
 * - A NaN in a cache row that a query row sees (or in the query row itself) makes that
 *   row's out and lse NaN, whatever the split: it is never dropped; other rows keep theirs.
 *   An infinity in the latent part (dims 0..511) of a row that only the step's later
 *   tokens see (s_q > 1) makes the earlier tokens' out rows NaN (not their lse): the
 *   tensor cores multiply an unseen key's zero weight by its value.
 * - Scales: logits are q.k * softmax_scale; with an fp8 cache also times
 *   q_scale * kv_scale, and values times kv_scale. q_scale must be 1 unless q is fp8 and
 *   kv_scale 1 unless the cache is fp8 (MLA_ERR_INVALID otherwise: a zeroed struct is not
 *   valid). softmax_scale, q_scale and kv_scale must be finite and > 0, output_scale
 *   finite, and so must the products the kernels use: softmax_scale * q_scale * kv_scale
 *   * log2(e) (finite, > 0) and output_scale * kv_scale (finite). output_scale multiplies
 *   out only; lse does not include it.
 * - The page table must hold the s_q tokens of a step: max_pages * page_size >= s_q
 *   (MLA_ERR_INVALID naming page_table otherwise; unsharded plans).
 * - A q / kv dtype pair other than bf16/bf16, fp16/fp16, bf16/fp8 and fp8/fp8 is
 *   MLA_ERR_UNSUPPORTED.
 * - Page-table entries past a sequence's pages (columns >= ceil(seq_len / page_size))
 *   are never read.
 * - A page id outside [0, num_pages) reads as zero rows (never out of bounds); a length
 *   past max_pages * page_size is cut there. Neither is an error; a plan in checked mode
 *   (mla_plan_set_checked) records the first such fault for mla_plan_fault.
 * - One plan must not run on two streams at once (its workspace holds the run in flight);
 *   use a plan per stream. Plans and runtimes may be used from any thread, but
 *   mla_plan_set_checked and mla_plan_set_shard change the plan: no other call on that
 *   plan may be in progress on any thread while they run. */
#ifndef MLA_H
#define MLA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MLA_OK 0
#define MLA_ERR_INVALID (-1)     /* bad config, request or argument; a null handle */
#define MLA_ERR_UNSUPPORTED (-2) /* a valid config no backend on this GPU runs */
#define MLA_ERR_NO_DEVICE (-3)   /* no driver or no device */
#define MLA_ERR_CUDA (-4)        /* a driver call, allocation or launch failed */
#define MLA_ERR_INTERNAL (-5)    /* a panic inside the library (a bug) */

#define MLA_BF16 0u
#define MLA_FP16 1u
#define MLA_FP8_E4M3 2u

#define MLA_FAULT_NONE 0
#define MLA_FAULT_PAGE_ID 1 /* page_table[sequence][column] = value is outside [0, num_pages) */
#define MLA_FAULT_SEQ_LEN 2 /* seq_lens[sequence] = value is past max_pages * page_size
                             * (sharded: value is this rank's share of the length) */

typedef struct MlaRuntime MlaRuntime;
typedef struct MlaPlan MlaPlan;

/* Fields outside these ranges are MLA_ERR_INVALID naming the field: max_batch 1..65535,
 * heads 1..128, s_q 1..8, page_size a power of two in 1..256, dtype codes above, tile
 * 0..4, waves 0..4. max_batch also bounds the splits per sequence (the decode grid and the
 * partials are sized for it): up to about 4 x (SMs x waves) / (row tiles x max_batch), at
 * most 128; plans of several row tiles whose max_seq_len would leave SMs idle in the last
 * round of a full batch of that length take the count that fills it, up to 8192 split cells
 * (row tiles x max_batch x splits; max_seq_len 0 or >= 2^31-1 takes none). A batch far
 * smaller than max_batch, or a bucket of max_batch sequences padded with zero lengths, gets
 * no more splits than that (a 256-sequence plan gives 8 live sequences at 128 heads 2
 * splits where an 8-sequence plan gives 8): plan per batch bucket. */
typedef struct MlaPlanConfig {
  uint32_t max_batch, heads, s_q, page_size;
  uint32_t max_seq_len; /* the longest length the plan is tuned for, a hint: longer lengths
                           run correctly; 0, or 2^31-1 and above: unknown (no split raise) */
  uint32_t q_dtype, kv_dtype;
  uint32_t waves; /* 0: default tactic */
  uint32_t tile;  /* 0: the plan's default (16-row tile when s_q * heads <= 16, but
                     bf16 on sm_90a with pages >= 16 in plans of max_batch >= 8,
                     max_seq_len >= 4096 and >= 2^19 tokens in all takes the wgmma
                     tile, whose small-row decode runs there; fp16
                     above 16 rows: the 64-row mma.sync tile; on sm_90a, 17..32 rows:
                     with an fp8 cache and pages >= 16 the wgmma tile in plans of
                     >= 65536 tokens in all (fp8 q) or >= 131072 with sequences of
                     >= 1024 (bf16 q); else two 16-row tiles in plans of sequences
                     <= 4096 tokens and <= 32768 in all (bf16 with pages >= 16:
                     <= 16384), and with an fp8 cache below 9 sequences; otherwise the
                     32-row tile (fp8 cache) or the wgmma tile (bf16); more rows: the
                     wgmma tile on sm_90a, else 64-row); 1: 16-row; 2: 64-row
                     mma.sync; 3: 64-row wgmma (sm_90a, not fp16); 4: 32-row (sm_90a,
                     fp8 cache) */
} MlaPlanConfig;

typedef struct MlaDecodeArgs {
  uint64_t q, kv_cache, page_table, seq_lens, out, lse; /* device pointers */
  uint32_t batch, num_pages, max_pages, _pad; /* batch 1..=the plan's max_batch; num_pages
                                                 and max_pages >= 1 (MLA_ERR_INVALID) */
  uint64_t page_table_stride; /* elements; 0: max_pages */
  uint64_t kv_page_stride;    /* elements; 0: page_size * 576 */
  float softmax_scale, output_scale, q_scale, kv_scale;
} MlaDecodeArgs;

/* What a plan chose. Strings are NUL-terminated. */
typedef struct MlaPlanInfo {
  char backend[16];  /* sm90a, portable or reference */
  char tactic[64];   /* the tactic's canonical string */
  char kernels[256]; /* the kernels a run may launch, comma-separated, in launch order */
  uint64_t workspace_bytes;
  uint32_t checked, _pad;
} MlaPlanInfo;

/* A checked decode's first fault since the plan was made or last cleared. */
typedef struct MlaFault {
  int32_t kind;     /* MLA_FAULT_* */
  int32_t sequence; /* batch index */
  int32_t column;   /* page-table column (MLA_FAULT_PAGE_ID); -1 otherwise */
  int32_t value;    /* the page id or the length met */
} MlaFault;

/* A rank merge (context-parallel decode): `ranks` results of the same query rows, each
 * over its own share of the KV, merged exactly by their LSE. A rank with lse -inf for a row
 * contributes nothing (its out row is not read); a row no rank saw gets zeros and -inf; a
 * rank whose lse is NaN (or +inf) for a row makes that row NaN. Every row is written. The
 * ranks' out rows are 16-bit with output_scale applied: an fp16 rank value past the fp16
 * range is already +-inf there (fp16 outputs overflow to infinity, not to 65504), so the
 * merge of such rows can be inf or NaN where one unsharded decode was finite. s_q
 * 1..=8, heads 1..=128, batch * s_q * heads <= 2^31 - 1; outs_rank_stride a multiple of 4
 * elements (MLA_ERR_INVALID otherwise). */
typedef struct MlaMergeArgs {
  uint64_t outs, lses, out, lse; /* device: outs [ranks][batch, s_q, heads, 512] of dtype,
                                    lses [ranks][batch, s_q, heads] float, out, lse */
  uint32_t ranks, batch, s_q, heads; /* ranks 1..64 */
  uint32_t dtype, _pad;              /* MLA_BF16 or MLA_FP16 (outs and out) */
  uint64_t outs_rank_stride;         /* elements; 0: batch * s_q * heads * 512 */
  uint64_t lses_rank_stride;         /* elements; 0: batch * s_q * heads */
} MlaMergeArgs;

/* A paged cache and its page table, for mla_append_kv and mla_gather_kv. */
typedef struct MlaPagedArgs {
  uint64_t rows;     /* device. append: the new rows [batch, n, 576] (the cache's type; bf16
                        for an fp8 cache); gather: the output [batch, n, 576] */
  uint64_t kv_cache; /* device: [num_pages, page_size, 576] of kv_dtype */
  uint64_t page_table, seq_lens; /* device: [batch, max_pages] and [batch] int32 */
  uint32_t batch, n;             /* append: n >= 1 new tokens (a step's s_q, or a prefill
                                    chunk), max_pages * page_size >= n; gather: output
                                    rows, >= 1; both n <= 2^31-1 (MLA_ERR_UNSUPPORTED
                                    above) */
  uint32_t num_pages, max_pages, page_size;
  uint32_t kv_dtype;   /* MLA_BF16, MLA_FP16 or MLA_FP8_E4M3 */
  uint32_t rows_dtype; /* gather: kv_dtype, or MLA_BF16 to dequantise an fp8 cache */
  uint32_t _pad;
  uint64_t page_table_stride; /* elements; 0: max_pages */
  uint64_t kv_page_stride;    /* elements; 0: page_size * 576 */
  float kv_scale;             /* fp8 caches (append stores saturate(x / kv_scale) rounded to
                                 nearest even; gather to bf16 multiplies): finite, > 0; 1
                                 otherwise */
  uint32_t _pad2;
} MlaPagedArgs;

/* Loads the kernels on device `ordinal` (>= 0; its primary context). */
int mla_runtime_create(int ordinal, MlaRuntime **out);
void mla_runtime_destroy(MlaRuntime *rt); /* NULL is ignored; destroy its plans first */
/* Allocates the plan's workspace and synchronises: not while any stream of the device is
 * capturing a graph. A plan runs with any runtime of its device (MLA_ERR_INVALID naming rt
 * for another device's, before any launch). */
int mla_plan_create(const MlaRuntime *rt, const MlaPlanConfig *cfg, MlaPlan **out);
/* NULL is ignored; waits for the plan's work (the whole context). Not while any stream of
 * the device is capturing a graph (the context's synchronisation would invalidate that
 * capture; a context that cannot synchronize leaves the workspace allocated, leaked, rather
 * than freeing it under running work). Graphs captured with the plan use its workspace: do
 * not launch them after. */
void mla_plan_destroy(MlaPlan *plan);
int mla_plan_info(const MlaRuntime *rt, const MlaPlan *plan, MlaPlanInfo *out);
/* One decode step on `stream` (a CUstream; NULL: the legacy default stream): launches
 * only, no allocation or synchronisation, capturable in a CUDA graph. Each launch reads
 * the buffers it is given, also when eager runs and graph replays of one plan mix. */
int mla_decode_run(const MlaRuntime *rt, const MlaPlan *plan, const MlaDecodeArgs *args, void *stream);
/* Per-step scheduling, for the layers of one decode step: the split counts of a batch whose
 * lengths are at `seq_lens` ([batch] int32, device), computed on the device into the plan's
 * workspace in stream order (capturable); lengths are cut at max_pages * page_size
 * (max_pages >= 1: the layers' page-table columns), into the plan's step slot 0: the
 * slot's next mla_schedule_step (on any stream) replaces them. Runs of the plan
 * (mla_decode_run, eager or replayed) keep counts of their own and leave the steps' as
 * they are. */
int mla_schedule_step(const MlaRuntime *rt, const MlaPlan *plan, uint64_t seq_lens, uint32_t batch,
                      uint32_t max_pages, void *stream);
/* Into step slot `slot` (0..3, else MLA_ERR_INVALID naming it): one plan holds up to 4
 * steps scheduled ahead of their layers (micro-batches: slots 0 and 1), each read by
 * mla_decode_run_layer_slot of its slot. mla_schedule_step is slot 0. */
int mla_schedule_step_slot(const MlaRuntime *rt, const MlaPlan *plan, uint32_t slot,
                           uint64_t seq_lens, uint32_t batch, uint32_t max_pages, void *stream);
/* One layer of a scheduled step: mla_decode_run without the schedule, with step slot 0's
 * counts; args->batch and the contents of args->seq_lens (that buffer or another) must be
 * the ones the slot's last mla_schedule_step read (MLA_ERR_INVALID when the slot has no
 * schedule yet or args->batch is not its batch, checked at each call on the host: a graph
 * replay checks nothing; the contents are not checked). A captured mla_schedule_step
 * counts as made, but writes its counts only when its graph is launched; until then a live
 * sequence whose count is 0 (a new plan's slots hold zeros) is decoded in one split, still
 * exact. Capturable. */
int mla_decode_run_layer(const MlaRuntime *rt, const MlaPlan *plan, const MlaDecodeArgs *args,
                         void *stream);
/* mla_decode_run_layer with step slot `slot`'s counts (mla_schedule_step_slot). */
int mla_decode_run_layer_slot(const MlaRuntime *rt, const MlaPlan *plan, uint32_t slot,
                              const MlaDecodeArgs *args, void *stream);
/* Split layouts: the rope part (dims 512..575) of the cache and/or of q in tensors of their
 * own, as FlashInfer's and vLLM's paged caches keep them. Zero fields take the default;
 * kpe_page_stride or kpe_token_stride nonzero with kpe_cache 0 is MLA_ERR_INVALID. */
typedef struct MlaSplitArgs {
    uint64_t kpe_cache;        /* [num_pages, page_size, 64] of kv_dtype; kv_cache is then
                                  [num_pages, page_size, 512]. 0: the cache is fused (576) */
    uint64_t kpe_page_stride;  /* elements; 0: page_size * kpe_token_stride */
    uint64_t kpe_token_stride; /* elements; 0: 64 */
    uint64_t kv_token_stride;  /* of kv_cache, elements; 0: its width (512 split, 576 fused);
                                  args->kv_page_stride 0 is then page_size times it */
    uint64_t q_pe;             /* [batch, s_q, heads, 64] row-major of q_dtype; q is then
                                  [batch, s_q, heads, 512] row-major. 0: q is fused (576) */
} MlaSplitArgs;
/* mla_decode_run / mla_decode_run_layer on split layouts; validated as the fused layout
 * (errors name kpe_cache or q_pe and the field). A split cache never takes the TMA decodes
 * or their cp.async forms (they read fused rows): it runs the plan's own tile kernel. */
int mla_decode_run_split(const MlaRuntime *rt, const MlaPlan *plan, const MlaDecodeArgs *args,
                         const MlaSplitArgs *split, void *stream);
int mla_decode_run_layer_split(const MlaRuntime *rt, const MlaPlan *plan,
                               const MlaDecodeArgs *args, const MlaSplitArgs *split,
                               void *stream);
int mla_decode_run_layer_split_slot(const MlaRuntime *rt, const MlaPlan *plan, uint32_t slot,
                                    const MlaDecodeArgs *args, const MlaSplitArgs *split,
                                    void *stream);
/* Checked mode on (1) or off (0, as made) for the plan's runs launched from now on: each
 * decode also records the first page id outside [0, num_pages) or length past
 * max_pages * page_size it meets. Not while the plan's work is in flight; a graph captured
 * before keeps its mode. */
int mla_plan_set_checked(const MlaRuntime *rt, MlaPlan *plan, int checked);
/* Decode context parallelism for the plan's runs launched from now on: the plan's cache
 * holds rank `rank`'s share of every sequence, global token t living on rank
 * (t / interleave) % ranks at local position (t / (interleave * ranks)) * interleave +
 * t % interleave (interleave 1: round-robin tokens; page_size: whole pages, as vLLM's
 * decode context parallelism; >= ceil(longest / ranks): one contiguous range per rank).
 * seq_lens stay the global lengths on every rank; the causal rule is the global one. Every
 * row of a sequence with seq_len > 0 is written, zeros and lse -inf where the rank holds
 * none of the keys the row sees, so mla_merge of the ranks' (out, lse) is exact. ranks 0
 * or 1: off (as made). MLA_ERR_INVALID naming the field: ranks > 64, rank >= ranks,
 * interleave 0. Not while the plan's work is in flight. */
int mla_plan_set_shard(const MlaRuntime *rt, MlaPlan *plan, uint32_t rank, uint32_t ranks,
                       uint32_t interleave);
/* Context parallelism over NCCL (loaded at run time: libnccl.so on the loader's path;
 * MLA_ERR_UNSUPPORTED without it). One group end per rank: */
typedef struct MlaCp MlaCp;
/* A new group identity (128 bytes), made once and handed to every rank. */
int mla_cp_unique_id(uint8_t id[128]);
/* Join group `id` as rank `rank` of `ranks` for combines of up to max_rows query rows
 * (batch * s_q * heads) of `dtype` (MLA_BF16 / MLA_FP16) outputs; waits for every rank at
 * most timeout_ms (> 0) and checks that all passed the same ranks, max_rows and dtype.
 * Each rank's plan must be sharded with the same interleave and its cache laid out by it
 * (mla_plan_set_shard): the group does not compare interleaves. */
int mla_cp_create(const MlaRuntime *rt, uint32_t rank, uint32_t ranks, const uint8_t id[128],
                  uint32_t max_rows, uint32_t dtype, uint32_t timeout_ms, MlaCp **out);
/* One step on this rank: the plan (mla_plan_set_shard to this rank of the group) decodes
 * args into args->out / args->lse, then every rank's are all-gathered and merged into
 * out ([batch, s_q, heads, 512], the plan's out dtype) and lse ([batch, s_q, heads] f32).
 * As in mla_decode_run, the rows of a padding sequence (seq_len <= 0) are not written, in
 * args->out / args->lse nor in out / lse.
 * A plan sharded for another group is MLA_ERR_INVALID before any launch. Capturable. The
 * group's combines share its gather buffers: keep them on one stream (as NCCL orders a
 * communicator's collectives), or wait between streams. */
int mla_cp_decode(const MlaRuntime *rt, MlaCp *cp, const MlaPlan *plan,
                  const MlaDecodeArgs *args, uint64_t out, uint64_t lse, void *stream);
/* Waits for stream at most the group's timeout; an NCCL error or a lost peer aborts the
 * group (MLA_ERR_CUDA) instead of hanging. Not during graph capture (MLA_ERR_UNSUPPORTED;
 * the group stays usable). */
int mla_cp_wait(MlaCp *cp, void *stream);
/* NULL is ignored. Waits for the last eager combine (at most the group's timeout; past it
 * the group is aborted) before freeing its buffers; replays of a captured combine must be
 * done, and its graphs not replayed after. Not during graph capture. */
void mla_cp_destroy(MlaCp *cp);
/* Checked plans only: waits for `stream`, then writes the first fault (kind
 * MLA_FAULT_NONE: none). Not during graph capture. */
int mla_plan_fault(const MlaRuntime *rt, const MlaPlan *plan, void *stream, MlaFault *out);
/* Checked plans only: empties the fault record in stream order (capturable). */
int mla_plan_clear_fault(const MlaRuntime *rt, const MlaPlan *plan, void *stream);
/* Merges the ranks' results on `stream` (capturable). */
int mla_merge(const MlaRuntime *rt, const MlaMergeArgs *args, void *stream);
/* Writes each sequence's n new rows at positions seq_len - n .. seq_len - 1 of its pages
 * (capturable). A length <= 0 is padding (nothing written), as is a length below n; a page
 * id outside [0, num_pages) is skipped, as is a position at or past max_pages * page_size. Two new rows the table maps to one slot are written
 * in no defined order. Both paged calls take batch <= 65535 (MLA_ERR_UNSUPPORTED above). */
int mla_append_kv(const MlaRuntime *rt, const MlaPagedArgs *args, void *stream);
/* Copies each sequence's rows 0 .. min(seq_len, max_pages * page_size, n) - 1 out of its
 * pages into rows[b] (capturable; a length is cut at the table's capacity, as the decode
 * cuts it); rows past them are not written; a page id outside [0, num_pages) reads as
 * zeros. */
int mla_gather_kv(const MlaRuntime *rt, const MlaPagedArgs *args, void *stream);
/* mla_append_kv / mla_gather_kv on a split or padded cache: `split` gives the rope part
 * (kpe_cache; kv_cache is then [num_pages, page_size, 512]) and the token strides as
 * mla_decode_run_split reads them; args->kv_page_stride 0 is page_size times the token
 * stride. split->q_pe must be 0. Gather rows stay 576 wide. */
int mla_append_kv_split(const MlaRuntime *rt, const MlaPagedArgs *args,
                        const MlaSplitArgs *split, void *stream);
int mla_gather_kv_split(const MlaRuntime *rt, const MlaPagedArgs *args,
                        const MlaSplitArgs *split, void *stream);
/* This thread's last error; empty after a call that succeeded (the destroy functions
 * leave it as it was, so it can be read after cleaning up). */
const char *mla_last_error(void);
/* The library's version (each pointer may be NULL). */
int mla_get_version(uint32_t *major, uint32_t *minor, uint32_t *patch);

#ifdef __cplusplus
}
#endif
#endif /* MLA_H */
