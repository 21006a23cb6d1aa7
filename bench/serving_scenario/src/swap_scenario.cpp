// The hot-swap serving scenario (see swap_scenario.hpp): the requests, the swaps, and the
// independent references every response is later checked against.
#include "eredu/bench/swap_scenario.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <tbb/global_control.h>
#include <xxhash.h>

#include <algorithm>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "eredu/app/tensor_set_module.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/log.hpp"
#include "eredu/core/quant_formats.hpp"
#include "eredu/core/shape.hpp"
#include "eredu/cpu/backend.hpp"
#include "eredu/cpu/float_formats.hpp"
#include "eredu/io/integrity/checksums.hpp"
#include "eredu/io/integrity/sha256.hpp"

namespace eredu::bench {
namespace {

using Module = app::TensorSetModule;
using Slot = engine::ModelSlot<cpu::Backend, Module>;
using Version = Slot::Version;
using Clock = std::chrono::steady_clock;

/// Closes a file descriptor on scope exit (close errors on a read-only fd are ignored).
struct Fd {
  int fd = -1;
  explicit Fd(const std::string& path) : fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd < 0)
      throw Error(errc::io_error, {.file = path, .os_error = {errno, std::generic_category()}}, "cannot open");
  }
  ~Fd() { ::close(fd); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

/// Reads `out.size()` bytes of tensor `t`, `within` bytes into it, with plain pread: a path
/// to the bytes that shares nothing with the engine's reader, for the reference outputs and
/// tags. Failures name the file, the tensor and the offset like the engine's.
void pread_exact(const io::Catalog& catalog, const io::TensorInfo& t, std::uint64_t within, std::span<std::byte> out) {
  const std::string& path = catalog.file_of(t).path;
  Fd file(path);
  const std::uint64_t offset = t.offset + within;
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(file.fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw Error(
          errc::io_error,
          {.file = path, .tensor = t.name, .offset = offset + done, .os_error = {errno, std::generic_category()}},
          "read failed while computing the reference");
    if (n == 0)
      throw Error(
          errc::unexpected_eof, {.file = path, .tensor = t.name, .offset = offset + done},
          fmt::format("the file ended {} bytes short of the tensor while computing the reference", out.size() - done));
    done += static_cast<std::size_t>(n);
  }
}

/// What a request computes: y = W[0:rows, :] · x for one 2-D tensor W and one of a few
/// fixed inputs x.
struct Probe {
  std::size_t slot = 0;  // the tensor's index in catalog order (= the module's slot index)
  std::string tensor;
  DType dtype{};
  std::size_t rows = 0, cols = 0;
  std::vector<std::vector<float>> inputs;
};

/// Picks the largest 2-D float tensor — or, in a checkpoint without one (a quantized GGUF
/// model), the largest 2-D quantized tensor — and as many of its rows as make about `work`
/// multiply-adds.
Probe make_probe(const io::Catalog& catalog, std::uint64_t work) {
  Probe p;
  std::uint64_t best = 0;
  bool best_float = false;
  for (std::size_t i = 0; i < catalog.size(); ++i) {
    const io::TensorInfo& t = catalog.tensors()[i];
    const bool float_type = t.dtype == DType::BF16 || t.dtype == DType::F16 || t.dtype == DType::F32;
    if (!float_type && !quant::has_dequantization(t.dtype)) continue;
    if (t.shape.size() != 2 || (best_float && !float_type)) continue;
    if (best_float == float_type && t.shape[0] * t.shape[1] <= best) continue;
    best = t.shape[0] * t.shape[1];
    best_float = float_type;
    p.slot = i;
    p.tensor = t.name;
    p.dtype = t.dtype;
    p.cols = t.shape[1];
    p.rows = std::clamp<std::uint64_t>(work / std::max<std::uint64_t>(1, t.shape[1]), 1, t.shape[0]);
  }
  if (best == 0) throw Error(errc::invalid_argument, {}, "no 2-D float or quantized tensor for the requests to read");
  for (std::size_t k = 0; k < 16; ++k) {
    std::vector<float> x(p.cols);
    for (std::size_t j = 0; j < x.size(); ++j)
      x[j] = std::sin(0.37f * static_cast<float>(j) + 0.71f * static_cast<float>(k));
    p.inputs.push_back(std::move(x));
  }
  return p;
}

/// y = W·x for `rows` rows of `Size`-byte elements that `load` widens to float.
template <std::size_t Size, class Load>
void matvec_as(const std::byte* w, std::size_t rows, std::size_t cols, const float* x, float* y, Load load) {
  for (std::size_t r = 0; r < rows; ++r) {
    const std::byte* row = w + r * cols * Size;
    float s = 0;
    for (std::size_t c = 0; c < cols; ++c) s += load(row + c * Size) * x[c];
    y[r] = s;
  }
}

/// The bytes of the probe's rows of W (whole rows: whole blocks, as the catalog checked).
std::size_t probe_bytes(const Probe& p) {
  return static_cast<std::size_t>(*checked_byte_size(p.rows * p.cols, p.dtype));
}

/// y = W·x for quantized rows, each dequantized by the core reference (ggml's bits) first.
void matvec_quantized(const Probe& p, const std::byte* w, const float* x, float* y) {
  const DTypeBlock block = dtype_block(p.dtype);
  const std::size_t blocks = p.cols / block.elements;
  const quant::QuantGrids grids = quant::host_quant_grids();
  std::vector<float> row(p.cols);
  for (std::size_t r = 0; r < p.rows; ++r) {
    const auto* in = reinterpret_cast<const std::uint8_t*>(w) + r * blocks * block.bytes;
    for (std::size_t b = 0; b < blocks; ++b)
      quant::dequantize_block(p.dtype, in + b * block.bytes, row.data() + b * block.elements, grids);
    float s = 0;
    for (std::size_t c = 0; c < p.cols; ++c) s += row[c] * x[c];
    y[r] = s;
  }
}

/// y = W·x over the first rows of `w`, the same arithmetic for the engine's tensor and the
/// reference's file bytes, so correct weights give bit-identical outputs.
std::uint64_t probe_output(const Probe& p, std::span<const std::byte> w, std::size_t input, std::vector<float>& y) {
  y.resize(p.rows);
  const float* x = p.inputs[input].data();
  if (dtype_is_quantized(p.dtype)) {
    matvec_quantized(p, w.data(), x, y.data());
    return XXH3_64bits(y.data(), y.size() * sizeof(float));
  }
  auto u16 = [](const std::byte* b) {
    std::uint16_t h;
    std::memcpy(&h, b, 2);
    return h;
  };
  switch (p.dtype) {
    case DType::BF16:
      matvec_as<2>(w.data(), p.rows, p.cols, x, y.data(), [&](const std::byte* b) { return cpu::bf16_to_f32(u16(b)); });
      break;
    case DType::F16:
      matvec_as<2>(w.data(), p.rows, p.cols, x, y.data(), [&](const std::byte* b) { return cpu::f16_to_f32(u16(b)); });
      break;
    default:
      matvec_as<4>(w.data(), p.rows, p.cols, x, y.data(), [](const std::byte* b) {
        float f;
        std::memcpy(&f, b, 4);
        return f;
      });
  }
  return XXH3_64bits(y.data(), y.size() * sizeof(float));
}

/// XXH3 of every tensor's bytes, in `order`'s catalog order, read from `catalog`'s files.
std::uint64_t file_tag(const io::Catalog& order, const io::Catalog& catalog) {
  XXH3_state_t* state = XXH3_createState();
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> guard(state, &XXH3_freeState);
  XXH3_64bits_reset(state);
  std::vector<std::byte> buffer(8 << 20);
  for (const io::TensorInfo& o : order.tensors()) {
    const io::TensorInfo& t = catalog.at(o.name);
    for (std::uint64_t done = 0; done < t.nbytes;) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), t.nbytes - done));
      pread_exact(catalog, t, done, std::span(buffer.data(), n));
      XXH3_64bits_update(state, buffer.data(), n);
      done += n;
    }
  }
  return XXH3_64bits_digest(state);
}

