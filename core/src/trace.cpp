#include "eredu/core/trace.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>

#include "eredu/core/error.hpp"

namespace eredu::trace {

struct Recorder::State {
  std::uint64_t start = 0;
  mutable std::mutex mutex;
  std::vector<Event> events;
  std::map<std::uint32_t, std::string> tracks;  // threads seen, with their names
};

namespace {

std::atomic<bool> active{false};
std::mutex installed_mutex;
std::shared_ptr<Recorder::State> installed;  // guarded by installed_mutex

std::mutex names_mutex;
std::map<std::uint32_t, std::string>& thread_names() {  // guarded by names_mutex
  static std::map<std::uint32_t, std::string> names;
  return names;
}

std::string track_name(std::uint32_t thread) {
  std::lock_guard lock(names_mutex);
  auto it = thread_names().find(thread);
  return it != thread_names().end() ? it->second : "thread " + std::to_string(thread);
}

std::shared_ptr<Recorder::State> current() {
  std::lock_guard lock(installed_mutex);
  return installed;
}

}  // namespace

Recorder::Recorder() : state_(std::make_shared<State>()) {
  state_->start = now_ns();
  std::lock_guard lock(installed_mutex);
  if (installed) throw Error(errc::invalid_argument, {}, "a trace recorder is already installed in this process");
  installed = state_;
  active.store(true, std::memory_order_relaxed);
}

Recorder::~Recorder() {
  std::lock_guard lock(installed_mutex);
  active.store(false, std::memory_order_relaxed);
  installed.reset();
}

std::vector<Event> Recorder::events() const {
  std::lock_guard lock(state_->mutex);
  return state_->events;
}

std::vector<Track> Recorder::tracks() const {
  std::map<std::uint32_t, std::string> seen;
  {
    std::lock_guard lock(state_->mutex);
    seen = state_->tracks;
  }
  std::vector<Track> out;
  for (auto& [thread, name] : seen) out.push_back({thread, name});
  return out;
}

std::uint64_t Recorder::start_ns() const noexcept { return state_->start; }

bool enabled() noexcept { return active.load(std::memory_order_relaxed); }

std::uint64_t now_ns() noexcept {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

std::uint32_t thread_index() noexcept {
  static std::atomic<std::uint32_t> next{1};
  thread_local const std::uint32_t index = next.fetch_add(1, std::memory_order_relaxed);
  return index;
}

void name_this_thread(std::string name) {
  const std::uint32_t thread = thread_index();
  {
    std::lock_guard lock(names_mutex);
    thread_names()[thread] = name;
  }
  if (auto state = current()) {
    std::lock_guard lock(state->mutex);
    state->tracks[thread] = std::move(name);
  }
}

void record(const char* name, const char* category, std::uint64_t begin_ns, std::uint64_t end_ns, std::string detail) {
  if (!enabled()) return;
  auto state = current();
  if (!state) return;
  const std::uint32_t thread = thread_index();
  std::lock_guard lock(state->mutex);
  if (!state->tracks.contains(thread)) state->tracks.emplace(thread, track_name(thread));
  state->events.push_back({name, category, std::move(detail), begin_ns, std::max(begin_ns, end_ns), thread});
}

}  // namespace eredu::trace
