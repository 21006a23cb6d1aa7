#pragma once
/// \file
/// The option table the front ends share: the accepted range of every numeric option (the CLI's
/// flag and Python's keyword of the same name accept the same values), the defaults a
/// whole-checkpoint load starts from, and the string choices (reader, O_DIRECT, weight storage)
/// with their parser. A range, a default or a choice is changed here, once, and `--help`,
/// Python's checks and their messages follow.

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "eredu/core/dtype.hpp"
#include "eredu/cpu/weight_storage.hpp"
#include "eredu/io/reading/reader.hpp"

namespace eredu::app {

/// An inclusive range of accepted values.
struct Range {
  std::uint64_t min = 0;  ///< smallest accepted value
  std::uint64_t max = 0;  ///< largest accepted value
};

/// The ranges of the shared numeric options (sizes in bytes).
namespace option_range {
inline constexpr Range budget{4096, std::uint64_t{1} << 40};   ///< staging memory (and a prefetch's resident bytes)
inline constexpr Range staging{4096, std::uint64_t{1} << 40};  ///< a prefetch's staging memory
inline constexpr Range request{4096, std::uint64_t{1} << 30};  ///< the largest single read
inline constexpr Range chunk{4096, std::uint64_t{1} << 40};    ///< the lease a converted tensor is read in
inline constexpr Range threads{1, 1024};                       ///< threads of an arena
inline constexpr Range depth{1, 256};                          ///< read requests in flight
inline constexpr Range lookahead{1, 64};                       ///< units a prefetch loads ahead
inline constexpr Range passes{1, 1000000};                     ///< passes of a prefetch over its units
inline constexpr Range tensor_parallel{1, 4096};               ///< ranks of a tensor-parallel group (checksum)
inline constexpr Range heads{1, std::uint64_t{1} << 20};       ///< attention heads, or indices per head
}  // namespace option_range

/// One entry of the option table: the option's name (Python's keyword) and its range.
struct NamedRange {
  std::string_view name;  ///< "budget", "depth", ...
  Range range;            ///< what it accepts
};

/// Every range of option_range, by name (what Python's RANGES holds).
std::span<const NamedRange> option_ranges() noexcept;

/// What a whole-checkpoint load starts from (`eredu load` and every Python open): it has every
/// tensor in flight at once, and deeper and larger requests keep both cores copying (recycled
/// 4 GiB loads: 11-13.5 GB/s at depth 8 / 8 MiB, 10.6-11.6 at 4 / 4 MiB).
struct LoadPreset {
  static constexpr unsigned depth = 8;                              ///< read requests in flight
  static constexpr std::uint64_t request = std::uint64_t{8} << 20;  ///< the largest single read
  static constexpr std::uint64_t chunk = std::uint64_t{64} << 20;   ///< a converted tensor's lease
};

/// A string choice and the value it selects.
template <class T>
struct Choice {
  std::string_view name;  ///< as the command line and Python spell it
  T value;                ///< what it selects
};

/// --reader / reader=: io_uring, pread, or io_uring where the kernel allows it.
inline constexpr std::array reader_choices{Choice<io::ReaderKind>{"auto", io::ReaderKind::automatic},
                                           Choice<io::ReaderKind>{"uring", io::ReaderKind::uring},
                                           Choice<io::ReaderKind>{"pread", io::ReaderKind::pread}};
/// --direct / direct=: O_DIRECT for data not in the page cache.
inline constexpr std::array direct_choices{Choice<io::DirectMode>{"auto", io::DirectMode::automatic},
                                           Choice<io::DirectMode>{"on", io::DirectMode::on},
                                           Choice<io::DirectMode>{"off", io::DirectMode::off}};
/// --weights / weights=: where tensors kept in their stored dtype live.
inline constexpr std::array weight_choices{Choice<cpu::WeightStorage>{"copy", cpu::WeightStorage::copied},
                                           Choice<cpu::WeightStorage>{"map", cpu::WeightStorage::mapped},
                                           Choice<cpu::WeightStorage>{"map-lock", cpu::WeightStorage::mapped_locked}};

/// --dtype / dtype=: the dtype float tensors are cast to on load; "keep" (Python: None) casts
/// nothing. Every spelling the CLI accepts Python accepts too, and the reverse: Python's and
/// PyTorch's names (float16, half), the short ones (f16, fp16) and safetensors' (F16, any case).
inline constexpr std::array cast_choices{
    Choice<std::optional<DType>>{"keep", std::nullopt},    Choice<std::optional<DType>>{"bf16", DType::BF16},
    Choice<std::optional<DType>>{"bfloat16", DType::BF16}, Choice<std::optional<DType>>{"f16", DType::F16},
    Choice<std::optional<DType>>{"fp16", DType::F16},      Choice<std::optional<DType>>{"float16", DType::F16},
    Choice<std::optional<DType>>{"half", DType::F16},      Choice<std::optional<DType>>{"f32", DType::F32},
    Choice<std::optional<DType>>{"fp32", DType::F32},      Choice<std::optional<DType>>{"float32", DType::F32},
    Choice<std::optional<DType>>{"float", DType::F32}};

/// The cast `name` selects (case-insensitive, so "F16" and "BF16" as safetensors spells them
/// work too): an engaged optional holding nullopt for "keep", nullopt when no choice matches.
std::optional<std::optional<DType>> parse_cast(std::string_view name) noexcept;

/// The value `name` selects among `choices`; nullopt when none does.
template <class T, std::size_t N>
constexpr std::optional<T> parse_choice(const std::array<Choice<T>, N>& choices, std::string_view name) noexcept {
  for (const Choice<T>& c : choices)
    if (c.name == name) return c.value;
  return std::nullopt;
}

/// The names of `choices`, in order, as a container of strings (help texts, completion).
template <class Strings, class T, std::size_t N>
Strings choice_names(const std::array<Choice<T>, N>& choices) {
  Strings out;
  for (const Choice<T>& c : choices) out.emplace_back(c.name);
  return out;
}

/// "auto, uring or pread": the names of `choices` as an error message lists them.
template <class T, std::size_t N>
std::string choice_list(const std::array<Choice<T>, N>& choices) {
  std::string out;
  for (std::size_t i = 0; i < N; ++i) {
    if (i > 0) out += i + 1 == N ? " or " : ", ";
    out += choices[i].name;
  }
  return out;
}

}  // namespace eredu::app
