#pragma once
// eredu::test::FakeBackend: a deterministic, in-memory backend for engine tests. It satisfies
// ParameterBackend, SubmissionBackend, TransferBackend and InPlaceBackend, so the engine's
// templates (async_materialize, async_load, PrefetchPipeline, ModelSlot, InPlaceModelSlot)
// are tested without a real backend, and it lets a test script what a real one cannot be
// made to do on demand:
//
//  * failures — `device.fail(FakeOp::materialize, "k", errc::io_error)` fails every
//    realization that reads checkpoint tensor "k" (at its completion, or at once with
//    FailAt::start); likewise validate_bind, promote, demote and overwrite of weights that
//    came from "k";
//  * delays — `FakeGate g = device.hold(FakeOp::materialize, "k")` keeps those realizations
//    in flight until the test calls `g.open()` (optionally waking them when their unit is
//    stopped), and `device.delay(op, "k", n)` makes them take n more event-loop turns;
//  * counters — `device.stats()`: realizations started, succeeded, failed, cancelled, in
//    flight and waiting at a gate; the keys started and completed in order; reads per key;
//    live weights and host buffers; shares, validations, binds (and binds of a weight that
//    validate_bind never accepted), promotes, demotes, overwrites, retained values.
//
// Reads: with FakeReads::through_pool (the default) every source a realization needs is read
// through the real io::CheckpointSource as a lease from its real pool, so lease accounting
// and injected I/O faults are real; a realization holds its last lease until it completes (a
// held realization keeps its lease: "leases outlive in-flight work" is observable). With
// FakeReads::bypass nothing is read: bytes are fake_tensor_bytes(), a pattern of the tensor's
// name, and every step of the fake runs on the event loop, so run_ready_handlers() reaches
// the same state on every run — what tests that count steps (look-ahead bounds) need.
//
// Realizations run as coroutines on the source's executor, executor work (promote, demote,
// overwrite) on the device's; both complete through eredu::Completion, never inline. Recipes
// are evaluated with the reference evaluator (support/reference_recipe.hpp). A realization
// stops at its next step once its stop token is set, and completes with errc::cancelled.
// Open every gate before a test ends: a held realization keeps its lease.

#include <algorithm>
#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "eredu/core/completion.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/unique_function.hpp"
#include "eredu/engine/backend/backend_glue.hpp"
#include "eredu/engine/description/recipe.hpp"
#include "eredu/engine/orchestration/placement.hpp"
#include "eredu/io/reading/byte_source.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"
#include "eredu/io/reading/tensor_read_request.hpp"
#include "io/read_fixture.hpp"
#include "support/reference_recipe.hpp"

namespace eredu::test {

/// An operation of the fake that a script can fail or delay.
enum class FakeOp {
  materialize,    ///< a realization (materialize or materialize_recipe)
  validate_bind,  ///< FakeBackend::validate_bind
  promote,        ///< FakeBackend::promote's copy
  demote,         ///< FakeBackend::demote's copy
  overwrite,      ///< FakeBackend::overwrite's copy
};

/// Name of an operation, for messages ("materialize").
inline const char* fake_op_name(FakeOp op) noexcept {
  switch (op) {
    case FakeOp::materialize:
      return "materialize";
    case FakeOp::validate_bind:
      return "validate_bind";
    case FakeOp::promote:
      return "promote";
    case FakeOp::demote:
      return "demote";
    case FakeOp::overwrite:
      return "overwrite";
  }
  return "?";
}

/// Where a scripted failure happens.
enum class FailAt {
  start,     ///< the call itself throws (materialize, promote...): nothing was started
  complete,  ///< the operation runs (reads, waits at its gates) and then its completion fails
};

/// Options of a scripted failure.
struct FakeFailure {
  FailAt at = FailAt::complete;  ///< where it happens (validate_bind always throws)
  std::size_t times = SIZE_MAX;  ///< how many matching operations fail; later ones succeed
};

/// How the fake gets a tensor's bytes (see file comment).
enum class FakeReads {
  through_pool,  ///< one real lease per source, from the source's pool
  bypass,        ///< no I/O: fake_tensor_bytes(), everything on the event loop
};

/// What the fake has been asked to do so far (FakeDevice::stats).
struct FakeStats {
  std::size_t started = 0;                  ///< realizations started (materialize calls that returned)
  std::size_t start_failures = 0;           ///< materialize calls that threw at once
  std::size_t succeeded = 0;                ///< realizations completed successfully
  std::size_t failed = 0;                   ///< realizations completed with an error other than cancelled
  std::size_t cancelled = 0;                ///< realizations completed with errc::cancelled (stopped)
  std::size_t in_flight = 0;                ///< realizations started and not completed
  std::size_t waiting = 0;                  ///< operations waiting at a closed gate now
  std::size_t finished = 0;                 ///< finish_materialization calls that returned a weight
  std::size_t finish_misuse = 0;            ///< finish_materialization calls before the completion was ready
  std::uint64_t bytes_materialized = 0;     ///< bytes of the realizations that succeeded
  std::vector<std::string> started_keys;    ///< first source key of each realization, in start order
  std::vector<std::string> completed_keys;  ///< the same, in completion order
  std::vector<std::string> read_keys;       ///< the key of every source read (lease or bypass fill)
  std::size_t live_weights = 0;             ///< weight storages alive now (materialized, promoted)
  std::uint64_t live_bytes = 0;             ///< their bytes
  std::size_t live_host_buffers = 0;        ///< host buffers alive now (demoted)
  std::size_t shares = 0;                   ///< share_materialized_weight calls
  std::size_t validations = 0;              ///< validate_bind calls that accepted
  std::size_t rejections = 0;               ///< validate_bind calls that threw
  std::size_t binds = 0;                    ///< bind calls
  std::size_t unvalidated_binds = 0;        ///< binds of a (slot, weight) that validate_bind did not accept
  std::size_t promotes = 0;                 ///< promote calls
  std::size_t demotes = 0;                  ///< demote calls
  std::size_t overwrites = 0;               ///< overwrite calls that started a copy
  std::size_t executor_ops = 0;             ///< promote/demote/overwrite copies completed
  std::size_t submits = 0;                  ///< submit (fence) calls
  std::size_t retained = 0;                 ///< values held by retain_until_complete now

