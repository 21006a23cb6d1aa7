// The local object cache: hits, refills of a changed object, failed fills, the LRU bound, and
// sharing one directory between threads and between processes (a second process is the
// test_remote_cache_filler program), including a filler killed mid-fill.
#include "eredu/io/remote/object_cache.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "eredu/core/error.hpp"
#include "eredu/io/reading/unique_fd.hpp"
#include "support/error_kind.hpp"
#include "support/temp_dir.hpp"

extern char** environ;

using namespace eredu;
using namespace eredu::io;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

/// Writes `n` bytes of `byte` to `fd`.
void write_bytes(int fd, std::uint64_t n, char byte) {
  const std::string chunk(4096, byte);
  while (n > 0) {
    const auto part = static_cast<std::size_t>(std::min<std::uint64_t>(n, chunk.size()));
    const ssize_t w = ::write(fd, chunk.data(), part);
    if (w <= 0) throw std::runtime_error("write failed");
    n -= static_cast<std::uint64_t>(w);
  }
}

/// A fill that writes the object's bytes (all `byte`) and counts its calls.
struct CountingFill {
  std::uint64_t size;
  char byte;
  int* calls;
  void operator()(int fd) const {
    ++*calls;
    write_bytes(fd, size, byte);
  }
};

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string read_all_fd(int fd) {
  std::string out;
  char buf[4096];
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd, buf, sizeof buf, at);
    if (n <= 0) return out;
    out.append(buf, static_cast<std::size_t>(n));
    at += n;
  }
}

/// True when `path` holds `size` bytes, all `byte`.
bool holds(const fs::path& path, std::uint64_t size, char byte) {
  const std::string bytes = read_all(path);
  return bytes.size() == size && bytes.find_first_not_of(byte) == std::string::npos;
}

/// Names in `dir` that contain `part`.
std::vector<std::string> names_with(const fs::path& dir, const std::string& part) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.find(part) != std::string::npos) out.push_back(name);
  }
  return out;
}

/// Sets an entry's use time (the returned data file's mtime) to `age` ago.
void set_age(const fs::path& data, std::chrono::seconds age) {
  fs::last_write_time(data, fs::file_time_type::clock::now() - age);
}

/// The lock file of the entry whose data file is `data` (`<hash>.<version>.data` → `<hash>.lock`).
fs::path lock_of(const fs::path& data) {
  const std::string name = data.filename().string();
  return data.parent_path() / (name.substr(0, name.find('.')) + ".lock");
}

/// True when thread `tid` of process `pid` is blocked in flock on a lock file in `dir`, as a
/// waiter for another's fill is. Where /proc/PID/task/TID/syscall cannot be read, an open lock
/// file is taken as the sign (it is opened right before the flock).
bool waiting_on_lock(pid_t pid, pid_t tid, const fs::path& dir) {
  const fs::path task = fs::path("/proc") / std::to_string(pid) / "task" / std::to_string(tid);
  bool lock_open = false;
  std::error_code ec;
  const std::string prefix = fs::canonical(dir).string() + "/";
  for (const auto& e : fs::directory_iterator(fs::path("/proc") / std::to_string(pid) / "fd", ec)) {
    const std::string target = fs::read_symlink(e.path(), ec).string();
    if (!ec && target.rfind(prefix, 0) == 0 && target.ends_with(".lock")) lock_open = true;
  }
  std::ifstream syscall_file(task / "syscall");
  long number = -1;
  if (!(syscall_file >> number)) return lock_open;
  return lock_open && number == SYS_flock;
}

/// Polls `done` every 5 ms for up to 10 s.
template <class F>
bool eventually(F&& done) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return done();
}

int count_lines(const fs::path& path) {
  const std::string text = read_all(path);
  return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
}

/// One run of test_remote_cache_filler; killed and reaped on destruction if still running.
class Filler {
 public:
  Filler(const fs::path& dir, const CacheKey& key, char byte, int delay_ms, const fs::path& log, fs::path out)
      : out_(std::move(out)) {
    std::vector<std::string> argv{
        EREDU_CACHE_FILLER,       dir.string(), key.url, key.etag, std::to_string(key.size), std::string(1, byte),
        std::to_string(delay_ms), log.string()};
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int rc = ::posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) throw std::runtime_error("cannot start " + argv[0]);
  }
  ~Filler() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }
  Filler(const Filler&) = delete;
  Filler& operator=(const Filler&) = delete;

  pid_t pid() const noexcept { return pid_; }
  /// Waits up to 20 s for the exit; its status (-1 when killed by a signal or still running).
  int wait() {
    int status = 0;
    for (int i = 0; i < 2000; ++i) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(10ms);
    }
    return -1;
  }
  void kill() {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  /// What it printed ("fills=F waits=W hits=H byte=B").
  std::string output() const { return read_all(out_); }

 private:
  fs::path out_;
  pid_t pid_ = -1;
};

}  // namespace

