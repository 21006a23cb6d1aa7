// Parameter identity (ParameterId) and Parameterized modules with const and mutable visitors.

#include "eredu/engine/description/parameter_id.hpp"
#include "eredu/engine/description/parameter_metadata.hpp"
#include "eredu/engine/description/parameterized.hpp"

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "eredu/core/error.hpp"
#include "eredu/engine/orchestration/engine_error.hpp"

using namespace eredu;
using namespace eredu::engine;

namespace {

void require_invalid(const std::string& name, const std::string& why_fragment) {
  INFO("name: " << name);
  CHECK_FALSE(ParameterId::parse(name).has_value());
  const std::string why = ParameterId::check(name);
  CHECK_THAT(why, Catch::Contains(why_fragment));
  try {
    ParameterId id(name);
    FAIL("accepted an invalid name");
  } catch (const DeclarationError& e) {
    CHECK(e.kind() == errc::invalid_parameter_id);
    CHECK(e.family() == error_family::declaration);
    CHECK_THAT(e.what(), Catch::Contains(why_fragment));
  }
}

}  // namespace

TEST_CASE("parameter id – accepts dotted names of [A-Za-z0-9_-] segments", "[engine][parameter]") {
  for (const char* name :
       {"w", "layers.3.attn.qkv.weight", "model.embed_tokens.weight", "a-b.C_9.0", "0", "lm_head", "x.y.z.w.v.u"}) {
    INFO(name);
    CHECK(ParameterId::check(name).empty());
    auto parsed = ParameterId::parse(name);
    REQUIRE(parsed.has_value());
    CHECK(parsed->str() == name);
    CHECK(ParameterId(name).str() == name);
  }
  CHECK(ParameterId::check(std::string(ParameterId::max_length, 'a')).empty());
}

TEST_CASE("parameter id – each rule rejects its kind of name, saying why", "[engine][parameter]") {
  require_invalid("", "empty");
  require_invalid(".a", "starts with '.'");
  require_invalid("a.", "ends with '.'");
  require_invalid("a..b", "empty segment");
  require_invalid(".", "starts with '.'");
  require_invalid("a.b c", "' ' at byte 3");
  require_invalid("a/b", "'/' at byte 1");
  require_invalid("layers[0]", "'[' at byte 6");
  require_invalid(std::string("a\0b", 3), "byte 0x00 at byte 1");
  require_invalid("caf\xc3\xa9", "byte 0xc3 at byte 3");
  require_invalid(std::string(ParameterId::max_length + 1, 'a'), "1025 bytes long, more than the limit of 1024");
}

TEST_CASE("parameter id – the error names the rejected name, escaped and shortened", "[engine][parameter]") {
  try {
    ParameterId id("bad..name");
    FAIL("accepted");
  } catch (const DeclarationError& e) {
    CHECK(e.context().parameter == "bad..name");
    CHECK_THAT(e.what(), Catch::StartsWith("parameter 'bad..name': invalid parameter identity"));
  }
  try {
    ParameterId id(std::string(2000, 'x'));
    FAIL("accepted");
  } catch (const DeclarationError& e) {
    CHECK_THAT(e.what(), Catch::Contains("... (2000 bytes)"));
    CHECK(std::string(e.what()).size() < 300);
  }
  try {
    ParameterId id("a\nb");
    FAIL("accepted");
  } catch (const DeclarationError& e) {
    CHECK(e.context().parameter == "a\\x0ab");
  }
}

TEST_CASE("parameter id – orders and compares like its name", "[engine][parameter]") {
  const ParameterId a("layers.1.w"), b("layers.10.w"), c("layers.2.w");
  CHECK(a < b);
  CHECK(b < c);  // lexicographic, as the names: stable and documented
  CHECK(a == ParameterId("layers.1.w"));
  CHECK(a != b);
  std::set<ParameterId> sorted{c, a, b};
  std::vector<std::string> names;
  for (const auto& id : sorted) names.push_back(id.str());
  CHECK(names == std::vector<std::string>{"layers.1.w", "layers.10.w", "layers.2.w"});
  std::map<ParameterId, int> by_id{{a, 1}};
  CHECK(by_id.contains(ParameterId("layers.1.w")));
}

