// Tile iteration for the optimizer kernels, and off-chip optimizer state streamed in chunks.
//
// [Note: off-chip optimizer state]
// With `TensorLocationSettings.useOnChipStorage(False)` for the optimizer state, an IPU keeps
// the state in host memory ("remote buffers") and streams it through a bounded on-chip staging
// buffer while the update runs:
//
//   for chunk in state:            host ──(chunk)──► staging      bytes_to_device += chunk
//       update(param[chunk], grad[chunk], staging)                (the same tile kernels)
//       staging ──(chunk)──► host                                 bytes_to_host   += chunk
//
// Chunks are whole tiles (see [Note: optimizer tiles]), so every element meets exactly the
// arithmetic it meets on-chip and the results are bit-identical. The counters below let the
// profiler show the streaming: chunks streamed and bytes each way.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "engine/tile_engine.h"
#include "optim/ops.h"
#include "optim/optimizer.h"

namespace poptorch_sim {
namespace optim {
namespace {

#define POPSIM_TILE_INLINE inline __attribute__((always_inline))

std::atomic<int64_t> g_chunks{0};
std::atomic<int64_t> g_bytes_to_device{0};
std::atomic<int64_t> g_bytes_to_host{0};

// Float view of `len` elements at element `offset` of raw data `base` (dtype `dt`): the data
// itself for float32, else a widened copy in `scratch`.
float* widen(void* base, at::ScalarType dt, int64_t offset, int64_t len, float* scratch) {
  if (dt == at::kFloat) {
    return static_cast<float*>(base) + offset;
  }
  if (dt == at::kHalf) {
    const auto* src = static_cast<const at::Half*>(base) + offset;
    for (int64_t i = 0; i < len; ++i) {
      scratch[i] = static_cast<float>(src[i]);
    }
  } else {
    const auto* src = static_cast<const at::BFloat16*>(base) + offset;
    for (int64_t i = 0; i < len; ++i) {
      scratch[i] = static_cast<float>(src[i]);
    }
  }
  return scratch;
}

// Writes a widened tile back (round to nearest even); no-op for float32.
void narrow(void* base, at::ScalarType dt, int64_t offset, int64_t len, const float* scratch) {
  if (dt == at::kHalf) {
    auto* dst = static_cast<at::Half*>(base) + offset;
    for (int64_t i = 0; i < len; ++i) {
      dst[i] = static_cast<at::Half>(scratch[i]);
    }
  } else if (dt == at::kBFloat16) {
    auto* dst = static_cast<at::BFloat16*>(base) + offset;
    for (int64_t i = 0; i < len; ++i) {
      dst[i] = static_cast<at::BFloat16>(scratch[i]);
    }
  }
}

// Staging buffer `slot` of the calling thread, grown on demand and reused across calls. Its
// start is 64-byte aligned like a tensor's data, so each tile meets the same vector code
// (no different alignment peeling) whether its state is on-chip or staged.
char* staging_buffer(size_t slot, size_t bytes) {
  constexpr size_t kAlign = 64;
  thread_local std::vector<std::vector<char>> buffers(kMaxStates);
  auto& buf = buffers[slot];
  if (buf.size() < bytes + kAlign) {
    buf.resize(bytes + kAlign);
  }
  const auto address = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + (kAlign - address % kAlign) % kAlign;
}

}  // namespace

namespace {

// Raw storage of one parameter's operands: state element 0 is parameter element `origin`.
struct Bases {
  void* param;
  void* grad;
  void* state[kMaxStates];
  at::ScalarType pdt, gdt, sdt[kMaxStates];
  size_t ns;
  int64_t origin;
};

Bases bases_of(const ParamOperands& ops, const std::vector<void*>& state_ptrs, int64_t origin) {
  Bases b{};
  b.param = ops.param.data_ptr();
  b.grad = const_cast<void*>(ops.grad.const_data_ptr());
  b.pdt = ops.param.scalar_type();
  b.gdt = ops.grad.scalar_type();
  b.ns = state_ptrs.size();
  b.origin = origin;
  for (size_t s = 0; s < b.ns; ++s) {
    b.state[s] = state_ptrs[s];
    b.sdt[s] = ops.states[s].scalar_type();
  }
  return b;
}

// Per-thread float scratch of one tile (used only by float16/bfloat16 operands).
struct Scratch {
  float param[kTile], grad[kTile], state[kMaxStates][kTile];
};

// Tile `t` of a parameter whose elements end at `end`: widen, `fn(view)`, narrow back.
template <class F>
POPSIM_TILE_INLINE void run_tile(const Bases& b, int64_t t, int64_t end, Scratch& sc, const F& fn) {
  const int64_t lo = t * kTile;
  const int64_t len = std::min(kTile, end - lo);
  TileView v{nullptr, nullptr, {nullptr, nullptr, nullptr}, len, t};
  v.param = widen(b.param, b.pdt, lo, len, sc.param);
  v.grad = widen(b.grad, b.gdt, lo, len, sc.grad);
  for (size_t s = 0; s < b.ns; ++s) {
    v.state[s] = widen(b.state[s], b.sdt[s], lo - b.origin, len, sc.state[s]);
  }
  fn(v);
  narrow(b.param, b.pdt, lo, len, sc.param);
  for (size_t s = 0; s < b.ns; ++s) {
    narrow(b.state[s], b.sdt[s], lo - b.origin, len, sc.state[s]);
  }
}

// Tiles per work unit of the all-parameter loop: big enough that claiming a unit costs
// nothing next to it, small enough that a descheduled thread leaves little for the others.
constexpr int64_t kUnitTiles = 16;

// Runs `unit_fn` on units [0, units): on the engine's threads, which claim units one at a time
// (see [Note: tile pool]), or in turn on the calling thread when there is too little `work`
// (elements) to be worth waking them.
void run_units(int64_t units, int64_t work, const std::function<void(int64_t)>& unit_fn) {
  if (work < engine::kMinParallelWork || units <= 1) {
    for (int64_t unit = 0; unit < units; ++unit) {
      unit_fn(unit);
    }
    return;
  }
  engine::run_tiles(units, unit_fn);
}

// The all-parameter loop on-chip: the tiles of every parameter, in order, cut into units of
// kUnitTiles that the engine's threads claim one at a time (see [Note: tile pool]).
void run_all_tiles(const std::vector<ParamOperands>& all, const IndexedTileFn& fn) {
  std::vector<Bases> bases;
  std::vector<int64_t> first_tile{0};
  bases.reserve(all.size());
  first_tile.reserve(all.size() + 1);
  for (const auto& ops : all) {
    std::vector<void*> host;
    for (const auto& st : ops.states) {
      host.push_back(st.data_ptr());
    }
    bases.push_back(bases_of(ops, host, 0));
    first_tile.push_back(first_tile.back() + (ops.param.numel() + kTile - 1) / kTile);
  }
  const int64_t tiles = first_tile.back();
  const int64_t units = (tiles + kUnitTiles - 1) / kUnitTiles;
  const std::function<void(int64_t)> unit_fn = [&](int64_t unit) {
    Scratch sc;
    const int64_t tb = unit * kUnitTiles;
    const int64_t te = std::min(tiles, tb + kUnitTiles);
    size_t i = std::upper_bound(first_tile.begin(), first_tile.end(), tb) - first_tile.begin() - 1;
    for (int64_t t = tb; t < te; ++t) {
      while (t >= first_tile[i + 1]) {
        ++i;
      }
      const int64_t n = all[i].param.numel();
      run_tile(bases[i], t - first_tile[i], n, sc, [&](const TileView& v) { fn(i, v); });
    }
  };
  run_units(units, tiles * kTile, unit_fn);
}

}  // namespace

void run_tiles(
    const ParamOperands& ops,
    const std::vector<void*>& state_ptrs,
    int64_t state_origin,
    int64_t begin,
    int64_t end,
    const TileFn& fn) {
  TORCH_INTERNAL_ASSERT(begin % kTile == 0, "tile range must start on a tile, got ", begin);
  const Bases b = bases_of(ops, state_ptrs, state_origin);
  const int64_t first = begin / kTile;
  const int64_t units = ((end + kTile - 1) / kTile - first + kUnitTiles - 1) / kUnitTiles;
  const std::function<void(int64_t)> unit_fn = [&](int64_t unit) {
    Scratch sc;
    const int64_t tb = first + unit * kUnitTiles;
    const int64_t te = std::min((end + kTile - 1) / kTile, tb + kUnitTiles);
    for (int64_t t = tb; t < te; ++t) {
      run_tile(b, t, end, sc, fn);
    }
  };
  run_units(units, end - begin, unit_fn);
}

void for_each_tile(
    const ParamOperands& ops,
    int64_t chunk_elements,
    bool write_back,
    const TileFn& fn) {
  const int64_t n = ops.param.numel();
  const size_t ns = ops.states.size();
  std::vector<void*> host(ns);
  for (size_t s = 0; s < ns; ++s) {
    host[s] = ops.states[s].data_ptr();
  }
  if (chunk_elements == 0 || ns == 0) {
    run_tiles(ops, host, 0, 0, n, fn);
    return;
  }
  engine::KernelScope scope("optimizer_offload");
  std::vector<void*> staging(ns);
  for (int64_t lo = 0; lo < n; lo += chunk_elements) {
    const int64_t len = std::min(chunk_elements, n - lo);
    int64_t bytes = 0;
    for (size_t s = 0; s < ns; ++s) {
      const int64_t elsize = static_cast<int64_t>(ops.states[s].element_size());
      staging[s] = staging_buffer(s, chunk_elements * elsize);
      std::memcpy(staging[s], static_cast<char*>(host[s]) + lo * elsize, len * elsize);
      bytes += len * elsize;
    }
    g_bytes_to_device.fetch_add(bytes, std::memory_order_relaxed);
    run_tiles(ops, staging, lo, lo, lo + len, fn);
    if (write_back) {
      for (size_t s = 0; s < ns; ++s) {
        const int64_t elsize = static_cast<int64_t>(ops.states[s].element_size());
        std::memcpy(static_cast<char*>(host[s]) + lo * elsize, staging[s], len * elsize);
      }
      g_bytes_to_host.fetch_add(bytes, std::memory_order_relaxed);
    }
    g_chunks.fetch_add(1, std::memory_order_relaxed);
    scope.add_supersteps(1);
    scope.add_bytes_exchanged(write_back ? 2 * bytes : bytes);
  }
}

void for_each_tile_all(
    const std::vector<ParamOperands>& all,
    int64_t chunk_elements,
    bool write_back,
    const IndexedTileFn& fn) {
  if (chunk_elements == 0) {
    run_all_tiles(all, fn);
    return;
  }
  for (size_t i = 0; i < all.size(); ++i) {
    for_each_tile(all[i], chunk_elements, write_back, [&](const TileView& v) { fn(i, v); });
  }
}

std::vector<int64_t> offload_stats() {
  return {g_chunks.load(), g_bytes_to_device.load(), g_bytes_to_host.load()};
}

void offload_reset_stats() {
  g_chunks = 0;
  g_bytes_to_device = 0;
  g_bytes_to_host = 0;
}

}  // namespace optim
}  // namespace poptorch_sim
