#include "trace_option.hpp"

#include <exception>
#include <optional>

#include "eredu/core/log.hpp"
#include "eredu/core/trace.hpp"
#include "eredu/io/formats/chrome_trace.hpp"

namespace eredu::cli {

void add_trace_option(CLI::App& command, std::string& path) {
  command
      .add_option("--trace", path,
                  "write the run's timeline (reads, conversions, binds, stalls, verification, publication; one track "
                  "per thread) to FILE as Chrome trace-event JSON, for ui.perfetto.dev or chrome://tracing")
      ->type_name("FILE");
}

int run_traced(const std::string& path, const std::function<int()>& run) {
  if (path.empty()) return run();
  std::optional<trace::Recorder> recorder;
  recorder.emplace();
  trace::name_this_thread("main");
  io::write_chrome_trace(*recorder, path);  // an empty timeline now: fails early on a bad path
  int status = 0;
  std::exception_ptr failure;
  try {
    status = run();
  } catch (...) {
    failure = std::current_exception();
  }
  const auto events = recorder->events().size();
  const auto threads = recorder->tracks().size();
  try {
    io::write_chrome_trace(*recorder, path);
  } catch (...) {
    if (!failure) throw;
    log::warn("the trace could not be written after the run failed");
  }
  log::info("trace: {} events on {} threads written to {}", events, threads, path);
  if (failure) std::rethrow_exception(failure);
  return status;
}

}  // namespace eredu::cli
