// `eredu inspect PATH`: the tensors of a checkpoint, as a table or one JSON document. For a
// GGUF checkpoint also its key metadata (architecture, block count, file type) and the count
// of tensors per type; --json adds every key-value pair of every file with its GGUF type.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "cli.hpp"
#include "commands.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/printable.hpp"
#include "eredu/io/formats/gguf.hpp"
#include "eredu/io/formats/open_catalog.hpp"

namespace eredu::cli {
namespace {

/// The options of `eredu inspect`.
struct InspectOptions {
  std::string path;
};

// llama.cpp's name of a general.file_type value (enum llama_ftype), or nullptr.
const char* llama_file_type_name(std::uint64_t t) noexcept {
  static constexpr const char* names[] = {
      "ALL_F32",       "MOSTLY_F16",     "MOSTLY_Q4_0",     "MOSTLY_Q4_1",   nullptr,         nullptr,
      nullptr,         "MOSTLY_Q8_0",    "MOSTLY_Q5_0",     "MOSTLY_Q5_1",   "MOSTLY_Q2_K",   "MOSTLY_Q3_K_S",
      "MOSTLY_Q3_K_M", "MOSTLY_Q3_K_L",  "MOSTLY_Q4_K_S",   "MOSTLY_Q4_K_M", "MOSTLY_Q5_K_S", "MOSTLY_Q5_K_M",
      "MOSTLY_Q6_K",   "MOSTLY_IQ2_XXS", "MOSTLY_IQ2_XS",   "MOSTLY_Q2_K_S", "MOSTLY_IQ3_XS", "MOSTLY_IQ3_XXS",
      "MOSTLY_IQ1_S",  "MOSTLY_IQ4_NL",  "MOSTLY_IQ3_S",    "MOSTLY_IQ3_M",  "MOSTLY_IQ2_S",  "MOSTLY_IQ2_M",
      "MOSTLY_IQ4_XS", "MOSTLY_IQ1_M",   "MOSTLY_BF16",     nullptr,         nullptr,         nullptr,
      "MOSTLY_TQ1_0",  "MOSTLY_TQ2_0",   "MOSTLY_MXFP4_MOE"};
  return t < std::size(names) ? names[t] : nullptr;
}

// The key metadata of a GGUF checkpoint, from the catalog's metadata (the first file's KV pairs).
struct GgufSummary {
  std::string architecture;                // general.architecture, or empty
  std::optional<std::uint64_t> blocks;     // <architecture>.block_count
  std::optional<std::uint64_t> file_type;  // general.file_type
};

std::optional<std::uint64_t> metadata_u64(const io::Catalog& catalog, const std::string& key) {
  const auto& m = catalog.metadata();
  auto it = m.find(key);
  if (it == m.end()) return std::nullopt;
  std::uint64_t v = 0;
  const auto* end = it->second.data() + it->second.size();
  const auto [p, ec] = std::from_chars(it->second.data(), end, v);
  if (ec != std::errc() || p != end) return std::nullopt;
  return v;
}

GgufSummary gguf_summary(const io::Catalog& catalog) {
  GgufSummary s;
  const auto& m = catalog.metadata();
  if (auto it = m.find("general.architecture"); it != m.end()) s.architecture = it->second;
  if (!s.architecture.empty()) s.blocks = metadata_u64(catalog, s.architecture + ".block_count");
  s.file_type = metadata_u64(catalog, "general.file_type");
  return s;
}

// The validated header of one GGUF file of the catalog (read again: the catalog keeps each
// value only as text).
io::gguf::Header read_gguf_header(const io::CheckpointFile& f) {
  const int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw Error(errc::io_error, {.file = f.path, .os_error = std::error_code(errno, std::system_category())},
                "cannot open the GGUF file to read its key-value pairs");
  try {
    io::gguf::Header h = io::gguf::read_header(fd, f.size, f.path);
    ::close(fd);
    return h;
  } catch (...) {
    ::close(fd);
    throw;
  }
}

int run_inspect(const InspectOptions& o, const CommonFlags& flags) {
  const io::Catalog catalog = io::open_catalog(o.path);
  const auto files = catalog.files();
  const bool gguf = !files.empty() && files.front().format == "gguf";
  std::map<std::string, std::uint64_t> per_dtype;  // tensors per dtype name
  for (const auto& t : catalog.tensors()) ++per_dtype[std::string(dtype_name(t.dtype))];
  if (flags.json) {
    JsonWriter json;
    begin_document(json, "inspect");
    json.field("path", o.path);
    json.key("files").begin_array();
    for (const auto& f : files) {
      json.begin_object().field("path", f.path).field("format", f.format).bytes("size", f.size);
      json.field("data_offset", f.data_offset);
      if (f.format == "gguf") {
        // Every KV pair with its GGUF type and its whole value (arrays in full).
        const io::gguf::Header h = read_gguf_header(f);
        json.field("gguf_version", h.version).bytes("alignment", h.alignment).count("key_value", h.kv.size());
        json.key("metadata").begin_object();
        for (const auto& kv : h.kv) {
          json.key(kv.key).begin_object().field("type", io::gguf::value_type_name(kv.value.type));
          if (kv.value.is_array()) json.field("element_type", io::gguf::value_type_name(kv.value.element_type));
          json.key("value").json_value(kv.value.to_json()).end_object();
        }
        json.end_object();
      }
      json.end_object();
    }
    json.end_array();
    json.key("metadata").begin_object();
    for (const auto& [k, v] : catalog.metadata()) json.field(k, v);
    json.end_object();
    json.key("dtypes").begin_array();
    for (const auto& [name, n] : per_dtype) json.begin_object().field("dtype", name).count("tensor", n).end_object();
    json.end_array();
    if (gguf) {
      const GgufSummary s = gguf_summary(catalog);
      json.key("gguf").begin_object();
      if (s.architecture.empty())
        json.null_field("architecture");
      else
        json.field("architecture", s.architecture);
      if (s.blocks)
        json.count("block", *s.blocks);
      else
        json.null_field("block_count");
      if (s.file_type)
        json.field("file_type", *s.file_type);
      else
        json.null_field("file_type");
      const char* ft = s.file_type ? llama_file_type_name(*s.file_type) : nullptr;
      if (ft)
        json.field("file_type_name", ft);
      else
        json.null_field("file_type_name");
      json.end_object();
    }
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
  // Names and paths come from the checkpoint: escaped (printable), so an escape sequence
  // cannot act on the terminal and a newline cannot split a row.
  std::vector<std::string> names;
  names.reserve(catalog.size());
  std::size_t name_w = 4;
  for (const auto& t : catalog.tensors()) name_w = std::max(name_w, names.emplace_back(printable(t.name)).size());
  name_w = std::min<std::size_t>(name_w, 60);
  std::vector<std::string> file_names;
  for (const auto& f : files) file_names.push_back(printable(std::filesystem::path(f.path).filename().string()));
  fmt::print("{:<{}}  {:<11}  {:<20}  {:>14}  {}\n", "name", name_w, "dtype", "shape", "bytes", "file");
  for (std::size_t i = 0; i < catalog.size(); ++i) {
    const io::TensorInfo& t = catalog.tensors()[i];
    fmt::print("{:<{}}  {:<11}  {:<20}  {:>14}  {}\n", names[i], name_w, dtype_name(t.dtype), format_shape(t.shape),
               t.nbytes, file_names[t.file]);
  }
  fmt::print("\n{} tensors, {} ({} bytes) in {} file{}", catalog.size(), format_bytes(catalog.total_bytes()),
             catalog.total_bytes(), files.size(), files.size() == 1 ? "" : "s");
  if (gguf) {
    // The KV pairs can be large (a tokenizer's 32000 strings): only the key ones here.
    const GgufSummary s = gguf_summary(catalog);
    const char* ft = s.file_type ? llama_file_type_name(*s.file_type) : nullptr;
    fmt::print(
        "\nGGUF: architecture {}, {} blocks, file type {}, {} key-value pairs (--json lists them all)\n",
        s.architecture.empty() ? "(none)" : printable(s.architecture),
        s.blocks ? std::to_string(*s.blocks) : "(unknown)",
        s.file_type ? fmt::format("{}{}", *s.file_type, ft ? fmt::format(" ({})", ft) : std::string()) : "(none)",
        catalog.metadata().size());
    fmt::print("types:");
    for (const auto& [name, n] : per_dtype) fmt::print(" {} x{}", name, n);
    fmt::print("\n");
    return 0;
  }
  if (!catalog.metadata().empty()) {
    fmt::print("; metadata:");
    for (const auto& [k, v] : catalog.metadata()) fmt::print(" {}={}", printable(k), printable(v));
  }
  fmt::print("\n");
  return 0;
}

}  // namespace

Command add_inspect_command(CLI::App& app, CommonFlags& flags) {
  auto o = std::make_shared<InspectOptions>();
  CLI::App* cmd =
      add_command(app, "inspect", "list the tensors of a checkpoint",
                  "Lists the tensors of a checkpoint: name, dtype, shape, bytes, file, and totals. For GGUF also the "
                  "architecture, block count, file type and tensors per type; --json adds every key-value pair.");
  add_path(*cmd, "PATH", o->path,
           "a .safetensors file, a sharded directory or its model.safetensors.index.json, a .gguf file, a split "
           "GGUF's file (*-00001-of-0000N.gguf), or a directory holding one GGUF checkpoint");
  add_common_flags(*cmd, flags, true);
  return {cmd, [o](const CommonFlags& f) { return run_inspect(*o, f); }};
}

}  // namespace eredu::cli
