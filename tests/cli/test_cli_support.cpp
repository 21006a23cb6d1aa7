// The eredu command's support code: the JSON writer, strict number and size parsing, and
// the CLI11 options built on them (ranges, messages, defaults in the help), and the
// tensor-parallel sharding options (--shard rules, the attention dims a checkpoint implies).
#include "json_writer.hpp"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cli.hpp"
#include "commands.hpp"
#include "eredu/core/error.hpp"
#include "options.hpp"
#include "progress.hpp"
#include "shard_options.hpp"

using namespace eredu::cli;

namespace {

// Parses `args` (after the program name) with `app`; returns the CLI11 error message, or ""
// when parsing succeeded.
std::string parse(CLI::App& app, std::vector<std::string> args) {
  std::vector<const char*> argv = {"eredu"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
    return {};
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
}

}  // namespace

TEST_CASE("json writer – places commas and escapes strings itself", "[cli][json]") {
  JsonWriter w;
  w.begin_object().field("name", "a \"b\"\n").key("list").begin_array();
  w.value(1).value(-2).value(true).null();
  w.begin_object().end_object().begin_array().end_array();
  w.end_array().field("x", 0.125).end_object();
  CHECK(w.complete());
  CHECK(w.take() == R"({"name":"a \"b\"\n","list":[1,-2,true,null,{},[]],"x":0.125})");
}

TEST_CASE("json writer – the vocabulary helpers add the unit suffix", "[cli][json]") {
  JsonWriter w;
  w.begin_object().bytes("peak_rss", 4096).bytes("", 1).seconds("load", 1.5).seconds("", 2);
  w.rate("", 3.25).rate("hot", 1).count("tensor", 7).count("", 0).end_object();
  CHECK(w.take() ==
        R"({"peak_rss_bytes":4096,"bytes":1,"load_seconds":1.5,"seconds":2,"gb_per_s":3.25,"hot_gb_per_s":1,)"
        R"("tensor_count":7,"count":0})");
}

TEST_CASE("json writer – doubles round-trip and non-finite values are null", "[cli][json]") {
  JsonWriter w;
  w.begin_array().value(1e-7).value(0.1).value(std::numeric_limits<double>::infinity());
  w.value(std::nan("")).value(std::uint64_t{18446744073709551615u}).end_array();
  CHECK(w.take() == "[1e-07,0.1,null,null,18446744073709551615]");
}

TEST_CASE("json writer – take() streams a long array in pieces", "[cli][json]") {
  JsonWriter w;
  w.begin_object().key("traceEvents").begin_array();
  std::string all = w.take();
  for (int i = 0; i < 3; ++i) {
    w.begin_object().field("ph", "X").field("ts", i).end_object();
    all += w.take();
  }
  w.end_array().end_object();
  all += w.take();
  CHECK(all == R"({"traceEvents":[{"ph":"X","ts":0},{"ph":"X","ts":1},{"ph":"X","ts":2}]})");
}

TEST_CASE("error document – names kind, message, file, tensor and offset", "[cli][json]") {
  const eredu::Error e(eredu::errc::unexpected_eof, {.file = "m.safetensors", .tensor = "w", .offset = 42},
                       "the file ended");
  const std::string doc = error_document("read", std::make_exception_ptr(e));
  CHECK_THAT(doc, Catch::StartsWith(R"({"schema":1,"command":"read","error":{"kind":"unexpected_eof",)"));
  CHECK_THAT(doc, Catch::Contains(R"("file":"m.safetensors","parameter":null,"tensor":"w","offset":42)"));
  CHECK_THAT(usage_error_document("load", "--depth: bad"),
             Catch::Contains(R"("error":{"kind":"usage","message":"--depth: bad","file":null)"));
}