TEST_CASE("object cache - a hit after a fill calls the fill once", "[remote][cache]") {
  test::TempDir tmp;
  ObjectCache cache(tmp / "cache", 0);
  const CacheKey key{.url = "https://h.example/org/model/model.safetensors", .etag = "\"e1\"", .size = 10000};
  int calls = 0;
  const fs::path first = cache.get(key, CountingFill{key.size, 'a', &calls});
  const fs::path second = cache.get(key, CountingFill{key.size, 'b', &calls});
  CHECK(calls == 1);
  CHECK(first == second);
  CHECK(holds(first, key.size, 'a'));
  CHECK(first.parent_path() == cache.dir());
  CHECK(cache.find(key) == first);
  CHECK(cache.size_bytes() == key.size);
  const CacheStats s = cache.stats();
  CHECK(s.fills == 1);
  CHECK(s.hits == 2);  // the second get and find
  CHECK(s.waits == 0);

  // Another size under the same URL and ETag is another object: not found, refilled.
  CHECK_FALSE(cache.find({.url = key.url, .etag = key.etag, .size = key.size + 1}));

  // A second cache on the same directory (another process would do the same) sees the entry.
  ObjectCache again(tmp / "cache", 0);
  CHECK(again.get(key, CountingFill{key.size, 'c', &calls}) == first);
  CHECK(calls == 1);

  // Names come from a hash of the URL: one that tries to climb out stays in the directory.
  const CacheKey climbing{.url = "https://h.example/../../../../etc/passwd", .etag = "x", .size = 3};
  const fs::path p = cache.get(climbing, CountingFill{3, 'z', &calls});
  CHECK(p.parent_path() == cache.dir());
  CHECK(names_with(tmp.path(), "passwd").empty());
}

TEST_CASE("object cache - an object whose ETag changed is refilled and replaces the old copy", "[remote][cache]") {
  test::TempDir tmp;
  ObjectCache cache(tmp / "cache", 0);
  const CacheKey v1{.url = "s3://bucket/model.safetensors", .etag = "\"v1\"", .size = 5000};
  const CacheKey v2{.url = v1.url, .etag = "\"v2\"", .size = 5000};
  int calls = 0;
  const fs::path old_path = cache.get(v1, CountingFill{v1.size, '1', &calls});
  // A reader of the old version keeps it open across the replacement.
  const UniqueFd old_reader(::open(old_path.c_str(), O_RDONLY | O_CLOEXEC));
  REQUIRE(old_reader);

  const fs::path new_path = cache.get(v2, CountingFill{v2.size, '2', &calls});
  CHECK(calls == 2);
  CHECK(new_path != old_path);  // a path handed out never holds another version's bytes
  CHECK(holds(new_path, v2.size, '2'));
  CHECK_FALSE(fs::exists(old_path));
  CHECK_FALSE(cache.find(v1));
  CHECK(cache.find(v2) == new_path);
  CHECK(cache.size_bytes() == v2.size);
  CHECK(names_with(cache.dir(), ".data").size() == 1);
  const std::string old_bytes = read_all_fd(old_reader.get());
  CHECK(old_bytes == std::string(v1.size, '1'));
}

TEST_CASE("object cache - a fill that throws leaves no entry and its exception passes through", "[remote][cache]") {
  test::TempDir tmp;
  ObjectCache cache(tmp / "cache", 0);
  const CacheKey key{.url = "https://h.example/m.safetensors", .etag = "e", .size = 8192};
  const auto failing = [&](int fd) {
    write_bytes(fd, key.size / 2, 'x');
    throw std::runtime_error("connection reset mid-object");
  };
  CHECK_THROWS_WITH(cache.get(key, failing), "connection reset mid-object");
  CHECK_FALSE(cache.find(key));
  CHECK(names_with(cache.dir(), ".tmp.").empty());
  CHECK(names_with(cache.dir(), ".data").empty());
  CHECK(names_with(cache.dir(), ".meta").empty());
  CHECK(cache.size_bytes() == 0);
  CHECK(cache.stats().fills == 0);

  // An eredu::Error passes through with its kind, and the next get fills.
  const auto timed_out = [](int) { throw Error(errc::timed_out, {}, "stalled"); };
  CHECK(test::kind_of([&] { cache.get(key, timed_out); }) == errc::timed_out);
  int calls = 0;
  CHECK(holds(cache.get(key, CountingFill{key.size, 'y', &calls}), key.size, 'y'));
  CHECK(calls == 1);
}

