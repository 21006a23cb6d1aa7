// A program outside the eredu tree, built against the installed package with CMake and
// with pkg-config (scripts/package-check.sh): it writes a synthetic checkpoint with
// eredu::synth, loads it through the engine into CPU tensors, streams it through a
// prefetch pipeline and hot-swaps it into a ModelSlot, checking the bytes against the
// generator. Prints "consumer: ok" and exits 0 when all of it worked.
#include <tbb/global_control.h>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "eredu/app/tensor_set_module.hpp"
#include "eredu/cpu/backend.hpp"
#include "eredu/engine/orchestration/load.hpp"
#include "eredu/engine/serving/model_slot.hpp"
#include "eredu/engine/serving/prefetch_pipeline.hpp"
#include "eredu/synth/synthetic_checkpoint.hpp"

namespace {

using Model = eredu::app::TensorSetModule;

// True when every slot of `model` holds the generator's bytes for its tensor.
bool matches(const Model& model, const eredu::synth::SyntheticModel& planned, std::uint64_t seed) {
  for (std::size_t i = 0; i < planned.tensors.size(); ++i) {
    const auto bytes = model.slot(i).value.bytes();
    std::vector<std::byte> want(bytes.size());
    eredu::synth::fill_tensor_bytes(seed, planned.tensors[i], 0, want);
    if (!std::equal(want.begin(), want.end(), bytes.begin(), bytes.end())) return false;
  }
  return true;
}

// One unit (the whole checkpoint) through a prefetch pipeline; true when it matched.
asio::awaitable<bool> stream(eredu::io::CheckpointSource& source, const Model& blueprint,
                             eredu::cpu::MaterializationContext& context, const eredu::synth::SyntheticModel& planned) {
  std::vector<eredu::engine::PipelineUnit> units;
  units.push_back({"all", blueprint.plan()});
  eredu::engine::PrefetchPipeline<eredu::cpu::Backend, Model> pipeline(
      source, std::move(units), [&blueprint](std::size_t) { return blueprint.unbound(); }, context);
  bool ok = false;
  while (auto unit = co_await pipeline.async_next(asio::use_awaitable)) ok = matches(unit.module(), planned, 7);
  co_await pipeline.async_close(asio::use_awaitable);
  co_return ok;
}

}  // namespace

int main() {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "eredu-consumer";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::filesystem::path file = dir / "model.safetensors";
  eredu::synth::SyntheticOptions options;
  options.target_bytes = 1 << 20;
  options.seed = 7;
  const eredu::synth::SyntheticModel planned = eredu::synth::plan_model(options);
  eredu::synth::write_synthetic(file, options);

  tbb::global_control workers(tbb::global_control::max_allowed_parallelism, 3);
  eredu::cpu::Executor executor(2);
  eredu::cpu::StoragePool storage;
  eredu::cpu::MaterializationContext context{executor, storage};
  asio::io_context ctx;
  auto source = eredu::io::CheckpointSource::open(ctx.get_executor(), file);
  const Model blueprint = Model::mirror(source->catalog());

  Model model = blueprint.unbound();
  std::future<void> loaded =
      eredu::engine::async_load<eredu::cpu::Backend>(model, *source, blueprint.plan(), context, asio::use_future);
  std::future<bool> streamed = asio::co_spawn(ctx, stream(*source, blueprint, context, planned), asio::use_future);
  eredu::engine::ModelSlot<eredu::cpu::Backend, Model> slot([&blueprint] { return blueprint.unbound(); });
  std::future<eredu::engine::SwapReport> swapped =
      slot.async_swap(*source, blueprint.plan(), context, asio::use_future);
  ctx.run();
  loaded.get();
  const bool load_ok = matches(model, planned, 7);
  const bool stream_ok = streamed.get();
  const bool swap_ok = swapped.get().generation == 1 && matches(slot.current()->model, planned, 7);
  std::filesystem::remove_all(dir);
  std::printf("consumer: load %s, pipeline %s, swap %s\n", load_ok ? "ok" : "WRONG", stream_ok ? "ok" : "WRONG",
              swap_ok ? "ok" : "WRONG");
  if (!(load_ok && stream_ok && swap_ok)) return 1;
  std::puts("consumer: ok");
  return 0;
}
