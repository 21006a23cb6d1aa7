// faultfs: a FUSE file system that serves a directory and injects read faults, so that the
// fault matrix (tests/faultfs/test_fault_matrix.cpp) can prove that eredu delivers the
// file's bytes or a typed error on a file system that fails the way network and cloud
// mounts do. A test tool, not a product.
//
// usage: faultfs SOURCE MOUNTPOINT [-o direct_io] [other FUSE options]
//
// Faults are configured per directory: a file `.faultfs` in a directory of SOURCE holds one
// rule per line, `NAME FAULT ARGS...`, where NAME is a file of that directory or `*`:
//
//   NAME errno ERRNO BEGIN END   a read request overlapping bytes [BEGIN, END) fails with
//                                ERRNO (EIO, ENOSPC, ENOMEM, EAGAIN, EINTR or a number)
//   NAME short N [BEGIN END]     every reply (to requests starting in [BEGIN, END), if given)
//                                carries at most N bytes
//   NAME delay MS                every read request waits MS milliseconds first
//   NAME shrink AFTER SIZE       once AFTER bytes of the file were served, it is SIZE bytes
//                                long (reads past return 0; getattr says SIZE)
//   NAME replace AFTER OTHER     once AFTER bytes were served, the open file serves the bytes
//                                (and getattr the size and times) of OTHER, a file of the
//                                same directory: a server that lets a replacement show
//                                through an open handle
//   NAME direct_io on|off        whether the kernel reads the file in direct_io mode
//                                (default: the mount's `-o direct_io`, else off)
//
// Rules are read again whenever `.faultfs` changes (its modification time or size), which
// also resets the byte counts of shrink and replace. Attribute and entry caching are off,
// so a getattr always reaches this process.

#define FUSE_USE_VERSION 35
#include <dirent.h>
#include <fcntl.h>
#include <fuse3/fuse.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

std::string source_root;

struct Rule {
  std::string name;  // file name or "*"
  std::string fault;
  int error = 0;
  std::uint64_t a = 0, b = 0;
  std::string other;
  bool flag = false;
};

struct DirectoryRules {
  struct timespec mtime {};
  off_t size = -1;
  ino_t inode = 0;
  std::vector<Rule> rules;
  std::map<std::string, std::uint64_t> served;  // bytes served per file name since the rules changed
};

std::mutex state_mutex;
std::map<std::string, DirectoryRules> rules_by_dir;  // relative directory -> its rules

int parse_errno(const std::string& s) {
  static const std::map<std::string, int> names = {{"EIO", EIO},       {"ENOSPC", ENOSPC},      {"ENOMEM", ENOMEM},
                                                   {"EAGAIN", EAGAIN}, {"EINTR", EINTR},        {"ENODATA", ENODATA},
                                                   {"ESTALE", ESTALE}, {"ETIMEDOUT", ETIMEDOUT}};
  if (auto it = names.find(s); it != names.end()) return it->second;
  return std::atoi(s.c_str());
}

std::pair<std::string, std::string> split_path(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return {"", path};
  return {path.substr(0, slash), path.substr(slash + 1)};
}

// The rules of `dir` (relative, no leading '/'), reloaded when its .faultfs changed.
// Called with state_mutex held.
DirectoryRules& rules_of(const std::string& dir) {
  DirectoryRules& r = rules_by_dir[dir];
  const std::string file = source_root + "/" + dir + "/.faultfs";
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) {
    if (r.size != -1) r = DirectoryRules{};
    return r;
  }
  if (st.st_size == r.size && st.st_ino == r.inode && st.st_mtim.tv_sec == r.mtime.tv_sec &&
      st.st_mtim.tv_nsec == r.mtime.tv_nsec)
    return r;
  r = DirectoryRules{};
  r.mtime = st.st_mtim;
  r.size = st.st_size;
  r.inode = st.st_ino;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    Rule rule;
    if (!(words >> rule.name >> rule.fault)) continue;
    if (rule.fault == "errno") {
      std::string e;
      words >> e >> rule.a >> rule.b;
      rule.error = parse_errno(e);
    } else if (rule.fault == "short") {
      rule.b = UINT64_MAX;  // [0, b): requests starting there are cut
      std::uint64_t begin = 0, end = 0;
      words >> rule.a;
      if (words >> begin >> end) rule.other = std::to_string(begin), rule.b = end;
    } else if (rule.fault == "delay") {
      words >> rule.a;
    } else if (rule.fault == "shrink") {
      words >> rule.a >> rule.b;
    } else if (rule.fault == "replace") {
      words >> rule.a >> rule.other;
    } else if (rule.fault == "direct_io") {
      std::string v;
      words >> v;
      rule.flag = v == "on";
    } else {
      std::fprintf(stderr, "faultfs: unknown fault '%s' in %s\n", rule.fault.c_str(), file.c_str());
      continue;
    }
    r.rules.push_back(rule);
  }
  return r;
}

