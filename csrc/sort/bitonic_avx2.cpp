// The AVX2 variant of the bitonic row sorts: see [Note: one file per variant] in
// bitonic/variants.h.
#include "sort/bitonic/variants.h"

namespace poptorch_sim {
namespace sorting {
namespace bitonic {

POPSIM_BITONIC_VARIANT(_avx2, POPSIM_AVX2, native, 4, 8)
POPSIM_BITONIC_NARROW_NETWORK(POPSIM_AVX2, 8)
POPSIM_BITONIC_INSTANCES(_avx2)

}  // namespace bitonic
}  // namespace sorting
}  // namespace poptorch_sim