/// XXH3 of every slot's bytes in slot order: the tag of a loaded version.
std::uint64_t module_tag(const Module& m) {
  XXH3_state_t* state = XXH3_createState();
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> guard(state, &XXH3_freeState);
  XXH3_64bits_reset(state);
  for (std::size_t i = 0; i < m.size(); ++i) {
    const auto bytes = m.slot(i).value.bytes();
    XXH3_64bits_update(state, bytes.data(), bytes.size());
  }
  return XXH3_64bits_digest(state);
}

/// What the version of `catalog` must answer: its tag and each input's output hash.
VersionReference make_reference(const std::string& path, const io::Catalog& order, const io::Catalog& catalog,
                                const Probe& p) {
  VersionReference r{path, file_tag(order, catalog), {}};
  const io::TensorInfo& t = catalog.at(p.tensor);
  std::vector<std::byte> w(probe_bytes(p));
  pread_exact(catalog, t, 0, w);
  std::vector<float> y;
  for (std::size_t k = 0; k < p.inputs.size(); ++k) r.outputs.push_back(probe_output(p, w, k, y));
  return r;
}

/// Throws unless B has A's tensors with A's dtypes and shapes.
void check_compatible(const io::Catalog& a, const io::Catalog& b, const std::string& b_path) {
  if (a.size() != b.size())
    throw Error(errc::invalid_argument, {.file = b_path},
                fmt::format("has {} tensors, A has {}: a swap needs the same tensors", b.size(), a.size()));
  for (const io::TensorInfo& t : a.tensors()) {
    const io::TensorInfo* u = b.find(t.name);
    if (u == nullptr || u->dtype != t.dtype || u->shape != t.shape)
      throw Error(errc::invalid_argument, {.file = b_path, .tensor = t.name},
                  "is missing or has another dtype or shape than in A");
  }
}

