// io::Checksums: digests from metadata and sidecars, their validation, and verification
// through a source catching a tensor whose bytes changed.
#include "eredu/io/integrity/checksums.hpp"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>
#include <asio/thread_pool.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <future>
#include <stdexcept>
#include <string_view>
#include <system_error>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/io/formats/open_catalog.hpp"
#include "eredu/io/integrity/digest.hpp"
#include "eredu/io/integrity/sha256.hpp"
#include "eredu/synth/safetensors_writer.hpp"
#include "io/read_fixture.hpp"
#include "support/error_kind.hpp"

using namespace eredu;
using namespace eredu::io;

namespace {

struct ChecksumsFixture {
  test::TempDir dir;
  std::filesystem::path path = dir / "model.safetensors";
  std::vector<synth::TensorSpec> specs{{"a", DType::F32, {300, 17}}, {"b", DType::BF16, {9}}};
  std::vector<std::vector<std::byte>> data = test::random_tensor_bytes(specs, 3);

  explicit ChecksumsFixture(const Metadata& metadata = {}) {
    synth::write_safetensors(path, specs, test::spans_of(data), metadata);
  }
  std::string digest(std::size_t i) const { return sha256_hex(data[i]); }
};

}  // namespace

using eredu::test::kind_of;

TEST_CASE("checksums – metadata keys and sidecars are read and validated", "[io][checksums]") {
  ChecksumsFixture f;
  Metadata metadata{{"sha256:a", f.digest(0)}, {"format", "pt"}};
  ChecksumsFixture with_metadata(metadata);
  Catalog catalog = open_catalog(with_metadata.path);
  Checksums from_meta = Checksums::from_metadata(catalog);
  REQUIRE(from_meta.size() == 1);
  CHECK(*from_meta.find("a") == f.digest(0));

  CHECK(Checksums::sidecar_path(f.path) == f.dir / "model.safetensors.sha256.json");
  CHECK(Checksums::sidecar_path(f.dir.path()) == f.dir / "checksums.sha256.json");

  Checksums sums;
  sums.add("a", f.digest(0));
  sums.add("b", f.digest(1));
  synth::write_text_file(Checksums::sidecar_path(f.path), sums.to_json());
  Checksums read_back = Checksums::from_sidecar(Checksums::sidecar_path(f.path));
  CHECK(read_back.digests() == sums.digests());

  auto sidecar = f.dir / "bad.json";
  synth::write_text_file(sidecar, R"({"a": "abc"})");
  CHECK(kind_of([&] { Checksums::from_sidecar(sidecar); }) == errc::invalid_metadata);
  synth::write_text_file(sidecar, R"(["a"])");
  CHECK(kind_of([&] { Checksums::from_sidecar(sidecar); }) == errc::invalid_metadata);
  synth::write_text_file(sidecar, R"({"a": )");
  CHECK(kind_of([&] { Checksums::from_sidecar(sidecar); }) == errc::invalid_metadata);
  CHECK(kind_of([&] { Checksums::from_sidecar(f.dir / "absent.json"); }) == errc::io_error);
  CHECK(kind_of([&] { sums.add("c", "not hex"); }) == errc::invalid_argument);
  Metadata bad_meta{{"sha256:a", "123"}};
  ChecksumsFixture bad(bad_meta);
  CHECK(kind_of([&] { Checksums::from_metadata(open_catalog(bad.path)); }) == errc::invalid_metadata);

  // Metadata and sidecar must agree where both speak.
  Metadata other{{"sha256:b", f.digest(0)}};  // a wrong digest for b
  ChecksumsFixture disagree(other);
  synth::write_text_file(Checksums::sidecar_path(disagree.path), sums.to_json());
  CHECK(kind_of([&] { Checksums::discover(disagree.path, open_catalog(disagree.path)); }) == errc::invalid_metadata);
}