TEST_CASE("parameter id – child appends a validated relative name", "[engine][parameter]") {
  const ParameterId base("a.b");
  CHECK(base.child("c").str() == "a.b.c");
  CHECK(base.child("c.d").str() == "a.b.c.d");
  CHECK(ParameterId("layers").child("3").child("attn").str() == "layers.3.attn");
  for (const char* bad : {"", ".c", "c.", "c..d", "c d"}) {
    INFO(bad);
    try {
      (void)base.child(bad);
      FAIL("accepted");
    } catch (const DeclarationError& e) {
      CHECK(e.kind() == errc::invalid_parameter_id);
      CHECK_THAT(e.what(), Catch::Contains("child name of 'a.b'"));
    }
  }
  // The joined name must also respect the length limit.
  const ParameterId long_base(std::string(1000, 'a'));
  CHECK_THROWS_AS(long_base.child(std::string(30, 'b')), DeclarationError);
}

TEST_CASE("parameter id – hashes as its name, formats with fmt", "[engine][parameter]") {
  const ParameterId id("model.norm.weight");
  CHECK(std::hash<ParameterId>{}(id) == std::hash<std::string>{}("model.norm.weight"));
  CHECK(std::hash<ParameterId>{}(id) == std::hash<ParameterId>{}(ParameterId("model.norm.weight")));
  std::unordered_set<ParameterId> set{id, ParameterId("a"), ParameterId("a")};
  CHECK(set.size() == 2);
  CHECK(set.contains(ParameterId("model.norm.weight")));
  std::unordered_map<ParameterId, int> map{{id, 7}};
  CHECK(map.at(ParameterId("model.norm.weight")) == 7);
  CHECK(fmt::format("'{}'", id) == "'model.norm.weight'");
  CHECK(fmt::format("[{:>8}]", ParameterId("a.b")) == "[     a.b]");
  CHECK(to_string(id) == "model.norm.weight");
}

TEST_CASE("parameterized – join_name adds a dot only between non-empty parts", "[engine][parameter]") {
  CHECK(join_name("", "w") == "w");
  CHECK(join_name("a", "w") == "a.w");
  CHECK(join_name("layers.3", "attn.q") == "layers.3.attn.q");
  CHECK(join_name("a", "") == "a");
  CHECK(join_name("", "") == "");
}

// ---- a nested test module: model -> layers.N -> attn / mlp ----

namespace {

// A parameter slot: what was bound into it (0 = nothing yet).
struct Slot {
  int value = 0;
};

void slot(ParameterVisitor<Slot>& v, const std::string& prefix, std::string_view local, DType dtype, Shape shape,
          const Slot& s) {
  v.visit(ParameterMetadata{ParameterId(join_name(prefix, local)), dtype, std::move(shape)}, s);
}
void slot(ParameterVisitorMut<Slot>& v, const std::string& prefix, std::string_view local, DType dtype, Shape shape,
          Slot& s) {
  v.visit_mut(ParameterMetadata{ParameterId(join_name(prefix, local)), dtype, std::move(shape)}, s);
}

struct Attention {
  Slot qkv, o;
  template <class V, class Self>
  static void visit(Self& self, V& v, const std::string& prefix) {
    slot(v, prefix, "qkv.weight", DType::BF16, {24, 8}, self.qkv);
    slot(v, prefix, "o.weight", DType::BF16, {8, 8}, self.o);
  }
  void visit_parameters(ParameterVisitor<Slot>& v, const std::string& prefix) const { visit(*this, v, prefix); }
  void visit_parameters_mut(ParameterVisitorMut<Slot>& v, const std::string& prefix) { visit(*this, v, prefix); }
};

struct Mlp {
  Slot gate_up, down;
  void visit_parameters(ParameterVisitor<Slot>& v, const std::string& prefix) const {
    slot(v, prefix, "gate_up.weight", DType::BF16, {32, 8}, gate_up);
    slot(v, prefix, "down.weight", DType::BF16, {8, 16}, down);
  }
  void visit_parameters_mut(ParameterVisitorMut<Slot>& v, const std::string& prefix) {
    slot(v, prefix, "gate_up.weight", DType::BF16, {32, 8}, gate_up);
    slot(v, prefix, "down.weight", DType::BF16, {8, 16}, down);
  }
};

struct Layer {
  Attention attn;
  Mlp mlp;
  void visit_parameters(ParameterVisitor<Slot>& v, const std::string& prefix) const {
    attn.visit_parameters(v, join_name(prefix, "attn"));
    mlp.visit_parameters(v, join_name(prefix, "mlp"));
  }
  void visit_parameters_mut(ParameterVisitorMut<Slot>& v, const std::string& prefix) {
    attn.visit_parameters_mut(v, join_name(prefix, "attn"));
    mlp.visit_parameters_mut(v, join_name(prefix, "mlp"));
  }
};

struct Model {
  Slot embed;
  std::vector<Layer> layers = std::vector<Layer>(2);
  Slot norm;
  void visit_parameters(ParameterVisitor<Slot>& v, const std::string& prefix) const {
    slot(v, prefix, "embed.weight", DType::F32, {100, 8}, embed);
    for (std::size_t i = 0; i < layers.size(); ++i) {
      layers[i].visit_parameters(v, join_name(prefix, fmt::format("layers.{}", i)));
    }
    slot(v, prefix, "norm.weight", DType::F32, {8}, norm);
  }
  void visit_parameters_mut(ParameterVisitorMut<Slot>& v, const std::string& prefix) {
    slot(v, prefix, "embed.weight", DType::F32, {100, 8}, embed);
    for (std::size_t i = 0; i < layers.size(); ++i) {
      layers[i].visit_parameters_mut(v, join_name(prefix, fmt::format("layers.{}", i)));
    }
    slot(v, prefix, "norm.weight", DType::F32, {8}, norm);
  }
};

// A module with only the const visitor: not Parameterized.
struct ReadOnly {
  void visit_parameters(ParameterVisitor<Slot>&, const std::string&) const {}
};

class Recorder final : public ParameterVisitor<Slot> {
 public:
  void visit(const ParameterMetadata& metadata, const Slot& parameter) override {
    names.push_back(metadata.id.str());
    metadata_seen.push_back(metadata);
    values.push_back(parameter.value);
  }
  std::vector<std::string> names;
  std::vector<ParameterMetadata> metadata_seen;
  std::vector<int> values;
};

class Numberer final : public ParameterVisitorMut<Slot> {
 public:
  void visit_mut(const ParameterMetadata& metadata, Slot& parameter) override {
    parameter.value = ++count;
    ids.push_back(metadata.id);
  }
  int count = 0;
  std::vector<ParameterId> ids;
};

std::vector<std::string> layer_names(int i) {
  const std::string p = fmt::format("layers.{}.", i);
  return {p + "attn.qkv.weight", p + "attn.o.weight", p + "mlp.gate_up.weight", p + "mlp.down.weight"};
}

}  // namespace

