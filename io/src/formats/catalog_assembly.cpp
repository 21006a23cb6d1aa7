#include "catalog_assembly.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "eredu/core/error.hpp"
#include "eredu/io/formats/checkpoint_format.hpp"

namespace eredu::io::detail {

namespace {

void add_to_catalog(Catalog& catalog, ParsedFile&& parsed) {
  const std::uint32_t index = catalog.add_file(std::move(parsed.file));
  for (auto& t : parsed.tensors) {
    t.file = index;
    catalog.add_tensor(std::move(t));
  }
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

}  // namespace

ParsedFile parse_layout(HeaderReader& reader, std::span<const std::byte> head, std::uint64_t size,
                        const std::string& path) {
  const auto formats = checkpoint_formats();
  const CheckpointFormat* format = formats.back();
  for (const CheckpointFormat* f : formats) {
    if (f->probe(head, path)) {
      format = f;
      break;
    }
  }
  FileLayout layout = format->parse(reader, size, path);
  ParsedFile out;
  out.file.path = path;
  out.file.format = layout.format.empty() ? std::string(format->name()) : layout.format;
  out.file.size = size;
  out.file.data_offset = layout.data_offset;
  out.file.metadata = std::move(layout.metadata);
  out.tensors = std::move(layout.tensors);
  return out;
}

Catalog assemble_single(ParsedFile parsed) {
  Catalog catalog;
  catalog.set_metadata(parsed.file.metadata);
  add_to_catalog(catalog, std::move(parsed));
  return catalog;
}

Catalog assemble_sharded(const ShardedIndex& index, const std::string& index_name, const ParseNamed& parse) {
  std::vector<ParsedFile> shards;
  std::unordered_map<std::string_view, std::size_t> shard_of_name;  // shard file name -> shards[i]
  const std::vector<std::string> names = index.shards();
  shards.reserve(names.size());
  for (const auto& name : names) {
    std::size_t listed = 0;
    for (const auto& entry : index.weight_map) listed += entry.second == name;
    const Naming naming{errc::shard_missing,
                        fmt::format("shard named by {} for {} tensor{}", index_name, listed, listed == 1 ? "" : "s")};
    shards.push_back(parse(name, naming));
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

Catalog assemble_split_gguf(const gguf::SplitName& split, const std::string& any_name, const ParseNamed& parse) {
  std::vector<ParsedFile> files;
  files.reserve(split.count);
  for (std::uint32_t i = 1; i <= split.count; ++i) {
    const Naming naming{errc::shard_missing, fmt::format("split file {} of {} of {}", i, split.count, any_name)};
    files.push_back(parse(gguf::split_file_name(split.prefix, i, split.count), naming));
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

}  // namespace eredu::io::detail
