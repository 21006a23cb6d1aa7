#pragma once
// The catalog of a checkpoint behind a URL: its headers fetched with ranged GETs (the first
// MiB speculatively, the rest only where a header is longer), each object pinned by the ETag of
// that first answer, and a sharded checkpoint's or a split GGUF set's cross-checks run exactly
// as for local files (catalog_assembly.hpp). An `s3://` prefix is listed to find the checkpoint
// as a local directory is searched.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "eredu/io/formats/catalog.hpp"
#include "eredu/io/remote/http_client.hpp"
#include "eredu/io/remote/object_cache.hpp"
#include "eredu/io/remote/remote_options.hpp"
#include "eredu/io/remote/s3.hpp"
#include "remote_reader.hpp"

namespace eredu::io::detail {

/// What a source reading remote objects keeps alive: the options, the client, the S3 endpoints
/// whose signers its requests use, and the cache.
struct RemoteSession {
  /// Starts the client; opens the cache when options.cache_dir is set.
  explicit RemoteSession(const RemoteOptions& options);
  RemoteOptions options;
  std::unique_ptr<HttpClient> client;
  std::vector<std::unique_ptr<S3Endpoint>> endpoints;
  std::unique_ptr<ObjectCache> cache;
};

/// A remote checkpoint's catalog (file paths are the objects' URLs, redacted) and its objects,
/// parallel to the catalog's files.
struct RemoteCheckpoint {
  Catalog catalog;
  std::vector<RemoteObject> objects;
};

/// Opens the checkpoint at `location` (an `http(s)://` file or `*.index.json`, an `s3://`
/// object, or an `s3://` prefix). Blocking. Throws eredu::Error: the remote kinds, format
/// errors, unknown_format for a prefix without a checkpoint.
RemoteCheckpoint open_remote_catalog(RemoteSession& session, std::string_view location);

/// Downloads the whole of `object` into `fd` (parts in parallel, each pinned by the ETag):
/// the ObjectCache's fill. Blocking.
void download_object(HttpClient& client, const RemoteObject& object, const RemoteOptions& options, int fd);

}  // namespace eredu::io::detail
