#include "eredu/io/remote/s3.hpp"

#include <fmt/format.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>

#include "eredu/core/error.hpp"
#include "eredu/io/remote/http_client.hpp"
#include "utf8.hpp"

namespace eredu::io {

namespace {

// SHA-256 of the empty body: every request eredu signs is a GET without one.
constexpr std::string_view kEmptyBodySha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// ASCII only, whatever the process's locale (a UTF-8 locale must not keep a byte >= 0x80).
bool unreserved(unsigned char c) noexcept {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
         c == '_' || c == '~';
}

// SigV4's URI encoding: unreserved characters kept, every other byte %XX (upper-case hex);
// `/` kept only where `keep_slash` (the path of an object URL).
std::string uri_encode(std::string_view s, bool keep_slash) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (unreserved(c) || (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

bool is_hex(char c) noexcept { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }

// A URL component as SigV4 canonicalizes it, without decoding it first (S3 does not
// double-encode): an existing %XX escape is kept (its hex upper-cased), an unreserved byte is
// kept, `/` is kept where `keep_slash`, and any other byte is escaped. The encoding eredu's own
// URLs use is a fixed point, so they sign as botocore signs them.
std::string canonical_component(std::string_view s, bool keep_slash) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '%' && i + 2 < s.size() && is_hex(s[i + 1]) && is_hex(s[i + 2])) {
      out.push_back('%');
      out.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(s[i + 1]))));
      out.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(s[i + 2]))));
      i += 2;
    } else if (unreserved(c) || (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

std::string hex(const unsigned char* data, std::size_t size) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out(size * 2, '0');
  for (std::size_t i = 0; i < size; ++i) {
    out[2 * i] = digits[data[i] >> 4];
    out[2 * i + 1] = digits[data[i] & 0xf];
  }
  return out;
}

std::string sha256_hex(std::string_view data) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), md.data(), &len, EVP_sha256(), nullptr) != 1) {
    throw Error(errc::remote_error, {}, "SHA-256 failed in OpenSSL (signing an S3 request)");
  }
  return hex(md.data(), len);
}

using Mac = std::array<unsigned char, 32>;

Mac hmac_sha256(std::string_view key, std::string_view data) {
  Mac out{};
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
            data.size(), out.data(), &len) ||
      len != out.size()) {
    throw Error(errc::remote_error, {}, "HMAC-SHA256 failed in OpenSSL (signing an S3 request)");
  }
  return out;
}

std::string_view as_view(const Mac& m) noexcept { return {reinterpret_cast<const char*>(m.data()), m.size()}; }

// The parts of an absolute http(s) URL that SigV4 signs.
struct SplitUrl {
  std::string host;  // as the Host header carries it: with the port unless it is the scheme's default
  std::string path;  // from the first `/`, "/" when none
  std::string query;
};

