#pragma once
// SIGINT, SIGTERM and SIGHUP at any moment of a command: main() installs one handler for the
// whole process before it parses anything, so no signal ever takes the default action while
// the command holds temporary files or a half-written checkpoint. The handler only records
// the signal (an atomic) and wakes the command's event loop (a self-pipe); the command turns
// it into a terminal cancellation of its operations (the library's own cancellation path),
// so that every lease, temporary file and thread is released as on any failure. Blocking
// phases (writing, hashing, copying) poll it between steps. The command then says what was
// interrupted and exits 128 + the signal's number: 130, 143 or 129. A second signal takes
// the default action (the handler restores it): a user who presses ^C twice means it.
//
// A signal that arrives once the command has its result (it is printing it, or returning)
// does not change the exit status: the work it would have stopped is done.

#include <asio/cancellation_signal.hpp>
#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <functional>
#include <list>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace eredu::cli {

/// Installs the process's handler for SIGINT, SIGTERM and SIGHUP, except for those the parent
/// set to be ignored (nohup), which stay ignored (see the file comment), and
/// ignores SIGPIPE, so that a closed pipe fails a write (EPIPE) the command reports instead of
/// killing it silently. Call first in main(); never throws (without a self-pipe, the commands
/// poll for the signal instead).
void install_signal_handlers() noexcept;

/// The first of SIGINT, SIGTERM or SIGHUP that arrived since install_signal_handlers(), or 0.
int pending_signal() noexcept;

/// Thrown by Interrupt::check() and rethrown for a cancellation a signal caused; main()
/// reports it and exits with exit_code().
class Interrupted : public std::runtime_error {
 public:
  /// `signo` arrived while `doing` ("loading model.safetensors").
  Interrupted(int signo, const std::string& doing);
  /// The signal.
  int signo() const noexcept { return signo_; }
  /// 128 + the signal number: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP.
  int exit_code() const noexcept { return 128 + signo_; }

 private:
  int signo_;
};

/// Throws Interrupted if a signal arrived: for blocking phases between their steps.
void throw_if_interrupted(const std::string& doing);

/// A command's view of the signals (see the file comment). Lives as long as the command's
/// io_context runs.
class Interrupt {
 public:
  /// Watches for a signal on `ctx` while armed.
  explicit Interrupt(asio::io_context& ctx);
  ~Interrupt();
  Interrupt(const Interrupt&) = delete;
  Interrupt& operator=(const Interrupt&) = delete;

  /// A new cancellation slot that a signal cancels (terminal); bind one operation to it.
  asio::cancellation_slot slot();
  /// Runs `action` on the event loop when a signal arrives (stop a timer, close a pipeline,
  /// tell clients to stop).
  void on_signal(std::function<void()> action);
  /// What the command is doing now, for the message.
  void doing(std::string what) { doing_ = std::move(what); }
  /// What the command is doing now.
  const std::string& doing() const noexcept { return doing_; }
  /// The signal that arrived, or 0.
  int signal() const noexcept { return pending_signal(); }
  /// Waits for a signal on the context while the command's operation runs; call before
  /// `ctx.run()`. A signal that arrived before is acted on as soon as the loop runs.
  void arm();
  /// Stops waiting, so that `ctx.run()` can return; call from the operation's completion.
  void disarm();
  /// Throws Interrupted if a signal arrived (between blocking steps).
  void check() const;
  /// Throws Interrupted if a signal arrived; else rethrows `failure` if set.
  void rethrow(std::exception_ptr failure) const;

 private:
  void wait();
  void fire();

  asio::io_context& ctx_;
  std::optional<asio::posix::stream_descriptor> wake_;  // the self-pipe's read end (not owned)
  asio::steady_timer poll_;                             // without a self-pipe: polls the flag
  std::list<asio::cancellation_signal> cancellations_;  // std::list: slots point into them
  std::vector<std::function<void()>> actions_;
  std::string doing_ = "working";
  bool armed_ = false;
  bool fired_ = false;
};

}  // namespace eredu::cli
