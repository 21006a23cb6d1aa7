// `eredu swap A B`: serves synthetic requests from checkpoint A while hot-swapping to B and
// back through engine::ModelSlot, optionally attempts a swap to a corrupt copy of B, and
// reports request latency per phase, every publish pause, and whether each response came
// from exactly one version.
#include <fcntl.h>
#include <unistd.h>

#include <tbb/global_control.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "cli.hpp"
#include "commands.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/log.hpp"
#include "eredu/cpu/backend.hpp"
#include "eredu/cpu/catalog_module.hpp"
#include "eredu/cpu/float_formats.hpp"
#include "eredu/engine/model_slot.hpp"
#include "eredu/io/checksums.hpp"
#include "eredu/io/json_text.hpp"
#include "eredu/io/sha256.hpp"

namespace eredu::cli {
namespace {

constexpr const char* swap_usage =
    "usage: eredu swap A B [--swaps 2] [--requests 2000] [--concurrency 8] [--serve-threads 0] "
    "[--swap-threads 1] [--budget 32M] [--work 256K] [--verify on|off] [--corrupt] [--json]";

constexpr const char* swap_help = R"(
  Serves synthetic requests from checkpoint A on one event loop while engine::ModelSlot
  hot-swaps to B, back to A, ... (--swaps N), then, with --corrupt, attempts a swap to a
  temporary copy of B with bytes flipped in one tensor (rejected by its checksum). A and B
  must have the same tensors, dtypes and shapes (e.g. `eredu gen` with two seeds).
  Each request computes y = W[0:rows, :] · x over the largest 2-D tensor (--work
  multiply-adds) and is checked against values computed from the files before serving.
    --requests N       requests answered in each phase between swaps (default 2000)
    --concurrency N    concurrent clients on the loop (default 8)
    --serve-threads N  0: compute on the loop thread (default); N: on an N-thread arena
    --swap-threads N   the swap's own arena (default 1)
    --budget SIZE      staging budget of each source (default 32M)
    --verify on|off    checksums from metadata or "<file>.sha256.json" (default on)
    --json             one JSON object instead of the table
  Exit status 1 if a response did not match its version or the corrupt swap changed one.
)";

using Module = cpu::CatalogModule;
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

/// Reads `out.size()` bytes at `offset` of `path` with plain pread: a path to the bytes that
/// shares nothing with the engine's reader, for the reference outputs and tags.
void pread_exact(const std::string& path, std::uint64_t offset, std::span<std::byte> out) {
  Fd file(path);
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(file.fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n <= 0)
      throw Error(errc::io_error,
                  {.file = path, .offset = offset + done, .os_error = {n < 0 ? errno : 0, std::generic_category()}},
                  "short read while computing the reference");
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

/// Picks the largest 2-D float tensor and as many of its rows as make about `work`
/// multiply-adds.
Probe make_probe(const io::Catalog& catalog, std::uint64_t work) {
  Probe p;
  std::uint64_t best = 0;
  for (std::size_t i = 0; i < catalog.size(); ++i) {
    const io::TensorInfo& t = catalog.tensors()[i];
    const bool float_type = t.dtype == DType::BF16 || t.dtype == DType::F16 || t.dtype == DType::F32;
    if (!float_type || t.shape.size() != 2 || t.shape[0] * t.shape[1] <= best) continue;
    best = t.shape[0] * t.shape[1];
    p.slot = i;
    p.tensor = t.name;
    p.dtype = t.dtype;
    p.cols = t.shape[1];
    p.rows = std::clamp<std::uint64_t>(work / std::max<std::uint64_t>(1, t.shape[1]), 1, t.shape[0]);
  }
  if (best == 0) throw Error(errc::invalid_argument, {}, "no 2-D BF16/F16/F32 tensor for the requests to read");
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

/// y = W·x over the first rows of `w`, the same arithmetic for the engine's tensor and the
/// reference's file bytes, so correct weights give bit-identical outputs.
std::uint64_t probe_output(const Probe& p, std::span<const std::byte> w, std::size_t input, std::vector<float>& y) {
  y.resize(p.rows);
  const float* x = p.inputs[input].data();
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

/// What a checkpoint's version must answer: its weight tag and each input's output hash,
/// computed from the files with pread before serving starts.
struct Reference {
  std::string path;
  std::uint64_t tag = 0;
  std::vector<std::uint64_t> outputs;
};

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
      pread_exact(catalog.file_of(t).path, t.offset + done, std::span(buffer.data(), n));
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

Reference make_reference(const std::string& path, const io::Catalog& order, const io::Catalog& catalog,
                         const Probe& p) {
  Reference r{path, file_tag(order, catalog), {}};
  const io::TensorInfo& t = catalog.at(p.tensor);
  std::vector<std::byte> w(p.rows * p.cols * dtype_bits(p.dtype) / 8);
  pread_exact(catalog.file_of(t).path, t.offset, w);
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

/// One response, as the client recorded it.
struct Response {
  std::uint32_t epoch_start = 0;  // even: between swaps; odd: while swap (epoch+1)/2 ran
  std::uint32_t epoch_end = 0;
  std::uint32_t input = 0;
  std::uint64_t generation = 0;
  std::uint64_t tag = 0;     // the version's weight tag, computed by the canary
  std::uint64_t output = 0;  // XXH3 of the output vector
  double latency_us = 0;
};

/// Everything the request coroutines share; touched only on the event-loop thread.
struct Server {
  Slot* slot = nullptr;
  const Probe* probe = nullptr;
  cpu::Executor* compute = nullptr;                                  // null: compute inline on the loop
  std::unordered_map<const Module*, std::uint64_t>* tags = nullptr;  // filled by the canary
  std::vector<Response> responses;
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
    Response r;
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
    r.latency_us = std::chrono::duration<double, std::micro>(Clock::now() - arrival).count();
    r.epoch_end = s.epoch;
    s.responses.push_back(r);
    ++s.served_in_epoch;
  }
  --s.running;
}

/// The canary: tags the new version by hashing its weights on the background arena (so the
/// loop keeps serving), and rejects it if the probe output is not finite.
asio::awaitable<void> tag_canary(const Module& m, cpu::Executor& background, const Probe& probe,
                                 std::unordered_map<const Module*, std::uint64_t>& tags) {
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
}

/// One attempted swap, as reported.
struct SwapRecord {
  std::string target;
  bool ok = false;
  engine::SwapReport report;
  std::string error_kind, error;
  double seconds = 0;
};

/// Redraws `bar` from the load counters every 100 ms until `done`.
void watch_progress(asio::steady_timer& timer, const engine::MaterializeProgress& counters, Progress& bar,
                    const bool& done) {
  timer.expires_after(std::chrono::milliseconds(100));
  timer.async_wait([&timer, &counters, &bar, &done](std::error_code ec) {
    if (ec || done) return;
    bar.update(counters.bytes_done.load(std::memory_order_relaxed));
    watch_progress(timer, counters, bar, done);
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
  int swaps = 0;
  std::uint64_t requests = 0;
  int concurrency = 0;
  std::uint64_t total_bytes = 0;
  bool show_progress = false;
};

/// Swaps the slot to source `index`; records the report or the typed error.
asio::awaitable<SwapRecord> swap_to(Server& s, const Plan& plan, std::size_t index, std::string label) {
  SwapRecord record{plan.paths[index]};
  engine::MaterializeProgress counters;
  Progress bar(std::move(label), plan.total_bytes);
  bool done = false;
  auto executor = co_await asio::this_coro::executor;
  asio::steady_timer timer(executor);
  if (plan.show_progress) watch_progress(timer, counters, bar, done);
  const Probe& probe = *s.probe;
  auto* tags = s.tags;
  cpu::Executor& background = *plan.background;
  engine::SwapOptions<Module> options{
      .origin = plan.paths[index],
      .checksums = plan.checksums[index],
      .canary = [&background, &probe, tags](const Module& m) { return tag_canary(m, background, probe, *tags); },
      .progress = &counters};
  const Clock::time_point start = Clock::now();
  try {
    record.report = co_await s.slot->async_swap(*plan.sources[index], *plan.plan, *plan.context, std::move(options),
                                                asio::use_awaitable);
    record.ok = true;
  } catch (const Error& e) {
    record.error_kind = errc_name(e.kind());
    record.error = e.what();
  }
  record.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  done = true;
  timer.cancel();
  bar.finish();
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
asio::awaitable<std::vector<SwapRecord>> drive(Server& s, const Plan& plan) {
  std::vector<SwapRecord> records;
  SwapRecord first = co_await swap_to(s, plan, 0, "load A");
  if (!first.ok) throw std::runtime_error(fmt::format("the first version did not load: {}", first.error));
  auto executor = co_await asio::this_coro::executor;
  for (int c = 0; c < plan.concurrency; ++c) {
    ++s.running;
    asio::co_spawn(executor, client(s, static_cast<std::uint32_t>(c)), [](std::exception_ptr e) {
      if (e) std::rethrow_exception(e);  // a failed request is a bug: stop the run loudly
    });
  }
  co_await serve(s, plan.requests);
  for (int k = 1; k <= plan.swaps; ++k) {
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

/// Latency figures of a set of responses.
struct Stats {
  std::size_t count = 0;
  double p50 = 0, p99 = 0, max = 0;
};

double percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const std::size_t i = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size()))) - 1;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(std::min(i, v.size() - 1)), v.end());
  return v[std::min(i, v.size() - 1)];
}

Stats stats_of(std::vector<double> v) {
  Stats s;
  s.count = v.size();
  if (v.empty()) return s;
  s.max = *std::max_element(v.begin(), v.end());
  s.p99 = percentile(v, 0.99);
  s.p50 = percentile(v, 0.50);
  return s;
}

std::string stats_json(const Stats& s) {
  return fmt::format("{{\"count\":{},\"p50_us\":{:.2f},\"p99_us\":{:.2f},\"max_us\":{:.2f}}}", s.count, s.p50, s.p99,
                     s.max);
}

/// One reporting phase: steady (between swaps) or during a swap.
struct Phase {
  std::string name;
  std::vector<double> latencies;
  std::set<std::uint64_t> generations;
  std::uint64_t mismatches = 0;
};

}  // namespace

int run_swap(int argc, char** argv) {
  for (int i = 2; i < argc; ++i)
    if (std::string_view(argv[i]) == "--help") {
      fmt::print("{}\n{}", swap_usage, swap_help);
      return 0;
    }
  Args args = parse_args(
      argc, argv, 2, {"swaps", "requests", "concurrency", "serve-threads", "swap-threads", "budget", "work", "verify"},
      {"corrupt", "json"});
  if (args.positional.size() != 2) throw std::invalid_argument(swap_usage);
  const int swaps = std::stoi(args.get("swaps", "2"));
  const std::uint64_t requests = std::stoull(args.get("requests", "2000"));
  const int concurrency = std::stoi(args.get("concurrency", "8"));
  const int serve_threads = std::stoi(args.get("serve-threads", "0"));
  const int swap_threads = std::stoi(args.get("swap-threads", "1"));
  const std::uint64_t work = parse_bytes(args.get("work", "256K"));
  const std::string verify = args.get("verify", "on");
  if (swaps < 0 || concurrency < 1 || serve_threads < 0 || swap_threads < 1 || requests < 1 || work < 1)
    throw std::invalid_argument(
        "--swaps ≥ 0, --requests ≥ 1, --concurrency ≥ 1, --serve-threads ≥ 0, --swap-threads ≥ 1");
  if (verify != "on" && verify != "off") throw std::invalid_argument("--verify must be on or off");
  const bool json = args.has("json");
  const bool corrupt = args.has("corrupt");
  io::SourceOptions source_options;
  // Small staging: the swap's reads must not take the memory (or the cache) serving needs.
  source_options.pool.budget = parse_bytes(args.get("budget", "32M"));

  // TBB workers for both arenas beside the event-loop thread, which never joins them.
  tbb::global_control workers(tbb::global_control::max_allowed_parallelism,
                              static_cast<std::size_t>(serve_threads + swap_threads) + 1);
  std::optional<cpu::Executor> serving;
  if (serve_threads > 0) serving.emplace(serve_threads);
  cpu::Executor background(swap_threads);  // the swap's own, small arena
  cpu::StoragePool storage;
  cpu::MaterializationContext context{background, storage};

  asio::io_context ctx(1);
  std::vector<std::string> paths = {args.positional[0], args.positional[1]};
  std::vector<std::unique_ptr<io::CheckpointSource>> sources;
  for (const std::string& p : paths)
    sources.push_back(io::CheckpointSource::open(ctx.get_executor(), p, source_options));
  const io::Catalog& a = sources[0]->catalog();
  check_compatible(a, sources[1]->catalog(), paths[1]);
  const Module blueprint = Module::mirror(a);
  const Probe probe = make_probe(a, work);
  std::vector<io::Checksums> checksums(2);
  if (verify == "on")
    for (std::size_t i = 0; i < 2; ++i) checksums[i] = io::Checksums::discover(paths[i], sources[i]->catalog());

  // --corrupt: a copy of B with bytes flipped in the middle of the probe tensor, checked
  // against the digest of B's true bytes, so only verification can tell.
  std::filesystem::path corrupt_dir;
  struct RemoveDir {
    std::filesystem::path* dir;
    ~RemoveDir() {  // best effort: a leftover temporary copy is not an error
      std::error_code ignored;
      if (!dir->empty()) std::filesystem::remove_all(*dir, ignored);
    }
  } remove_corrupt{&corrupt_dir};
  if (corrupt) {
    corrupt_dir = std::filesystem::temp_directory_path() / fmt::format("eredu-swap-corrupt-{}", ::getpid());
    std::filesystem::create_directories(corrupt_dir);
    const std::filesystem::path b(paths[1]);
    const std::filesystem::path copy = corrupt_dir / b.filename();
    std::filesystem::copy(b, copy,
                          std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing);
    const io::TensorInfo& t = sources[1]->catalog().at(probe.tensor);
    std::vector<std::byte> original(t.nbytes);
    pread_exact(sources[1]->catalog().file_of(t).path, t.offset, original);
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
    sums.add(probe.tensor, io::sha256_hex(original));
    checksums.push_back(std::move(sums));
  }

  // What each checkpoint's version must answer, from the files, before anything is served.
  const double t_ref = now_seconds();
  std::vector<Reference> refs;
  for (std::size_t i = 0; i < 2; ++i) refs.push_back(make_reference(paths[i], a, sources[i]->catalog(), probe));
  const double reference_s = now_seconds() - t_ref;
  if (refs[0].tag == refs[1].tag) log::warn("A and B have the same bytes: responses cannot tell the versions apart");

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
  plan.swaps = swaps;
  plan.requests = requests;
  plan.concurrency = concurrency;
  plan.total_bytes = blueprint.bytes();
  plan.show_progress = !json;

  std::vector<SwapRecord> records;
  std::exception_ptr failure;
  asio::co_spawn(ctx, drive(server, plan), [&](std::exception_ptr e, std::vector<SwapRecord> r) {
    failure = e;
    records = std::move(r);
  });
  const double t_run = now_seconds();
  ctx.run();
  const double run_s = now_seconds() - t_run;
  if (failure) std::rethrow_exception(failure);

  // Sort the responses into phases and check each against its version's reference.
  const std::size_t successful = static_cast<std::size_t>(swaps);
  std::vector<Phase> phases(2 * (successful + (corrupt ? 1 : 0)) + 1);
  for (std::size_t i = 0; i < phases.size(); ++i) {
    const std::size_t k = (i + 1) / 2;
    if (i == 0)
      phases[i].name = "before";
    else if (i % 2 == 1)
      phases[i].name = k <= successful ? fmt::format("swap {}", k) : "failed swap";
    else
      phases[i].name = k <= successful ? fmt::format("after {}", k) : "after failed";
  }
  std::vector<double> steady, during, failed_window;
  std::uint64_t mismatches = 0, changed = 0, failed_window_count = 0;
  const std::uint64_t final_generation = 1 + successful;
  const std::uint32_t failed_epoch = static_cast<std::uint32_t>(2 * successful + 1);
  for (const Response& r : server.responses) {
    // A version's generation says which checkpoint it must be: odd A, even B.
    const Reference& want = refs[(r.generation % 2 == 1) ? 0 : 1];
    const bool ok = r.tag == want.tag && r.output == want.outputs[r.input];
    // A request that overlapped a swap belongs to that swap's phase.
    std::size_t index = r.epoch_start;
    if (r.epoch_end != r.epoch_start && index % 2 == 0) ++index;
    Phase& ph = phases[std::min(index, phases.size() - 1)];
    ph.latencies.push_back(r.latency_us);
    ph.generations.insert(r.generation);
    if (!ok) {
      ++ph.mismatches;
      ++mismatches;
    }
    if (corrupt && r.epoch_end >= failed_epoch) {  // answered during or after the failed swap
      ++failed_window_count;
      if (!ok || r.generation != final_generation) ++changed;
    }
    if (index % 2 == 0)
      steady.push_back(r.latency_us);
    else if (corrupt && index == failed_epoch)
      failed_window.push_back(r.latency_us);
    else
      during.push_back(r.latency_us);
  }
  const Stats steady_stats = stats_of(steady), during_stats = stats_of(during), failed_stats = stats_of(failed_window);
  std::vector<double> pauses;
  for (std::size_t i = 0; i < successful && i < records.size(); ++i)
    if (records[i].ok) pauses.push_back(static_cast<double>(records[i].report.publish_pause.count()));
  const Stats pause_stats = stats_of(pauses);
  bool swaps_ok = true;
  for (std::size_t i = 0; i < successful && i < records.size(); ++i) swaps_ok &= records[i].ok;
  const SwapRecord* failed = corrupt && records.size() > successful ? &records[successful] : nullptr;
  const bool failed_ok = !failed || (!failed->ok && changed == 0 && slot.generation() == final_generation);
  const double ratio = steady_stats.p99 > 0 ? during_stats.p99 / steady_stats.p99 : 0;
  const cpu::StoragePoolStats pool = storage.stats();
  std::uint64_t staging = 0;
  for (auto& src : sources) staging = std::max<std::uint64_t>(staging, src->pool().high_water());
  const bool ok = mismatches == 0 && swaps_ok && failed_ok;

  if (json) {
    std::string swaps_json, phases_json;
    for (const SwapRecord& r : records)
      swaps_json += fmt::format(
          "{}{{\"target\":{},\"ok\":{},\"generation\":{},\"seconds\":{:.6f},\"load_s\":{:.6f},\"verify_s\":{:.6f},"
          "\"canary_s\":{:.6f},\"verified_bytes\":{},\"publish_pause_ns\":{},\"error_kind\":{},\"error\":{}}}",
          swaps_json.empty() ? "" : ",", io::json::quoted(r.target), r.ok ? "true" : "false", r.report.generation,
          r.seconds, r.report.load_s, r.report.verify_s, r.report.canary_s, r.report.verified_bytes,
          r.report.publish_pause.count(), io::json::quoted(r.error_kind), io::json::quoted(r.error));
    for (const Phase& ph : phases) {
      std::string gens;
      for (std::uint64_t g : ph.generations) gens += fmt::format("{}{}", gens.empty() ? "" : ",", g);
      phases_json += fmt::format("{}{{\"name\":{},\"latency\":{},\"generations\":[{}],\"mismatches\":{}}}",
                                 phases_json.empty() ? "" : ",", io::json::quoted(ph.name),
                                 stats_json(stats_of(ph.latencies)), gens, ph.mismatches);
    }
    fmt::print(
        "{{\"a\":{},\"b\":{},\"tensors\":{},\"bytes\":{},\"probe\":{{\"tensor\":{},\"rows\":{},\"cols\":{}}},"
        "\"serve_threads\":{},\"swap_threads\":{},\"concurrency\":{},\"requests_per_phase\":{},\"budget\":{},"
        "\"seconds\":{:.3f},\"reference_s\":{:.3f},\"responses\":{},\"mismatches\":{},\"swaps\":[{}],"
        "\"publish_pause_ns\":{{\"count\":{},\"p50\":{:.0f},\"p99\":{:.0f},\"max\":{:.0f}}},"
        "\"steady\":{},\"during_swap\":{},\"p99_ratio\":{:.4f},"
        "\"failed_swap\":{{\"attempted\":{},\"rejected\":{},\"error_kind\":{},\"responses\":{},\"changed\":{},"
        "\"latency\":{}}},\"phases\":[{}],\"staging_high_water\":{},\"storage\":{{\"live_bytes\":{},"
        "\"retained_bytes\":{},\"fresh_allocations\":{},\"recycled_allocations\":{}}},\"peak_rss_bytes\":{},\"ok\":{}}}"
        "\n",
        io::json::quoted(paths[0]), io::json::quoted(paths[1]), a.size(), blueprint.bytes(),
        io::json::quoted(probe.tensor), probe.rows, probe.cols, serve_threads, swap_threads, concurrency, requests,
        source_options.pool.budget, run_s, reference_s, server.responses.size(), mismatches, swaps_json,
        pause_stats.count, pause_stats.p50, pause_stats.p99, pause_stats.max, stats_json(steady_stats),
        stats_json(during_stats), ratio, corrupt ? "true" : "false", failed && !failed->ok ? "true" : "false",
        io::json::quoted(failed ? failed->error_kind : ""), failed_window_count, changed, stats_json(failed_stats),
        phases_json, staging, pool.live_bytes, pool.retained_bytes, pool.fresh_allocations, pool.recycled_allocations,
        peak_rss_bytes(), ok ? "true" : "false");
  } else {
    fmt::print("serving {} ({} tensors, {}), swapping with {}\n", paths[0], a.size(), format_bytes(blueprint.bytes()),
               paths[1]);
    fmt::print("  requests  {} clients, y = {}[0:{}, :] · x ({} multiply-adds), {}\n", concurrency, probe.tensor,
               probe.rows, probe.rows * probe.cols,
               serve_threads ? fmt::format("on a {}-thread arena", serve_threads) : std::string("inline on the loop"));
    fmt::print("  swaps     {}-thread arena, {} staging budget, checksums {}\n", swap_threads,
               format_bytes(source_options.pool.budget), verify);
    fmt::print("\n  {:<13} {:>8} {:>9} {:>9} {:>9}  {:<12} {}\n", "phase", "requests", "p50 µs", "p99 µs", "max µs",
               "generations", "mismatches");
    for (const Phase& ph : phases) {
      const Stats st = stats_of(ph.latencies);
      std::string gens;
      for (std::uint64_t g : ph.generations) gens += fmt::format("{}{}", gens.empty() ? "" : ",", g);
      fmt::print("  {:<13} {:>8} {:>9.1f} {:>9.1f} {:>9.1f}  {:<12} {}\n", ph.name, st.count, st.p50, st.p99, st.max,
                 gens, ph.mismatches);
    }
    fmt::print("\n");
    for (std::size_t i = 0; i < records.size(); ++i) {
      const SwapRecord& r = records[i];
      if (r.ok)
        fmt::print(
            "  swap {:<3} → generation {}: load {:.3f} s, verify {:.3f} s, canary {:.3f} s, publish pause {} ns\n",
            i + 1, r.report.generation, r.report.load_s, r.report.verify_s, r.report.canary_s,
            r.report.publish_pause.count());
      else
        fmt::print("  swap {:<3} to {} rejected after {:.3f} s [{}]: {}\n", i + 1, r.target, r.seconds, r.error_kind,
                   r.error);
    }
    fmt::print("\n  publish pause  p50 {:.0f} ns, p99 {:.0f} ns, max {:.0f} ns over {} swaps\n", pause_stats.p50,
               pause_stats.p99, pause_stats.max, pause_stats.count);
    fmt::print("  request p99    steady {:.1f} µs, during swaps {:.1f} µs: ratio {:.2f}\n", steady_stats.p99,
               during_stats.p99, ratio);
    if (corrupt)
      fmt::print("  failed swap    {} responses during and after it, {} changed; generation {} still serving\n",
                 failed_window_count, changed, slot.generation());
    fmt::print("  responses      {}, {} mismatched their version's reference\n", server.responses.size(), mismatches);
    fmt::print("  memory         staging high-water {}, tensor storage live {} retained {}, peak RSS {}\n",
               format_bytes(staging), format_bytes(pool.live_bytes), format_bytes(pool.retained_bytes),
               format_bytes(peak_rss_bytes()));
    fmt::print("{}\n", ok ? "ok" : "FAILED");
  }
  return ok ? 0 : 1;
}

}  // namespace eredu::cli
