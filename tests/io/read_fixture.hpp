#pragma once
// Shared by the reader tests: a checkpoint of random bytes written to a temporary
// directory, an independent pread of any byte range, and a way to run one coroutine.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>
#include <chrono>
#include <cstring>
#include <random>
#include <span>
#include <stdexcept>
#include <thread>
#include <vector>

#include "eredu/core/selection.hpp"
#include "eredu/synth/safetensors_writer.hpp"
#include "support/temp_dir.hpp"

namespace eredu::test {

/// The expected bytes of a selection, computed element by element from the whole tensor.
inline std::vector<std::byte> select_bytes(const std::vector<std::byte>& whole, const Shape& shape, DType dtype,
                                           const Selection& sel) {
  if (sel.is_all()) return whole;
  const std::size_t elem = dtype_bits(dtype) / 8;
  std::vector<std::byte> out;
  const std::size_t rank = shape.size();
  std::vector<std::uint64_t> idx(rank);
  for (std::size_t d = 0; d < rank; ++d) {
    idx[d] = sel.ranges[d].start;
    if (sel.ranges[d].size() == 0) return out;
  }
  for (;;) {
    std::uint64_t linear = 0;
    for (std::size_t d = 0; d < rank; ++d) linear = linear * shape[d] + idx[d];
    out.insert(out.end(), whole.begin() + static_cast<std::ptrdiff_t>(linear * elem),
               whole.begin() + static_cast<std::ptrdiff_t>((linear + 1) * elem));
    std::size_t d = rank;
    for (;;) {
      if (d == 0) return out;
      --d;
      if (++idx[d] < sel.ranges[d].stop) break;
      idx[d] = sel.ranges[d].start;
    }
  }
}

/// Reads [offset, offset + length) of `path` with plain pread: the reference path.
inline std::vector<std::byte> pread_reference(const std::filesystem::path& path, std::uint64_t offset,
                                              std::uint64_t length) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("open failed");
  std::vector<std::byte> out(length);
  std::uint64_t done = 0;
  while (done < length) {
    ssize_t n = ::pread(fd, out.data() + done, length - done, static_cast<off_t>(offset + done));
    if (n <= 0) break;
    done += static_cast<std::uint64_t>(n);
  }
  ::close(fd);
  out.resize(done);
  return out;
}

/// Random tensor bytes for `specs`, deterministic from `seed`.
inline std::vector<std::vector<std::byte>> random_tensor_bytes(const std::vector<synth::TensorSpec>& specs,
                                                               unsigned seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<std::byte>> data;
  for (const auto& s : specs) {
    std::vector<std::byte> bytes(synth::tensor_nbytes(s));
    for (std::size_t i = 0; i < bytes.size(); i += 8) {
      std::uint64_t v = rng();
      std::memcpy(bytes.data() + i, &v, std::min<std::size_t>(8, bytes.size() - i));
    }
    data.push_back(std::move(bytes));
  }
  return data;
}

/// Spans over each tensor's bytes, as the writer takes them.
inline std::vector<std::span<const std::byte>> spans_of(const std::vector<std::vector<std::byte>>& data) {
  std::vector<std::span<const std::byte>> spans;
  for (const auto& d : data) spans.emplace_back(d);
  return spans;
}

/// Runs `op` (an awaitable) on `ctx` to completion and returns its result or throws.
template <class Awaitable>
auto run_on(asio::io_context& ctx, Awaitable op) {
  auto future = asio::co_spawn(ctx, std::move(op), asio::use_future);
  ctx.restart();
  ctx.run();
  return future.get();
}

/// Rewrites `bytes` at `offset` of `path` in place (same size) and puts its access and
/// modification times back, as `cp -p` or `rsync --inplace -t` onto the file would. Returns
/// once the status-change time has moved: where it is coarse (a clock tick, a few ms) the
/// write can land in the tick of the last change, so it is repeated after a pause until the
/// ctime differs. Throws std::runtime_error when it never does (then no test can tell).
inline void rewrite_in_place(const std::filesystem::path& path, std::uint64_t offset,
                             std::span<const std::byte> bytes) {
  struct stat before {};
  if (::stat(path.c_str(), &before) != 0) throw std::runtime_error("stat failed");
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error("open for writing failed");
    const bool written =
        ::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset)) == static_cast<ssize_t>(bytes.size());
    const struct timespec times[2] = {before.st_atim, before.st_mtim};
    const bool restored = ::futimens(fd, times) == 0;
    struct stat after {};
    const bool stated = ::fstat(fd, &after) == 0;
    ::close(fd);
    if (!written || !restored || !stated) throw std::runtime_error("rewriting the file failed");
    if (after.st_size != before.st_size || after.st_mtim.tv_sec != before.st_mtim.tv_sec ||
        after.st_mtim.tv_nsec != before.st_mtim.tv_nsec)
      throw std::runtime_error("the rewrite changed the size or the modification time");
    if (after.st_ctim.tv_sec != before.st_ctim.tv_sec || after.st_ctim.tv_nsec != before.st_ctim.tv_nsec) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  throw std::runtime_error("the status-change time never moved after a rewrite");
}

}  // namespace eredu::test
