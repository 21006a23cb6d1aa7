#pragma once
/// \file
/// eredu::python::Checkpoint: an open checkpoint as the Python module holds it — the
/// io::CheckpointSource (opened on the runtime's loop), a copy of its catalog that Python
/// threads may read at any time, and what its loads run on: a TBB arena (cpu::Executor) and a
/// storage pool (the runtime's, unless a pipeline or slot brings its own).
///
/// Threads: the source is used on the loop thread only; reads are posted there and report
/// through an Operation. close() and the destructor destroy the source on the loop thread too,
/// and only once no operation uses it: a read in flight keeps it (and so every lease it holds)
/// valid to its end. Tensors never refer to the source — they own their storage — so they
/// outlive it.

#include <pybind11/pybind11.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "eredu/cpu/executor.hpp"
#include "eredu/cpu/materialization_context.hpp"
#include "eredu/cpu/storage_pool.hpp"
#include "eredu/engine/orchestration/verify_options.hpp"
#include "eredu/io/formats/catalog.hpp"
#include "eredu/io/integrity/checksums.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"
#include "operation.hpp"
#include "source_options.hpp"
#include "tensor_set.hpp"

namespace eredu::python {

/// See file comment. Held by std::shared_ptr (Python's reference and every operation's).
class Checkpoint : public std::enable_shared_from_this<Checkpoint> {
  struct Passkey {};

 public:
  /// Keeps the source open while it lives; create and destroy on the loop thread.
  class Use {
   public:
    /// Counts one more user of `checkpoint`'s source.
    explicit Use(std::shared_ptr<Checkpoint> checkpoint);
    Use(Use&&) noexcept = default;
    Use& operator=(Use&&) = delete;
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    /// The last use of a closed checkpoint lets its source go.
    ~Use();
    /// The source (loop thread only).
    io::CheckpointSource& source() const { return *checkpoint_->source_; }
    /// The checkpoint.
    Checkpoint& checkpoint() const { return *checkpoint_; }

   private:
    std::shared_ptr<Checkpoint> checkpoint_;
  };

  /// Opens `path` (file, directory or index) on the loop; the operation's result is the
  /// Checkpoint. Errors: those of io::CheckpointSource::open.
  static std::shared_ptr<Operation> open(std::string path, OpenOptions options);

  /// Use open(). Takes the opened source.
  Checkpoint(Passkey, std::string path, OpenOptions options, std::unique_ptr<io::CheckpointSource> source);
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;
  /// Lets the source go on the loop thread (see file comment).
  ~Checkpoint();

  /// The path as opened.
  const std::string& path() const noexcept { return path_; }
  /// The catalog (a copy: safe from any thread, also after close()).
  const io::Catalog& catalog() const noexcept { return catalog_; }
  /// The options it was opened with.
  const OpenOptions& options() const noexcept { return options_; }

  /// Loads `specs` as one unit through the engine (engine::async_materialize on the CPU
  /// backend); the result is a list of eredu._native.Tensor in spec order. `verify` as
  /// checksums_to_verify takes it: 1 verifies what has a digest, 2 requires every tensor read
  /// to be verifiable. Errors: those of TensorSet::build and checksums_to_verify before any
  /// read, then the load's (checksum_mismatch among them); cancelled; invalid_argument when
  /// closed.
  std::shared_ptr<Operation> read(std::vector<ReadSpec> specs, int verify = 0);

  /// The staging pool's budget, bytes in use, high-water mark and waiters (zeros once closed).
  pybind11::dict staging();
  /// The digests the checkpoint records (io::Checksums::discover: metadata and sidecar), found
  /// once and kept: the sidecar is read at the first call.
  std::shared_ptr<const io::Checksums> checksums() const;
  /// The digests a load or swap with Python's `verify` checks: none for 0 (verify=False); those
  /// recorded for 1 (verify=None) and 2 (verify=True), which throws Error(invalid_argument)
  /// naming the file and the sidecar looked for when there are none.
  io::Checksums checksums_to_verify(int verify) const;
  /// The VerifyOptions of a load with Python's `verify` (checksums_to_verify's values): off,
  /// on over the digests recorded (off when there are none), or require.
  engine::VerifyOptions verify_options(int verify) const;

  /// Closes: refuses reads started after it, and lets the source go once those started before
  /// it (in flight or queued) have ended.
  void close();
  /// True after close().
  bool closed() const noexcept { return closed_.load(std::memory_order_acquire); }

  /// A use of the source for an operation that starts now; throws Error(invalid_argument)
  /// once closed. Loop thread only.
  Use use();

 private:
  std::string path_;
  OpenOptions options_;
  io::Catalog catalog_;
  std::unique_ptr<cpu::Executor> executor_;
  cpu::StoragePool storage_;
  std::atomic<bool> closed_{false};
  mutable std::mutex checksums_mutex_;
  mutable std::shared_ptr<const io::Checksums> checksums_;  // found by the first checksums()
  int uses_ = 0;                                            // loop thread only
  // Guards source_ being let go against staging(), which reads the pool's thread-safe counters
  // from the caller's thread: the loop may be busy (a test gate can block it inside the reader).
  mutable std::mutex source_mutex_;
  std::unique_ptr<io::CheckpointSource> source_;  // last: destroyed before the executor it may feed

  /// Moves the source out under source_mutex_.
  std::unique_ptr<io::CheckpointSource> take_source();
};

/// (name, dtype, shape, nbytes, file index, offset) of every tensor of `catalog`, in its order:
/// what the package's readers take from any opened source.
pybind11::list tensor_tuples(const io::Catalog& catalog);

/// Registers eredu._native.Checkpoint and eredu._native.open.
void bind_checkpoint(pybind11::module_& m);

}  // namespace eredu::python
