#include "eredu/io/formats/chrome_trace.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <memory>
#include <system_error>

#include "eredu/core/error.hpp"
#include "eredu/io/formats/json_text.hpp"

namespace eredu::io {

std::string chrome_trace_json(const trace::Recorder& recorder) {
  const std::uint64_t zero = recorder.start_ns();
  auto micros = [zero](std::uint64_t ns) { return static_cast<double>(ns > zero ? ns - zero : 0) / 1000.0; };
  std::string out = R"({"displayTimeUnit":"ms","traceEvents":[)";
  bool first = true;
  auto separate = [&] {
    if (!first) out += ',';
    first = false;
  };
  separate();
  out += R"({"name":"process_name","ph":"M","pid":1,"tid":0,"args":{"name":"eredu"}})";
  for (const auto& track : recorder.tracks()) {
    separate();
    out += fmt::format(R"({{"name":"thread_name","ph":"M","pid":1,"tid":{},"args":{{"name":)", track.thread);
    json::append_quoted_bytes(out, track.name);
    out += "}}";
  }
  for (const auto& e : recorder.events()) {
    separate();
    out += R"({"name":)";
    json::append_quoted_bytes(out, e.name);
    out += R"(,"cat":)";
    json::append_quoted_bytes(out, e.category);
    out += fmt::format(R"(,"ph":"X","pid":1,"tid":{},"ts":{:.3f},"dur":{:.3f})", e.thread, micros(e.begin_ns),
                       static_cast<double>(e.end_ns - e.begin_ns) / 1000.0);
    if (!e.detail.empty()) {
      out += R"(,"args":{"detail":)";
      json::append_quoted_bytes(out, e.detail);
      out += '}';
    }
    out += '}';
  }
  out += "]}\n";
  return out;
}

void write_chrome_trace(const trace::Recorder& recorder, const std::filesystem::path& path) {
  const std::string text = chrome_trace_json(recorder);
  auto fail = [&](int error, const char* what) {
    throw Error(errc::io_error, {.file = path.string(), .os_error = std::error_code(error, std::generic_category())},
                fmt::format("cannot {} the trace file", what));
  };
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!file) fail(errno, "create");
  if (std::fwrite(text.data(), 1, text.size(), file.get()) != text.size()) fail(errno, "write");
  if (std::fclose(file.release()) != 0) fail(errno, "write");
}

}  // namespace eredu::io
