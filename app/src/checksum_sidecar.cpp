#include "eredu/app/checksum_sidecar.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <numeric>
#include <optional>
#include <set>
#include <string_view>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/io/reading/unique_fd.hpp"

namespace eredu::app {
namespace {

namespace fs = std::filesystem;

/// Bytes of a tensor read (and hashed) at once.
constexpr std::size_t buffer_bytes = std::size_t{4} << 20;
/// Byte runs of a tensor's shards held at once, all shards together: a shard's runs are made
/// a batch of dim-0 indices at a time (a column shard has one run per row, and thousands of
/// ranks make thousands of shards).
constexpr std::uint64_t run_budget = std::uint64_t{1} << 16;

std::error_code os_error(int err) { return {err, std::system_category()}; }

/// `kinds` followed by those `recorded` has and `kinds` lacks.
std::vector<io::DigestKind> kinds_with(std::span<const io::DigestKind> kinds, const io::TensorDigests* recorded) {
  std::vector<io::DigestKind> out(kinds.begin(), kinds.end());
  if (recorded)
    for (io::DigestKind kind : {io::DigestKind::sha256, io::DigestKind::xxh3_128})
      if (recorded->get(kind) && std::find(out.begin(), out.end(), kind) == out.end()) out.push_back(kind);
  return out;
}

/// One hasher per kind, fed the same bytes.
class Hashers {
 public:
  explicit Hashers(const std::vector<io::DigestKind>& kinds) {
    for (io::DigestKind kind : kinds) hashers_.emplace_back(kind);
  }
  void update(std::span<const std::byte> data) noexcept {
    for (io::Hasher& h : hashers_) h.update(data);
    bytes_ += data.size();
  }
  /// Bytes fed so far.
  std::uint64_t bytes() const noexcept { return bytes_; }
  /// (kind, lowercase hex) of each hasher; call once.
  std::vector<std::pair<io::DigestKind, std::string>> finish() {
    std::vector<std::pair<io::DigestKind, std::string>> out;
    for (io::Hasher& h : hashers_) out.emplace_back(h.kind(), h.hex_digest());
    return out;
  }

 private:
  std::vector<io::Hasher> hashers_;
  std::uint64_t bytes_ = 0;
};

/// One shard of the tensor being read: fed, chunk by chunk in file order, the parts of its
/// byte runs (selection_runs) each chunk holds, so its hashers see the selection's bytes in
/// the order a load delivers them. The runs are made a batch of dim-0 indices at a time
/// (restricting dim 0 of a selection keeps its row-major order, so the batches' runs in turn
/// are its runs), at most about `max_runs` of them at once.
class ShardStream {
 public:
  ShardStream(const io::TensorInfo& tensor, Selection selection, const std::vector<io::DigestKind>& kinds,
              std::uint64_t max_runs)
      : tensor_(&tensor), selection_(std::move(selection)), hashers_(kinds) {
    const std::vector<Range>& ranges = selection_.ranges;
    const bool empty = std::any_of(ranges.begin(), ranges.end(), [](const Range& r) { return r.size() == 0; });
    next_ = ranges[0].start;
    stop_ = empty ? next_ : ranges[0].stop;
    // Runs per dim-0 index: at most one per index of the dims between the first and the last.
    std::uint64_t runs_per_index = 1;
    for (std::size_t d = 1; d + 1 < ranges.size(); ++d) runs_per_index *= std::max<std::uint64_t>(1, ranges[d].size());
    batch_ = ranges.size() == 1 ? ranges[0].size() : std::max<std::uint64_t>(1, max_runs / runs_per_index);
  }

  /// Feeds the parts of its runs that lie in `chunk`, the tensor's bytes from `at` on
  /// (every byte before `at` having been fed already).
  void feed(std::uint64_t at, std::span<const std::byte> chunk) {
    const std::uint64_t end = at + chunk.size();
    for (;;) {
      if (index_ == runs_.size() && !refill()) return;
      const ByteRun& run = runs_[index_];
      const std::uint64_t from = run.source_offset + within_;
      if (from >= end) return;
      const std::uint64_t to = std::min(run.source_offset + run.length, end);
      hashers_.update(chunk.subspan(static_cast<std::size_t>(from - at), static_cast<std::size_t>(to - from)));
      within_ += to - from;
      if (within_ == run.length) {
        ++index_;
        within_ = 0;
      }
    }
  }

