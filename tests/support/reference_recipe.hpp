#pragma once
// A reference evaluator of derived-weight recipes on host bytes, written for tests from the
// definitions (row-major layouts; IEEE 754 round to nearest, ties to even), independent of
// every backend's kernels. The conformance suite compares each backend's recipe results with
// it; the fake backend evaluates its recipes with it.
//
// Casts: F32, F16, BF16, F8_E4M3, F8_E5M2 and F8_E8M0 decode exactly to f32; F32, F16 and
// BF16 encode with round to nearest even, subnormals included. NaNs decode and encode to
// *a* NaN; their payload bits are the CPU conversion tests' business (tests/cpu), so tests
// that compare backends with this reference cast finite values only.

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "eredu/core/dtype.hpp"
#include "eredu/core/selection.hpp"
#include "eredu/core/shape.hpp"
#include "eredu/engine/description/recipe.hpp"
#include "eredu/io/formats/catalog.hpp"

namespace eredu::test {

/// Bytes one element of a whole-byte dtype occupies.
inline std::size_t reference_element_bytes(DType t) { return dtype_bits(t) / 8; }

/// The exact f32 value of one element of a float dtype (see file comment) at `p`.
inline float reference_decode(DType t, const std::byte* p) {
  auto u8 = [&] { return std::to_integer<std::uint32_t>(p[0]); };
  auto u16 = [&] { return u8() | (std::to_integer<std::uint32_t>(p[1]) << 8); };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  switch (t) {
    case DType::F32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::BF16:
      return std::bit_cast<float>(u16() << 16);
    case DType::F16: {
      const std::uint32_t h = u16(), exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
      const float sign = (h & 0x8000) ? -1.0f : 1.0f;
      if (exp == 0x1F) return mant ? nan : sign * std::numeric_limits<float>::infinity();
      if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -24);
      return sign * std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
    }
    case DType::F8_E4M3: {  // OCP E4M3 (FN): bias 7, no infinities, S.1111.111 is NaN
      const std::uint32_t b = u8(), exp = (b >> 3) & 0xF, mant = b & 0x7;
      const float sign = (b & 0x80) ? -1.0f : 1.0f;
      if (exp == 0xF && mant == 0x7) return nan;
      if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -9);
      return sign * std::ldexp(static_cast<float>(mant | 0x8), static_cast<int>(exp) - 10);
    }
    case DType::F8_E5M2: {  // OCP E5M2: the high byte of an IEEE f16
      const std::byte h[2] = {std::byte{0}, p[0]};
      return reference_decode(DType::F16, h);
    }
    case DType::F8_E8M0: {  // MX scale: 2^(e - 127), 0xFF is NaN
      const std::uint32_t e = u8();
      return e == 0xFF ? nan : std::ldexp(1.0f, static_cast<int>(e) - 127);
    }
    default:
      throw std::invalid_argument("reference_decode: not a float dtype: " + std::string(dtype_name(t)));
  }
}

/// Encodes `v` as one element of F32, F16 or BF16 at `p`, rounding to nearest even.
inline void reference_encode(DType t, float v, std::byte* p) {
  auto put16 = [&](std::uint32_t h) {
    p[0] = static_cast<std::byte>(h & 0xFF);
    p[1] = static_cast<std::byte>((h >> 8) & 0xFF);
  };
  const std::uint32_t x = std::bit_cast<std::uint32_t>(v);
  switch (t) {
    case DType::F32:
      std::memcpy(p, &v, 4);
      return;
    case DType::BF16: {
      if (std::isnan(v)) return put16((x >> 16) | 0x40);
      // Keep the high 16 bits; round on the low 16, ties to the even kept value.
      std::uint32_t kept = x >> 16;
      const std::uint32_t rest = x & 0xFFFF;
      if (rest > 0x8000 || (rest == 0x8000 && (kept & 1))) ++kept;
      return put16(kept);
    }
    case DType::F16: {
      const std::uint32_t sign = (x >> 16) & 0x8000;
      const float a = std::fabs(v);
      if (std::isnan(v)) return put16(sign | 0x7E00);
      if (a >= 65520.0f) return put16(sign | 0x7C00);  // halfway past 65504 and above: Inf
      if (a < std::ldexp(1.0f, -14)) {
        // Subnormal: a whole number of 2^-24 units, rounded to nearest even (exact scaling).
        const float units = a * 16777216.0f;
        auto q = static_cast<std::uint32_t>(units);
        const float rem = units - static_cast<float>(q);
        if (rem > 0.5f || (rem == 0.5f && (q & 1))) ++q;
        return put16(sign | q);  // q may reach 0x400: the smallest normal, correctly encoded
      }
      int e = 0;
      const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
      // 11 significant bits: units of 2^(e - 11).
      const float units = std::ldexp(m, 11);
      auto q = static_cast<std::uint32_t>(units);
      const float rem = units - static_cast<float>(q);
      if (rem > 0.5f || (rem == 0.5f && (q & 1))) ++q;
      if (q == 0x800) {  // rounded up into the next binade
        q = 0x400;
        ++e;
      }
      const std::uint32_t biased = static_cast<std::uint32_t>(e - 1 + 15);
      if (biased >= 0x1F) return put16(sign | 0x7C00);
      return put16(sign | (biased << 10) | (q & 0x3FF));
    }
    default:
      throw std::invalid_argument("reference_encode: not F32, F16 or BF16: " + std::string(dtype_name(t)));
  }
}

