// cuda_load: loads a checkpoint, page-cache hot, into GPU memory through the CUDA backend and
// reports its throughput next to the two limits it is measured against, in the same run:
//
//   read  host read bandwidth: parallel pread of every file (page-cache hot) into reused
//         host buffers, 8 MiB pieces over --threads threads — what the reader can deliver;
//   pcie  cudaMemcpyAsync host-to-device bandwidth from pinned memory (256 MiB buffer, timed
//         with events) — the PCIe/NVLink-C2C limit of any host-to-device path;
//   both  read and pcie side by side, each over every byte: the rate a perfect pipeline could
//         reach where the two compete for memory bandwidth and cores;
//   load  every tensor materialized with cuda::Backend (lease pool pinned with pin_staging,
//         --streams streams), from the first materialize call to the last completion.
//
// After one untimed warm-up of each, the four run --repeat rounds (7 by default), their order
// rotated every round, because these machines are noisy; each figure is the median with min–max,
// and the ratio is the median of each round's load / min(read, pcie). The last round's weights
// are copied back and compared with the file's bytes (pread), tensor by tensor; a difference
// fails the run. Target: load >= 0.8 x min(read, pcie). Without a path it writes a synthetic Llama-shaped
// bf16 checkpoint of --size bytes (eredu::synth) into --dir and removes it afterwards.
// Without a CUDA device it prints "skipped: no CUDA device" and exits 0.
//
// usage: cuda_load [PATH] [--size 4G] [--dir /tmp] [--budget 512M] [--streams 2] [--threads 8]
//                  [--repeat 7] [--depth 8] [--request 8M] [--chunk 64M] [--reader auto|uring|pread]
//                  [--json]
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include <fmt/format.h>
#include <algorithm>
#include <asio/io_context.hpp>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "eredu/core/error.hpp"
#include "eredu/cuda/backend.hpp"
#include "eredu/cuda/cuda_error.hpp"
#include "eredu/cuda/device.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"
#include "eredu/synth/synthetic_checkpoint.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace eredu;

struct Options {
  std::string path;
  std::uint64_t size = std::uint64_t{4} << 30;
  std::string dir = "/tmp";
  std::uint64_t budget = std::uint64_t{512} << 20;
  unsigned streams = 2;
  unsigned threads = 8;
  unsigned repeat = 7;
  unsigned depth = 8;
  std::uint64_t request = std::uint64_t{8} << 20;
  std::uint64_t chunk = std::uint64_t{64} << 20;
  io::ReaderKind reader = io::ReaderKind::automatic;
  bool json = false;
};

[[noreturn]] void usage_error(const std::string& what) {
  fmt::print(stderr, "cuda_load: {}\n", what);
  std::exit(2);
}

std::uint64_t parse_size(std::string_view s) {
  if (s.empty()) usage_error("empty size");
  std::uint64_t scale = 1;
  switch (s.back()) {
    case 'K':
    case 'k':
      scale = 1ull << 10;
      break;
    case 'M':
    case 'm':
      scale = 1ull << 20;
      break;
    case 'G':
    case 'g':
      scale = 1ull << 30;
      break;
    default:
      break;
  }
  if (scale != 1) s.remove_suffix(1);
  try {
    return std::stoull(std::string(s)) * scale;
  } catch (...) {
    usage_error(fmt::format("bad size '{}'", s));
  }
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) usage_error(fmt::format("{} needs a value", a));
      return argv[++i];
    };
    if (a == "--size")
      o.size = parse_size(value());
    else if (a == "--dir")
      o.dir = value();
    else if (a == "--budget")
      o.budget = parse_size(value());
    else if (a == "--streams")
      o.streams = static_cast<unsigned>(std::max<std::uint64_t>(1, parse_size(value())));
    else if (a == "--threads")
      o.threads = static_cast<unsigned>(std::max<std::uint64_t>(1, parse_size(value())));
    else if (a == "--repeat")
      o.repeat = static_cast<unsigned>(std::max<std::uint64_t>(1, parse_size(value())));
    else if (a == "--depth")
      o.depth = static_cast<unsigned>(std::max<std::uint64_t>(1, parse_size(value())));
    else if (a == "--request")
      o.request = parse_size(value());
    else if (a == "--chunk")
      o.chunk = parse_size(value());
    else if (a == "--reader") {
      const std::string_view r = value();
      if (r == "auto")
        o.reader = io::ReaderKind::automatic;
      else if (r == "uring")
        o.reader = io::ReaderKind::uring;
      else if (r == "pread")
        o.reader = io::ReaderKind::pread;
      else
        usage_error(fmt::format("--reader takes auto, uring or pread, not '{}'", r));
    } else if (a == "--json")
      o.json = true;
    else if (!a.empty() && a[0] != '-' && o.path.empty())
      o.path = a;
    else
      usage_error(fmt::format("unknown argument '{}'", a));
  }
  return o;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
