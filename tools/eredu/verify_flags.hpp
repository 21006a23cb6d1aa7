#pragma once
/// \file
/// `--verify off|on|require` and `--checksums FILE` of `eredu load`, `pipeline` and `swap`:
/// where the digests come from, how `require` fails and the one report line that says what
/// was verified.

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "eredu/engine/orchestration/verify_options.hpp"
#include "eredu/io/formats/catalog.hpp"
#include "eredu/io/integrity/checksums.hpp"

namespace eredu::cli {

/// The digests of `path` for --verify `mode`: none for off; otherwise those of `sidecar`
/// when given (--checksums), else the checkpoint's metadata plus its sidecar
/// (io::Checksums::discover). Under require, throws Error(invalid_argument) naming the first
/// tensor without a digest and where digests come from. Under on, warns when there are none
/// or too few, saying "<subject> nothing" / "only those", when `subject` is not empty.
io::Checksums checksums_for(const std::string& path, const io::Catalog& catalog, const std::string& mode,
                            const std::string& sidecar = {}, const std::string& subject = {});

/// The engine's VerifyOptions for --verify `mode` with `checksums`.
engine::VerifyOptions verify_options(const std::string& mode, io::Checksums checksums);

/// Adds --verify (choices off, on, require; `mode`'s value is the default) and --checksums
/// FILE to `command`; `what` says when the check happens ("as each tensor lands").
void add_verify_flags(CLI::App& command, std::string& mode, std::string& sidecar, const std::string& what);

/// The report line after "  verify   ": "off", "N of M tensors (X) verified, SHA-256 ..." or,
/// under on with nothing verified, "on, but nothing was verified (...)".
std::string verify_summary(const std::string& mode, std::uint64_t verified, std::uint64_t verified_bytes,
                           std::uint64_t unverified, std::size_t digests);

}  // namespace eredu::cli
