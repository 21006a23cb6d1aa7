#include "eredu/io/mapping/mapped_tensor.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "eredu/io/reading/open_file.hpp"
#include "posix_values.hpp"

namespace eredu::io {
namespace {

using detail::page_size;
using detail::sys_error;

/// Bytes as "1.5 GiB" for messages.
std::string bytes_text(std::uint64_t n) {
  if (n == UINT64_MAX) return "unlimited";
  if (n < (1u << 20)) return fmt::format("{} KiB", n >> 10);
  return fmt::format("{:.1f} MiB", static_cast<double>(n) / (1 << 20));
}

}  // namespace

MappedFile::MappedFile(const OpenFile& file) : path_(file.path), size_(file.size), stamp_(file.stamp) {
  fd_.reset(::fcntl(file.buffered.get(), F_DUPFD_CLOEXEC, 0));
  if (!fd_) {
    throw Error(errc::io_error, {.file = path_, .os_error = sys_error(errno)},
                "cannot duplicate the file's descriptor to map its tensors");
  }
  struct stat st {};
  if (::fstat(fd_.get(), &st) != 0) {
    throw Error(errc::io_error, {.file = path_, .os_error = sys_error(errno)}, "cannot stat");
  }
  device_ = st.st_dev;
  inode_ = st.st_ino;
}

MappedFile::State MappedFile::check(const std::string& tensor, std::uint64_t offset) const {
  struct stat st {};
  if (::fstat(fd_.get(), &st) != 0) {
    throw Error(errc::io_error, {.file = path_, .tensor = tensor, .offset = offset, .os_error = sys_error(errno)},
                "cannot stat the mapped file");
  }
  const std::string_view why = stamp_.rewritten(FileStamp::of(st));
  if (static_cast<std::uint64_t>(st.st_size) != size_ || !why.empty()) {
    throw Error(errc::file_changed, {.file = path_, .tensor = tensor, .offset = offset},
                fmt::format("the file was rewritten in place since it was opened ({} bytes then, {} now{}{}): mapped "
                            "weights are the file's pages, so they may no longer be the bytes loaded; replace "
                            "checkpoints by renaming a new file over the old one, or load with copied weights",
                            size_, st.st_size, why.empty() ? "" : "; ", why));
  }
  struct stat now {};
  if (::stat(path_.c_str(), &now) != 0 || now.st_dev != device_ || now.st_ino != inode_) return State::replaced;
  return State::unchanged;
}

MappedTensor::MappedTensor(std::shared_ptr<const MappedFile> file, std::string tensor, std::uint64_t offset,
                           std::uint64_t length)
    : file_(std::move(file)),
      tensor_(std::move(tensor)),
      offset_(offset),
      view_(file_->fd(), offset, length, file_->path(), tensor_, file_->size()) {}

void MappedTensor::populate(std::span<const std::byte> part) const {
  if (part.empty()) return;
  const std::uint64_t page = page_size();
  const std::byte* base = view_.region().data();
  const auto begin = static_cast<std::uint64_t>(part.data() - base) / page * page;
  const auto end = static_cast<std::uint64_t>(part.data() + part.size() - base);
  const std::uint64_t at = offset_ + static_cast<std::uint64_t>(part.data() - bytes().data());
#ifdef MADV_POPULATE_READ
  for (;;) {
    if (::madvise(const_cast<std::byte*>(base + begin), end - begin, MADV_POPULATE_READ) == 0) return;
    const int e = errno;
    if (e == EINTR || e == EAGAIN) continue;
    if (e == ENOMEM) {
      throw Error(errc::out_of_memory,
                  {.file = file_->path(), .tensor = tensor_, .offset = at, .os_error = sys_error(e)},
                  fmt::format("cannot map {} bytes of the file's pages", part.size()));
    }
    // EINVAL (a kernel before 5.14), or a page that cannot be read in (EFAULT, EIO): the
    // guarded touch below finds that page, and fault_error names its offset and whether the
    // file shrank.
    break;
  }
#endif
  // One read per page, guarded: a page the kernel cannot supply becomes a typed error.
  struct Touch {
    const std::byte* from;
    const std::byte* to;
    std::uint64_t page;
    void operator()() const {
      for (const volatile std::byte* p = from; p < to; p += page) (void)*p;
    }
  } touch{base + begin, base + end, page};
  if (auto fault = guarded_read(view_.region(), touch)) throw view_.fault_error(*fault);
}

MemoryLockLimit memory_lock_limit() noexcept {
  MemoryLockLimit m;
  struct rlimit lim {};
  m.limit = ::getrlimit(RLIMIT_MEMLOCK, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY ? lim.rlim_cur : UINT64_MAX;
  // Capabilities are per thread, and lock() runs on whichever arena thread maps the weight.
  std::ifstream status("/proc/thread-self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.starts_with("VmLck:")) m.locked = std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;  // "N kB"
    if (line.starts_with("CapEff:")) {
      constexpr unsigned cap_ipc_lock = 14;  // linux/capability.h
      m.exempt = (std::strtoull(line.c_str() + 7, nullptr, 16) >> cap_ipc_lock) & 1u;
    }
  }
  return m;
}

void MappedTensor::lock() {
  if (locked_ || view_.region().empty()) return;
  const std::span<const std::byte> region = view_.region();
  const MemoryLockLimit m = memory_lock_limit();
  auto refused = [&](std::error_code os) {
    return Error(errc::out_of_memory, {.file = file_->path(), .tensor = tensor_, .offset = offset_, .os_error = os},
                 fmt::format("cannot lock the tensor's {} in memory: RLIMIT_MEMLOCK is {} and this process has {} "
                             "locked already{} (raise it: ulimit -l, LimitMEMLOCK= in a systemd unit, "
                             "--ulimit memlock= in a container; or map without locking)",
                             bytes_text(region.size()), bytes_text(m.limit), bytes_text(m.locked),
                             m.exempt ? ", though CAP_IPC_LOCK exempts it" : ""));
  };
  if (!m.exempt && m.limit != UINT64_MAX && m.locked + region.size() > m.limit) throw refused({});
  if (::mlock(region.data(), region.size()) != 0) throw refused(sys_error(errno));
  locked_ = true;
}

std::uint64_t MappedTensor::resident_bytes() const noexcept {
  const std::span<const std::byte> region = view_.region();
  if (region.empty()) return 0;
  const std::uint64_t page = page_size();
  std::vector<unsigned char> pages((region.size() + page - 1) / page);
  if (::mincore(const_cast<std::byte*>(region.data()), region.size(), pages.data()) != 0) return 0;
  std::uint64_t resident = 0;
  for (unsigned char p : pages) resident += p & 1u;
  return std::min<std::uint64_t>(resident * page, bytes().size());
}

}  // namespace eredu::io
