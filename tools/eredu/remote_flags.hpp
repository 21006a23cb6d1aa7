#pragma once
/// \file
/// The options of every reading verb for a checkpoint behind a URL (`https://`, `http://`,
/// `s3://`): the local cache, the CA bundle, the S3 endpoint and region, and how many ranged
/// GETs of what size are in flight. docs/remote.md says what each does.

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "eredu/io/remote/remote_options.hpp"

namespace eredu::cli {

/// What the flags set (defaults: io::RemoteOptions').
struct RemoteFlags {
  std::string cache;                                       ///< --cache DIR
  std::uint64_t cache_max = 0;                             ///< --cache-max SIZE (0: unbounded)
  std::string ca_file;                                     ///< --ca-file FILE
  std::string s3_endpoint;                                 ///< --s3-endpoint URL
  std::string s3_region;                                   ///< --s3-region NAME
  std::string s3_addressing = "auto";                      ///< --s3-addressing auto|path|virtual
  bool anonymous = false;                                  ///< --anonymous
  std::uint64_t part = io::RemoteOptions{}.part_bytes;     ///< --part-size SIZE
  unsigned connections = io::RemoteOptions{}.concurrency;  ///< --connections N
};

/// Adds the flags to `command` (under the group "Remote checkpoints").
void add_remote_flags(CLI::App& command, RemoteFlags& flags);

/// The io::RemoteOptions the flags ask for.
io::RemoteOptions remote_options(const RemoteFlags& flags);

}  // namespace eredu::cli
