#pragma once
// PageCacheProbe: is a file range already in the page cache? Decides, per request, whether
// O_DIRECT (best for cold data) or a buffered read (one memcpy for hot data) is faster, and,
// on file systems eredu does not trust, whether a direct read may have been served from the
// page cache (see ReaderCore's page-cache guard).

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <optional>
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

  /// Whether the file could be mapped (FUSE in direct_io mode, for one, refuses).
  bool mapped() const noexcept { return base_ != nullptr; }

  /// The file offset of the first page of [offset, offset + length) that is in the page
  /// cache, the partial pages at both ends included; none when no page is, or when the
  /// range is past the mapping. One mincore() over the range (a byte per page).
  std::optional<std::uint64_t> first_resident(std::uint64_t offset, std::uint64_t length) const {
    if (!base_ || length == 0 || offset >= size_) return std::nullopt;
    const std::uint64_t begin = offset / page * page;
    const std::uint64_t end = std::min((offset + length + page - 1) / page * page, (size_ + page - 1) / page * page);
    std::vector<unsigned char> v((end - begin) / page);
    if (::mincore(base_ + begin, end - begin, v.data()) != 0) return begin;  // unknown: assume cached
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (v[i] & 1u) return begin + i * page;
    }
    return std::nullopt;
  }

  /// True when the request [offset, offset + length) looks cached: at least two of its
  /// first, middle and last pages are. Three one-page mincore() calls cost about a
  /// microsecond; asking about every page of a 4 MiB request cost more than copying it.
  bool mostly_resident(std::uint64_t offset, std::uint64_t length) const {
    if (!base_ || length == 0 || offset >= size_) return false;
    const std::uint64_t last = std::min(size_, offset + length) - 1;
    const std::uint64_t samples[3] = {offset, offset + (last - offset) / 2, last};
    int resident = 0;
    for (std::uint64_t at : samples) resident += page_resident(at) ? 1 : 0;
    return resident >= 2;
  }

 private:
  bool page_resident(std::uint64_t at) const {
    unsigned char v = 0;
    return ::mincore(base_ + at / page * page, 1, &v) == 0 && (v & 1u);
  }

  static constexpr std::uint64_t page = 4096;

  unsigned char* base_ = nullptr;
  std::uint64_t size_ = 0;
};

}  // namespace eredu::io::detail
