// The 8-lane network compiled for AVX2 (see [Note: split 8-lane vectors] in bitonic/vectors.h):
// all but the 32-bit items of 16-bit keys (16 lanes), which only run where AVX-512 does. See
// [Note: one file per variant] in bitonic/variants.h.
//
// Only the tests call it (torch.ops.poptorch_sim._sort_rows_8_lanes, to check the AVX-512
// variant's logic on CPUs without AVX-512), so it is optimised at -O1: at -O3 it was the
// extension's longest compile (119 of about 400 CPU seconds on a 2-vCPU Xeon, 2026-11-28). The
// results are the same bits at every level (integer steps; -ffp-contract=off).
#pragma GCC optimize("O1")
#include "sort/bitonic/variants.h"

namespace poptorch_sim {
namespace sorting {
namespace bitonic {

POPSIM_BITONIC_VARIANT(_8_lanes_avx2, POPSIM_AVX2, split, 8, 0)
POPSIM_BITONIC_INSTANCES(_8_lanes_avx2)

}  // namespace bitonic
}  // namespace sorting
}  // namespace poptorch_sim
