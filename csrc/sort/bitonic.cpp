// The bitonic network as the base case of the long-row sorts: see [Note: bitonic network].
#include "sort/bitonic/variants.h"

#include <c10/util/Exception.h>

namespace poptorch_sim {
namespace sorting {
namespace bitonic {

namespace {

constexpr int64_t kBaseBuffer = padded_size(kBitonicBaseMax, 8);

// GCC 12 cannot see that n <= kBitonicBaseMax keeps the network inside buf, and warns about the
// network's loops for longer rows (-Warray-bounds), which these calls never run; nor that
// sort_items fills buf (items, then padding) before its first load (-Wmaybe-uninitialized).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

POPSIM_AVX512 void sort_small_avx512(uint64_t* items, int64_t n) {
  int64_t buf[kBaseBuffer];
  native::sort_items<8>(items, n, buf);
}

POPSIM_AVX2 void sort_small_avx2(uint64_t* items, int64_t n) {
  int64_t buf[kBaseBuffer];
  native::sort_items<4>(items, n, buf);
}

void sort_small_base(uint64_t* items, int64_t n) {
  int64_t buf[kBaseBuffer];
  native::sort_items<2>(items, n, buf);
}

#pragma GCC diagnostic pop

}  // namespace

std::atomic<bool> stream_mid_rows_setting{false};

bool set_stream_mid_rows(bool stream) { return stream_mid_rows_setting.exchange(stream); }

void sort_small(uint64_t* items, int64_t n, simd::Level level) {
  TORCH_CHECK(n <= kBitonicBaseMax, "poptorch_sim: bitonic::sort_small got ", n, " items");
  simd::pick(level, &sort_small_avx512, &sort_small_avx2, &sort_small_base)(items, n);
}

}  // namespace bitonic
}  // namespace sorting
}  // namespace poptorch_sim
