#pragma once
// Shared by the CPU backend and orchestration tests: a small checkpoint of random bytes with
// its expected contents, an open source over it, and a CPU materialization context.

#include <tbb/global_control.h>

#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "eredu/cpu/backend.hpp"
#include "eredu/engine/parameterized.hpp"
#include "eredu/io/checkpoint_source.hpp"
#include "io/read_fixture.hpp"

namespace eredu::test {

/// Two TBB workers besides the test thread, as `eredu load` sets up, so that executors of
/// concurrency 2 really run two tasks at once (TBB's default is hardware threads - 1).
inline tbb::global_control test_workers(tbb::global_control::max_allowed_parallelism, 3);

/// A single-file checkpoint whose tensors hold random bytes (float tensors get random bit
/// patterns, NaNs included: conversions must handle them), kept in memory for comparison.
struct CpuCheckpoint {
  TempDir dir;
  std::filesystem::path path;
  std::vector<synth::TensorSpec> specs;
  std::vector<std::vector<std::byte>> data;

  CpuCheckpoint(std::vector<synth::TensorSpec> tensors, unsigned seed = 7) : specs(std::move(tensors)) {
    path = dir / "model.safetensors";
    data = random_tensor_bytes(specs, seed);
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
};

/// Options for a small staging pool (so chunked reads really are chunked) and the pread
/// reader when `pread` is set.
inline io::SourceOptions small_source_options(std::size_t budget = std::size_t{256} << 10) {
  io::SourceOptions o;
  o.pool.budget = budget;
  o.chunk_bytes = std::size_t{64} << 10;
  return o;
}

/// The bytes of a tensor, as a vector, for comparisons.
inline std::vector<std::byte> to_vector(std::span<const std::byte> s) { return {s.begin(), s.end()}; }

/// Runs `ctx` until `c` is ready (work may finish on TBB threads while the loop is idle).
inline void drive_until(asio::io_context& ctx, const Completion& c) {
  while (!c.ready()) {
    ctx.restart();
    ctx.run_one_for(std::chrono::milliseconds(5));
  }
  ctx.restart();
  ctx.poll();
}

/// Runs `ctx` until `future` is ready (work may finish on TBB threads while the loop is
/// idle), then returns its value or throws its failure.
template <class T>
T run_until_ready(asio::io_context& ctx, std::future<T>& future) {
  while (future.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    ctx.restart();
    ctx.run_one_for(std::chrono::milliseconds(5));
  }
  return future.get();
}

/// Waits (running `ctx`) for a materialization and returns its tensor or throws.
inline cpu::Tensor finish(asio::io_context& ctx, cpu::Materialization m) {
  drive_until(ctx, m.done);
  return cpu::Backend::finish_materialization(std::move(m));
}

/// A test module's read-only visitor, from its one slot list: `Self::each(self, fn)` calls
/// fn(local name, slot) for every slot.
template <class Self>
void visit_slots(const Self& self, engine::ParameterVisitor<cpu::Parameter>& v, const std::string& prefix) {
  Self::each(self, [&](const char* name, const cpu::Parameter& p) {
    v.visit({engine::ParameterId(engine::join_name(prefix, name)), p.dtype, p.shape}, p);
  });
}

/// The binding visitor from the same slot list.
template <class Self>
void visit_slots_mut(Self& self, engine::ParameterVisitorMut<cpu::Parameter>& v, const std::string& prefix) {
  Self::each(self, [&](const char* name, cpu::Parameter& p) {
    v.visit_mut({engine::ParameterId(engine::join_name(prefix, name)), p.dtype, p.shape}, p);
  });
}

}  // namespace eredu::test
