#include "remote_catalog.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <future>
#include <map>
#include <mutex>

#include "../formats/catalog_assembly.hpp"
#include "eredu/core/error.hpp"
#include "eredu/io/formats/sharded_index.hpp"
#include "eredu/io/formats/split_gguf.hpp"
#include "eredu/io/remote/remote_url.hpp"

namespace eredu::io::detail {

namespace {

constexpr std::string_view index_file_name = "model.safetensors.index.json";

// Where one object is and how its requests are signed.
struct Target {
  std::string url;      // absolute http(s) URL
  std::string display;  // for messages
  const RequestSigner* signer = nullptr;
};

// The first bytes of an object, its size and its ETag, from one ranged GET.
struct Probe {
  RemoteObject object;
  std::vector<std::byte> head;
};

// Serves a format parser from the probe's bytes, and the rest of a long header with more
// ranged GETs pinned to the probe's ETag.
class RemoteHeaderReader final : public HeaderReader {
 public:
  RemoteHeaderReader(HttpClient& client, const Probe& probe) : client_(client), probe_(probe) {}
  void read(std::uint64_t offset, std::span<std::byte> dest, const char* what) override {
    const auto& head = probe_.head;
    std::size_t done = 0;
    if (offset < head.size()) {
      done = static_cast<std::size_t>(std::min<std::uint64_t>(dest.size(), head.size() - offset));
      std::memcpy(dest.data(), head.data() + offset, done);
    }
    if (done == dest.size()) return;
    const std::uint64_t at = offset + done;
    if (at >= probe_.object.size) {
      throw Error(errc::unexpected_eof, {.file = probe_.object.display, .offset = at},
                  fmt::format("the object ended at offset {} while reading its {}", probe_.object.size, what));
    }
    RangeResult r = client_.get_blocking(RangeGet{.url = probe_.object.url,
                                                  .offset = at,
                                                  .dest = dest.subspan(done),
                                                  .if_match = probe_.object.etag,
                                                  .signer = probe_.object.signer,
                                                  .allow_short = true});
    if (r.bytes != dest.size() - done) {
      throw Error(errc::unexpected_eof, {.file = probe_.object.display, .offset = at + r.bytes},
                  fmt::format("the object ended at offset {} while reading its {}", at + r.bytes, what));
    }
  }

