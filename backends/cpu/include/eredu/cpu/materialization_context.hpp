#pragma once
/// \file
/// eredu::cpu::MaterializationContext: what the CPU backend uses while realizing weights.

#include "eredu/cpu/executor.hpp"
#include "eredu/cpu/storage_pool.hpp"

namespace eredu::cpu {

/// The arena that populates memory and runs conversions and recipes, and the pool tensor
/// storage comes from. Both must outlive every materialization started with the context.
struct MaterializationContext {
  Executor& executor;    ///< runs populate, conversion and layout work
  StoragePool& storage;  ///< tensor storage (recycled across loads)
};

}  // namespace eredu::cpu