TEST_CASE("parameterized – the concept needs both visitors", "[engine][parameter]") {
  STATIC_REQUIRE(Parameterized<Model, Slot>);
  STATIC_REQUIRE(Parameterized<Layer, Slot>);
  STATIC_REQUIRE(Parameterized<Attention, Slot>);
  STATIC_REQUIRE_FALSE(Parameterized<ReadOnly, Slot>);
  STATIC_REQUIRE_FALSE(Parameterized<Model, int>);
}

TEST_CASE("parameterized – a nested model visits fully dotted names in declaration order", "[engine][parameter]") {
  Model model;
  Recorder rec;
  model.visit_parameters(rec, "");
  std::vector<std::string> expected{"embed.weight"};
  for (int i = 0; i < 2; ++i) {
    for (auto& n : layer_names(i)) expected.push_back(n);
  }
  expected.push_back("norm.weight");
  CHECK(rec.names == expected);
  REQUIRE(rec.metadata_seen.size() == 10);
  CHECK(rec.metadata_seen[0] == ParameterMetadata{ParameterId("embed.weight"), DType::F32, {100, 8}});
  CHECK(rec.metadata_seen[1] == ParameterMetadata{ParameterId("layers.0.attn.qkv.weight"), DType::BF16, {24, 8}});
  CHECK(rec.metadata_seen[9].shape == Shape{8});

  // A layer visited alone, as one unit of a pipeline, gets the prefix it is given.
  Recorder unit;
  model.layers[1].visit_parameters(unit, "model.layers.1");
  CHECK(unit.names.front() == "model.layers.1.attn.qkv.weight");
  CHECK(unit.names.size() == 4);
}

TEST_CASE("parameterized – the mutable visitor writes each slot, the const one sees it", "[engine][parameter]") {
  Model model;
  Numberer numberer;
  model.visit_parameters_mut(numberer, "");
  CHECK(numberer.count == 10);
  CHECK(model.embed.value == 1);
  CHECK(model.layers[0].attn.qkv.value == 2);
  CHECK(model.layers[1].mlp.down.value == 9);
  CHECK(model.norm.value == 10);
  CHECK(numberer.ids[8] == ParameterId("layers.1.mlp.down.weight"));

  Recorder rec;
  model.visit_parameters(rec, "");
  CHECK(rec.values == std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
}