/// Everything the request coroutines share; touched only on the event-loop thread.
struct Server {
  Slot* slot = nullptr;
  const Probe* probe = nullptr;
  cpu::Executor* compute = nullptr;                                  // null: compute inline on the loop
  std::unordered_map<const Module*, std::uint64_t>* tags = nullptr;  // filled by the canary
  std::vector<SwapResponse> responses;
  std::uint32_t epoch = 0;
  std::uint64_t served_in_epoch = 0;
  bool stop = false;
  int running = 0;
};

/// One closed-loop client: issue a request, wait for its answer, repeat until stopped. The
/// latency counts from the request's arrival on the loop to its answer, so it includes the
/// wait for the loop thread (and, with an arena, for a worker).
asio::awaitable<void> client(Server& s, std::uint32_t id) {
  auto executor = co_await asio::this_coro::executor;
  std::vector<float> y;
  std::uint32_t n = id;
  while (!s.stop) {
    SwapResponse r;
    r.input = n++ % static_cast<std::uint32_t>(s.probe->inputs.size());
    r.epoch_start = s.epoch;
    const Clock::time_point arrival = Clock::now();
    co_await asio::post(executor, asio::use_awaitable);    // queue behind whatever the loop runs
    std::shared_ptr<const Version> v = s.slot->current();  // one version for the whole request
    r.generation = v->generation;
    r.tag = s.tags->at(&v->model);
    const std::span<const std::byte> w = v->model.slot(s.probe->slot).value.bytes();
    if (s.compute) {
      Completion done = s.compute->submit([&] { r.output = probe_output(*s.probe, w, r.input, y); });
      co_await done.async_wait(asio::use_awaitable);
    } else {
      r.output = probe_output(*s.probe, w, r.input, y);
    }
    v.reset();  // the request is answered: its version may retire
    r.latency_seconds = std::chrono::duration<double>(Clock::now() - arrival).count();
    r.epoch_end = s.epoch;
    s.responses.push_back(r);
    ++s.served_in_epoch;
  }
  --s.running;
}