TEST_CASE("checksums – verification reads through the source and names a changed tensor", "[io][checksums]") {
  ChecksumsFixture f;
  asio::io_context ctx;
  SourceOptions options;
  // Both ways of reading: hashing a mapping of the page cache, and chunk leases.
  options.map_resident = GENERATE(true, false);
  options.pool.budget = 64 << 10;
  options.chunk_bytes = 8 << 10;  // "a" spans several chunks
  auto source = CheckpointSource::open(ctx.get_executor(), f.path, options);
  Checksums good;
  good.add("a", f.digest(0));
  good.add("b", f.digest(1));
  auto verify = [&](Checksums sums) {
    return test::run_on(ctx, [](CheckpointSource& s, Checksums c) -> asio::awaitable<std::uint64_t> {
      co_return co_await async_verify_checksums(s, std::move(c), asio::use_awaitable);
    }(*source, std::move(sums)));
  };
  CHECK(verify(good) == f.data[0].size() + f.data[1].size());

  Checksums wrong;
  wrong.add("a", f.digest(1));
  try {
    verify(wrong);
    FAIL("a wrong digest passed");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::checksum_mismatch);
    CHECK(e.context().tensor == "a");
    CHECK(e.context().file == f.path.string());
  }
  Checksums unknown;
  unknown.add("zzz", f.digest(0));
  CHECK(kind_of([&] { verify(unknown); }) == errc::tensor_not_found);
  CHECK(source->pool().in_use() == 0);
}

TEST_CASE(
    "checksums – a sidecar that cannot be read says why with its errno; one that cannot be examined is not "
    "ignored",
    "[io][checksums]") {
  ChecksumsFixture f;
  auto error_of = [](auto&& fn) -> Error {
    try {
      fn();
    } catch (const Error& e) {
      return e;
    }
    FAIL("no eredu::Error");
    throw std::logic_error("unreachable");
  };
  auto check_errno = [](const Error& e, int err) {
    CHECK(e.kind() == errc::io_error);
    CHECK(e.context().os_error == std::error_code(err, std::system_category()));
    CHECK_THAT(e.what(), Catch::Contains(std::error_code(err, std::system_category()).message()));
  };
  // Missing: ENOENT, named.
  check_errno(error_of([&] { Checksums::from_sidecar(f.dir / "absent.json"); }), ENOENT);
  // A symbolic link to itself: ELOOP, at the open. discover() must not take it for no sidecar.
  const std::filesystem::path sidecar = Checksums::sidecar_path(f.path);
  std::filesystem::create_symlink(sidecar.filename(), sidecar);
  check_errno(error_of([&] { Checksums::from_sidecar(sidecar); }), ELOOP);
  check_errno(error_of([&] { Checksums::discover(f.path, open_catalog(f.path)); }), ELOOP);
  std::filesystem::remove(sidecar);
  // A FIFO at the path: refused at once, never waited on.
  REQUIRE(::mkfifo(sidecar.c_str(), 0600) == 0);
  const Error fifo = error_of([&] { Checksums::from_sidecar(sidecar); });
  CHECK(fifo.kind() == errc::io_error);
  CHECK_THAT(fifo.what(), Catch::Contains("FIFO"));
  std::filesystem::remove(sidecar);

  // Unreadable (EACCES): the case the message lacked its errno for. Root reads any file, so
  // as root the check runs in a child that has given its privileges up.
  Checksums sums;
  sums.add("a", f.digest(0));
  synth::write_text_file(sidecar, sums.to_json());
  REQUIRE(::chmod(sidecar.c_str(), 0) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(3);
    try {
      Checksums::from_sidecar(sidecar);
    } catch (const Error& e) {
      const bool has_errno = e.kind() == errc::io_error && e.context().os_error == std::errc::permission_denied &&
                             std::string_view(e.what()).find("Permission denied") != std::string_view::npos;
      ::_exit(has_errno ? 0 : 1);
    }
    ::_exit(2);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 3)
    WARN("cannot give up root here (setuid failed): the unreadable-sidecar case is not exercised");
  else
    CHECK(WEXITSTATUS(status) == 0);  // 1: an io_error without EACCES's errno text; 2: read anyway
}

TEST_CASE(
    "checksums – a file rewritten in place since it was opened fails verification with file_changed, not as a "
    "mismatch",
    "[io][checksums]") {
  ChecksumsFixture f;
  asio::io_context ctx;
  SourceOptions options;
  // Both ways of reading: hashing a mapping of the page cache, and chunk leases.
  options.map_resident = GENERATE(true, false);
  options.pool.budget = 64 << 10;
  options.chunk_bytes = 8 << 10;
  auto source = CheckpointSource::open(ctx.get_executor(), f.path, options);
  const TensorInfo& a = source->catalog().at("a");
  // cp -p's rewrite: same size, other bytes, the old modification time put back.
  const std::vector<std::byte> other(a.nbytes, std::byte{0x33});
  test::rewrite_in_place(f.path, a.offset, other);
  Checksums good;
  good.add("a", f.digest(0));
  try {
    test::run_on(ctx, [](CheckpointSource& s, Checksums c) -> asio::awaitable<std::uint64_t> {
      co_return co_await async_verify_checksums(s, std::move(c), asio::use_awaitable);
    }(*source, std::move(good)));
    FAIL("a rewritten file verified");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::file_changed);
    CHECK(e.context().file == f.path.string());
    CHECK(e.context().tensor == "a");
  }
  CHECK(source->pool().in_use() == 0);
}

