#pragma once
/// \file
/// A move-only std::function (C++23's std::move_only_function is not in C++20), so that
/// completion handlers, which are often move-only, can be stored type-erased. It can take its
/// memory from an allocator (std::allocator_arg), so that a wrapped Asio handler's associated
/// allocator is honoured.

#include <memory>
#include <type_traits>
#include <utility>

namespace eredu {

template <class Signature>
class UniqueFunction;

/// Move-only type-erased callable with signature R(Args...).
template <class R, class... Args>
class UniqueFunction<R(Args...)> {
 public:
  UniqueFunction() noexcept = default;
  /// Wraps any callable invocable as R(Args...), in memory from the heap.
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, UniqueFunction>>>
  UniqueFunction(F&& f) : UniqueFunction(std::allocator_arg, std::allocator<void>(), std::forward<F>(f)) {}
  /// Wraps any callable invocable as R(Args...), in memory from `allocator` (rebound).
  template <class Alloc, class F>
  UniqueFunction(std::allocator_arg_t, const Alloc& allocator, F&& f)
      : impl_(make<std::decay_t<F>>(allocator, std::forward<F>(f))) {}
  UniqueFunction(UniqueFunction&&) noexcept = default;
  UniqueFunction& operator=(UniqueFunction&&) noexcept = default;

  /// True when a callable is held.
  explicit operator bool() const noexcept { return impl_ != nullptr; }
  /// Invokes the held callable.
  R operator()(Args... args) { return impl_->call(std::forward<Args>(args)...); }

 private:
  struct Concept {
    virtual R call(Args&&... args) = 0;
    // Destroys and frees itself, with the allocator it was made with.
    virtual void destroy() noexcept = 0;

   protected:
    ~Concept() = default;
  };
  template <class F, class Alloc>
  struct Model final : Concept {
    using Self = typename std::allocator_traits<Alloc>::template rebind_alloc<Model>;
    template <class G>
    Model(const Alloc& a, G&& g) : allocator(a), fn(std::forward<G>(g)) {}
    R call(Args&&... args) override { return fn(std::forward<Args>(args)...); }
    void destroy() noexcept override {
      Self a(allocator);  // a copy: the member goes with the object
      std::allocator_traits<Self>::destroy(a, this);
      std::allocator_traits<Self>::deallocate(a, this, 1);
    }
    Alloc allocator;
    F fn;
  };
  struct Destroy {
    void operator()(Concept* c) const noexcept { c->destroy(); }
  };

  template <class F, class Alloc, class G>
  static Concept* make(const Alloc& allocator, G&& g) {
    using M = Model<F, Alloc>;
    typename M::Self a(allocator);
    M* p = std::allocator_traits<typename M::Self>::allocate(a, 1);
    try {
      std::allocator_traits<typename M::Self>::construct(a, p, allocator, std::forward<G>(g));
    } catch (...) {
      std::allocator_traits<typename M::Self>::deallocate(a, p, 1);
      throw;
    }
    return p;
  }

  std::unique_ptr<Concept, Destroy> impl_;
};

}  // namespace eredu