/// `hooks` with a no-op wherever the caller gave none (stop_requested excepted: without it,
/// nothing polls).
SwapScenarioHooks completed(SwapScenarioHooks hooks) {
  if (!hooks.phase) hooks.phase = [](std::string_view, std::uint64_t, std::string_view) {};
  if (!hooks.update) hooks.update = [](std::uint64_t) {};
  if (!hooks.tick) hooks.tick = [] {};
  if (!hooks.finish) hooks.finish = [] {};
  if (!hooks.check) hooks.check = [](const std::string&) {};
  return hooks;
}

/// Seconds on the monotonic clock.
double now_seconds() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

/// The phases of one swap as the caller is shown them. The engine counts the load's bytes;
/// the verification that follows has no counter, so the phase switches to it (with its
/// elapsed time) once every byte is loaded; the canary is this scenario's own step, and the
/// publication follows it at once.
///
/// Shared between the swap and its redraw timer: a timer handler already queued when the
/// swap ends still runs after the swap's coroutine frame is gone, so it holds this state
/// (timer and counters included) rather than pointing into the frame.
struct SwapProgress {
  SwapProgress(const SwapScenarioHooks& h, std::string c, std::uint64_t t, bool v,
               const asio::any_io_executor& executor)
      : hooks(h), context(std::move(c)), total(t), verifies(v), timer(executor) {}

  const SwapScenarioHooks& hooks;        // completed(); outlives the scenario
  engine::MaterializeProgress counters;  // the engine's load counters
  std::string context;                   // "load A", "swap 1/2", "corrupt swap"
  std::uint64_t total = 0;
  bool verifies = false;  // checksums will be verified after the load
  enum class Stage { read, verify, canary } stage = Stage::read;
  bool done = false;
  asio::steady_timer timer;  // redraws every 100 ms

  /// Called every 100 ms while the swap runs.
  void poll() {
    if (stage == Stage::read && verifies && counters.bytes_done.load(std::memory_order_relaxed) >= total) {
      stage = Stage::verify;
      hooks.phase("verify", 0, context);
    }
    if (stage == Stage::read)
      hooks.update(counters.bytes_done.load(std::memory_order_relaxed));
    else
      hooks.tick();
  }
};

/// The canary: tags the new version by hashing its weights on the background arena (so the
/// loop keeps serving), and rejects it if the probe output is not finite.
asio::awaitable<void> tag_canary(const Module& m, cpu::Executor& background, const Probe& probe,
                                 std::unordered_map<const Module*, std::uint64_t>& tags, SwapProgress& progress) {
  progress.stage = SwapProgress::Stage::canary;
  progress.hooks.phase("canary", 0, progress.context);
  std::uint64_t tag = 0;
  bool finite = true;
  Completion done = background.submit([&] {
    tag = module_tag(m);
    std::vector<float> y;
    probe_output(probe, m.slot(probe.slot).value.bytes(), 0, y);
    finite = std::all_of(y.begin(), y.end(), [](float f) { return std::isfinite(f); });
  });
  co_await done.async_wait(asio::use_awaitable);
  if (!finite) throw std::runtime_error(fmt::format("the probe output of '{}' is not finite", probe.tensor));
  tags[&m] = tag;
  progress.hooks.phase("publish", 0, progress.context);  // what the slot does next
}

/// Redraws the display of `progress` every 100 ms until the swap is done.
void watch_progress(std::shared_ptr<SwapProgress> progress) {
  SwapProgress& p = *progress;
  p.timer.expires_after(std::chrono::milliseconds(100));
  p.timer.async_wait([progress = std::move(progress)](std::error_code ec) mutable {
    if (ec || progress->done) return;
    progress->poll();
    watch_progress(std::move(progress));
  });
}

/// Inputs of the driver coroutine.
struct Plan {
  std::vector<io::CheckpointSource*> sources;  // A, B, and the corrupt copy if any
  std::vector<std::string> paths;
  std::vector<io::Checksums> checksums;
  const engine::WeightBindingPlan* plan = nullptr;
  cpu::MaterializationContext* context = nullptr;
  cpu::Executor* background = nullptr;
  const SwapScenarioHooks* hooks = nullptr;  // completed()
  unsigned swaps = 0;
  std::uint64_t requests = 0;
  unsigned concurrency = 0;
  std::uint64_t total_bytes = 0;
};

