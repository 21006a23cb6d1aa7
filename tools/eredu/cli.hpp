#pragma once
// Small helpers shared by the eredu subcommands: argument parsing, byte sizes, JSON
// strings, a terminal progress bar and process statistics.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace eredu::cli {

/// Parsed command line of one subcommand: positional arguments and --flag [value] pairs.
struct Args {
  std::vector<std::string> positional;       ///< arguments without a leading --
  std::map<std::string, std::string> flags;  ///< --name value (value "" for switches)
  /// The flag's value, or `fallback`.
  std::string get(const std::string& name, const std::string& fallback) const;
  /// True when the switch was given.
  bool has(const std::string& name) const { return flags.count(name) != 0; }
};

/// Splits argv into positional arguments and flags; `switches` take no value.
/// Throws std::invalid_argument for an unknown flag or a missing value.
Args parse_args(int argc, char** argv, int first, const std::vector<std::string>& valued,
                const std::vector<std::string>& switches);

/// Parses "256M", "4GiB", "1.5G", "4096" (powers of 1024); throws std::invalid_argument.
std::uint64_t parse_bytes(std::string_view text);
/// "1.50 GiB" style.
std::string format_bytes(std::uint64_t bytes);

/// Peak resident set size of this process in bytes.
std::uint64_t peak_rss_bytes();

/// A one-line progress bar on stderr, drawn only when stderr is a terminal, at most ten
/// times a second; finish() clears it.
class Progress {
 public:
  /// `label` precedes the bar; `total` is the 100% mark in bytes.
  Progress(std::string label, std::uint64_t total);
  /// Redraws with `done` bytes done if enough time has passed.
  void update(std::uint64_t done);
  /// Clears the line.
  void finish();

 private:
  std::string label_;
  std::uint64_t total_;
  bool enabled_;
  double start_;
  double last_ = 0;
};

/// Seconds on a monotonic clock.
double now_seconds();

}  // namespace eredu::cli
