#include "interrupt.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>

#include <fmt/format.h>

namespace eredu::cli {
namespace {

constexpr int handled[] = {SIGINT, SIGTERM, SIGHUP};

// Written by the handler, so lock-free (async-signal-safe) by requirement.
std::atomic<int> arrived{0};
static_assert(std::atomic<int>::is_always_lock_free);
int wake_pipe[2] = {-1, -1};

void restore_default(int signo) noexcept {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(signo, &dfl, nullptr);
}

extern "C" void on_signal(int signo) {
  const int saved_errno = errno;
  int none = 0;
  arrived.compare_exchange_strong(none, signo);
  for (int s : handled) restore_default(s);
  if (wake_pipe[1] >= 0) {
    const char byte = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_pipe[1], &byte, 1);  // full or gone: the flag still says it
  }
  errno = saved_errno;
}

const char* signal_name(int signo) {
  switch (signo) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "a signal";
  }
}

}  // namespace

void install_signal_handlers() noexcept {
  // Above the standard descriptors: a pipe made while stdout or stderr is closed must not
  // become them (main() has reopened closed ones on /dev/null before this).
  if (::pipe2(wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) wake_pipe[0] = wake_pipe[1] = -1;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int s : handled) sigaddset(&sa.sa_mask, s);  // one handler at a time
  // Restarted system calls: the commands poll the flag, and a read or write interrupted
  // half-way (EINTR from a FUSE file, a short write) would be an error of its own.
  sa.sa_flags = SA_RESTART;
  for (int s : handled) {
    // A signal the parent set to be ignored stays ignored: `nohup eredu ...` must survive the
    // hangup, and a background job of a non-interactive shell ignores SIGINT.
    struct sigaction was {};
    if (::sigaction(s, nullptr, &was) == 0 && was.sa_handler == SIG_IGN) continue;
    ::sigaction(s, &sa, nullptr);
  }
  ::signal(SIGPIPE, SIG_IGN);
}

int pending_signal() noexcept { return arrived.load(std::memory_order_relaxed); }

Interrupted::Interrupted(int signo, const std::string& doing)
    : std::runtime_error(fmt::format("interrupted by {} while {}: stopped, and everything it held released",
                                     signal_name(signo), doing)),
      signo_(signo) {}

void throw_if_interrupted(const std::string& doing) {
  if (const int s = pending_signal()) throw Interrupted(s, doing);
}

Interrupt::Interrupt(asio::io_context& ctx) : ctx_(ctx), poll_(ctx) {
  if (wake_pipe[0] >= 0) wake_.emplace(ctx, wake_pipe[0]);
}

Interrupt::~Interrupt() {
  if (wake_) {
    std::error_code ignored;
    wake_->cancel(ignored);
    wake_->release();  // the pipe is the process's, not this command's
  }
}

void Interrupt::arm() {
  if (armed_ || fired_) return;
  armed_ = true;
  if (pending_signal()) {
    // It arrived before the operation was started (while opening, say): act on it as soon
    // as the loop runs, once the operation is listening on its slot.
    asio::post(ctx_, [this] {
      armed_ = false;
      fire();
    });
    return;
  }
  wait();
}

void Interrupt::wait() {
  auto handler = [this](const std::error_code& ec) {
    armed_ = false;
    if (ec) return;  // disarmed
    if (pending_signal()) {
      fire();
    } else {
      armed_ = true;  // a spurious wake-up (another reader of the pipe); wait again
      wait();
    }
  };
  if (wake_) {
    wake_->async_wait(asio::posix::descriptor_base::wait_read, handler);
  } else {
    poll_.expires_after(std::chrono::milliseconds(20));
    poll_.async_wait(handler);
  }
}

void Interrupt::fire() {
  if (fired_) return;
  fired_ = true;
  for (auto& c : cancellations_) c.emit(asio::cancellation_type::terminal);
  for (auto& a : actions_) a();
}

asio::cancellation_slot Interrupt::slot() { return cancellations_.emplace_back().slot(); }

void Interrupt::on_signal(std::function<void()> action) { actions_.push_back(std::move(action)); }

void Interrupt::disarm() {
  if (!armed_) return;
  std::error_code ignored;
  if (wake_) wake_->cancel(ignored);
  poll_.cancel();
}

void Interrupt::check() const { throw_if_interrupted(doing_); }

void Interrupt::rethrow(std::exception_ptr failure) const {
  throw_if_interrupted(doing_);
  if (failure) std::rethrow_exception(failure);
}

}  // namespace eredu::cli
