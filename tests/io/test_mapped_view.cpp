// Mapped reads of resident tensors: a MappedView holds exactly the tensor's bytes, and a
// file that shrinks under it becomes a typed error through guarded_read, never a SIGBUS
// that kills the process.
#include "eredu/io/mapping/mapped_view.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "eredu/io/mapping/guarded_read.hpp"
#include "eredu/io/reading/checkpoint_source.hpp"
#include "eredu/io/reading/read_fault.hpp"
#include "io/read_fixture.hpp"

using namespace eredu;
using namespace eredu::io;

namespace {

struct MappedCheckpoint {
  test::TempDir dir;
  std::filesystem::path path = dir / "model.safetensors";
  std::vector<synth::TensorSpec> specs{{"head", DType::U8, {100}}, {"w", DType::BF16, {256, 1024}}};
  std::vector<std::vector<std::byte>> data = test::random_tensor_bytes(specs, 3);
  MappedCheckpoint() { synth::write_safetensors(path, specs, test::spans_of(data)); }
};

/// Sums the bytes of `bytes`, reading every one (the access a conversion makes).
std::uint64_t sum(std::span<const std::byte> bytes) {
  std::uint64_t s = 0;
  for (std::byte b : bytes) s += std::to_integer<unsigned>(b);
  return s;
}

}  // namespace

TEST_CASE("mapped view – a resident tensor maps to exactly its bytes", "[mapped]") {
  MappedCheckpoint ckpt;
  asio::io_context ctx;
  auto source = CheckpointSource::open(ctx.get_executor(), ckpt.path);
  TensorReadRequest w{"w"};
  std::optional<MappedView> view = source->map_resident(w);  // just written: in the page cache
  REQUIRE(view);
  REQUIRE(view->bytes().size() == ckpt.data[1].size());
  CHECK(std::memcmp(view->bytes().data(), ckpt.data[1].data(), ckpt.data[1].size()) == 0);
  CHECK(view->looks_resident(17));
  // The whole-page region holds the bytes; releasing pages keeps them readable.
  CHECK(view->region().data() <= view->bytes().data());
  CHECK(view->region().data() + view->region().size() == view->bytes().data() + view->bytes().size());
  view->release_pages(view->bytes());
  CHECK(sum(view->bytes()) == sum(ckpt.data[1]));

  // A column selection is not one contiguous run: not mappable; bad requests still throw.
  TensorReadRequest columns{"w", Selection::columns({256, 1024}, 0, 10)};
  CHECK_FALSE(source->map_resident(columns));
  TensorReadRequest missing{"nope"};
  CHECK_THROWS_AS(source->map_resident(missing), Error);

  // Off by option.
  SourceOptions off;
  off.map_resident = false;
  auto unmapped = CheckpointSource::open(ctx.get_executor(), ckpt.path, off);
  CHECK_FALSE(unmapped->map_resident(w));
}

TEST_CASE("mapped view – made private, the same addresses are writable and a write never reaches the file",
          "[mapped]") {
  MappedCheckpoint ckpt;
  asio::io_context ctx;
  auto source = CheckpointSource::open(ctx.get_executor(), ckpt.path);
  TensorReadRequest w{"w"};
  std::optional<MappedView> view = source->map_resident(w);
  REQUIRE(view);
  const std::byte* before = view->bytes().data();
  CHECK_FALSE(view->copy_on_write());
  view->make_private();
  REQUIRE(view->copy_on_write());
  CHECK(view->bytes().data() == before);  // remapped in place: addresses handed out stay valid
  CHECK(std::memcmp(view->bytes().data(), ckpt.data[1].data(), ckpt.data[1].size()) == 0);

  auto* out = const_cast<std::byte*>(view->bytes().data());
  std::memset(out, 0x5a, 4096 + 3);  // a page and a bit: two pages copied
  CHECK(std::to_integer<int>(view->bytes()[4096 + 2]) == 0x5a);
  view->make_private();  // idempotent: the written pages stay written
  CHECK(std::to_integer<int>(view->bytes()[0]) == 0x5a);

  // The file, and a fresh mapping of it, still hold the original bytes.
  std::optional<MappedView> again = source->map_resident(w);
  REQUIRE(again);
  CHECK(std::memcmp(again->bytes().data(), ckpt.data[1].data(), ckpt.data[1].size()) == 0);
  std::vector<std::byte> on_disk(ckpt.data[1].size());
  std::ifstream file(ckpt.path, std::ios::binary);
  file.seekg(static_cast<std::streamoff>(source->catalog().at("w").offset));
  file.read(reinterpret_cast<char*>(on_disk.data()), static_cast<std::streamsize>(on_disk.size()));
  CHECK(on_disk == ckpt.data[1]);

  MappedView moved = std::move(*view);
  CHECK(moved.copy_on_write());
  CHECK_FALSE(view->copy_on_write());
}

