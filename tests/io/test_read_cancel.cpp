// Cancelling a read drops its requests not yet issued (they never reach the kernel or a
// worker: counted by the reader's stats), cancels what the kernel can of those in flight, and
// gives every lease back before the cancelled read completes. Gated, not timed.
#include <fcntl.h>
#include <unistd.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/io_context.hpp>
#include <atomic>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <optional>

#include "eredu/core/error.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"
#include "eredu/io/reading/lease_pool.hpp"
#include "eredu/io/reading/pread_reader.hpp"
#include "eredu/io/reading/uring_reader.hpp"
#include "io/read_fixture.hpp"
#include "support/byte_units.hpp"
#include "support/error_kind.hpp"

using namespace eredu;
using namespace eredu::io;

namespace {

using eredu::test::KiB;
using eredu::test::MiB;

using eredu::test::kind_of;

// Holds the first read it sees until opened: the read is then in a worker, the rest queued.
struct Gate final : FaultInjector {
  std::mutex mutex;
  std::condition_variable changed;
  int entered = 0;
  bool open = false;
  ReadFault on_complete(std::uint32_t, std::uint64_t, std::uint64_t) override {
    std::unique_lock lock(mutex);
    ++entered;
    changed.notify_all();
    changed.wait(lock, [&] { return open; });
    return {};
  }
  bool has_entered() {
    std::lock_guard lock(mutex);
    return entered > 0;
  }
  void wait_entered() {
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return entered > 0; });
  }
  void release() {
    {
      std::lock_guard lock(mutex);
      open = true;
    }
    changed.notify_all();
  }
};

// A file of `bytes` random bytes, with a checkpoint header the source can open.
struct BigCheckpoint {
  test::TempDir dir;
  std::filesystem::path path = dir / "model.safetensors";
  BigCheckpoint() {
    std::vector<synth::TensorSpec> specs{{"w", DType::U8, {4 * MiB}}};
    auto data = test::random_tensor_bytes(specs, 3);
    synth::write_safetensors(path, specs, test::spans_of(data));
  }
};

}  // namespace

TEST_CASE("read cancel – the pread reader drops a cancelled batch's queued requests unread", "[io][read][cancel]") {
  BigCheckpoint ck;
  asio::io_context ctx;
  std::vector<OpenFile> files(1);
  files[0].path = ck.path.string();
  files[0].buffered.reset(::open(ck.path.c_str(), O_RDONLY | O_CLOEXEC));
  files[0].size = std::filesystem::file_size(ck.path);
  files[0].file_system.uring_trusted = true;
  Gate gate;
  ReaderOptions ro;
  ro.kind = ReaderKind::pread;
  ro.direct = DirectMode::off;
  ro.depth = 1;  // one worker: one read in flight, the rest queued
  ro.max_request = 64 * KiB;
  ro.faults = &gate;
  PreadReader reader(files, ro);
  LeasePool pool(ctx.get_executor(), {.budget = 8 * MiB, .huge_pages = false, .prefault = false});
  std::optional<StagingBuffer> buffer = pool.try_acquire(4 * MiB);
  REQUIRE(buffer);
  asio::cancellation_signal cancel;
  std::optional<std::exception_ptr> result;
  // 64 requests of 64 KiB.
  reader.async_read({{0, 0, buffer->data(), 4 * MiB, 4 * MiB}}, ctx.get_executor(),
                    asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e) {
                      result = e;
                      buffer.reset();  // the lease's memory goes back as the read ends
                    }));
  gate.wait_entered();
  cancel.emit(asio::cancellation_type::terminal);
  gate.release();
  ctx.run();
  REQUIRE(result);
  REQUIRE(*result);
  CHECK(kind_of(*result) == errc::cancelled);
  CHECK(reader.stats().requests == 1);  // the 63 queued never reached a worker
  CHECK(pool.in_use() == 0);
}

TEST_CASE("read cancel – the io_uring reader drops queued requests and cancels the one in flight",
          "[io][read][cancel][uring]") {
  // A pipe nobody writes to: its read stays in flight until cancelled, on every kernel.
  int fds[2];
  REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
  UniqueFd write_end(fds[1]);
  asio::io_context ctx;
  std::vector<OpenFile> files(1);
  files[0].path = "pipe";
  files[0].buffered.reset(fds[0]);
  files[0].size = 1 << 30;
  files[0].file_system.uring_trusted = true;
  ReaderOptions ro;
  ro.kind = ReaderKind::uring;
  ro.direct = DirectMode::off;
  ro.depth = 1;
  ro.max_request = 4 * KiB;
  ro.parallel_buffered_copies = false;  // polled by the kernel, not blocked in a worker
  ro.register_buffers = false;
  std::vector<std::byte> memory(256 * KiB);
  UringReader reader(ctx.get_executor(), files, {}, ro);
  asio::cancellation_signal cancel;
  std::optional<std::exception_ptr> result;
  // 64 requests of 4 KiB.
  reader.async_read({{0, 0, memory.data(), memory.size(), memory.size()}}, ctx.get_executor(),
                    asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e) { result = e; }));
  // The reader submits the first request and waits on the kernel: nothing else to run.
  ctx.poll();
  CHECK(reader.stats().requests == 1);
  CHECK_FALSE(result);
  cancel.emit(asio::cancellation_type::terminal);
  ctx.run();  // returns once the reader waits on nothing: the read in flight was cancelled
  REQUIRE(result);
  REQUIRE(*result);
  CHECK(kind_of(*result) == errc::cancelled);
  CHECK(reader.stats().requests == 1);  // the 63 queued never reached the kernel
  CHECK(reader.stats().bytes == 0);
}

TEST_CASE("read cancel – a cancelled lease read gives its lease back before it completes", "[io][read][cancel][pool]") {
  BigCheckpoint ck;
  asio::io_context ctx;
  Gate gate;
  SourceOptions options;
  options.pool = {.budget = 8 * MiB, .huge_pages = false, .prefault = false};
  options.reader.kind = ReaderKind::pread;
  options.reader.direct = DirectMode::off;
  options.reader.depth = 1;
  options.reader.max_request = 64 * KiB;
  options.reader.faults = &gate;
  auto source = CheckpointSource::open(ctx.get_executor(), ck.path, options);
  asio::cancellation_signal cancel;
  std::optional<std::exception_ptr> result;
  std::size_t in_use_at_completion = 1;
  TensorReadRequest request{"w"};
  source->async_read(request, asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e, Lease lease) {
                       result = e;
                       CHECK(lease.bytes().empty());
                       in_use_at_completion = source->pool().in_use();
                     }));
  // Until the first request is in the worker, held by the gate.
  while (!gate.has_entered()) {
    ctx.poll();
    ctx.restart();
  }
  cancel.emit(asio::cancellation_type::terminal);  // on the loop's thread, as Asio's slots want
  gate.release();
  ctx.run();
  REQUIRE(result);
  REQUIRE(*result);
  CHECK(kind_of(*result) == errc::cancelled);
  CHECK(source->reader().stats().requests == 1);
  CHECK(in_use_at_completion == 0);
}
