// Does the order in which a CTA reads a paged MLA cache's blocks change the DRAM rate?
//
// Every CTA (one per SM by default) streams its share of a cache of 64-token pages, rows of
// 1152 bytes (576 bf16), through plain 16-byte loads, 36 per thread and page (128 threads: a
// page's 72 KB), in one of four orders:
//   slab   chunk s (128 bytes) of all 64 rows, then chunk s + 1: how the decodes' slab copies
//          read a block (nine 64-row x 128-byte boxes);
//   row    the nine chunks of 16 rows, then the next 16 rows: each row's 1152 bytes read back
//          to back;
//   split  the row order on the cache split as the peers' harness hands it to FlashInfer: the
//          512 latent dims of every page in one tensor (1024-byte rows), the 64 rope dims in
//          another (128-byte rows), a row's eight latent pieces then its rope piece;
//   linear consecutive 2 KB runs of the page (the bound).
// `--gap NS` sleeps each thread NS ns after each 8 KB of its CTA's loads (four loads a
// thread), as the decodes' ring issues a slab when its slot frees, not a block at once.
// The page table is shuffled unless `--linear-table`. Prints each order's GB/s and its share
// of a device-to-device copy (bytes read + written) measured in the same process.
//
// Build (here; the GPU machine runs the binary, it needs only the driver):
//   C=$(ls -d .venv/lib/python3*/site-packages/nvidia/cu13)
//   $C/bin/nvcc -arch=sm_90a -O3 -cudart static -I$C/include -L$C/lib tools/dram_order.cu \
//       -o stage/dram_order
// Run: stage/dram_order [--gap NS] [--pages N] [--ctas N] [--linear-table] [--reps N]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

namespace {

constexpr int kRow = 1152;            // bytes of one token's row
constexpr int kRows = 64;             // tokens a page
constexpr int kPage = kRow * kRows;   // 73728 bytes
constexpr int kThreads = 128;
constexpr int kLoads = kPage / (kThreads * 16);  // 36 loads a thread and page

__device__ __forceinline__ uint4 load(const uint8_t* p) {
  uint4 v;
  // volatile: the loads keep the order written here.
  asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// Byte offset in the cache of load k (0..36) of thread t in page `page` of `pages`, by order.
template <int kOrder>
__device__ __forceinline__ size_t offset(int k, int t, size_t page, size_t pages) {
  const int r0 = t / 8, c = t % 8;  // 16 rows an instruction, eight 16-byte pieces a row
  if (kOrder == 0) {                // slab: k = 4 s + i
    const int s = k / 4, i = k % 4;
    return page * kPage + (r0 + 16 * i) * kRow + s * 128 + c * 16;
  } else if (kOrder == 1) {         // row: k = 9 i + s
    const int i = k / 9, s = k % 9;
    return page * kPage + (r0 + 16 * i) * kRow + s * 128 + c * 16;
  } else if (kOrder == 2) {         // split: latent pages (64 KB each), then rope pages (8 KB)
    const int i = k / 9, s = k % 9;
    const int row = r0 + 16 * i;
    if (s < 8) return page * (kRows * 1024) + row * 1024 + s * 128 + c * 16;
    return pages * (kRows * 1024) + page * (kRows * 128) + row * 128 + c * 16;
  } else {                          // linear
    return page * kPage + k * (kThreads * 16) + t * 16;
  }
}

template <int kOrder>
__global__ void __launch_bounds__(kThreads)
    stream(const uint8_t* __restrict__ cache, const int* __restrict__ table, int pages,
           int per_cta, unsigned gap_ns, uint4* __restrict__ sink) {
  const int t = threadIdx.x;
  uint4 acc = make_uint4(0, 0, 0, 0);
  const int p0 = blockIdx.x * per_cta;
  const int p1 = min(p0 + per_cta, pages);
  for (int p = p0; p < p1; ++p) {
    const size_t page = static_cast<size_t>(table[p]);
    uint4 v[kLoads];
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      v[k] = load(cache + offset<kOrder>(k, t, page, pages));
      // (The warp barrier keeps ptxas from hoisting the next loads above the sleep.)
      if (gap_ns != 0 && k % 4 == 3) {
        __nanosleep(gap_ns);
        __syncwarp();
      }
    }
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      acc.x ^= v[k].x;
      acc.y ^= v[k].y;
      acc.z ^= v[k].z;
      acc.w ^= v[k].w;
    }
  }
  sink[blockIdx.x * kThreads + t] = acc;
}