TEST_CASE("checksums – a tensor larger than the whole staging pool is verified chunk by chunk", "[io][checksums]") {
  ChecksumsFixture f;
  asio::io_context ctx;
  SourceOptions options;
  options.pool.budget = 8 << 10;  // "a" is 20 400 bytes: more than the pool
  options.chunk_bytes = 8 << 10;  // a chunk may take the whole pool
  options.map_resident = false;   // chunk leases, not a mapping
  auto source = CheckpointSource::open(ctx.get_executor(), f.path, options);
  Checksums sums;
  sums.add("a", f.digest(0));
  auto op = [](CheckpointSource& s, Checksums c) -> asio::awaitable<std::uint64_t> {
    co_return co_await async_verify_checksums(s, std::move(c), asio::use_awaitable);
  };
  auto done = asio::co_spawn(ctx, op(*source, sums), asio::use_future);
  // Bounded: a verification that waits for staging it holds itself would never finish.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (done.wait_for(std::chrono::seconds(0)) != std::future_status::ready &&
         std::chrono::steady_clock::now() < deadline) {
    ctx.restart();
    ctx.run_one_for(std::chrono::milliseconds(5));
  }
  REQUIRE(done.wait_for(std::chrono::seconds(0)) == std::future_status::ready);
  CHECK(done.get() == f.data[0].size());
  CHECK(source->pool().in_use() == 0);
}

TEST_CASE("checksums – a read error while a chunk is being hashed is reported, nothing leaks", "[io][checksums]") {
  ChecksumsFixture f;
  struct FailSecondChunk final : FaultInjector {
    std::uint64_t at = 0;
    ReadFault on_complete(std::uint32_t, std::uint64_t offset, std::uint64_t length) override {
      return offset <= at && at < offset + length ? ReadFault{.error = EIO} : ReadFault{};
    }
  } faults;
  asio::io_context ctx;
  SourceOptions options;
  options.pool.budget = 64 << 10;
  options.chunk_bytes = 8 << 10;
  options.reader.faults = &faults;
  auto source = CheckpointSource::open(ctx.get_executor(), f.path, options);
  faults.at = source->catalog().at("a").offset + 12000;  // inside the second chunk
  Checksums sums;
  sums.add("a", f.digest(0));
  asio::thread_pool hashers(1);
  auto op = [](CheckpointSource& s, Checksums c, asio::any_io_executor h) -> asio::awaitable<std::uint64_t> {
    co_return co_await async_verify_checksums(s, std::move(c), h, asio::use_awaitable);
  };
  CHECK(kind_of([&] { test::run_on(ctx, op(*source, sums, hashers.get_executor())); }) == errc::io_error);
  CHECK(source->pool().in_use() == 0);
}

TEST_CASE("digests – SHA-256 and XXH3-128, whole and piecewise, match their references", "[io][checksums]") {
  // XXH3-128 of nothing, in the canonical (big-endian) form xxhsum -H2 prints.
  CHECK(digest_hex(DigestKind::xxh3_128, {}) == "99aa06d3014798d86001c324468d497f");
  CHECK(digest_hex(DigestKind::sha256, {}) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  std::vector<std::byte> data(1000003);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>((i * 2654435761u) >> 13);
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits(data.data(), data.size()));
  std::string reference;
  for (unsigned char b : canonical.digest) reference += fmt::format("{:02x}", b);
  for (DigestKind kind : {DigestKind::sha256, DigestKind::xxh3_128}) {
    const std::string whole = digest_hex(kind, data);
    CHECK(whole.size() == digest_hex_digits(kind));
    CHECK(is_digest_hex(kind, whole));
    if (kind == DigestKind::xxh3_128) CHECK(whole == reference);
    if (kind == DigestKind::sha256) CHECK(whole == sha256_hex(data));
    Hasher h(kind);
    for (std::size_t at = 0; at < data.size(); at += 4099)
      h.update(std::span(data).subspan(at, std::min<std::size_t>(4099, data.size() - at)));
    CHECK(h.hex_digest() == whole);
    CHECK(digest_kind_named(digest_name(kind)) == kind);
  }
  CHECK_FALSE(digest_kind_named("md5"));
  CHECK_FALSE(is_digest_hex(DigestKind::xxh3_128, std::string(64, 'a')));
}

