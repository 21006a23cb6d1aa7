// `eredu swap A B`: the command line of the hot-swap serving scenario (bench/serving_scenario:
// eredu/bench/swap_scenario.hpp), which it runs with the progress line and the signals as
// hooks, and its report (swap_report.hpp).
#include <memory>

#include "commands.hpp"
#include "eredu/bench/swap_analysis.hpp"
#include "eredu/bench/swap_scenario.hpp"
#include "interrupt.hpp"
#include "progress.hpp"
#include "swap_report.hpp"
#include "trace_option.hpp"
#include "verify_flags.hpp"
#include "weights_flag.hpp"

namespace eredu::cli {
namespace {

/// The scenario's hooks: phases on `progress`; a signal stops the run, which then reports
/// Interrupted saying what it was doing.
bench::SwapScenarioHooks swap_hooks(Progress& progress) {
  return {.phase = [&progress](std::string_view name, std::uint64_t total,
                               std::string_view context) { progress.phase(name, total, context); },
          .update = [&progress](std::uint64_t done) { progress.update(done); },
          .tick = [&progress] { progress.tick(); },
          .finish = [&progress] { progress.finish(); },
          .check = [](const std::string& doing) { throw_if_interrupted(doing); },
          .stop_requested = [] { return pending_signal() != 0; }};
}

int run_swap(const SwapCommandOptions& command, const CommonFlags& flags) {
  bench::SwapScenarioOptions o = command.scenario;
  o.verify = command.verify != "off";
  o.checksums = [mode = command.verify](const std::string& path, const io::Catalog& catalog) {
    return checksums_for(path, catalog, mode, {}, "swaps to it verify");
  };
  o.weights = weight_storage(command.weights);
  Progress progress(!flags.quiet);
  const bench::SwapScenarioResult result = bench::run_swap_scenario(o, swap_hooks(progress));
  const bench::SwapAnalysis analysis = bench::analyze_swap(o, result);
  if (flags.json)
    print_swap_json(command, result, analysis);
  else
    print_swap_text(command, result, analysis);
  return analysis.ok ? 0 : 1;
}

}  // namespace

Command add_swap_command(CLI::App& app, CommonFlags& flags) {
  auto command = std::make_shared<SwapCommandOptions>();
  bench::SwapScenarioOptions* o = &command->scenario;
  CLI::App* cmd = add_command(
      app, "swap", "serve requests from A while hot-swapping to B and back",
      "Serves synthetic requests from checkpoint A on one event loop while engine::ModelSlot hot-swaps to B, "
      "back to A, ... (--swaps N), then with --corrupt attempts a swap to a copy of B with bytes flipped in one "
      "tensor, which verification must reject. A and B must have the same tensors, dtypes and shapes (eredu gen "
      "with two seeds). Each request computes y = W[0:rows, :] x over the largest 2-D tensor and is checked "
      "against values computed from the files. Exit status 1 if a response did not come from exactly one "
      "version, a swap failed, or the corrupt swap was published.");
  add_path(*cmd, "A", o->a, "the checkpoint served first");
  add_path(*cmd, "B", o->b, "the checkpoint swapped to (same tensors, dtypes and shapes as A)");
  add_integer(*cmd, "--swaps", o->swaps, 0u, 100000u, "successful swaps to run, alternating A→B and B→A");
  add_integer(*cmd, "--requests", o->requests, std::uint64_t{1}, std::uint64_t{1} << 32,
              "requests answered in each phase between swaps");
  add_integer(*cmd, "--concurrency", o->concurrency, 1u, 4096u, "concurrent clients on the event loop");
  add_integer(*cmd, "--serve-threads", o->serve_threads, 0u, 1024u,
              "0: compute requests on the loop thread; N: on an N-thread arena");
  add_integer(*cmd, "--swap-threads", o->swap_threads, app::option_range::threads, "threads of the swap's own arena");
  add_bytes(*cmd, "--budget", o->budget, app::option_range::budget, "staging memory of each source");
  add_bytes(*cmd, "--work", o->work, 1, std::uint64_t{1} << 40, "multiply-adds per request");
  add_choice(*cmd, "--verify", command->verify, {"on", "off", "require"},
             "SHA-256 of every tensor with a recorded digest (\"sha256:<tensor>\" metadata, or the sidecar "
             "<file>.sha256.json / checksums.sha256.json of a directory) before each publication: on verifies "
             "what is recorded and warns when nothing is; require fails (exit status 1) unless every tensor of A "
             "and B has a digest; off verifies nothing");
  add_weights_flag(*cmd, command->weights);
  cmd->add_flag("--corrupt", o->corrupt, "end with a swap to a corrupted copy of B, which must be rejected");
  auto trace_path = std::make_shared<std::string>();
  add_trace_option(*cmd, *trace_path);
  add_common_flags(*cmd, flags, true);
  return {cmd, [command, trace_path](const CommonFlags& f) {
            return run_traced(*trace_path, [&] { return run_swap(*command, f); });
          }};
}

}  // namespace eredu::cli