  /// True once every run has been fed.
  bool finished() { return index_ == runs_.size() && !refill(); }
  const Selection& selection() const noexcept { return selection_; }
  Hashers& hashers() noexcept { return hashers_; }

 private:
  /// The runs of the next batch of dim-0 indices; false when none is left.
  bool refill() {
    while (next_ < stop_) {
      Selection part = selection_;
      const std::uint64_t last = next_ + std::min(batch_, stop_ - next_);
      part.ranges[0] = {next_, last};
      next_ = last;
      runs_ = selection_runs(tensor_->shape, tensor_->dtype, part);
      index_ = 0;
      within_ = 0;
      if (!runs_.empty()) return true;
    }
    return false;
  }

  const io::TensorInfo* tensor_;
  Selection selection_;
  Hashers hashers_;
  std::uint64_t next_ = 0;   // the first dim-0 index not yet made into runs
  std::uint64_t stop_ = 0;   // one past the selection's last dim-0 index
  std::uint64_t batch_ = 1;  // dim-0 indices per batch
  std::vector<ByteRun> runs_;
  std::size_t index_ = 0;     // the run being fed
  std::uint64_t within_ = 0;  // its bytes fed so far
};

/// The shards to hash of one tensor: the selections asked for (with `kinds`) and those `known`
/// records (with their recorded kinds, and `kinds` too when also asked for), each once.
struct ShardPlan {
  Selection selection;
  std::vector<io::DigestKind> kinds;
};

std::vector<ShardPlan> shard_plans(const std::string& tensor, std::span<const io::DigestKind> kinds,
                                   const ShardSelections& shards, const io::Checksums& known) {
  std::vector<ShardPlan> out;
  std::set<std::string> asked;
  const auto recorded = known.shards().find(tensor);
  auto recorded_of = [&](const std::string& text) -> const io::TensorDigests* {
    if (recorded == known.shards().end()) return nullptr;
    const auto it = recorded->second.find(text);
    return it == recorded->second.end() ? nullptr : &it->second.digests;
  };
  if (const auto it = shards.find(tensor); it != shards.end())
    for (const Selection& s : it->second) {
      const std::string text = s.to_string();
      if (asked.insert(text).second) out.push_back({s, kinds_with(kinds, recorded_of(text))});
    }
  if (recorded != known.shards().end())
    for (const auto& [text, shard] : recorded->second)
      if (!asked.contains(text)) out.push_back({shard.selection, kinds_with({}, &shard.digests)});
  return out;
}

/// Every digest of `known` and every selection of `shards` names a tensor of `catalog` and
/// fits it (see hash_checkpoint); throws otherwise.
void check_inputs(const io::Catalog& catalog, const ShardSelections& shards, const io::Checksums& known) {
  // The sidecar written at the end must be able to name every tensor: said before the hashing.
  for (const io::TensorInfo& t : catalog.tensors()) io::Checksums::check_recordable(t.name);
  for (const auto& [tensor, digests] : known.digests()) (void)known.check(catalog, tensor);
  for (const auto& [tensor, recorded] : known.shards())
    for (const auto& [text, shard] : recorded) (void)known.check(catalog, tensor, shard.selection);
  for (const auto& [tensor, selections] : shards) {
    const io::TensorInfo* info = catalog.find(tensor);
    if (info == nullptr)
      throw Error(errc::tensor_not_found, {.tensor = tensor},
                  "a shard to hash names a tensor the checkpoint does not have");
    for (const Selection& s : selections) {
      std::string why = s.is_all() ? "it is the whole tensor, whose digest is not a shard's" : s.check(info->shape);
      if (why.empty()) why = selection_block_error(info->shape, info->dtype, s);
      if (!why.empty())
        throw Error(errc::invalid_argument, {.file = catalog.file_of(*info).path, .tensor = tensor},
                    fmt::format("shard {}: {}", s.to_string(), why));
    }
  }
}

/// Reads `want` bytes at `offset` of `fd` into `into` (retrying short reads); throws
/// Error(io_error) or Error(unexpected_eof) naming file, tensor and the offset that failed.
void read_exact(int fd, std::byte* into, std::size_t want, std::uint64_t offset, const std::string& file,
                const std::string& tensor) {
  std::size_t got = 0;
  while (got < want) {
    const ssize_t r = ::pread(fd, into + got, want - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      throw Error(errc::io_error, {.file = file, .tensor = tensor, .offset = offset + got, .os_error = os_error(errno)},
                  "reading the tensor to hash it failed");
    if (r == 0)
      throw Error(errc::unexpected_eof, {.file = file, .tensor = tensor, .offset = offset + got},
                  fmt::format("the file ends {} bytes short of the tensor's end", want - got));
    got += static_cast<std::size_t>(r);
  }
}

}  // namespace

std::vector<io::DigestKind> digest_kinds(const std::string& digest) {
  if (digest == "both") return {io::DigestKind::sha256, io::DigestKind::xxh3_128};
  if (digest == "sha256") return {io::DigestKind::sha256};
  if (digest == "xxh3-128") return {io::DigestKind::xxh3_128};
  throw Error(errc::invalid_argument, {}, fmt::format("digest must be sha256, xxh3-128 or both, not '{}'", digest));
}

ShardSelections tensor_parallel_selections(const io::Catalog& catalog, const engine::ShardingRules& rules, int size) {
  ShardSelections out;
  std::map<std::string, std::set<std::string>> seen;
  for (int rank = 0; rank < size; ++rank) {
    const engine::TensorParallelPlan plan = engine::plan_tensor_parallel(catalog, rules, rank, size);
    for (const engine::ShardedTensor& t : plan.tensors) {
      if (t.shard.kind() == engine::Shard::Kind::replicated) continue;
      for (const Selection& piece : t.pieces)
        if (!piece.is_all() && seen[t.key].insert(piece.to_string()).second) out[t.key].push_back(piece);
    }
  }
  return out;
}

io::Checksums hash_checkpoint(const io::Catalog& catalog, std::span<const io::DigestKind> kinds,
                              const ShardSelections& shards, const io::Checksums& known, const HashProgress& progress,
                              HashStats* stats) {
  // A bad list costs no I/O.
  check_inputs(catalog, shards, known);
  // File order: a cold checkpoint is read front to back.
  std::vector<const io::TensorInfo*> order;
  for (const io::TensorInfo& t : catalog.tensors()) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(), [](const io::TensorInfo* a, const io::TensorInfo* b) {
    return std::pair(a->file, a->offset) < std::pair(b->file, b->offset);
  });