TEST_CASE("checksums – XXH3-128 digests in metadata and sidecar objects, the preferred one is checked",
          "[io][checksums]") {
  ChecksumsFixture plain;
  const std::string xa = digest_hex(DigestKind::xxh3_128, plain.data[0]);
  Metadata metadata{{"xxh3-128:a", xa}, {"sha256:b", plain.digest(1)}};
  ChecksumsFixture f(metadata);
  const Catalog catalog = open_catalog(f.path);
  const Checksums meta = Checksums::from_metadata(catalog);
  CHECK(*meta.find("a", DigestKind::xxh3_128) == xa);
  CHECK(meta.find("a") == nullptr);
  // "a" has only XXH3: checked with it even though SHA-256 is preferred.
  const std::optional<DigestCheck> a = meta.check(catalog, "a");
  REQUIRE(a);
  CHECK(a->kind == DigestKind::xxh3_128);
  CHECK(a->offset == catalog.at("a").offset);
  CHECK_NOTHROW(a->verify(f.data[0]));
  CHECK_THROWS_AS(a->verify(f.data[1]), Error);
  CHECK(kind_of([&] { a->verify(f.data[1]); }) == errc::checksum_mismatch);
  CHECK(kind_of([&] { meta.check(catalog, "zzz"); }) == errc::tensor_not_found);

  // Both kinds in one sidecar: written as objects, read back equal; merged with metadata.
  Checksums both;
  both.add("a", f.digest(0));
  both.add("a", DigestKind::xxh3_128, xa);
  both.add("b", DigestKind::xxh3_128, digest_hex(DigestKind::xxh3_128, f.data[1]));
  const std::string text = both.to_json();
  CHECK_THAT(text, Catch::Contains("\"xxh3-128\""));
  synth::write_text_file(Checksums::sidecar_path(f.path), text);
  const Checksums read_back = Checksums::from_sidecar(Checksums::sidecar_path(f.path));
  CHECK(read_back.digests() == both.digests());
  const Checksums found = Checksums::discover(f.path, catalog);
  CHECK(*found.find("b") == f.digest(1));  // from the metadata
  CHECK(found.check(catalog, "a", DigestKind::xxh3_128)->kind == DigestKind::xxh3_128);
  CHECK(found.check(catalog, "a", DigestKind::sha256)->kind == DigestKind::sha256);

  // Malformed objects are refused with the offending tensor named.
  auto sidecar = f.dir / "bad.json";
  for (const char* bad : {R"({"a": {"md5": "00"}})", R"({"a": {"xxh3-128": "abc"}})", R"({"a": {}})", R"({"a": 3})",
                          R"({"a": {"sha256": 3}})"}) {
    synth::write_text_file(sidecar, bad);
    CHECK(kind_of([&] { Checksums::from_sidecar(sidecar); }) == errc::invalid_metadata);
  }
  CHECK(kind_of([&] { both.add("a", DigestKind::xxh3_128, f.digest(0)); }) == errc::invalid_argument);
  // A plain SHA-256 set keeps the flat form older readers know.
  Checksums sha_only;
  sha_only.add("a", f.digest(0));
  CHECK_THAT(sha_only.to_json(), !Catch::Contains("{\"sha256\""));
}

