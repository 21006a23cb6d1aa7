// The CPU backend's opt-in mapped weights (cpu::WeightStorage): what they are (the file's
// page-cache pages, no pool memory) and every trade-off weight_storage.hpp states — a file
// rewritten in place changes them and the next bind refuses it, a file replaced by a rename
// does not, unlocked pages can be evicted and locked ones cannot, RLIMIT_MEMLOCK is checked
// and named, an in-place swap refuses them, and a shrunk file is a typed error, not SIGBUS,
// whether it shrinks after the load or while the load faults its pages in.

#include <fcntl.h>
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cpu/cpu_fixture.hpp"
#include "eredu/core/error.hpp"
#include "eredu/io/integrity/digest.hpp"
#include "eredu/io/mapping/mapped_tensor.hpp"
#include "eredu/io/reading/read_fault.hpp"

using namespace eredu;
using namespace eredu::test;

namespace {

/// "odd" (7 bytes) puts "misaligned" at an odd file offset; "big" spans several populate
/// tasks and pages; "small" is under a page.
std::vector<synth::TensorSpec> specs() {
  return {{"small", DType::F32, {3, 5}},
          {"big", DType::BF16, {1024, 2304}},  // 4.5 MiB
          {"odd", DType::U8, {7}},
          {"misaligned", DType::BF16, {16, 16}}};
}

struct Env {
  CpuCheckpoint ckpt{specs()};
  asio::io_context ctx;
  std::unique_ptr<io::CheckpointSource> source;
  cpu::Executor executor{2};
  cpu::StoragePool storage;
  cpu::MaterializationContext mc{executor, storage, false, cpu::WeightStorage::mapped};

  explicit Env(cpu::WeightStorage weights = cpu::WeightStorage::mapped) {
    mc.weights = weights;
    // Written by the fixture moments ago: flush the pages so that the kernel may evict them.
    io::UniqueFd fd(::open(ckpt.path.c_str(), O_RDONLY));
    ::fsync(fd.get());
    source = io::CheckpointSource::open(ctx.get_executor(), ckpt.path, io::SourceOptions{});
  }
  cpu::Tensor load(const std::string& name, Selection selection = {}) {
    io::TensorReadRequest request{name, std::move(selection)};
    return finish(ctx, cpu::Backend::materialize(*source, request, mc, {}));
  }
  std::uint64_t offset_of(const std::string& name) const { return source->catalog().at(name).offset; }
};

/// The /proc/self/maps line of the mapping that holds `p`, or "".
std::string mapping_line(const void* p) {
  std::ifstream maps("/proc/self/maps");
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  for (std::string line; std::getline(maps, line);) {
    std::uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> lo >> dash >> hi && lo <= addr && addr < hi) return line;
  }
  return "";
}

void overwrite_file(const std::filesystem::path& path, std::uint64_t offset, std::span<const std::byte> bytes) {
  io::UniqueFd fd(::open(path.c_str(), O_WRONLY));
  REQUIRE(fd);
  REQUIRE(::pwrite(fd.get(), bytes.data(), bytes.size(), static_cast<off_t>(offset)) ==
          static_cast<ssize_t>(bytes.size()));
}

/// MADV_PAGEOUT over the tensor's whole pages: 0, or the errno.
int page_out(const cpu::Tensor& t) {
  const std::span<const std::byte> region = t.storage()->mapping()->region();
  return ::madvise(const_cast<std::byte*>(region.data()), region.size(), MADV_PAGEOUT) == 0 ? 0 : errno;
}

/// This thread's capabilities (capget/capset act on the calling thread only).
struct ThreadCaps {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  ThreadCaps() { REQUIRE(::syscall(SYS_capget, &header, data) == 0); }
  void set() { REQUIRE(::syscall(SYS_capset, &header, data) == 0); }
};

}  // namespace

