#pragma once
// The eredu subcommands; each returns the process exit status.

namespace eredu::cli {

/// `eredu inspect PATH [--json]`: the catalog as a table or JSON.
int run_inspect(int argc, char** argv);
/// `eredu read PATH ...`: reads every tensor through the lease pool and verifies it.
int run_read(int argc, char** argv);
/// `eredu load PATH ...`: loads every tensor into CPU tensors through the engine.
int run_load(int argc, char** argv);
/// `eredu gen OUT ...`: writes a synthetic transformer-shaped checkpoint.
int run_gen(int argc, char** argv);
/// `eredu pipeline PATH ...`: streams a checkpoint's layers through a prefetch pipeline.
int run_pipeline(int argc, char** argv);
/// `eredu swap A B ...`: serves requests while hot-swapping between checkpoints.
int run_swap(int argc, char** argv);

}  // namespace eredu::cli
