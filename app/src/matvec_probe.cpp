#include "eredu/app/matvec_probe.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cstdint>
#include <vector>

#include "eredu/cpu/float_formats.hpp"

namespace eredu::app {
namespace {

template <class Widen, class T>
float dot(const T* w, const float* x, std::size_t n, Widen widen) noexcept {
  float acc[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (std::size_t j = 0; j < 8; ++j) acc[j] += widen(w[i + j]) * x[i + j];
  for (; i < n; ++i) acc[i % 8] += widen(w[i]) * x[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace

double matvec_probe(const TensorSetModule& module) {
  double total = 0;
  for (const TensorSetModule::Slot& s : module.slots()) {
    const cpu::Parameter& p = s.parameter;
    if (p.shape.size() != 2 || (p.dtype != DType::BF16 && p.dtype != DType::F16 && p.dtype != DType::F32)) continue;
    const std::size_t rows = p.shape[0], cols = p.shape[1];
    std::vector<float> x(cols), y(rows);
    for (std::size_t i = 0; i < cols; ++i) x[i] = 1.0f / static_cast<float>(1 + i % 7);
    const std::byte* data = p.value.bytes().data();
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, rows), [&](const tbb::blocked_range<std::size_t>& r) {
      for (std::size_t row = r.begin(); row != r.end(); ++row) {
        if (p.dtype == DType::F32)
          y[row] = dot(reinterpret_cast<const float*>(data) + row * cols, x.data(), cols, [](float v) { return v; });
        else if (p.dtype == DType::BF16)
          y[row] = dot(reinterpret_cast<const std::uint16_t*>(data) + row * cols, x.data(), cols,
                       [](std::uint16_t v) { return cpu::bf16_to_f32(v); });
        else
          y[row] = dot(reinterpret_cast<const std::uint16_t*>(data) + row * cols, x.data(), cols,
                       [](std::uint16_t v) { return cpu::f16_to_f32(v); });
      }
    });
    for (float v : y) total += v;
  }
  return total;
}

}  // namespace eredu::app
