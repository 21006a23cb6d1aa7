#include "eredu/io/integrity/checksums.hpp"

#include <unistd.h>

#include <algorithm>
#include <asio/cancellation_state.hpp>
#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_awaitable.hpp>
#include <cctype>
#include <cerrno>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "eredu/core/completion.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/trace.hpp"
#include "eredu/core/unique_function.hpp"
#include "eredu/io/formats/json_text.hpp"
#include "eredu/io/mapping/guarded_read.hpp"
#include "eredu/io/reading/lease.hpp"
#include "eredu/io/reading/regular_file.hpp"
#include "json.hpp"

namespace eredu::io {
namespace {

// A sidecar lists one digest per tensor: far below this even for huge checkpoints.
constexpr std::uintmax_t max_sidecar_bytes = 64u << 20;
constexpr auto& kinds = digest_kinds;
// Bytes hashed from a mapping per task: small enough that cancellation is checked often and
// the mapped pages (which count in RSS until released) stay few, large enough that posting a
// task costs nothing next to hashing it (4 ms at 2 GB/s).
constexpr std::size_t mapped_window_bytes = std::size_t{8} << 20;

std::string lowered(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

/// `d`'s digest of `kind` (TensorDigests, const or not).
template <class Digests>
auto& slot(Digests& d, DigestKind kind) {
  switch (kind) {
    case DigestKind::sha256:
      return d.sha256;
    case DigestKind::xxh3_128:
      return d.xxh3_128;
    case DigestKind::xxh3_128_blocks:
      break;
  }
  return d.xxh3_128_blocks;
}

/// Only a SHA-256 (or nothing) is recorded: what a plain sidecar string can say.
bool only_sha256(const TensorDigests& d) {
  return std::all_of(std::begin(kinds), std::end(kinds),
                     [&](DigestKind kind) { return kind == DigestKind::sha256 || slot(d, kind).empty(); });
}

/// Merges `from` into `into`; a digest present in both must agree.
void merge(std::map<std::string, TensorDigests>& into, const std::map<std::string, TensorDigests>& from,
           const std::string& sidecar) {
  for (const auto& [tensor, digests] : from) {
    TensorDigests& mine = into[tensor];
    for (DigestKind kind : kinds) {
      const std::string& theirs = slot(digests, kind);
      std::string& ours = slot(mine, kind);
      if (theirs.empty()) continue;
      if (!ours.empty() && ours != theirs)
        throw Error(errc::invalid_metadata, {.file = sidecar, .tensor = tensor},
                    fmt::format("the sidecar's {} {} disagrees with the checkpoint metadata's {}", digest_name(kind),
                                theirs, ours));
      ours = theirs;
    }
  }
}

/// The sidecar member that holds shard digests (see checksums.hpp).
constexpr std::string_view shards_member = "__shards__";

/// Parses the "__shards__" member: tensor → selection text → digests (`parse_digests`).
template <class ParseDigests>
void parse_shards(const json::Value& value, const std::filesystem::path& path, ParseDigests& parse_digests,
                  std::map<std::string, std::map<std::string, ShardDigests>>& into) {
  if (value.kind() != json::Kind::object)
    throw Error(errc::invalid_metadata, {.file = path.string(), .offset = value.offset()},
                fmt::format("\"{}\" is a JSON {}, not an object of tensor → shard → digest", shards_member,
                            json::kind_name(value.kind())));
  for (const json::Member& t : value.members()) {
    const std::string tensor(t.key.as_string());
    if (t.value.kind() != json::Kind::object)
      throw Error(errc::invalid_metadata, {.file = path.string(), .tensor = tensor, .offset = t.value.offset()},
                  "the tensor's shards are not an object of selection → digest");
    std::map<std::string, ShardDigests>& mine = into[tensor];
    for (const json::Member& m : t.value.members()) {
      const std::optional<Selection> selection = Selection::parse(m.key.as_string());
      if (!selection || selection->is_all())
        throw Error(errc::invalid_metadata, {.file = path.string(), .tensor = tensor, .offset = m.key.offset()},
                    fmt::format("\"{}\" is not a shard's selection (like \"[0:1024, 0:4096]\")", m.key.as_string()));
      // Keyed by the canonical text, so "[0:4,0:8]" and "[0:4, 0:8]" are one shard.
      if (!mine.emplace(selection->to_string(), ShardDigests{*selection, parse_digests(m.value, tensor)}).second)
        throw Error(errc::invalid_metadata, {.file = path.string(), .tensor = tensor, .offset = m.key.offset()},
                    fmt::format("the shard {} is listed twice", selection->to_string()));
    }
  }
}

/// The preferred digest of `digests` when recorded, else the first other one in `kinds`;
/// nullopt when none is.
std::optional<std::pair<DigestKind, std::string>> pick(const TensorDigests& digests, DigestKind preferred) {
  if (const std::string* expected = digests.get(preferred)) return std::pair{preferred, *expected};
  for (DigestKind kind : kinds)
    if (const std::string* expected = digests.get(kind)) return std::pair{kind, *expected};
  return std::nullopt;
}

/// `{"sha256": ..., "xxh3-128": ..., "xxh3-128-blocks": ...}`, or the bare SHA-256 string when `plain`.
std::string digests_json(const TensorDigests& d, bool plain) {
  if (plain) return fmt::format("\"{}\"", d.sha256);
  std::string fields;
  for (DigestKind kind : kinds)
    if (const std::string* v = d.get(kind))
      fields += fmt::format("{}\"{}\": \"{}\"", fields.empty() ? "" : ", ", digest_name(kind), *v);
  return "{" + fields + "}";
}

}  // namespace

const std::string* TensorDigests::get(DigestKind kind) const noexcept {
  const std::string& d = slot(*this, kind);
  return d.empty() ? nullptr : &d;
}

void DigestCheck::compare(const std::string& actual, std::uint64_t hashed) const {
  if (actual == expected) return;
  const std::string what =
      selection.is_all() ? std::string("the tensor's") : fmt::format("the shard {}'s", selection.to_string());
  throw Error(
      errc::checksum_mismatch, {.file = file, .tensor = tensor, .offset = offset},
      fmt::format("{} {} bytes hash to {} {}, but {} was recorded", what, hashed, digest_name(kind), actual, expected));
}

void DigestCheck::verify(std::span<const std::byte> data) const { compare(digest_hex(kind, data), data.size()); }

Checksums Checksums::from_metadata(const Catalog& catalog) {
  Checksums out;
  for (const auto& [key, value] : catalog.metadata()) {
    for (DigestKind kind : kinds) {
      const std::string prefix = fmt::format("{}:", digest_name(kind));
      if (!key.starts_with(prefix)) continue;
      std::string tensor = key.substr(prefix.size());
      if (!is_digest_hex(kind, value))
        throw Error(errc::invalid_metadata, {.tensor = tensor},
                    fmt::format("metadata key \"{}\" holds \"{}\", not a {}-hex-digit {}", key, value,
                                digest_hex_digits(kind), digest_name(kind)));
      slot(out.digests_[tensor], kind) = lowered(value);
    }
  }
  return out;
}

Checksums Checksums::from_sidecar(const std::filesystem::path& path) {
  // open(2) and read(2) themselves, not a stream: every failure keeps its errno, and a FIFO
  // or device at the sidecar's path is refused instead of blocking.
  RegularFile opened = open_regular_file(path.string());
  if (!opened) {
    if (!opened.not_regular.empty())
      throw Error(errc::io_error, {.file = path.string()},
                  fmt::format("the checksum sidecar is {}, not a regular file", opened.not_regular));
    throw Error(errc::io_error, {.file = path.string(), .os_error = opened.error}, "cannot open the checksum sidecar");
  }
  const auto size = static_cast<std::uintmax_t>(opened.status.st_size);
  if (size > max_sidecar_bytes)
    throw Error(errc::invalid_metadata, {.file = path.string()},
                fmt::format("the checksum sidecar is {} bytes, more than the {}-byte limit", size, max_sidecar_bytes));
  std::string text(static_cast<std::size_t>(size), '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t r = ::read(opened.fd.get(), text.data() + got, text.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      throw Error(errc::io_error, {.file = path.string(), .offset = got, .os_error = {errno, std::system_category()}},
                  "reading the checksum sidecar failed");
    if (r == 0) break;  // it shrank since the fstat: parse what is there
    got += static_cast<std::size_t>(r);
  }
  text.resize(got);
  if (auto bad = json::find_invalid_utf8(text))
    throw Error(errc::invalid_metadata, {.file = path.string(), .offset = *bad}, "the checksum sidecar is not UTF-8");
  Checksums out;
  try {
    const json::Document doc = json::Document::parse(text);
    const json::Value root = doc.root();
    if (root.kind() != json::Kind::object)
      throw Error(errc::invalid_metadata, {.file = path.string()},
                  fmt::format("the checksum sidecar is a JSON {}, not an object of tensor → digest",
                              json::kind_name(root.kind())));
    // One tensor's (or shard's) digests: a SHA-256 string or an object of digests by name.
    auto parse_digests = [&](const json::Value& value, const std::string& tensor) {
      TensorDigests digests;
      if (value.kind() == json::Kind::string) {
        if (!is_digest_hex(DigestKind::sha256, value.as_string()))
          throw Error(errc::invalid_metadata, {.file = path.string(), .tensor = tensor, .offset = value.offset()},
                      "the digest is not a string of 64 hex digits (SHA-256)");
        digests.sha256 = lowered(std::string(value.as_string()));
      } else if (value.kind() == json::Kind::object) {
        for (const json::Member& d : value.members()) {
          const std::optional<DigestKind> kind = digest_kind_named(d.key.as_string());
          if (!kind)
            throw Error(errc::invalid_metadata, {.file = path.string(), .tensor = tensor, .offset = d.key.offset()},
                        fmt::format("unknown digest \"{}\" (sha256, xxh3-128 and xxh3-128-blocks are known)",
                                    d.key.as_string()));
          if (d.value.kind() != json::Kind::string || !is_digest_hex(*kind, d.value.as_string()))
            throw Error(errc::invalid_metadata, {.file = path.string(), .tensor = tensor, .offset = d.value.offset()},
                        fmt::format("the {} digest is not a string of {} hex digits", digest_name(*kind),
                                    digest_hex_digits(*kind)));
          std::string& into = slot(digests, *kind);
          if (!into.empty())
            throw Error(errc::invalid_metadata, {.file = path.string(), .tensor = tensor, .offset = d.key.offset()},
                        fmt::format("the {} digest is listed twice", digest_name(*kind)));
          into = lowered(std::string(d.value.as_string()));
        }
        if (digests == TensorDigests{})
          throw Error(errc::invalid_metadata, {.file = path.string(), .tensor = tensor, .offset = value.offset()},
                      "the tensor lists no digest");
      } else {
        throw Error(errc::invalid_metadata, {.file = path.string(), .tensor = tensor, .offset = value.offset()},
                    "the digest is neither a string of 64 hex digits nor an object of digests");
      }
      return digests;
    };
    for (const json::Member& m : root.members()) {
      const std::string tensor(m.key.as_string());
      if (tensor == shards_member) {
        parse_shards(m.value, path, parse_digests, out.shards_);
        continue;
      }
      TensorDigests digests = parse_digests(m.value, tensor);
      if (!out.digests_.emplace(tensor, std::move(digests)).second)
        throw Error(errc::invalid_metadata, {.file = path.string(), .tensor = tensor, .offset = m.key.offset()},
                    "the tensor is listed twice");
    }
  } catch (const json::SyntaxError& e) {
    throw Error(errc::invalid_metadata, {.file = path.string(), .offset = e.offset()},
                fmt::format("the checksum sidecar is not valid JSON: {}", e.what()));
  }
  return out;
}

std::filesystem::path Checksums::sidecar_path(const std::filesystem::path& checkpoint) {
  std::error_code ec;
  if (std::filesystem::is_directory(checkpoint, ec)) return checkpoint / "checksums.sha256.json";
  if (checkpoint.filename() == "model.safetensors.index.json")
    return checkpoint.parent_path() / "checksums.sha256.json";
  std::filesystem::path p = checkpoint;
  p += ".sha256.json";
  return p;
}

Checksums Checksums::discover(const std::filesystem::path& checkpoint, const Catalog& catalog) {
  Checksums out = from_metadata(catalog);
  const std::filesystem::path sidecar = sidecar_path(checkpoint);
  std::error_code ec;
  // Only a sidecar that is absent, or whose name no file can have (a checkpoint name near
  // NAME_MAX), is no sidecar: one whose status cannot be read (ELOOP, EACCES on its
  // directory) may exist, and from_sidecar says why it cannot be read.
  const bool absent = !std::filesystem::exists(sidecar, ec);
  if (absent && (!ec || ec == std::errc::filename_too_long || ec == std::errc::not_a_directory)) return out;
  Checksums found = from_sidecar(sidecar);
  merge(out.digests_, found.digests_, sidecar.string());
  out.shards_ = std::move(found.shards_);  // shard digests live in sidecars only
  return out;
}

void Checksums::add(const std::string& tensor, std::string digest) {
  add(tensor, DigestKind::sha256, std::move(digest));
}

void Checksums::add(const std::string& tensor, DigestKind kind, std::string digest) {
  if (!is_digest_hex(kind, digest))
    throw Error(errc::invalid_argument, {.tensor = tensor},
                fmt::format("\"{}\" is not a {}-hex-digit {}", digest, digest_hex_digits(kind), digest_name(kind)));
  slot(digests_[tensor], kind) = lowered(std::move(digest));
}

void Checksums::add_shard(const std::string& tensor, const Selection& selection, DigestKind kind, std::string digest) {
  if (selection.is_all())
    throw Error(errc::invalid_argument, {.tensor = tensor},
                "a shard digest needs a selection of part of the tensor; the whole tensor's digest is add()'s");
  if (!is_digest_hex(kind, digest))
    throw Error(errc::invalid_argument, {.tensor = tensor},
                fmt::format("\"{}\" is not a {}-hex-digit {}", digest, digest_hex_digits(kind), digest_name(kind)));
  ShardDigests& shard = shards_[tensor][selection.to_string()];
  shard.selection = selection;
  slot(shard.digests, kind) = lowered(std::move(digest));
}

std::size_t Checksums::shard_count() const noexcept {
  std::size_t n = 0;
  for (const auto& [tensor, shards] : shards_) n += shards.size();
  return n;
}

const std::string* Checksums::find(const std::string& tensor) const { return find(tensor, DigestKind::sha256); }

const std::string* Checksums::find(const std::string& tensor, DigestKind kind) const {
  auto it = digests_.find(tensor);
  return it == digests_.end() ? nullptr : it->second.get(kind);
}

std::optional<DigestCheck> Checksums::check(const Catalog& catalog, const std::string& tensor,
                                            DigestKind preferred) const {
  const TensorInfo* info = catalog.find(tensor);
  if (info == nullptr)
    throw Error(errc::tensor_not_found, {.tensor = tensor}, "a checksum names a tensor the checkpoint does not have");
  auto it = digests_.find(tensor);
  if (it == digests_.end()) return std::nullopt;
  auto digest = pick(it->second, preferred);
  if (!digest) return std::nullopt;
  return DigestCheck{digest->first, std::move(digest->second), catalog.file_of(*info).path, tensor, info->offset,
                     info->nbytes};
}

std::optional<DigestCheck> Checksums::check(const Catalog& catalog, const std::string& tensor,
                                            const Selection& selection, DigestKind preferred) const {
  if (selection.is_all()) return check(catalog, tensor, preferred);
  const TensorInfo* info = catalog.find(tensor);
  if (info == nullptr)
    throw Error(errc::tensor_not_found, {.tensor = tensor}, "a checksum names a tensor the checkpoint does not have");
  std::string why = selection.check(info->shape);
  if (why.empty()) why = selection_block_error(info->shape, info->dtype, selection);
  if (!why.empty())
    throw Error(errc::invalid_argument, {.tensor = tensor}, fmt::format("shard {}: {}", selection.to_string(), why));
  auto t = shards_.find(tensor);
  if (t == shards_.end()) return std::nullopt;
  auto s = t->second.find(selection.to_string());
  if (s == t->second.end()) return std::nullopt;
  auto digest = pick(s->second.digests, preferred);
  if (!digest) return std::nullopt;
  const std::vector<ByteRun> runs = selection_runs(info->shape, info->dtype, selection);
  std::uint64_t bytes = 0;
  for (const ByteRun& r : runs) bytes += r.length;
  return DigestCheck{digest->first,
                     std::move(digest->second),
                     catalog.file_of(*info).path,
                     tensor,
                     info->offset + (runs.empty() ? 0 : runs.front().source_offset),
                     bytes,
                     selection};
}

void Checksums::check_recordable(const std::string& tensor) {
  // JSON text cannot hold a byte that is not UTF-8 (GGUF names may have them): a sidecar that
  // named such a tensor some other way would name a tensor the checkpoint does not have.
  if (const auto bad = json::find_invalid_utf8(tensor))
    throw Error(errc::invalid_argument, {.tensor = tensor},
                fmt::format("the tensor name is not UTF-8 (byte {} of it), and a JSON checksum sidecar can only "
                            "record UTF-8 names",
                            *bad));
}

std::string Checksums::to_json() const {
  for (const auto& [tensor, d] : digests_) check_recordable(tensor);
  for (const auto& [tensor, shards] : shards_) check_recordable(tensor);
  bool plain =
      std::all_of(digests_.begin(), digests_.end(), [](const auto& entry) { return only_sha256(entry.second); });
  for (const auto& [tensor, shards] : shards_)
    for (const auto& [text, shard] : shards) plain = plain && only_sha256(shard.digests);
  std::string out = "{";
  bool first = true;
  for (const auto& [tensor, d] : digests_) {
    out += fmt::format("{}\n  {}: {}", first ? "" : ",", json::quoted(tensor), digests_json(d, plain));
    first = false;
  }
  if (!shards_.empty()) {
    out += fmt::format("{}\n  \"{}\": {{", first ? "" : ",", shards_member);
    bool first_tensor = true;
    for (const auto& [tensor, shards] : shards_) {
      out += fmt::format("{}\n    {}: {{", first_tensor ? "" : ",", json::quoted(tensor));
      first_tensor = false;
      bool first_shard = true;
      for (const auto& [text, shard] : shards) {
        out += fmt::format("{}\n      {}: {}", first_shard ? "" : ",", json::quoted(text),
                           digests_json(shard.digests, plain));
        first_shard = false;
      }
      out += "\n    }";
    }
    out += "\n  }";
  }
  out += "\n}\n";
  return out;
}

namespace detail {
namespace {

/// What the tensors being verified at once share; touched only on the source's executor
/// (hash tasks see their own hasher and bytes only).
struct VerifyState {
  std::vector<DigestCheck> checks;  // in file order
  std::size_t next = 0;
  std::vector<std::exception_ptr> errors;
  std::uint64_t verified = 0;
  bool stop = false;  // a tensor failed: the others stop at their next step
};

/// Runs `work` on `hasher` and waits for it; its exception becomes this coroutine's.
asio::awaitable<void> on_hasher(const asio::any_io_executor& hasher, UniqueFunction<void()> work) {
  auto done = std::make_shared<CompletionSource>();
  Completion finished = done->completion();
  asio::post(hasher, [work = std::move(work), done]() mutable {
    try {
      work();
      done->complete();
    } catch (...) {
      done->fail(std::current_exception());
    }
  });
  co_await finished.async_wait(asio::use_awaitable);
}

/// Hashes one tensor: from a guarded mapping of the page cache when it is resident, else in
/// chunk leases. Returns the digest; throws read errors, Error(cancelled) when stopped.
asio::awaitable<std::string> hash_tensor(CheckpointSource& source, const DigestCheck& check,
                                         const asio::any_io_executor& hasher, asio::cancellation_state cancel,
                                         std::shared_ptr<VerifyState> state) {
  auto stopped = [&] { return state->stop || cancel.cancelled() != asio::cancellation_type::none; };
  auto hash = std::make_shared<Hasher>(check.kind);
  const TensorReadRequest request{check.tensor, check.selection};
  if (std::optional<MappedView> view = source.map_resident(request)) {
    auto mapped = std::make_shared<MappedView>(std::move(*view));
    const std::span<const std::byte> all = mapped->bytes();
    for (std::size_t at = 0; at < all.size(); at += mapped_window_bytes) {
      if (stopped()) throw Error(errc::cancelled, {.tensor = check.tensor}, "checksum verification was cancelled");
      const std::span<const std::byte> part = all.subspan(at, std::min(mapped_window_bytes, all.size() - at));
      // Named, not a temporary in the co_await expression (g++ 12; docs/io.md).
      UniqueFunction<void()> window = [mapped, hash, part, name = &check.tensor] {
        trace::Span span("hash", "verify",
                         trace::enabled() ? fmt::format("{}: {} bytes mapped", *name, part.size()) : "");
        mapped->populate(part);
        auto work = [&] { hash->update(part); };
        // A fault abandons the update mid-way; the hash state is then never used again.
        if (std::optional<MappingFault> fault = guarded_read(mapped->region(), work)) throw mapped->fault_error(*fault);
        mapped->release_pages(part);
      };
      co_await on_hasher(hasher, std::move(window));
    }
    // A mapping reads the file as it is at each page: a rewrite meanwhile faults nothing.
    mapped->check_unchanged();
  } else {
    ChunkStream chunks = source.stream(request);
    // Each chunk is hashed and released before the next one is read: holding it while
    // reading the next could need two chunk windows of staging, and a chunk may take the
    // whole pool (a wait that would never end).
    for (;;) {
      if (stopped()) throw Error(errc::cancelled, {.tensor = check.tensor}, "checksum verification was cancelled");
      std::optional<Lease> chunk = co_await chunks.async_next(asio::use_awaitable);
      if (!chunk) break;
      UniqueFunction<void()> update = [held = std::make_shared<Lease>(std::move(*chunk)), hash, name = &check.tensor] {
        trace::Span span("hash", "verify",
                         trace::enabled() ? fmt::format("{}: {} bytes", *name, held->bytes().size()) : "");
        hash->update(held->bytes());
      };
      co_await on_hasher(hasher, std::move(update));
    }
  }
  std::string digest;
  UniqueFunction<void()> finish = [&digest, hash] { digest = hash->hex_digest(); };
  co_await on_hasher(hasher, std::move(finish));
  co_return digest;
}

/// One of the verification lanes: takes the next tensor until none is left or one failed.
asio::awaitable<void> verify_lane(CheckpointSource& source, std::shared_ptr<VerifyState> state,
                                  asio::any_io_executor hasher, asio::cancellation_state cancel) {
  while (!state->stop && state->next < state->checks.size()) {
    const std::size_t i = state->next++;
    const DigestCheck& check = state->checks[i];
    try {
      const std::string digest = co_await hash_tensor(source, check, hasher, cancel, state);
      check.compare(digest, check.bytes);
      state->verified += check.bytes;
    } catch (...) {
      state->errors[i] = std::current_exception();
      state->stop = true;
    }
  }
}

}  // namespace

asio::awaitable<std::uint64_t> verify_checksums(CheckpointSource& source, Checksums checksums,
                                                asio::any_io_executor hasher, VerifyChecksumsOptions options) {
  const unsigned lanes = options.concurrency ? options.concurrency : std::max(1u, std::thread::hardware_concurrency());
  // Without a hashing executor, threads of our own: hashing on the source's executor would
  // stall everything else that loop runs.
  std::optional<asio::thread_pool> own_threads;
  if (!hasher) hasher = own_threads.emplace(lanes).get_executor();
  struct JoinOnExit {
    std::optional<asio::thread_pool>& pool;
    ~JoinOnExit() {
      if (pool) pool->join();
    }
  } join_on_exit{own_threads};

  // Every named tensor must exist before anything is read: a bad list costs no I/O.
  auto state = std::make_shared<VerifyState>();
  for (const auto& [tensor, digests] : checksums.digests())
    if (std::optional<DigestCheck> c = checksums.check(source.catalog(), tensor, options.preferred))
      state->checks.push_back(std::move(*c));
  for (const auto& [tensor, shards] : checksums.shards()) {
    if (checksums.digests().contains(tensor)) continue;  // the whole tensor's check covers its shards
    for (const auto& [text, shard] : shards)
      if (std::optional<DigestCheck> c = checksums.check(source.catalog(), tensor, shard.selection, options.preferred))
        state->checks.push_back(std::move(*c));
  }
  // File order: a cold checkpoint is then read front to back.
  std::sort(state->checks.begin(), state->checks.end(), [&](const DigestCheck& a, const DigestCheck& b) {
    return std::tie(a.file, a.offset) < std::tie(b.file, b.offset);
  });
  state->errors.resize(state->checks.size());

  // Cancellation is checked between chunks, never while a hash task may still use a lane's
  // hash state.
  co_await asio::this_coro::throw_if_cancelled(false);
  asio::cancellation_state cancel_state = co_await asio::this_coro::cancellation_state;
  const asio::any_io_executor loop = co_await asio::this_coro::executor;
  std::vector<Completion> finished;
  for (unsigned lane = 0; lane < std::min<std::size_t>(lanes, state->checks.size()); ++lane) {
    CompletionSource done;
    finished.push_back(done.completion());
    asio::co_spawn(loop, verify_lane(source, state, hasher, cancel_state),
                   [done = std::move(done)](std::exception_ptr e) mutable { done.finish(std::move(e)); });
  }
  co_await when_all(finished).async_wait(asio::use_awaitable);
  // The root cause in file order: a cancellation it provoked in another lane comes second.
  std::exception_ptr cancelled;
  for (const std::exception_ptr& e : state->errors) {
    if (!e) continue;
    if (!is_cancellation(e)) std::rethrow_exception(e);
    if (!cancelled) cancelled = e;
  }
  if (cancelled) std::rethrow_exception(cancelled);
  co_return state->verified;
}

}  // namespace detail
}  // namespace eredu::io
