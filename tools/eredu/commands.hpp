#pragma once
// The eredu subcommands. Each add_*_command defines its options on a CLI11 subcommand of
// `app` and returns it with what runs it once the command line is parsed.

#include <CLI/CLI.hpp>
#include <functional>
#include <stdexcept>

#include "options.hpp"

namespace eredu::cli {

/// Runs a parsed subcommand with the common flags; returns the process exit status.
using Runner = std::function<int(const CommonFlags&)>;

/// One defined subcommand: its CLI11 app and what runs it.
struct Command {
  CLI::App* app = nullptr;  ///< owned by the parent app
  Runner run{};             ///< called once, after a successful parse
};

/// A command-line error found only after parsing (an option against the checkpoint's
/// contents, say); main() reports it like a parse error, with exit status 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// `eredu inspect PATH`: the catalog as a table or JSON.
Command add_inspect_command(CLI::App& app, CommonFlags& flags);
/// `eredu read PATH`: reads every tensor through the lease pool and verifies it.
Command add_read_command(CLI::App& app, CommonFlags& flags);
/// `eredu load PATH`: loads every tensor into CPU tensors through the engine.
Command add_load_command(CLI::App& app, CommonFlags& flags);
/// `eredu pipeline PATH`: streams a checkpoint's layers through a prefetch pipeline.
Command add_pipeline_command(CLI::App& app, CommonFlags& flags);
/// `eredu swap A B`: serves requests while hot-swapping between checkpoints.
Command add_swap_command(CLI::App& app, CommonFlags& flags);
/// `eredu gen OUT`: writes a synthetic transformer-shaped checkpoint.
Command add_gen_command(CLI::App& app, CommonFlags& flags);
/// `eredu checksum PATH`: writes the checksum sidecar (whole tensors, tensor-parallel shards).
Command add_checksum_command(CLI::App& app, CommonFlags& flags);

}  // namespace eredu::cli