  /// How many times `key` was read.
  std::size_t reads_of(const std::string& key) const {
    return static_cast<std::size_t>(std::count(read_keys.begin(), read_keys.end(), key));
  }
  /// How many realizations of `key` were started.
  std::size_t starts_of(const std::string& key) const {
    return static_cast<std::size_t>(std::count(started_keys.begin(), started_keys.end(), key));
  }
};

/// The bytes the fake gives tensor `tensor` in FakeReads::bypass mode: a pattern derived from
/// its name (FNV-1a, then splitmix64 per 8 bytes), the same on every run.
inline std::vector<std::byte> fake_tensor_bytes(const io::TensorInfo& tensor) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : tensor.name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  std::vector<std::byte> out(tensor.nbytes);
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::uint64_t z = h + (i / 8 + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    out[i] = static_cast<std::byte>(z >> ((i % 8) * 8));
  }
  return out;
}

namespace fake_detail {

struct DeviceState;

/// The bytes of one weight; counted live while it exists.
struct Storage {
  /// `size` zero bytes realized from key `from`, counted on `d`.
  Storage(std::shared_ptr<DeviceState> d, std::size_t size, std::string from);
  /// Uncounts itself.
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  std::shared_ptr<DeviceState> device;  ///< counters and script
  std::vector<std::byte> bytes;         ///< the weight's bytes
  const std::string origin;             ///< the checkpoint key it came from
};

/// The bytes of one host buffer; counted live while it exists.
struct HostStorage {
  /// `size` zero bytes, counted on `d`.
  HostStorage(std::shared_ptr<DeviceState> d, std::size_t size);
  /// Uncounts itself.
  ~HostStorage();
  HostStorage(const HostStorage&) = delete;
  HostStorage& operator=(const HostStorage&) = delete;
  std::shared_ptr<DeviceState> device;  ///< counters
  std::vector<std::byte> bytes;         ///< the parked bytes
};

/// A gate: closed until opened, then open for good.
struct GateState {
  CompletionSource source;                  ///< completed by FakeGate::open
  Completion opened = source.completion();  ///< what waiters wait for
  std::atomic<bool> open{false};            ///< set once opened
};

/// One scripted rule.
struct Rule {
  /// What the rule does.
  enum class Kind {
    fail,   ///< fails the operation
    gate,   ///< holds it at a gate
    turns,  ///< delays it by event-loop turns
  };
  Kind kind = Kind::fail;              ///< what it does
  FakeOp op = FakeOp::materialize;     ///< the operation it applies to
  std::string key;                     ///< the checkpoint key it applies to; empty: every key
  errc error = errc::backend_failure;  ///< fail: the kind
  FakeFailure failure;                 ///< fail: where, how often (counted down)
  std::shared_ptr<GateState> gate;     ///< gate: the gate
  bool wake_on_stop = false;           ///< gate: a stopped realization stops waiting
  std::size_t turns = 0;               ///< turns: how many

  /// True when the rule applies to `o` on an operation reading `keys`.
  bool matches(FakeOp o, const std::vector<std::string>& keys) const {
    return op == o && (key.empty() || std::find(keys.begin(), keys.end(), key) != keys.end());
  }
};

/// What an operation waits for before it may complete.
struct Delays {
  std::size_t turns = 0;                                           ///< loop turns to take first
  std::vector<std::pair<std::shared_ptr<GateState>, bool>> gates;  ///< then (gate, wake on stop)
};

/// The device: script, counters, executor. Shared by every handle, weight and buffer.
struct DeviceState {
  /// A device running executor work on `ex`, reading as `r` says.
  DeviceState(asio::any_io_executor ex, FakeReads r) : executor(std::move(ex)), reads(r) {}

  const asio::any_io_executor executor;                     ///< where executor work runs
  const FakeReads reads;                                    ///< how realizations read
  mutable std::mutex mutex;                                 ///< guards everything below
  std::vector<Rule> rules;                                  ///< the script
  FakeStats stats;                                          ///< the counters
  std::set<std::pair<const void*, const void*>> validated;  ///< (slot, storage) pairs accepted

