#include "verify_flags.hpp"

#include <algorithm>
#include <filesystem>
#include <iterator>

#include <fmt/format.h>

#include "cli.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/log.hpp"
#include "options.hpp"

namespace eredu::cli {

io::Checksums checksums_for(const std::string& path, const io::Catalog& catalog, const std::string& mode,
                            const std::string& sidecar, const std::string& subject) {
  if (mode == "off") return {};
  io::Checksums sums = sidecar.empty() ? io::Checksums::discover(path, catalog) : io::Checksums::from_sidecar(sidecar);
  const std::string where = sidecar.empty() ? io::Checksums::sidecar_path(path).string() : sidecar;
  if (mode == "require") {
    for (const io::TensorInfo& t : catalog.tensors())
      if (std::none_of(std::begin(io::digest_kinds), std::end(io::digest_kinds),
                       [&](io::DigestKind kind) { return sums.find(t.name, kind) != nullptr; }))
        throw Error(errc::invalid_argument, {.file = path, .tensor = t.name},
                    fmt::format("--verify require: no digest recorded for this tensor ({} of {} tensors have one; "
                                "digests come from \"sha256:<tensor>\" metadata or the sidecar {}, which `eredu gen "
                                "--checksums` writes)",
                                sums.size(), catalog.size(), where));
  } else if (subject.empty()) {
    // The caller reports what was verified itself (the engine logs one line under on).
  } else if (sums.empty()) {
    log::warn("{}: no checksums (no \"sha256:<tensor>\" metadata, no sidecar {}): {} nothing", path, where, subject);
  } else if (sums.size() < catalog.size()) {
    log::warn("{}: checksums for {} of its {} tensors: {} only those", path, sums.size(), catalog.size(), subject);
  }
  return sums;
}

engine::VerifyOptions verify_options(const std::string& mode, io::Checksums checksums) {
  engine::VerifyOptions v;
  v.mode = mode == "require" ? engine::VerifyMode::require
           : mode == "on"    ? engine::VerifyMode::on
                             : engine::VerifyMode::off;
  v.checksums = std::move(checksums);
  return v;
}

void add_verify_flags(CLI::App& command, std::string& mode, std::string& sidecar, const std::string& what) {
  add_choice(command, "--verify", mode, {"off", "on", "require"},
             fmt::format("digest verification {}, against \"sha256:<tensor>\" (or \"xxh3-128:<tensor>\") metadata, "
                         "the sidecar <file>.sha256.json / checksums.sha256.json of a directory, or --checksums: on "
                         "verifies what is recorded and says so when nothing is; require fails (exit status 1) unless "
                         "every tensor has a digest; off verifies nothing",
                         what));
  command
      .add_option("--checksums", sidecar,
                  "a sidecar JSON file of digests to verify against instead of the checkpoint's own (default: "
                  "none)")
      ->type_name("FILE")
      ->check(CLI::ExistingFile);
}

std::string verify_summary(const std::string& mode, std::uint64_t verified, std::uint64_t verified_bytes,
                           std::uint64_t unverified, std::size_t digests) {
  if (mode == "off") return "off: nothing was verified";
  if (verified == 0)
    return fmt::format("{}, but nothing was verified ({} digests found; {} tensors without one)", mode, digests,
                       unverified);
  return fmt::format("{}: {} tensors ({}) matched their digests{}", mode, verified, format_bytes(verified_bytes),
                     unverified ? fmt::format(", {} without one were not verified", unverified) : std::string());
}

}  // namespace eredu::cli
