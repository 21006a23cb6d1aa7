#pragma once
// Shared by the CPU backend and orchestration tests: the backend-neutral checkpoint fixture
// (tests/support/checkpoint_fixture.hpp) plus what only CPU tests need: TBB workers, finishing
// a CPU materialization, and visitors over cpu::Parameter slots.

#include <tbb/global_control.h>

#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "eredu/cpu/backend.hpp"
#include "eredu/engine/description/parameterized.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"
#include "eredu/io/reading/read_fault.hpp"
#include "support/checkpoint_fixture.hpp"

namespace eredu::test {

/// Two TBB workers besides the test thread, as `eredu load` sets up, so that executors of
/// concurrency 2 really run two tasks at once (TBB's default is hardware threads - 1).
inline tbb::global_control test_workers(tbb::global_control::max_allowed_parallelism, 3);

/// The CPU tests' name for the backend-neutral TestCheckpoint.
using CpuCheckpoint = TestCheckpoint;

/// A fault injector that cuts the checkpoint at `path` short the moment a mapping of it is
/// handed out, keeping `survive` bytes (rounded up to a page) past the mapped offset: the
/// mapping's reads then fault (SIGBUS) and must come back as typed errors. `keep` is where
/// the file now ends (0 until a mapping was made).
struct ShrinkOnMap : io::FaultInjector {
  std::filesystem::path path;
  std::uint64_t survive = 4096;
  std::uint64_t keep = 0;
  io::ReadFault on_complete(std::uint32_t, std::uint64_t, std::uint64_t) override { return {}; }
  bool allow_mapping() const override { return true; }
  void on_map(std::uint32_t, std::uint64_t offset, std::uint64_t) override {
    keep = (offset + survive + 4095) / 4096 * 4096;
    std::filesystem::resize_file(path, keep);
  }
};

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
