// eredu: inspect, read, load, stream, hot-swap, generate and checksum checkpoints from the command line.
//
// Exit status (docs/cli.md, options.hpp's exit_status_text): 0 success; 1 the command ran
// and failed; 2 a usage error, reported before anything runs.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cli.hpp"
#include "commands.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/log.hpp"
#include "eredu/core/printable.hpp"
#include "interrupt.hpp"
#include "options.hpp"
#include "output_streams.hpp"
#include "version.hpp"

namespace {

constexpr const char* description =
    "eredu: asynchronous checkpoint loading (safetensors files and sharded directories)";

// The first argument naming a subcommand, for messages before (or without) a parse.
std::string command_in(int argc, char** argv, const std::vector<eredu::cli::Command>& commands) {
  for (int i = 1; i < argc; ++i)
    for (const eredu::cli::Command& c : commands)
      if (c.app->get_name() == argv[i]) return argv[i];
  return {};
}

}  // namespace

namespace {

/// The command line run: parse, run the chosen command, report its failure. Returns the exit
/// status; every report goes through write_unchecked, so that a broken stderr cannot turn a
/// failure into an abort.
int run(int argc, char** argv, std::string& who) {
  using namespace eredu::cli;
  CLI::App app(description, "eredu");
  app.get_formatter()->column_width(34);
  app.set_help_flag("-h,--help", "print this help and exit");
  app.set_version_flag("--version", fmt::format("eredu {} (commit {})", version, commit),
                       "print the version and the git commit it was built from, and exit");
  app.set_help_all_flag("--help-all", "print the help of every command and exit");
  bool completion = false;
  app.add_flag("--completion-bash", completion, "print a bash completion script for eredu and exit");
  app.require_subcommand(0, 1);
  app.footer(std::string("Run 'eredu COMMAND --help' for a command's options; docs/cli.md has them all and the JSON "
                         "schema.\n\n") +
             exit_status_text);

  CommonFlags flags;
  const std::vector<Command> commands = {add_inspect_command(app, flags), add_read_command(app, flags),
                                         add_load_command(app, flags),    add_pipeline_command(app, flags),
                                         add_swap_command(app, flags),    add_gen_command(app, flags),
                                         add_checksum_command(app, flags)};

  const std::string name = command_in(argc, argv, commands);
  who = name.empty() ? "eredu" : "eredu " + name;
  // --json is known before parsing so that a usage error can be reported as JSON too.
  const bool json = [&] {
    for (int i = 1; i < argc; ++i)
      if (std::string_view(argv[i]) == "--")
        break;
      else if (std::string_view(argv[i]) == "--json")
        return true;
    return false;
  }();
  // A document goes out only if the command printed none: one document per run.
  auto document = [&](const std::string& text) {
    if (json && !document_printed()) write_unchecked(stdout, text + "\n");
  };
  auto usage_error = [&](std::string_view message) {
    document(usage_error_document(name, message));
    write_unchecked(stderr, fmt::format("{}: {}\nRun '{} --help' for usage.\n", who, eredu::printable(message), who));
    return 2;
  };

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --help-all, --version
    return usage_error(e.what());
  }
  if (completion) {
    write_unchecked(stdout, bash_completion(app));
    return 0;
  }
  const auto chosen = std::find_if(commands.begin(), commands.end(), [](const Command& c) { return c.app->parsed(); });
  if (chosen == commands.end()) {
    write_unchecked(stderr, app.help());
    return 2;
  }

  namespace log = eredu::log;
  log::set_level(flags.verbose ? log::Level::debug : flags.quiet ? log::Level::warn : log::Level::info);
  try {
    return chosen->run(flags);
  } catch (const UsageError& e) {
    return usage_error(e.what());
  } catch (const Interrupted& e) {
    document(interrupted_document(name, e.what()));
    write_unchecked(stderr, fmt::format("{}: {}\n", who, eredu::printable(e.what())));
    return e.exit_code();
  } catch (...) {
    // What the system refused (a thread, a descriptor, memory) is reported by its kind.
    const std::exception_ptr error = typed_failure(std::current_exception());
    // A report that could not be written is not the command's failure: finish_output
    // states it (fmt::print threw it from a write to stdout).
    try {
      std::rethrow_exception(error);
    } catch (const eredu::Error&) {
      // The command's own failure, reported below.
    } catch (const std::system_error& e) {
      if (stdout_failed()) {
        remember_stdout_error(e.code().value());
        return 1;
      }
    } catch (...) {}
    // A signal that arrived while the command failed: the failure may be what the signal's
    // cancellation caused (a read that stopped), so the interruption is what is reported.
    if (const int signo = pending_signal()) {
      const Interrupted interrupted(signo, "working");
      document(interrupted_document(name, interrupted.what()));
      write_unchecked(stderr, fmt::format("{}: {}\n", who, eredu::printable(interrupted.what())));
      return interrupted.exit_code();
    }
    document(error_document(name, error));
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      // An eredu::Error's message is printable already; a std::filesystem_error's holds raw paths.
      write_unchecked(stderr, fmt::format("{}: {}\n", who, eredu::printable(e.what())));
    } catch (...) {
      write_unchecked(stderr, fmt::format("{}: an unknown exception\n", who));
    }
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace eredu::cli;
  // Before anything can open a file or be interrupted: see output_streams.hpp, interrupt.hpp.
  guard_standard_descriptors();
  install_signal_handlers();
  std::string who = "eredu";
  int status = 1;
  try {
    status = run(argc, argv, who);
  } catch (...) {
    // Only allocation can fail here (building a report): say what can be said.
    write_unchecked(stderr, "eredu: out of memory while reporting a failure\n");
    status = 1;
  }
  return finish_output(status, who);
}
