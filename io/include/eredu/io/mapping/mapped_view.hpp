#pragma once
/// \file
/// eredu::io::MappedView: a read-only mapping of one tensor's bytes in a checkpoint file, for
/// reading page-cache-resident data with no staging copy.
///
/// Read it only inside io::guarded_read (a shrunk file or a failed page-in faults), and
/// release what has been read with release_pages() so the mapped pages, which count in the
/// process's RSS, stay bounded by what is being converted at the moment. After the last
/// read, check_unchanged() says whether the file was rewritten meanwhile: a mapping reads
/// the file as it is at each page, so a rewrite mixes versions without any fault.

#include <cstdint>
#include <span>
#include <string>

#include "eredu/core/error.hpp"
#include "eredu/io/integrity/file_stamp.hpp"
#include "eredu/io/mapping/guarded_read.hpp"

namespace eredu::io {

/// RAII mapping of [offset, offset + length) of an open file (see file comment). Move-only.
class MappedView {
 public:
  /// An empty view (no bytes, no mapping).
  MappedView() = default;
  /// Maps the byte range read-only; `path` and `tensor` are for error messages, `file_size`
  /// and `stamp` what the file was when it was opened (compared by fault_error and
  /// check_unchanged; a default stamp compares the size alone). Throws eredu::Error
  /// (io_error) when mmap fails.
  MappedView(int fd, std::uint64_t offset, std::uint64_t length, std::string path, std::string tensor,
             std::uint64_t file_size, FileStamp stamp = {});
  ~MappedView();
  MappedView(MappedView&& other) noexcept;
  MappedView& operator=(MappedView&& other) noexcept;
  MappedView(const MappedView&) = delete;
  MappedView& operator=(const MappedView&) = delete;

  /// The mapped bytes of the range (read them inside guarded_read(region(), ...)).
  std::span<const std::byte> bytes() const noexcept { return {data_, length_}; }
  /// The whole page-aligned mapping: the region to guard.
  std::span<const std::byte> region() const noexcept { return {base_, map_length_}; }
  /// True when `samples` pages spread evenly over bytes() (first and last included) are all
  /// in the page cache; mincore() on the untouched mapping faults nothing in.
  bool looks_resident(unsigned samples) const noexcept;
  /// Maps the page-cache pages of `part` (a subrange of bytes()) into the page table in one
  /// call, instead of one fault per few pages as they are read. Advisory: a page that cannot
  /// be mapped is left for the read to fault on (inside guarded_read).
  void populate(std::span<const std::byte> part) const noexcept;
  /// Drops the page-table entries of whole pages inside `part` (a subrange of bytes()): the
  /// pages stay in the page cache, but no longer count in this process's RSS.
  void release_pages(std::span<const std::byte> part) const noexcept;
  /// The typed error for `fault`: file_changed when the file is now shorter than when it was
  /// opened, io_error otherwise; names the file, the tensor and the file offset of the fault.
  Error fault_error(MappingFault fault) const;
  /// Throws Error(file_changed) naming the file and the tensor when the file's size is not
  /// the one it had when opened or it was rewritten since (FileStamp::rewritten): bytes read
  /// from the view may then mix two versions. Call it after the last read. One fstat.
  void check_unchanged() const;
  /// Remaps the view in place (same addresses) as a private copy-on-write mapping, readable
  /// and writable: reads are the file's page-cache pages until a page is written, and a
  /// written page becomes the process's own copy — the file never sees a write (MAP_PRIVATE,
  /// what torch.load(mmap=True) maps). Throws Error(io_error) naming file and tensor when
  /// mmap refuses; the view is then unchanged.
  void make_private();
  /// True after make_private(): bytes() may be written.
  bool copy_on_write() const noexcept { return copy_on_write_; }

 private:
  void reset() noexcept;

  int fd_ = -1;
  const std::byte* base_ = nullptr;
  std::size_t map_length_ = 0;
  std::uint64_t map_offset_ = 0;  // file offset of base_
  const std::byte* data_ = nullptr;
  std::size_t length_ = 0;
  std::string path_;
  std::string tensor_;
  std::uint64_t file_size_ = 0;
  FileStamp stamp_{};
  bool copy_on_write_ = false;
};

}  // namespace eredu::io
