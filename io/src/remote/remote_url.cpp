#include "eredu/io/remote/remote_url.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "eredu/core/error.hpp"
#include "eredu/core/printable.hpp"

namespace eredu::io {

namespace {

bool starts_with_nocase(std::string_view s, std::string_view prefix) noexcept {
  if (s.size() < prefix.size()) return false;
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  }
  return true;
}

// Without the query: what a message may show of a URL the user gave (it may hold a signature).
std::string shown(std::string_view text) {
  const auto q = text.find('?');
  return printable(q == std::string_view::npos ? text : text.substr(0, q));
}

[[noreturn]] void refuse(std::string_view text, std::string_view why) {
  throw Error(errc::invalid_argument, {.file = shown(text)}, fmt::format("not a usable URL: {}", why));
}

// Percent-encodes one path segment (RFC 3986 unreserved characters kept).
std::string encode_segment(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

}  // namespace

bool is_remote(std::string_view location) noexcept {
  return starts_with_nocase(location, "http://") || starts_with_nocase(location, "https://") ||
         starts_with_nocase(location, "s3://");
}

RemoteUrl parse_remote_url(std::string_view text) {
  RemoteUrl url;
  url.text = std::string(text);
  std::string_view rest;
  if (starts_with_nocase(text, "https://")) {
    url.scheme = RemoteUrl::Scheme::https;
    rest = text.substr(8);
  } else if (starts_with_nocase(text, "http://")) {
    url.scheme = RemoteUrl::Scheme::http;
    rest = text.substr(7);
  } else if (starts_with_nocase(text, "s3://")) {
    url.scheme = RemoteUrl::Scheme::s3;
    rest = text.substr(5);
  } else {
    refuse(text, "the scheme is not http://, https:// or s3://");
  }
  if (std::any_of(text.begin(), text.end(), [](char c) {
        const auto u = static_cast<unsigned char>(c);
        return u < 0x20 || u == 0x7f || c == ' ';
      })) {
    refuse(text, "it holds a space or a control byte (percent-encode it)");
  }
  if (text.find('#') != std::string_view::npos) refuse(text, "it has a fragment (#...)");
  const auto slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
  if (authority.find('@') != std::string_view::npos) {
    refuse(text, "it holds user information (user@host); give credentials through the environment instead");
  }
  if (url.scheme == RemoteUrl::Scheme::s3) {
    if (authority.empty()) refuse(text, "no bucket (s3://BUCKET/KEY)");
    if (authority.find('?') != std::string_view::npos || path.find('?') != std::string_view::npos)
      refuse(text, "an s3:// URL has no query");
    url.host = std::string(authority);
    url.path = std::string(path);
    return url;
  }
  const auto q = path.find('?');
  if (q != std::string_view::npos) {
    url.query = std::string(path.substr(q + 1));
    path = path.substr(0, q);
  } else if (const auto aq = authority.find('?'); aq != std::string_view::npos) {
    url.query = std::string(authority.substr(aq + 1));
    authority = authority.substr(0, aq);
  }
  // host, [v6]:port or host:port
  std::string_view host = authority;
  std::string_view port;
  if (!host.empty() && host.front() == '[') {
    const auto close = host.find(']');
    if (close == std::string_view::npos) refuse(text, "an IPv6 host without ']'");
    port = host.substr(close + 1);
    host = host.substr(0, close + 1);
    if (!port.empty() && port.front() != ':') refuse(text, "garbage after the IPv6 host");
    if (!port.empty()) port.remove_prefix(1);
  } else if (const auto colon = host.rfind(':'); colon != std::string_view::npos) {
    port = host.substr(colon + 1);
    host = host.substr(0, colon);
  }
  if (host.empty()) refuse(text, "no host");
  if (!port.empty() || authority.ends_with(':')) {
    unsigned value = 0;
    for (char c : port) {
      if (c < '0' || c > '9') refuse(text, "the port is not a number");
      value = value * 10 + static_cast<unsigned>(c - '0');
      if (value > 65535) refuse(text, "the port is above 65535");
    }
    if (port.empty() || value == 0) refuse(text, "the port is empty or 0");
    url.port = static_cast<std::uint16_t>(value);
  }
  url.host = std::string(host);
  url.path = std::string(path);
  return url;
}

std::string redacted(const RemoteUrl& url) {
  std::string out;
  switch (url.scheme) {
    case RemoteUrl::Scheme::s3:
      return printable(fmt::format("s3://{}/{}", url.host, url.path));
    case RemoteUrl::Scheme::http:
      out = "http://";
      break;
    case RemoteUrl::Scheme::https:
      out = "https://";
      break;
  }
  out += url.host;
  if (url.port != 0) out += fmt::format(":{}", url.port);
  out += '/';
  out += url.path;
  if (!url.query.empty()) out += "?…";
  return printable(out);
}

RemoteUrl sibling(const RemoteUrl& base, std::string_view name) {
  const bool bad = name.empty() || name == "." || name == ".." || name.find('/') != std::string_view::npos ||
                   name.find('\\') != std::string_view::npos ||
                   std::any_of(name.begin(), name.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20; });
  if (bad) {
    throw Error(errc::invalid_index, {.file = redacted(base)},
                fmt::format("the shard name '{}' is not a plain file name", printable(name)));
  }
  RemoteUrl out = base;
  out.query.clear();
  const auto last = out.path.rfind('/');
  const std::string dir = last == std::string::npos ? std::string() : out.path.substr(0, last + 1);
  out.path = dir + (base.scheme == RemoteUrl::Scheme::s3 ? std::string(name) : encode_segment(name));
  std::string scheme = base.scheme == RemoteUrl::Scheme::s3     ? "s3://"
                       : base.scheme == RemoteUrl::Scheme::http ? "http://"
                                                                : "https://";
  out.text = scheme + out.host + (out.port ? fmt::format(":{}", out.port) : std::string()) + "/" + out.path;
  return out;
}

}  // namespace eredu::io
