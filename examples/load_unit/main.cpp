// load_unit: `co_await` one decoder block, then a whole model, from a safetensors checkpoint
// into CPU tensors, and check a forward pass against the checkpoint's own bytes.
//
//   load_unit [CHECKPOINT_DIR]
//
// Without an argument it generates a small sharded BF16 checkpoint in a temporary directory.
// See README.md next to this file.

#include <tbb/global_control.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "../common/temp_dir.hpp"
#include "eredu/core/error.hpp"
#include "eredu/cpu/backend.hpp"
#include "eredu/cpu/float_formats.hpp"
#include "eredu/engine/orchestration/load.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"
#include "eredu/synth/synthetic_checkpoint.hpp"
#include "model.hpp"

using namespace eredu;
using namespace eredu::example;

namespace {

double mib(std::uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

/// Writes a 3-shard BF16 checkpoint with tied embeddings (no lm_head.weight) into `dir`.
void generate_checkpoint(const std::filesystem::path& dir) {
  const synth::SyntheticOptions options{
      .target_bytes = 6 << 20, .dtype = DType::BF16, .shards = 3, .seed = 7, .layers = 3, .tie_embeddings = true};
  const synth::SyntheticModel plan = synth::plan_model(options);
  synth::write_synthetic(dir, options);
  fmt::print(
      "generated {}: 3 shards, BF16, {} layers, hidden {}, intermediate {}, vocab {}, tied embeddings, "
      "{:.1f} MiB\n",
      dir.string(), plan.layers, plan.hidden, plan.intermediate, plan.vocab, mib(plan.total_bytes));
}

/// What the loading coroutine hands back to main.
struct Loaded {
  std::unique_ptr<io::CheckpointSource> source;  // the open checkpoint (its catalog)
  ModelConfig config;                            // its sizes, read from the catalog
  std::uint64_t layer = 0;                       // the checkpoint layer loaded alone
  Block block;                                   // that layer, as a standalone unit
  Model model;                                   // the whole checkpoint
};

using Clock = std::chrono::steady_clock;

/// Prints what loading `plan` cost: tensor bytes, seconds and the staging high-water.
void report(const std::string& what, const engine::WeightBindingPlan& plan, io::CheckpointSource& source,
            Clock::time_point start) {
  const std::chrono::duration<double> seconds = Clock::now() - start;
  fmt::print("loaded {}: {} parameters, {:.2f} MiB of tensors in {:.4f} s; staging high-water {:.2f} of {:.0f} MiB\n",
             what, plan.bindings().size(), mib(plan.owner_bytes(source.catalog())), seconds.count(),
             mib(source.pool().high_water()), mib(source.pool().budget()));
  source.pool().reset_high_water();
}

/// The asynchronous part: open, then co_await one block, then the whole model. Everything is
/// passed as a parameter (coroutine lambdas must not capture).
asio::awaitable<Loaded> load_units(asio::any_io_executor executor, std::filesystem::path path,
                                   cpu::MaterializationContext& context) {
  Loaded out;
  const io::SourceOptions options;  // named: no class temporaries inside co_await (g++ 12)
  out.source = co_await io::async_open_checkpoint(executor, path, options, asio::use_awaitable);
  const io::Catalog& catalog = out.source->catalog();
  out.config = ModelConfig::from_catalog(catalog);
  const ModelConfig& config = out.config;
  fmt::print("opened {}: {} tensors in {} file(s), {} layers, reader {}\n", path.string(), catalog.size(),
             catalog.files().size(), config.layers, out.source->reader().name());

  // One unit: checkpoint layer 1 into a Block of its own. The plan maps the block's slot
  // names ("attn.qkv.weight", ...) to recipes over "model.layers.1.*".
  out.layer = std::min<std::uint64_t>(1, config.layers - 1);
  out.block = Block(config);
  const engine::WeightBindingPlan one_block = block_plan(catalog, out.layer);
  for (const engine::WeightBinding& b : one_block.bindings())
    fmt::print("  {:<18} <- {}\n", b.name(), b.recipe()->to_string());
  Clock::time_point start = Clock::now();
  co_await engine::async_load<cpu::Backend>(out.block, *out.source, one_block, context, asio::use_awaitable);
  report(fmt::format("block {} alone", out.layer), one_block, *out.source, start);

  // The whole model, as one atomic unit: either every slot is bound or none is.
  out.model = Model(config);
  const engine::WeightBindingPlan whole = model_plan(catalog, config);
  start = Clock::now();
  co_await engine::async_load<cpu::Backend>(out.model, *out.source, whole, context, asio::use_awaitable);
  report("the whole model", whole, *out.source, start);
  co_return out;
}

/// Every element of checkpoint tensor `key` as f32, read with plain file I/O from the offset
/// the catalog gives, and widened with a scalar loop: an independent path to the same values.
std::vector<float> read_f32(const io::Catalog& catalog, const std::string& key) {
  const io::TensorInfo& t = catalog.at(key);
  std::vector<char> raw(t.nbytes);
  std::ifstream file(catalog.file_of(t).path, std::ios::binary);
  file.seekg(static_cast<std::streamoff>(t.offset));
  file.read(raw.data(), static_cast<std::streamsize>(raw.size()));
  if (!file) throw std::runtime_error(fmt::format("cannot read '{}' from {}", key, catalog.file_of(t).path));
  auto u16 = [&raw](std::size_t i) {
    std::uint16_t h = 0;
    std::memcpy(&h, raw.data() + 2 * i, 2);
    return h;
  };
  std::vector<float> out(t.nbytes * 8 / dtype_bits(t.dtype));
  for (std::size_t i = 0; i < out.size(); ++i) {
    switch (t.dtype) {
      case DType::BF16:
        out[i] = cpu::bf16_to_f32(u16(i));
        break;
      case DType::F16:
        out[i] = cpu::f16_to_f32(u16(i));
        break;
      case DType::F32:
        std::memcpy(&out[i], raw.data() + 4 * i, 4);
        break;
      default:
        throw std::runtime_error(fmt::format("'{}' is {}: the check reads BF16, F16 or F32", key, dtype_name(t.dtype)));
    }
  }
  return out;
}

/// Appends W · x for row-major `w` of `x.size()` columns.
void append_matvec(std::vector<float>& y, const std::vector<float>& w, const std::vector<float>& x) {
  for (std::size_t r = 0; r < w.size() / x.size(); ++r) y.push_back(dot(w.data() + r * x.size(), x.data(), x.size()));
}

/// Block::forward computed from checkpoint layer `layer`'s own tensors: q, k, v, gate and up
/// separately, so the fused layouts the recipes built are checked too.
BlockOutput reference_forward(const io::Catalog& catalog, std::uint64_t layer, const std::vector<float>& x) {
  auto tensor = [&](const char* leaf) { return read_f32(catalog, fmt::format("model.layers.{}.{}", layer, leaf)); };
  BlockOutput out;
  const std::vector<float> xn = rms_norm(x, tensor("input_layernorm.weight"));
  for (const char* w : {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"})
    append_matvec(out.qkv, tensor(w), xn);
  const std::vector<float> xn2 = rms_norm(x, tensor("post_attention_layernorm.weight"));
  std::vector<float> gate, up, act;
  append_matvec(gate, tensor("mlp.gate_proj.weight"), xn2);
  append_matvec(up, tensor("mlp.up_proj.weight"), xn2);
  for (std::size_t i = 0; i < gate.size(); ++i) act.push_back(silu(gate[i]) * up[i]);
  append_matvec(out.mlp, tensor("mlp.down_proj.weight"), act);
  return out;
}

/// Largest |a - b|; false (and a message) if it exceeds 1e-5 of the largest |b|.
bool compare(const char* what, const std::vector<float>& a, const std::vector<float>& b, std::string& report) {
  if (a.size() != b.size()) {
    report += fmt::format(" {}: {} values vs {}", what, a.size(), b.size());
    return false;
  }
  float diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  report += fmt::format(" {} max|diff| {:.3g} (of {:.3g})", what, diff, scale);
  return std::isfinite(diff) && diff <= 1e-5f * scale;
}

/// Runs `block` and the reference on a fixed input; prints and returns whether they agree.
bool check_block(const char* what, const Block& block, const io::Catalog& catalog, std::uint64_t layer) {
  std::vector<float> x(block.attn_norm.shape.at(0));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i) + 0.1f);
  const BlockOutput got = block.forward(x), want = reference_forward(catalog, layer, x);
  std::string report;
  const bool qkv_ok = compare("qkv", got.qkv, want.qkv, report);
  const bool mlp_ok = compare("mlp", got.mlp, want.mlp, report);
  const bool ok = qkv_ok && mlp_ok;
  fmt::print("  {:<15} vs the file's bytes:{}  {}\n", what, report, ok ? "ok" : "MISMATCH");
  return ok;
}

int run(int argc, char** argv) {
  if (argc > 2) {
    fmt::print(stderr, "usage: {} [CHECKPOINT_DIR]\n", argv[0]);
    return 2;
  }
  std::unique_ptr<TempDir> temp;
  std::filesystem::path path;
  if (argc == 2) {
    path = argv[1];
  } else {
    temp = std::make_unique<TempDir>("eredu-load-unit");
    path = temp->path();
    generate_checkpoint(path);
  }

  asio::io_context ctx;
  // This thread runs the event loop and never joins TBB's work, so let TBB start one worker
  // per hardware thread (its default assumes the main thread helps).
  const std::size_t threads = std::max(1u, std::thread::hardware_concurrency());
  tbb::global_control workers(tbb::global_control::max_allowed_parallelism, threads + 1);
  cpu::Executor executor;    // a TBB arena: populates memory, converts, concatenates
  cpu::StoragePool storage;  // tensor storage, recycled across loads
  cpu::MaterializationContext context{executor, storage};
  std::future<Loaded> done = asio::co_spawn(ctx, load_units(ctx.get_executor(), path, context), asio::use_future);
  ctx.run();
  Loaded loaded = done.get();  // rethrows the coroutine's failure (an eredu::Error)

  const io::Catalog& catalog = loaded.source->catalog();
  const Model& model = loaded.model;
  const bool shared = model.lm_head.value.shares_storage_with(model.embed.value);
  bool ok = shared == loaded.config.tied;
  fmt::print("lm_head.weight {} embed.weight's storage{}\n", shared ? "shares" : "does not share",
             ok ? "" : "  MISMATCH");

  fmt::print("forward check (rmsnorm, fused qkv, SwiGLU MLP):\n");
  ok &= check_block(fmt::format("block {} alone", loaded.layer).c_str(), loaded.block, catalog, loaded.layer);
  for (std::size_t i = 0; i < model.layers.size(); ++i)
    ok &= check_block(fmt::format("model layer {}", i).c_str(), model.layers[i], catalog, i);
  fmt::print("{}\n", ok ? "ok" : "FAILED: the loaded weights differ from the checkpoint");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const eredu::Error& e) {  // its message names the file, tensor and parameter
    fmt::print(stderr, "load_unit: {}\n", e.what());
  } catch (const std::exception& e) {
    fmt::print(stderr, "load_unit: {}\n", e.what());
  }
  return 1;
}