// What the rules say about one file, at one moment.
struct FileFaults {
  std::vector<Rule> errors;
  std::uint64_t short_reply = 0;
  std::uint64_t short_begin = 0, short_end = UINT64_MAX;
  std::uint64_t delay_ms = 0;
  bool shrink = false;
  std::uint64_t shrink_after = 0, shrink_to = 0;
  bool replace = false;
  std::uint64_t replace_after = 0;
  std::string replace_with;
  int direct_io = -1;  // -1: the mount's default
};

FileFaults faults_for(const std::string& rel) {
  const auto [dir, name] = split_path(rel);
  std::lock_guard lock(state_mutex);
  FileFaults f;
  for (const Rule& r : rules_of(dir).rules) {
    if (r.name != "*" && r.name != name) continue;
    if (r.fault == "errno") f.errors.push_back(r);
    if (r.fault == "short") {
      f.short_reply = r.a;
      f.short_begin = r.other.empty() ? 0 : std::stoull(r.other);
      f.short_end = r.b;
    }
    if (r.fault == "delay") f.delay_ms = r.a;
    if (r.fault == "shrink") f.shrink = true, f.shrink_after = r.a, f.shrink_to = r.b;
    if (r.fault == "replace") f.replace = true, f.replace_after = r.a, f.replace_with = r.other;
    if (r.fault == "direct_io") f.direct_io = r.flag ? 1 : 0;
  }
  return f;
}

std::uint64_t served_bytes(const std::string& rel) {
  const auto [dir, name] = split_path(rel);
  std::lock_guard lock(state_mutex);
  return rules_of(dir).served[name];
}

void add_served(const std::string& rel, std::uint64_t n) {
  const auto [dir, name] = split_path(rel);
  std::lock_guard lock(state_mutex);
  rules_of(dir).served[name] += n;
}

std::string relative(const char* path) { return path[0] == '/' ? std::string(path + 1) : std::string(path); }
std::string backing(const std::string& rel) { return rel.empty() ? source_root : source_root + "/" + rel; }

// One open file: its backing descriptor, and the replacement's once it shows through.
struct Handle {
  std::string rel;
  int fd = -1;
  int other_fd = -1;
  std::mutex mutex;
  ~Handle() {
    if (fd >= 0) ::close(fd);
    if (other_fd >= 0) ::close(other_fd);
  }
};

Handle* handle_of(fuse_file_info* fi) { return reinterpret_cast<Handle*>(fi->fh); }

void* ff_init(fuse_conn_info*, fuse_config* cfg) {
  cfg->attr_timeout = 0;
  cfg->entry_timeout = 0;
  cfg->negative_timeout = 0;
  cfg->kernel_cache = 0;
  cfg->use_ino = 1;
  return nullptr;
}

int ff_getattr(const char* path, struct stat* st, fuse_file_info*) {
  const std::string rel = relative(path);
  if (::lstat(backing(rel).c_str(), st) != 0) return -errno;
  if (!S_ISREG(st->st_mode)) return 0;
  const FileFaults f = faults_for(rel);
  const std::uint64_t served = served_bytes(rel);
  if (f.replace && served >= f.replace_after) {
    const auto [dir, name] = split_path(rel);
    struct stat other {};
    if (::stat(backing(dir.empty() ? f.replace_with : dir + "/" + f.replace_with).c_str(), &other) == 0) {
      st->st_size = other.st_size;
      st->st_mtim = other.st_mtim;
      st->st_ctim = other.st_ctim;
    }
  }
  if (f.shrink && served >= f.shrink_after && static_cast<std::uint64_t>(st->st_size) > f.shrink_to) {
    st->st_size = static_cast<off_t>(f.shrink_to);
  }
  return 0;
}

