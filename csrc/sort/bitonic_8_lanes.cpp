// The 8-lane network compiled for AVX2 (see [Note: split 8-lane vectors] in bitonic/vectors.h):
// all but the 32-bit items of 16-bit keys (16 lanes), which only run where AVX-512 does. See
// [Note: one file per variant] in bitonic/variants.h.
#include "sort/bitonic/variants.h"

namespace poptorch_sim {
namespace sorting {
namespace bitonic {

POPSIM_BITONIC_VARIANT(_8_lanes_avx2, POPSIM_AVX2, split, 8, 0)
POPSIM_BITONIC_INSTANCES(_8_lanes_avx2)

}  // namespace bitonic
}  // namespace sorting
}  // namespace poptorch_sim
