#pragma once
/// \file
/// The command line's conventions, on top of CLI11. Every value is parsed completely and
/// range-checked while the command line is parsed, before a command starts: "2x", "-1",
/// "1e30", "abc" or a value outside the accepted range is a usage error (exit status 2)
/// whose message names the option and the range ("--depth: '100000' is not an integer from
/// 1 to 256"). No out-of-range value reaches the library. Every option's help line states
/// its range and default, so `--help`, docs/cli.md and the checks agree.

#include <CLI/CLI.hpp>
#include <charconv>
#include <concepts>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "eredu/app/option_presets.hpp"

namespace eredu::cli {

/// Parses a byte size: digits, an optional fraction, and an optional unit K, M, G or T
/// (powers of 1024; "Ki", "KiB", "KB" and lower case mean the same), e.g. "4096", "256M",
/// "1.5GiB". Nothing else is accepted (no sign, exponent, spaces or trailing text); a value
/// above 2^64 - 1 is nullopt too. A fraction is rounded down to whole bytes.
std::optional<std::uint64_t> parse_bytes(std::string_view text) noexcept;

/// `n` as help texts spell it: "256M", "4K", "1T" when `n` is a whole multiple of the unit,
/// the plain number of bytes otherwise; parse_bytes reads it back as `n`.
std::string size_text(std::uint64_t n);

/// Parses a decimal integer of type T completely: an optional '-' only for signed types, no
/// '+', spaces, base prefix or trailing text; nullopt when malformed or out of T's range.
template <std::integral T>
std::optional<T> parse_integer(std::string_view text) noexcept {
  if (text.empty() || text.front() == '+') return std::nullopt;
  if constexpr (std::is_unsigned_v<T>)
    if (text.front() == '-') return std::nullopt;
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, 10);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

/// Flags every subcommand takes; main() applies them (log level, output mode).
struct CommonFlags {
  bool json = false;     ///< --json: one JSON object on stdout instead of the text report
  bool quiet = false;    ///< -q/--quiet: no progress, no informational lines (warnings stay)
  bool verbose = false;  ///< -v/--verbose: the library's debug lines too
};

/// The exit status every command follows (printed at the end of every --help).
inline constexpr const char* exit_status_text =
    "Exit status: 0 success; 1 the command ran and failed (an eredu error, a mismatch, a budget exceeded, a "
    "rejected swap, nothing verifiable under --verify require, output that stdout or stderr could not take); 2 a "
    "usage error; 129, 130, 143 interrupted by SIGHUP, SIGINT, SIGTERM.";

/// Adds the subcommand `name` to `app`: `summary` is its line in `eredu --help`, `details`
/// (with the exit status) ends its own --help.
CLI::App* add_command(CLI::App& app, const std::string& name, const std::string& summary, const std::string& details);

/// Adds -q/--quiet and -v/--verbose to `command`, and --json where `with_json`.
void add_common_flags(CLI::App& command, CommonFlags& flags, bool with_json);

/// The validator behind add_integer: accepts what parse_integer<T> reads and [min, max].
template <std::integral T>
CLI::Validator integer_in(T min, T max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        const std::optional<T> v = parse_integer<T>(text);
        if (v && *v >= min && *v <= max) return {};
        return fmt::format("'{}' is not an integer from {} to {}", text, min, max);
      },
      "", "integer_in");
}

/// An integer option accepting [min, max], stored into `value` (whose current value is the
/// default shown, unless `default_text` says it otherwise, e.g. "the number of CPUs").
template <std::integral T>
CLI::Option* add_integer(CLI::App& command, const std::string& name, T& value, T min, T max, const std::string& what,
                         const std::string& default_text = {}) {
  const std::string shown = default_text.empty() ? fmt::format("{}", value) : default_text;
  return command.add_option(name, value, fmt::format("{} ({} to {}; default {})", what, min, max, shown))
      ->type_name("N")
      ->check(integer_in<T>(min, max));
}

/// A byte-size option (parse_bytes) accepting [min, max], and also 0 when `zero` names what
/// 0 means ("one lease per tensor"). `default_text` overrides the shown default.
CLI::Option* add_bytes(CLI::App& command, const std::string& name, std::uint64_t& value, std::uint64_t min,
                       std::uint64_t max, const std::string& what, const std::string& zero = {},
                       const std::string& default_text = {});

/// add_integer accepting one of app's shared ranges (eredu/app/option_presets.hpp).
template <std::integral T>
CLI::Option* add_integer(CLI::App& command, const std::string& name, T& value, app::Range range,
                         const std::string& what, const std::string& default_text = {}) {
  return add_integer(command, name, value, static_cast<T>(range.min), static_cast<T>(range.max), what, default_text);
}

/// add_bytes accepting one of app's shared ranges (eredu/app/option_presets.hpp).
inline CLI::Option* add_bytes(CLI::App& command, const std::string& name, std::uint64_t& value, app::Range range,
                              const std::string& what, const std::string& zero = {},
                              const std::string& default_text = {}) {
  return add_bytes(command, name, value, range.min, range.max, what, zero, default_text);
}

/// An option taking one of `choices` (its current value is the default shown); `any_case`
/// accepts them in any letter case (the value keeps the case given).
CLI::Option* add_choice(CLI::App& command, const std::string& name, std::string& value,
                        std::vector<std::string> choices, const std::string& what, bool any_case = false);

/// The choices add_choice registered for `option` (for shell completion); empty otherwise.
const std::vector<std::string>& choices_of(const CLI::Option* option);

/// A required positional argument naming a file or directory.
CLI::Option* add_path(CLI::App& command, const std::string& name, std::string& value, const std::string& what);

/// A bash completion script for `app` and its subcommands, their options and choices (what
/// `eredu --completion-bash` prints, as llama.cpp's tools do, and what is installed).
std::string bash_completion(const CLI::App& app);

}  // namespace eredu::cli
