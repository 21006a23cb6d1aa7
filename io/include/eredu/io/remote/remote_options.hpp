#pragma once
/// \file
/// eredu::io::RemoteOptions: how eredu reaches checkpoints behind `https://`, `http://` and
/// `s3://` URLs (transport, S3 addressing and credentials, read sizes, the local cache).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace eredu::io {

/// Transport settings of the HTTP client (libcurl).
struct HttpOptions {
  /// Transfers in flight at once over all hosts (the reader's concurrency is capped by it).
  unsigned max_transfers = 16;
  /// Time to establish a connection (TCP and TLS).
  std::chrono::milliseconds connect_timeout{10'000};
  /// A transfer slower than `low_speed_bytes` per second for `low_speed_window` is stalled:
  /// it is abandoned and retried (CURLOPT_LOW_SPEED_LIMIT/TIME).
  std::uint64_t low_speed_bytes = 1024;
  std::chrono::seconds low_speed_window{20};
  /// Retries of one request after a timeout, a reset, a short body or 429/500/502/503/504,
  /// each resuming from the last byte received; 0: fail at the first.
  unsigned max_retries = 6;
  std::chrono::milliseconds backoff_initial{100};  ///< first retry's delay (then doubled, with full jitter)
  std::chrono::milliseconds backoff_max{5'000};    ///< ceiling of one retry's delay
  /// CA bundle (PEM) to verify servers against instead of the system store; empty: the system
  /// store. TLS is always verified.
  std::filesystem::path ca_file{};
  bool http2 = true;  ///< offer HTTP/2 over TLS (ALPN); plain HTTP stays HTTP/1.1
};

/// How `s3://bucket/key` becomes a request, and whose credentials sign it.
struct S3Options {
  /// Region for signing and for the AWS endpoint; empty: $AWS_REGION, $AWS_DEFAULT_REGION, the
  /// profile's `region` in ~/.aws/config, else us-east-1.
  std::string region{};
  /// Endpoint URL (MinIO, Ceph RGW, R2, GCS's XML API: `https://storage.googleapis.com`);
  /// empty: $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, else AWS's regional endpoint.
  std::string endpoint{};
  /// Addressing style: virtual-host (`bucket.host/key`) or path (`host/bucket/key`).
  enum class Addressing { automatic, path, virtual_host };
  /// automatic: virtual-host for AWS endpoints and DNS-compatible bucket names, path otherwise
  /// (a custom endpoint).
  Addressing addressing = Addressing::automatic;
  /// Profile of ~/.aws/credentials and ~/.aws/config; empty: $AWS_PROFILE, else `default`.
  std::string profile{};
  /// Send unsigned requests (public buckets) even where credentials are found.
  bool anonymous = false;
};

/// Everything about remote checkpoints (SourceOptions::remote).
struct RemoteOptions {
  HttpOptions http{};
  S3Options s3{};
  /// Bytes of one ranged GET of tensor data (a larger segment is split into parts of this size).
  std::size_t part_bytes = std::size_t{8} << 20;
  /// Ranged GETs of tensor data in flight at once (also capped by http.max_transfers).
  unsigned concurrency = 16;
  /// Bytes fetched first to read a header (one GET); a longer header costs a second GET.
  std::size_t header_probe_bytes = std::size_t{1} << 20;
  /// Opt-in local cache of whole objects (docs/remote.md); empty: none.
  std::filesystem::path cache_dir{};
  /// Bound on the cache's size; least recently used objects are evicted past it. 0: none.
  std::uint64_t cache_max_bytes = 0;
};

/// Throws eredu::Error(invalid_argument) naming the first field of `options` out of its range.
void validate(const RemoteOptions& options);

}  // namespace eredu::io