#define CHECK(x)                                                                \
  do {                                                                          \
    cudaError_t e = (x);                                                        \
    if (e != cudaSuccess) {                                                     \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e));              \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int pages = 16384;  // 1.2 GB: B=64 L=16384's cache
  int ctas = 0;
  int reps = 20;
  unsigned gap = 0;
  bool shuffle = true;
  for (int i = 1; i < argc; ++i) {
    auto next = [&]() { return i + 1 < argc ? std::atoi(argv[++i]) : 0; };
    if (!std::strcmp(argv[i], "--pages")) pages = next();
    else if (!std::strcmp(argv[i], "--ctas")) ctas = next();
    else if (!std::strcmp(argv[i], "--reps")) reps = next();
    else if (!std::strcmp(argv[i], "--gap")) gap = static_cast<unsigned>(next());
    else if (!std::strcmp(argv[i], "--linear-table")) shuffle = false;
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  if (ctas <= 0) ctas = prop.multiProcessorCount;
  const size_t bytes = static_cast<size_t>(pages) * kPage;
  uint8_t* cache;
  CHECK(cudaMalloc(&cache, bytes));
  CHECK(cudaMemset(cache, 0x5a, bytes));
  std::vector<int> h_table(pages);
  std::iota(h_table.begin(), h_table.end(), 0);
  if (shuffle) std::shuffle(h_table.begin(), h_table.end(), std::mt19937(1234));
  int* table;
  CHECK(cudaMalloc(&table, pages * sizeof(int)));
  CHECK(cudaMemcpy(table, h_table.data(), pages * sizeof(int), cudaMemcpyHostToDevice));
  uint4* sink;
  CHECK(cudaMalloc(&sink, static_cast<size_t>(ctas) * kThreads * sizeof(uint4)));
  uint8_t* flush;
  const size_t flush_bytes = 256u << 20;
  CHECK(cudaMalloc(&flush, flush_bytes));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));

  // The copy: half the cache onto the other half, bytes read + written.
  std::vector<float> ms;
  for (int r = 0; r < reps; ++r) {
    CHECK(cudaEventRecord(e0));
    CHECK(cudaMemcpyAsync(cache + bytes / 2, cache, bytes / 2, cudaMemcpyDeviceToDevice));
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float m;
    CHECK(cudaEventElapsedTime(&m, e0, e1));
    ms.push_back(m);
  }
  const double copy = static_cast<double>(bytes) / (median(ms) * 1e-3) / 1e9;
  std::printf("%s, %d SMs; cache %.2f GB (%d pages of 64 x 1152 B, table %s); %d CTAs x %d "
              "threads; gap %u ns\n",
              prop.name, prop.multiProcessorCount, bytes / 1e9, pages,
              shuffle ? "shuffled" : "linear", ctas, kThreads, gap);
  std::printf("copy (read + write): %.0f GB/s\n", copy);

  const int per_cta = (pages + ctas - 1) / ctas;
  const char* names[] = {"slab", "row", "split", "linear"};
  for (int order = 0; order < 4; ++order) {
    ms.clear();
    for (int r = 0; r < reps + 2; ++r) {
      CHECK(cudaMemsetAsync(flush, r, flush_bytes));
      CHECK(cudaEventRecord(e0));
      if (order == 0) stream<0><<<ctas, kThreads>>>(cache, table, pages, per_cta, gap, sink);
      if (order == 1) stream<1><<<ctas, kThreads>>>(cache, table, pages, per_cta, gap, sink);
      if (order == 2) stream<2><<<ctas, kThreads>>>(cache, table, pages, per_cta, gap, sink);
      if (order == 3) stream<3><<<ctas, kThreads>>>(cache, table, pages, per_cta, gap, sink);
      CHECK(cudaGetLastError());
      CHECK(cudaEventRecord(e1));
      CHECK(cudaEventSynchronize(e1));
      float m;
      CHECK(cudaEventElapsedTime(&m, e0, e1));
      if (r >= 2) ms.push_back(m);
    }
    const double us = median(ms) * 1e3;
    const double gbs = static_cast<double>(bytes) / (us * 1e-6) / 1e9;
    std::printf("%-7s %9.1f us %7.0f GB/s %6.1f%% of copy\n", names[order], us, gbs,
                100.0 * gbs / copy);
  }
  return 0;
}
