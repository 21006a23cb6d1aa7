#pragma once
/// \file
/// eredu::io::HttpClient: ranged GETs over libcurl's multi interface, driven by an Asio loop.
///
/// The client owns one thread running an io_context; every libcurl call happens there. Its
/// sockets are watched as Asio descriptors (CURLMOPT_SOCKETFUNCTION) and its timeout is an Asio
/// timer (CURLMOPT_TIMERFUNCTION): no thread per request. Connections are kept alive and reused;
/// HTTP/2 is offered over TLS. Redirects (to http or https, at most 10) are followed; the signer
/// signs only requests to the first URL's origin (a CDN a redirect names gets no credentials).
/// Every failure is an eredu::Error naming the URL, redacted (never a
/// credential or a signed query), and the offset:
///  - retried with exponential backoff and full jitter, resuming from the last byte received:
///    timeouts, stalls (the low-speed limit), resets, short bodies, 429/500/502/503/504;
///  - at once: 401/403 access_denied, 404 remote_not_found, 412 (If-Match) file_changed,
///    TLS failures tls_error, a 200 answer to a ranged GET range_unsupported, other statuses
///    remote_error;
///  - once the retries are spent: timed_out for timeouts, remote_error for the rest.

#include <asio/any_io_executor.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/async_result.hpp>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "eredu/core/detail/handler_delivery.hpp"
#include "eredu/core/unique_function.hpp"
#include "eredu/io/remote/remote_options.hpp"
#include "eredu/io/remote/request_signer.hpp"

namespace eredu::io {

/// One ranged GET: bytes [offset, offset + dest.size()) of the object at `url`.
struct RangeGet {
  std::string url{};                      ///< absolute http(s) URL
  std::uint64_t offset = 0;               ///< first byte
  std::span<std::byte> dest{};            ///< where the bytes go; its size is the length asked
  std::string if_match{};                 ///< ETag the object must still have (If-Match); empty: any
  const RequestSigner* signer = nullptr;  ///< signs each attempt; null: unsigned. Must outlive the GET
  /// Accept fewer bytes when the object ends first (a header probe); otherwise a body that ends
  /// before the range does is a short body (retried, then remote_error).
  bool allow_short = false;
};

/// What a completed ranged GET found.
struct RangeResult {
  std::uint64_t bytes = 0;        ///< bytes written to dest (== dest.size() unless allow_short)
  std::string etag{};             ///< the object's ETag as sent (quotes kept); empty if none
  std::uint64_t object_size = 0;  ///< the object's size, from Content-Range
  unsigned attempts = 1;          ///< attempts made (1: no retry)
  unsigned http_version = 0;      ///< HTTP major version of the last answer (1, 2 or 3)
};

/// A whole small document (an index, a listing): GET without Range, at most `max_bytes`.
struct DocumentGet {
  std::string url{};                              ///< absolute http(s) URL
  const RequestSigner* signer = nullptr;          ///< signs each attempt; null: unsigned
  std::size_t max_bytes = std::size_t{64} << 20;  ///< a larger body is remote_error
};

/// What a completed document GET found.
struct DocumentResult {
  std::string body{};  ///< the body
  std::string etag{};  ///< its ETag, if any
};

/// Counters of a client (summaries, tests, benchmarks).
struct HttpStats {
  std::uint64_t requests = 0;     ///< attempts started (retries included)
  std::uint64_t retries = 0;      ///< attempts that were retries
  std::uint64_t bytes = 0;        ///< body bytes received
  std::uint64_t connections = 0;  ///< new connections opened (CURLINFO_NUM_CONNECTS summed)
};

/// Completion of a ranged GET: null and the result, or the failure.
using RangeCallback = UniqueFunction<void(std::exception_ptr, RangeResult)>;
/// Completion of a document GET.
using DocumentCallback = UniqueFunction<void(std::exception_ptr, DocumentResult)>;
/// Names one request for HttpClient::cancel(); unique in the process.
using RequestId = std::uint64_t;

/// See the file comment. Not movable; destroying it cancels every transfer and waits for
/// their callbacks (each completes with errc::cancelled).
class HttpClient {
 public:
  /// Starts the client's thread. Throws Error(resource_exhausted) when the thread cannot start,
  /// Error(invalid_argument) for options out of range.
  explicit HttpClient(const HttpOptions& options);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  /// A fresh RequestId (never 0). Thread-safe.
  static RequestId new_request_id() noexcept;

  /// Starts a ranged GET; `done` runs once, on the client's thread. `id` (0: none) names it for
  /// cancel(). Thread-safe.
  void get(RangeGet request, RangeCallback done, RequestId id = 0);
  /// Starts a document GET; `done` runs once, on the client's thread. Thread-safe.
  void get(DocumentGet request, DocumentCallback done, RequestId id = 0);
  /// Stops request `id`: it completes with errc::cancelled (dest may hold some bytes). Harmless
  /// for a finished or unknown id. Thread-safe.
  void cancel(RequestId id);

  /// Blocking ranged GET (throws the failure). Must not be called on the client's own thread.
  RangeResult get_blocking(RangeGet request);
  /// Blocking document GET (throws the failure). Must not be called on the client's own thread.
  DocumentResult get_blocking(DocumentGet request);

  /// Counters so far. Thread-safe.
  HttpStats stats() const;
  /// The options it was made with.
  const HttpOptions& options() const noexcept;

  /// Ranged GET as an Asio operation.
  ///
  /// @par Completion Signature
  /// `void(std::exception_ptr, RangeResult)`. The handler runs on its associated executor (or
  /// `fallback`), never inline.
  ///
  /// @par Per-Operation Cancellation
  /// terminal, partial and total: the transfer is stopped and the operation fails with
  /// errc::cancelled. The memory behind `request.dest` must outlive the operation.
  template <asio::completion_token_for<void(std::exception_ptr, RangeResult)> Token>
  auto async_get(RangeGet request, asio::any_io_executor fallback, Token&& token) {
    return asio::async_initiate<Token, void(std::exception_ptr, RangeResult)>(
        [](auto handler, HttpClient* self, RangeGet r, asio::any_io_executor ex) {
          const RequestId id = new_request_id();
          if (auto slot = asio::get_associated_cancellation_slot(handler); slot.is_connected()) {
            slot.assign([self, id](asio::cancellation_type type) {
              if (type != asio::cancellation_type::none) self->cancel(id);
            });
          }
          self->get(std::move(r),
                    eredu::detail::deliver_on_handler_executor<std::exception_ptr, RangeResult>(std::move(handler), ex),
                    id);
        },
        token, this, std::move(request), std::move(fallback));
  }

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace eredu::io
