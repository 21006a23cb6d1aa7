#include "eredu/core/completion.hpp"

#include <condition_variable>
#include <mutex>
#include <new>
#include <vector>

#include "eredu/core/error.hpp"
#include "eredu/core/log.hpp"

namespace eredu {
namespace {

std::exception_ptr build(errc kind, const char* detail) noexcept {
  try {
    return std::make_exception_ptr(Error(kind, {}, detail));
  } catch (...) {
    return {};
  }
}

// Failures reported where memory may have run out (a destructor, a completing TBB worker):
// built once, while memory is plentiful, and shared (an exception object may be rethrown on
// several threads at once), so that saying what happened never needs an allocation.
struct Prebuilt {
  std::exception_ptr out_of_memory =
      build(errc::out_of_memory, "out of memory (std::bad_alloc): an allocation the work needed failed");
  std::exception_ptr destroyed = build(errc::cancelled, "producer destroyed before completing its work");
  std::exception_ptr replaced = build(errc::cancelled, "completion source replaced before it completed");
};

const Prebuilt& prebuilt() noexcept {
  static const Prebuilt errors;
  return errors;
}

// At load time, not at the first failure: by then there may be no memory to build them.
[[maybe_unused]] const Prebuilt& prebuilt_at_load = prebuilt();

// A fresh error when memory allows (each carries its own message), else the prebuilt one.
std::exception_ptr cancelled_error(const char* detail, const std::exception_ptr& fallback) noexcept {
  if (std::exception_ptr fresh = build(errc::cancelled, detail)) return fresh;
  return fallback;
}

}  // namespace

std::exception_ptr out_of_memory_error() noexcept {
  if (const auto& oom = prebuilt().out_of_memory) return oom;
  // Only if even the process's start had no memory for it: the exception says as much.
  return std::make_exception_ptr(std::bad_alloc());
}

std::exception_ptr typed_failure(std::exception_ptr error) noexcept {
  if (!error) return error;
  try {
    std::rethrow_exception(error);
  } catch (const std::bad_alloc&) {
    return out_of_memory_error();
  } catch (...) {}
  return error;
}

namespace detail {

struct CompletionState {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  std::vector<UniqueFunction<void(std::exception_ptr)>> callbacks;
};

}  // namespace detail

Completion Completion::ready_now() {
  CompletionSource source;
  source.complete();
  return source.completion();
}

Completion Completion::failed(std::exception_ptr error) {
  CompletionSource source;
  source.fail(std::move(error));
  return source.completion();
}

bool Completion::ready() const noexcept {
  std::lock_guard lock(state_->mutex);
  return state_->done;
}

std::exception_ptr Completion::error() const noexcept {
  std::lock_guard lock(state_->mutex);
  return state_->done ? state_->error : nullptr;
}

void Completion::wait() const {
  std::unique_lock lock(state_->mutex);
  state_->cv.wait(lock, [&] { return state_->done; });
}

void Completion::get() const {
  wait();
  if (auto e = error()) std::rethrow_exception(e);
}

void Completion::on_complete(UniqueFunction<void(std::exception_ptr)> fn) const {
  std::unique_lock lock(state_->mutex);
  if (!state_->done) {
    state_->callbacks.push_back(std::move(fn));
    return;
  }
  auto error = state_->error;
  lock.unlock();
  fn(std::move(error));
}

CompletionSource::CompletionSource() : state_(std::make_shared<detail::CompletionState>()) {}

namespace {

/// Says that a callback failed; says nothing when even that cannot be allocated.
void report_lost_callback(const std::exception_ptr& error) noexcept {
  try {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      log::warn("a completion callback failed and was dropped: {}", e.what());
    } catch (...) {
      log::warn("a completion callback failed with an unknown exception and was dropped");
    }
  } catch (...) {}
}

/// True when `state` is set and not yet complete: only then is there anyone to tell.
bool pending(const std::shared_ptr<detail::CompletionState>& state) {
  if (!state) return false;
  std::lock_guard lock(state->mutex);
  return !state->done;
}

}  // namespace

CompletionSource& CompletionSource::operator=(CompletionSource&& other) noexcept {
  if (this != &other) {
    if (pending(state_)) fail(cancelled_error("completion source replaced before it completed", prebuilt().replaced));
    state_ = std::move(other.state_);
  }
  return *this;
}

CompletionSource::~CompletionSource() {
  // Building the error only when it is needed keeps this destructor trivial for completed
  // sources, which may be destroyed by a TBB worker while the process exits.
  if (pending(state_)) fail(cancelled_error("producer destroyed before completing its work", prebuilt().destroyed));
}

void CompletionSource::finish(std::exception_ptr error) noexcept {
  if (!state_) return;
  std::vector<UniqueFunction<void(std::exception_ptr)>> callbacks;
  {
    std::lock_guard lock(state_->mutex);
    if (state_->done) return;
    state_->done = true;
    state_->error = error;
    callbacks.swap(state_->callbacks);
  }
  state_->cv.notify_all();
  // Callbacks run outside the lock: one may register another callback or query this state.
  // This runs on whatever thread completed the work (a TBB worker, a reader's thread), where
  // an escaping exception would terminate the process: a callback that throws (most likely
  // std::bad_alloc under a memory limit) loses only what it was doing, and each callback is
  // destroyed here, so the completion sources it held fail their own completions.
  for (auto& cb : callbacks) {
    try {
      cb(error);
    } catch (...) {
      report_lost_callback(std::current_exception());
    }
  }
}

namespace {

struct JoinState {
  std::mutex mutex;
  std::size_t remaining = 0;
  std::vector<std::exception_ptr> errors;
  CompletionSource source;
};

}  // namespace

Completion when_all(std::span<const Completion> completions) {
  if (completions.empty()) return Completion::ready_now();
  auto join = std::make_shared<JoinState>();
  join->remaining = completions.size();
  join->errors.resize(completions.size());
  Completion result = join->source.completion();
  for (std::size_t i = 0; i < completions.size(); ++i) {
    completions[i].on_complete([join, i](std::exception_ptr e) {
      std::unique_lock lock(join->mutex);
      join->errors[i] = std::move(e);
      if (--join->remaining != 0) return;
      std::exception_ptr first, root;
      for (auto& err : join->errors) {
        if (!err) continue;
        if (!first) first = err;
        if (!root && !is_cancellation(err)) root = err;
      }
      lock.unlock();
      join->source.finish(root ? root : first);
    });
  }
  return result;
}

}  // namespace eredu
