#include "eredu/io/checksums.hpp"

#include <algorithm>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_awaitable.hpp>
#include <cctype>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "eredu/core/completion.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/trace.hpp"
#include "eredu/io/json_text.hpp"
#include "eredu/io/lease.hpp"
#include "eredu/io/sha256.hpp"
#include "json.hpp"

namespace eredu::io {
namespace {

constexpr std::string_view metadata_prefix = "sha256:";
// A sidecar lists one digest per tensor: far below this even for huge checkpoints.
constexpr std::uintmax_t max_sidecar_bytes = 64u << 20;

bool is_digest(std::string_view d) noexcept {
  return d.size() == 64 &&
         std::all_of(d.begin(), d.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

std::string lowered(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

Checksums Checksums::from_metadata(const Catalog& catalog) {
  Checksums out;
  for (const auto& [key, value] : catalog.metadata()) {
    if (!key.starts_with(metadata_prefix)) continue;
    std::string tensor = key.substr(metadata_prefix.size());
    if (!is_digest(value))
      throw Error(errc::invalid_metadata, {.tensor = tensor},
                  fmt::format("metadata key \"{}\" holds \"{}\", not a 64-hex-digit SHA-256", key, value));
    out.digests_[tensor] = lowered(value);
  }
  return out;
}

Checksums Checksums::from_sidecar(const std::filesystem::path& path) {
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) throw Error(errc::io_error, {.file = path.string(), .os_error = ec}, "cannot read the checksum sidecar");
  if (size > max_sidecar_bytes)
    throw Error(errc::invalid_metadata, {.file = path.string()},
                fmt::format("the checksum sidecar is {} bytes, more than the {}-byte limit", size, max_sidecar_bytes));
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in && !in.eof()) throw Error(errc::io_error, {.file = path.string()}, "reading the checksum sidecar failed");
  if (auto bad = json::find_invalid_utf8(text))
    throw Error(errc::invalid_metadata, {.file = path.string(), .offset = *bad}, "the checksum sidecar is not UTF-8");
  Checksums out;
  try {
    const json::Document doc = json::Document::parse(text);
    const json::Value root = doc.root();
    if (root.kind() != json::Kind::object)
      throw Error(errc::invalid_metadata, {.file = path.string()},
                  fmt::format("the checksum sidecar is a JSON {}, not an object of tensor → SHA-256",
                              json::kind_name(root.kind())));
    for (const json::Member& m : root.members()) {
      const std::string tensor(m.key.as_string());
      if (m.value.kind() != json::Kind::string || !is_digest(m.value.as_string()))
        throw Error(errc::invalid_metadata, {.file = path.string(), .tensor = tensor, .offset = m.value.offset()},
                    "the digest is not a string of 64 hex digits");
      if (!out.digests_.emplace(tensor, lowered(std::string(m.value.as_string()))).second)
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
  if (!std::filesystem::exists(sidecar, ec)) return out;
  for (const auto& [tensor, digest] : from_sidecar(sidecar).digests_) {
    auto [it, added] = out.digests_.emplace(tensor, digest);
    if (!added && it->second != digest)
      throw Error(
          errc::invalid_metadata, {.file = sidecar.string(), .tensor = tensor},
          fmt::format("the sidecar's digest {} disagrees with the checkpoint metadata's {}", digest, it->second));
  }
  return out;
}

void Checksums::add(const std::string& tensor, std::string digest) {
  if (!is_digest(digest))
    throw Error(errc::invalid_argument, {.tensor = tensor},
                fmt::format("\"{}\" is not a 64-hex-digit SHA-256", digest));
  digests_[tensor] = lowered(std::move(digest));
}

const std::string* Checksums::find(const std::string& tensor) const {
  auto it = digests_.find(tensor);
  return it == digests_.end() ? nullptr : &it->second;
}

std::string Checksums::to_json() const {
  std::string out = "{";
  bool first = true;
  for (const auto& [tensor, digest] : digests_) {
    out += fmt::format("{}\n  {}: \"{}\"", first ? "" : ",", json::quoted(tensor), digest);
    first = false;
  }
  out += "\n}\n";
  return out;
}

namespace detail {

asio::awaitable<std::uint64_t> verify_checksums(CheckpointSource& source, Checksums checksums,
                                                asio::any_io_executor hasher) {
  // Without a hashing executor, one thread of our own: hashing on the source's executor
  // would stall everything else that loop runs.
  std::optional<asio::thread_pool> own_thread;
  if (!hasher) hasher = own_thread.emplace(1).get_executor();
  struct JoinOnExit {
    std::optional<asio::thread_pool>& pool;
    ~JoinOnExit() {
      if (pool) pool->join();
    }
  } join_on_exit{own_thread};

  // Cancellation is checked between chunks, never while a hash task may still use the
  // frame's hash state.
  co_await asio::this_coro::throw_if_cancelled(false);
  asio::cancellation_state cancel_state = co_await asio::this_coro::cancellation_state;

  std::uint64_t verified = 0;
  for (const auto& [tensor, expected] : checksums.digests()) {
    const TensorInfo* info = source.catalog().find(tensor);
    if (info == nullptr)
      throw Error(errc::tensor_not_found, {.tensor = tensor}, "a checksum names a tensor the checkpoint does not have");
    Sha256 hash;
    ChunkStream chunks = source.stream(TensorReadRequest{tensor, Selection::all()});
    // Each chunk is hashed on the hasher and released before the next one is read: holding
    // it while reading the next could need two chunk windows of staging, and a chunk may
    // take the whole pool (a wait that would never end).
    for (;;) {
      if (cancel_state.cancelled() != asio::cancellation_type::none)
        throw Error(errc::cancelled, {.tensor = tensor}, "checksum verification was cancelled");
      std::optional<Lease> chunk = co_await chunks.async_next(asio::use_awaitable);
      if (!chunk) break;
      verified += chunk->bytes().size();
      auto done = std::make_shared<CompletionSource>();
      Completion hashed = done->completion();
      // A structured binding cannot be captured before C++20's P1091 (clang 14): name it.
      const std::string* name = &tensor;
      asio::post(hasher, [&hash, bytes = chunk->bytes(), done, name] {
        trace::Span span("hash", "verify", trace::enabled() ? fmt::format("{}: {} bytes", *name, bytes.size()) : "");
        hash.update(bytes);
        done->complete();
      });
      co_await hashed.async_wait(asio::use_awaitable);  // a hash task never fails
    }
    const std::string actual = hash.hex_digest();
    if (actual != expected)
      throw Error(
          errc::checksum_mismatch,
          {.file = source.catalog().file_of(*info).path, .tensor = tensor, .offset = info->offset},
          fmt::format("the tensor's {} bytes hash to SHA-256 {}, but {} was recorded", info->nbytes, actual, expected));
  }
  co_return verified;
}

}  // namespace detail
}  // namespace eredu::io