SplitUrl split_url(std::string_view url) {
  bool https = false;
  std::string_view rest;
  auto nocase_prefix = [&](std::string_view p) {
    if (url.size() < p.size()) return false;
    for (std::size_t i = 0; i < p.size(); ++i) {
      if (std::tolower(static_cast<unsigned char>(url[i])) != p[i]) return false;
    }
    return true;
  };
  if (nocase_prefix("https://")) {
    https = true;
    rest = url.substr(8);
  } else if (nocase_prefix("http://")) {
    rest = url.substr(7);
  } else {
    throw Error(errc::invalid_argument, {}, "SigV4 signs http:// and https:// URLs only");
  }
  const auto end = rest.find_first_of("/?");
  std::string_view authority = rest.substr(0, end);
  std::string_view tail = end == std::string_view::npos ? std::string_view() : rest.substr(end);
  SplitUrl out;
  const auto colon = authority.rfind(':');
  if (colon != std::string_view::npos && authority.find(']', colon) == std::string_view::npos) {
    const std::string_view port = authority.substr(colon + 1);
    if (port.empty() || port == (https ? "443" : "80")) authority = authority.substr(0, colon);
  }
  out.host = std::string(authority);
  std::transform(out.host.begin(), out.host.end(), out.host.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const auto q = tail.find('?');
  out.path = std::string(q == std::string_view::npos ? tail : tail.substr(0, q));
  if (out.path.empty()) out.path = "/";
  if (q != std::string_view::npos) out.query = std::string(tail.substr(q + 1));
  return out;
}

// The canonical query string: each `name=value` canonically encoded, sorted by name then value.
std::string canonical_query(std::string_view query) {
  std::vector<std::pair<std::string, std::string>> pairs;
  while (!query.empty()) {
    const auto amp = query.find('&');
    const std::string_view item = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (item.empty()) continue;
    const auto eq = item.find('=');
    pairs.emplace_back(canonical_component(item.substr(0, eq), false),
                       eq == std::string_view::npos ? std::string() : canonical_component(item.substr(eq + 1), false));
  }
  std::sort(pairs.begin(), pairs.end());
  std::string out;
  for (const auto& [name, value] : pairs) {
    if (!out.empty()) out.push_back('&');
    out += name;
    out.push_back('=');
    out += value;
  }
  return out;
}

// One INI file as the AWS tools read it: `[section]`, `key = value`, `#`/`;` comments.
using Ini = std::map<std::string, std::map<std::string, std::string>, std::less<>>;

std::optional<Ini> read_ini(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  Ini ini;
  std::map<std::string, std::string>* section = nullptr;
  std::string line;
  while (std::getline(in, line)) {
    std::string_view l = trim(line);
    if (l.empty() || l.front() == '#' || l.front() == ';') continue;
    if (l.front() == '[') {
      const auto close = l.find(']');
      section = close == std::string_view::npos ? nullptr : &ini[std::string(trim(l.substr(1, close - 1)))];
      continue;
    }
    const auto eq = l.find('=');
    if (!section || eq == std::string_view::npos) continue;  // a nested (indented) block or junk
    std::string key(trim(l.substr(0, eq)));
    std::transform(key.begin(), key.end(), key.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    std::string_view value = trim(l.substr(eq + 1));
    // An inline comment needs a blank before it (a secret may hold `#`).
    for (std::size_t i = 1; i < value.size(); ++i) {
      if ((value[i] == '#' || value[i] == ';') && std::isspace(static_cast<unsigned char>(value[i - 1]))) {
        value = trim(value.substr(0, i));
        break;
      }
    }
    (*section)[std::move(key)] = std::string(value);
  }
  return ini;
}

// $variable (a leading `~/` is the home directory, as the AWS CLI reads it), else ~/.aws/NAME.
std::filesystem::path aws_file(const char* variable, const char* name) {
  const std::string home = env("HOME");
  const std::filesystem::path home_dir(home.empty() ? "." : home);
  if (std::string v = env(variable); !v.empty()) {
    return v.rfind("~/", 0) == 0 ? home_dir / v.substr(2) : std::filesystem::path(v);
  }
  return home_dir / ".aws" / name;
}

// The profile, and whether someone named it (a named profile that is missing is an error; a
// missing `default` just means no credentials).
std::pair<std::string, bool> chosen_profile(const S3Options& options) {
  if (!options.profile.empty()) return {options.profile, true};
  if (std::string p = env("AWS_PROFILE"); !p.empty()) return {p, true};
  return {"default", false};
}

// The profile's section of ~/.aws/config: `[default]`, `[profile NAME]` otherwise.
const std::map<std::string, std::string>* config_section(const Ini& ini, const std::string& profile) {
  if (auto it = ini.find("profile " + profile); it != ini.end()) return &it->second;
  if (profile == "default") {
    if (auto it = ini.find("default"); it != ini.end()) return &it->second;
  }
  return nullptr;
}

std::string value_of(const std::map<std::string, std::string>& section, const char* key) {
  const auto it = section.find(key);
  return it == section.end() ? std::string() : it->second;
}

// Credentials of one profile section; nullopt when it holds no key pair at all.
std::optional<AwsCredentials> from_section(const std::map<std::string, std::string>& section,
                                           const std::string& where) {
  AwsCredentials c;
  c.access_key_id = value_of(section, "aws_access_key_id");
  c.secret_access_key = value_of(section, "aws_secret_access_key");
  c.session_token = value_of(section, "aws_session_token");
  if (c.access_key_id.empty() && c.secret_access_key.empty()) return std::nullopt;
  if (c.access_key_id.empty() || c.secret_access_key.empty()) {
    throw Error(errc::access_denied, {},
                fmt::format("{} has {} without {}", where,
                            c.access_key_id.empty() ? "aws_secret_access_key" : "aws_access_key_id",
                            c.access_key_id.empty() ? "aws_access_key_id" : "aws_secret_access_key"));
  }
  c.source = where;
  return c;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// A bucket name that can be a DNS label under a TLS wildcard (no dots, lower case).
bool dns_compatible(std::string_view bucket) noexcept {
  if (bucket.size() < 3 || bucket.size() > 63) return false;
  if (bucket.front() == '-' || bucket.back() == '-') return false;
  return std::all_of(bucket.begin(), bucket.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; });
}

}  // namespace

AwsCredentials find_credentials(const S3Options& options) {
  if (options.anonymous) return AwsCredentials{.source = "anonymous"};
  const std::string key = env("AWS_ACCESS_KEY_ID");
  const std::string secret = env("AWS_SECRET_ACCESS_KEY");
  if (!key.empty() || !secret.empty()) {
    if (key.empty() || secret.empty()) {
      throw Error(
          errc::access_denied, {},
          fmt::format("the environment has {} without {}", key.empty() ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID",
                      key.empty() ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY"));
    }
    return AwsCredentials{.access_key_id = key,
                          .secret_access_key = secret,
                          .session_token = env("AWS_SESSION_TOKEN"),
                          .source = "environment"};
  }
  const auto [profile, named] = chosen_profile(options);
  const std::filesystem::path credentials_file = aws_file("AWS_SHARED_CREDENTIALS_FILE", "credentials");
  const std::filesystem::path config_file = aws_file("AWS_CONFIG_FILE", "config");
  bool found = false;
  if (const auto ini = read_ini(credentials_file)) {
    if (auto it = ini->find(profile); it != ini->end()) {
      found = true;
      if (auto c = from_section(it->second, fmt::format("{} [{}]", credentials_file.string(), profile))) return *c;
    }
  }
  // The AWS CLI also takes a key pair written in the config file's profile.
  if (const auto ini = read_ini(config_file)) {
    if (const auto* section = config_section(*ini, profile)) {
      found = true;
      if (auto c = from_section(*section, fmt::format("{} [{}]", config_file.string(), profile))) return *c;
    }
  }
  if (named) {
    throw Error(errc::access_denied, {},
                found ? fmt::format("AWS profile '{}' has no aws_access_key_id in {} or {} (eredu reads "
                                    "static keys only)",
                                    profile, credentials_file.string(), config_file.string())
                      : fmt::format("AWS profile '{}' is not in {} nor in {}", profile, credentials_file.string(),
                                    config_file.string()));
  }
  return AwsCredentials{.source = "anonymous"};
}

std::string find_region(const S3Options& options) {
  if (!options.region.empty()) return options.region;
  if (std::string r = env("AWS_REGION"); !r.empty()) return r;
  if (std::string r = env("AWS_DEFAULT_REGION"); !r.empty()) return r;
  if (const auto ini = read_ini(aws_file("AWS_CONFIG_FILE", "config"))) {
    if (const auto* section = config_section(*ini, chosen_profile(options).first)) {
      if (std::string r = value_of(*section, "region"); !r.empty()) return r;
    }
  }
  return "us-east-1";
}

SigV4Signer::SigV4Signer(AwsCredentials credentials, std::string region, std::string service)
    : credentials_(std::move(credentials)), region_(std::move(region)), service_(std::move(service)) {}

HttpHeaders SigV4Signer::sign(std::string_view method, std::string_view url) const {
  return sign_at(method, url, std::chrono::system_clock::now());
}

HttpHeaders SigV4Signer::sign_at(std::string_view method, std::string_view url,
                                 std::chrono::system_clock::time_point when) const {
  const SplitUrl parts = split_url(url);
  const std::time_t t = std::chrono::system_clock::to_time_t(when);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char stamp[17];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
  const std::string amz_date(stamp);
  const std::string date = amz_date.substr(0, 8);

  // Canonical headers, sorted by name (host < x-amz-content-sha256 < x-amz-date < x-amz-security-token).
  std::vector<std::pair<std::string, std::string>> headers{
      {"host", parts.host}, {"x-amz-content-sha256", std::string(kEmptyBodySha256)}, {"x-amz-date", amz_date}};
  if (!credentials_.session_token.empty()) headers.emplace_back("x-amz-security-token", credentials_.session_token);
  std::string canonical_headers;
  std::string signed_headers;
  for (const auto& [name, value] : headers) {
    canonical_headers += fmt::format("{}:{}\n", name, trim(value));
    if (!signed_headers.empty()) signed_headers.push_back(';');
    signed_headers += name;
  }
  std::string upper_method(method);
  std::transform(upper_method.begin(), upper_method.end(), upper_method.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  const std::string canonical_request =
      fmt::format("{}\n{}\n{}\n{}\n{}\n{}", upper_method, canonical_component(parts.path, true),
                  canonical_query(parts.query), canonical_headers, signed_headers, kEmptyBodySha256);
  const std::string scope = fmt::format("{}/{}/{}/aws4_request", date, region_, service_);
  const std::string string_to_sign =
      fmt::format("AWS4-HMAC-SHA256\n{}\n{}\n{}", amz_date, scope, sha256_hex(canonical_request));
  const Mac k_date = hmac_sha256("AWS4" + credentials_.secret_access_key, date);
  const Mac k_region = hmac_sha256(as_view(k_date), region_);
  const Mac k_service = hmac_sha256(as_view(k_region), service_);
  const Mac k_signing = hmac_sha256(as_view(k_service), "aws4_request");
  const Mac signature = hmac_sha256(as_view(k_signing), string_to_sign);

  HttpHeaders out;
  out.emplace_back("x-amz-date", amz_date);
  out.emplace_back("x-amz-content-sha256", std::string(kEmptyBodySha256));
  if (!credentials_.session_token.empty()) out.emplace_back("x-amz-security-token", credentials_.session_token);
  out.emplace_back("authorization", fmt::format("AWS4-HMAC-SHA256 Credential={}/{}, SignedHeaders={}, Signature={}",
                                                credentials_.access_key_id, scope, signed_headers,
                                                hex(signature.data(), signature.size())));
  return out;
}

S3Endpoint::S3Endpoint(std::string bucket, const S3Options& options) : bucket_(std::move(bucket)) {
  if (bucket_.empty() || bucket_.find('/') != std::string::npos) {
    throw Error(errc::invalid_argument, {.file = "s3://" + bucket_}, "not an S3 bucket name");
  }
  const std::string region = find_region(options);
  std::string endpoint = options.endpoint;
  if (endpoint.empty()) endpoint = env("AWS_ENDPOINT_URL_S3");
  if (endpoint.empty()) endpoint = env("AWS_ENDPOINT_URL");
  const bool custom = !endpoint.empty();
  if (!custom) endpoint = fmt::format("https://s3.{}.amazonaws.com", region);
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  const auto sep = endpoint.find("://");
  const std::string scheme = sep == std::string::npos ? std::string() : lower(endpoint.substr(0, sep));
  if (scheme != "http" && scheme != "https") {
    // Not printed: a malformed endpoint may hold anything, a credential included.
    throw Error(errc::invalid_argument, {}, "the S3 endpoint is not an http:// or https:// URL");
  }
  const std::string rest = endpoint.substr(sep + 3);
  const auto slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  const std::string path = slash == std::string::npos ? std::string() : rest.substr(slash);
  if (authority.empty() || authority.find('@') != std::string::npos || rest.find('?') != std::string::npos) {
    throw Error(errc::invalid_argument, {}, "the S3 endpoint needs a host, and takes no user info and no query");
  }
  S3Options::Addressing style = options.addressing;
  if (style == S3Options::Addressing::automatic) {
    style = !custom && dns_compatible(bucket_) ? S3Options::Addressing::virtual_host : S3Options::Addressing::path;
  }
  if (style == S3Options::Addressing::virtual_host) {
    if (!dns_compatible(bucket_)) {
      throw Error(errc::invalid_argument, {.file = "s3://" + bucket_},
                  "virtual-host addressing needs a bucket name that is a DNS label (lower case, digits, '-', "
                  "3 to 63 characters, no '.'); use path addressing");
    }
    base_ = fmt::format("{}://{}.{}{}", scheme, bucket_, authority, path);
  } else {
    base_ = fmt::format("{}://{}{}/{}", scheme, authority, path, uri_encode(bucket_, false));
  }
  AwsCredentials credentials = find_credentials(options);
  source_ = credentials.anonymous() ? std::string("anonymous") : credentials.source;
  if (!credentials.anonymous()) signer_.emplace(std::move(credentials), region);
}

std::string S3Endpoint::object_url(std::string_view key) const { return base_ + "/" + uri_encode(key, true); }

std::string S3Endpoint::list_url(std::string_view prefix, std::string_view continuation) const {
  // Parameters in the order SigV4 sorts them, so the URL sent is its own canonical query.
  std::string url = base_ + "/?";
  if (!continuation.empty()) url += "continuation-token=" + uri_encode(continuation, false) + "&";
  url += "list-type=2";
  if (!prefix.empty()) url += "&prefix=" + uri_encode(prefix, false);
  return url;
}

const RequestSigner* S3Endpoint::signer() const noexcept { return signer_ ? &*signer_ : nullptr; }

std::string_view S3Endpoint::credentials_source() const noexcept { return source_; }

namespace {

[[noreturn]] void bad_listing(std::string_view url, std::string_view why) {
  throw Error(errc::remote_error, {.file = std::string(url)}, fmt::format("not an S3 ListObjectsV2 answer: {}", why));
}

// The text of an element, its entities decoded; markup inside it is refused.
std::string decode_text(std::string_view text, std::string_view url) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '<' || c == '>') bad_listing(url, "markup inside a text element");
    if (c != '&') {
      out.push_back(c);
      continue;
    }
    const auto semi = text.find(';', i);
    if (semi == std::string_view::npos || semi - i > 12) bad_listing(url, "an unterminated entity");
    const std::string_view name = text.substr(i + 1, semi - i - 1);
    if (name == "amp") {
      out.push_back('&');
    } else if (name == "lt") {
      out.push_back('<');
    } else if (name == "gt") {
      out.push_back('>');
    } else if (name == "quot") {
      out.push_back('"');
    } else if (name == "apos") {
      out.push_back('\'');
    } else if (name.size() >= 2 && name[0] == '#') {
      const bool is_hex_ref = name[1] == 'x' || name[1] == 'X';
      const std::string_view digits = name.substr(is_hex_ref ? 2 : 1);
      std::uint32_t cp = 0;
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), cp, is_hex_ref ? 16 : 10);
      if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || cp == 0 || cp > 0x10FFFF ||
          (cp >= 0xD800 && cp <= 0xDFFF)) {
        bad_listing(url, "a bad character reference");
      }
      detail::append_utf8(out, cp);
    } else {
      bad_listing(url, "an unknown entity");
    }
    i = semi;
  }
  return out;
}

