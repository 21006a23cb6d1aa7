#include "eredu/io/mapping/guarded_read.hpp"

#include <pthread.h>

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

// The handler eredu's replaced: faults outside guarded regions go to it. Written only under
// install_mutex, before eredu's handler is (re)installed, so the handler reads a stable value.
struct sigaction previous {};
std::mutex install_mutex;
// The frame of this handler while it passes a fault on to `previous`: an application
// handler that itself chains to the handler it replaced (eredu's) would otherwise bounce the
// fault back forever. A handler entered in a frame deeper than this one is such a bounce.
// (A handler that jumps out of the chain leaves a stale frame behind; the next fault's
// handler frame is then at the same place or higher, not deeper, so it is not mistaken.)
thread_local const void* chaining_frame = nullptr;

void on_sigbus(int sig, siginfo_t* info, void* context);

void default_action(int sig) {
  // Back to the default action; returning re-executes the access, which then kills the
  // process with the signal it would have died of.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
}

void on_sigbus(int sig, siginfo_t* info, void* context) {
  Guard* g = active;
  const auto* at = static_cast<const std::byte*>(info->si_addr);
  if (g && at >= g->begin && at < g->end) {
    last_fault = at;
    // SA_NODEFER left SIGBUS unblocked (guarded_read unblocks it after the jump, should a
    // wrapper around this handler have blocked it).
    siglongjmp(g->resume, 1);
  }
  // Not a guarded read: behave as if this handler were not there.
  const void* frame = __builtin_frame_address(0);
  if (chaining_frame && frame < chaining_frame) {
    default_action(sig);
    return;
  }
  chaining_frame = frame;
  if (previous.sa_flags & SA_SIGINFO) {
    if (previous.sa_sigaction && previous.sa_sigaction != on_sigbus) {
      previous.sa_sigaction(sig, info, context);
    } else {
      default_action(sig);
    }
  } else if (previous.sa_handler == SIG_DFL || previous.sa_handler == SIG_IGN) {
    default_action(sig);  // SIG_IGN cannot ignore a fault: the access would repeat forever
  } else {
    previous.sa_handler(sig);
  }
  chaining_frame = nullptr;
}

// Installs eredu's handler, chaining to whatever is installed now. Called by every
// guarded_read: an application that installed its own SIGBUS handler after eredu's gets
// eredu's back in front of it (chaining to the application's) at the next guarded read.
void install_handler() {
  struct sigaction current {};
  sigaction(SIGBUS, nullptr, &current);
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigbus) return;
  std::lock_guard lock(install_mutex);
  sigaction(SIGBUS, nullptr, &current);
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigbus) return;
  previous = current;
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, nullptr);
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
    // SA_NODEFER kept SIGBUS unblocked in our handler, but a wrapper that runs it (a
    // sanitizer's, another library's chain) may have blocked it; blocked, the thread's next
    // SIGBUS would kill the process. One syscall on the fault path, none on the fast path.
    sigset_t bus;
    sigemptyset(&bus);
    sigaddset(&bus, SIGBUS);
    pthread_sigmask(SIG_UNBLOCK, &bus, nullptr);
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