  /// The failure scripted for this occurrence of `op` on `keys` at `at`, if any (counts it).
  std::optional<errc> take_failure(FakeOp op, const std::vector<std::string>& keys, FailAt at) {
    std::lock_guard lock(mutex);
    for (Rule& r : rules)
      if (r.kind == Rule::Kind::fail && r.failure.at == at && r.failure.times > 0 && r.matches(op, keys)) {
        --r.failure.times;
        return r.error;
      }
    return std::nullopt;
  }
  /// The gates and turns scripted for `op` on `keys`.
  Delays delays(FakeOp op, const std::vector<std::string>& keys) const {
    std::lock_guard lock(mutex);
    Delays d;
    for (const Rule& r : rules) {
      if (!r.matches(op, keys)) continue;
      if (r.kind == Rule::Kind::turns) d.turns += r.turns;
      if (r.kind == Rule::Kind::gate) d.gates.emplace_back(r.gate, r.wake_on_stop);
    }
    return d;
  }
  /// Runs `fn(stats)` under the mutex.
  template <class Fn>
  void update(Fn&& fn) {
    std::lock_guard lock(mutex);
    fn(stats);
  }
};

inline Storage::Storage(std::shared_ptr<DeviceState> d, std::size_t size, std::string from)
    : device(std::move(d)), bytes(size), origin(std::move(from)) {
  device->update([&](FakeStats& s) {
    ++s.live_weights;
    s.live_bytes += bytes.size();
  });
}
inline Storage::~Storage() {
  std::lock_guard lock(device->mutex);
  --device->stats.live_weights;
  device->stats.live_bytes -= bytes.size();
}
inline HostStorage::HostStorage(std::shared_ptr<DeviceState> d, std::size_t size) : device(std::move(d)), bytes(size) {
  device->update([](FakeStats& s) { ++s.live_host_buffers; });
}
inline HostStorage::~HostStorage() {
  std::lock_guard lock(device->mutex);
  --device->stats.live_host_buffers;
}

/// The scripted error of kind `kind` for `op` on `key`: a BackendError for backend kinds,
/// otherwise an eredu::Error; it names the tensor.
inline std::exception_ptr scripted_error(errc kind, FakeOp op, const std::string& key) {
  const ErrorContext context{.tensor = key};
  const std::string detail = fmt::format("scripted {} failure of the fake backend", fake_op_name(op));
  if (errc_family(kind) == error_family::backend) return std::make_exception_ptr(BackendError(kind, context, detail));
  return std::make_exception_ptr(Error(kind, context, detail));
}

/// The error a stopped realization completes with.
inline std::exception_ptr stopped_error(const std::string& key) {
  return std::make_exception_ptr(
      Error(errc::cancelled, {.tensor = key}, "the fake realization stopped: its unit was stopped"));
}

/// Waits for `c` to finish, success or failure alike.
inline asio::awaitable<void> settle(Completion c) {
  try {
    co_await c.async_wait(asio::use_awaitable);
  } catch (...) {
    // Callers look at the state, not at how the wait ended.
  }
}

/// Waits until `gate` opens, or (when `wake_on_stop`) `stop` is requested.
inline asio::awaitable<void> wait_gate(std::shared_ptr<DeviceState> d, std::shared_ptr<GateState> gate,
                                       bool wake_on_stop, std::stop_token stop) {
  if (gate->open.load()) co_return;
  auto wake = std::make_shared<CompletionSource>();
  Completion woken = wake->completion();
  gate->opened.on_complete([wake](std::exception_ptr) { wake->complete(); });
  auto on_stop_fn = [wake] { wake->complete(); };
  std::optional<std::stop_callback<decltype(on_stop_fn)>> on_stop;
  if (wake_on_stop) on_stop.emplace(stop, on_stop_fn);
  d->update([](FakeStats& s) { ++s.waiting; });
  co_await settle(woken);
  d->update([](FakeStats& s) { --s.waiting; });
}

/// Takes the scripted turns, then waits at the scripted gates, of `op` on `keys`.
inline asio::awaitable<void> wait_delays(std::shared_ptr<DeviceState> d, FakeOp op,
                                         const std::vector<std::string>& keys, std::stop_token stop) {
  Delays delays = d->delays(op, keys);
  auto ex = co_await asio::this_coro::executor;
  for (std::size_t i = 0; i < delays.turns; ++i) co_await asio::post(ex, asio::use_awaitable);
  for (auto& [gate, wake_on_stop] : delays.gates) co_await wait_gate(d, gate, wake_on_stop, stop);
}

/// "key|[0:4, 0:8]": identifies one source read of a realization.
inline std::string source_id(const std::string& key, const Selection& selection) {
  return key + "|" + selection.to_string();
}

/// What one realization reads and computes.
struct Job {
  std::vector<io::TensorReadRequest> reads;           ///< its sources, in recipe order
  std::optional<engine::DerivedWeightRecipe> recipe;  ///< none: the one read, dtype kept
  std::vector<std::string> keys;                      ///< keys its rules match; the first names it
  std::shared_ptr<Storage> storage;                   ///< the destination
  std::stop_token stop;                               ///< its unit's stop
};

/// One realization: read (holding the last lease), wait, check the script, compute.
template <io::ByteSource S>
asio::awaitable<void> realize(std::shared_ptr<DeviceState> d, S& source, std::unique_ptr<Job> job) {
  const std::string& origin = job->keys.front();
  // Never done inside materialize(): its first step is a turn of the event loop later, as
  // for a real backend, so a stop requested right after the start is always seen.
  auto ex = co_await asio::this_coro::executor;
  co_await asio::post(ex, asio::use_awaitable);
  if (job->stop.stop_requested()) std::rethrow_exception(stopped_error(origin));
  std::map<std::string, std::vector<std::byte>> fetched;
  io::Lease held;
  std::string held_id;
  for (const io::TensorReadRequest& request : job->reads) {
    if (job->stop.stop_requested()) std::rethrow_exception(stopped_error(origin));
    d->update([&](FakeStats& s) { s.read_keys.push_back(request.key); });
    if (d->reads == FakeReads::bypass) {
      const io::TensorInfo& info = source.catalog().at(request.key);
      fetched[source_id(request.key, request.selection)] =
          select_bytes(fake_tensor_bytes(info), info.shape, info.dtype, request.selection);
      continue;
    }
    if (held) {
      fetched[held_id] = std::vector<std::byte>(held.bytes().begin(), held.bytes().end());
      held.release();
    }
    held = co_await source.async_read(request, asio::use_awaitable);
    held_id = source_id(request.key, request.selection);
  }
  co_await wait_delays(d, FakeOp::materialize, job->keys, job->stop);
  if (job->stop.stop_requested()) {
    held.release();
    std::rethrow_exception(stopped_error(origin));
  }
  if (std::optional<errc> kind = d->take_failure(FakeOp::materialize, job->keys, FailAt::complete)) {
    held.release();
    std::rethrow_exception(scripted_error(*kind, FakeOp::materialize, origin));
  }
  if (held) {
    fetched[held_id] = std::vector<std::byte>(held.bytes().begin(), held.bytes().end());
    held.release();
  }
  std::vector<std::byte> result;
  if (job->recipe) {
    result = reference_evaluate(*job->recipe, source.catalog(), [&](const std::string& key, const Selection& sel) {
      return fetched.at(source_id(key, sel));
    });
  } else {
    result = std::move(fetched.begin()->second);
  }
  if (result.size() != job->storage->bytes.size())
    throw Error(
        errc::backend_failure, {.tensor = origin},
        fmt::format("the fake computed {} bytes for a weight of {}", result.size(), job->storage->bytes.size()));
  std::memcpy(job->storage->bytes.data(), result.data(), result.size());
}

/// Every recipe source (key and selection), in recipe order.
inline void collect_sources(const engine::DerivedWeightRecipe& r, std::vector<io::TensorReadRequest>& out) {
  if (r.kind() == engine::DerivedWeightRecipe::Kind::source) {
    out.push_back({r.key(), r.selection()});
    return;
  }
  for (const engine::DerivedWeightRecipe& input : r.inputs()) collect_sources(input, out);
}

}  // namespace fake_detail