 private:
  HttpClient& client_;
  const Probe& probe_;
};

// Probes fetched concurrently: one ranged GET of the first header_probe_bytes of each target.
std::vector<Probe> probe_all(RemoteSession& session, const std::vector<Target>& targets) {
  std::vector<Probe> probes(targets.size());
  std::vector<std::promise<void>> done(targets.size());
  std::vector<std::future<void>> waits;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    probes[i].object.url = targets[i].url;
    probes[i].object.display = targets[i].display;
    probes[i].object.signer = targets[i].signer;
    probes[i].head.resize(session.options.header_probe_bytes);
    waits.push_back(done[i].get_future());
    session.client->get(RangeGet{.url = targets[i].url,
                                 .offset = 0,
                                 .dest = probes[i].head,
                                 .signer = targets[i].signer,
                                 .allow_short = true},
                        [&probes, &done, i](std::exception_ptr e, RangeResult r) {
                          if (e) {
                            done[i].set_exception(e);
                            return;
                          }
                          probes[i].head.resize(r.bytes);
                          probes[i].object.etag = std::move(r.etag);
                          probes[i].object.size = r.object_size;
                          done[i].set_value();
                        });
  }
  // Every callback must have run before `probes` and `done` go: wait for all, then throw the
  // first failure.
  std::exception_ptr first;
  for (auto& w : waits) {
    try {
      w.get();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
  return probes;
}

ParsedFile parse_probe(RemoteSession& session, const Probe& probe) {
  RemoteHeaderReader reader(*session.client, probe);
  const std::size_t head = std::min<std::size_t>(probe.head.size(), 64);
  return parse_layout(reader, std::span(probe.head.data(), head), probe.object.size, probe.object.display);
}

// The session's endpoint for `bucket`, resolved (region, credentials) at its first use.
const S3Endpoint& endpoint_for(RemoteSession& session, const std::string& bucket) {
  for (const auto& e : session.endpoints) {
    if (e->bucket() == bucket) return *e;
  }
  session.endpoints.push_back(std::make_unique<S3Endpoint>(bucket, session.options.s3));
  return *session.endpoints.back();
}

Target target_of(RemoteSession& session, const RemoteUrl& url) {
  if (url.scheme != RemoteUrl::Scheme::s3) return {url.text, redacted(url), nullptr};
  const S3Endpoint& endpoint = endpoint_for(session, url.host);
  return {endpoint.object_url(url.path), redacted(url), endpoint.signer()};
}

RemoteCheckpoint finish(Catalog catalog, std::map<std::string, RemoteObject>& objects) {
  RemoteCheckpoint out;
  for (const auto& f : catalog.files()) out.objects.push_back(objects.at(f.path));
  out.catalog = std::move(catalog);
  return out;
}

RemoteCheckpoint open_file_url(RemoteSession& session, const RemoteUrl& url) {
  std::map<std::string, RemoteObject> objects;
  const std::string name = url.path.substr(url.path.rfind('/') + 1);
  if (auto split = gguf::parse_split_name(name); split && split->count > 1) {
    std::vector<Target> targets;
    for (std::uint32_t i = 1; i <= split->count; ++i)
      targets.push_back(target_of(session, sibling(url, gguf::split_file_name(split->prefix, i, split->count))));
    std::vector<Probe> probes = probe_all(session, targets);
    std::map<std::string, const Probe*> by_name;
    for (std::uint32_t i = 1; i <= split->count; ++i)
      by_name[gguf::split_file_name(split->prefix, i, split->count)] = &probes[i - 1];
    Catalog catalog = assemble_split_gguf(*split, name, [&](const std::string& n, const Naming&) {
      const Probe& p = *by_name.at(n);
      objects[p.object.display] = p.object;
      return parse_probe(session, p);
    });
    return finish(std::move(catalog), objects);
  }
  std::vector<Probe> probes = probe_all(session, {target_of(session, url)});
  objects[probes[0].object.display] = probes[0].object;
  return finish(assemble_single(parse_probe(session, probes[0])), objects);
}

RemoteCheckpoint open_index_url(RemoteSession& session, const RemoteUrl& url) {
  const Target index_target = target_of(session, url);
  DocumentResult doc = session.client->get_blocking(
      DocumentGet{.url = index_target.url, .signer = index_target.signer, .max_bytes = std::size_t{64} << 20});
  const ShardedIndex index = parse_sharded_index(doc.body, index_target.display);
  const std::vector<std::string> names = index.shards();
  std::vector<Target> targets;
  for (const auto& n : names) targets.push_back(target_of(session, sibling(url, n)));
  std::vector<Probe> probes;
  try {
    probes = probe_all(session, targets);
  } catch (const Error& e) {
    // A shard the index names but the server lacks: the kind a local shard_missing has.
    if (e.kind() != errc::remote_not_found) throw;
    throw Error(errc::shard_missing, e.context(),
                fmt::format("a shard named by {} is missing: {}", index_target.display, e.detail()));
  }
  std::map<std::string, const Probe*> by_name;
  for (std::size_t i = 0; i < names.size(); ++i) by_name[names[i]] = &probes[i];
  std::map<std::string, RemoteObject> objects;
  Catalog catalog = assemble_sharded(index, index_target.display, [&](const std::string& n, const Naming&) {
    const Probe& p = *by_name.at(n);
    objects[p.object.display] = p.object;
    return parse_probe(session, p);
  });
  return finish(std::move(catalog), objects);
}

// An s3:// prefix: searched as a local directory is (open_catalog.hpp).
RemoteCheckpoint open_s3_prefix(RemoteSession& session, const RemoteUrl& url) {
  std::string prefix = url.path;
  if (!prefix.empty() && !prefix.ends_with('/')) prefix += '/';
  RemoteUrl dir = url;
  dir.path = prefix;
  const S3Endpoint& endpoint = endpoint_for(session, url.host);
  const std::vector<S3Object> listed = list_objects(*session.client, endpoint, prefix);
  std::vector<std::string> names;  // directly under the prefix
  for (const auto& o : listed) {
    const std::string rest = o.key.substr(prefix.size());
    if (!rest.empty() && rest.find('/') == std::string::npos) names.push_back(rest);
  }
  std::sort(names.begin(), names.end());
  const std::string shown = redacted(dir);
  auto with = [&](const std::string& n) {
    RemoteUrl u = dir;
    u.path = prefix + n;
    u.text = "s3://" + u.host + "/" + u.path;
    return u;
  };
  if (std::find(names.begin(), names.end(), index_file_name) != names.end())
    return open_index_url(session, with(std::string(index_file_name)));
  std::vector<std::string> st, gg;
  for (const auto& n : names) {
    if (n.ends_with(".safetensors")) st.push_back(n);
    if (n.ends_with(".gguf")) gg.push_back(n);
  }
  if (st.size() == 1) return open_file_url(session, with(st.front()));
  if (st.empty() && !gg.empty()) {
    const auto first = gguf::parse_split_name(gg.front());
    if (gg.size() == 1 || (first && first->count == gg.size())) return open_file_url(session, with(gg.front()));
    throw Error(errc::unknown_format, {.file = shown},
                fmt::format("the prefix holds {} *.gguf objects that are not one split set; open one", gg.size()));
  }
  if (st.empty()) {
    throw Error(listed.empty() ? errc::remote_not_found : errc::unknown_format, {.file = shown},
                listed.empty() ? std::string("the prefix lists no object")
                               : fmt::format("the prefix holds no checkpoint: no {}, no *.safetensors and no *.gguf",
                                             index_file_name));
  }
  throw Error(errc::unknown_format, {.file = shown},
              fmt::format("the prefix holds {} *.safetensors objects ({}, {}, ...) and no {}; open one, or the index",
                          st.size(), st[0], st[1], index_file_name));
}

}  // namespace

RemoteSession::RemoteSession(const RemoteOptions& o) : options(o) {
  validate(options);
  client = std::make_unique<HttpClient>(options.http);
  if (!options.cache_dir.empty()) cache = std::make_unique<ObjectCache>(options.cache_dir, options.cache_max_bytes);
}

RemoteCheckpoint open_remote_catalog(RemoteSession& session, std::string_view location) {
  const RemoteUrl url = parse_remote_url(location);
  const std::string name = url.path.substr(url.path.rfind('/') == std::string::npos ? 0 : url.path.rfind('/') + 1);
  if (url.scheme == RemoteUrl::Scheme::s3 && (name.empty() || name.find('.') == std::string::npos))
    return open_s3_prefix(session, url);
  if (name.empty()) {
    throw Error(errc::invalid_argument, {.file = redacted(url)},
                "an http(s) URL must name a checkpoint file or a *.index.json (a directory cannot be listed)");
  }
  if (name.ends_with(".index.json")) return open_index_url(session, url);
  return open_file_url(session, url);
}

void download_object(HttpClient& client, const RemoteObject& object, const RemoteOptions& options, int fd) {
  // Parts of part_bytes, `concurrency` in flight, each written at its offset once it lands.
  const std::uint64_t part = options.part_bytes;
  const std::uint64_t parts = (object.size + part - 1) / part;
  std::mutex m;
  std::condition_variable cv;
  unsigned in_flight = 0;
  std::uint64_t next = 0;
  std::exception_ptr failure;
  auto write_all = [&](const std::vector<std::byte>& b, std::uint64_t at) {
    std::size_t done = 0;
    while (done < b.size()) {
      const ssize_t w = ::pwrite(fd, b.data() + done, b.size() - done, static_cast<off_t>(at + done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        throw Error(errc::io_error,
                    {.file = object.display, .offset = at + done, .os_error = {errno, std::system_category()}},
                    "cannot write the object into the cache");
      }
      done += static_cast<std::size_t>(w);
    }
  };
  std::unique_lock lock(m);
  while (true) {
    while (!failure && next < parts && in_flight < options.concurrency) {
      const std::uint64_t at = next * part;
      auto buffer =
          std::make_shared<std::vector<std::byte>>(static_cast<std::size_t>(std::min(part, object.size - at)));
      ++next;
      ++in_flight;
      lock.unlock();
      client.get(
          RangeGet{.url = object.url, .offset = at, .dest = *buffer, .if_match = object.etag, .signer = object.signer},
          [&, buffer, at](std::exception_ptr e, RangeResult) {
            if (!e) {
              try {
                write_all(*buffer, at);
              } catch (...) {
                e = std::current_exception();
              }
            }
            std::lock_guard g(m);
            if (e && !failure) failure = e;
            --in_flight;
            cv.notify_all();
          });
      lock.lock();
    }
    if (in_flight == 0 && (failure || next == parts)) break;
    cv.wait(lock);
  }
  if (failure) std::rethrow_exception(failure);
}

}  // namespace eredu::io::detail
