#pragma once
// RoutingReader: a Reader that sends each batch to one of two readers by the file it reads.
// CheckpointSource uses it when some files of a checkpoint may be read with io_uring and
// others may not (file_system.hpp): the former go to the io_uring reader, the latter to
// the pread reader. Both readers index the same span of files.

#include <memory>
#include <vector>

#include "eredu/io/reading/reader.hpp"

namespace eredu::io::detail {

/// See the file comment.
class RoutingReader final : public Reader {
 public:
  /// `use_second[i]` sends file i to `second`, else to `first`.
  RoutingReader(std::unique_ptr<Reader> first, std::unique_ptr<Reader> second, std::vector<bool> use_second);
  /// Destroys `second` then `first`; each drains and cancels as its own destructor says.
  ~RoutingReader() override;

  std::string_view name() const noexcept override { return name_; }
  void read(std::vector<ReadSegment> segments, ReadCallback done, BatchId id) override;
  void cancel(BatchId id) override;
  ReaderStats stats() const override;
  std::size_t direct_alignment(std::uint32_t file) const noexcept override;
  bool reads_direct(std::uint32_t file, std::uint64_t offset, std::uint64_t length) const noexcept override;
  std::string describe() const override;

 private:
  Reader& route(std::uint32_t file) const noexcept;
  std::unique_ptr<Reader> first_;
  std::unique_ptr<Reader> second_;
  std::vector<bool> use_second_;
  std::string name_;
};

}  // namespace eredu::io::detail
