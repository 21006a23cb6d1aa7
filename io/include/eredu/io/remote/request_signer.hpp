#pragma once
/// \file
/// eredu::io::RequestSigner: adds authentication to each attempt of an HTTP request.

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace eredu::io {

/// Header lines of a request, name and value ("x-amz-date", "20261204T120000Z").
using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

/// Signs requests (S3's SigV4). The HTTP client calls it for every attempt, retries included,
/// so that a retried request carries a fresh date. Thread-safe: const, no shared state.
class RequestSigner {
 public:
  virtual ~RequestSigner() = default;
  /// The headers to add to a `method` request of the absolute URL `url` whose body is empty
  /// (Range and If-Match are added by the client and are not signed).
  virtual HttpHeaders sign(std::string_view method, std::string_view url) const = 0;
};

}  // namespace eredu::io
