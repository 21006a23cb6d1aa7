#include "options.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <utility>

#include <fmt/format.h>

namespace eredu::cli {
namespace {

struct Unit {
  const char* name;
  unsigned shift;
};
constexpr Unit units[] = {{"T", 40}, {"G", 30}, {"M", 20}, {"K", 10}};

// Choices of every add_choice option, for shell completion. Filled while the command line
// is defined (before parsing), read by bash_completion(); the tool is single-threaded then.
std::map<const CLI::Option*, std::vector<std::string>>& choice_registry() {
  static std::map<const CLI::Option*, std::vector<std::string>> registry;
  return registry;
}

}  // namespace

std::optional<std::uint64_t> parse_bytes(std::string_view text) noexcept {
  std::size_t i = 0;
  std::uint64_t whole = 0;
  std::size_t whole_digits = 0;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i, ++whole_digits) {
    if (__builtin_mul_overflow(whole, 10u, &whole) || __builtin_add_overflow(whole, text[i] - '0', &whole))
      return std::nullopt;
  }
  // The fraction, as a numerator over 10^k; digits past the sixth are dropped (a millionth
  // of a unit is below a byte up to M, and keeps (frac << 40) within 64 bits for T).
  std::uint64_t frac = 0, frac_scale = 1;
  std::size_t frac_digits = 0;
  if (i < text.size() && text[i] == '.') {
    ++i;
    for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i, ++frac_digits) {
      if (frac_digits < 6) {
        frac = frac * 10 + static_cast<std::uint64_t>(text[i] - '0');
        frac_scale *= 10;
      }
    }
    if (frac_digits == 0) return std::nullopt;  // "1." is not a size
  }
  if (whole_digits == 0) return std::nullopt;  // ".5M", "M", ""
  std::string unit(text.substr(i));
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return std::toupper(c); });
  if (unit.size() > 1 && unit.back() == 'B') unit.pop_back();
  if (unit.size() > 1 && unit.back() == 'I') unit.pop_back();
  unsigned shift = 0;
  if (!unit.empty() && unit != "B") {
    const auto* u = std::find_if(std::begin(units), std::end(units), [&](const Unit& x) { return unit == x.name; });
    if (u == std::end(units)) return std::nullopt;
    shift = u->shift;
  }
  if (shift == 0 && frac_digits > 0) return std::nullopt;  // "1.5" bytes
  if (shift > 0 && whole > (std::numeric_limits<std::uint64_t>::max() >> shift)) return std::nullopt;
  std::uint64_t bytes = whole << shift;
  // frac / frac_scale of a unit, rounded down.
  const std::uint64_t part = (frac << shift) / frac_scale;
  if (__builtin_add_overflow(bytes, part, &bytes)) return std::nullopt;
  return bytes;
}

std::string size_text(std::uint64_t n) {
  if (n != 0)
    for (const Unit& u : units)
      if (n % (std::uint64_t{1} << u.shift) == 0) return fmt::format("{}{}", n >> u.shift, u.name);
  return fmt::format("{}", n);
}

CLI::App* add_command(CLI::App& app, const std::string& name, const std::string& summary, const std::string& details) {
  CLI::App* command = app.add_subcommand(name, summary);
  command->set_help_flag("-h,--help", "print this help and exit");
  command->set_help_all_flag();  // --help-all is the top level's
  command->footer(details.empty() ? std::string(exit_status_text) : details + "\n\n" + exit_status_text);
  return command;
}

void add_common_flags(CLI::App& command, CommonFlags& flags, bool with_json) {
  if (with_json)
    command.add_flag("--json", flags.json,
                     "print one JSON object on stdout instead of the text report (docs/cli.md has the schema)");
  command.add_flag("-q,--quiet", flags.quiet, "no progress display and no informational lines; warnings remain");
  command.add_flag("-v,--verbose", flags.verbose, "also print the library's debug lines");
}

CLI::Option* add_bytes(CLI::App& command, const std::string& name, std::uint64_t& value, std::uint64_t min,
                       std::uint64_t max, const std::string& what, const std::string& zero,
                       const std::string& default_text) {
  const bool zero_ok = !zero.empty();
  const std::string range = fmt::format("{}{} to {}", zero_ok ? "0 or " : "", size_text(min), size_text(max));
  std::string help =
      fmt::format("{} ({}; default {}", what, range, default_text.empty() ? size_text(value) : default_text);
  if (zero_ok) help += fmt::format("; 0: {}", zero);
  help += ")";
  CLI::Validator check(
      [min, max, zero_ok, range](std::string& text) -> std::string {
        const std::optional<std::uint64_t> v = parse_bytes(text);
        if (v && ((*v >= min && *v <= max) || (*v == 0 && zero_ok))) {
          text = std::to_string(*v);  // what CLI11 then stores, exactly
          return {};
        }
        return fmt::format("'{}' is not a byte size from {} (e.g. 4096, 256M, 1.5G)", text, range);
      },
      "", "byte_size");
  return command.add_option(name, value, help)->type_name("SIZE")->transform(check);
}

