#include "eredu/io/guarded_read.hpp"

#include <csetjmp>
#include <csignal>
#include <mutex>

namespace eredu::io {
namespace {

/// One active guarded_read on this thread: lives in its stack frame.
struct Guard {
  sigjmp_buf resume;
  const std::byte* begin = nullptr;
  const std::byte* end = nullptr;
};

// Static TLS, touched by guarded_read before any fault can happen, so the handler reads it
// without allocating.
thread_local Guard* active = nullptr;
// The faulting address, kept here rather than in the Guard: an automatic object written
// between sigsetjmp and siglongjmp has no reliable value after the jump.
thread_local const std::byte* last_fault = nullptr;

struct sigaction previous {};

void on_sigbus(int sig, siginfo_t* info, void* context) {
  Guard* g = active;
  const auto* at = static_cast<const std::byte*>(info->si_addr);
  if (g && at >= g->begin && at < g->end) {
    last_fault = at;
    // SA_NODEFER left SIGBUS unblocked, so the mask needs no restoring.
    siglongjmp(g->resume, 1);
  }
  // Not a guarded read: behave as if this handler were not there.
  if (previous.sa_flags & SA_SIGINFO) {
    if (previous.sa_sigaction) previous.sa_sigaction(sig, info, context);
    return;
  }
  if (previous.sa_handler == SIG_DFL || previous.sa_handler == SIG_IGN) {
    // Back to the default action; returning re-executes the access, which then kills the
    // process with the signal it would have died of.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGBUS, &dfl, nullptr);
    return;
  }
  previous.sa_handler(sig);
}

void install_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &previous);
  });
}

}  // namespace

std::optional<MappingFault> guarded_read(std::span<const std::byte> region, void (*access)(void*), void* context) {
  install_handler();
  Guard guard;
  guard.begin = region.data();
  guard.end = region.data() + region.size();
  Guard* const outer = active;
  if (sigsetjmp(guard.resume, 0) != 0) {
    active = outer;
    return MappingFault{last_fault};
  }
  active = &guard;
  try {
    access(context);
  } catch (...) {
    active = outer;
    throw;
  }
  active = outer;
  return std::nullopt;
}

}  // namespace eredu::io
