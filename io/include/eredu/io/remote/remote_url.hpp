#pragma once
/// \file
/// eredu::io::RemoteUrl: the parsed form of a checkpoint location that is not a local path.

#include <cstdint>
#include <string>
#include <string_view>

namespace eredu::io {

/// A parsed `https://`, `http://` or `s3://` location.
struct RemoteUrl {
  /// Which kind of location.
  enum class Scheme { http, https, s3 };
  Scheme scheme = Scheme::https;  ///< scheme
  /// Host (http/https), or the bucket (s3).
  std::string host{};
  std::uint16_t port = 0;  ///< explicit port, 0: the scheme's default
  /// Path without the leading `/`, still percent-encoded as given (http/https), or the key /
  /// prefix (s3, decoded as written).
  std::string path{};
  std::string query{};  ///< after `?`, without it (http/https only); never printed
  std::string text{};   ///< the URL as given, for the user's own requests
};

/// True for a string that names a remote location (`http://`, `https://`, `s3://`,
/// case-insensitive scheme), which eredu opens over the network rather than as a file.
bool is_remote(std::string_view location) noexcept;

/// Parses a remote location; throws eredu::Error(invalid_argument) naming the URL (redacted)
/// and what is wrong (no host, a bad port, user info, a fragment, a control byte).
RemoteUrl parse_remote_url(std::string_view location);

/// The URL for messages and logs: scheme, host, port and path; the query (which may carry a
/// presigned signature) is replaced by `?…`.
std::string redacted(const RemoteUrl& url);

/// What messages show of a location the user gave: a URL redacted (above), a local path as is.
std::string shown_location(std::string_view location);

/// `base` with its last path segment replaced by `name` (a shard named by an index); the query
/// is dropped. Refuses (invalid_index) a name with `/`, `\`, `..`, a control byte, or empty.
RemoteUrl sibling(const RemoteUrl& base, std::string_view name);

}  // namespace eredu::io