/// A gate scripted by FakeDevice::hold: operations that match it wait until it is opened.
/// Cheap to copy (copies are the same gate).
class FakeGate {
 public:
  /// Lets every waiting and every later matching operation through (idempotent).
  void open() const {
    if (!state_->open.exchange(true)) state_->source.complete();
  }
  /// True once opened.
  bool is_open() const noexcept { return state_->open.load(); }

 private:
  friend class FakeDevice;
  explicit FakeGate(std::shared_ptr<fake_detail::GateState> s) : state_(std::move(s)) {}
  std::shared_ptr<fake_detail::GateState> state_;
};

/// A weight of the fake: dtype, shape and shared host bytes. Cheap to copy: a copy is another
/// handle to the same storage (aliases, bound slots).
class FakeWeight {
 public:
  /// An empty weight; `bool(w)` is false.
  FakeWeight() = default;
  /// Element type.
  DType dtype() const noexcept { return dtype_; }
  /// Dimensions.
  const Shape& shape() const noexcept { return shape_; }
  /// The bytes (complete once the realization or copy that writes them has completed).
  std::span<const std::byte> bytes() const noexcept {
    return storage_ ? std::span<const std::byte>(storage_->bytes) : std::span<const std::byte>{};
  }
  /// Address of the first byte (nullptr when empty): what "in place" keeps.
  const std::byte* data() const noexcept { return storage_ ? storage_->bytes.data() : nullptr; }
  /// Byte size.
  std::size_t nbytes() const noexcept { return storage_ ? storage_->bytes.size() : 0; }
  /// The checkpoint key it was realized from (a recipe's first source).
  const std::string& origin() const {
    static const std::string none;
    return storage_ ? storage_->origin : none;
  }
  /// True when both handles share storage.
  bool shares_storage_with(const FakeWeight& other) const noexcept { return storage_ && storage_ == other.storage_; }
  /// True when the weight holds storage.
  explicit operator bool() const noexcept { return storage_ != nullptr; }

