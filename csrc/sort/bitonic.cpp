// The bitonic network as the base case of the long-row sorts: see [Note: bitonic network].
#include "sort/bitonic/variants.h"

#include <c10/util/Exception.h>

namespace poptorch_sim {
namespace sorting {
namespace bitonic {

namespace {

// The variants' networks out of line (sort_row_items_once, defined in bitonic_<variant>.cpp):
// this file compiles no copy of its own.
template <int W>
void sort_small_lanes(uint64_t* items, int64_t n) {
  int64_t buf[2 * padded_size(kBitonicBaseMax, W)];
  native::sort_items<W>(items, n, buf);
}

}  // namespace

std::atomic<bool> stream_mid_rows_setting{false};

bool set_stream_mid_rows(bool stream) { return stream_mid_rows_setting.exchange(stream); }

void sort_small(uint64_t* items, int64_t n, simd::Level level) {
  TORCH_CHECK(n <= kBitonicBaseMax, "poptorch_sim: bitonic::sort_small got ", n, " items");
  simd::pick(level, &sort_small_lanes<8>, &sort_small_lanes<4>, &sort_small_lanes<2>)(items, n);
}

}  // namespace bitonic
}  // namespace sorting
}  // namespace poptorch_sim
