#include "remote_flags.hpp"

#include "options.hpp"

namespace eredu::cli {

void add_remote_flags(CLI::App& command, RemoteFlags& flags) {
  const std::string group = "Remote checkpoints (https://, http://, s3://; docs/remote.md)";
  command
      .add_option("--cache", flags.cache,
                  "keep whole objects in this directory, shared by processes, and load them "
                  "from there while their ETag is unchanged (default: no cache)")
      ->type_name("DIR")
      ->group(group);
  add_bytes(command, "--cache-max", flags.cache_max, 0, std::uint64_t{1} << 50,
            "bound on the cache's size: least recently used objects are removed past it", "unbounded", "unbounded")
      ->group(group);
  command
      .add_option("--ca-file", flags.ca_file, "verify HTTPS servers against this PEM bundle instead of the system's")
      ->type_name("FILE")
      ->check(CLI::ExistingFile)
      ->group(group);
  command
      .add_option("--s3-endpoint", flags.s3_endpoint,
                  "S3 endpoint URL (MinIO, Ceph, R2, GCS: https://storage.googleapis.com); default "
                  "$AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, else AWS")
      ->type_name("URL")
      ->group(group);
  command
      .add_option("--s3-region", flags.s3_region, "region to sign for (default $AWS_REGION, the profile's, us-east-1)")
      ->type_name("NAME")
      ->group(group);
  add_choice(command, "--s3-addressing", flags.s3_addressing, {"auto", "path", "virtual"},
             "bucket in the path (host/bucket/key) or the host name (bucket.host/key); auto: virtual on AWS, path "
             "on a custom endpoint")
      ->group(group);
  command.add_flag("--anonymous", flags.anonymous, "send S3 requests unsigned (public buckets), even with credentials")
      ->group(group);
  add_bytes(command, "--part-size", flags.part, 4096, std::uint64_t{1} << 30, "bytes of one ranged GET")->group(group);
  add_integer(command, "--connections", flags.connections, 1u, 1024u, "ranged GETs in flight at once")->group(group);
}

io::RemoteOptions remote_options(const RemoteFlags& flags) {
  io::RemoteOptions o;
  o.cache_dir = flags.cache;
  o.cache_max_bytes = flags.cache_max;
  o.http.ca_file = flags.ca_file;
  o.s3.endpoint = flags.s3_endpoint;
  o.s3.region = flags.s3_region;
  o.s3.addressing = flags.s3_addressing == "path"      ? io::S3Options::Addressing::path
                    : flags.s3_addressing == "virtual" ? io::S3Options::Addressing::virtual_host
                                                       : io::S3Options::Addressing::automatic;
  o.s3.anonymous = flags.anonymous;
  o.part_bytes = static_cast<std::size_t>(flags.part);
  o.concurrency = flags.connections;
  o.http.max_transfers = std::max(o.http.max_transfers, flags.connections);
  return o;
}

}  // namespace eredu::cli
