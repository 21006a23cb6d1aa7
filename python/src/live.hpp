#pragma once
/// \file
/// Live updates for Python (built where eredu::mpi is): the process's MPI world, the trainer's
/// Publisher and Publication, and the server's Subscriber and PublishedVersion, whose versions
/// a ModelSlot swaps to (model_slot.hpp). See docs/live_updates.md.
///
/// MPI's lifetime: initialized by the first LiveGroup, finalized by live_finalize(), which the
/// Python package calls at exit after closing every publisher and subscriber still open (their
/// windows are freed collectively, so every rank closes its own before MPI ends).

// Python.h first: it sets feature macros the standard headers must see.
#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "eredu/mpi/published_source.hpp"

namespace eredu::python {

/// One published version open on a subscriber: what a ModelSlot swap reads. Used on the
/// runtime's loop thread only (its source's executor), held by Python and by each swap.
class PublishedVersion {
 public:
  /// Holds `source`, opened by a subscriber that `subscriber` keeps alive.
  PublishedVersion(std::shared_ptr<void> subscriber, std::unique_ptr<mpi::PublishedSource> source)
      : subscriber_(std::move(subscriber)), source_(std::move(source)) {}
  /// Releases the source on the loop thread.
  ~PublishedVersion();
  PublishedVersion(const PublishedVersion&) = delete;
  PublishedVersion& operator=(const PublishedVersion&) = delete;

  /// The source (loop thread only).
  mpi::PublishedSource& source() const noexcept { return *source_; }

 private:
  std::shared_ptr<void> subscriber_;  // destroyed after the source
  std::shared_ptr<mpi::PublishedSource> source_;
};

/// Registers eredu._native.LiveGroup, Publisher, Publication, Subscriber, PublishedVersion and
/// live_finalize.
void bind_live(pybind11::module_& m);

}  // namespace eredu::python