TEST_CASE("digests – XXH3-128 over 64 KiB blocks: the hasher, the block list and an update of some blocks agree",
          "[io][checksums]") {
  constexpr std::size_t B = BlockDigests::block_bytes;
  // The reference, from libxxhash alone: XXH3-128 of the blocks' canonical XXH3-128s.
  const auto reference = [](std::span<const std::byte> data) {
    std::vector<unsigned char> digests;
    for (std::size_t at = 0; at < data.size(); at += BlockDigests::block_bytes) {
      XXH128_canonical_t c;
      XXH128_canonicalFromHash(&c,
                               XXH3_128bits(data.data() + at, std::min(BlockDigests::block_bytes, data.size() - at)));
      digests.insert(digests.end(), std::begin(c.digest), std::end(c.digest));
    }
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(digests.data(), digests.size()));
    std::string hex;
    for (unsigned char b : c.digest) hex += fmt::format("{:02x}", b);
    return hex;
  };
  std::vector<std::byte> data(3 * B + 5);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>((i * 2654435761u) >> 11);
  for (std::size_t size : {std::size_t{0}, std::size_t{1}, B - 1, B, B + 1, 3 * B + 5}) {
    CAPTURE(size);
    const std::span<const std::byte> bytes = std::span<const std::byte>(data).first(size);
    const BlockDigests blocks = BlockDigests::of(bytes);
    CHECK(blocks.size() == (size + B - 1) / B);
    CHECK(blocks.bytes() == size);
    CHECK(blocks.hex_digest() == reference(bytes));
    CHECK(digest_hex(DigestKind::xxh3_128_blocks, bytes) == reference(bytes));
    // Fed in pieces that straddle the blocks' edges: the same digest and the same blocks.
    Hasher h(DigestKind::xxh3_128_blocks);
    for (std::size_t at = 0; at < size; at += 40961)
      h.update(bytes.subspan(at, std::min<std::size_t>(40961, size - at)));
    CHECK(h.hex_digest() == reference(bytes));
    CHECK(h.take_blocks() == blocks);
  }
  CHECK(digest_hex(DigestKind::xxh3_128_blocks, data) != digest_hex(DigestKind::xxh3_128, data));
  CHECK(digest_kind_named("xxh3-128-blocks") == DigestKind::xxh3_128_blocks);
  CHECK(is_digest_hex(DigestKind::xxh3_128_blocks, digest_hex(DigestKind::xxh3_128_blocks, data)));
  Hasher plain(DigestKind::xxh3_128);
  plain.update(data);
  (void)plain.hex_digest();
  CHECK(plain.take_blocks().size() == 0);  // only the block kind keeps them

  // Changing blocks 1 and 3 (the short last one): set() of their new bytes gives the digest
  // of the changed string, and only their digests differ.
  BlockDigests blocks = BlockDigests::of(data);
  std::vector<std::byte> changed = data;
  changed[B + 17] ^= std::byte{0x40};
  changed[3 * B + 4] ^= std::byte{0x01};
  CHECK(blocks.hex_digest() != reference(changed));
  blocks.set(1, std::span<const std::byte>(changed).subspan(B, B));
  CHECK(blocks.hex_digest() != reference(changed));  // block 3 still the old one
  blocks.set(3, std::span<const std::byte>(changed).subspan(3 * B, 5));
  CHECK(blocks.hex_digest() == reference(changed));
  CHECK(blocks == BlockDigests::of(changed));
  // Bytes that are not the block are refused, and nothing follows a short block.
  CHECK(kind_of([&] { blocks.set(3, std::span<const std::byte>(changed).subspan(0, B)); }) == errc::invalid_argument);
  CHECK(kind_of([&] { blocks.set(4, std::span<const std::byte>(changed).subspan(0, 5)); }) == errc::invalid_argument);
  CHECK(kind_of([&] { blocks.append(BlockDigests::digest_of(changed), B); }) == errc::invalid_argument);
  BlockDigests empty;
  CHECK(kind_of([&] { empty.append(BlockDigests::digest_of(changed), B + 1); }) == errc::invalid_argument);
  CHECK(kind_of([&] { empty.append(BlockDigests::digest_of(changed), 0); }) == errc::invalid_argument);
}

