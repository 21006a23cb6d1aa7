#include "eredu/io/formats/sharded_index.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <unordered_map>

#include "eredu/core/error.hpp"
#include "eredu/io/reading/regular_file.hpp"
#include "json.hpp"

namespace eredu::io {
namespace {

// An index is a few MB even for the largest models; the cap keeps a hostile file from
// making us allocate without bound.
constexpr std::uint64_t max_index_size = 100'000'000;

[[noreturn]] void fail(const std::string& path, std::optional<std::uint64_t> offset, const std::string& detail) {
  throw Error(errc::invalid_index, {.file = path, .offset = offset}, detail);
}

// Shards must stay inside the index's directory: one plain file name.
std::string_view bad_shard_name_reason(std::string_view name) noexcept {
  if (name.empty()) return "is empty";
  if (name == "." || name == "..") return "is not a file name";
  if (name.find('/') != std::string_view::npos)
    return "contains `/` (shards must be plain file names in the index's directory)";
  if (name.find('\\') != std::string_view::npos) return "contains `\\`";
  if (name.find('\0') != std::string_view::npos) return "contains a NUL byte";
  return {};
}

}  // namespace

std::vector<std::string> ShardedIndex::shards() const {
  std::vector<std::string> out;
  out.reserve(weight_map.size());
  for (const auto& [tensor, shard] : weight_map) out.push_back(shard);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

ShardedIndex parse_sharded_index(std::string_view text, const std::string& path) {
  if (auto bad = json::find_invalid_utf8(text)) {
    fail(path, *bad, fmt::format("byte {} of the index is not valid UTF-8", *bad));
  }
  std::optional<json::Document> doc;
  try {
    doc = json::Document::parse(text);
  } catch (const json::SyntaxError& e) {
    fail(path, e.offset(), fmt::format("invalid JSON at offset {}: {}", e.offset(), e.what()));
  }
  const json::Value root = doc->root();
  if (root.kind() != json::Kind::object) {
    fail(path, root.offset(), fmt::format("the index is a JSON {}, not an object", json::kind_name(root.kind())));
  }
  ShardedIndex index;
  std::optional<json::Value> metadata, weight_map;
  for (const auto& m : root.members()) {
    const std::string_view key = m.key.as_string();
    auto* slot = key == "metadata" ? &metadata : key == "weight_map" ? &weight_map : nullptr;
    if (!slot) continue;  // other keys are conventions we do not need
    if (*slot) fail(path, m.key.offset(), fmt::format("`{}` given twice", key));
    *slot = m.value;
  }
  if (metadata && metadata->kind() != json::Kind::null) {
    if (metadata->kind() != json::Kind::object) {
      fail(path, metadata->offset(),
           fmt::format("`metadata` must be an object, not a {}", json::kind_name(metadata->kind())));
    }
    for (const auto& m : metadata->members()) {
      // Readers want strings; "total_size": 4305 becomes "4305".
      std::string value = m.value.kind() == json::Kind::string ? std::string(m.value.as_string()) : m.value.to_json();
      index.metadata.insert_or_assign(std::string(m.key.as_string()), std::move(value));
    }
  }
  if (!weight_map) fail(path, std::nullopt, "the index has no `weight_map`");
  if (weight_map->kind() != json::Kind::object) {
    fail(path, weight_map->offset(),
         fmt::format("`weight_map` must be an object, not a {}", json::kind_name(weight_map->kind())));
  }
  index.weight_map.reserve(weight_map->size());
  std::unordered_map<std::string_view, std::size_t> seen;
  seen.reserve(weight_map->size());
  for (const auto& m : weight_map->members()) {
    const std::string_view tensor = m.key.as_string();
    if (m.value.kind() != json::Kind::string) {
      fail(path, m.value.offset(),
           fmt::format("weight_map entry for tensor '{}' must be a shard file name, not a {}", tensor,
                       json::kind_name(m.value.kind())));
    }
    const std::string_view shard = m.value.as_string();
    if (auto why = bad_shard_name_reason(shard); !why.empty()) {
      fail(path, m.value.offset(), fmt::format("shard name \"{}\" of tensor '{}' {}", shard, tensor, why));
    }
    if (!seen.try_emplace(tensor, m.key.offset()).second) {
      fail(path, m.key.offset(),
           fmt::format("tensor '{}' is listed twice in weight_map (first at offset {})", tensor, seen[tensor]));
    }
    index.weight_map.emplace_back(std::string(tensor), std::string(shard));
  }
  return index;
}

ShardedIndex read_sharded_index(const std::string& path, const std::filesystem::path& confine_to) {
  RegularFile opened = open_regular_file(path);
  if (!opened) {
    if (!opened.not_regular.empty()) {
      throw Error(errc::unknown_format, {.file = path},
                  fmt::format("the sharded-checkpoint index is {}, not a regular file", opened.not_regular));
    }
    throw Error(errc::io_error, {.file = path, .os_error = opened.error}, "cannot open the sharded-checkpoint index");
  }
  const int fd = opened.fd.get();
  if (!confine_to.empty()) {
    const std::filesystem::path real = real_path_of(fd, path);
    if (!is_inside(real, confine_to)) {
      throw Error(errc::outside_root, {.file = path},
                  fmt::format("the sharded-checkpoint index resolves to {}, outside {} (CatalogOptions::confine_to)",
                              real.empty() ? std::string("an unknown place") : real.string(), confine_to.string()));
    }
  }
  auto os_fail = [&](const char* what) {
    const int err = errno;
    throw Error(errc::io_error, {.file = path, .os_error = std::error_code(err, std::system_category())}, what);
  };
  const struct stat& st = opened.status;
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size > max_index_size) {
    fail(path, std::nullopt, fmt::format("the index is {} bytes, more than the {}-byte limit", size, max_index_size));
  }
  std::string text(static_cast<std::size_t>(size), '\0');
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t r = ::pread(fd, text.data() + done, text.size() - done, static_cast<off_t>(done));
    if (r < 0) {
      if (errno == EINTR) continue;
      os_fail("reading the sharded-checkpoint index failed");
    }
    if (r == 0) break;
    done += static_cast<std::size_t>(r);
  }
  text.resize(done);
  return parse_sharded_index(text, path);
}

}  // namespace eredu::io
