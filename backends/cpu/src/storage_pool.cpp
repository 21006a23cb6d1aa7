#include "eredu/cpu/storage_pool.hpp"

#include <fmt/format.h>
#include <sys/mman.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cerrno>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <system_error>
#include <vector>

#include "eredu/core/error.hpp"
#include "eredu/core/trace.hpp"
#include "eredu/io/mapping/mapped_tensor.hpp"

namespace eredu::cpu {
namespace {

constexpr std::size_t small_limit = std::size_t{64} << 10;  // below: aligned_alloc
constexpr std::size_t page = 4096;
constexpr std::size_t huge = std::size_t{2} << 20;

std::size_t round_up(std::size_t v, std::size_t to) { return (v + to - 1) / to * to; }

/// Capacity actually mapped for `bytes`: whole pages, never whole huge pages — rounding a
/// tensor up to 2 MiB would add up to 2 MiB of resident memory per tensor (huge pages are
/// faulted in whole), a hundred MiB over a model's few hundred tensors.
std::size_t size_class(std::size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes < small_limit) return round_up(bytes, 64);
  return round_up(bytes, page);
}

bool is_mapped(std::size_t capacity) { return capacity >= small_limit; }

[[noreturn]] void throw_oom(std::size_t bytes, int err) {
  throw BackendError(errc::out_of_memory, {.os_error = std::error_code(err, std::system_category())},
                     fmt::format("cannot allocate {} bytes of tensor storage", bytes));
}

/// Maps `capacity` bytes; large blocks start 2 MiB-aligned so huge pages can back every
/// whole 2 MiB of them (the tail stays in 4 KiB pages).
std::byte* map_block(std::size_t capacity, StoragePages pages) {
  if (capacity < huge) {
    void* p = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw_oom(capacity, errno);
    return static_cast<std::byte*>(p);
  }
  // Over-map by 2 MiB and trim both ends to get 2 MiB alignment.
  std::size_t span = capacity + huge;
  void* p = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw_oom(capacity, errno);
  auto base = reinterpret_cast<std::uintptr_t>(p);
  auto aligned = round_up(base, huge);
  if (aligned > base) ::munmap(p, aligned - base);
  std::size_t tail = (base + span) - (aligned + capacity);
  if (tail) ::munmap(reinterpret_cast<void*>(aligned + capacity), tail);
  // Advice only: a kernel without THP refuses it, and the block works either way.
  ::madvise(reinterpret_cast<void*>(aligned), capacity, pages == StoragePages::huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  return reinterpret_cast<std::byte*>(aligned);
}

void free_block(std::byte* data, std::size_t capacity) {
  if (is_mapped(capacity))
    ::munmap(data, capacity);
  else
    std::free(data);
}

}  // namespace

namespace detail {

struct PoolState {
  explicit PoolState(StoragePoolOptions o) : options(o) {}
  ~PoolState() {
    for (auto& [capacity, blocks] : retained)
      for (auto* b : blocks) free_block(b, capacity);
    release_reservation();
  }
  StoragePoolOptions options;
  mutable std::mutex mutex;
  std::map<std::size_t, std::vector<std::byte*>> retained;  // capacity -> populated blocks
  StoragePoolStats stats;
  // reserve(): mapped, never touched; blocks are carved from the front.
  std::byte* reserved_next = nullptr;
  std::byte* reserved_end = nullptr;

  /// Under `mutex`: the next `capacity` bytes of the reservation, or null when it is shorter.
  std::byte* carve(std::size_t capacity) noexcept {
    if (static_cast<std::size_t>(reserved_end - reserved_next) < capacity) return nullptr;
    std::byte* p = reserved_next;
    reserved_next += capacity;
    stats.reserved_bytes -= capacity;
    ++stats.reserved_allocations;
    return p;
  }