TEST_CASE("checksums – block digests in a sidecar: read, written, and checked where preferred or alone",
          "[io][checksums]") {
  ChecksumsFixture f;
  const Catalog catalog = open_catalog(f.path);
  const std::string ba = digest_hex(DigestKind::xxh3_128_blocks, f.data[0]);
  Checksums sums;
  sums.add("a", f.digest(0));
  sums.add("a", DigestKind::xxh3_128_blocks, ba);
  sums.add("b", DigestKind::xxh3_128_blocks, digest_hex(DigestKind::xxh3_128_blocks, f.data[1]));
  const std::string text = sums.to_json();
  CHECK_THAT(text, Catch::Contains("\"xxh3-128-blocks\""));
  synth::write_text_file(Checksums::sidecar_path(f.path), text);
  const Checksums read_back = Checksums::from_sidecar(Checksums::sidecar_path(f.path));
  CHECK(read_back.digests() == sums.digests());
  CHECK(read_back.check(catalog, "a")->kind == DigestKind::sha256);
  CHECK(read_back.check(catalog, "a", DigestKind::xxh3_128_blocks)->kind == DigestKind::xxh3_128_blocks);
  const std::optional<DigestCheck> b = read_back.check(catalog, "b");  // its only digest
  REQUIRE(b);
  CHECK(b->kind == DigestKind::xxh3_128_blocks);
  CHECK_NOTHROW(b->verify(f.data[1]));
  CHECK(kind_of([&] { b->verify(f.data[0]); }) == errc::checksum_mismatch);
  // Only block digests: still objects, never the flat SHA-256 form.
  Checksums blocks_only;
  blocks_only.add("a", DigestKind::xxh3_128_blocks, ba);
  CHECK_THAT(blocks_only.to_json(), Catch::Contains("{\"xxh3-128-blocks\""));
}

TEST_CASE("checksums – many tensors verified in parallel lanes, a bad one is named, the rest stop", "[io][checksums]") {
  test::TempDir dir;
  const auto path = dir / "many.safetensors";
  std::vector<synth::TensorSpec> specs;
  for (std::uint64_t i = 0; i < 24; ++i) specs.push_back({fmt::format("t{:02}", i), DType::BF16, {64, 33 + i}});
  const auto data = test::random_tensor_bytes(specs, 7);
  synth::write_safetensors(path, specs, test::spans_of(data));
  asio::io_context ctx;
  SourceOptions options;
  options.map_resident = GENERATE(true, false);
  auto source = CheckpointSource::open(ctx.get_executor(), path, options);
  const DigestKind kind = GENERATE(DigestKind::sha256, DigestKind::xxh3_128);
  Checksums sums;
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    sums.add(specs[i].name, kind, digest_hex(kind, data[i]));
    total += data[i].size();
  }
  asio::thread_pool hashers(3);
  auto op = [](CheckpointSource& s, Checksums c, asio::any_io_executor h) -> asio::awaitable<std::uint64_t> {
    co_return co_await async_verify_checksums(s, std::move(c), h, VerifyChecksumsOptions{.concurrency = 4},
                                              asio::use_awaitable);
  };
  CHECK(test::run_on(ctx, op(*source, sums, hashers.get_executor())) == total);
  Checksums bad = sums;
  bad.add("t13", kind, digest_hex(kind, data[12]));
  try {
    test::run_on(ctx, op(*source, bad, hashers.get_executor()));
    FAIL("a wrong digest passed");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::checksum_mismatch);
    CHECK(e.context().tensor == "t13");
    CHECK_THAT(e.what(), Catch::Contains(std::string(digest_name(kind))));
  }
  CHECK(source->pool().in_use() == 0);
}

