#pragma once
// SIGINT and SIGTERM during a command: caught on the command's io_context and turned into
// a terminal cancellation of its operations (the library's own cancellation path), so that
// every lease, temporary file and thread is released as on any failure; the command then
// says what was interrupted and exits 130 (SIGINT) or 143 (SIGTERM). A second signal ends
// the process at once (the default action is back after the first).

#include <asio/cancellation_signal.hpp>
#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>
#include <csignal>
#include <functional>
#include <list>
#include <stdexcept>
#include <string>
#include <vector>

namespace eredu::cli {

/// Thrown by Interrupt::check() and rethrown for a cancellation a signal caused; main()
/// reports it and exits with exit_code().
class Interrupted : public std::runtime_error {
 public:
  /// `signo` arrived while `doing` ("loading model.safetensors").
  Interrupted(int signo, const std::string& doing);
  /// The signal.
  int signo() const noexcept { return signo_; }
  /// 128 + the signal number: 130 for SIGINT, 143 for SIGTERM.
  int exit_code() const noexcept { return 128 + signo_; }

 private:
  int signo_;
};

/// See the file comment. Lives as long as the command's io_context runs.
class Interrupt {
 public:
  /// Catches SIGINT and SIGTERM from now on (a signal arriving while not armed is kept
  /// for the next arm()).
  explicit Interrupt(asio::io_context& ctx);
  Interrupt(const Interrupt&) = delete;
  Interrupt& operator=(const Interrupt&) = delete;

  /// A new cancellation slot that a signal cancels (terminal); bind one operation to it.
  asio::cancellation_slot slot();
  /// Runs `action` when a signal arrives (stop a timer, tell clients to stop).
  void on_signal(std::function<void()> action);
  /// What the command is doing now, for the message.
  void doing(std::string what) { doing_ = std::move(what); }
  /// The signal that arrived, or 0.
  int signal() const noexcept { return signo_; }
  /// Waits for a signal on the context while the command's operation runs; call before
  /// `ctx.run()`.
  void arm();
  /// Stops waiting, so that `ctx.run()` can return; call from the operation's completion.
  void disarm();
  /// Runs the handlers already due on the context (a signal that arrived during blocking
  /// work), then throws Interrupted if a signal arrived.
  void check();
  /// Throws Interrupted if a signal arrived; else rethrows `failure` if set.
  void rethrow(std::exception_ptr failure) const;

 private:
  asio::io_context& ctx_;
  asio::signal_set signals_;
  std::list<asio::cancellation_signal> cancellations_;  // std::list: slots point into them
  std::vector<std::function<void()>> actions_;
  std::string doing_ = "working";
  int signo_ = 0;
  bool armed_ = false;
};

}  // namespace eredu::cli