TEST_CASE("mapped weights are the checkpoint's page-cache pages, byte for byte, and outlive the source", "[mapped]") {
  Env env;
  std::vector<cpu::Tensor> weights;
  for (const auto& s : env.ckpt.specs) weights.push_back(env.load(s.name));
  for (std::size_t i = 0; i < weights.size(); ++i) {
    INFO(env.ckpt.specs[i].name);
    CHECK(to_vector(weights[i].bytes()) == env.ckpt.data[i]);
  }
  // Mapped: read-only storage from no pool, inside a mapping of the file, every page faulted
  // in by the load.
  const cpu::Tensor& big = weights[1];
  REQUIRE(big.storage()->read_only());
  CHECK(env.storage.stats().fresh_allocations == 1);  // only "misaligned" was copied
  CHECK(env.storage.stats().live_bytes < (std::uint64_t{1} << 20));
  CHECK(mapping_line(big.bytes().data()).find(env.ckpt.path.filename().string()) != std::string::npos);
  CHECK(big.storage()->mapping()->resident_bytes() == big.nbytes());
  CHECK(big.storage()->mapping()->offset() == env.offset_of("big"));
  CHECK(weights[0].storage()->read_only());
  CHECK(weights[2].storage()->read_only());  // u8: any offset is aligned

  // A bf16 tensor at an odd file offset cannot be read as values where it lies: copied.
  CHECK_FALSE(weights[3].storage()->read_only());

  // A column slice is not one run of the file: copied. A row slice is: mapped.
  cpu::Tensor columns = env.load("big", Selection{{Range{0, 1024}, Range{0, 128}}});
  CHECK_FALSE(columns.storage()->read_only());
  cpu::Tensor rows = env.load("big", Selection{{Range{100, 200}, Range{0, 2304}}});
  REQUIRE(rows.storage()->read_only());
  const auto& all = env.ckpt.bytes("big");
  CHECK(to_vector(rows.bytes()) == std::vector<std::byte>(all.begin() + 100 * 2304 * 2, all.begin() + 200 * 2304 * 2));

  env.source.reset();  // the mappings hold their own descriptor
  CHECK(to_vector(big.bytes()) == env.ckpt.bytes("big"));
  cpu::Backend::validate_bind(cpu::Parameter(DType::BF16, {1024, 2304}), big);
}

TEST_CASE("private mapped weights are writable copy-on-write pages: reads are the file's, writes never reach it",
          "[mapped]") {
  Env env(cpu::WeightStorage::mapped_private);
  cpu::Tensor big = env.load("big");
  cpu::Tensor small = env.load("small");
  // Reads equal the file, from a private mapping of it, faulted in by the load.
  CHECK(to_vector(big.bytes()) == env.ckpt.bytes("big"));
  CHECK(to_vector(small.bytes()) == env.ckpt.bytes("small"));
  REQUIRE(big.storage()->mapping() != nullptr);
  CHECK(big.storage()->mapping()->copy_on_write());
  CHECK_FALSE(big.storage()->read_only());
  CHECK(env.storage.stats().fresh_allocations == 0);  // no pool memory until a page is written
  const std::string line = mapping_line(big.bytes().data());
  CHECK(line.find(env.ckpt.path.filename().string()) != std::string::npos);
  CHECK(line.find(" rw-p ") != std::string::npos);  // writable, private
  CHECK(big.storage()->mapping()->resident_bytes() == big.nbytes());

  // Writable through the tensor: every byte of the first and last page, and one in between.
  const std::span<std::byte> out = big.mutable_bytes();
  REQUIRE(out.data() == big.storage()->mapping()->writable_bytes().data());
  std::vector<std::byte> expected = env.ckpt.bytes("big");
  for (std::size_t i : {std::size_t{0}, std::size_t{4095}, out.size() / 2, out.size() - 1}) {
    out[i] ^= std::byte{0xff};
    expected[i] ^= std::byte{0xff};
  }
  CHECK(to_vector(big.bytes()) == expected);

  // The file's bytes are unchanged: read back from it, and through a shared mapping of it.
  std::vector<std::byte> on_disk(big.nbytes());
  {
    io::UniqueFd fd(::open(env.ckpt.path.c_str(), O_RDONLY));
    REQUIRE(fd);
    REQUIRE(::pread(fd.get(), on_disk.data(), on_disk.size(), static_cast<off_t>(env.offset_of("big"))) ==
            static_cast<ssize_t>(on_disk.size()));
  }
  CHECK(on_disk == env.ckpt.bytes("big"));
  cpu::MaterializationContext sharing{env.executor, env.storage, false, cpu::WeightStorage::mapped};
  io::TensorReadRequest request{"big"};
  cpu::Tensor shared = finish(env.ctx, cpu::Backend::materialize(*env.source, request, sharing, {}));
  REQUIRE(shared.storage()->read_only());
  CHECK(to_vector(shared.bytes()) == env.ckpt.bytes("big"));

  // A private mapping is still a mapping of the file: an in-place swap refuses it as any other.
  cpu::Parameter slot(DType::BF16, {1024, 2304});
  cpu::Backend::bind(slot, cpu::Tensor(big));
  CHECK_THROWS_AS(cpu::Backend::overwrite(env.executor, slot, shared), BackendError);
}