 private:
  friend struct FakeBackend;
  FakeWeight(DType dtype, Shape shape, std::shared_ptr<fake_detail::Storage> storage)
      : dtype_(dtype), shape_(std::move(shape)), storage_(std::move(storage)) {}
  DType dtype_{};
  Shape shape_;
  std::shared_ptr<fake_detail::Storage> storage_;
};

/// A weight parked on the fake's host: bytes, dtype, shape, origin. Cheap to copy.
class FakeHostBuffer {
 public:
  /// An empty buffer.
  FakeHostBuffer() = default;
  /// Element type.
  DType dtype() const noexcept { return dtype_; }
  /// Dimensions.
  const Shape& shape() const noexcept { return shape_; }
  /// The bytes (complete once the demote's completion has fired).
  std::span<const std::byte> bytes() const noexcept {
    return storage_ ? std::span<const std::byte>(storage_->bytes) : std::span<const std::byte>{};
  }
  /// The key of the weight it was demoted from.
  const std::string& origin() const noexcept { return origin_; }

 private:
  friend struct FakeBackend;
  FakeHostBuffer(DType dtype, Shape shape, std::string origin, std::shared_ptr<fake_detail::HostStorage> storage)
      : dtype_(dtype), shape_(std::move(shape)), origin_(std::move(origin)), storage_(std::move(storage)) {}
  DType dtype_{};
  Shape shape_;
  std::string origin_;
  std::shared_ptr<fake_detail::HostStorage> storage_;
};

/// A parameter slot of a fake module: the dtype and shape it accepts, and its bound weight.
using FakeParameter = engine::BasicParameter<FakeWeight>;

/// An in-flight realization: the destination and the completion of the work writing it.
using FakeMaterialization = engine::BasicMaterialization<FakeWeight>;

/// The fake's device and its MaterializationContext: the script, the counters, and the
/// executor its executor work runs on. Cheap to copy (copies are the same device).
class FakeDevice {
 public:
  /// A device whose executor work runs on `executor` (the event loop of the test), reading
  /// as `reads` says.
  explicit FakeDevice(asio::any_io_executor executor, FakeReads reads = FakeReads::through_pool)
      : state_(std::make_shared<fake_detail::DeviceState>(std::move(executor), reads)) {}

  /// A snapshot of the counters (any thread).
  FakeStats stats() const {
    std::lock_guard lock(state_->mutex);
    return state_->stats;
  }
  /// How the device reads.
  FakeReads reads() const noexcept { return state_->reads; }
  /// The executor executor work runs on.
  const asio::any_io_executor& executor() const noexcept { return state_->executor; }

  /// Fails `op` on weights read from checkpoint tensor `key` ("" = every key) with an error
  /// of `kind` naming the tensor (a BackendError for backend kinds): see FakeFailure.
  void fail(FakeOp op, std::string key, errc kind, FakeFailure options = {}) {
    fake_detail::Rule r;
    r.kind = fake_detail::Rule::Kind::fail;
    r.op = op;
    r.key = std::move(key);
    r.error = kind;
    r.failure = options;
    add(std::move(r));
  }
  /// Holds `op` on weights of `key` ("" = every key) until the returned gate is opened: a
  /// realization waits after its reads, holding its last lease; an executor copy waits
  /// before it copies. With `wake_on_stop`, a realization whose unit was stopped stops
  /// waiting (an interruptible step); without, it waits for the gate whatever happens (a
  /// step that cannot be interrupted, such as a kernel in flight).
  FakeGate hold(FakeOp op, std::string key, bool wake_on_stop = false) {
    fake_detail::Rule r;
    r.kind = fake_detail::Rule::Kind::gate;
    r.op = op;
    r.key = std::move(key);
    r.gate = std::make_shared<fake_detail::GateState>();
    r.wake_on_stop = wake_on_stop;
    FakeGate gate(r.gate);
    add(std::move(r));
    return gate;
  }
  /// Makes `op` on weights of `key` ("" = every key) take `turns` more event-loop turns.
  void delay(FakeOp op, std::string key, std::size_t turns) {
    fake_detail::Rule r;
    r.kind = fake_detail::Rule::Kind::turns;
    r.op = op;
    r.key = std::move(key);
    r.turns = turns;
    add(std::move(r));
  }
  /// Forgets every failure, gate (opening it first) and delay scripted so far.
  void clear_script() {
    std::vector<fake_detail::Rule> rules;
    {
      std::lock_guard lock(state_->mutex);
      rules.swap(state_->rules);
    }
    for (auto& r : rules)
      if (r.gate) FakeGate(r.gate).open();
  }

 private:
  friend struct FakeBackend;
  friend class FakeExecutor;
  void add(fake_detail::Rule r) {
    std::lock_guard lock(state_->mutex);
    state_->rules.push_back(std::move(r));
  }
  std::shared_ptr<fake_detail::DeviceState> state_;
};

