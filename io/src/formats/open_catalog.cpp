#include "eredu/io/formats/open_catalog.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "catalog_assembly.hpp"
#include "eredu/core/error.hpp"
#include "eredu/io/formats/checkpoint_format.hpp"
#include "eredu/io/formats/sharded_index.hpp"
#include "eredu/io/formats/split_gguf.hpp"
#include "eredu/io/reading/regular_file.hpp"

namespace eredu::io {
namespace {

using detail::Naming;
using detail::ParsedFile;

namespace fs = std::filesystem;

constexpr std::string_view index_file_name = "model.safetensors.index.json";

std::error_code last_os_error() noexcept { return {errno, std::system_category()}; }

// Refuses a file whose real location (symbolic links resolved) is outside `root`.
void check_confined(int fd, const std::string& path, const std::filesystem::path& root, const Naming& naming) {
  if (root.empty()) return;
  const std::filesystem::path real = real_path_of(fd, path);
  if (!is_inside(real, root)) {
    throw Error(errc::outside_root, {.file = path},
                fmt::format("the {} resolves to {}, outside {} (CatalogOptions::confine_to)", naming.role,
                            real.empty() ? std::string("an unknown place") : real.string(), root.string()));
  }
}

// Parses the checkpoint file at `path`.
ParsedFile parse_file(const std::string& path, const Naming& naming, const CatalogOptions& options) {
  RegularFile opened = open_regular_file(path);
  if (!opened) {
    if (!opened.not_regular.empty()) {
      throw Error(
          errc::unknown_format, {.file = path},
          fmt::format("the {} is {}, not a regular file, so not a checkpoint", naming.role, opened.not_regular));
    }
    const bool missing = opened.error == std::errc::no_such_file_or_directory;
    throw Error(missing ? naming.missing : errc::io_error, {.file = path, .os_error = opened.error},
                fmt::format("the {} {}", naming.role, missing ? "does not exist" : "cannot be opened"));
  }
  const int fd = opened.fd.get();
  check_confined(fd, path, options.confine_to, naming);
  const struct stat& st = opened.status;
  const auto size = static_cast<std::uint64_t>(st.st_size);
  std::array<std::byte, 64> head{};
  std::size_t got = 0;
  while (got < head.size() && got < size) {
    const ssize_t r = ::pread(fd, head.data() + got, head.size() - got, static_cast<off_t>(got));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw Error(errc::io_error, {.file = path, .offset = got, .os_error = last_os_error()},
                  "cannot read the start of the checkpoint file");
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  FileHeaderReader reader(fd, size, path);
  ParsedFile out = detail::parse_layout(reader, std::span(head.data(), got), size, path);
  out.file.device = static_cast<std::uint64_t>(st.st_dev);
  out.file.inode = static_cast<std::uint64_t>(st.st_ino);
  out.file.stamp = FileStamp::of(st);
  return out;
}

Catalog open_single(const std::string& path, const CatalogOptions& options) {
  return detail::assemble_single(parse_file(path, {errc::io_error, "checkpoint file"}, options));
}

Catalog open_sharded(const fs::path& index_path, const CatalogOptions& options) {
  const std::string index_name = index_path.string();
  const ShardedIndex index = read_sharded_index(index_name, options.confine_to);
  const fs::path dir = index_path.parent_path();
  return detail::assemble_sharded(index, index_name, [&](const std::string& name, const Naming& naming) {
    return parse_file((dir / name).string(), naming, options);
  });
}

// A split GGUF checkpoint: every file of the set `any` names, cross-checked (split_gguf.hpp).
Catalog open_split_gguf(const fs::path& any, const gguf::SplitName& split, const CatalogOptions& options) {
  const fs::path dir = any.parent_path();
  return detail::assemble_split_gguf(split, any.filename().string(),
                                     [&](const std::string& name, const Naming& naming) {
                                       return parse_file((dir / name).string(), naming, options);
                                     });
}

// A file path: split GGUF by name, otherwise one file.
Catalog open_file(const fs::path& path, const CatalogOptions& options) {
  if (auto split = gguf::parse_split_name(path.filename().string())) return open_split_gguf(path, *split, options);
  return open_single(path.string(), options);
}

}  // namespace

Catalog open_catalog(const fs::path& path, const CatalogOptions& options) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec) throw Error(errc::io_error, {.file = path.string(), .os_error = ec}, "cannot open the checkpoint");
  if (fs::is_directory(status)) {
    const fs::path index = path / index_file_name;
    if (fs::exists(index, ec)) return open_sharded(index, options);
    std::vector<fs::path> candidates, ggufs;
    for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
      const auto& p = it->path();
      if (p.extension() == ".safetensors" && it->is_regular_file(ec)) candidates.push_back(p);
      if (p.extension() == ".gguf" && it->is_regular_file(ec)) ggufs.push_back(p);
    }
    if (ec) throw Error(errc::io_error, {.file = path.string(), .os_error = ec}, "cannot list the directory");
    std::sort(candidates.begin(), candidates.end());
    std::sort(ggufs.begin(), ggufs.end());
    if (candidates.size() == 1) return open_single(candidates.front().string(), options);
    if (candidates.empty() && !ggufs.empty()) {
      // One GGUF file, or the files of one split set.
      const auto first = gguf::parse_split_name(ggufs.front().filename().string());
      const bool one_set = first && std::all_of(ggufs.begin(), ggufs.end(), [&](const fs::path& p) {
                             const auto s = gguf::parse_split_name(p.filename().string());
                             return s && s->prefix == first->prefix && s->count == first->count;
                           });
      if (one_set) return open_split_gguf(ggufs.front(), *first, options);
      if (ggufs.size() == 1) return open_single(ggufs.front().string(), options);
      throw Error(errc::unknown_format, {.file = path.string()},
                  fmt::format("the directory holds {} *.gguf files ({}, {}, ...) that are not one split set; open one "
                              "file",
                              ggufs.size(), ggufs[0].filename().string(), ggufs[1].filename().string()));
    }
    if (candidates.empty()) {
      throw Error(errc::unknown_format, {.file = path.string()},
                  fmt::format("the directory holds no checkpoint: no {}, no *.safetensors and no *.gguf file",
                              index_file_name));
    }
    throw Error(errc::unknown_format, {.file = path.string()},
                fmt::format("the directory holds {} *.safetensors files ({}, {}, ...) and no {}; open "
                            "one file, or the index of a sharded checkpoint",
                            candidates.size(), candidates[0].filename().string(), candidates[1].filename().string(),
                            index_file_name));
  }
  const std::string name = path.filename().string();
  if (name.ends_with(".index.json")) return open_sharded(path, options);
  return open_file(path, options);
}

}  // namespace eredu::io