TEST_CASE("a file rewritten in place changes mapped weights (not copied ones), and the next bind refuses them",
          "[mapped]") {
  Env env;
  cpu::Tensor mapped = env.load("big");
  cpu::MaterializationContext copying{env.executor, env.storage};
  io::TensorReadRequest request{"big"};
  cpu::Tensor copied = finish(env.ctx, cpu::Backend::materialize(*env.source, request, copying, {}));
  REQUIRE(mapped.storage()->read_only());
  REQUIRE_FALSE(copied.storage()->read_only());

  const std::byte before = mapped.bytes()[4096];
  const std::byte after = before ^ std::byte{0x5a};
  overwrite_file(env.ckpt.path, env.offset_of("big") + 4096, std::span(&after, 1));

  // The trade-off itself: the weight is the file's page, whatever the load saw.
  CHECK(mapped.bytes()[4096] == after);
  CHECK(copied.bytes()[4096] == before);
  try {
    cpu::Backend::validate_bind(cpu::Parameter(DType::BF16, {1024, 2304}), mapped);
    FAIL("a mapped weight of a rewritten file was bound");
  } catch (const Error& e) {
    CHECK(e.code() == errc::file_changed);
    CHECK_THAT(e.what(), Catch::Contains(env.ckpt.path.string()) && Catch::Contains("'big'") &&
                             Catch::Contains("rewritten in place"));
  }
  cpu::Backend::validate_bind(cpu::Parameter(DType::BF16, {1024, 2304}), copied);
}

TEST_CASE("a file replaced by a rename leaves mapped weights the old file's bytes, and they bind", "[mapped]") {
  Env env;
  cpu::Tensor mapped = env.load("big");
  const std::filesystem::path next = env.ckpt.path.string() + ".next";
  std::filesystem::copy_file(env.ckpt.path, next);
  const std::byte flipped = env.ckpt.bytes("big")[0] ^ std::byte{0xff};
  overwrite_file(next, env.offset_of("big"), std::span(&flipped, 1));
  std::filesystem::rename(next, env.ckpt.path);

  CHECK(mapped.storage()->mapping()->check_file() == io::MappedFile::State::replaced);
  CHECK(to_vector(mapped.bytes()) == env.ckpt.bytes("big"));
  cpu::Backend::validate_bind(cpu::Parameter(DType::BF16, {1024, 2304}), mapped);  // warns once, binds
}

TEST_CASE("unlocked mapped weights can be evicted and read back from the file, locked ones stay", "[mapped]") {
  Env env;
  cpu::Tensor mapped = env.load("big");
  REQUIRE(mapped.storage()->mapping()->resident_bytes() == mapped.nbytes());
  if (const int e = page_out(mapped); e != 0) {
    WARN("MADV_PAGEOUT is not available here (" << std::strerror(e) << "): eviction cannot be forced, skipping");
    return;
  }
  const std::uint64_t left = mapped.storage()->mapping()->resident_bytes();
  CHECK(left < mapped.nbytes() / 2);
  CHECK(to_vector(mapped.bytes()) == env.ckpt.bytes("big"));  // faulted back in from the file

  Env locking(cpu::WeightStorage::mapped_locked);
  cpu::Tensor locked = locking.load("big");
  REQUIRE(locked.storage()->mapping()->locked());
  (void)page_out(locked);  // refused or ignored for locked pages
  CHECK(locked.storage()->mapping()->resident_bytes() == locked.nbytes());
}

TEST_CASE("a lock beyond RLIMIT_MEMLOCK is refused, naming the limit", "[mapped]") {
  Env env(cpu::WeightStorage::copied);
  io::TensorReadRequest request{"big"};
  std::optional<io::MappedTensor> mapped = env.source->map_tensor(request);
  REQUIRE(mapped);

  // The limit applies to this thread only once CAP_IPC_LOCK is out of its effective set
  // (capabilities are per thread; it stays permitted, so it comes back below).
  ThreadCaps caps;
  const ThreadCaps saved = caps;
  caps.data[0].effective &= ~(1u << CAP_IPC_LOCK);
  caps.set();
  struct rlimit old {};
  REQUIRE(::getrlimit(RLIMIT_MEMLOCK, &old) == 0);
  struct rlimit small = old;
  small.rlim_cur = 64 << 10;
  REQUIRE(::setrlimit(RLIMIT_MEMLOCK, &small) == 0);
  std::optional<Error> refused;
  try {
    mapped->lock();
  } catch (const Error& e) {
    refused = e;
  }
  ::setrlimit(RLIMIT_MEMLOCK, &old);
  ThreadCaps restore = saved;
  restore.set();

  REQUIRE(refused);
  CHECK(refused->code() == errc::out_of_memory);
  CHECK_THAT(refused->what(),
             Catch::Contains("RLIMIT_MEMLOCK is 64 KiB") && Catch::Contains("'big'") && Catch::Contains("ulimit -l"));
  CHECK_FALSE(mapped->locked());
  mapped->lock();  // within the limit again (or exempt)
  CHECK(mapped->locked());
  CHECK(mapped->resident_bytes() == mapped->bytes().size());
}