/// An executor of the fake (SubmissionBackend): its work runs on the device's executor, in
/// submission order once its predecessors (order_after) have completed; a failed
/// predecessor fails it. Not movable; fork_executors hands out more.
class FakeExecutor {
 public:
  /// An executor of `device`.
  explicit FakeExecutor(const FakeDevice& device) : device_(device) {}
  FakeExecutor(const FakeExecutor&) = delete;
  FakeExecutor& operator=(const FakeExecutor&) = delete;

  /// The device it belongs to.
  const FakeDevice& device() const noexcept { return device_; }

 private:
  friend struct FakeBackend;

  /// Runs `work` after the predecessors and the script's delays for `op` on `key`.
  Completion run(FakeOp op, const std::string& key, UniqueFunction<void()> work) {
    std::vector<Completion> before;
    {
      std::lock_guard lock(mutex_);
      std::erase_if(predecessors_, [](const Completion& c) { return c.ready() && !c.error(); });
      before = predecessors_;
    }
    std::shared_ptr<fake_detail::DeviceState> d = device_.state_;
    CompletionSource done;
    Completion completion = done.completion();
    asio::co_spawn(d->executor, op_coroutine(d, op, key, when_all(before), std::move(work)),
                   [d, done = std::move(done)](std::exception_ptr e) mutable {
                     d->update([](FakeStats& s) { ++s.executor_ops; });
                     done.finish(std::move(e));
                   });
    std::lock_guard lock(mutex_);
    std::erase_if(outstanding_, [](const Completion& c) { return c.ready(); });
    outstanding_.push_back(completion);
    return completion;
  }

  static asio::awaitable<void> op_coroutine(std::shared_ptr<fake_detail::DeviceState> d, FakeOp op, std::string key,
                                            Completion before, UniqueFunction<void()> work) {
    co_await before.async_wait(asio::use_awaitable);
    const std::vector<std::string> keys{key};
    const std::stop_token never;
    co_await fake_detail::wait_delays(d, op, keys, never);
    if (std::optional<errc> kind = d->take_failure(op, keys, FailAt::complete))
      std::rethrow_exception(fake_detail::scripted_error(*kind, op, key));
    work();
  }

  FakeDevice device_;
  std::mutex mutex_;
  std::vector<Completion> predecessors_;
  std::vector<Completion> outstanding_;
};

/// The fake backend's types and operations (see file comment).
struct FakeBackend {
  using Parameter = FakeParameter;              ///< a module's slot
  using MaterializedWeight = FakeWeight;        ///< a realized weight
  using MaterializationContext = FakeDevice;    ///< the device: script and counters
  using Materialization = FakeMaterialization;  ///< an in-flight realization
  using Executor = FakeExecutor;                ///< runs promote/demote/overwrite copies
  using HostBuffer = FakeHostBuffer;            ///< a parked weight

  /// What fake device memory offers the placement planner: memory no source writes into,
  /// that takes each read's bytes whole, in one lease (whose accounting the engine's tests
  /// watch): every read is a staged lease.
  static constexpr engine::BufferTraits buffer_traits{.host = false, .alignment = 1, .whole_leases = true};

  // --- ParameterBackend ---

