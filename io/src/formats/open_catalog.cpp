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

#include "eredu/core/error.hpp"
#include "eredu/io/formats/checkpoint_format.hpp"
#include "eredu/io/formats/sharded_index.hpp"
#include "eredu/io/formats/split_gguf.hpp"
#include "eredu/io/reading/regular_file.hpp"

namespace eredu::io {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view index_file_name = "model.safetensors.index.json";

std::error_code last_os_error() noexcept { return {errno, std::system_category()}; }

// One parsed file: what goes into the catalog.
struct ParsedFile {
  CheckpointFile file;
  std::vector<TensorInfo> tensors;
};

const CheckpointFormat& pick_format(std::span<const std::byte> head, std::string_view path) {
  const auto formats = checkpoint_formats();
  for (const CheckpointFormat* f : formats) {
    if (f->probe(head, path)) return *f;
  }
  return *formats.back();
}

// Who named a file, for messages: a shard names the index and how many tensors it holds.
struct Naming {
  errc missing = errc::io_error;  // kind for a file that does not exist
  std::string role;               // "checkpoint file", "shard named by X for N tensors"
};

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
  const CheckpointFormat& format = pick_format(std::span(head.data(), got), path);
  FileLayout layout = format.parse(fd, size, path);
  ParsedFile out;
  out.file.path = path;
  out.file.format = layout.format.empty() ? std::string(format.name()) : layout.format;
  out.file.size = size;
  out.file.data_offset = layout.data_offset;
  out.file.metadata = std::move(layout.metadata);
  out.file.device = static_cast<std::uint64_t>(st.st_dev);
  out.file.inode = static_cast<std::uint64_t>(st.st_ino);
  out.file.stamp = FileStamp::of(st);
  out.tensors = std::move(layout.tensors);
  return out;
}

void add_to_catalog(Catalog& catalog, ParsedFile&& parsed) {
  const std::uint32_t index = catalog.add_file(std::move(parsed.file));
  for (auto& t : parsed.tensors) {
    t.file = index;
    catalog.add_tensor(std::move(t));
  }
}

Catalog open_single(const std::string& path, const CatalogOptions& options) {
  ParsedFile parsed = parse_file(path, {errc::io_error, "checkpoint file"}, options);
  Catalog catalog;
  catalog.set_metadata(parsed.file.metadata);
  add_to_catalog(catalog, std::move(parsed));
  return catalog;
}

Catalog open_sharded(const fs::path& index_path, const CatalogOptions& options) {
  const std::string index_name = index_path.string();
  const ShardedIndex index = read_sharded_index(index_name, options.confine_to);
  const fs::path dir = index_path.parent_path();

  std::vector<ParsedFile> shards;
  std::unordered_map<std::string_view, std::size_t> shard_of_name;  // shard file name -> shards[i]
  const std::vector<std::string> names = index.shards();
  shards.reserve(names.size());
  for (const auto& name : names) {
    std::size_t listed = 0;
    for (const auto& entry : index.weight_map) listed += entry.second == name;
    const Naming naming{errc::shard_missing,
                        fmt::format("shard named by {} for {} tensor{}", index_name, listed, listed == 1 ? "" : "s")};
    shards.push_back(parse_file((dir / name).string(), naming, options));
    shard_of_name.emplace(name, shards.size() - 1);
  }

  // Where each tensor actually is (first shard that has it).
  std::unordered_map<std::string_view, std::size_t> found;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    for (const auto& t : shards[s].tensors) found.try_emplace(t.name, s);
  }

  // The checks of st_check.py, in its order.
  for (const auto& mapping : index.weight_map) {
    // Named, not a structured binding: clang 14 cannot capture bindings in lambdas.
    const std::string& tensor = mapping.first;
    const auto& in_named = shards[shard_of_name.at(mapping.second)];
    const bool present = std::any_of(in_named.tensors.begin(), in_named.tensors.end(),
                                     [&](const TensorInfo& t) { return t.name == tensor; });
    if (!present) {
      auto it = found.find(tensor);
      throw Error(errc::tensor_missing_from_shard, {.file = in_named.file.path, .tensor = tensor},
                  fmt::format("{} maps the tensor to this shard, but the shard does not contain it{}", index_name,
                              it == found.end() ? std::string("; no shard does")
                                                : fmt::format("; it is in {}", shards[it->second].file.path)));
    }
  }
  for (std::size_t s = 0; s < shards.size(); ++s) {
    for (const auto& t : shards[s].tensors) {
      const std::size_t first = found.at(t.name);
      if (first != s) {
        throw Error(errc::tensor_in_two_shards, {.file = shards[s].file.path, .tensor = t.name, .offset = t.offset},
                    fmt::format("the tensor is also in {}", shards[first].file.path));
      }
    }
  }
  std::unordered_map<std::string_view, std::string_view> listed;
  listed.reserve(index.weight_map.size());
  for (const auto& [tensor, shard] : index.weight_map) listed.emplace(tensor, shard);
  for (const auto& shard : shards) {
    for (const auto& t : shard.tensors) {
      if (!listed.contains(t.name)) {
        throw Error(errc::tensor_not_in_index, {.file = shard.file.path, .tensor = t.name, .offset = t.offset},
                    fmt::format("the shard holds this tensor but {} does not list it", index_name));
      }
    }
  }

  Catalog catalog;
  catalog.set_metadata(index.metadata);
  for (auto& shard : shards) add_to_catalog(catalog, std::move(shard));
  return catalog;
}

