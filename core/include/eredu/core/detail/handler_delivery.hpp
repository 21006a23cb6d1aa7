#pragma once
/// \file
/// Turning an Asio completion handler into a type-erased, move-only callback that may be
/// invoked from any thread and always runs the handler on the handler's own executor.

#include <asio/associated_allocator.hpp>
#include <asio/associated_executor.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <atomic>
#include <cstddef>
#include <memory>
#include <new>
#include <tuple>
#include <type_traits>
#include <utility>

#include "eredu/core/unique_function.hpp"

namespace eredu::detail {

/// Memory for the one operation a delivery posts, reserved when the handler is wrapped (where
/// a failed allocation is the initiating call's exception). Delivering then allocates
/// nothing: it runs on the thread that completed the work (a TBB worker, a reader's thread),
/// where a std::bad_alloc could only drop the handler — and its coroutine with it. The memory
/// comes from the handler's associated allocator (DeliveryReserveFrom).
class DeliveryReserve {
 public:
  DeliveryReserve(const DeliveryReserve&) = delete;
  DeliveryReserve& operator=(const DeliveryReserve&) = delete;
  virtual ~DeliveryReserve() = default;

  /// More memory, from the same allocator, when the reserve is taken (max_align_t alignment).
  virtual void* allocate_more(std::size_t bytes) = 0;
  /// Gives back what allocate_more(bytes) returned.
  virtual void deallocate_more(void* p, std::size_t bytes) noexcept = 0;

  std::size_t size = 0;           ///< bytes reserved
  void* memory = nullptr;         ///< the reserved bytes (aligned for any scalar type)
  std::atomic<bool> used{false};  ///< handed out and not yet given back

 protected:
  DeliveryReserve() = default;
};

/// A DeliveryReserve whose memory comes from `Alloc` (a handler's associated allocator).
template <class Alloc>
class DeliveryReserveFrom final : public DeliveryReserve {
  using Words = typename std::allocator_traits<Alloc>::template rebind_alloc<std::max_align_t>;
  using Traits = std::allocator_traits<Words>;

 public:
  /// Reserves `bytes` from `allocator`.
  DeliveryReserveFrom(std::size_t bytes, const Alloc& allocator) : words_(allocator), count_(words_for(bytes)) {
    memory = Traits::allocate(words_, count_);
    size = count_ * sizeof(std::max_align_t);
  }
  ~DeliveryReserveFrom() override { Traits::deallocate(words_, static_cast<std::max_align_t*>(memory), count_); }

  void* allocate_more(std::size_t bytes) override { return Traits::allocate(words_, words_for(bytes)); }
  void deallocate_more(void* p, std::size_t bytes) noexcept override {
    Traits::deallocate(words_, static_cast<std::max_align_t*>(p), words_for(bytes));
  }

 private:
  static std::size_t words_for(std::size_t bytes) {
    return (bytes + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t);
  }
  Words words_;
  std::size_t count_;
};

/// The allocator of a delivery's posted operation: the reserve when it fits and is free,
/// else more from the reserve's allocator (the heap for over-aligned types).
template <class T>
class DeliveryAllocator {
 public:
  /// The allocated type.
  using value_type = T;

  /// An allocator drawing on `reserve`.
  explicit DeliveryAllocator(std::shared_ptr<DeliveryReserve> reserve) noexcept : reserve_(std::move(reserve)) {}
  /// The same reserve, for another type.
  template <class U>
  DeliveryAllocator(const DeliveryAllocator<U>& other) noexcept : reserve_(other.reserve()) {}

  /// Storage for `n` objects of T.
  T* allocate(std::size_t n) {
    const std::size_t bytes = n * sizeof(T);
    if (reserve_ && ordinary) {
      if (bytes <= reserve_->size && !reserve_->used.exchange(true, std::memory_order_acquire))
        return static_cast<T*>(reserve_->memory);
      return static_cast<T*>(reserve_->allocate_more(bytes));
    }
    return std::allocator<T>().allocate(n);
  }
  /// Gives back what allocate() returned.
  void deallocate(T* p, std::size_t n) noexcept {
    if (reserve_ && ordinary) {
      if (p == reserve_->memory)
        reserve_->used.store(false, std::memory_order_release);
      else
        reserve_->deallocate_more(p, n * sizeof(T));
      return;
    }
    std::allocator<T>().deallocate(p, n);
  }
  /// The reserve drawn on.
  const std::shared_ptr<DeliveryReserve>& reserve() const noexcept { return reserve_; }

