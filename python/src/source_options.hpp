#pragma once
/// \file
/// The one place where the Python module's keyword options become eredu's options structs.
/// eredu/_options.py validates and normalises the keywords (sizes such as "64M" become
/// bytes) and passes a dict; source_options() maps each key to its field. An option added to
/// io::SourceOptions (or to what a load takes) is added here and in _options.py, nowhere else.

#include <pybind11/pybind11.h>

#include <memory>

#include "eredu/cpu/weight_storage.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"
#include "read_gate.hpp"

namespace eredu::python {

/// How a checkpoint is opened and loaded.
struct OpenOptions {
  io::SourceOptions source;                                 ///< staging budget, reader, O_DIRECT, chunking
  int threads = 0;                                          ///< TBB arena of loads (0: the hardware's threads)
  bool copy_resident = true;                                ///< MaterializationContext::copy_resident_on_executor
  cpu::WeightStorage weights = cpu::WeightStorage::copied;  ///< MaterializationContext::weights
  std::shared_ptr<ReadGate> faults;                         ///< test hook (forces the pread reader)
};

/// Maps `options` (keys: budget, depth, request, reader, direct, chunk, map_resident,
/// register_buffers, threads, copy_resident, weights, the remote ones of _options.py, _faults) onto OpenOptions. Throws
/// Error(invalid_argument) naming the key for an unknown key or a bad value.
OpenOptions open_options(const pybind11::dict& options);

}  // namespace eredu::python
