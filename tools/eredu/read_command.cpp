#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <cstdio>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "cli.hpp"
#include "commands.hpp"
#include "eredu/core/error.hpp"
#include "eredu/io/checkpoint_source.hpp"
#include "eredu/io/json_text.hpp"

namespace eredu::cli {
namespace {

struct ReadState {
  io::CheckpointSource* source = nullptr;
  std::span<const io::TensorInfo> tensors;
  bool verify = true;
  std::uint64_t chunk = 0;  // 0: one lease per tensor when it fits the pool
  std::size_t next = 0;
  std::uint64_t bytes_done = 0;
  std::vector<std::uint64_t> hashes;
  std::exception_ptr failure;
  Progress* progress = nullptr;
};

// Hashes the bytes of one lease into the tensor's running digest.
void absorb(ReadState& st, XXH3_state_t* h, std::span<const std::byte> bytes) {
  if (st.verify) XXH3_64bits_update(h, bytes.data(), bytes.size());
  st.bytes_done += bytes.size();
  st.progress->update(st.bytes_done);
}

// One of `concurrency` workers: takes the next tensor until none is left. Everything it
// needs comes in through its parameter, which lives in the coroutine frame.
asio::awaitable<void> read_worker(ReadState* st) {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> h(XXH3_createState(), &XXH3_freeState);
  while (!st->failure && st->next < st->tensors.size()) {
    const std::size_t i = st->next++;
    const auto& t = st->tensors[i];
    XXH3_64bits_reset(h.get());
    io::TensorReadRequest request{t.name};
    if (st->chunk == 0 && io::LeasePool::block_size(t.nbytes) <= st->source->pool().budget()) {
      io::Lease lease = co_await st->source->async_read(request, asio::use_awaitable);
      absorb(*st, h.get(), lease.bytes());
    } else {
      request.policy = io::ReadPolicy::chunked;
      io::ChunkStream stream = st->source->stream(request);
      while (auto chunk = co_await stream.async_next(asio::use_awaitable)) absorb(*st, h.get(), chunk->bytes());
    }
    st->hashes[i] = XXH3_64bits_digest(h.get());
  }
}

// The independent path: plain pread of each tensor's byte range into a 16 MiB buffer.
std::vector<std::uint64_t> reference_hashes(const io::Catalog& catalog) {
  std::vector<std::uint64_t> out;
  std::vector<std::byte> buf(std::size_t{16} << 20);
  std::vector<int> fds;
  for (const auto& f : catalog.files()) fds.push_back(::open(f.path.c_str(), O_RDONLY | O_CLOEXEC));
  for (const auto& t : catalog.tensors()) {
    XXH3_state_t* h = XXH3_createState();
    XXH3_64bits_reset(h);
    std::uint64_t done = 0;
    while (done < t.nbytes) {
      std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), t.nbytes - done));
      ssize_t n = ::pread(fds[t.file], buf.data(), want, static_cast<off_t>(t.offset + done));
      if (n <= 0) break;
      XXH3_64bits_update(h, buf.data(), static_cast<std::size_t>(n));
      done += static_cast<std::uint64_t>(n);
    }
    out.push_back(done == t.nbytes ? XXH3_64bits_digest(h) : ~XXH3_64bits_digest(h));
    XXH3_freeState(h);
  }
  for (int fd : fds) ::close(fd);
  return out;
}

}  // namespace