  /// Unmaps what is left of the reservation.
  void release_reservation() noexcept {
    std::byte* from = nullptr;
    std::size_t n = 0;
    {
      std::lock_guard lock(mutex);
      from = reserved_next;
      n = static_cast<std::size_t>(reserved_end - reserved_next);
      reserved_next = reserved_end = nullptr;
      stats.reserved_bytes = 0;
    }
    if (n) ::munmap(from, n);
  }

  /// Takes a freed block back; keeps it while under the retention limit. Called from
  /// StorageBlock's destructor, where an exception would end the process.
  void give_back(std::byte* data, std::size_t capacity, bool fresh) noexcept {
    {
      std::lock_guard lock(mutex);
      stats.live_bytes -= capacity;
      // A never-populated block is no cheaper to reuse than new memory: return it.
      if (!fresh && stats.retained_bytes + capacity <= options.max_retained_bytes) {
        try {
          retained[capacity].push_back(data);
          stats.retained_bytes += capacity;
          return;
        } catch (const std::bad_alloc&) {
          // No memory to remember the block (a map node, a longer list): returning it to
          // the system is what memory this short needs anyway.
        }
      }
    }
    free_block(data, capacity);
  }
};

}  // namespace detail

StorageBlock::StorageBlock(StorageBlock&& other) noexcept
    : pool_(std::move(other.pool_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      capacity_(std::exchange(other.capacity_, 0)),
      lead_(std::exchange(other.lead_, 0)),
      fresh_(other.fresh_),
      mapped_(other.mapped_),
      mapping_(std::move(other.mapping_)) {}

StorageBlock& StorageBlock::operator=(StorageBlock&& other) noexcept {
  if (this != &other) {
    StorageBlock old(std::move(*this));
    pool_ = std::move(other.pool_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
    lead_ = std::exchange(other.lead_, 0);
    fresh_ = other.fresh_;
    mapped_ = other.mapped_;
    mapping_ = std::move(other.mapping_);
  }
  return *this;
}

StorageBlock::~StorageBlock() {
  if (data_ && pool_) pool_->give_back(data_ - lead_, capacity_, fresh_);
}

bool StorageBlock::read_only() const noexcept { return mapping_ != nullptr && !mapping_->copy_on_write(); }

StorageBlock StorageBlock::adopt(std::shared_ptr<const io::MappedTensor> mapping) noexcept {
  StorageBlock block;
  const std::span<const std::byte> bytes = mapping->bytes();
  // Written only by code that checks read_only() first: nothing writes a shared mapped block;
  // a copy-on-write one (MappedTensor::make_private) is the process's to write.
  block.data_ = const_cast<std::byte*>(bytes.data());
  block.size_ = block.capacity_ = bytes.size();
  block.mapping_ = std::move(mapping);
  return block;
}

StoragePool::StoragePool(StoragePoolOptions options) : state_(std::make_shared<detail::PoolState>(options)) {}

StorageBlock StoragePool::allocate(std::size_t bytes) {
  std::size_t capacity = size_class(bytes);
  StorageBlock block;
  block.pool_ = state_;
  block.size_ = bytes;
  block.capacity_ = capacity;
  block.mapped_ = is_mapped(capacity);
  {
    std::lock_guard lock(state_->mutex);
    auto it = state_->retained.find(capacity);
    if (it != state_->retained.end() && !it->second.empty()) {
      block.data_ = it->second.back();
      it->second.pop_back();
      state_->stats.retained_bytes -= capacity;
      state_->stats.live_bytes += capacity;
      ++state_->stats.recycled_allocations;
      return block;
    }
    if (block.mapped_) block.data_ = state_->carve(capacity);
  }
  if (block.data_) {
    // Carved from the reservation: its advice was given once, for all of it.
  } else if (block.mapped_) {
    block.data_ = map_block(capacity, state_->options.pages);
  } else {
    block.data_ = static_cast<std::byte*>(std::aligned_alloc(64, capacity));
    if (!block.data_) throw_oom(capacity, ENOMEM);
  }
  // Small blocks are not worth a parallel populate: the first write faults them in.
  block.fresh_ = block.mapped_;
  std::lock_guard lock(state_->mutex);
  state_->stats.live_bytes += capacity;
  ++state_->stats.fresh_allocations;
  return block;
}

StorageBlock StoragePool::allocate_window(std::size_t window, std::size_t lead, std::size_t bytes) {
  if (lead > window || bytes > window - lead) {
    throw Error(errc::invalid_argument, {},
                fmt::format("a window of {} bytes cannot hold {} bytes after {} bytes of lead", window, bytes, lead));
  }
  // Below small_limit blocks come from aligned_alloc, 64-byte aligned only: map whole pages.
  StorageBlock block = allocate(std::max(window, small_limit));
  block.data_ += lead;
  block.size_ = bytes;
  block.lead_ = lead;
  return block;
}

void StoragePool::populate(StorageBlock& block) {
  if (!block.fresh_) return;
  std::size_t capacity = block.capacity_;
  std::byte* const base = block.data_ - block.lead_;
  std::size_t chunks = (capacity + huge - 1) / huge;
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, chunks, 1), [&](const tbb::blocked_range<std::size_t>& r) {
    trace::Span span("populate", "cpu", trace::enabled() ? fmt::format("{} x 2 MiB", r.size()) : "");
    for (std::size_t c = r.begin(); c < r.end(); ++c) {
      std::byte* p = base + c * huge;
      std::size_t n = std::min(huge, capacity - c * huge);
#ifdef MADV_POPULATE_WRITE
      if (::madvise(p, n, MADV_POPULATE_WRITE) == 0) continue;
#endif
      // Kernels before 5.14: a write per page faults it in.
      for (std::size_t off = 0; off < n; off += page) reinterpret_cast<volatile char*>(p)[off] = 0;
    }
  });
  block.fresh_ = false;
}

void StoragePool::reserve(std::uint64_t bytes) noexcept {
  if (state_->options.pages == StoragePages::huge) return;
  state_->release_reservation();
  std::uint64_t want = 0;
  {
    std::lock_guard lock(state_->mutex);
    want = bytes > state_->stats.retained_bytes ? bytes - state_->stats.retained_bytes : 0;
  }
  // Below one mapped block there is nothing to carve; beyond the address space, nothing to map.
  if (want < small_limit || want > (std::uint64_t{1} << 47)) return;
  const std::size_t n = round_up(static_cast<std::size_t>(want), page);
  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return;  // the blocks are then mapped one by one, as without it
  ::madvise(p, n, MADV_NOHUGEPAGE);
  {
    std::lock_guard lock(state_->mutex);
    if (state_->reserved_next == nullptr) {
      state_->reserved_next = static_cast<std::byte*>(p);
      state_->reserved_end = state_->reserved_next + n;
      state_->stats.reserved_bytes = n;
      return;
    }
  }
  ::munmap(p, n);  // another thread reserved meanwhile: one reservation at a time
}

void StoragePool::trim(std::uint64_t keep_bytes) {
  state_->release_reservation();
  std::vector<std::pair<std::byte*, std::size_t>> victims;
  {
    std::lock_guard lock(state_->mutex);
    for (auto it = state_->retained.begin();
         it != state_->retained.end() && state_->stats.retained_bytes > keep_bytes;) {
      auto& blocks = it->second;
      while (!blocks.empty() && state_->stats.retained_bytes > keep_bytes) {
        victims.emplace_back(blocks.back(), it->first);
        blocks.pop_back();
        state_->stats.retained_bytes -= it->first;
      }
      it = blocks.empty() ? state_->retained.erase(it) : std::next(it);
    }
  }
  for (auto [p, c] : victims) free_block(p, c);
}

StoragePoolStats StoragePool::stats() const {
  std::lock_guard lock(state_->mutex);
  return state_->stats;
}

}  // namespace eredu::cpu
