#pragma once
/// \file
/// The stand-in compute of a streamed unit, what `eredu pipeline --compute matvec` runs while
/// the next units load: W · x for every 2-D BF16/F16/F32 weight of a module, as a layer's
/// projections would be used, without a model to run.

#include "eredu/app/tensor_set_module.hpp"

namespace eredu::app {

/// W · x (x_i = 1 / (1 + i mod 7)) for every bound 2-D BF16/F16/F32 slot of `module`, rows in
/// parallel on the calling thread's TBB arena (call inside it); other slots are skipped. Returns
/// Σ of every result, so the work cannot be optimised away and can be reported.
double matvec_probe(const TensorSetModule& module);

}  // namespace eredu::app