  /// Starts realizing `request` (dtype kept). Throws at once for an unknown tensor, a bad
  /// selection, or a FailAt::start failure scripted for its key.
  template <io::ByteSource S>
  static FakeMaterialization materialize(S& source, const io::TensorReadRequest& request, FakeDevice& device,
                                         std::stop_token stop) {
    const io::TensorInfo& info = source.catalog().at(request.key);
    check_placement(source, source.selected_bytes(request), false);
    Shape shape = request.selection.is_all() ? info.shape : request.selection.selected_shape(info.shape);
    auto job = std::make_unique<fake_detail::Job>();
    job->reads.push_back(request);
    job->keys.push_back(request.key);
    return start(source, device, info.dtype, std::move(shape), std::move(job), std::move(stop));
  }
  /// Starts evaluating `recipe`. Throws RecipeError at once if it does not infer, or a
  /// FailAt::start failure scripted for one of its keys.
  template <io::ByteSource S>
  static FakeMaterialization materialize_recipe(S& source, const engine::DerivedWeightRecipe& recipe,
                                                FakeDevice& device, std::stop_token stop) {
    engine::InferredWeight w = recipe.infer(source.catalog());
    check_placement(source, w.bytes, recipe.kind() == engine::DerivedWeightRecipe::Kind::cast);
    auto job = std::make_unique<fake_detail::Job>();
    fake_detail::collect_sources(recipe, job->reads);
    job->keys = recipe.source_keys();
    job->recipe = recipe;
    return start(source, device, w.dtype, std::move(w.shape), std::move(job), std::move(stop));
  }
  /// The completion of an in-flight realization.
  static Completion completion(const FakeMaterialization& m) { return m.done; }
  /// The weight an in-flight realization writes.
  static const FakeWeight& materialized_weight(const FakeMaterialization& m) { return m.weight; }
  /// The realized weight; rethrows the realization's error. Called before the completion is
  /// ready, it counts a misuse (FakeStats::finish_misuse) and throws std::logic_error
  /// instead of blocking.
  static FakeWeight finish_materialization(FakeMaterialization&& m) {
    const std::shared_ptr<fake_detail::DeviceState>& d = m.weight.storage_->device;
    if (!m.done.ready()) {
      d->update([](FakeStats& s) { ++s.finish_misuse; });
      throw std::logic_error("finish_materialization before the realization completed");
    }
    if (std::exception_ptr e = m.done.error()) std::rethrow_exception(e);
    d->update([](FakeStats& s) { ++s.finished; });
    return std::move(m.weight);
  }
  /// Another handle to the same storage.
  static FakeWeight share_materialized_weight(const FakeWeight& weight) {
    weight.storage_->device->update([](FakeStats& s) { ++s.shares; });
    return weight;
  }
  /// Throws BackendError(bind_dtype_mismatch / bind_shape_mismatch), or the scripted
  /// validate_bind failure of the weight's key.
  static void validate_bind(const FakeParameter& parameter, const FakeWeight& weight) {
    const std::shared_ptr<fake_detail::DeviceState>& d = weight.storage_->device;
    auto reject = [&](std::exception_ptr e) {
      d->update([](FakeStats& s) { ++s.rejections; });
      std::rethrow_exception(e);
    };
    try {
      engine::check_bind_fits(parameter.dtype, parameter.shape, weight.dtype(), weight.shape());
    } catch (const BackendError&) {
      reject(std::current_exception());
    }
    if (std::optional<errc> kind = d->take_failure(FakeOp::validate_bind, {weight.origin()}, FailAt::complete))
      reject(fake_detail::scripted_error(*kind, FakeOp::validate_bind, weight.origin()));
    if (std::optional<errc> kind = d->take_failure(FakeOp::validate_bind, {weight.origin()}, FailAt::start))
      reject(fake_detail::scripted_error(*kind, FakeOp::validate_bind, weight.origin()));
    std::lock_guard lock(d->mutex);
    ++d->stats.validations;
    d->validated.emplace(&parameter, weight.storage_.get());
  }
  /// Stores the weight in the slot; counts a bind that validate_bind did not accept.
  static void bind(FakeParameter& parameter, FakeWeight&& weight) noexcept {
    if (weight.storage_) {
      const std::shared_ptr<fake_detail::DeviceState> d = weight.storage_->device;
      std::lock_guard lock(d->mutex);
      ++d->stats.binds;
      if (d->validated.erase({&parameter, weight.storage_.get()}) == 0) ++d->stats.unvalidated_binds;
    }
    parameter.value = std::move(weight);
  }

  // --- InPlaceBackend ---

  /// Copies `weight` into the storage bound to `slot`, keeping its address. Throws
  /// BackendError at once when the slot is unbound or differs in dtype or shape, or for a
  /// FailAt::start overwrite failure; `weight` is retained until the copy completes.
  static Completion overwrite(FakeExecutor& executor, FakeParameter& slot, const FakeWeight& weight) {
    if (!slot.value)
      throw BackendError(errc::backend_failure, {}, "an in-place overwrite needs a parameter that is already bound");
    if (slot.value.dtype() != weight.dtype() || slot.value.shape() != weight.shape() ||
        slot.value.nbytes() != weight.nbytes())
      throw BackendError(errc::bind_shape_mismatch, {}, "the bound weight cannot be overwritten by a different one");
    const std::shared_ptr<fake_detail::DeviceState>& d = executor.device_.state_;
    if (std::optional<errc> kind = d->take_failure(FakeOp::overwrite, {weight.origin()}, FailAt::start))
      std::rethrow_exception(fake_detail::scripted_error(*kind, FakeOp::overwrite, weight.origin()));
    d->update([](FakeStats& s) { ++s.overwrites; });
    if (slot.value.shares_storage_with(weight)) return Completion::ready_now();
    return executor.run(FakeOp::overwrite, weight.origin(),
                        [destination = slot.value.storage_, source = weight.storage_] {
                          std::memcpy(destination->bytes.data(), source->bytes.data(), source->bytes.size());
                        });
  }

  // --- SubmissionBackend ---

  /// `count` new executors of the same device.
  static std::vector<std::unique_ptr<FakeExecutor>> fork_executors(FakeExecutor& executor, std::size_t count) {
    std::vector<std::unique_ptr<FakeExecutor>> out;
    for (std::size_t i = 0; i < count; ++i) out.push_back(std::make_unique<FakeExecutor>(executor.device_));
    return out;
  }
  /// Completes when everything submitted to `executor` so far has.
  static Completion submit(FakeExecutor& executor) {
    executor.device_.state_->update([](FakeStats& s) { ++s.submits; });
    std::lock_guard lock(executor.mutex_);
    return when_all(executor.outstanding_);
  }
  /// Later work on `executor` starts after `completion` (and fails if it failed).
  static void order_after(const Completion& completion, FakeExecutor& executor) {
    std::lock_guard lock(executor.mutex_);
    executor.predecessors_.push_back(completion);
  }
  /// Keeps `value` alive until `completion` has completed (counted in FakeStats::retained).
  template <class T>
  static void retain_until_complete(FakeExecutor& executor, const Completion& completion, T value) {
    std::shared_ptr<fake_detail::DeviceState> d = executor.device_.state_;
    d->update([](FakeStats& s) { ++s.retained; });
    auto held = std::make_unique<T>(std::move(value));
    completion.on_complete([d, held = std::move(held)](std::exception_ptr) mutable {
      held.reset();
      d->update([](FakeStats& s) { --s.retained; });
    });
  }

