// Inputs and options that must not hang, abort or lie: the reader policy by file system,
// FIFOs and devices given as checkpoints, symbolic links and CatalogOptions::confine_to,
// shards that cannot be opened for reasons other than absence, names that would act on a
// terminal, a GGUF file given to the safetensors parser, options out of range, a pread
// reader short of threads, EAGAIN storms, window reads failing in a neighbour, and the
// SIGBUS guard next to an application's own handler.
#include "eredu/io/reading/file_system.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <csetjmp>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/core/log.hpp"
#include "eredu/core/printable.hpp"
#include "eredu/io/formats/open_catalog.hpp"
#include "eredu/io/formats/safetensors.hpp"
#include "eredu/io/mapping/guarded_read.hpp"
#include "eredu/io/mapping/mapped_tensor.hpp"
#include "eredu/io/mapping/mapped_view.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"
#include "eredu/io/reading/regular_file.hpp"
#include "io/read_fixture.hpp"
#include "support/error_kind.hpp"
#include "support/st_bytes.hpp"

using namespace eredu;
using namespace eredu::io;
using eredu::test::error_of;
using eredu::test::run_on;

namespace {

struct Small {
  test::TempDir dir;
  std::filesystem::path path = dir / "model.safetensors";
  std::vector<synth::TensorSpec> specs{{"a", DType::U8, {100}}, {"b", DType::F32, {3000}}, {"c", DType::U8, {9}}};
  std::vector<std::vector<std::byte>> data = test::random_tensor_bytes(specs, 5);
  Small() { synth::write_safetensors(path, specs, test::spans_of(data)); }
};

struct DebugLogCapture {
  std::mutex mutex;
  std::vector<std::string> lines;
  log::Sink previous;
  DebugLogCapture() {
    log::set_level(log::Level::debug);
    previous = log::set_sink([this](log::Level, std::string_view l) {
      std::lock_guard lock(mutex);
      lines.emplace_back(l);
    });
  }
  ~DebugLogCapture() {
    log::set_sink(std::move(previous));
    log::set_level(log::Level::info);
  }
  bool contains(std::string_view needle) {
    std::lock_guard lock(mutex);
    for (auto& l : lines)
      if (l.find(needle) != std::string::npos) return true;
    return false;
  }
};

bool sanitized() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  return true;
#endif
#endif
  return false;
}

}  // namespace

TEST_CASE("file system – local file systems are trusted with io_uring, remote and userspace ones are not",
          "[io][policy]") {
  for (std::uint64_t m : {0xEF53ull, 0x58465342ull, 0x9123683Eull, 0x01021994ull, 0x794C7630ull}) {
    INFO(file_system_from_magic(m).describe());
    CHECK(file_system_from_magic(m).uring_trusted);
  }
  CHECK(file_system_from_magic(0xEF53).name == "ext4");
  for (std::uint64_t m :
       {0x65735546ull, 0x6969ull, 0xFF534D42ull, 0xFE534D42ull, 0x01021997ull, 0x00C36400ull, 0x12345678ull}) {
    INFO(file_system_from_magic(m).describe());
    CHECK_FALSE(file_system_from_magic(m).uring_trusted);
  }
  CHECK(file_system_from_magic(0x65735546).name == "fuse");
  CHECK(file_system_from_magic(0x12345678).name == "unknown");
  CHECK(file_system_from_magic(0x65735546).describe() == "fuse (magic 0x65735546)");
}

