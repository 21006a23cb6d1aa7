// io::chrome_trace_json / write_chrome_trace: a recorder's timeline as trace-event JSON.
#include <catch2/catch.hpp>

#include "eredu/core/error.hpp"
#include "eredu/core/trace.hpp"
#include "eredu/io/formats/chrome_trace.hpp"

using namespace eredu;

TEST_CASE("trace – the Chrome trace-event JSON names tracks and escapes details", "[trace]") {
  trace::Recorder recorder;
  trace::name_this_thread("json \"main\"");
  trace::record("read", "io", recorder.start_ns() + 1500, recorder.start_ns() + 4000, "a\nb");
  const std::string json = io::chrome_trace_json(recorder);
  CHECK_THAT(json, Catch::StartsWith(R"({"displayTimeUnit":"ms","traceEvents":[)"));
  CHECK_THAT(json, Catch::Contains(R"("name":"thread_name")") && Catch::Contains(R"("name":"json \"main\"")"));
  CHECK_THAT(json, Catch::Contains(R"("name":"read","cat":"io","ph":"X")"));
  CHECK_THAT(json, Catch::Contains(R"("ts":1.500,"dur":2.500)"));
  CHECK_THAT(json, Catch::Contains(R"("args":{"detail":"a\nb"})"));
  CHECK_THROWS_AS(io::write_chrome_trace(recorder, "/nonexistent-dir/trace.json"), Error);
}
