#pragma once
/// \file
/// A move-only std::function (C++23's std::move_only_function is not in C++20), so that
/// completion handlers, which are often move-only, can be stored type-erased.

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
  /// Wraps any callable invocable as R(Args...).
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, UniqueFunction>>>
  UniqueFunction(F&& f) : impl_(std::make_unique<Model<std::decay_t<F>>>(std::forward<F>(f))) {}
  UniqueFunction(UniqueFunction&&) noexcept = default;
  UniqueFunction& operator=(UniqueFunction&&) noexcept = default;

  /// True when a callable is held.
  explicit operator bool() const noexcept { return impl_ != nullptr; }
  /// Invokes the held callable.
  R operator()(Args... args) { return impl_->call(std::forward<Args>(args)...); }

 private:
  struct Concept {
    virtual ~Concept() = default;
    virtual R call(Args&&... args) = 0;
  };
  template <class F>
  struct Model final : Concept {
    explicit Model(F&& f) : fn(std::move(f)) {}
    explicit Model(const F& f) : fn(f) {}
    R call(Args&&... args) override { return fn(std::forward<Args>(args)...); }
    F fn;
  };
  std::unique_ptr<Concept> impl_;
};

}  // namespace eredu