  // --- TransferBackend ---

  /// Copies a parked weight into new storage on `executor`; throws a FailAt::start promote
  /// failure at once, and fails the completion with a FailAt::complete one.
  static std::pair<FakeWeight, Completion> promote(FakeExecutor& executor, const FakeHostBuffer& host) {
    const std::shared_ptr<fake_detail::DeviceState>& d = executor.device_.state_;
    d->update([](FakeStats& s) { ++s.promotes; });
    if (std::optional<errc> kind = d->take_failure(FakeOp::promote, {host.origin()}, FailAt::start))
      std::rethrow_exception(fake_detail::scripted_error(*kind, FakeOp::promote, host.origin()));
    auto storage = std::make_shared<fake_detail::Storage>(d, host.bytes().size(), host.origin());
    FakeWeight weight(host.dtype(), host.shape(), storage);
    Completion c = executor.run(FakeOp::promote, host.origin(), [storage, from = host.storage_] {
      std::memcpy(storage->bytes.data(), from->bytes.data(), from->bytes.size());
    });
    return {std::move(weight), std::move(c)};
  }
  /// Copies a weight into a new host buffer on `executor`, retaining the weight until then;
  /// scripted failures as for promote.
  static std::pair<FakeHostBuffer, Completion> demote(FakeExecutor& executor, const FakeWeight& weight) {
    const std::shared_ptr<fake_detail::DeviceState>& d = executor.device_.state_;
    d->update([](FakeStats& s) { ++s.demotes; });
    if (std::optional<errc> kind = d->take_failure(FakeOp::demote, {weight.origin()}, FailAt::start))
      std::rethrow_exception(fake_detail::scripted_error(*kind, FakeOp::demote, weight.origin()));
    auto storage = std::make_shared<fake_detail::HostStorage>(d, weight.nbytes());
    FakeHostBuffer host(weight.dtype(), weight.shape(), weight.origin(), storage);
    Completion c = executor.run(FakeOp::demote, weight.origin(), [storage, from = weight.storage_] {
      std::memcpy(storage->bytes.data(), from->bytes.data(), from->bytes.size());
    });
    return {std::move(host), std::move(c)};
  }

 private:
  /// Fails unless the placement planner sends the owner down the one landing the fake
  /// executes: a staged lease per read (buffer_traits).
  template <io::ByteSource S>
  static void check_placement(const S& source, std::uint64_t bytes, bool converted) {
    const engine::PlacementPlan plan = engine::plan_placement(
        source.capabilities(), buffer_traits, engine::PlacementPolicy{}, {.bytes = bytes, .converted = converted});
    if (plan.landings().size() != 1 || plan.landings().front() != engine::Landing::staged_lease)
      throw BackendError(errc::backend_failure, {}, "the fake backend lands bytes by staged lease only");
  }

  /// Allocates the destination and starts the realization coroutine on the source's executor.
  template <io::ByteSource S>
  static FakeMaterialization start(S& source, FakeDevice& device, DType dtype, Shape shape,
                                   std::unique_ptr<fake_detail::Job> job, std::stop_token stop) {
    const std::shared_ptr<fake_detail::DeviceState>& d = device.state_;
    const std::string origin = job->keys.front();
    if (std::optional<errc> kind = d->take_failure(FakeOp::materialize, job->keys, FailAt::start)) {
      d->update([](FakeStats& s) { ++s.start_failures; });
      std::rethrow_exception(fake_detail::scripted_error(*kind, FakeOp::materialize, origin));
    }
    const std::uint64_t bytes = *checked_byte_size(*checked_element_count(shape), dtype);
    job->storage = std::make_shared<fake_detail::Storage>(d, bytes, origin);
    job->stop = std::move(stop);
    FakeWeight weight(dtype, std::move(shape), job->storage);
    d->update([&](FakeStats& s) {
      ++s.started;
      ++s.in_flight;
      s.started_keys.push_back(origin);
    });
    CompletionSource done;
    Completion completion = done.completion();
    asio::co_spawn(source.get_executor(), fake_detail::realize(d, source, std::move(job)),
                   [d, origin, bytes, done = std::move(done)](std::exception_ptr e) mutable {
                     d->update([&](FakeStats& s) {
                       --s.in_flight;
                       s.completed_keys.push_back(origin);
                       if (!e) {
                         ++s.succeeded;
                         s.bytes_materialized += bytes;
                       } else if (is_cancellation(e)) {
                         ++s.cancelled;
                       } else {
                         ++s.failed;
                       }
                     });
                     done.finish(std::move(e));
                   });
    return FakeMaterialization{std::move(weight), std::move(completion)};
  }
};

}  // namespace eredu::test
