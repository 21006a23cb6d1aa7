#include "eredu/io/remote/remote_options.hpp"

#include <fmt/format.h>

#include "eredu/core/error.hpp"

namespace eredu::io {

namespace {
void refuse(const char* field, const std::string& range) {
  throw Error(errc::invalid_argument, {}, fmt::format("RemoteOptions::{} is out of range; {}", field, range));
}
}  // namespace

void validate(const RemoteOptions& o) {
  if (o.http.max_transfers < 1 || o.http.max_transfers > 1024) refuse("http.max_transfers", "it must be 1..1024");
  if (o.http.connect_timeout.count() < 1) refuse("http.connect_timeout", "it must be at least 1 ms");
  if (o.http.low_speed_window.count() < 1) refuse("http.low_speed_window", "it must be at least 1 s");
  if (o.http.max_retries > 100) refuse("http.max_retries", "it must be 0..100");
  if (o.http.backoff_initial.count() < 0 || o.http.backoff_max < o.http.backoff_initial)
    refuse("http.backoff_initial", "it must be 0..http.backoff_max");
  if (o.part_bytes < 4096 || o.part_bytes > (std::size_t{1} << 30)) refuse("part_bytes", "it must be 4 KiB..1 GiB");
  if (o.concurrency < 1 || o.concurrency > 1024) refuse("concurrency", "it must be 1..1024");
  if (o.header_probe_bytes < 64 || o.header_probe_bytes > (std::size_t{100} << 20))
    refuse("header_probe_bytes", "it must be 64 B..100 MiB");
  const auto addressing = static_cast<int>(o.s3.addressing);
  if (addressing < 0 || addressing > 2) refuse("s3.addressing", "it must be automatic, path or virtual_host");
}

}  // namespace eredu::io
