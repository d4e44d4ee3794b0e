// The bitonic network as the base case of the long-row sorts: see [Note: bitonic network].
#include "sort/bitonic/variants.h"

#include <c10/util/Exception.h>

namespace poptorch_sim {
namespace sorting {
namespace bitonic {

namespace {

// The items' loops compiled for each SIMD level, the network out of line in its variant's file
// (sort_row_items_once in bitonic_<variant>.cpp): this file compiles no copy of its own.
constexpr int64_t kBaseBuffer = 2 * padded_size(kBitonicBaseMax, 8);

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
