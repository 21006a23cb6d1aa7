#pragma once
// PageCacheProbe: is a file range already in the page cache? Decides, per request, whether
// O_DIRECT (best for cold data) or a buffered read (one memcpy for hot data) is faster.

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

namespace eredu::io::detail {

/// A read-only mapping of a file used only for mincore(); it is never touched, so it
/// faults nothing in and costs address space only.
class PageCacheProbe {
 public:
  PageCacheProbe() = default;
  /// Maps `size` bytes of `fd`; on failure the probe reports "not resident".
  PageCacheProbe(int fd, std::uint64_t size) : size_(size) {
    if (size == 0) return;
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) base_ = static_cast<unsigned char*>(p);
  }
  PageCacheProbe(PageCacheProbe&& o) noexcept : base_(o.base_), size_(o.size_) { o.base_ = nullptr; }
  PageCacheProbe& operator=(PageCacheProbe&&) = delete;
  PageCacheProbe(const PageCacheProbe&) = delete;
  ~PageCacheProbe() {
    if (base_) ::munmap(base_, size_);
  }

  /// True when at least half of the pages of [offset, offset + length) are cached.
  bool mostly_resident(std::uint64_t offset, std::uint64_t length) {
    if (!base_ || length == 0 || offset >= size_) return false;
    const std::uint64_t page = 4096;
    std::uint64_t begin = offset / page * page;
    std::uint64_t end = std::min(size_, offset + length);
    std::size_t pages = static_cast<std::size_t>((end - begin + page - 1) / page);
    vec_.resize(pages);
    if (::mincore(base_ + begin, end - begin, vec_.data()) != 0) return false;
    std::size_t resident = 0;
    for (auto v : vec_) resident += v & 1u;
    return resident * 2 >= pages;
  }

 private:
  unsigned char* base_ = nullptr;
  std::uint64_t size_ = 0;
  std::vector<unsigned char> vec_;
};

}  // namespace eredu::io::detail