TEST_CASE("reader policy – files on the local file systems here get io_uring, with a log line each", "[io][policy]") {
  // /tmp (the test directory) and /dev/shm (tmpfs) where present.
  std::vector<std::filesystem::path> roots{std::filesystem::temp_directory_path()};
  if (std::filesystem::is_directory("/dev/shm")) roots.emplace_back("/dev/shm");
  for (const auto& root : roots) {
    const auto dir = root / fmt::format("eredu-policy-{}", ::getpid());
    std::filesystem::create_directories(dir);
    const auto path = dir / "m.safetensors";
    Small s;
    std::filesystem::copy_file(s.path, path, std::filesystem::copy_options::overwrite_existing);
    {
      DebugLogCapture logs;
      asio::io_context ctx;
      SourceOptions o;
      o.pool = {.budget = 1 << 20, .huge_pages = false, .prefault = false};
      auto source = CheckpointSource::open(ctx.get_executor(), path, o);
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      const FileSystemInfo fs = file_system_of(fd, path.string());
      ::close(fd);
      INFO(root << " is " << fs.describe());
      if (logs.contains("io_uring unavailable")) {
        WARN("io_uring is unavailable here: the pread reader reads every file");
        CHECK(source->reader().name() == "pread");
      } else if (fs.uring_trusted) {
        CHECK(source->reader().name() == "io_uring");
        CHECK(logs.contains(fmt::format("{}: io_uring reader (on {}", path.string(), fs.name)));
      } else {
        CHECK(source->reader().name() == "pread");
        CHECK(logs.contains("pread reader, not io_uring"));
      }
      TensorReadRequest b{"b"};
      Lease lease = run_on(ctx, source->async_read(b, asio::use_awaitable));
      CHECK(std::vector<std::byte>(lease.bytes().begin(), lease.bytes().end()) == s.data[1]);
    }
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE("regular files only – a FIFO, a device or a directory as checkpoint, index or shard is refused at once",
          "[io][inputs]") {
  test::TempDir dir;
  const auto fifo = dir / "x.safetensors";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // No writer ever opens the FIFO: a blocking open would never return.
  Error e = error_of([&] { open_catalog(fifo); });
  CHECK(e.kind() == errc::unknown_format);
  CHECK_THAT(e.what(), Catch::Contains("a FIFO"));
  e = error_of([&] { open_catalog("/dev/null"); });
  CHECK(e.kind() == errc::unknown_format);
  CHECK_THAT(e.what(), Catch::Contains("character device"));

  // An index that is a FIFO.
  test::TempDir sharded;
  REQUIRE(::mkfifo((sharded / "model.safetensors.index.json").c_str(), 0600) == 0);
  e = error_of([&] { open_catalog(sharded.path()); });
  CHECK(e.kind() == errc::unknown_format);
  CHECK_THAT(e.what(), Catch::Contains("index") && Catch::Contains("a FIFO"));

  // A shard that is a FIFO.
  test::TempDir shard_dir;
  { std::ofstream(shard_dir / "model.safetensors.index.json") << R"({"weight_map":{"a":"s.safetensors"}})"; }
  REQUIRE(::mkfifo((shard_dir / "s.safetensors").c_str(), 0600) == 0);
  e = error_of([&] { open_catalog(shard_dir.path()); });
  CHECK(e.kind() == errc::unknown_format);
  CHECK_THAT(e.what(), Catch::Contains("shard named by") && Catch::Contains("a FIFO"));

  // And through the source.
  asio::io_context ctx;
  e = error_of([&] { CheckpointSource::open(ctx.get_executor(), fifo); });
  CHECK(e.kind() == errc::unknown_format);
  RegularFile f = open_regular_file(fifo.string());
  CHECK_FALSE(f);
  CHECK(f.not_regular == "a FIFO");
}

TEST_CASE("shards – one that cannot be opened reports its errno, only a missing one says it does not exist",
          "[io][inputs][messages]") {
  test::TempDir dir;
  const std::string long_name = std::string(300, 'x') + ".safetensors";  // longer than NAME_MAX
  { std::ofstream(dir / "model.safetensors.index.json") << fmt::format(R"({{"weight_map":{{"a":"{}"}}}})", long_name); }
  Error e = error_of([&] { open_catalog(dir.path()); });
  CHECK(e.kind() == errc::io_error);
  CHECK(e.context().os_error == std::error_code(ENAMETOOLONG, std::system_category()));
  CHECK_THAT(e.what(), Catch::Contains("cannot be opened") && !Catch::Contains("does not exist"));

  // A link loop: ELOOP, not "does not exist".
  test::TempDir loop;
  { std::ofstream(loop / "model.safetensors.index.json") << R"({"weight_map":{"a":"s.safetensors"}})"; }
  std::filesystem::create_symlink("s.safetensors", loop / "s.safetensors");
  e = error_of([&] { open_catalog(loop.path()); });
  CHECK(e.kind() == errc::io_error);
  CHECK(e.context().os_error == std::error_code(ELOOP, std::system_category()));

  // Missing: shard_missing, "does not exist".
  std::filesystem::remove(loop / "s.safetensors");
  e = error_of([&] { open_catalog(loop.path()); });
  CHECK(e.kind() == errc::shard_missing);
  CHECK_THAT(e.what(), Catch::Contains("does not exist") && Catch::Contains("for 1 tensor"));
}

TEST_CASE("symbolic links – a Hugging Face cache snapshot is followed, confine_to refuses links leaving a root",
          "[io][inputs]") {
  Small s;
  test::TempDir repo;
  std::filesystem::create_directories(repo / "blobs");
  std::filesystem::create_directories(repo / "snapshots" / "rev");
  std::filesystem::copy_file(s.path, repo / "blobs" / "0123abcd");
  std::filesystem::create_symlink("../../blobs/0123abcd", repo / "snapshots" / "rev" / "model.safetensors");
  const auto snapshot = repo / "snapshots" / "rev";

  CHECK(open_catalog(snapshot).size() == 3);  // followed by default
  CHECK(open_catalog(snapshot, {.confine_to = repo.path()}).size() == 3);
  Error e = error_of([&] { open_catalog(snapshot, {.confine_to = snapshot}); });
  CHECK(e.kind() == errc::outside_root);
  CHECK(errc_family(e.kind()) == error_family::format);
  CHECK_THAT(e.what(), Catch::Contains("blobs/0123abcd") && Catch::Contains("confine_to"));

  asio::io_context ctx;
  SourceOptions o;
  o.pool = {.budget = 1 << 20, .huge_pages = false, .prefault = false};
  o.confine_to = snapshot;
  e = error_of([&] { CheckpointSource::open(ctx.get_executor(), snapshot, o); });
  CHECK(e.kind() == errc::outside_root);
}

TEST_CASE("messages – NULs, escape sequences and newlines from names are escaped, never echoed", "[io][messages]") {
  test::TempDir dir;
  // The tensor name is "a\0b\x1b[31m\nc" (JSON escapes), with a dtype that does not exist.
  const std::string header = R"({"a\u0000b\u001b[31m\nc":{"dtype":"NOPE","shape":[1],"data_offsets":[0,1]}})";
  test::write_bytes(dir / "m.safetensors", test::st_file(header, 1));
  Error e = error_of([&] { open_catalog(dir / "m.safetensors"); });
  CHECK(e.kind() == errc::unknown_dtype);
  const std::string what = e.what();
  CHECK_THAT(what, Catch::Contains(R"(a\0b\x1b[31m\nc)"));
  for (char c : what) CHECK(static_cast<unsigned char>(c) >= 0x20);
  CHECK(std::strlen(e.what()) == what.size());  // no NUL cuts it off

  CHECK(printable("ok ü") == "ok ü");
  CHECK(printable(std::string("\x9b", 1)) == "\\x9b");  // not UTF-8: escaped
  CHECK(printable("\xc2\x9b"
                  "2J") == "\\xc2\\x9b2J");  // C1 CSI as UTF-8: escaped
  CHECK(printable("tab\there\r") == "tab\\there\\r");

  DebugLogCapture logs;
  log::info("{}", std::string("x\x1b[2Jy\n", 7));
  CHECK(logs.contains("x\\x1b[2Jy\\n"));
}

TEST_CASE("messages – a GGUF file given to the safetensors parser says it looks like GGUF", "[io][messages]") {
  test::TempDir dir;
  std::vector<std::byte> bytes = test::raw_bytes(std::string("GGUF\x03\0\0\0", 8));
  bytes.resize(4096, std::byte{0});
  test::write_bytes(dir / "model.gguf", bytes);
  // The catalog recognises GGUF (an empty v3 file: no tensors, no KV pairs) ...
  const Catalog catalog = open_catalog(dir / "model.gguf");
  CHECK(catalog.size() == 0);
  CHECK(catalog.files().front().format == "gguf");
  // ... and the safetensors parser, given it anyway, says what it looks like.
  Error e = error_of([&] { safetensors::parse_file_prefix(bytes, bytes.size(), (dir / "model.gguf").string()); });
  CHECK(e.kind() == errc::header_too_large);
  CHECK_THAT(e.what(), Catch::Contains("14064895815") && Catch::Contains("GGUF"));
}

TEST_CASE("options – out-of-range values are invalid_argument naming the option and its range", "[io][options]") {
  Small s;
  asio::io_context ctx;
  auto open_with = [&](auto change) {
    SourceOptions o;
    o.pool = {.budget = 1 << 20, .huge_pages = false, .prefault = false};
    change(o);
    return error_of([&] { CheckpointSource::open(ctx.get_executor(), s.path, o); });
  };
  struct Case {
    const char* name;
    std::function<void(SourceOptions&)> change;
    const char* says;
  };
  const Case cases[] = {
      {"depth 0", [](SourceOptions& o) { o.reader.depth = 0; }, "ReaderOptions::depth is 0; it must be 1..4096"},
      {"depth -1", [](SourceOptions& o) { o.reader.depth = static_cast<unsigned>(-1); }, "ReaderOptions::depth"},
      {"depth 2^31", [](SourceOptions& o) { o.reader.depth = 1u << 31; }, "ReaderOptions::depth"},
      {"pread depth 100000",
       [](SourceOptions& o) {
         o.reader.kind = ReaderKind::pread;
         o.reader.depth = 100000;
       },
       "ReaderOptions::depth is 100000"},
      {"max_request 0", [](SourceOptions& o) { o.reader.max_request = 0; }, "ReaderOptions::max_request"},
      {"max_request 2 GiB", [](SourceOptions& o) { o.reader.max_request = std::size_t{2} << 30; },
       "must be 1..1073741824"},
      {"kind 7", [](SourceOptions& o) { o.reader.kind = static_cast<ReaderKind>(7); }, "ReaderOptions::kind"},
      {"direct 9", [](SourceOptions& o) { o.reader.direct = static_cast<DirectMode>(9); }, "ReaderOptions::direct"},
      {"uring_policy 5", [](SourceOptions& o) { o.reader.uring_policy = static_cast<UringPolicy>(5); },
       "ReaderOptions::uring_policy"},
      {"budget 0", [](SourceOptions& o) { o.pool.budget = 0; }, "LeasePoolOptions::budget is 0 bytes"},
      {"budget SIZE_MAX", [](SourceOptions& o) { o.pool.budget = SIZE_MAX; }, "LeasePoolOptions::budget"},
      {"release_after -1 ms", [](SourceOptions& o) { o.pool.release_after = std::chrono::milliseconds(-1); },
       "LeasePoolOptions::release_after is -1 ms"},
      {"chunk_bytes 0", [](SourceOptions& o) { o.chunk_bytes = 0; }, "SourceOptions::chunk_bytes"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    Error e = open_with(c.change);
    CHECK(e.kind() == errc::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains(c.says));
  }
}

TEST_CASE("pread reader – threads are bounded and a deep queue needs no thread per request", "[io][options]") {
  Small s;
  asio::io_context ctx;
  SourceOptions o;
  o.pool = {.budget = 1 << 20, .huge_pages = false, .prefault = false};
  o.reader.kind = ReaderKind::pread;
  o.reader.depth = ReaderOptions::max_depth;
  auto source = CheckpointSource::open(ctx.get_executor(), s.path, o);
  CHECK_THAT(source->reader().describe(), Catch::Contains(fmt::format("{} threads", ReaderOptions::max_pread_threads)));
  TensorReadRequest b{"b"};
  Lease lease = run_on(ctx, source->async_read(b, asio::use_awaitable));
  CHECK(std::vector<std::byte>(lease.bytes().begin(), lease.bytes().end()) == s.data[1]);
}

TEST_CASE("pread reader – a 300 MB address-space limit gives a load or a typed error, never an abort",
          "[io][options]") {
  if (sanitized()) {
    WARN("skipped under a sanitizer: its shadow memory needs more address space than the limit");
    return;
  }
  Small s;
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    struct rlimit limit {
      300'000'000, 300'000'000
    };
    ::setrlimit(RLIMIT_AS, &limit);
    try {
      asio::io_context ctx;
      SourceOptions o;  // the default 256 MiB budget, prefaulted on threads
      o.reader.kind = ReaderKind::pread;
      o.reader.depth = 64;
      auto source = CheckpointSource::open(ctx.get_executor(), s.path, o);
      TensorReadRequest b{"b"};
      Lease lease = run_on(ctx, source->async_read(b, asio::use_awaitable));
      ::_exit(std::memcmp(lease.bytes().data(), s.data[1].data(), s.data[1].size()) == 0 ? 0 : 1);
    } catch (const Error&) {
      ::_exit(3);  // a typed error is an acceptable outcome
    } catch (...) {
      ::_exit(4);
    }
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  INFO("status " << status);
  REQUIRE(WIFEXITED(status));  // not killed by abort()
  CHECK((WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 3));
}

TEST_CASE("readers – a read that keeps failing with EAGAIN fails with io_error instead of spinning", "[io][faults]") {
  struct Again final : FaultInjector {
    ReadFault on_complete(std::uint32_t, std::uint64_t, std::uint64_t) override { return {.error = EAGAIN}; }
  } faults;
  auto kind = GENERATE(ReaderKind::uring, ReaderKind::pread);
  Small s;
  asio::io_context ctx;
  SourceOptions o;
  o.pool = {.budget = 1 << 20, .huge_pages = false, .prefault = false};
  o.reader.kind = kind;
  o.reader.faults = &faults;
  auto source = CheckpointSource::open(ctx.get_executor(), s.path, o);
  TensorReadRequest b{"b"};
  Error e = error_of([&] { run_on(ctx, source->async_read(b, asio::use_awaitable)); });
  CHECK(e.kind() == errc::io_error);
  CHECK(e.context().tensor == "b");
  CHECK(e.context().os_error == std::error_code(EAGAIN, std::system_category()));
  CHECK_THAT(e.what(), Catch::Contains("1001 times in a row"));
  CHECK(source->pool().in_use() == 0);
}

TEST_CASE("checkpoint source – an EIO in a neighbour's bytes inside a direct-read window is not this tensor's",
          "[io][faults][messages]") {
  // Fails reads overlapping [begin, end): the bytes of tensor `a`, just before `b`.
  struct FailRange final : FaultInjector {
    std::uint64_t begin = 0, end = 0;
    ReadFault on_complete(std::uint32_t, std::uint64_t offset, std::uint64_t length) override {
      if (offset < end && offset + length > begin) return {.error = EIO};
      return {};
    }
  } faults;
  auto kind = GENERATE(ReaderKind::uring, ReaderKind::pread);
  Small s;
  asio::io_context ctx;
  SourceOptions o;
  o.pool = {.budget = 1 << 20, .huge_pages = false, .prefault = false};
  o.reader.kind = kind;
  o.reader.direct = DirectMode::on;
  o.reader.faults = &faults;
  std::unique_ptr<CheckpointSource> source;
  try {
    source = CheckpointSource::open(ctx.get_executor(), s.path, o);
  } catch (const Error& e) {
    if (e.kind() != errc::direct_io_unsupported) throw;
    WARN("O_DIRECT is unsupported here: " << e.what());
    return;
  }
  const TensorInfo& a = source->catalog().at("a");
  const TensorInfo& b = source->catalog().at("b");
  REQUIRE(b.offset % 4096 != 0);  // b's window starts inside a's bytes
  faults.begin = a.offset;
  faults.end = a.offset + a.nbytes;
  TensorReadRequest rb{"b"};
  Lease lease = run_on(ctx, source->async_read(rb, asio::use_awaitable));
  CHECK(std::vector<std::byte>(lease.bytes().begin(), lease.bytes().end()) == s.data[1]);
  lease.release();
  // The same through a caller's window (the CPU backend's cold reads): b's bytes land at the
  // window's lead, and a's failing bytes are not b's error.
  const std::uint64_t aligned_before = source->alignment_bytes();
  const std::optional<DirectWindow> w = source->direct_window(rb);
  REQUIRE(w);
  CHECK(w->lead == b.offset % 4096);
  CHECK(w->bytes % 4096 == 0);
  CHECK(w->bytes >= w->lead + b.nbytes);
  std::unique_ptr<std::byte, decltype(&std::free)> window(static_cast<std::byte*>(std::aligned_alloc(4096, w->bytes)),
                                                          &std::free);
  REQUIRE(window);
  run_on(ctx, source->async_read_window_into(rb, {window.get(), w->bytes}, asio::use_awaitable));
  CHECK(std::vector<std::byte>(window.get() + w->lead, window.get() + w->lead + b.nbytes) == s.data[1]);
  CHECK(source->alignment_bytes() == aligned_before);  // the window failed: b's bytes were read alone
  faults.begin = faults.end = 0;                       // no fault: the window is read whole
  run_on(ctx, source->async_read_window_into(rb, {window.get(), w->bytes}, asio::use_awaitable));
  CHECK(std::vector<std::byte>(window.get() + w->lead, window.get() + w->lead + b.nbytes) == s.data[1]);
  const std::uint64_t file_end =
      std::min<std::uint64_t>(b.offset - w->lead + w->bytes, std::filesystem::file_size(s.path));
  CHECK(source->alignment_bytes() - aligned_before == file_end - (b.offset - w->lead) - b.nbytes);
  // A window of the wrong size or alignment is refused, naming the tensor.
  Error wrong = error_of([&] {
    run_on(ctx, source->async_read_window_into(rb, {window.get() + 8, w->bytes - 8}, asio::use_awaitable));
  });
  CHECK(wrong.kind() == errc::invalid_argument);
  CHECK(wrong.context().tensor == "b");
  faults.begin = a.offset;
  faults.end = a.offset + a.nbytes;
  TensorReadRequest ra{"a"};
  Error e = error_of([&] { run_on(ctx, source->async_read(ra, asio::use_awaitable)); });
  CHECK(e.kind() == errc::io_error);
  CHECK(e.context().tensor == "a");
}

TEST_CASE("checkpoint source – a file modified while open fails its next read with file_changed", "[io][faults]") {
  Small s;
  asio::io_context ctx;
  SourceOptions o;
  o.pool = {.budget = 1 << 20, .huge_pages = false, .prefault = false};
  auto source = CheckpointSource::open(ctx.get_executor(), s.path, o);
  // Same size, new bytes, a new modification time: an in-place rewrite.
  const struct timespec times[2] = {{0, UTIME_OMIT}, {12345, 0}};
  REQUIRE(::utimensat(AT_FDCWD, s.path.c_str(), times, 0) == 0);
  TensorReadRequest b{"b"};
  Error e = error_of([&] { run_on(ctx, source->async_read(b, asio::use_awaitable)); });
  CHECK(e.kind() == errc::file_changed);
  CHECK(e.context().tensor == "b");
}

TEST_CASE(
    "checkpoint source – a file rewritten in place at its size with its old modification time put back fails with "
    "file_changed, never mixed bytes",
    "[io][faults]") {
  Small s;
  asio::io_context ctx;
  SourceOptions o;
  o.pool = {.budget = 1 << 20, .huge_pages = false, .prefault = false};
  auto source = CheckpointSource::open(ctx.get_executor(), s.path, o);
  const TensorInfo& b = source->catalog().at("b");
  // Read before the rewrite: the file's bytes.
  TensorReadRequest a{"a"};
  {
    Lease before = run_on(ctx, source->async_read(a, asio::use_awaitable));
    CHECK(std::memcmp(before.bytes().data(), s.data[0].data(), s.data[0].size()) == 0);
  }
  // A mapping and a mapped weight made before it: checked after their reads.
  TensorReadRequest rb{"b"};
  std::optional<MappedView> view = source->map_resident(rb);
  std::optional<MappedTensor> weight = source->map_tensor(rb);
  if (view) CHECK_NOTHROW(view->check_unchanged());
  if (weight) CHECK(weight->check_file() == MappedFile::State::unchanged);

  // What cp -p does to the file: same size, other bytes, the old modification time back.
  const std::vector<std::byte> other(b.nbytes, std::byte{0x5a});
  test::rewrite_in_place(s.path, b.offset, other);

  auto check_changed = [&](const Error& e, const std::string& tensor) {
    CHECK(e.kind() == errc::file_changed);
    CHECK(e.context().file == s.path.string());
    CHECK(e.context().tensor == tensor);
    CHECK_THAT(e.what(), Catch::Contains("ctime"));
  };
  // Every later read: as a lease, into caller memory, of a tensor the rewrite did not touch.
  for (const char* name : {"b", "c", "a"}) {
    TensorReadRequest r{name};
    check_changed(error_of([&] { run_on(ctx, source->async_read(r, asio::use_awaitable)); }), name);
  }
  std::vector<std::byte> into(b.nbytes);
  check_changed(error_of([&] { run_on(ctx, source->async_read_into(rb, into, asio::use_awaitable)); }), "b");
  if (view)
    check_changed(error_of([&] { view->check_unchanged(); }), "b");
  else
    WARN("no mapping of the resident tensor here (map_resident declined): its check is not exercised");
  if (weight)
    check_changed(error_of([&] { (void)weight->check_file(); }), "b");
  else
    WARN("no mapped weight here (map_tensor declined): its check is not exercised");
  CHECK(source->pool().in_use() == 0);  // the failed reads' leases went back
}

TEST_CASE(
    "checkpoint source – a file replaced by rename while open keeps being read: the old inode's ctime and link "
    "count moved, its bytes did not",
    "[io][faults]") {
  Small s;
  asio::io_context ctx;
  SourceOptions o;
  o.pool = {.budget = 1 << 20, .huge_pages = false, .prefault = false};
  auto source = CheckpointSource::open(ctx.get_executor(), s.path, o);
  TensorReadRequest rb{"b"};
  std::optional<MappedTensor> weight = source->map_tensor(rb);
  // The documented way to replace a checkpoint: a new file renamed over the path. Unlinking
  // the old inode moves its ctime (and its link count to 0) without touching its bytes.
  struct stat old_status {};
  REQUIRE(::stat(s.path.c_str(), &old_status) == 0);
  const std::filesystem::path next = s.dir / "next.safetensors";
  const std::vector<std::vector<std::byte>> next_data = test::random_tensor_bytes(s.specs, 6);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a coarse ctime moves too
  synth::write_safetensors(next, s.specs, test::spans_of(next_data));
  std::filesystem::rename(next, s.path);

  Lease lease = run_on(ctx, source->async_read(rb, asio::use_awaitable));
  REQUIRE(lease.bytes().size() == s.data[1].size());
  CHECK(std::memcmp(lease.bytes().data(), s.data[1].data(), s.data[1].size()) == 0);
  if (weight)
    CHECK(weight->check_file() == MappedFile::State::replaced);
  else
    WARN("no mapped weight here (map_tensor declined): its check is not exercised");
}

namespace {
sigjmp_buf app_jump;
volatile sig_atomic_t app_faults = 0;
void app_handler(int, siginfo_t*, void*) {
  app_faults = app_faults + 1;
  siglongjmp(app_jump, 1);
}
// A shared mapping of a one-page file truncated to 0: reading it raises SIGBUS.
const volatile char* faulting_page(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  (void)!::ftruncate(fd, 4096);
  void* p = ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0);
  (void)!::ftruncate(fd, 0);
  ::close(fd);
  return static_cast<const volatile char*>(p);
}
}  // namespace

TEST_CASE("guarded read – an application's SIGBUS handler installed before or after eredu's keeps its faults",
          "[io][mapped]") {
  test::TempDir dir;
  for (const bool before : {true, false}) {
    INFO((before ? "installed before eredu's" : "installed after eredu's"));
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      // A fresh process: eredu's handler is not installed yet.
      const volatile char* mine = faulting_page(dir / "mine");
      const volatile char* eredus = faulting_page(dir / "eredus");
      struct sigaction sa {};
      sa.sa_sigaction = app_handler;
      sa.sa_flags = SA_SIGINFO | SA_NODEFER;
      sigemptyset(&sa.sa_mask);
      auto guarded = [&] {
        auto touch = [&] { (void)eredus[0]; };
        auto fault =
            guarded_read(std::span(reinterpret_cast<const std::byte*>(const_cast<const char*>(eredus)), 4096), touch);
        return fault.has_value();
      };
      if (before) sigaction(SIGBUS, &sa, nullptr);
      if (!guarded()) ::_exit(10);  // eredu's fault, resolved by eredu
      if (!before) sigaction(SIGBUS, &sa, nullptr);
      if (sigsetjmp(app_jump, 0) == 0) (void)mine[0];  // the application's own fault
      if (app_faults != 1) ::_exit(11);
      if (!guarded()) ::_exit(12);  // eredu's again (its handler back in front)
      if (sigsetjmp(app_jump, 0) == 0) (void)mine[0];
      ::_exit(app_faults == 2 ? 0 : 13);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
}