  /// Allocators of one reserve are interchangeable.
  friend bool operator==(const DeliveryAllocator& a, const DeliveryAllocator& b) noexcept {
    return a.reserve_ == b.reserve_;
  }

 private:
  // Aligned as the reserve's words are: anything more aligned comes from the heap.
  static constexpr bool ordinary = alignof(T) <= alignof(std::max_align_t);
  std::shared_ptr<DeliveryReserve> reserve_;
};

/// The function a delivery posts: the handler with its arguments, allocated from the
/// delivery's reserve (see DeliveryReserve).
template <class Handler, class Work, class... Args>
struct DeliveryCall {
  /// What asio allocates the posted operation with.
  using allocator_type = DeliveryAllocator<std::byte>;

  Handler handler;           ///< the wrapped handler
  Work work;                 ///< keeps the handler's executor's context alive
  std::tuple<Args...> args;  ///< the result delivered
  allocator_type allocator;  ///< draws on the reserve

  /// asio's associated allocator.
  allocator_type get_allocator() const noexcept { return allocator; }
  /// Runs the handler (on its executor: asio calls this there).
  void operator()() { std::apply(handler, std::move(args)); }
};

/// Posts `call` to `ex`. When `ex` is an io_context's executor (wrapped in an
/// any_io_executor, as a coroutine's is), the posted operation is allocated with the call's
/// allocator — the reserve; the type-erased path would allocate its own wrappers.
template <class Executor, class Call>
void post_delivery(const Executor& ex, Call call) {
  if constexpr (std::is_same_v<Executor, asio::any_io_executor>) {
    using plain = asio::io_context::executor_type;
    using tracked = decltype(asio::prefer(std::declval<plain>(), asio::execution::outstanding_work.tracked));
    if (const auto* io = ex.template target<plain>()) return void(asio::post(*io, std::move(call)));
    if (const auto* io = ex.template target<tracked>()) return void(asio::post(*io, std::move(call)));
  }
  asio::post(ex, std::move(call));
}

/// Wraps `handler` so that calling the result with Args posts the handler, with those
/// arguments, to its associated executor (or `fallback` when it has none). A work guard
/// keeps that executor's context alive until then. Never runs the handler inline, so a
/// reaping loop or a releasing destructor never resumes a coroutine in the middle of its
/// own work. Memory for the post is reserved here (see DeliveryReserve); it, and the
/// wrapper, come from the handler's associated allocator.
template <class... Args, class Handler, class Executor>
UniqueFunction<void(Args...)> deliver_on_handler_executor(Handler handler, const Executor& fallback) {
  auto ex = asio::get_associated_executor(handler, fallback);
  auto allocator = asio::get_associated_allocator(handler);
  auto work = asio::make_work_guard(ex);
  using Call = DeliveryCall<Handler, decltype(work), std::decay_t<Args>...>;
  // The operation asio builds around the call: its bookkeeping, the call, a copy of the
  // allocator. A larger one (another asio) takes more from the allocator.
  std::shared_ptr<DeliveryReserve> reserve =
      std::allocate_shared<DeliveryReserveFrom<decltype(allocator)>>(allocator, sizeof(Call) + 128, allocator);
  return UniqueFunction<void(Args...)>(
      std::allocator_arg, allocator,
      [h = std::move(handler), w = std::move(work), r = std::move(reserve)](Args... args) mutable {
        auto ex2 = w.get_executor();
        post_delivery(ex2, Call{std::move(h), std::move(w), std::make_tuple(std::forward<Args>(args)...),
                                DeliveryAllocator<std::byte>(std::move(r))});
      });
}

}  // namespace eredu::detail