TEST_CASE("parse_bytes – accepts sizes with units and nothing else", "[cli][options]") {
  CHECK(parse_bytes("4096") == 4096u);
  CHECK(parse_bytes("256M") == 256u << 20);
  CHECK(parse_bytes("256MiB") == 256u << 20);
  CHECK(parse_bytes("4k") == 4096u);
  CHECK(parse_bytes("1.5G") == 3u << 29);
  CHECK(parse_bytes("16EiB") == std::nullopt);  // no E unit
  CHECK(parse_bytes("16383P") == std::nullopt);
  CHECK(parse_bytes("16777216T") == std::nullopt);  // 2^64: overflows
  CHECK(parse_bytes("16777215T") == std::uint64_t{16777215} << 40);
  for (const char* bad : {"", "M", "-1", "+1", "1e30", "1.5", "1.", ".5M", " 1M", "1M ", "2x", "0x10", "1MM", "abc"})
    CHECK(parse_bytes(bad) == std::nullopt);
  CHECK(size_text(256u << 20) == "256M");
  CHECK(size_text(4096) == "4K");
  CHECK(size_text(1000) == "1000");
  CHECK(size_text(0) == "0");
  CHECK(parse_bytes(size_text(std::uint64_t{1} << 40)) == std::uint64_t{1} << 40);
}

TEST_CASE("parse_integer – parses the whole text as a decimal of the type", "[cli][options]") {
  CHECK(parse_integer<unsigned>("8") == 8u);
  CHECK(parse_integer<int>("-3") == -3);
  CHECK(parse_integer<std::uint64_t>("18446744073709551615") == std::numeric_limits<std::uint64_t>::max());
  CHECK(parse_integer<std::uint64_t>("18446744073709551616") == std::nullopt);
  CHECK(parse_integer<std::uint32_t>("4294967296") == std::nullopt);
  for (const char* bad : {"", "-1", "+1", "2x", "1e3", "abc", " 1", "0x10", "1.0"})
    CHECK(parse_integer<unsigned>(bad) == std::nullopt);
}

TEST_CASE("options – out-of-range and malformed values name the option and the range", "[cli][options]") {
  CLI::App app("t", "eredu");
  unsigned depth = 4;
  std::uint64_t budget = 256u << 20, chunk = 4u << 20, seed = 1;
  std::string reader = "auto";
  add_integer(app, "--depth", depth, 1u, 256u, "requests in flight");
  add_integer(app, "--seed", seed, std::uint64_t{0}, std::numeric_limits<std::uint64_t>::max(), "seed");
  add_bytes(app, "--budget", budget, 4096, std::uint64_t{1} << 40, "staging");
  add_bytes(app, "--chunk", chunk, 4096, std::uint64_t{1} << 40, "chunk", "one lease per tensor");
  add_choice(app, "--reader", reader, {"auto", "uring", "pread"}, "reader");

  CHECK(parse(app, {"--depth", "-1"}) == "--depth: '-1' is not an integer from 1 to 256");
  CHECK(parse(app, {"--depth", "100000"}) == "--depth: '100000' is not an integer from 1 to 256");
  CHECK(parse(app, {"--depth", "2x"}) == "--depth: '2x' is not an integer from 1 to 256");
  CHECK(parse(app, {"--seed", "-1"}) == "--seed: '-1' is not an integer from 0 to 18446744073709551615");
  CHECK(parse(app, {"--seed", "abc"}) == "--seed: 'abc' is not an integer from 0 to 18446744073709551615");
  CHECK(parse(app, {"--budget", "1e30"}) ==
        "--budget: '1e30' is not a byte size from 4K to 1T (e.g. 4096, 256M, 1.5G)");
  CHECK(parse(app, {"--budget", "0"}) == "--budget: '0' is not a byte size from 4K to 1T (e.g. 4096, 256M, 1.5G)");
  CHECK(parse(app, {"--reader", "io_uring"}) == "--reader: 'io_uring' is not one of auto, uring, pread");

  CHECK(parse(app, {"--depth=256", "--budget", "1.5G", "--chunk", "0", "--seed", "18446744073709551615"}).empty());
  CHECK(depth == 256u);
  CHECK(budget == 3u << 29);
  CHECK(chunk == 0u);
  CHECK(seed == std::numeric_limits<std::uint64_t>::max());
}

