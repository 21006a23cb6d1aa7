#pragma once
// A module for tests over any backend: a list of named slots of the backend's parameter type,
// declared at run time and visited in declaration order. It works with every parameter type
// that has `dtype` and `shape` fields and a (DType, Shape) constructor (cpu::Parameter,
// cuda::Parameter, FakeParameter).

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "eredu/core/dtype.hpp"
#include "eredu/core/shape.hpp"
#include "eredu/engine/description/parameterized.hpp"

namespace eredu::test {

/// One slot of a SlotModule: its local name, and the dtype and shape it accepts.
struct SlotDeclaration {
  std::string name;  ///< local name ("attn.qkv.weight"); the visitors add the prefix
  DType dtype{};     ///< dtype the slot accepts
  Shape shape;       ///< shape the slot accepts
};

/// A Parameterized module of slots of type P (see file comment).
template <class P>
class SlotModule {
 public:
  /// A module with one unbound slot per declaration.
  explicit SlotModule(const std::vector<SlotDeclaration>& slots) {
    for (const SlotDeclaration& d : slots) slots_.push_back({d.name, P(d.dtype, d.shape)});
  }

  /// The slot called `name` (local name); throws std::out_of_range when there is none.
  P& slot(std::string_view name) { return find(*this, name); }
  /// The slot called `name` (local name); throws std::out_of_range when there is none.
  const P& slot(std::string_view name) const { return find(*this, name); }
  /// Number of slots.
  std::size_t size() const noexcept { return slots_.size(); }
  /// Calls `fn(name, slot)` for every slot, in declaration order.
  template <class Fn>
  void for_each(Fn&& fn) const {
    for (const Entry& e : slots_) fn(e.name, e.parameter);
  }

  /// The const traversal (engine::Parameterized).
  void visit_parameters(engine::ParameterVisitor<P>& v, const std::string& prefix) const {
    for (const Entry& e : slots_)
      v.visit({engine::ParameterId(engine::join_name(prefix, e.name)), e.parameter.dtype, e.parameter.shape},
              e.parameter);
  }
  /// The mutable traversal (engine::Parameterized).
  void visit_parameters_mut(engine::ParameterVisitorMut<P>& v, const std::string& prefix) {
    for (Entry& e : slots_)
      v.visit_mut({engine::ParameterId(engine::join_name(prefix, e.name)), e.parameter.dtype, e.parameter.shape},
                  e.parameter);
  }

 private:
  struct Entry {
    std::string name;
    P parameter;
  };
  template <class Self>
  static auto& find(Self& self, std::string_view name) {
    for (auto& e : self.slots_)
      if (e.name == name) return e.parameter;
    throw std::out_of_range("no slot " + std::string(name));
  }
  std::vector<Entry> slots_;
};

}  // namespace eredu::test