/// `bytes` of `from` elements converted to `to` (same dtype: a copy).
inline std::vector<std::byte> reference_cast(const std::vector<std::byte>& bytes, DType from, DType to) {
  if (from == to) return bytes;
  const std::size_t in = reference_element_bytes(from), out = reference_element_bytes(to), n = bytes.size() / in;
  std::vector<std::byte> result(n * out);
  for (std::size_t i = 0; i < n; ++i)
    reference_encode(to, reference_decode(from, bytes.data() + i * in), &result[i * out]);
  return result;
}

/// Product of `shape[begin, end)`.
inline std::uint64_t reference_extent(const Shape& shape, std::size_t begin, std::size_t end) {
  std::uint64_t n = 1;
  for (std::size_t d = begin; d < end; ++d) n *= shape[d];
  return n;
}

/// Indices `range` of dimension `dim` of a row-major tensor.
inline std::vector<std::byte> reference_slice(const std::vector<std::byte>& bytes, const Shape& shape, std::size_t elem,
                                              std::size_t dim, Range range) {
  const std::uint64_t outer = reference_extent(shape, 0, dim);
  const std::uint64_t inner = reference_extent(shape, dim + 1, shape.size()) * elem;
  std::vector<std::byte> out;
  for (std::uint64_t o = 0; o < outer; ++o)
    for (std::uint64_t i = range.start; i < range.stop; ++i) {
      const auto at = static_cast<std::ptrdiff_t>((o * shape[dim] + i) * inner);
      out.insert(out.end(), bytes.begin() + at, bytes.begin() + at + static_cast<std::ptrdiff_t>(inner));
    }
  return out;
}

/// Row-major tensors (bytes, shape) joined along `dim`.
inline std::vector<std::byte> reference_concat(const std::vector<std::pair<std::vector<std::byte>, Shape>>& inputs,
                                               std::size_t dim, std::size_t elem) {
  if (inputs.empty()) return {};
  const std::uint64_t outer = reference_extent(inputs.front().second, 0, dim);
  std::vector<std::byte> out;
  for (std::uint64_t o = 0; o < outer; ++o)
    for (const auto& [bytes, shape] : inputs) {
      const auto block = static_cast<std::ptrdiff_t>(reference_extent(shape, dim, shape.size()) * elem);
      const auto at = static_cast<std::ptrdiff_t>(o) * block;
      out.insert(out.end(), bytes.begin() + at, bytes.begin() + at + block);
    }
  return out;
}

/// A row-major tensor with its dimensions reordered: result dim i is input dim order[i].
inline std::vector<std::byte> reference_permute(const std::vector<std::byte>& bytes, const Shape& shape,
                                                std::size_t elem, const std::vector<std::size_t>& order) {
  const std::size_t rank = shape.size();
  Shape out_shape(rank);
  for (std::size_t i = 0; i < rank; ++i) out_shape[i] = shape[order[i]];
  std::vector<std::uint64_t> in_stride(rank, 1);
  for (std::size_t d = rank; d-- > 1;) in_stride[d - 1] = in_stride[d] * shape[d];
  const std::uint64_t n = reference_extent(shape, 0, rank);
  std::vector<std::byte> out(bytes.size());
  std::vector<std::uint64_t> idx(rank, 0);  // index into the result
  for (std::uint64_t linear = 0; linear < n; ++linear) {
    std::uint64_t from = 0;
    for (std::size_t i = 0; i < rank; ++i) from += idx[i] * in_stride[order[i]];
    std::memcpy(&out[linear * elem], &bytes[from * elem], elem);
    for (std::size_t d = rank; d-- > 0;) {
      if (++idx[d] < out_shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

/// The selected bytes of checkpoint tensor `key` (a source node's input).
using ReferenceSource = std::function<std::vector<std::byte>(const std::string& key, const Selection& selection)>;

/// The bytes `recipe` produces, evaluated node by node on host bytes from `source`.
inline std::vector<std::byte> reference_evaluate(const engine::DerivedWeightRecipe& recipe, const io::Catalog& catalog,
                                                 const ReferenceSource& source) {
  using Kind = engine::DerivedWeightRecipe::Kind;
  switch (recipe.kind()) {
    case Kind::source:
      return source(recipe.key(), recipe.selection());
    case Kind::reshape:
      return reference_evaluate(recipe.inputs()[0], catalog, source);
    case Kind::cast: {
      const engine::InferredWeight in = recipe.inputs()[0].infer(catalog);
      return reference_cast(reference_evaluate(recipe.inputs()[0], catalog, source), in.dtype, recipe.dtype());
    }
    case Kind::slice: {
      const engine::InferredWeight in = recipe.inputs()[0].infer(catalog);
      return reference_slice(reference_evaluate(recipe.inputs()[0], catalog, source), in.shape,
                             reference_element_bytes(in.dtype), recipe.dim(), recipe.range());
    }
    case Kind::concat: {
      std::vector<std::pair<std::vector<std::byte>, Shape>> parts;
      for (const engine::DerivedWeightRecipe& input : recipe.inputs())
        parts.emplace_back(reference_evaluate(input, catalog, source), input.infer(catalog).shape);
      return reference_concat(parts, recipe.dim(), reference_element_bytes(recipe.infer(catalog).dtype));
    }
    case Kind::permute: {
      const engine::InferredWeight in = recipe.inputs()[0].infer(catalog);
      return reference_permute(reference_evaluate(recipe.inputs()[0], catalog, source), in.shape,
                               reference_element_bytes(in.dtype), recipe.permutation(in.shape.size()));
    }
  }
  throw std::logic_error("reference_evaluate: unknown recipe kind");
}

}  // namespace eredu::test