TEST_CASE("object cache - a copy whose size differs from the object's is remote_error", "[remote][cache]") {
  test::TempDir tmp;
  ObjectCache cache(tmp / "cache", 0);
  const CacheKey key{.url = "https://h.example/short.safetensors", .etag = "e", .size = 4096};
  int calls = 0;
  for (const std::uint64_t written : {key.size - 1, key.size + 1, std::uint64_t{0}}) {
    try {
      cache.get(key, CountingFill{written, 's', &calls});
      FAIL("a short or long copy was accepted");
    } catch (const Error& e) {
      CHECK(e.kind() == errc::remote_error);
      CHECK(std::string(e.what()).find(key.url) != std::string::npos);
    }
  }
  CHECK(calls == 3);
  CHECK_FALSE(cache.find(key));
  CHECK(names_with(cache.dir(), ".tmp.").empty());
  CHECK(names_with(cache.dir(), ".data").empty());
}

TEST_CASE("object cache - the least recently used entries are evicted past the bound", "[remote][cache]") {
  test::TempDir tmp;
  ObjectCache cache(tmp / "cache", 300);
  int calls = 0;
  const auto key = [](char c) {
    return CacheKey{.url = std::string("https://h.example/") + c, .etag = "e", .size = 100};
  };
  const fs::path a = cache.get(key('a'), CountingFill{100, 'a', &calls});
  const fs::path b = cache.get(key('b'), CountingFill{100, 'b', &calls});
  const fs::path c = cache.get(key('c'), CountingFill{100, 'c', &calls});
  CHECK(cache.size_bytes() == 300);  // at the bound, not past it
  CHECK(cache.stats().evictions == 0);

  // a is the oldest, but a hit makes it the newest: b goes when d arrives.
  set_age(a, 30s);
  set_age(b, 20s);
  set_age(c, 10s);
  CHECK(cache.get(key('a'), CountingFill{100, '!', &calls}) == a);
  CHECK(calls == 3);
  const fs::path d = cache.get(key('d'), CountingFill{100, 'd', &calls});
  CHECK(cache.stats().evictions == 1);
  CHECK_FALSE(fs::exists(b));
  CHECK(fs::exists(a));
  CHECK(fs::exists(c));
  CHECK(fs::exists(d));
  CHECK(cache.size_bytes() == 300);

  // Set by hand: c, then a, is the least recently used; e pushes out c only.
  set_age(c, 50s);
  set_age(a, 40s);
  set_age(d, 30s);
  cache.get(key('e'), CountingFill{100, 'e', &calls});
  CHECK(cache.stats().evictions == 2);
  CHECK_FALSE(fs::exists(c));
  CHECK(fs::exists(a));
  CHECK_FALSE(cache.find(key('b')));
  CHECK_FALSE(cache.find(key('c')));
  CHECK(cache.size_bytes() == 300);

  // A bound smaller than one object: the one returned stays, all the others go.
  test::TempDir tmp2;
  ObjectCache small(tmp2 / "cache", 50);
  const fs::path x = small.get(key('x'), CountingFill{100, 'x', &calls});
  CHECK(holds(x, 100, 'x'));
  const fs::path y = small.get(key('y'), CountingFill{100, 'y', &calls});
  CHECK(holds(y, 100, 'y'));
  CHECK_FALSE(fs::exists(x));
  CHECK(small.stats().evictions == 1);
  CHECK(small.size_bytes() == 100);
}

TEST_CASE("object cache - an evicted entry stays readable to whoever opened it", "[remote][cache]") {
  test::TempDir tmp;
  ObjectCache cache(tmp / "cache", 1000);
  int calls = 0;
  const CacheKey a{.url = "https://h.example/a", .etag = "e", .size = 1000};
  const CacheKey b{.url = "https://h.example/b", .etag = "e", .size = 1000};
  const fs::path pa = cache.get(a, CountingFill{1000, 'a', &calls});
  const UniqueFd reader(::open(pa.c_str(), O_RDONLY | O_CLOEXEC));
  REQUIRE(reader);
  char first[10];
  REQUIRE(::pread(reader.get(), first, sizeof first, 0) == 10);  // a read has begun
  cache.get(b, CountingFill{1000, 'b', &calls});
  CHECK(cache.stats().evictions == 1);
  CHECK_FALSE(fs::exists(pa));
  CHECK_FALSE(cache.find(a));
  CHECK(read_all_fd(reader.get()) == std::string(1000, 'a'));  // unlinked, not truncated
}