  io::Checksums out;
  HashStats seen;
  std::vector<std::byte> buffer(buffer_bytes);
  if (progress.start) progress.start(catalog.total_bytes());
  io::UniqueFd fd;
  std::optional<std::uint32_t> open_file;  // the file `fd` reads (one at a time)
  for (const io::TensorInfo* t : order) {
    const std::string& path = catalog.file_of(*t).path;
    if (open_file != t->file) {
      fd.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
      if (fd.get() < 0)
        throw Error(errc::io_error, {.file = path, .tensor = t->name, .offset = t->offset, .os_error = os_error(errno)},
                    "cannot open the file to hash the tensor");
      open_file = t->file;
    }
    const auto recorded = known.digests().find(t->name);
    Hashers whole(kinds_with(kinds, recorded == known.digests().end() ? nullptr : &recorded->second));
    const std::vector<ShardPlan> plans = shard_plans(t->name, kinds, shards, known);
    std::vector<ShardStream> streams;
    streams.reserve(plans.size());
    const std::uint64_t max_runs = std::max<std::uint64_t>(1, run_budget / std::max<std::size_t>(1, plans.size()));
    for (const ShardPlan& p : plans) streams.emplace_back(*t, p.selection, p.kinds, max_runs);

    for (std::uint64_t done = 0; done < t->nbytes;) {
      const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), t->nbytes - done));
      read_exact(fd.get(), buffer.data(), want, t->offset + done, path, t->name);
      const std::span<const std::byte> chunk(buffer.data(), want);
      whole.update(chunk);
      for (ShardStream& s : streams) s.feed(done, chunk);
      done += want;
      if (progress.update) progress.update(seen.bytes + done);
      // An interrupt stops the hashing here: one buffer (4 MiB) after it arrived.
      if (progress.check) progress.check(path);
    }

    // Compare with what is recorded first: a mismatch writes nothing.
    for (const auto& [kind, hex] : whole.finish()) {
      if (recorded != known.digests().end() && recorded->second.get(kind)) {
        known.check(catalog, t->name, kind)->compare(hex, whole.bytes());
        ++seen.verified;
      }
      out.add(t->name, kind, hex);
    }
    for (ShardStream& s : streams) {
      assert(s.finished());  // the runs lie within the tensor's bytes: every one was fed
      const std::uint64_t hashed = s.hashers().bytes();
      for (const auto& [kind, hex] : s.hashers().finish()) {
        if (std::optional<io::DigestCheck> check = known.check(catalog, t->name, s.selection(), kind);
            check && check->kind == kind) {
          check->compare(hex, hashed);
          ++seen.verified_shards;
        }
        out.add_shard(t->name, s.selection(), kind, hex);
      }
    }
    ++seen.tensors;
    seen.bytes += t->nbytes;
  }
  if (stats) *stats = seen;
  return out;
}