CLI::Option* add_choice(CLI::App& command, const std::string& name, std::string& value,
                        std::vector<std::string> choices, const std::string& what, bool any_case) {
  const std::string list = fmt::format("{}", fmt::join(choices, "|"));
  CLI::Validator check(
      [choices, any_case](std::string& text) -> std::string {
        std::string key = text;
        if (any_case)
          std::transform(key.begin(), key.end(), key.begin(),
                         [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        if (std::find(choices.begin(), choices.end(), key) != choices.end()) return {};
        return fmt::format("'{}' is not one of {}", text, fmt::join(choices, ", "));
      },
      "", "choice");
  CLI::Option* option =
      command.add_option(name, value, fmt::format("{} (default {})", what, value))->type_name(list)->check(check);
  choice_registry()[option] = std::move(choices);
  return option;
}

const std::vector<std::string>& choices_of(const CLI::Option* option) {
  static const std::vector<std::string> none;
  auto it = choice_registry().find(option);
  return it == choice_registry().end() ? none : it->second;
}

CLI::Option* add_path(CLI::App& command, const std::string& name, std::string& value, const std::string& what) {
  return command.add_option(name, value, what)->required()->type_name("");
}

std::string bash_completion(const CLI::App& app) {
  auto names_of = [](const CLI::Option* o) {
    std::vector<std::string> names;
    for (const std::string& s : o->get_snames()) names.push_back("-" + s);
    for (const std::string& l : o->get_lnames()) names.push_back("--" + l);
    return names;
  };
  std::vector<std::string> top = {"-h", "--help", "--help-all", "--version", "--completion-bash"};
  std::string cases;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    top.push_back(sub->get_name());
    std::vector<std::string> all, valued;
    std::string choice_cases;
    for (const CLI::Option* o : sub->get_options()) {
      if (o->get_positional()) continue;
      const std::vector<std::string> names = names_of(o);
      all.insert(all.end(), names.begin(), names.end());
      if (o->get_expected_max() == 0) continue;  // a flag
      if (const auto& choices = choices_of(o); !choices.empty())
        choice_cases += fmt::format("        {}) COMPREPLY=($(compgen -W \"{}\" -- \"$cur\")); return ;;\n",
                                    fmt::join(names, "|"), fmt::join(choices, " "));
      else
        valued.insert(valued.end(), names.begin(), names.end());
    }
    cases += fmt::format(
        "    {0})\n"
        "      case \"$prev\" in\n"
        "{1}"
        "{2}"
        "      esac\n"
        "      if [[ \"$cur\" == -* ]]; then COMPREPLY=($(compgen -W \"{3}\" -- \"$cur\")); return; fi\n"
        "      COMPREPLY=($(compgen -f -- \"$cur\")) ;;\n",
        sub->get_name(), choice_cases,
        valued.empty() ? std::string() : fmt::format("        {}) return ;;  # a value\n", fmt::join(valued, "|")),
        fmt::join(all, " "));
  }
  std::vector<std::string> commands(top.begin() + 5, top.end());
  return fmt::format(
      "# bash completion for eredu; generated by `eredu --completion-bash`, which prints the\n"
      "# options of the binary it comes from. Install as bash-completion/completions/eredu, or\n"
      "# source it: source <(eredu --completion-bash)\n"
      "_eredu() {{\n"
      "  local cur=\"${{COMP_WORDS[COMP_CWORD]}}\" prev=\"${{COMP_WORDS[COMP_CWORD-1]}}\" cmd=\"\" i\n"
      "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
      "    case \"${{COMP_WORDS[i]}}\" in {0}) cmd=\"${{COMP_WORDS[i]}}\"; break ;; esac\n"
      "  done\n"
      "  case \"$cmd\" in\n"
      "    \"\") COMPREPLY=($(compgen -W \"{1}\" -- \"$cur\")) ;;\n"
      "{2}"
      "  esac\n"
      "}}\n"
      "complete -o filenames -F _eredu eredu\n",
      fmt::join(commands, "|"), fmt::join(top, " "), cases);
}

}  // namespace eredu::cli
