#include "interrupt.hpp"

#include <cstring>

#include <fmt/format.h>

namespace eredu::cli {

Interrupted::Interrupted(int signo, const std::string& doing)
    : std::runtime_error(fmt::format("interrupted by {} while {}: stopped, and everything it held released",
                                     signo == SIGINT    ? "SIGINT"
                                     : signo == SIGTERM ? "SIGTERM"
                                                        : strsignal(signo),
                                     doing)),
      signo_(signo) {}

Interrupt::Interrupt(asio::io_context& ctx) : ctx_(ctx), signals_(ctx, SIGINT, SIGTERM) {}

void Interrupt::arm() {
  if (armed_ || signo_) return;
  armed_ = true;
  signals_.async_wait([this](const std::error_code& ec, int signo) {
    armed_ = false;
    if (ec) return;
    signo_ = signo;
    // The next signal takes the default action: a user who presses ^C twice means it.
    std::error_code ignored;
    signals_.clear(ignored);
    for (auto& c : cancellations_) c.emit(asio::cancellation_type::terminal);
    for (auto& a : actions_) a();
  });
}

asio::cancellation_slot Interrupt::slot() { return cancellations_.emplace_back().slot(); }

void Interrupt::on_signal(std::function<void()> action) { actions_.push_back(std::move(action)); }

void Interrupt::disarm() {
  std::error_code ignored;
  if (armed_) signals_.cancel(ignored);
}

void Interrupt::check() {
  arm();
  ctx_.restart();
  ctx_.poll();  // delivers a signal that arrived during blocking work
  disarm();
  ctx_.restart();
  ctx_.poll();     // runs the cancelled wait's handler
  ctx_.restart();  // poll() leaves the context stopped: the command's run() must work
  if (signo_) throw Interrupted(signo_, doing_);
}

void Interrupt::rethrow(std::exception_ptr failure) const {
  if (signo_) throw Interrupted(signo_, doing_);
  if (failure) std::rethrow_exception(failure);
}

}  // namespace eredu::cli
