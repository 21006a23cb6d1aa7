// `eredu read PATH`: every tensor through the bounded lease pool, each checked against an
// independent pread pass.
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <cstdio>
#include <functional>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "cli.hpp"
#include "commands.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/printable.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"
#include "eredu/io/reading/unique_fd.hpp"
#include "eredu/io/remote/remote_url.hpp"
#include "interrupt.hpp"
#include "progress.hpp"
#include "remote_flags.hpp"
#include "trace_option.hpp"

namespace eredu::cli {
namespace {

/// The options of `eredu read`, with their defaults.
struct ReadOptions {
  std::string path;
  std::string reader = "auto";
  std::string uring_files = "local";
  std::uint64_t budget = std::uint64_t{256} << 20;
  unsigned depth = 4;
  std::uint64_t request = std::uint64_t{4} << 20;
  std::string direct = "auto";
  unsigned concurrency = 2;
  std::uint64_t chunk = std::uint64_t{4} << 20;
  std::string verify = "on";
  RemoteFlags remote;
};

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

// The independent path: plain pread of each tensor's byte range into a 16 MiB buffer;
// `progress` gets the bytes hashed so far. A signal stops it between reads.
std::vector<std::uint64_t> reference_hashes(const io::Catalog& catalog,
                                            const std::function<void(std::uint64_t)>& progress,
                                            const std::string& doing) {
  std::vector<std::uint64_t> out;
  std::vector<std::byte> buf(std::size_t{16} << 20);
  std::vector<io::UniqueFd> fds;
  for (const auto& f : catalog.files()) fds.emplace_back(::open(f.path.c_str(), O_RDONLY | O_CLOEXEC));
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> h(XXH3_createState(), &XXH3_freeState);
  if (!h) throw std::bad_alloc();
  std::uint64_t total = 0;
  for (const auto& t : catalog.tensors()) {
    XXH3_64bits_reset(h.get());
    std::uint64_t done = 0;
    while (done < t.nbytes) {
      throw_if_interrupted(doing);
      std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), t.nbytes - done));
      ssize_t n = ::pread(fds[t.file].get(), buf.data(), want, static_cast<off_t>(t.offset + done));
      if (n <= 0) break;
      XXH3_64bits_update(h.get(), buf.data(), static_cast<std::size_t>(n));
      done += static_cast<std::uint64_t>(n);
      progress(total + done);
    }
    total += t.nbytes;
    out.push_back(done == t.nbytes ? XXH3_64bits_digest(h.get()) : ~XXH3_64bits_digest(h.get()));
  }
  return out;
}

