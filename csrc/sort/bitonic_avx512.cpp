// The AVX-512 variant of the bitonic row sorts: see [Note: one file per variant] in
// bitonic/variants.h.
#include "sort/bitonic/variants.h"

namespace poptorch_sim {
namespace sorting {
namespace bitonic {

POPSIM_BITONIC_VARIANT(_avx512, POPSIM_AVX512, native, 8, 16)
POPSIM_BITONIC_NARROW_NETWORK(POPSIM_AVX512, 16)
POPSIM_BITONIC_INSTANCES(_avx512)

}  // namespace bitonic
}  // namespace sorting
}  // namespace poptorch_sim