double gbps(std::uint64_t bytes, double s) { return s > 0 ? static_cast<double>(bytes) / s / 1e9 : 0; }

std::uint64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

/// Parallel pread of every file in 8 MiB pieces over `threads` threads; returns seconds.
double read_files(const io::Catalog& catalog, unsigned threads) {
  constexpr std::size_t piece = std::size_t{8} << 20;
  struct Piece {
    int fd;
    std::uint64_t offset, length;
  };
  std::vector<int> fds;
  std::vector<Piece> pieces;
  for (const auto& f : catalog.files()) {
    int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) usage_error(fmt::format("cannot open {}", f.path));
    fds.push_back(fd);
    for (std::uint64_t off = 0; off < f.size; off += piece)
      pieces.push_back({fd, off, std::min<std::uint64_t>(piece, f.size - off)});
  }
  std::atomic<std::size_t> next{0};
  const auto t0 = Clock::now();
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t)
    workers.emplace_back([&] {
      std::vector<std::byte> buffer(piece);
      for (std::size_t i; (i = next.fetch_add(1)) < pieces.size();) {
        std::uint64_t done = 0;
        while (done < pieces[i].length) {
          ssize_t n = ::pread(pieces[i].fd, buffer.data(), pieces[i].length - done,
                              static_cast<off_t>(pieces[i].offset + done));
          if (n <= 0) break;
          done += static_cast<std::uint64_t>(n);
        }
      }
    });
  for (auto& w : workers) w.join();
  const double s = seconds_since(t0);
  for (int fd : fds) ::close(fd);
  return s;
}