TEST_CASE("object cache - an entry whose lock another holder has is not evicted", "[remote][cache]") {
  test::TempDir tmp;
  ObjectCache cache(tmp / "cache", 150);
  int calls = 0;
  const auto key = [](char c) {
    return CacheKey{.url = std::string("https://h.example/") + c, .etag = "e", .size = 100};
  };
  const fs::path a = cache.get(key('a'), CountingFill{100, 'a', &calls});
  set_age(a, 60s);
  {
    // As a process refilling a would hold it.
    const UniqueFd held(::open(lock_of(a).c_str(), O_RDWR | O_CLOEXEC));
    REQUIRE(held);
    REQUIRE(::flock(held.get(), LOCK_EX) == 0);
    const fs::path b = cache.get(key('b'), CountingFill{100, 'b', &calls});
    CHECK(fs::exists(a));
    CHECK(fs::exists(b));
    CHECK(cache.stats().evictions == 0);
    set_age(b, 30s);
  }
  cache.get(key('c'), CountingFill{100, 'c', &calls});
  CHECK(cache.stats().evictions == 2);
  CHECK_FALSE(cache.find(key('a')));
  CHECK_FALSE(cache.find(key('b')));
  CHECK(cache.size_bytes() == 100);
}

TEST_CASE("object cache - two threads asking for one key fill it once", "[remote][cache]") {
  test::TempDir tmp;
  ObjectCache cache(tmp / "cache", 0);
  const CacheKey key{.url = "https://h.example/shared", .etag = "e", .size = 1 << 20};
  std::atomic<int> calls{0};
  std::atomic<bool> filling{false};
  std::atomic<pid_t> second_tid{0};
  std::atomic<bool> second_waited{false};
  const auto fill = [&](int fd) {
    ++calls;
    filling = true;
    // Hold the fill until the other thread blocks on the entry's lock.
    second_waited = eventually([&] {
      const pid_t tid = second_tid.load();
      return tid != 0 && waiting_on_lock(::getpid(), tid, cache.dir());
    });
    write_bytes(fd, key.size, 't');
  };
  fs::path p1, p2;
  std::thread t1([&] { p1 = cache.get(key, fill); });
  REQUIRE(eventually([&] { return filling.load(); }));
  std::thread t2([&] {
    second_tid = static_cast<pid_t>(::syscall(SYS_gettid));
    p2 = cache.get(key, fill);
  });
  t1.join();
  t2.join();
  CHECK(second_waited);
  CHECK(calls == 1);
  CHECK(p1 == p2);
  CHECK(holds(p1, key.size, 't'));
  const CacheStats s = cache.stats();
  CHECK(s.fills == 1);
  CHECK(s.waits == 1);
  CHECK(s.hits == 1);
}

TEST_CASE("object cache - two processes asking for one key fill it once", "[remote][cache]") {
  test::TempDir tmp;
  const fs::path dir = tmp / "cache";
  const fs::path log = tmp / "fills.log";
  const CacheKey key{.url = "https://h.example/big.safetensors", .etag = "\"p\"", .size = 1 << 20};
  ObjectCache cache(dir, 0);  // makes the directory waiting_on_lock looks in

  Filler first(dir, key, 'p', 1500, log, tmp / "first.out");
  REQUIRE(eventually([&] { return count_lines(log) == 1; }));  // its fill has begun
  Filler second(dir, key, 'q', 0, log, tmp / "second.out");
  Filler third(dir, key, 'r', 0, log, tmp / "third.out");
  CHECK(eventually([&] {
    return waiting_on_lock(second.pid(), second.pid(), dir) && waiting_on_lock(third.pid(), third.pid(), dir);
  }));

  CHECK(first.wait() == 0);
  CHECK(second.wait() == 0);
  CHECK(third.wait() == 0);
  CHECK(count_lines(log) == 1);
  CHECK(first.output() == "fills=1 waits=0 hits=0 byte=p\n");
  CHECK(second.output() == "fills=0 waits=1 hits=1 byte=p\n");
  CHECK(third.output() == "fills=0 waits=1 hits=1 byte=p\n");
  const auto found = cache.find(key);
  REQUIRE(found);
  CHECK(holds(*found, key.size, 'p'));
}

