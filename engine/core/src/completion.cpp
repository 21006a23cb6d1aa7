#include "eredu/core/completion.hpp"

#include <condition_variable>
#include <mutex>
#include <vector>

#include "eredu/core/error.hpp"

namespace eredu {
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

/// True when `state` is set and not yet complete: only then is there anyone to tell.
bool pending(const std::shared_ptr<detail::CompletionState>& state) {
  if (!state) return false;
  std::lock_guard lock(state->mutex);
  return !state->done;
}

}  // namespace

CompletionSource& CompletionSource::operator=(CompletionSource&& other) noexcept {
  if (this != &other) {
    if (pending(state_))
      fail(std::make_exception_ptr(Error(errc::cancelled, {}, "completion source replaced before it completed")));
    state_ = std::move(other.state_);
  }
  return *this;
}

CompletionSource::~CompletionSource() {
  // Building the error only when it is needed keeps this destructor trivial for completed
  // sources, which may be destroyed by a TBB worker while the process exits.
  if (pending(state_))
    fail(std::make_exception_ptr(Error(errc::cancelled, {}, "producer destroyed before completing its work")));
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
  for (auto& cb : callbacks) cb(error);
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