// The content of the first `<name>…</name>` in `xml` at or after `from` (no attributes: S3's
// listing elements carry none), or nullopt; `end` gets the position after the closing tag.
std::optional<std::string_view> element(std::string_view xml, std::string_view name, std::size_t from,
                                        std::size_t* end = nullptr) {
  const std::string open = fmt::format("<{}>", name);
  const std::string close = fmt::format("</{}>", name);
  const auto start = xml.find(open, from);
  if (start == std::string_view::npos) return std::nullopt;
  const auto body = start + open.size();
  const auto stop = xml.find(close, body);
  if (stop == std::string_view::npos) return std::nullopt;
  if (end) *end = stop + close.size();
  return xml.substr(body, stop - body);
}

}  // namespace

std::pair<std::vector<S3Object>, std::string> parse_list_objects(std::string_view xml, std::string_view url) {
  // The root element, after an optional declaration and blanks.
  std::size_t at = 0;
  while (at < xml.size() && std::isspace(static_cast<unsigned char>(xml[at]))) ++at;
  if (xml.substr(at, 5) == "<?xml") {
    const auto decl_end = xml.find("?>", at);
    if (decl_end == std::string_view::npos) bad_listing(url, "an unterminated XML declaration");
    at = decl_end + 2;
    while (at < xml.size() && std::isspace(static_cast<unsigned char>(xml[at]))) ++at;
  }
  constexpr std::string_view root = "<ListBucketResult";
  if (xml.substr(at, root.size()) != root || (at + root.size() < xml.size() && xml[at + root.size()] != '>' &&
                                              !std::isspace(static_cast<unsigned char>(xml[at + root.size()])))) {
    if (xml.substr(at, 7) == "<Error>") {
      const auto code = element(xml, "Code", at);
      bad_listing(url, fmt::format("the server answered an S3 error ({})",
                                   code ? decode_text(code->substr(0, 64), url) : std::string("no code")));
    }
    bad_listing(url, "the body is not a ListBucketResult");
  }
  const auto root_close = xml.rfind("</ListBucketResult>");
  if (root_close == std::string_view::npos || root_close < at) bad_listing(url, "ListBucketResult is not closed");
  const std::string_view body = xml.substr(at, root_close - at);

  std::vector<S3Object> objects;
  std::string_view rest = body;
  for (std::size_t pos = 0;;) {
    std::size_t end = 0;
    const auto contents = element(rest, "Contents", pos, &end);
    if (!contents) {
      if (rest.find("<Contents>", pos) != std::string_view::npos) bad_listing(url, "a Contents element is not closed");
      break;
    }
    const auto key = element(*contents, "Key", 0);
    const auto size = element(*contents, "Size", 0);
    if (!key || !size) bad_listing(url, "a Contents element without Key or Size");
    S3Object object;
    object.key = decode_text(*key, url);
    const auto [p, ec] = std::from_chars(size->data(), size->data() + size->size(), object.size);
    if (size->empty() || ec != std::errc() || p != size->data() + size->size()) {
      bad_listing(url, fmt::format("Size '{}' of a Contents element is not a number", size->substr(0, 32)));
    }
    if (const auto etag = element(*contents, "ETag", 0)) object.etag = decode_text(*etag, url);
    objects.push_back(std::move(object));
    pos = end;
  }
  // The top-level fields sit outside every Contents element: strip those first.
  std::string top;
  for (std::size_t pos = 0;;) {
    const auto open = body.find("<Contents>", pos);
    top += body.substr(pos, open == std::string_view::npos ? std::string_view::npos : open - pos);
    if (open == std::string_view::npos) break;
    const auto close = body.find("</Contents>", open);
    pos = close + std::string_view("</Contents>").size();
  }
  std::string token;
  if (const auto truncated = element(top, "IsTruncated", 0)) {
    if (*truncated == "true") {
      const auto next = element(top, "NextContinuationToken", 0);
      if (!next || next->empty()) bad_listing(url, "IsTruncated is true without a NextContinuationToken");
      token = decode_text(*next, url);
    } else if (*truncated != "false") {
      bad_listing(url, "IsTruncated is neither true nor false");
    }
  }
  return {std::move(objects), std::move(token)};
}

std::vector<S3Object> list_objects(HttpClient& client, const S3Endpoint& endpoint, std::string_view prefix) {
  std::vector<S3Object> objects;
  std::string token;
  for (;;) {
    const std::string url = endpoint.list_url(prefix, token);
    const std::string shown = redacted(parse_remote_url(url));
    const DocumentResult page = client.get_blocking(DocumentGet{.url = url, .signer = endpoint.signer()});
    auto [found, next] = parse_list_objects(page.body, shown);
    objects.insert(objects.end(), std::make_move_iterator(found.begin()), std::make_move_iterator(found.end()));
    if (next.empty()) break;
    // A server that hands back the token it was given would list forever.
    if (next == token)
      throw Error(errc::remote_error, {.file = shown}, "the S3 listing repeats its continuation token");
    token = std::move(next);
  }
  std::stable_sort(objects.begin(), objects.end(), [](const S3Object& a, const S3Object& b) { return a.key < b.key; });
  return objects;
}

}  // namespace eredu::io