TEST_CASE("mapped view – a fault injector turns mapping off unless it allows it", "[mapped]") {
  MappedCheckpoint ckpt;
  struct Injector : FaultInjector {
    bool allow = false;
    int mapped = 0;
    ReadFault on_complete(std::uint32_t, std::uint64_t, std::uint64_t) override { return {}; }
    bool allow_mapping() const override { return allow; }
    void on_map(std::uint32_t, std::uint64_t, std::uint64_t) override { ++mapped; }
  } injector;
  SourceOptions o;
  o.reader.faults = &injector;
  asio::io_context ctx;
  auto source = CheckpointSource::open(ctx.get_executor(), ckpt.path, o);
  TensorReadRequest w{"w"};
  CHECK_FALSE(source->map_resident(w));
  injector.allow = true;
  CHECK(source->map_resident(w));
  CHECK(injector.mapped == 1);
}

TEST_CASE("guarded read – a file that shrinks under its mapping gives a typed error naming file, tensor, offset",
          "[mapped]") {
  MappedCheckpoint ckpt;
  asio::io_context ctx;
  auto source = CheckpointSource::open(ctx.get_executor(), ckpt.path);
  const TensorInfo& info = source->catalog().at("w");
  TensorReadRequest w{"w"};
  std::optional<MappedView> view = source->map_resident(w);
  REQUIRE(view);

  std::uint64_t total = 0;
  auto read_all = [&] { total = sum(view->bytes()); };
  CHECK_FALSE(guarded_read(view->region(), read_all));  // intact: runs to the end
  CHECK(total == sum(ckpt.data[1]));

  // Cut the file 3 pages into the tensor: pages past the new end fault.
  const std::uint64_t cut = (info.offset + 3 * 4096 + 4095) / 4096 * 4096;
  std::filesystem::resize_file(ckpt.path, cut);
  std::optional<MappingFault> fault = guarded_read(view->region(), read_all);
  REQUIRE(fault);
  const Error e = view->fault_error(*fault);
  CHECK(e.kind() == errc::file_changed);
  REQUIRE(e.context().offset);
  CHECK(*e.context().offset == cut);  // the first byte of the first page past the end
  const std::string what = e.what();
  CHECK_THAT(what,
             Catch::Contains(ckpt.path.string()) && Catch::Contains("'w'") && Catch::Contains(std::to_string(cut)));

  // The guard is gone once guarded_read returns; a second guarded read faults the same way,
  // and an exception from the access passes through.
  CHECK(guarded_read(view->region(), read_all));
  auto throws = [] { throw std::runtime_error("from the access"); };
  CHECK_THROWS_WITH(guarded_read(view->region(), throws), "from the access");
}

TEST_CASE("guarded read – a fault outside any guard still kills the process", "[mapped]") {
  MappedCheckpoint ckpt;
  asio::io_context ctx;
  auto source = CheckpointSource::open(ctx.get_executor(), ckpt.path);
  TensorReadRequest w{"w"};
  std::optional<MappedView> view = source->map_resident(w);
  REQUIRE(view);
  auto touch = [&] { (void)sum(view->bytes().first(16)); };
  CHECK_FALSE(guarded_read(view->region(), touch));  // installs the handler
  std::filesystem::resize_file(ckpt.path, source->catalog().at("w").offset);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // Unguarded read of a page past the end: must not be swallowed by eredu's handler.
    volatile std::uint64_t s = sum(view->bytes().subspan(8192));
    (void)s;
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  // Killed by SIGBUS, or (under a sanitizer that reports deadly signals) exited non-zero.
  CHECK_FALSE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  if (WIFSIGNALED(status)) CHECK(WTERMSIG(status) == SIGBUS);
}