int run_read(int argc, char** argv) {
  Args args = parse_args(
      argc, argv, 2, {"reader", "budget", "depth", "direct", "request", "concurrency", "verify", "chunk"}, {"json"});
  if (args.positional.size() != 1) {
    throw std::invalid_argument(
        "usage: eredu read PATH [--reader auto|uring|pread] [--budget 256M] [--depth 4] [--request 4M] "
        "[--direct auto|on|off] [--concurrency 2] [--chunk 4M|0] [--verify on|off] [--json]");
  }
  io::SourceOptions opts;
  opts.pool.budget = parse_bytes(args.get("budget", "256M"));
  opts.reader.depth = static_cast<unsigned>(std::stoul(args.get("depth", "4")));
  opts.reader.max_request = parse_bytes(args.get("request", "4M"));
  std::string reader = args.get("reader", "auto");
  if (reader == "auto")
    opts.reader.kind = io::ReaderKind::automatic;
  else if (reader == "uring")
    opts.reader.kind = io::ReaderKind::uring;
  else if (reader == "pread")
    opts.reader.kind = io::ReaderKind::pread;
  else
    throw std::invalid_argument("--reader must be auto, uring or pread");
  std::string direct = args.get("direct", "auto");
  if (direct == "auto")
    opts.reader.direct = io::DirectMode::automatic;
  else if (direct == "on")
    opts.reader.direct = io::DirectMode::on;
  else if (direct == "off")
    opts.reader.direct = io::DirectMode::off;
  else
    throw std::invalid_argument("--direct must be auto, on or off");
  const std::string verify = args.get("verify", "on");
  if (verify != "on" && verify != "off") throw std::invalid_argument("--verify must be on or off");
  const unsigned concurrency = static_cast<unsigned>(std::stoul(args.get("concurrency", "2")));
  if (concurrency == 0) throw std::invalid_argument("--concurrency must be at least 1");
  const bool json = args.has("json");
  // Consuming a tensor in request-sized leases keeps the staging memory that is written
  // cache-warm and reused; whole-tensor leases (--chunk 0) are what a loader that needs the
  // tensor at once gets.
  const std::uint64_t chunk = parse_bytes(args.get("chunk", "4M"));
  if (chunk) opts.chunk_bytes = chunk;

  asio::io_context ctx(1);
  const double t_setup = now_seconds();
  auto source = io::CheckpointSource::open(ctx.get_executor(), args.positional[0], opts);
  const double setup_s = now_seconds() - t_setup;
  const auto& catalog = source->catalog();

  ReadState st;
  st.source = source.get();
  st.tensors = catalog.tensors();
  st.verify = verify == "on";
  st.chunk = chunk;
  st.hashes.resize(st.tensors.size());
  Progress progress("read", catalog.total_bytes());
  st.progress = &progress;
  const double t0 = now_seconds();
  for (unsigned w = 0; w < concurrency; ++w) {
    asio::co_spawn(ctx, read_worker(&st), [&st](std::exception_ptr e) {
      if (e && !st.failure) st.failure = e;
    });
  }
  ctx.run();
  const double read_s = now_seconds() - t0;
  progress.finish();
  if (st.failure) std::rethrow_exception(st.failure);

  std::size_t mismatches = 0;
  double verify_s = 0;
  std::string first_mismatch;
  if (st.verify) {
    const double tv = now_seconds();
    auto ref = reference_hashes(catalog);
    verify_s = now_seconds() - tv;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      if (ref[i] != st.hashes[i]) {
        if (mismatches++ == 0) first_mismatch = st.tensors[i].name;
      }
    }
  }
  const auto stats = source->reader().stats();
  const double gbps = static_cast<double>(st.bytes_done) / read_s / 1e9;
  const std::uint64_t rss = peak_rss_bytes();
  if (json) {
    fmt::print(
        "{{\"path\":{},\"reader\":{},\"tensors\":{},\"files\":{},\"bytes\":{},\"seconds\":{:.6f},\"gb_per_s\":{:.4f},"
        "\"gib_per_s\":{:.4f},\"setup_seconds\":{:.6f},\"budget\":{},\"staging_high_water\":{},\"peak_rss\":{},"
        "\"requests\":{},\"direct_requests\":{},\"fixed_buffer_requests\":{},\"short_reads\":{},\"syscalls\":{},"
        "\"depth\":{},\"max_request\":{},\"chunk\":{},\"concurrency\":{},\"verify\":{},\"verify_seconds\":{:.6f},"
        "\"mismatches\":{}}}\n",
        io::json::quoted(args.positional[0]), io::json::quoted(source->reader().name()), st.tensors.size(),
        catalog.files().size(), st.bytes_done, read_s, gbps, static_cast<double>(st.bytes_done) / read_s / (1u << 30),
        setup_s, source->pool().budget(), source->pool().high_water(), rss, stats.requests, stats.direct_requests,
        stats.fixed_buffer_requests, stats.short_reads, stats.syscalls, opts.reader.depth, opts.reader.max_request,
        st.chunk, concurrency, st.verify ? "true" : "false", verify_s, mismatches);
  } else {
    fmt::print("read {} ({} tensors, {} file{}) in {:.3f} s: {:.2f} GB/s\n", format_bytes(st.bytes_done),
               st.tensors.size(), catalog.files().size(), catalog.files().size() == 1 ? "" : "s", read_s, gbps);
    fmt::print("  reader   {}\n", source->reader().describe());
    fmt::print("  staging  high-water {} of a {} budget (setup {:.2f} s: files opened, pool mapped and registered)\n",
               format_bytes(source->pool().high_water()), format_bytes(source->pool().budget()), setup_s);
    fmt::print("  requests {} ({} O_DIRECT, {} into fixed buffers, {} short reads), {} system calls\n", stats.requests,
               stats.direct_requests, stats.fixed_buffer_requests, stats.short_reads, stats.syscalls);
    if (st.verify) {
      if (mismatches == 0) {
        fmt::print("  verify   all {} tensors match an independent pread + xxh3 pass ({:.2f} s)\n", st.tensors.size(),
                   verify_s);
      } else {
        fmt::print("  verify   {} tensors DIFFER from the independent pread pass, first: {}\n", mismatches,
                   first_mismatch);
      }
    } else {
      fmt::print("  verify   off\n");
    }
    fmt::print("  memory   peak RSS {}\n", format_bytes(rss));
  }
  return mismatches == 0 ? 0 : 1;
}

}  // namespace eredu::cli
