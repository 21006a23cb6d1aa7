// trace::Recorder and Span: nothing recorded without a recorder, one process-wide recorder,
// events on the thread that records them.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <thread>

#include "eredu/core/error.hpp"
#include "eredu/core/trace.hpp"

using namespace eredu;

TEST_CASE("trace – nothing is recorded while no recorder is installed", "[trace]") {
  CHECK_FALSE(trace::enabled());
  { trace::Span span("before", "test", "ignored"); }
  trace::Recorder recorder;
  CHECK(trace::enabled());
  CHECK(recorder.events().empty());
}

TEST_CASE("trace – one recorder at a time, destroying it stops recording", "[trace]") {
  {
    trace::Recorder recorder;
    CHECK_THROWS_MATCHES(trace::Recorder(), Error,
                         Catch::Predicate<Error>([](const Error& e) { return e.kind() == errc::invalid_argument; }));
    CHECK(trace::enabled());  // the failed second one left the first installed
  }
  CHECK_FALSE(trace::enabled());
  trace::record("after", "test", 1, 2);  // no recorder: a no-op, not a crash
}

TEST_CASE("trace – spans land on the track of the thread that ends them, in order", "[trace]") {
  trace::Recorder recorder;
  trace::name_this_thread("test main");
  const std::uint64_t before = trace::now_ns();
  {
    trace::Span outer("outer", "test", "a detail");
    trace::Span inner("inner", "test");
  }
  std::uint32_t worker_thread = 0;
  std::thread worker([&] {
    worker_thread = trace::thread_index();
    trace::Span span("on worker", "test");
  });
  worker.join();
  const auto events = recorder.events();
  REQUIRE(events.size() == 3);
  CHECK(std::string(events[0].name) == "inner");  // the inner scope ends first
  CHECK(std::string(events[1].name) == "outer");
  CHECK(events[1].detail == "a detail");
  CHECK(events[1].begin_ns >= before);
  CHECK(events[1].begin_ns <= events[0].begin_ns);
  CHECK(events[0].end_ns <= events[1].end_ns);
  CHECK(events[0].thread == trace::thread_index());
  CHECK(events[2].thread == worker_thread);
  CHECK(worker_thread != trace::thread_index());

  const auto tracks = recorder.tracks();
  REQUIRE(tracks.size() == 2);
  auto main_track = std::find_if(tracks.begin(), tracks.end(),
                                 [](const trace::Track& t) { return t.thread == trace::thread_index(); });
  REQUIRE(main_track != tracks.end());
  CHECK(main_track->name == "test main");
}

TEST_CASE("trace – events from many threads at once are all kept", "[trace]") {
  trace::Recorder recorder;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([] {
      for (int i = 0; i < 250; ++i) trace::Span span("work", "test");
    });
  for (auto& t : threads) t.join();
  const auto events = recorder.events();
  CHECK(events.size() == 1000);
  std::set<std::uint32_t> seen;
  for (const auto& e : events) seen.insert(e.thread);
  CHECK(seen.size() == 4);
}
