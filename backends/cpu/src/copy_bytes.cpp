#include "eredu/cpu/copy_bytes.hpp"

#include <fmt/format.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cstring>

#include "eredu/core/error.hpp"
#include "eredu/core/trace.hpp"

namespace eredu::cpu {

void copy_bytes(std::span<const std::byte> in, std::span<std::byte> out) {
  if (in.size() != out.size())
    throw Error(errc::invalid_argument, {}, fmt::format("copy of {} bytes into {} bytes", in.size(), out.size()));
  constexpr std::size_t block = std::size_t{1} << 20;
  if (in.size() <= block) {
    if (!in.empty()) std::memcpy(out.data(), in.data(), in.size());
    return;
  }
  const std::size_t blocks = (in.size() + block - 1) / block;
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, blocks), [&](const tbb::blocked_range<std::size_t>& r) {
    trace::Span span("copy", "cpu", trace::enabled() ? fmt::format("{} MiB blocks", r.size()) : "");
    for (std::size_t b = r.begin(); b < r.end(); ++b) {
      std::size_t off = b * block, n = std::min(block, in.size() - off);
      std::memcpy(out.data() + off, in.data() + off, n);
    }
  });
}

}  // namespace eredu::cpu