/// Host-to-device cudaMemcpyAsync from pinned memory in 256 MiB copies. The buffers are made
/// once, so that a timed run (events on the stream) holds nothing but the copies.
class PcieCopier {
 public:
  PcieCopier() : host_(chunk), stream_(0) {
    std::fill(host_.bytes().begin(), host_.bytes().end(), std::byte{1});
    cuda::check(cudaMalloc(&device_, chunk), "cudaMalloc");
    cuda::check(cudaEventCreate(&start_), "cudaEventCreate");
    cuda::check(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  ~PcieCopier() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaFree(device_);
  }
  PcieCopier(const PcieCopier&) = delete;
  PcieCopier& operator=(const PcieCopier&) = delete;

  /// Copies `total` bytes (rounded up to whole copies); returns GB/s.
  double run(std::uint64_t total) {
    cuda::check(cudaEventRecord(start_, stream_.get()), "cudaEventRecord");
    std::uint64_t copied = 0;
    for (; copied < total; copied += chunk)
      cuda::check(cudaMemcpyAsync(device_, host_.bytes().data(), chunk, cudaMemcpyHostToDevice, stream_.get()),
                  "cudaMemcpyAsync");
    cuda::check(cudaEventRecord(stop_, stream_.get()), "cudaEventRecord");
    cuda::check(cudaEventSynchronize(stop_), "cudaEventSynchronize");  // a benchmark may block
    float ms = 0;
    cuda::check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return gbps(copied, ms / 1e3);
  }

 private:
  static constexpr std::size_t chunk = std::size_t{256} << 20;
  cuda::PinnedBlock host_;
  cuda::Stream stream_;
  void* device_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

/// The median and range of one contender's rounds.
struct Spread {
  double median = 0, min = 0, max = 0;
  std::string text(int precision = 1) const {
    return fmt::format("{:.{}f} ({:.{}f}-{:.{}f})", median, precision + 1, min, precision + 1, max, precision + 1);
  }
  std::string json() const {
    return fmt::format("{{\"median\":{:.3f},\"min\":{:.3f},\"max\":{:.3f}}}", median, min, max);
  }
};

Spread spread(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return {n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, v.front(), v.back()};
}

struct LoadRun {
  double seconds = 0;
  std::uint64_t bytes = 0;
  std::uint64_t staging_high_water = 0;
  std::size_t tensors_differing = 0;  ///< counted only when the run verifies
  std::string first_difference{};     ///< names the first tensor that differs
};

/// Whether the device copy of every tensor of `source` equals the file's bytes (pread).
void verify_against_file(const io::CheckpointSource& source, const std::vector<cuda::Materialization>& loaded,
                         LoadRun& run) {
  cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::vector<std::byte> want, got;
  std::size_t k = 0;
  for (const io::TensorInfo& t : source.catalog().tensors()) {
    const cuda::Tensor& w = loaded[k++].weight;
    want.resize(t.nbytes);
    got.assign(w.nbytes(), std::byte{0});
    const int fd = ::open(source.catalog().files()[t.file].path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) usage_error(fmt::format("cannot open {}", source.catalog().files()[t.file].path));
    std::uint64_t done = 0;
    while (done < t.nbytes) {
      const ssize_t n = ::pread(fd, want.data() + done, t.nbytes - done, static_cast<off_t>(t.offset + done));
      if (n <= 0) break;
      done += static_cast<std::uint64_t>(n);
    }
    ::close(fd);
    if (w.nbytes() > 0)
      cuda::check(cudaMemcpy(got.data(), w.data(), w.nbytes(), cudaMemcpyDeviceToHost), "verification copy");
    if (done != t.nbytes || got.size() != want.size() || std::memcmp(got.data(), want.data(), want.size()) != 0) {
      if (run.tensors_differing++ == 0) run.first_difference = t.name;
    }
  }
}

/// Materializes every tensor of `source` across `executors` and waits (driving the loop).
LoadRun load_all(asio::io_context& ctx, io::CheckpointSource& source,
                 std::vector<std::unique_ptr<cuda::Executor>>& executors, cuda::DeviceMemoryPool& memory,
                 const cuda::PinnedRegistration& pin, bool verify) {
  std::vector<cuda::MaterializationContext> contexts;
  for (auto& e : executors) contexts.push_back({*e, memory, &pin});
  source.pool().reset_high_water();
  LoadRun run;
  std::vector<cuda::Materialization> in_flight;
  std::vector<Completion> done;
  const auto t0 = Clock::now();
  std::size_t i = 0;
  for (const io::TensorInfo& t : source.catalog().tensors()) {
    io::TensorReadRequest request{t.name};
    in_flight.push_back(cuda::Backend::materialize(source, request, contexts[i++ % contexts.size()], {}));
    done.push_back(in_flight.back().done);
    run.bytes += in_flight.back().weight.nbytes();
  }
  Completion all = when_all(done);
  while (!all.ready()) {
    ctx.restart();
    ctx.run_one_for(std::chrono::milliseconds(1));
  }
  run.seconds = seconds_since(t0);
  all.get();
  run.staging_high_water = source.pool().high_water();
  if (verify) verify_against_file(source, in_flight, run);
  return run;  // the weights go back to the pool here (stream-ordered frees)
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (cuda::device_count() == 0) {
    const std::string reason = cuda::no_device_reason();
    if (o.json)
      fmt::print("{{\"skipped\":\"no CUDA device\",\"reason\":\"{}\"}}\n", reason);
    else
      fmt::print("cuda_load: skipped: no CUDA device ({})\n", reason);
    return 0;
  }
  try {
    cudaDeviceProp prop{};
    cuda::check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    std::filesystem::path path = o.path;
    std::filesystem::path generated;
    if (path.empty()) {
      generated = std::filesystem::path(o.dir) / fmt::format("eredu-cuda-load-{}", ::getpid());
      synth::SyntheticOptions so;
      so.target_bytes = o.size;
      so.shards = 4;
      if (!o.json)
        fmt::print("cuda_load: writing a {:.1f} GiB synthetic checkpoint to {}\n", o.size / double(1 << 30),
                   generated.string());
      synth::write_synthetic(generated, so);
      path = generated;
    }
    asio::io_context ctx;
    io::SourceOptions so;
    so.pool.budget = o.budget;
    so.reader.depth = o.depth;
    so.reader.max_request = o.request;
    so.reader.kind = o.reader;
    so.chunk_bytes = o.chunk;
    auto source = io::CheckpointSource::open(ctx.get_executor(), path, so);
    const std::uint64_t total = source->catalog().total_bytes();

    const std::uint64_t pcie_bytes = std::max<std::uint64_t>(total, std::uint64_t{4} << 30);
    read_files(source->catalog(), o.threads);  // warm the page cache, untimed
    {
      cuda::PinnedRegistration pin = cuda::pin_staging(*source);
      cuda::Executor first(0);
      auto executors = first.fork(o.streams);
      cuda::DeviceMemoryPool memory(0);
      auto fence_all = [&] {
        for (auto& e : executors) e->fence().get();  // frees done before the next load
      };
      PcieCopier copier;
      copier.run(pcie_bytes);  // warm-up, untimed
      const LoadRun first_run = load_all(ctx, *source, executors, memory, pin, false);
      fence_all();
      const double first_gbps = gbps(first_run.bytes, first_run.seconds);

      // Both at once: the parallel pread and the pinned copies of `total` bytes each, side by
      // side: what a perfect pipeline could do when the two compete for memory and cores.
      auto both_gbps = [&] {
        const auto t0 = Clock::now();
        std::thread reader([&] { read_files(source->catalog(), o.threads); });
        copier.run(total);
        reader.join();
        return gbps(total, seconds_since(t0));
      };
      std::vector<double> read_r, pcie_r, both_r, load_r, ratio_r, both_ratio_r;
      LoadRun last;
      for (unsigned r = 0; r < o.repeat; ++r) {
        double rd = 0, pc = 0, bo = 0, ld = 0;
        for (unsigned k = 0; k < 4; ++k) {
          switch ((r + k) % 4) {  // rotate the contenders' order every round
            case 0:
              rd = gbps(total, read_files(source->catalog(), o.threads));
              break;
            case 1:
              pc = copier.run(pcie_bytes);
              break;
            case 2:
              bo = both_gbps();
              break;
            default:
              last = load_all(ctx, *source, executors, memory, pin, r + 1 == o.repeat);
              fence_all();
              ld = gbps(last.bytes, last.seconds);
              break;
          }
        }
        read_r.push_back(rd);
        pcie_r.push_back(pc);
        load_r.push_back(ld);
        both_r.push_back(bo);
        ratio_r.push_back(std::min(rd, pc) > 0 ? ld / std::min(rd, pc) : 0);
        both_ratio_r.push_back(bo > 0 ? ld / bo : 0);
      }
      const Spread read = spread(read_r), pcie = spread(pcie_r), load = spread(load_r), ratio = spread(ratio_r),
                   both = spread(both_r), both_ratio = spread(both_ratio_r);
      if (o.json) {
        fmt::print(
            "{{\"gpu\":\"{}\",\"bytes\":{},\"tensors\":{},\"rounds\":{},\"read_gb_per_s\":{},"
            "\"pcie_gb_per_s\":{},\"load_gb_per_s\":{},\"ratio_to_limit\":{},\"read_and_pcie_at_once_gb_per_s\":{},"
            "\"ratio_to_at_once\":{},\"load_first_gb_per_s\":{:.2f},"
            "\"target\":0.8,\"streams\":{},\"budget\":{},\"staging_high_water\":{},\"peak_rss_bytes\":{},"
            "\"tensors_differing\":{}}}\n",
            prop.name, last.bytes, source->catalog().size(), o.repeat, read.json(), pcie.json(), load.json(),
            ratio.json(), both.json(), both_ratio.json(), first_gbps, o.streams, o.budget, last.staging_high_water,
            peak_rss_bytes(), last.tensors_differing);
      } else {
        fmt::print("gpu                {}\n", prop.name);
        fmt::print("checkpoint         {} ({} tensors, {:.2f} GiB), {} rounds, order rotated\n", path.string(),
                   source->catalog().size(), last.bytes / double(1 << 30), o.repeat);
        fmt::print("host read          {} GB/s  (parallel pread, page-cache hot, {} threads)\n", read.text(),
                   o.threads);
        fmt::print("pcie h2d           {} GB/s  (cudaMemcpyAsync from pinned memory, 256 MiB copies)\n", pcie.text());
        fmt::print("read + pcie at once {} GB/s  (both of every byte, side by side)\n", both.text());
        fmt::print(
            "load to device     {} GB/s  (first load {:.2f}), {} streams, budget {} MiB, {} reader depth {}, "
            "requests {} MiB, chunks {} MiB\n",
            load.text(), first_gbps, o.streams, o.budget >> 20, source->reader().name(), o.depth, o.request >> 20,
            o.chunk >> 20);
        fmt::print("ratio              {} of min(read, pcie) per round; target 0.8: {}\n", ratio.text(2),
                   ratio.median >= 0.8 ? "met" : "NOT met");
        fmt::print("ratio to at once   {} of read + pcie at once per round\n", both_ratio.text(2));
        fmt::print("staging high-water {} MiB of {} MiB, peak RSS {} MiB\n", last.staging_high_water >> 20,
                   o.budget >> 20, peak_rss_bytes() >> 20);
        fmt::print("bytes              {} of {} tensors differ from the file{}{}\n", last.tensors_differing,
                   source->catalog().size(), last.tensors_differing ? ", first: " : "", last.first_difference);
      }
      if (last.tensors_differing != 0) return 1;
    }
    source.reset();
    if (!generated.empty()) std::filesystem::remove_all(generated);
  } catch (const std::exception& e) {
    fmt::print(stderr, "cuda_load: {}\n", e.what());
    return 1;
  }
  return 0;
}
