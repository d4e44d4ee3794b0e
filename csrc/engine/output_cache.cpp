// The output cache: see [Note: output cache] in output_cache.h.
#include "engine/output_cache.h"

#include <cstdlib>
#include <list>
#include <mutex>
#include <new>
#include <utility>

#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>
#include <unistd.h>

namespace poptorch_sim {

namespace {

constexpr size_t kHugePage = size_t{1} << 21;
constexpr size_t kPage = size_t{1} << 12;

size_t granule(size_t bytes) { return bytes >= kHugeBlockMin ? kHugePage : kPage; }

struct Block {
  void* data;
  size_t bytes;
};

class OutputCache final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (n < kOutputCacheMin) {
      return c10::GetCPUAllocator()->allocate(n);
    }
    const size_t rounded = block_size(n);
    Block* block = nullptr;
    if (getpid() == pid_) {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto it = idle_.rbegin(); it != idle_.rend(); ++it) {
        if (it->bytes == rounded) {
          block = new Block(*it);
          idle_bytes_ -= rounded;
          idle_.erase(std::next(it).base());
          break;
        }
      }
    }
    if (block == nullptr) {
      block = new Block{alloc_block(n), rounded};
    }
    return {block->data, block, &OutputCache::release, c10::Device(c10::DeviceType::CPU)};
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  static void release(void* context);

  void keep(Block block) {
    if (getpid() != pid_) {
      std::free(block.data);
      return;
    }
    std::list<Block> evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      idle_.push_back(block);
      idle_bytes_ += block.bytes;
      while (idle_bytes_ > kOutputCacheBytes) {
        idle_bytes_ -= idle_.front().bytes;
        evicted.splice(evicted.end(), idle_, idle_.begin());
      }
    }
    for (const Block& old : evicted) {
      std::free(old.data);
    }
  }

  const pid_t pid_ = getpid();
  std::mutex mutex_;
  std::list<Block> idle_;  // oldest first
  size_t idle_bytes_ = 0;
};

OutputCache& cache() {
  static OutputCache* instance = new OutputCache();  // never destroyed: outputs may outlive exit
  return *instance;
}

void OutputCache::release(void* context) {
  auto* block = static_cast<Block*>(context);
  cache().keep(*block);
  delete block;
}

}  // namespace

size_t block_size(size_t bytes) {
  const size_t unit = granule(bytes);
  return (bytes + unit - 1) / unit * unit;
}

void* alloc_block(size_t bytes) {
  const size_t unit = granule(bytes);
  const size_t size = block_size(bytes);
  void* data = nullptr;
  if (posix_memalign(&data, unit, size) != 0) {
    throw std::bad_alloc();
  }
#ifdef MADV_HUGEPAGE
  if (unit == kHugePage) {
    madvise(data, size, MADV_HUGEPAGE);  // a hint: fails harmlessly where THP is off
  }
#endif
  return data;
}

at::Tensor empty_output(at::IntArrayRef sizes, at::ScalarType dtype) {
  return at::detail::empty_generic(
      sizes, &cache(), c10::DispatchKeySet(c10::DispatchKey::CPU), dtype, std::nullopt);
}

}  // namespace poptorch_sim