// A split-file key as an integer, or nullopt when absent or not an integer.
std::optional<std::uint64_t> metadata_integer(const ParsedFile& f, std::string_view key) {
  auto it = f.file.metadata.find(std::string(key));
  if (it == f.file.metadata.end() || it->second.empty()) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : it->second) {
    if (c < '0' || c > '9' || __builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, c - '0', &v))
      return std::nullopt;
  }
  return v;
}

// A split GGUF checkpoint: every file of the set `any` names, cross-checked (split_gguf.hpp).
Catalog open_split_gguf(const fs::path& any, const gguf::SplitName& split, const CatalogOptions& options) {
  const fs::path dir = any.parent_path();
  std::vector<ParsedFile> files;
  files.reserve(split.count);
  for (std::uint32_t i = 1; i <= split.count; ++i) {
    const fs::path p = dir / gguf::split_file_name(split.prefix, i, split.count);
    const Naming naming{errc::shard_missing,
                        fmt::format("split file {} of {} of {}", i, split.count, any.filename().string())};
    files.push_back(parse_file(p.string(), naming, options));
    const ParsedFile& f = files.back();
    if (f.file.format != "gguf") {
      throw Error(errc::split_mismatch, {.file = f.file.path},
                  fmt::format("a split GGUF file is {}, not GGUF", f.file.format));
    }
    const auto no = metadata_integer(f, gguf::split_no_key);
    const auto count = metadata_integer(f, gguf::split_count_key);
    if (split.count == 1 && !no && !count) continue;  // a single file that merely looks split
    if (!no || !count || *no != i - 1 || *count != split.count) {
      throw Error(errc::split_mismatch, {.file = f.file.path},
                  fmt::format("the file name says split {} of {}, but the file's {} is {} and its {} is {} (expected "
                              "{} and {})",
                              i, split.count, gguf::split_no_key, no ? std::to_string(*no) : "missing",
                              gguf::split_count_key, count ? std::to_string(*count) : "missing", i - 1, split.count));
    }
  }
  std::unordered_map<std::string_view, std::size_t> where;
  std::uint64_t total = 0;
  for (std::size_t s = 0; s < files.size(); ++s) {
    for (const auto& t : files[s].tensors) {
      auto [it, inserted] = where.try_emplace(t.name, s);
      if (!inserted) {
        throw Error(errc::tensor_in_two_shards, {.file = files[s].file.path, .tensor = t.name, .offset = t.offset},
                    fmt::format("the tensor is also in {}", files[it->second].file.path));
      }
      ++total;
    }
  }
  if (auto declared = metadata_integer(files.front(), gguf::split_tensors_count_key); declared && *declared != total) {
    throw Error(errc::split_mismatch, {.file = files.front().file.path},
                fmt::format("{} is {} but the {} files hold {} tensors", gguf::split_tensors_count_key, *declared,
                            files.size(), total));
  } else if (!declared && split.count > 1) {
    throw Error(errc::split_mismatch, {.file = files.front().file.path},
                fmt::format("the first split file lacks {}", gguf::split_tensors_count_key));
  }
  Catalog catalog;
  catalog.set_metadata(files.front().file.metadata);
  for (auto& f : files) add_to_catalog(catalog, std::move(f));
  return catalog;
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