TEST_CASE("options – the help states each option's range and default", "[cli][options]") {
  CLI::App app("t", "eredu");
  unsigned depth = 8;
  std::uint64_t budget = 256u << 20;
  std::string reader = "auto";
  add_integer(app, "--depth", depth, 1u, 256u, "requests in flight");
  add_bytes(app, "--budget", budget, 4096, std::uint64_t{1} << 40, "staging memory");
  add_choice(app, "--reader", reader, {"auto", "uring", "pread"}, "reader");
  const std::string help = app.help();
  CHECK_THAT(help, Catch::Contains("requests in flight (1 to 256; default 8)"));
  CHECK_THAT(help, Catch::Contains("staging memory (4K to 1T; default 256M)"));
  CHECK_THAT(help, Catch::Contains("--reader auto|uring|pread"));
  CHECK_THAT(help, Catch::Contains("reader (default auto)"));
}

TEST_CASE("bash completion – offers subcommands, options and choices", "[cli][options]") {
  CLI::App app("t", "eredu");
  CLI::App* read = app.add_subcommand("read", "read");
  std::string reader = "auto", path;
  std::uint64_t budget = 4096;
  add_path(*read, "PATH", path, "checkpoint");
  add_choice(*read, "--reader", reader, {"auto", "uring", "pread"}, "reader");
  add_bytes(*read, "--budget", budget, 4096, 8192, "budget");
  CommonFlags flags;
  add_common_flags(*read, flags, true);
  const std::string script = bash_completion(app);
  CHECK_THAT(script, Catch::Contains("complete -o filenames -F _eredu eredu"));
  CHECK_THAT(script, Catch::Contains("--reader) COMPREPLY=($(compgen -W \"auto uring pread\""));
  CHECK_THAT(script, Catch::Contains("--budget) return ;;"));
  CHECK_THAT(script, Catch::Contains("\"-h --help --reader --budget --json -q --quiet -v --verbose\""));
}

namespace {

// A Llama-shaped catalog: q/k/o projections of `heads` / `kv_heads` heads of 64, BF16.
eredu::io::Catalog attention_catalog(std::uint64_t heads, std::uint64_t kv_heads, bool from_gen) {
  eredu::io::Catalog catalog;
  catalog.add_file({.path = "m.safetensors", .format = "safetensors"});
  const std::uint64_t hidden = heads * 64;
  std::uint64_t offset = 0;
  auto add = [&](std::string name, eredu::Shape shape) {
    const std::uint64_t n = shape[0] * shape[1] * 2;
    catalog.add_tensor({std::move(name), eredu::DType::BF16, shape, 0, offset, n});
    offset += n;
  };
  add("model.layers.0.self_attn.q_proj.weight", {hidden, hidden});
  add("model.layers.0.self_attn.k_proj.weight", {kv_heads * 64, hidden});
  add("model.layers.0.self_attn.o_proj.weight", {hidden, hidden});
  if (from_gen) catalog.set_metadata({{"generator", "eredu-synth"}});
  return catalog;
}

}  // namespace