void write_sidecar(const fs::path& sidecar, const io::Checksums& checksums) {
  const std::string text = checksums.to_json();
  fs::path tmp = sidecar;
  tmp += ".tmp";
  io::UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0)
    throw Error(errc::io_error, {.file = tmp.string(), .os_error = os_error(errno)},
                "cannot create the checksum sidecar's temporary file");
  auto fail = [&](int err, const fs::path& file, std::string_view what) {
    fd.reset();
    ::unlink(tmp.c_str());
    throw Error(errc::io_error, {.file = file.string(), .os_error = os_error(err)}, std::string(what));
  };
  for (std::size_t done = 0; done < text.size();) {
    const ssize_t w = ::write(fd.get(), text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) fail(errno, tmp, "writing the checksum sidecar's temporary file failed");
    done += static_cast<std::size_t>(w);
  }
  if (::fsync(fd.get()) != 0) fail(errno, tmp, "fsync of the checksum sidecar's temporary file failed");
  // close() reports what a delayed write-back failed with (NFS, quotas): checked, not ignored.
  if (::close(fd.release()) != 0) fail(errno, tmp, "closing the checksum sidecar's temporary file failed");
  if (::rename(tmp.c_str(), sidecar.c_str()) != 0)
    fail(errno, sidecar, fmt::format("cannot rename {} over the checksum sidecar", tmp.string()));
  // The rename itself is durable once the directory is: best effort (some file systems
  // refuse fsync on a directory; the sidecar is in place either way).
  const fs::path dir = sidecar.has_parent_path() ? sidecar.parent_path() : fs::path(".");
  if (io::UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)); d) (void)::fsync(d.get());
}

WrittenChecksums write_checksums(const std::string& path, const io::Catalog& catalog,
                                 std::span<const io::DigestKind> kinds, const ShardSelections& shards,
                                 const HashProgress& progress) {
  const io::Checksums known = io::Checksums::discover(path, catalog);
  WrittenChecksums out;
  out.checksums = hash_checkpoint(catalog, kinds, shards, known, progress, &out.stats);
  out.sidecar = io::Checksums::sidecar_path(path);
  if (progress.check) progress.check(path);
  write_sidecar(out.sidecar, out.checksums);
  return out;
}

}  // namespace eredu::app