int ff_readdir(const char* path, void* buf, fuse_fill_dir_t fill, off_t, fuse_file_info*, fuse_readdir_flags) {
  DIR* d = ::opendir(backing(relative(path)).c_str());
  if (!d) return -errno;
  while (dirent* e = ::readdir(d)) {
    struct stat st {};
    st.st_ino = e->d_ino;
    st.st_mode = static_cast<mode_t>(DTTOIF(e->d_type));
    if (fill(buf, e->d_name, &st, 0, static_cast<fuse_fill_dir_flags>(0))) break;
  }
  ::closedir(d);
  return 0;
}

int ff_readlink(const char* path, char* buf, size_t size) {
  const ssize_t n = ::readlink(backing(relative(path)).c_str(), buf, size - 1);
  if (n < 0) return -errno;
  buf[n] = '\0';
  return 0;
}

int ff_open(const char* path, fuse_file_info* fi) {
  if ((fi->flags & O_ACCMODE) != O_RDONLY) return -EROFS;
  auto h = std::make_unique<Handle>();
  h->rel = relative(path);
  h->fd = ::open(backing(h->rel).c_str(), O_RDONLY | O_CLOEXEC);
  if (h->fd < 0) return -errno;
  const FileFaults f = faults_for(h->rel);
  if (f.direct_io >= 0) fi->direct_io = static_cast<unsigned>(f.direct_io);
  fi->keep_cache = 0;
  fi->fh = reinterpret_cast<std::uint64_t>(h.release());
  return 0;
}

int ff_read(const char*, char* buf, size_t size, off_t off, fuse_file_info* fi) {
  Handle* h = handle_of(fi);
  const FileFaults f = faults_for(h->rel);
  if (f.delay_ms) std::this_thread::sleep_for(std::chrono::milliseconds(f.delay_ms));
  const auto begin = static_cast<std::uint64_t>(off);
  for (const Rule& r : f.errors) {
    if (begin < r.b && begin + size > r.a) return -r.error;
  }
  std::uint64_t want = size;
  if (f.short_reply && want > f.short_reply && begin >= f.short_begin && begin < f.short_end) want = f.short_reply;
  const std::uint64_t served = served_bytes(h->rel);
  if (f.shrink && served >= f.shrink_after) {
    if (begin >= f.shrink_to) return 0;
    want = std::min<std::uint64_t>(want, f.shrink_to - begin);
  }
  int fd = h->fd;
  if (f.replace && served >= f.replace_after) {
    std::lock_guard lock(h->mutex);
    if (h->other_fd < 0) {
      const auto [dir, name] = split_path(h->rel);
      h->other_fd =
          ::open(backing(dir.empty() ? f.replace_with : dir + "/" + f.replace_with).c_str(), O_RDONLY | O_CLOEXEC);
      if (h->other_fd < 0) return -errno;
    }
    fd = h->other_fd;
  }
  std::uint64_t got = 0;
  while (got < want) {
    const ssize_t n = ::pread(fd, buf + got, want - got, static_cast<off_t>(begin + got));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) break;
    got += static_cast<std::uint64_t>(n);
  }
  add_served(h->rel, got);
  return static_cast<int>(got);
}

int ff_release(const char*, fuse_file_info* fi) {
  delete handle_of(fi);  // owned since ff_open released it into fi->fh
  return 0;
}

int ff_statfs(const char* path, struct statvfs* st) {
  return ::statvfs(backing(relative(path)).c_str(), st) == 0 ? 0 : -errno;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: faultfs SOURCE MOUNTPOINT [FUSE options]\n");
    return 2;
  }
  char* real = ::realpath(argv[1], nullptr);
  if (!real) {
    std::perror("faultfs: source");
    return 2;
  }
  source_root = real;
  std::free(real);  // from realpath's malloc
  fuse_operations ops{};
  ops.init = ff_init;
  ops.getattr = ff_getattr;
  ops.readdir = ff_readdir;
  ops.readlink = ff_readlink;
  ops.open = ff_open;
  ops.read = ff_read;
  ops.release = ff_release;
  ops.statfs = ff_statfs;
  // argv without SOURCE: fuse_main takes the mount point and options.
  std::vector<char*> args{argv[0]};
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  return fuse_main(static_cast<int>(args.size()), args.data(), &ops, nullptr);
}
