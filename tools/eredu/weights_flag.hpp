#pragma once
/// \file
/// `--weights copy|map|map-lock` of `eredu load` and `eredu swap`: where dtype-kept tensors
/// live (cpu::WeightStorage), and the report of what a load left mapped.

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "eredu/app/tensor_set_module.hpp"
#include "eredu/cpu/weight_storage.hpp"

namespace eredu::cli {

/// Adds --weights (choices copy, map, map-lock; `value`'s value is the default) to `command`.
void add_weights_flag(CLI::App& command, std::string& value);

/// The WeightStorage --weights `value` names.
cpu::WeightStorage weight_storage(const std::string& value);

/// What --weights map left mapped (the rest was copied), over a module's bound tensors.
struct MappedCount {
  std::uint64_t tensors = 0;       ///< tensors whose storage is a file mapping
  std::uint64_t bytes = 0;         ///< their bytes
  std::uint64_t locked_bytes = 0;  ///< bytes of those pinned with mlock
};

/// Counts the mapped tensors bound in `model`.
MappedCount count_mapped(const app::TensorSetModule& model);

/// The report's line for `value` and `count` of `tensors` tensors ("" for copy): how many
/// tensors were mapped and, for map-lock, what is locked within RLIMIT_MEMLOCK.
std::string weights_summary(const std::string& value, const MappedCount& count, std::size_t tensors);

}  // namespace eredu::cli
