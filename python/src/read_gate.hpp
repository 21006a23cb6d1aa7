#pragma once
/// \file
/// eredu::python::ReadGate: a test hook (eredu._native._ReadGate) that holds reads in flight
/// until a test opens it, so cancellation and Ctrl-C tests are deterministic: "the load is
/// certainly in flight, with reads outstanding, when the cancellation lands".
///
/// It is an io::FaultInjector, consulted as each read request completes. With the pread reader
/// that happens on the reader's worker threads, which block here; the event loop stays free to
/// deliver the cancellation. (With io_uring it would block the loop itself, so the Python layer
/// forces reader="pread" when a gate is given.) While set it also keeps map_resident() from
/// handing out mappings, so every byte goes through the gated reader. It records each read's
/// file, offset and length, so a test can also check which bytes a call read (a gate made open
/// only records): "get_slice reads only the selected bytes" is then a fact about the reader.

#include <pybind11/pybind11.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <tuple>
#include <vector>

#include "eredu/io/reading/read_fault.hpp"

namespace eredu::python {

/// See file comment. Thread-safe.
class ReadGate : public io::FaultInjector {
 public:
  /// One read request as the reader completed it: file index, offset, length.
  using Read = std::tuple<std::uint32_t, std::uint64_t, std::uint64_t>;

  /// A gate that starts closed (holds reads) or open (only records them).
  explicit ReadGate(bool open = false) : open_(open) {}

  /// Blocks the calling reader thread while the gate is closed (it starts closed).
  io::ReadFault on_complete(std::uint32_t file, std::uint64_t offset, std::uint64_t length) override;

  /// Lets every held read and every later one through.
  void open();
  /// Waits until at least `count` reads have arrived, at most `timeout`; true if they did.
  bool wait_arrivals(std::uint64_t count, std::chrono::milliseconds timeout);
  /// Reads that have arrived so far.
  std::uint64_t arrivals() const;
  /// Every read that has arrived, in arrival order.
  std::vector<Read> reads() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool open_ = false;
  std::uint64_t arrivals_ = 0;
  std::vector<Read> reads_;
};

/// Registers eredu._native._ReadGate.
void bind_read_gate(pybind11::module_& m);

}  // namespace eredu::python
