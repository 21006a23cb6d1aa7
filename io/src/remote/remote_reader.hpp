#pragma once
// RemoteReader: a Reader whose files are remote objects, read by ranged GETs of the HttpClient.
// Each segment is split into parts of RemoteOptions::part_bytes; up to `concurrency` parts are
// in flight over all batches; every part carries If-Match with the object's ETag, so a batch
// never mixes two versions of an object (a changed object fails with file_changed). The first
// failure of a batch cancels its other parts; the batch completes once none is in flight.

#include <memory>
#include <string>
#include <vector>

#include "eredu/io/reading/reader.hpp"
#include "eredu/io/remote/http_client.hpp"
#include "eredu/io/remote/request_signer.hpp"

namespace eredu::io::detail {

/// One remote object as the reader reads it. An entry with an empty url is not the reader's
/// (a local file of the same checkpoint, read by another reader).
struct RemoteObject {
  std::string url{};                      ///< absolute http(s) URL
  std::string display{};                  ///< URL for messages (redacted; the `s3://` form for S3)
  std::string etag{};                     ///< pinned ETag (If-Match); empty: the server sent none
  std::uint64_t size = 0;                 ///< object size
  const RequestSigner* signer = nullptr;  ///< signs its requests; must outlive the reader
};

/// See the file comment.
class RemoteReader final : public Reader {
 public:
  /// Reads `objects` (indexed as ReadSegment::file) through `client`, which must outlive it.
  RemoteReader(HttpClient& client, std::vector<RemoteObject> objects, std::size_t part_bytes, unsigned concurrency);
  /// Cancels every batch in flight and waits for their completion callbacks.
  ~RemoteReader() override;

  std::string_view name() const noexcept override { return "http"; }
  void read(std::vector<ReadSegment> segments, ReadCallback done, BatchId id) override;
  void cancel(BatchId id) override;
  ReaderStats stats() const override;
  std::size_t direct_alignment(std::uint32_t) const noexcept override { return 0; }
  bool reads_direct(std::uint32_t, std::uint64_t, std::uint64_t) const noexcept override { return false; }
  std::string describe() const override;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace eredu::io::detail