int run_read(const ReadOptions& o, const CommonFlags& flags) {
  io::SourceOptions opts;
  opts.pool.budget = o.budget;
  opts.reader.depth = o.depth;
  opts.reader.max_request = o.request;
  opts.reader.kind = app::parse_choice(app::reader_choices, o.reader).value_or(io::ReaderKind::automatic);
  opts.reader.uring_policy = o.uring_files == "all" ? io::UringPolicy::every_file : io::UringPolicy::by_file_system;
  opts.reader.direct = app::parse_choice(app::direct_choices, o.direct).value_or(io::DirectMode::automatic);
  // Consuming a tensor in request-sized leases keeps the staging memory that is written
  // cache-warm and reused; whole-tensor leases (--chunk 0) are what a loader that needs the
  // tensor at once gets.
  if (o.chunk) opts.chunk_bytes = o.chunk;
  // The pool is the command's until it exits: an idle-release timer would hold the event loop
  // a second after the last read (counted in the read's time, and keeping a signal that came
  // then waiting for it).
  opts.pool.release_after = std::chrono::milliseconds(0);
  opts.remote = remote_options(o.remote);
  // The independent pass preads local files; a checkpoint behind a URL has none to pread (its
  // ranged GETs are pinned by ETag and checked for length instead).
  const bool remote = io::is_remote(o.path);
  const bool verify = o.verify == "on" && !remote;

  Progress progress(!flags.quiet);
  asio::io_context ctx(1);
  Interrupt interrupt(ctx);
  interrupt.doing(fmt::format("opening {}", io::shown_location(o.path)));
  progress.phase("open");
  const double t_setup = now_seconds();
  auto source = io::CheckpointSource::open(ctx.get_executor(), o.path, opts);
  interrupt.check();
  const double setup_s = now_seconds() - t_setup;
  const auto& catalog = source->catalog();

  ReadState st;
  st.source = source.get();
  st.tensors = catalog.tensors();
  st.verify = verify;
  st.chunk = o.chunk;
  st.hashes.resize(st.tensors.size());
  st.progress = &progress;
  progress.phase("read", catalog.total_bytes());
  const double t0 = now_seconds();
  interrupt.doing(fmt::format("reading {}", io::shown_location(o.path)));
  unsigned running = o.concurrency;
  for (unsigned w = 0; w < o.concurrency; ++w) {
    asio::co_spawn(ctx, read_worker(&st),
                   asio::bind_cancellation_slot(interrupt.slot(), [&st, &running, &interrupt](std::exception_ptr e) {
                     if (e && !st.failure) st.failure = e;
                     if (--running == 0) interrupt.disarm();
                   }));
  }
  interrupt.arm();
  ctx.run();
  const double read_s = now_seconds() - t0;
  interrupt.rethrow(st.failure);

  std::size_t mismatches = 0;
  double verify_s = 0;
  std::string first_mismatch;
  if (verify) {
    progress.phase("verify", catalog.total_bytes());
    const double tv = now_seconds();
    const std::string doing =
        fmt::format("verifying what was read of {} against an independent read", io::shown_location(o.path));
    auto ref = reference_hashes(
        catalog, [&progress](std::uint64_t done) { progress.update(done); }, doing);
    verify_s = now_seconds() - tv;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      if (ref[i] != st.hashes[i]) {
        if (mismatches++ == 0) first_mismatch = st.tensors[i].name;
      }
    }
  }
  progress.finish();
  const auto stats = source->reader().stats();
  const double rate = gb_per_s(st.bytes_done, read_s);
  const std::uint64_t rss = peak_rss_bytes();
  if (flags.json) {
    JsonWriter json;
    begin_document(json, "read");
    json.field("path", io::shown_location(o.path)).field("reader", source->reader().name());
    json.count("tensor", st.tensors.size()).count("file", catalog.files().size());
    json.bytes("tensor", catalog.total_bytes()).bytes("", st.bytes_done).seconds("", read_s).rate("", rate);
    json.seconds("setup", setup_s).bytes("budget", source->pool().budget());
    json.bytes("staging_high_water", source->pool().high_water()).bytes("peak_rss", rss);
    json.count("request", stats.requests).count("direct_request", stats.direct_requests);
    json.count("fixed_buffer_request", stats.fixed_buffer_requests).count("short_read", stats.short_reads);
    json.count("syscall", stats.syscalls);
    json.field("depth", o.depth).bytes("max_request", o.request).bytes("chunk", o.chunk);
    json.field("concurrency", o.concurrency).field("verify", o.verify).field("verified", verify);
    json.seconds("verify", verify_s).count("mismatch", mismatches);
    if (mismatches)
      json.field("first_mismatch", first_mismatch);
    else
      json.null_field("first_mismatch");
    print_document(json);
  } else {
    fmt::print("read {} ({} tensors, {} file{}) in {:.3f} s: {:.2f} GB/s\n", format_bytes(st.bytes_done),
               st.tensors.size(), catalog.files().size(), catalog.files().size() == 1 ? "" : "s", read_s, rate);
    fmt::print("  reader   {}\n", source->reader().describe());
    fmt::print("  staging  high-water {} of a {} budget (setup {:.2f} s: files opened, pool mapped and registered)\n",
               format_bytes(source->pool().high_water()), format_bytes(source->pool().budget()), setup_s);
    fmt::print("  requests {} ({} O_DIRECT, {} into fixed buffers, {} short reads), {} system calls\n", stats.requests,
               stats.direct_requests, stats.fixed_buffer_requests, stats.short_reads, stats.syscalls);
    if (verify) {
      if (mismatches == 0) {
        fmt::print("  verify   all {} tensors match an independent pread + xxh3 pass ({:.2f} s)\n", st.tensors.size(),
                   verify_s);
      } else {
        fmt::print("  verify   {} tensors DIFFER from the independent pread pass, first: {}\n", mismatches,
                   printable(first_mismatch));
      }
    } else {
      fmt::print("  verify   off: nothing was compared{}\n",
                 remote && o.verify == "on" ? " (the independent pread pass reads local files only)" : "");
    }
    fmt::print("  memory   peak RSS {}\n", format_bytes(rss));
  }
  return mismatches == 0 ? 0 : 1;
}

}  // namespace

Command add_read_command(CLI::App& app, CommonFlags& flags) {
  auto o = std::make_shared<ReadOptions>();
  CLI::App* cmd =
      add_command(app, "read", "read every tensor through the bounded lease pool and verify it",
                  "Reads every tensor through the bounded lease pool (in --chunk sized leases), checks each against an "
                  "independent pread pass, and prints bytes, seconds, GB/s, staging high-water and peak RSS.");
  add_path(*cmd, "PATH", o->path,
           "a .safetensors file, a sharded directory or its model.safetensors.index.json, or a GGUF checkpoint; or the "
           "URL of one (https://, http://, s3://)");
  add_choice(*cmd, "--reader", o->reader, app::choice_names<std::vector<std::string>>(app::reader_choices),
             "reader: io_uring, pread, or auto (io_uring where the kernel allows it)");
  add_choice(*cmd, "--uring-files", o->uring_files, {"local", "all"},
             "files io_uring may read: local (ext4, xfs, btrfs, tmpfs, overlayfs...; FUSE, NFS, SMB, 9p, ceph and "
             "unknown file systems are read with pread, where io_uring can hide a failed read) or all");
  add_bytes(*cmd, "--budget", o->budget, app::option_range::budget, "staging memory of the lease pool");
  add_integer(*cmd, "--depth", o->depth, app::option_range::depth, "read requests in flight");
  add_bytes(*cmd, "--request", o->request, app::option_range::request, "largest single read request");
  add_choice(*cmd, "--direct", o->direct, app::choice_names<std::vector<std::string>>(app::direct_choices),
             "O_DIRECT: auto (for data not in the page cache), on, off");
  add_integer(*cmd, "--concurrency", o->concurrency, 1u, 64u, "tensors read at once");
  add_bytes(*cmd, "--chunk", o->chunk, app::option_range::chunk, "lease size tensors are consumed in",
            "one lease per tensor where it fits the budget");
  add_choice(*cmd, "--verify", o->verify, {"on", "off"},
             "compare every tensor with an independent pread + xxh3 pass (exit status 1 on a difference); local "
             "files only");
  add_remote_flags(*cmd, o->remote);
  auto trace_path = std::make_shared<std::string>();
  add_trace_option(*cmd, *trace_path);
  add_common_flags(*cmd, flags, true);
  return {cmd,
          [o, trace_path](const CommonFlags& f) { return run_traced(*trace_path, [&] { return run_read(*o, f); }); }};
}

}  // namespace eredu::cli
