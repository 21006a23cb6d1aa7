#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "cli.hpp"
#include "commands.hpp"
#include "eredu/io/json_text.hpp"
#include "eredu/io/open_catalog.hpp"

namespace eredu::cli {

int run_inspect(int argc, char** argv) {
  Args args = parse_args(argc, argv, 2, {}, {"json"});
  if (args.positional.size() != 1) throw std::invalid_argument("usage: eredu inspect PATH [--json]");
  io::Catalog catalog = io::open_catalog(args.positional[0]);
  auto files = catalog.files();
  if (args.has("json")) {
    std::string out = "{\"path\":" + io::json::quoted(args.positional[0]) + ",\"files\":[";
    for (std::size_t i = 0; i < files.size(); ++i) {
      out += fmt::format("{}{{\"path\":{},\"format\":{},\"size\":{},\"data_offset\":{}}}", i ? "," : "",
                         io::json::quoted(files[i].path), io::json::quoted(files[i].format), files[i].size,
                         files[i].data_offset);
    }
    out += "],\"metadata\":{";
    bool first = true;
    for (const auto& [k, v] : catalog.metadata()) {
      out += fmt::format("{}{}:{}", first ? "" : ",", io::json::quoted(k), io::json::quoted(v));
      first = false;
    }
    out += "},\"tensors\":[";
    first = true;
    for (const auto& t : catalog.tensors()) {
      out += fmt::format("{}{{\"name\":{},\"dtype\":\"{}\",\"shape\":[{}],\"bytes\":{},\"file\":{},\"offset\":{}}}",
                         first ? "" : ",", io::json::quoted(t.name), dtype_name(t.dtype), fmt::join(t.shape, ","),
                         t.nbytes, io::json::quoted(files[t.file].path), t.offset);
      first = false;
    }
    out += fmt::format("],\"tensor_count\":{},\"total_bytes\":{}}}", catalog.size(), catalog.total_bytes());
    std::puts(out.c_str());
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

}  // namespace eredu::cli
