#pragma once
// Backend-neutral test support: a small checkpoint of random bytes with its expected contents,
// source options with a small staging pool, and ways to drive an io_context until something
// is ready. Shared by the CPU and CUDA tests (through tests/cpu/cpu_fixture.hpp), the engine
// tests over the fake backend, and the backend conformance suite.

#include <asio/io_context.hpp>
#include <chrono>
#include <cstddef>
#include <exception>
#include <filesystem>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "eredu/core/completion.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/selection.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"
#include "io/read_fixture.hpp"

namespace eredu::test {

/// A single-file checkpoint whose tensors hold random bytes (float tensors get random bit
/// patterns, NaNs included: conversions must handle them), kept in memory for comparison.
struct TestCheckpoint {
  TempDir dir;                               ///< removed with the file when the object dies
  std::filesystem::path path;                ///< the safetensors file
  std::vector<synth::TensorSpec> specs;      ///< the tensors, in file order
  std::vector<std::vector<std::byte>> data;  ///< each tensor's stored bytes, as specs

  /// Writes `tensors` with random contents drawn from `seed`.
  TestCheckpoint(std::vector<synth::TensorSpec> tensors, unsigned seed = 7) : specs(std::move(tensors)) {
    path = dir / "model.safetensors";
    data = random_tensor_bytes(specs, seed);
    synth::write_safetensors(path, specs, spans_of(data));
  }
  /// Writes `tensors` with the given contents (one byte vector per spec, of its size).
  TestCheckpoint(std::vector<synth::TensorSpec> tensors, std::vector<std::vector<std::byte>> contents)
      : specs(std::move(tensors)), data(std::move(contents)) {
    path = dir / "model.safetensors";
    synth::write_safetensors(path, specs, spans_of(data));
  }
  /// The stored bytes of tensor `name`.
  const std::vector<std::byte>& bytes(const std::string& name) const {
    for (std::size_t i = 0; i < specs.size(); ++i)
      if (specs[i].name == name) return data[i];
    throw std::runtime_error("no tensor " + name);
  }
  /// The spec of tensor `name`.
  const synth::TensorSpec& spec(const std::string& name) const {
    for (const auto& s : specs)
      if (s.name == name) return s;
    throw std::runtime_error("no tensor " + name);
  }
  /// The stored bytes of `selection` of tensor `name`, in the order a load delivers them
  /// (what a shard digest covers).
  std::vector<std::byte> selected_bytes(const std::string& name, const Selection& selection) const {
    const synth::TensorSpec& s = spec(name);
    const std::vector<std::byte>& full = bytes(name);
    std::vector<std::byte> out;
    for (const ByteRun& run : selection_runs(s.shape, s.dtype, selection))
      out.insert(out.end(), full.begin() + static_cast<std::ptrdiff_t>(run.source_offset),
                 full.begin() + static_cast<std::ptrdiff_t>(run.source_offset + run.length));
    return out;
  }
};

/// Options for a small staging pool (so chunked reads really are chunked).
inline io::SourceOptions small_source_options(std::size_t budget = std::size_t{256} << 10) {
  io::SourceOptions o;
  o.pool.budget = budget;
  o.chunk_bytes = std::size_t{64} << 10;
  return o;
}

/// The bytes of a tensor, as a vector, for comparisons.
inline std::vector<std::byte> to_vector(std::span<const std::byte> s) { return {s.begin(), s.end()}; }

/// Runs `ctx` until `c` is ready (work may finish on other threads while the loop is idle).
inline void drive_until(asio::io_context& ctx, const Completion& c) {
  while (!c.ready()) {
    ctx.restart();
    ctx.run_one_for(std::chrono::milliseconds(5));
  }
  ctx.restart();
  ctx.poll();
}

/// Runs `ctx` until `future` is ready (work may finish on other threads while the loop is
/// idle), then returns its value or throws its failure.
template <class T>
T run_until_ready(asio::io_context& ctx, std::future<T>& future) {
  while (future.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    ctx.restart();
    ctx.run_one_for(std::chrono::milliseconds(5));
  }
  return future.get();
}

/// Runs `ctx` until `condition()` holds (checked between handlers). A condition that never
/// holds hangs the test, which ctest's timeout then reports: tests wait for states, never
/// for a duration.
template <class Condition>
void run_until(asio::io_context& ctx, Condition&& condition) {
  while (!condition()) {
    ctx.restart();
    ctx.run_one_for(std::chrono::milliseconds(5));
  }
}

/// Runs every handler that is ready, and those they make ready, until none is: with work
/// that lives only on the event loop (the fake backend in FakeReads::bypass mode), the
/// state reached is the same on every run.
inline void run_ready_handlers(asio::io_context& ctx) {
  do {
    ctx.restart();
  } while (ctx.poll() > 0);
}

/// True once `future` holds its value or failure (does not wait).
template <class T>
bool is_ready(const std::future<T>& future) {
  return future.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

/// The outcome of one asynchronous operation, received by a plain callback: pass
/// `outcome.handler()` as the completion token. A callback has no executor of its own, so
/// eredu delivers it on the operation's executor (the test's event loop), and the outcome is
/// there as soon as the loop has run the delivery; asio::use_future's arrives on another
/// thread, some time later, which a test that checks "not done yet" cannot tell from "never".
/// Single-threaded: read it on the loop's thread.
template <class T = void>
class Outcome {
 public:
  /// The completion handler, void(std::exception_ptr, T).
  auto handler() const {
    return [s = state_](std::exception_ptr e, T value) {
      s->error = e;
      if (!e) s->value.emplace(std::move(value));
      s->done = true;
    };
  }
  /// True once the operation has completed.
  bool ready() const noexcept { return state_->done; }
  /// The failure, or nullptr.
  std::exception_ptr error() const noexcept { return state_->error; }
  /// The result; rethrows the failure. Call once ready().
  T get() {
    if (!state_->done) throw std::logic_error("Outcome::get before the operation completed");
    if (state_->error) std::rethrow_exception(state_->error);
    return std::move(*state_->value);
  }

 private:
  struct State {
    bool done = false;
    std::exception_ptr error;
    std::optional<T> value;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

/// Outcome of an operation that completes with void(std::exception_ptr).
template <>
class Outcome<void> {
 public:
  /// The completion handler, void(std::exception_ptr).
  auto handler() const {
    return [s = state_](std::exception_ptr e) {
      s->error = e;
      s->done = true;
    };
  }
  /// True once the operation has completed.
  bool ready() const noexcept { return state_->done; }
  /// The failure, or nullptr.
  std::exception_ptr error() const noexcept { return state_->error; }
  /// Rethrows the failure. Call once ready().
  void get() {
    if (!state_->done) throw std::logic_error("Outcome::get before the operation completed");
    if (state_->error) std::rethrow_exception(state_->error);
  }

 private:
  struct State {
    bool done = false;
    std::exception_ptr error;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

/// Runs `ctx` until `outcome` is ready, then returns its result or throws its failure.
template <class T>
T run_until_ready(asio::io_context& ctx, Outcome<T>& outcome) {
  run_until(ctx, [&] { return outcome.ready(); });
  return outcome.get();
}

/// Runs `ctx` until `outcome` is ready and returns the eredu::Error it failed with; throws
/// std::logic_error when it succeeded or failed with something else.
template <class T>
Error failure_of(asio::io_context& ctx, Outcome<T>& outcome) {
  run_until(ctx, [&] { return outcome.ready(); });
  try {
    outcome.get();
  } catch (const Error& e) {
    return e;
  } catch (const std::exception& e) {
    throw std::logic_error(std::string("expected an eredu::Error, got: ") + e.what());
  }
  throw std::logic_error("expected the operation to fail, and it succeeded");
}

}  // namespace eredu::test