TEST_CASE("object cache - a filler killed mid-fill leaves no entry, and the next get fills anew", "[remote][cache]") {
  test::TempDir tmp;
  const fs::path dir = tmp / "cache";
  const fs::path log = tmp / "fills.log";
  ObjectCache cache(dir, 0);
  const CacheKey key{.url = "https://h.example/killed", .etag = "e", .size = 1 << 20};

  SECTION("a process waiting for it fills") {
    Filler doomed(dir, key, 'k', 60'000, log, tmp / "doomed.out");
    REQUIRE(eventually([&] { return count_lines(log) == 1; }));
    Filler waiter(dir, key, 'n', 0, log, tmp / "waiter.out");
    CHECK(eventually([&] { return waiting_on_lock(waiter.pid(), waiter.pid(), dir); }));
    CHECK_FALSE(cache.find(key));  // half written: invisible
    doomed.kill();
    CHECK(waiter.wait() == 0);
    CHECK(waiter.output() == "fills=1 waits=1 hits=0 byte=n\n");
    CHECK(count_lines(log) == 2);
    int calls = 0;
    CHECK(holds(cache.get(key, CountingFill{key.size, '?', &calls}), key.size, 'n'));
    CHECK(calls == 0);
  }
  SECTION("the next get in this process fills") {
    Filler doomed(dir, key, 'k', 60'000, log, tmp / "doomed.out");
    REQUIRE(eventually([&] { return count_lines(log) == 1; }));
    // Wait for the first half on disk, then kill it with a temp file left behind.
    REQUIRE(eventually([&] {
      for (const auto& name : names_with(dir, ".tmp.")) {
        if (fs::file_size(dir / name) == key.size / 2) return true;
      }
      return false;
    }));
    doomed.kill();
    CHECK(names_with(dir, ".tmp.").size() == 1);
    CHECK_FALSE(cache.find(key));
    int calls = 0;
    const fs::path p = cache.get(key, CountingFill{key.size, 'm', &calls});
    CHECK(calls == 1);
    CHECK(holds(p, key.size, 'm'));
    CHECK(cache.stats().waits == 0);          // the kernel released the dead filler's lock
    CHECK(names_with(dir, ".tmp.").empty());  // its temp file is cleaned
    CHECK(names_with(dir, ".data").size() == 1);
  }
}

TEST_CASE("object cache - a directory that cannot be made or written is io_error naming it", "[remote][cache]") {
  test::TempDir tmp;
  { std::ofstream(tmp / "file") << "not a directory"; }
  for (const fs::path& bad : {tmp / "file" / "cache", tmp / "file"}) {
    try {
      ObjectCache cache(bad, 0);
      FAIL("a cache opened under a regular file");
    } catch (const Error& e) {
      CHECK(e.kind() == errc::io_error);
      CHECK(e.context().file == bad.string());
      CHECK(e.context().os_error);
    }
  }
  if (::geteuid() == 0) {
    WARN("running as root: permissions do not stop root, the read-only directory case is not checked");
    return;
  }
  const fs::path ro = tmp / "ro";
  fs::create_directory(ro);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  for (const fs::path& bad : {ro, ro / "cache"}) {
    try {
      ObjectCache cache(bad, 0);
      FAIL("a cache opened in a read-only directory");
    } catch (const Error& e) {
      CHECK(e.kind() == errc::io_error);
      CHECK(e.context().file == bad.string());
      CHECK(e.context().os_error == std::errc::permission_denied);
      CHECK(std::string(e.what()).find(bad.string()) != std::string::npos);
    }
  }
  fs::permissions(ro, fs::perms::owner_all);
}

TEST_CASE("object cache - files a crashed process left are removed, files not the cache's are not", "[remote][cache]") {
  test::TempDir tmp;
  const fs::path dir = tmp / "cache";
  const CacheKey key{.url = "https://h.example/left", .etag = "e", .size = 100};
  int calls = 0;
  fs::path data;
  {
    ObjectCache cache(dir, 0);
    data = cache.get(key, CountingFill{key.size, 'l', &calls});
  }
  const std::string name = data.filename().string();
  const std::string hash = name.substr(0, name.find('.'));
  // A half-written temp, a data file renamed without its meta (another version), and a stranger.
  { std::ofstream(dir / (hash + ".tmp.99999.7")) << "half"; }
  { std::ofstream(dir / (hash + ".0123456789abcdef.data")) << "orphan"; }
  { std::ofstream(dir / "notes.txt") << "mine"; }

  ObjectCache reopened(dir, 0);
  CHECK_FALSE(fs::exists(dir / (hash + ".tmp.99999.7")));
  CHECK_FALSE(fs::exists(dir / (hash + ".0123456789abcdef.data")));
  CHECK(fs::exists(dir / "notes.txt"));
  CHECK(reopened.get(key, CountingFill{key.size, '?', &calls}) == data);
  CHECK(calls == 1);
  CHECK(holds(data, key.size, 'l'));
}
