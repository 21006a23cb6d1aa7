#include "cli.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include <fmt/format.h>

namespace eredu::cli {

std::string Args::get(const std::string& name, const std::string& fallback) const {
  auto it = flags.find(name);
  return it == flags.end() ? fallback : it->second;
}

Args parse_args(int argc, char** argv, int first, const std::vector<std::string>& valued,
                const std::vector<std::string>& switches) {
  Args a;
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg == "--") {
      a.positional.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::string value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (std::find(switches.begin(), switches.end(), name) != switches.end()) {
      a.flags[name] = "";
    } else if (std::find(valued.begin(), valued.end(), name) != valued.end()) {
      if (value.empty()) {
        if (i + 1 >= argc) throw std::invalid_argument(fmt::format("--{} needs a value", name));
        value = argv[++i];
      }
      a.flags[name] = value;
    } else {
      throw std::invalid_argument(fmt::format("unknown option --{}", name));
    }
  }
  return a;
}

std::uint64_t parse_bytes(std::string_view text) {
  std::string s(text);
  std::size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(s, &pos);
  } catch (...) {
    throw std::invalid_argument(fmt::format("'{}' is not a byte size (e.g. 256M, 4GiB)", text));
  }
  std::string unit = s.substr(pos);
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return std::toupper(c); });
  if (unit.size() > 1 && unit.back() == 'B') unit.pop_back();
  if (unit.size() > 1 && unit.back() == 'I') unit.pop_back();
  double mult = 1;
  if (unit == "" || unit == "B")
    mult = 1;
  else if (unit == "K")
    mult = 1024.0;
  else if (unit == "M")
    mult = 1024.0 * 1024;
  else if (unit == "G")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "T")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else
    throw std::invalid_argument(fmt::format("'{}': unknown unit (use K, M, G, T)", text));
  if (value < 0 || !std::isfinite(value)) throw std::invalid_argument(fmt::format("'{}' is negative", text));
  return static_cast<std::uint64_t>(value * mult);
}

std::string format_bytes(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.2f} {}", v, units[u]);
}

std::uint64_t peak_rss_bytes() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<std::uint64_t>(ru.ru_maxrss) * 1024;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Progress::Progress(std::string label, std::uint64_t total)
    : label_(std::move(label)), total_(total), enabled_(::isatty(STDERR_FILENO) == 1), start_(now_seconds()) {}

void Progress::update(std::uint64_t done) {
  if (!enabled_) return;
  double t = now_seconds();
  if (t - last_ < 0.1 && done < total_) return;
  last_ = t;
  const int width = 30;
  double frac = total_ ? static_cast<double>(done) / static_cast<double>(total_) : 1.0;
  int filled = static_cast<int>(frac * width);
  double rate = static_cast<double>(done) / std::max(1e-9, t - start_) / 1e9;
  std::fprintf(stderr, "\r%s [%s%s] %3d%% %s / %s  %.2f GB/s ", label_.c_str(), std::string(filled, '#').c_str(),
               std::string(width - filled, ' ').c_str(), static_cast<int>(frac * 100), format_bytes(done).c_str(),
               format_bytes(total_).c_str(), rate);
  std::fflush(stderr);
}

void Progress::finish() {
  if (enabled_) std::fprintf(stderr, "\r\033[K");
}

}  // namespace eredu::cli
