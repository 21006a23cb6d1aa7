// The CUDA backend's host-side logic, which needs no device: CUDA errors as typed eredu
// errors, the relay that completes stream callbacks off CUDA's thread, retention, the RAII
// wrappers' behaviour where no device is present, and the backend concepts.

#include "eredu/cuda/backend.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <catch2/catch.hpp>
#include <thread>
#include <vector>

#include "eredu/core/error.hpp"
#include "eredu/cuda/cuda_error.hpp"
#include "eredu/cuda/device.hpp"
#include "eredu/cuda/event.hpp"
#include "eredu/cuda/stream_completion.hpp"
#include "eredu/engine/backend/parameter_backend.hpp"
#include "eredu/engine/backend/submission_backend.hpp"
#include "eredu/engine/backend/transfer_backend.hpp"

using namespace eredu;

namespace {

// Waits (blocking: no event loop involved) until `c` is ready, for at most a few seconds.
bool wait_ready(const Completion& c) {
  for (int i = 0; i < 5000 && !c.ready(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return c.ready();
}

}  // namespace

TEST_CASE("cuda backend – satisfies the engine's three backend concepts", "[cuda][host]") {
  STATIC_REQUIRE(engine::ParameterBackend<cuda::Backend>);
  STATIC_REQUIRE(engine::SubmissionBackend<cuda::Backend>);
  STATIC_REQUIRE(engine::TransferBackend<cuda::Backend>);
}

TEST_CASE("cuda errors – a failed call becomes a BackendError naming the call, the CUDA error and the tensor",
          "[cuda][host][errors]") {
  try {
    cuda::check(cudaErrorInvalidValue, "cudaMemcpyAsync (host to device)", "model.layers.0.q_proj.weight");
    FAIL("check did not throw");
  } catch (const BackendError& e) {
    CHECK(e.kind() == errc::backend_failure);
    CHECK(e.family() == error_family::backend);
    CHECK(e.context().tensor == "model.layers.0.q_proj.weight");
    CHECK_THAT(e.what(), Catch::Contains("cudaMemcpyAsync (host to device) failed"));
    CHECK_THAT(e.what(), Catch::Contains("cudaErrorInvalidValue"));
    CHECK_THAT(e.what(), Catch::Contains("model.layers.0.q_proj.weight"));
  }
  CHECK_NOTHROW(cuda::check(cudaSuccess, "cudaStreamCreate"));
}

TEST_CASE("cuda errors – allocation failures are out_of_memory, everything else backend_failure",
          "[cuda][host][errors]") {
  CHECK(cuda::errc_for(cudaErrorMemoryAllocation) == errc::out_of_memory);
  CHECK(cuda::errc_for(cudaErrorInvalidValue) == errc::backend_failure);
  CHECK(cuda::errc_for(cudaErrorNoDevice) == errc::backend_failure);
  CHECK(cuda::errc_for(cudaErrorIllegalAddress) == errc::backend_failure);
  BackendError oom = cuda::cuda_error(cudaErrorMemoryAllocation, "cudaMallocFromPoolAsync", "embed");
  CHECK(oom.kind() == errc::out_of_memory);
  CHECK_THAT(oom.what(), Catch::Contains("cudaErrorMemoryAllocation") && Catch::Contains("embed"));
  // A value the runtime does not know still yields a message with the call and the number.
  BackendError odd = cuda::cuda_error(static_cast<cudaError_t>(4242), "cudaEventRecord");
  CHECK_THAT(odd.what(), Catch::Contains("cudaEventRecord failed") && Catch::Contains("4242"));
}

TEST_CASE("cuda completions – the relay completes on its own thread, never the callback's",
          "[cuda][host][completion]") {
  CompletionSource source;
  Completion c = source.completion();
  std::atomic<std::thread::id> completed_on{};
  c.on_complete([&](std::exception_ptr) { completed_on = std::this_thread::get_id(); });
  std::thread callback_thread(
      [s = std::move(source)]() mutable { cuda::detail::relay_completion(std::move(s), cudaSuccess, "w"); });
  const std::thread::id callback_id = callback_thread.get_id();
  callback_thread.join();
  REQUIRE(wait_ready(c));
  CHECK_FALSE(c.error());
  CHECK(completed_on.load() != callback_id);
  CHECK(completed_on.load() != std::this_thread::get_id());
}

TEST_CASE("cuda completions – a device error status fails the completion with a BackendError naming the work",
          "[cuda][host][completion][errors]") {
  CompletionSource source;
  Completion c = source.completion();
  cuda::detail::relay_completion(std::move(source), cudaErrorIllegalAddress, "model.norm.weight");
  REQUIRE(wait_ready(c));
  REQUIRE(c.error());
  try {
    std::rethrow_exception(c.error());
  } catch (const BackendError& e) {
    CHECK(e.kind() == errc::backend_failure);
    CHECK_THAT(e.what(), Catch::Contains("stream work failed") && Catch::Contains("cudaErrorIllegalAddress") &&
                             Catch::Contains("model.norm.weight"));
  }
}

TEST_CASE("cuda completions – a coroutine awaiting a relayed completion resumes on its event loop",
          "[cuda][host][completion]") {
  asio::io_context ctx;
  CompletionSource source;
  Completion c = source.completion();
  std::thread::id resumed_on{};
  bool done = false;
  asio::co_spawn(
      ctx,
      [](Completion awaited, std::thread::id* where, bool* finished) -> asio::awaitable<void> {
        co_await awaited.async_wait(asio::use_awaitable);
        *where = std::this_thread::get_id();
        *finished = true;
      }(c, &resumed_on, &done),
      asio::detached);
  std::thread producer(
      [s = std::move(source)]() mutable { cuda::detail::relay_completion(std::move(s), cudaSuccess, ""); });
  producer.join();
  while (!done) {
    ctx.restart();
    ctx.run_one_for(std::chrono::milliseconds(5));
  }
  CHECK(resumed_on == std::this_thread::get_id());
}

TEST_CASE("cuda executor – retain_until_complete keeps a value until the completion fires, then drops it",
          "[cuda][host][completion]") {
  struct Probe {
    std::shared_ptr<std::atomic<int>> alive;
    explicit Probe(std::shared_ptr<std::atomic<int>> a) : alive(std::move(a)) { ++*alive; }
    Probe(Probe&& o) noexcept : alive(o.alive) { ++*alive; }
    ~Probe() { --*alive; }
  };
  auto alive = std::make_shared<std::atomic<int>>(0);
  CompletionSource source;
  cuda::Executor::retain_until_complete(source.completion(), Probe(alive));
  CHECK(*alive == 1);
  Completion c = source.completion();
  cuda::detail::relay_completion(std::move(source), cudaSuccess, "");
  REQUIRE(wait_ready(c));
  for (int i = 0; i < 1000 && *alive != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(*alive == 0);
}

TEST_CASE("cuda wrappers – empty handles own nothing and destroy cleanly", "[cuda][host]") {
  cuda::Stream stream;
  CHECK_FALSE(stream);
  cuda::Event event;
  CHECK_FALSE(event);
  cuda::PinnedRegistration none;
  CHECK(none.memory().empty());
  std::vector<std::byte> bytes(16);
  CHECK_FALSE(none.contains(bytes));
  cuda::PinnedRegistration empty(std::span<std::byte>{});  // registers nothing, needs no device
  CHECK(empty.memory().empty());
  cuda::Stream moved(std::move(stream));
  CHECK_FALSE(moved);
  cuda::Tensor t;
  CHECK_FALSE(t);
  CHECK(t.data() == nullptr);
  CHECK(t.device() == -1);
  cuda::Parameter p(DType::BF16, {2, 3});
  CHECK_FALSE(p.bound());
}

TEST_CASE("cuda wrappers – without a device every constructor throws a typed error naming its call",
          "[cuda][host][nodevice]") {
  if (cuda::device_count() > 0) {
    WARN("a CUDA device is present: the no-device behaviour is not exercised, skipping");
    return;
  }
  CHECK_FALSE(cuda::no_device_reason().empty());
  auto expect_backend_error = [](auto make, const char* call) {
    try {
      make();
      FAIL("no error without a device");
    } catch (const BackendError& e) {
      CHECK(e.family() == error_family::backend);
      CHECK_THAT(e.what(), Catch::Contains(call));
    }
  };
  expect_backend_error([] { cuda::Stream s(0); }, "cuda");
  expect_backend_error([] { cuda::Event e(0); }, "cuda");
  expect_backend_error([] { cuda::Executor ex(0); }, "cuda");
  expect_backend_error([] { cuda::DeviceMemoryPool pool(0); }, "cudaMemPoolCreate");
  expect_backend_error([] { cuda::PinnedBlock block(4096); }, "cudaMallocHost");
  expect_backend_error([] { cuda::HostBuffer host(DType::F32, {4}, 16); }, "cudaMallocHost");
  std::vector<std::byte> memory(1 << 16);
  expect_backend_error([&] { cuda::PinnedRegistration pin(memory); }, "cudaHostRegister");
  // A stream callback cannot be queued on a stream that does not exist: the completion fails
  // at once, it does not hang.
  Completion c = cuda::stream_completion(nullptr, "w");
  CHECK(c.ready());
  CHECK(c.error());
}
