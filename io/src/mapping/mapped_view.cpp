#include "eredu/io/mapping/mapped_view.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include <fmt/format.h>

#include "posix_values.hpp"

namespace eredu::io {
using detail::page_size;

MappedView::MappedView(int fd, std::uint64_t offset, std::uint64_t length, std::string path, std::string tensor,
                       std::uint64_t file_size, FileStamp stamp)
    : fd_(fd), path_(std::move(path)), tensor_(std::move(tensor)), file_size_(file_size), stamp_(stamp) {
  if (length == 0) return;
  const std::uint64_t page = page_size();
  map_offset_ = offset / page * page;
  map_length_ = static_cast<std::size_t>(offset + length - map_offset_);
  void* p = ::mmap(nullptr, map_length_, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(map_offset_));
  if (p == MAP_FAILED) {
    const int e = errno;
    map_length_ = 0;
    throw Error(errc::io_error,
                {.file = path_, .tensor = tensor_, .offset = offset, .os_error = {e, std::system_category()}},
                fmt::format("cannot map {} bytes to read them", length));
  }
  base_ = static_cast<const std::byte*>(p);
  data_ = base_ + (offset - map_offset_);
  length_ = static_cast<std::size_t>(length);
}

MappedView::~MappedView() { reset(); }

MappedView::MappedView(MappedView&& other) noexcept
    : fd_(other.fd_),
      base_(std::exchange(other.base_, nullptr)),
      map_length_(std::exchange(other.map_length_, 0)),
      map_offset_(other.map_offset_),
      data_(std::exchange(other.data_, nullptr)),
      length_(std::exchange(other.length_, 0)),
      path_(std::move(other.path_)),
      tensor_(std::move(other.tensor_)),
      file_size_(other.file_size_),
      stamp_(other.stamp_),
      copy_on_write_(std::exchange(other.copy_on_write_, false)) {}

MappedView& MappedView::operator=(MappedView&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.fd_;
    base_ = std::exchange(other.base_, nullptr);
    map_length_ = std::exchange(other.map_length_, 0);
    map_offset_ = other.map_offset_;
    data_ = std::exchange(other.data_, nullptr);
    length_ = std::exchange(other.length_, 0);
    path_ = std::move(other.path_);
    tensor_ = std::move(other.tensor_);
    file_size_ = other.file_size_;
    stamp_ = other.stamp_;
    copy_on_write_ = std::exchange(other.copy_on_write_, false);
  }
  return *this;
}

void MappedView::reset() noexcept {
  if (base_) ::munmap(const_cast<std::byte*>(base_), map_length_);
  base_ = data_ = nullptr;
  map_length_ = length_ = 0;
  copy_on_write_ = false;
}

void MappedView::make_private() {
  if (copy_on_write_ || !base_) {
    copy_on_write_ = copy_on_write_ || base_ != nullptr;
    return;
  }
  // MAP_FIXED over our own mapping swaps it atomically: the addresses handed out stay valid.
  void* p = ::mmap(const_cast<std::byte*>(base_), map_length_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd_,
                   static_cast<off_t>(map_offset_));
  if (p == MAP_FAILED) {
    const int e = errno;
    throw Error(errc::io_error,
                {.file = path_,
                 .tensor = tensor_,
                 .offset = map_offset_ + static_cast<std::uint64_t>(data_ - base_),
                 .os_error = {e, std::system_category()}},
                fmt::format("cannot map {} bytes copy-on-write", length_));
  }
  copy_on_write_ = true;
}

bool MappedView::looks_resident(unsigned samples) const noexcept {
  if (!base_) return false;
  const std::uint64_t page = page_size();
  const auto first = static_cast<std::uint64_t>(data_ - base_);
  const std::uint64_t last = first + length_ - 1;
  for (unsigned i = 0; i < samples; ++i) {
    const std::uint64_t at = samples == 1 ? first : first + (last - first) / (samples - 1) * i;
    unsigned char resident = 0;
    if (::mincore(const_cast<std::byte*>(base_ + at / page * page), 1, &resident) != 0 || !(resident & 1u)) {
      return false;
    }
  }
  return true;
}

void MappedView::populate(std::span<const std::byte> part) const noexcept {
#ifdef MADV_POPULATE_READ
  const std::uint64_t page = page_size();
  const auto begin = static_cast<std::uint64_t>(part.data() - base_) / page * page;
  const auto end = static_cast<std::uint64_t>(part.data() + part.size() - base_);
  if (!base_ || end <= begin) return;
  ::madvise(const_cast<std::byte*>(base_ + begin), static_cast<std::size_t>(end - begin), MADV_POPULATE_READ);
#else
  (void)part;
#endif
}

void MappedView::release_pages(std::span<const std::byte> part) const noexcept {
  const std::uint64_t page = page_size();
  const auto begin = static_cast<std::uint64_t>(part.data() - base_);
  const std::uint64_t first = (begin + page - 1) / page * page;
  const std::uint64_t last = (begin + part.size()) / page * page;
  if (!base_ || last <= first) return;
  // Advisory: on failure the pages just stay mapped until the view is destroyed.
  ::madvise(const_cast<std::byte*>(base_ + first), static_cast<std::size_t>(last - first), MADV_DONTNEED);
}

Error MappedView::fault_error(MappingFault fault) const {
  const std::uint64_t offset = map_offset_ + static_cast<std::uint64_t>(fault.address - base_);
  struct stat st {};
  if (::fstat(fd_, &st) == 0 && static_cast<std::uint64_t>(st.st_size) < file_size_) {
    return Error(errc::file_changed, {.file = path_, .tensor = tensor_, .offset = offset},
                 fmt::format("the file shrank to {} bytes while it was read (it was {} bytes when opened)", st.st_size,
                             file_size_));
  }
  return Error(errc::io_error, {.file = path_, .tensor = tensor_, .offset = offset},
               "reading the mapped file failed (SIGBUS: the page could not be read in)");
}

void MappedView::check_unchanged() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    throw Error(errc::io_error, {.file = path_, .tensor = tensor_, .os_error = detail::sys_error(errno)},
                "cannot stat the mapped file");
  }
  if (static_cast<std::uint64_t>(st.st_size) != file_size_) {
    throw Error(errc::file_changed, {.file = path_, .tensor = tensor_},
                fmt::format("the file is now {} bytes; it was {} bytes when opened, and the tensor's bytes read from "
                            "its mapping may not be the ones it had",
                            st.st_size, file_size_));
  }
  if (!stamp_.known()) return;
  if (const std::string_view why = stamp_.rewritten(FileStamp::of(st)); !why.empty()) {
    throw Error(errc::file_changed, {.file = path_, .tensor = tensor_},
                fmt::format("the file was modified while its mapping was read, so the tensor's bytes may mix two "
                            "versions: {}",
                            why));
  }
}

}  // namespace eredu::io
