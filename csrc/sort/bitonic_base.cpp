// The baseline (x86-64) variant of the bitonic row sorts: see [Note: one file per variant] in
// bitonic/variants.h.
#include "sort/bitonic/variants.h"

namespace poptorch_sim {
namespace sorting {
namespace bitonic {

POPSIM_BITONIC_VARIANT(_base, , native, 2, 0)
POPSIM_BITONIC_INSTANCES(_base)

}  // namespace bitonic
}  // namespace sorting
}  // namespace poptorch_sim
