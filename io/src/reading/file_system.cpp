#include "eredu/io/reading/file_system.hpp"

#include <sys/vfs.h>

#include <array>
#include <cerrno>
#include <system_error>

#include <fmt/format.h>

#include "eredu/core/error.hpp"

namespace eredu::io {
namespace {

struct Known {
  std::uint64_t magic;
  std::string_view name;
  bool local;
};

// Magic numbers from linux/magic.h (and the out-of-tree zfs, lustre and gpfs). Only the
// local ones are trusted with io_uring; the others are listed so that log lines name them.
constexpr std::array known{
    Known{0xEF53, "ext4", true},  // ext2, ext3 and ext4 share it
    Known{0x58465342, "xfs", true},       Known{0x9123683E, "btrfs", true},
    Known{0x01021994, "tmpfs", true},     Known{0x858458F6, "ramfs", true},
    Known{0x794C7630, "overlayfs", true}, Known{0xF2F52010, "f2fs", true},
    Known{0xE0F5E1E2, "erofs", true},     Known{0x73717368, "squashfs", true},
    Known{0x2FC12FC1, "zfs", true},       Known{0xCA451A4E, "bcachefs", true},
    Known{0x958458F6, "hugetlbfs", true}, Known{0x65735546, "fuse", false},  // virtiofs too
    Known{0x6969, "nfs", false},          Known{0xFF534D42, "cifs", false},
    Known{0xFE534D42, "smb2", false},     Known{0x517B, "smb", false},
    Known{0x01021997, "9p", false},       Known{0x00C36400, "ceph", false},
    Known{0x5346414F, "afs", false},      Known{0x6B414653, "kafs", false},
    Known{0x73757245, "coda", false},     Known{0x0BD00BD0, "lustre", false},
    Known{0x47504653, "gpfs", false},     Known{0x20030528, "orangefs", false},
    Known{0x7461636F, "ocfs2", false},    Known{0x01161970, "gfs2", false},
};

}  // namespace

std::string FileSystemInfo::describe() const { return fmt::format("{} (magic 0x{:x})", name, magic); }

FileSystemInfo file_system_from_magic(std::uint64_t magic) noexcept {
  for (const Known& k : known) {
    if (k.magic == magic) return {magic, k.name, k.local, k.local};
  }
  return {magic, "unknown", false, false};
}

FileSystemInfo file_system_of(int fd, const std::string& path) {
  struct statfs st {};
  if (::fstatfs(fd, &st) != 0) {
    throw Error(errc::io_error, {.file = path, .os_error = std::error_code(errno, std::system_category())},
                "cannot tell which file system holds the file (fstatfs failed)");
  }
  // f_type is a signed word; magics such as 0xEF53 or 0xFF534D42 are 32-bit values.
  return file_system_from_magic(static_cast<std::uint64_t>(static_cast<std::uint32_t>(st.f_type)));
}

}  // namespace eredu::io