/// Swaps the slot to source `index`; records the report or the typed error. The one
/// asynchronous engine call of this command.
asio::awaitable<SwapAttempt> swap_to(Server& s, const Plan& plan, std::size_t index, std::string label) {
  SwapAttempt record{plan.paths[index]};
  record.checksum_count = plan.checksums[index].size();
  auto executor = co_await asio::this_coro::executor;
  auto progress = std::make_shared<SwapProgress>(*plan.hooks, std::move(label), plan.total_bytes,
                                                 !plan.checksums[index].empty(), executor);
  progress->hooks.phase("read", plan.total_bytes, progress->context);
  watch_progress(progress);
  const Probe& probe = *s.probe;
  auto* tags = s.tags;
  cpu::Executor& background = *plan.background;
  SwapProgress* shown = progress.get();  // alive for the whole swap, which holds `progress`
  engine::SwapOptions<Module> options{
      .origin = plan.paths[index],
      .checksums = plan.checksums[index],
      .canary = [&background, &probe, tags,
                 shown](const Module& m) { return tag_canary(m, background, probe, *tags, *shown); },
      .progress = &progress->counters};
  const Clock::time_point start = Clock::now();
  try {
    record.report = co_await s.slot->async_swap(*plan.sources[index], *plan.plan, *plan.context, std::move(options),
                                                asio::use_awaitable);
    record.ok = true;
  } catch (const Error& e) {
    record.error_kind = errc_name(e.kind());
    record.error = e.what();
    record.failure = std::current_exception();
  }
  record.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  progress->done = true;
  progress->timer.cancel();
  progress->hooks.finish();
  co_return record;
}

/// Waits until `n` requests have been answered since the current epoch began.
asio::awaitable<void> serve(Server& s, std::uint64_t n) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  while (s.served_in_epoch < n) {
    timer.expires_after(std::chrono::milliseconds(1));
    co_await timer.async_wait(asio::use_awaitable);
  }
}

void next_epoch(Server& s) {
  ++s.epoch;
  s.served_in_epoch = 0;
}

/// The run: publish A, start the clients, alternate swaps with steady phases, then the
/// corrupt swap if asked, and stop the clients.
asio::awaitable<std::vector<SwapAttempt>> drive(Server& s, const Plan& plan) {
  std::vector<SwapAttempt> records;
  SwapAttempt first = co_await swap_to(s, plan, 0, "load A");
  if (!first.ok) std::rethrow_exception(first.failure);  // nothing was served: the run cannot go on
  auto executor = co_await asio::this_coro::executor;
  for (unsigned c = 0; c < plan.concurrency; ++c) {
    ++s.running;
    asio::co_spawn(executor, client(s, c), [](std::exception_ptr e) {
      if (e) std::rethrow_exception(e);  // a failed request is a bug: stop the run loudly
    });
  }
  co_await serve(s, plan.requests);
  for (unsigned k = 1; k <= plan.swaps; ++k) {
    next_epoch(s);
    records.push_back(co_await swap_to(s, plan, k % 2 == 1 ? 1 : 0, fmt::format("swap {}/{}", k, plan.swaps)));
    next_epoch(s);
    co_await serve(s, plan.requests);
  }
  if (plan.sources.size() > 2) {
    next_epoch(s);
    records.push_back(co_await swap_to(s, plan, 2, "corrupt swap"));
    next_epoch(s);
    co_await serve(s, plan.requests);
  }
  s.stop = true;
  asio::steady_timer timer(executor);
  while (s.running > 0) {
    timer.expires_after(std::chrono::milliseconds(1));
    co_await timer.async_wait(asio::use_awaitable);
  }
  co_return records;
}

/// Ends the run when the caller asks (SwapScenarioHooks::stop_requested, polled on the loop):
/// the driver's cancellation (terminal), then `on_stop`, once. Without `requested`, nothing
/// polls and nothing stops.
class StopWatch {
 public:
  StopWatch(asio::io_context& ctx, std::function<bool()> requested, std::function<void()> on_stop)
      : timer_(ctx), requested_(std::move(requested)), on_stop_(std::move(on_stop)) {}