TEST_CASE("an in-place overwrite refuses a mapped slot", "[mapped]") {
  Env env;
  cpu::Parameter slot(DType::BF16, {1024, 2304});
  cpu::Backend::bind(slot, env.load("big"));
  cpu::MaterializationContext copying{env.executor, env.storage};
  io::TensorReadRequest request{"big"};
  cpu::Tensor next = finish(env.ctx, cpu::Backend::materialize(*env.source, request, copying, {}));
  try {
    (void)cpu::Backend::overwrite(env.executor, slot, next);
    FAIL("a mapped slot was overwritten");
  } catch (const BackendError& e) {
    CHECK_THAT(e.what(), Catch::Contains("mapped read-only"));
  }
  CHECK(to_vector(slot.value.bytes()) == env.ckpt.bytes("big"));
}

TEST_CASE("eredu's reads of a mapped weight whose file shrank fail with file_changed, not SIGBUS", "[mapped]") {
  Env env;
  cpu::Tensor mapped = env.load("big");
  const io::DigestCheck check{io::DigestKind::sha256, io::digest_hex(io::DigestKind::sha256, env.ckpt.bytes("big")),
                              env.ckpt.path.string(), "big",
                              env.offset_of("big"),   mapped.nbytes()};
  drive_until(env.ctx, cpu::Backend::verify_weight(env.mc, mapped, check));  // intact: passes
  std::filesystem::resize_file(env.ckpt.path, env.offset_of("big") + mapped.nbytes() / 2);

  Completion verified = cpu::Backend::verify_weight(env.mc, mapped, check);
  drive_until(env.ctx, verified);
  try {
    verified.get();
    FAIL("verifying a truncated mapping succeeded");
  } catch (const Error& e) {
    CHECK(e.code() == errc::file_changed);
    CHECK_THAT(e.what(), Catch::Contains("'big'") && Catch::Contains("shrank"));
  }
  // Faults again on the threads that faulted in the verification: each must have SIGBUS
  // unblocked again (under ThreadSanitizer, whose wrapper blocks it, the second fault killed).
  auto [host, demoted] = cpu::Backend::demote(env.executor, mapped);
  drive_until(env.ctx, demoted);
  CHECK_THROWS_MATCHES(demoted.get(), Error,
                       Catch::Predicate<Error>([](const Error& e) { return e.code() == errc::file_changed; }));
  CHECK_THROWS_MATCHES(cpu::Backend::validate_bind(cpu::Parameter(DType::BF16, {1024, 2304}), mapped), Error,
                       Catch::Predicate<Error>([](const Error& e) { return e.code() == errc::file_changed; }));
}

TEST_CASE("a file that shrinks while its weight is mapped fails the load with file_changed at the first lost page",
          "[mapped]") {
  // Shrinks the checkpoint the moment the mapping is made, so faulting its pages in fails.
  ShrinkOnMap shrinker;
  shrinker.survive = 8192;  // two pages or so of the tensor survive
  CpuCheckpoint ckpt{specs()};
  shrinker.path = ckpt.path;
  io::SourceOptions options;
  options.reader.faults = &shrinker;
  asio::io_context ctx;
  auto source = io::CheckpointSource::open(ctx.get_executor(), ckpt.path, options);
  cpu::Executor executor{2};
  cpu::StoragePool storage;
  cpu::MaterializationContext mc{executor, storage, false, cpu::WeightStorage::mapped};
  const io::TensorInfo& big = source->catalog().at("big");
  io::TensorReadRequest request{"big"};
  try {
    (void)finish(ctx, cpu::Backend::materialize(*source, request, mc, {}));
    FAIL("a weight mapped from a shrunk file loaded");
  } catch (const Error& e) {
    CHECK(e.code() == errc::file_changed);
    CHECK(e.context().file == ckpt.path.string());
    CHECK(e.context().tensor == "big");
    REQUIRE(e.context().offset);
    CHECK(*e.context().offset >= shrinker.keep);
    CHECK(*e.context().offset < big.offset + big.nbytes);
  }
}