TEST_CASE("checksums – shard digests: recorded, kept by the sidecar, checked by re-reading, a change named",
          "[io][checksums]") {
  ChecksumsFixture f;  // "a" is F32 [300, 17]
  const Catalog catalog = open_catalog(f.path);
  const Selection rows = Selection::rows({300, 17}, 100, 200);    // one contiguous run
  const Selection columns = Selection::columns({300, 17}, 5, 9);  // a run per row
  auto piece = [&](const Selection& selection) {
    std::vector<std::byte> out;
    for (const ByteRun& run : selection_runs({300, 17}, DType::F32, selection))
      out.insert(out.end(), f.data[0].begin() + static_cast<std::ptrdiff_t>(run.source_offset),
                 f.data[0].begin() + static_cast<std::ptrdiff_t>(run.source_offset + run.length));
    return out;
  };
  Checksums sums;
  sums.add_shard("a", rows, DigestKind::sha256, sha256_hex(piece(rows)));
  sums.add_shard("a", columns, DigestKind::xxh3_128, digest_hex(DigestKind::xxh3_128, piece(columns)));
  CHECK(sums.shard_count() == 2);
  CHECK(sums.size() == 0);
  CHECK_FALSE(sums.empty());
  CHECK(kind_of([&] { sums.add_shard("a", Selection::all(), DigestKind::sha256, f.digest(0)); }) ==
        errc::invalid_argument);
  CHECK(kind_of([&] { sums.add_shard("a", rows, DigestKind::sha256, "abc"); }) == errc::invalid_argument);

  // The check names the shard's first byte and its size; whole-tensor checks are unchanged.
  const std::optional<DigestCheck> check = sums.check(catalog, "a", rows);
  REQUIRE(check);
  CHECK(check->selection == rows);
  CHECK(check->offset == catalog.find("a")->offset + 100 * 17 * 4);
  CHECK(check->bytes == 100 * 17 * 4);
  CHECK_FALSE(sums.check(catalog, "a", Selection::rows({300, 17}, 0, 100)));  // no digest for that shard
  CHECK_FALSE(sums.check(catalog, "a"));
  CHECK(kind_of([&] { sums.check(catalog, "a", Selection::rows({300, 17}, 0, 301)); }) == errc::invalid_argument);
  CHECK(kind_of([&] { sums.check(catalog, "zzz", rows); }) == errc::tensor_not_found);

  // The sidecar round trip, alongside a whole-tensor digest; the text of a selection may
  // differ in spaces.
  sums.add("b", f.digest(1));
  synth::write_text_file(Checksums::sidecar_path(f.path), sums.to_json());
  const Checksums found = Checksums::discover(f.path, catalog);
  CHECK(found.shards() == sums.shards());
  CHECK(found.digests() == sums.digests());
  auto sidecar = f.dir / "shards.json";
  synth::write_text_file(
      sidecar, fmt::format(R"({{"__shards__": {{"a": {{"[100:200,0:17]": "{}"}}}}}})", sha256_hex(piece(rows))));
  CHECK(Checksums::from_sidecar(sidecar).check(catalog, "a", rows)->expected == sha256_hex(piece(rows)));
  for (const char* bad :
       {R"({"__shards__": []})", R"({"__shards__": {"a": "00"}})", R"({"__shards__": {"a": {"[all]": "00"}}})",
        R"({"__shards__": {"a": {"rows": "00"}}})", R"({"__shards__": {"a": {"[0:1, 0:17]": "abc"}}})"}) {
    CAPTURE(bad);
    synth::write_text_file(sidecar, bad);
    CHECK(kind_of([&] { Checksums::from_sidecar(sidecar); }) == errc::invalid_metadata);
  }
  synth::write_text_file(
      sidecar, fmt::format(R"({{"__shards__": {{"a": {{"[0:1, 0:17]": "{0}", "[0:1,0:17]": "{0}"}}}}}})", f.digest(0)));
  CHECK(kind_of([&] { Checksums::from_sidecar(sidecar); }) == errc::invalid_metadata);  // one shard, twice

  // Re-reading checks exactly the shards' bytes, through a mapping or chunk leases.
  asio::io_context ctx;
  SourceOptions options;
  options.map_resident = GENERATE(true, false);
  options.chunk_bytes = 4 << 10;
  auto source = CheckpointSource::open(ctx.get_executor(), f.path, options);
  auto verify = [&](Checksums sums_to_check) {
    return test::run_on(ctx, [](CheckpointSource& s, Checksums c) -> asio::awaitable<std::uint64_t> {
      co_return co_await async_verify_checksums(s, std::move(c), asio::use_awaitable);
    }(*source, std::move(sums_to_check)));
  };
  Checksums shards_only;
  shards_only.add_shard("a", rows, DigestKind::sha256, sha256_hex(piece(rows)));
  shards_only.add_shard("a", columns, DigestKind::xxh3_128, digest_hex(DigestKind::xxh3_128, piece(columns)));
  CHECK(verify(shards_only) == piece(rows).size() + piece(columns).size());
  // A tensor with a whole digest is checked whole: its shards add nothing to read.
  Checksums both = shards_only;
  both.add("a", f.digest(0));
  CHECK(verify(both) == f.data[0].size());

  std::vector<std::byte> changed = piece(columns);
  changed[3] ^= std::byte{1};
  Checksums wrong;
  wrong.add_shard("a", columns, DigestKind::sha256, sha256_hex(changed));
  try {
    verify(wrong);
    FAIL("a wrong shard digest passed");
  } catch (const Error& e) {
    CHECK(e.kind() == errc::checksum_mismatch);
    CHECK(e.context().tensor == "a");
    CHECK(e.context().offset == catalog.find("a")->offset + 5 * 4);
    CHECK_THAT(std::string(e.what()), Catch::Contains("shard [0:300, 5:9]"));
  }
  CHECK(source->pool().in_use() == 0);
}