TEST_CASE("shard rules – PATTERN=SPEC parses every spec and names --shard in every error", "[cli][tensor_parallel]") {
  using eredu::engine::Shard;
  CHECK(parse_shard_rule("*.norm.weight=replicated") == std::pair{std::string("*.norm.weight"), Shard::replicated()});
  CHECK(parse_shard_rule("a=column").second == Shard::column_parallel());
  CHECK(parse_shard_rule("a=row:128").second == Shard::row_parallel(128));
  CHECK(parse_shard_rule("a=split:2").second == Shard::split(2));
  CHECK(parse_shard_rule("a=split:1:64").second == Shard::split(1, 64));
  CHECK(parse_shard_rule("a=fused:0:2").second == Shard::fused_even(0, 2));
  CHECK(parse_shard_rule("a=fused:0:3:64").second == Shard::fused_even(0, 3, 64));
  CHECK(parse_shard_rule("x=y=column").first == "x=y");  // the last '=' separates SPEC
  for (const char* bad : {"a", "=column", "a=", "a=diagonal", "a=split", "a=split:x", "a=row:0", "a=column:1:2",
                          "a=replicated:1", "a=fused:0", "a=split:-1"}) {
    CAPTURE(bad);
    try {
      parse_shard_rule(bad);
      FAIL("accepted");
    } catch (const UsageError& e) {
      CHECK(std::string(e.what()).starts_with("--shard: '"));
    }
  }
}

TEST_CASE("shard rules – attention dims come from the options, eredu gen's rule, or are asked for",
          "[cli][tensor_parallel]") {
  // eredu gen's checkpoints: 64-wide heads up to a hidden size of 2048.
  LlamaDims d = llama_dims(attention_catalog(4, 2, true), {}, "m");
  CHECK((d.sharding.head_dim == 64 && d.sharding.heads == 4 && d.sharding.kv_heads == 2));
  CHECK(d.source == "eredu gen's dims");
  // --heads: the query rows over heads; kv heads from k_proj's rows.
  d = llama_dims(attention_catalog(4, 2, false), {.heads = 2}, "m");
  CHECK((d.sharding.head_dim == 128 && d.sharding.heads == 2 && d.sharding.kv_heads == 1 && d.source == "options"));
  CHECK(llama_dims(attention_catalog(4, 2, false), {.head_dim = 32}, "m").sharding.heads == 8);
  // Nothing to go by, or heads that do not divide the rows: a usage error naming what to give.
  CHECK_THROWS_WITH(llama_dims(attention_catalog(4, 2, false), {}, "m"), Catch::Contains("give --heads"));
  CHECK_THROWS_WITH(llama_dims(attention_catalog(4, 2, false), {.heads = 3}, "m"),
                    Catch::Contains("q_proj.weight") && Catch::Contains("3 heads"));
  CHECK_THROWS_AS(llama_dims(attention_catalog(4, 2, false), {.heads = 3}, "m"), UsageError);
  // The --shard rules come first: they win over the Llama rules for the tensors they match.
  const eredu::engine::ShardingRules rules =
      tensor_parallel_rules({"*.q_proj.weight=replicated"}, "llama", {.head_dim = 64, .heads = 4, .kv_heads = 2});
  CHECK(rules.find("model.layers.0.self_attn.q_proj.weight") == eredu::engine::Shard::replicated());
  CHECK(rules.find("model.layers.0.self_attn.k_proj.weight") == eredu::engine::Shard::column_parallel(64));
  CHECK(rules.find("model.norm.weight") == eredu::engine::Shard::replicated());
}

TEST_CASE("the progress line's time left", "[progress]") {
  // Nothing while an estimate would mislead: too early, nothing done, or finished.
  CHECK(eta_text(0, 100, 5.0).empty());
  CHECK(eta_text(50, 100, 0.2).empty());
  CHECK(eta_text(100, 100, 5.0).empty());
  CHECK(eta_text(150, 100, 5.0).empty());
  CHECK(eta_text(1, 100, std::nan("")).empty());
  // At the rate so far: half done in 4 s leaves 4 s.
  CHECK(eta_text(50, 100, 4.0) == "ETA 4.0 s");
  CHECK(eta_text(25, 100, 10.0) == "ETA 30 s");
  CHECK(eta_text(10, 100, 10.0) == "ETA 1m30s");
  CHECK(eta_text(1, 1000, 10.0) == "ETA 2h46m");
  CHECK(eta_text(1, std::uint64_t{1} << 62, 100.0) == "ETA 99h59m");  // capped, never an overflow
}
