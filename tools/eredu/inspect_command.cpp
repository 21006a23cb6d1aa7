// `eredu inspect PATH`: the tensors of a checkpoint, as a table or one JSON document.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "cli.hpp"
#include "commands.hpp"
#include "eredu/io/open_catalog.hpp"

namespace eredu::cli {
namespace {

/// The options of `eredu inspect`.
struct InspectOptions {
  std::string path;
};

int run_inspect(const InspectOptions& o, const CommonFlags& flags) {
  const io::Catalog catalog = io::open_catalog(o.path);
  const auto files = catalog.files();
  if (flags.json) {
    JsonWriter json;
    begin_document(json, "inspect");
    json.field("path", o.path);
    json.key("files").begin_array();
    for (const auto& f : files) {
      json.begin_object().field("path", f.path).field("format", f.format).bytes("size", f.size);
      json.field("data_offset", f.data_offset).end_object();
    }
    json.end_array();
    json.key("metadata").begin_object();
    for (const auto& [k, v] : catalog.metadata()) json.field(k, v);
    json.end_object();
    json.key("tensors").begin_array();
    for (const auto& t : catalog.tensors()) {
      json.begin_object().field("name", t.name).field("dtype", dtype_name(t.dtype));
      json.key("shape").begin_array();
      for (const auto d : t.shape) json.value(d);
      json.end_array();
      json.bytes("", t.nbytes).field("file", files[t.file].path).field("offset", t.offset).end_object();
    }
    json.end_array();
    json.count("tensor", catalog.size()).count("file", files.size()).bytes("tensor", catalog.total_bytes());
    print_document(json);
    return 0;
  }
  std::size_t name_w = 4;
  for (const auto& t : catalog.tensors()) name_w = std::max(name_w, t.name.size());
  name_w = std::min<std::size_t>(name_w, 60);
  fmt::print("{:<{}}  {:<11}  {:<20}  {:>14}  {}\n", "name", name_w, "dtype", "shape", "bytes", "file");
  for (const auto& t : catalog.tensors()) {
    std::string file = std::filesystem::path(files[t.file].path).filename().string();
    fmt::print("{:<{}}  {:<11}  {:<20}  {:>14}  {}\n", t.name, name_w, dtype_name(t.dtype), format_shape(t.shape),
               t.nbytes, file);
  }
  fmt::print("\n{} tensors, {} ({} bytes) in {} file{}", catalog.size(), format_bytes(catalog.total_bytes()),
             catalog.total_bytes(), files.size(), files.size() == 1 ? "" : "s");
  if (!catalog.metadata().empty()) {
    fmt::print("; metadata:");
    for (const auto& [k, v] : catalog.metadata()) fmt::print(" {}={}", k, v);
  }
  fmt::print("\n");
  return 0;
}

}  // namespace

Command add_inspect_command(CLI::App& app, CommonFlags& flags) {
  auto o = std::make_shared<InspectOptions>();
  CLI::App* cmd = add_command(app, "inspect", "list the tensors of a checkpoint",
                              "Lists the tensors of a checkpoint: name, dtype, shape, bytes, file, and totals.");
  add_path(*cmd, "PATH", o->path, "a .safetensors file, a sharded directory, or its model.safetensors.index.json");
  add_common_flags(*cmd, flags, true);
  return {cmd, [o](const CommonFlags& f) { return run_inspect(*o, f); }};
}

}  // namespace eredu::cli
