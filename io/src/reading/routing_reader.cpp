#include "routing_reader.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace eredu::io::detail {

RoutingReader::RoutingReader(std::unique_ptr<Reader> first, std::unique_ptr<Reader> second,
                             std::vector<bool> use_second)
    : first_(std::move(first)),
      second_(std::move(second)),
      use_second_(std::move(use_second)),
      name_(fmt::format("{}+{}", first_->name(), second_->name())) {}

RoutingReader::~RoutingReader() {
  second_.reset();
  first_.reset();
}

Reader& RoutingReader::route(std::uint32_t file) const noexcept {
  return file < use_second_.size() && use_second_[file] ? *second_ : *first_;
}

void RoutingReader::read(std::vector<ReadSegment> segments, ReadCallback done, BatchId id) {
  // A source's batch reads one tensor, so one file; a batch that mixed files would go to
  // the second (pread) reader, which is correct on every file system.
  const bool any_second = std::any_of(segments.begin(), segments.end(), [&](const ReadSegment& s) {
    return s.file < use_second_.size() && use_second_[s.file];
  });
  (any_second ? *second_ : *first_).read(std::move(segments), std::move(done), id);
}

void RoutingReader::cancel(BatchId id) {
  // Ids are unique in the process: the reader that does not hold the batch ignores it.
  first_->cancel(id);
  second_->cancel(id);
}

ReaderStats RoutingReader::stats() const {
  ReaderStats a = first_->stats();
  const ReaderStats b = second_->stats();
  a.requests += b.requests;
  a.bytes += b.bytes;
  a.short_reads += b.short_reads;
  a.cache_redone += b.cache_redone;
  a.requeued += b.requeued;
  a.direct_requests += b.direct_requests;
  a.fixed_buffer_requests += b.fixed_buffer_requests;
  a.syscalls += b.syscalls;
  return a;
}

std::size_t RoutingReader::direct_alignment(std::uint32_t file) const noexcept {
  return route(file).direct_alignment(file);
}

bool RoutingReader::reads_direct(std::uint32_t file, std::uint64_t offset, std::uint64_t length) const noexcept {
  return route(file).reads_direct(file, offset, length);
}

std::string RoutingReader::describe() const {
  const auto n = static_cast<std::size_t>(std::count(use_second_.begin(), use_second_.end(), true));
  return fmt::format("{} for {} files; {} for {} files", first_->describe(), use_second_.size() - n,
                     second_->describe(), n);
}

}  // namespace eredu::io::detail