  /// The slot the driver is bound to.
  asio::cancellation_slot slot() { return cancel_.slot(); }
  /// Polls now, then every 10 ms until stopped or disarmed; call once the driver runs.
  void poll() {
    if (done_ || !requested_) return;
    if (requested_()) {
      done_ = true;
      cancel_.emit(asio::cancellation_type::terminal);
      on_stop_();
      return;
    }
    timer_.expires_after(std::chrono::milliseconds(10));
    timer_.async_wait([this](std::error_code ec) {
      if (!ec) poll();
    });
  }
  /// Stops polling, so that the loop can return; call from the driver's completion.
  void disarm() {
    done_ = true;
    timer_.cancel();
  }

 private:
  asio::steady_timer timer_;
  asio::cancellation_signal cancel_;
  std::function<bool()> requested_;
  std::function<void()> on_stop_;
  bool done_ = false;
};

}  // namespace

SwapScenarioResult run_swap_scenario(const SwapScenarioOptions& o, const SwapScenarioHooks& caller_hooks) {
  const SwapScenarioHooks hooks = completed(caller_hooks);
  const std::string opening = "opening the checkpoints";
  io::SourceOptions source_options;
  // Small staging: the swap's reads must not take the memory (or the cache) serving needs.
  source_options.pool.budget = o.budget;
  // Kept until the run ends: no idle-release timer holding the loop.
  source_options.pool.release_after = std::chrono::milliseconds(0);

  // TBB workers for both arenas beside the event-loop thread, which never joins them.
  tbb::global_control workers(tbb::global_control::max_allowed_parallelism,
                              std::size_t{o.serve_threads} + o.swap_threads + 1);
  std::optional<cpu::Executor> serving;
  if (o.serve_threads > 0) serving.emplace(static_cast<int>(o.serve_threads));
  cpu::Executor background(static_cast<int>(o.swap_threads));  // the swap's own, small arena
  cpu::StoragePool storage;
  cpu::MaterializationContext context{background, storage, false, o.weights};

  asio::io_context ctx(1);
  SwapScenarioResult result;
  result.paths = {o.a, o.b};
  std::vector<std::string>& paths = result.paths;
  std::vector<std::unique_ptr<io::CheckpointSource>> sources;
  hooks.phase("open", 0, {});
  for (const std::string& p : paths)
    sources.push_back(io::CheckpointSource::open(ctx.get_executor(), p, source_options));
  const io::Catalog& a = sources[0]->catalog();
  check_compatible(a, sources[1]->catalog(), paths[1]);
  const Module blueprint = Module::mirror(a);
  const Probe probe = make_probe(a, o.work);
  std::vector<io::Checksums> checksums;
  for (std::size_t i = 0; i < 2; ++i) {
    const io::Catalog& catalog = sources[i]->catalog();
    checksums.push_back(!o.verify     ? io::Checksums{}
                        : o.checksums ? o.checksums(paths[i], catalog)
                                      : io::Checksums::discover(paths[i], catalog));
  }

  // --corrupt: a copy of B with bytes flipped in the middle of the probe tensor. Unless
  // verification is off, the copy carries the digest of B's true bytes of that tensor, so
  // only verification can tell (and does, even when B itself has no checksums).
  std::filesystem::path corrupt_dir;
  struct RemoveDir {
    std::filesystem::path* dir;
    ~RemoveDir() {  // best effort: a leftover temporary copy is not an error
      std::error_code ignored;
      if (!dir->empty()) std::filesystem::remove_all(*dir, ignored);
    }
  } remove_corrupt{&corrupt_dir};
  if (o.corrupt) {
    corrupt_dir = std::filesystem::temp_directory_path() / fmt::format("eredu-swap-corrupt-{}", ::getpid());
    std::filesystem::create_directories(corrupt_dir);
    const std::filesystem::path b(paths[1]);
    const std::filesystem::path copy = corrupt_dir / b.filename();
    const io::TensorInfo& t = sources[1]->catalog().at(probe.tensor);
    std::vector<std::byte> original(t.nbytes);
    try {
      std::filesystem::copy(
          b, copy, std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing);
      pread_exact(sources[1]->catalog(), t, 0, original);
    } catch (...) {
      // A signal during the copy interrupts its system calls (EINTR on FUSE): the check
      // reports the interruption, not the copy's failure it caused.
      hooks.check(opening);
      throw;
    }
    std::filesystem::path file = copy;
    if (std::filesystem::is_directory(copy))
      file = copy / std::filesystem::path(sources[1]->catalog().file_of(t).path).filename();
    {
      std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(static_cast<std::streamoff>(t.offset + t.nbytes / 2));
      const char flipped[4] = {'\x5a', '\x5a', '\x5a', '\x5a'};
      f.write(flipped, sizeof flipped);
      if (!f) throw Error(errc::io_error, {.file = file.string()}, "cannot corrupt the temporary copy");
    }
    sources.push_back(io::CheckpointSource::open(ctx.get_executor(), copy, source_options));
    paths.push_back(copy.string());
    io::Checksums sums = checksums[1];
    if (o.verify) sums.add(probe.tensor, io::sha256_hex(original));
    checksums.push_back(std::move(sums));
    hooks.check(opening);  // the copy took a while: a stop during it ends the run here
  }
  for (const io::Checksums& c : checksums) result.checksum_counts.push_back(c.size());

  // What each checkpoint's version must answer, from the files, before anything is served.
  const double t_ref = now_seconds();
  for (std::size_t i = 0; i < 2; ++i)
    result.references.push_back(make_reference(paths[i], a, sources[i]->catalog(), probe));
  result.reference_seconds = now_seconds() - t_ref;
  if (result.references[0].tag == result.references[1].tag)
    log::warn("A and B have the same bytes: responses cannot tell the versions apart");

  std::unordered_map<const Module*, std::uint64_t> tags;
  Slot slot([&blueprint] { return blueprint.unbound(); });
  Server server;
  server.slot = &slot;
  server.probe = &probe;
  server.compute = serving ? &*serving : nullptr;
  server.tags = &tags;
  Plan plan;
  for (auto& src : sources) plan.sources.push_back(src.get());
  plan.paths = paths;
  plan.checksums = checksums;
  plan.plan = &blueprint.plan();
  plan.context = &context;
  plan.background = &background;
  plan.hooks = &hooks;
  plan.swaps = o.swaps;
  plan.requests = o.requests;
  plan.concurrency = o.concurrency;
  plan.total_bytes = blueprint.bytes();

  std::exception_ptr failure;
  hooks.check(opening);
  StopWatch stop(ctx, hooks.stop_requested, [&server] { server.stop = true; });  // the clients stop too
  asio::co_spawn(ctx, drive(server, plan),
                 asio::bind_cancellation_slot(stop.slot(), [&](std::exception_ptr e, std::vector<SwapAttempt> r) {
                   failure = e;
                   result.attempts = std::move(r);
                   stop.disarm();
                 }));
  // After the driver's start: a stop asked for before the loop ran is acted on once the
  // driver listens on its slot.
  asio::post(ctx, [&stop] { stop.poll(); });
  const double t_run = now_seconds();
  ctx.run();
  result.run_seconds = now_seconds() - t_run;
  hooks.finish();
  hooks.check("serving while swapping; the serving version was left as it was");
  if (failure) std::rethrow_exception(failure);

  result.tensor_count = a.size();
  result.bytes = blueprint.bytes();
  result.probe_tensor = probe.tensor;
  result.probe_rows = probe.rows;
  result.probe_cols = probe.cols;
  result.probe_dtype = probe.dtype;
  result.responses = std::move(server.responses);
  result.final_generation = slot.generation();
  for (auto& src : sources)
    result.staging_high_water = std::max<std::uint64_t>(result.staging_high_water, src->pool().high_water());
  result.storage = storage.stats();
  return result;
}

}  // namespace eredu::bench
