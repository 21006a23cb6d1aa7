// The placement planner's decision table, row by row, and place()'s probing: it asks a source
// only for the landings the plan lists, in order, and settles on the first the source serves.
#include "eredu/engine/orchestration/placement.hpp"

#include <asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/vector_source.hpp"

using namespace eredu;
using namespace eredu::engine;
using L = Landing;

namespace {

constexpr std::uint64_t KiB = 1024;

/// A local file source as CheckpointSource declares one on a trusted file system.
constexpr io::SourceCapabilities file_source{
    .maps_pages = true, .direct_windows = true, .window_alignment = 4096, .request_bytes = 4 << 20, .concurrency = 4};
/// A source that only reads (an object store, a trainer's memory).
constexpr io::SourceCapabilities read_only{};
/// A source that maps pages whose failures it cannot vouch for.
constexpr io::SourceCapabilities untrusted_pages{.maps_pages = true, .trusted_errors = false};
/// A file source without O_DIRECT (a file system that refuses it, or direct reads off).
constexpr io::SourceCapabilities no_windows{.maps_pages = true};

/// The CPU backend's storage: host memory it can read into, adopt mappings as, lay windows out in.
constexpr BufferTraits host{
    .host = true, .alignment = 64, .adopts_mappings = true, .reads_into = true, .lays_out_windows = true};
/// Pinned-less plain host memory: read into, nothing else.
constexpr BufferTraits plain_host{.host = true, .alignment = 16, .reads_into = true};
/// A device's memory: only staged copies reach it.
constexpr BufferTraits device{.host = false, .alignment = 256};
/// Memory that takes an owner's bytes in one lease (a backend that copies them whole).
constexpr BufferTraits whole{.host = false, .alignment = 8, .whole_leases = true};

constexpr PlacementPolicy copied{};
constexpr PlacementPolicy mapped_weights{.map_weights = true};
constexpr PlacementPolicy no_cold_windows{.read_cold_windows = false};
constexpr PlacementPolicy resident_copies{.copy_resident = true};

constexpr OwnerBytes big{.bytes = 1 << 20, .unit_alignment = 2};
constexpr OwnerBytes small{.bytes = 4 * KiB, .unit_alignment = 4};
constexpr OwnerBytes cast{.bytes = 1 << 20, .unit_alignment = 2, .converted = true};

struct Row {
  const char* name;
  io::SourceCapabilities source;
  BufferTraits buffer;
  PlacementPolicy policy;
  OwnerBytes owner;
  std::vector<Landing> expected;
};

std::vector<Landing> landings(const PlacementPlan& plan) { return {plan.landings().begin(), plan.landings().end()}; }

std::string names(const std::vector<Landing>& ls) {
  std::string out;
  for (Landing l : ls) out += std::string(out.empty() ? "" : ", ") + std::string(landing_name(l));
  return out;
}

}  // namespace

TEST_CASE("the placement planner's decision table") {
  const std::vector<Row> table{
      {"copied weights from a file: a cold window, else read into storage",
       file_source,
       host,
       copied,
       big,
       {L::direct_window, L::read_into}},
      {"mapped weights from a file: mapped first",
       file_source,
       host,
       mapped_weights,
       big,
       {L::mapped, L::direct_window, L::read_into}},
      {"mapped weights from a source whose pages fail silently: never mapped",
       untrusted_pages,
       host,
       mapped_weights,
       big,
       {L::read_into}},
      {"mapped weights from a read-only source: read into storage",
       read_only,
       host,
       mapped_weights,
       big,
       {L::read_into}},
      {"a buffer that cannot adopt mappings is never mapped",
       file_source,
       plain_host,
       mapped_weights,
       big,
       {L::read_into}},
      {"a small weight is not worth a window", file_source, host, copied, small, {L::read_into}},
      {"cold windows switched off", file_source, host, no_cold_windows, big, {L::read_into}},
      {"a source without direct reads has no windows", no_windows, host, copied, big, {L::read_into}},
      {"a buffer that cannot lay windows out gets none", file_source, plain_host, copied, big, {L::read_into}},
      {"resident copies asked: a mapping's copy before the read",
       file_source,
       host,
       resident_copies,
       big,
       {L::direct_window, L::copy_from_mapping, L::read_into}},
      {"resident copies asked for a small weight: read into storage, no mapping's system calls",
       file_source,
       host,
       resident_copies,
       small,
       {L::read_into}},
      {"resident copies from a read-only source: read into storage",
       read_only,
       host,
       resident_copies,
       big,
       {L::read_into}},
      {"resident copies from untrusted pages: read into storage",
       untrusted_pages,
       host,
       PlacementPolicy{.read_cold_windows = false, .copy_resident = true},
       big,
       {L::read_into}},
      {"a cast into host memory: converted from a mapping, else streamed",
       file_source,
       host,
       copied,
       cast,
       {L::copy_from_mapping, L::chunk_stream}},
      {"a cast from a read-only source: streamed", read_only, host, copied, cast, {L::chunk_stream}},
      {"a cast from untrusted pages: streamed", untrusted_pages, host, copied, cast, {L::chunk_stream}},
      {"a device buffer: streamed, whatever the source can do",
       file_source,
       device,
       mapped_weights,
       big,
       {L::chunk_stream}},
      {"a cast into a device buffer: streamed", file_source, device, resident_copies, cast, {L::chunk_stream}},
      {"a buffer that takes whole leases: one staged lease",
       file_source,
       whole,
       mapped_weights,
       big,
       {L::staged_lease}},
      {"a cast into a buffer that takes whole leases: one staged lease",
       read_only,
       whole,
       copied,
       cast,
       {L::staged_lease}},
      {"everything asked of a file into host storage",
       file_source,
       host,
       PlacementPolicy{.map_weights = true, .copy_resident = true},
       big,
       {L::mapped, L::direct_window, L::copy_from_mapping, L::read_into}},
  };
  for (const Row& row : table) {
    INFO(row.name);
    const PlacementPlan plan = plan_placement(row.source, row.buffer, row.policy, row.owner);
    CHECK(names(landings(plan)) == names(row.expected));
  }
}

TEST_CASE("storage just allocated is filled by the source when fresh, from a mapping only when recycled") {
  const PlacementPlan plan =
      plan_placement(file_source, host, PlacementPolicy{.map_weights = true, .copy_resident = true}, big);
  CHECK(names(landings(plan_storage_fill(plan, false))) == names({L::copy_from_mapping, L::read_into}));
  CHECK(names(landings(plan_storage_fill(plan, true))) == names({L::read_into}));
  const PlacementPlan plain = plan_placement(file_source, host, copied, big);
  CHECK(names(landings(plan_storage_fill(plain, false))) == names({L::read_into}));
}

TEST_CASE("a placement plan falls back on a landing that needs only reads") {
  CHECK_THROWS_AS(PlacementPlan(L::mapped), std::invalid_argument);
  CHECK_THROWS_AS(PlacementPlan(L::copy_from_mapping), std::invalid_argument);
  CHECK(PlacementPlan(L::staged_lease).landings().front() == L::staged_lease);
  PlacementPlan plan(L::chunk_stream);
  plan.add(L::copy_from_mapping);
  plan.add(L::copy_from_mapping);
  CHECK(names(landings(plan)) == names({L::copy_from_mapping, L::chunk_stream}));
  CHECK(plan.offers(L::copy_from_mapping));
  CHECK_FALSE(plan.offers(L::mapped));
  CHECK(names(landings(plan.without(L::chunk_stream))) == names({L::copy_from_mapping, L::chunk_stream}));
}

TEST_CASE("a mapping or a window is accepted only where it keeps the owner's units aligned") {
  alignas(8) std::byte bytes[16]{};
  const OwnerBytes f32{.bytes = 1 << 20, .unit_alignment = 4};
  CHECK(accepts_mapping(bytes, f32));
  CHECK_FALSE(accepts_mapping(bytes + 2, f32));
  CHECK(accepts_mapping(bytes + 2, OwnerBytes{.unit_alignment = 2}));
  // A window that is the owner's bytes exactly is an aligned read already.
  CHECK_FALSE(accepts_window(io::DirectWindow{.lead = 0, .bytes = 1 << 20}, f32));
  CHECK(accepts_window(io::DirectWindow{.lead = 8, .bytes = (1 << 20) + 4096}, f32));
  CHECK_FALSE(accepts_window(io::DirectWindow{.lead = 6, .bytes = (1 << 20) + 4096}, f32));
}

TEST_CASE("storage unit alignment: a power of two of the unit's bytes, at most 8") {
  CHECK(unit_alignment(DType::U8) == 1);
  CHECK(unit_alignment(DType::BF16) == 2);
  CHECK(unit_alignment(DType::F32) == 4);
  CHECK(unit_alignment(DType::F64) == 8);
  // A Q8_0 block is 34 bytes (an f16 scale and 32 values): 2.
  CHECK(unit_alignment(DType::Q8_0) == 2);
}

namespace {

/// An in-memory source that declares it maps pages and serves direct windows, and records
/// which of those members place() asked; it has neither to give, so every probe fails.
class ProbedSource : public test::VectorSource {
 public:
  using VectorSource::VectorSource;
  io::SourceCapabilities capabilities() const { return file_source; }
  std::optional<io::MappedTensor> map_tensor(const io::TensorReadRequest&) const {
    asked.emplace_back("map_tensor");
    return std::nullopt;
  }
  std::optional<io::MappedView> map_resident(const io::TensorReadRequest&) const {
    asked.emplace_back("map_resident");
    return std::nullopt;
  }
  std::optional<io::DirectWindow> direct_window(const io::TensorReadRequest&) const {
    asked.emplace_back("direct_window");
    return window;
  }
  mutable std::vector<std::string> asked;
  std::optional<io::DirectWindow> window;
};
static_assert(io::ByteSource<ProbedSource>);

}  // namespace

TEST_CASE("place asks the source only for the landings its plan lists, best first") {
  asio::io_context ctx;
  ProbedSource source(ctx.get_executor(), 1 << 20, 4096);
  const std::vector<std::byte> stored(1 << 20);
  source.add("w", DType::F32, {1 << 18}, stored);
  const io::TensorReadRequest request{"w"};
  const OwnerBytes owner{.bytes = 1 << 20, .unit_alignment = 4};

  SECTION("every probe fails: the fallback, after asking in order") {
    const PlacementPlan plan =
        plan_placement(source.capabilities(), host, PlacementPolicy{.map_weights = true, .copy_resident = true}, owner);
    const Placement p = place(source, request, plan, owner);
    CHECK(p.landing == L::read_into);
    CHECK(source.asked == std::vector<std::string>{"map_tensor", "direct_window", "map_resident"});
  }
  SECTION("a plan without mapping never asks for a mapping") {
    const PlacementPlan plan = plan_placement(source.capabilities(), host, copied, owner);
    place(source, request, plan, owner);
    CHECK(source.asked == std::vector<std::string>{"direct_window"});
  }
  SECTION("an acceptable window is taken with its geometry") {
    source.window = io::DirectWindow{.lead = 512, .bytes = (1 << 20) + 4096};
    const Placement p = place(source, request, plan_placement(source.capabilities(), host, copied, owner), owner);
    CHECK(p.landing == L::direct_window);
    CHECK(p.window.lead == 512);
    CHECK(p.window.bytes == (1 << 20) + 4096);
  }
  SECTION("a window that misaligns the owner's units is passed over") {
    source.window = io::DirectWindow{.lead = 2, .bytes = (1 << 20) + 4096};
    CHECK(place(source, request, plan_placement(source.capabilities(), host, copied, owner), owner).landing ==
          L::read_into);
  }
  SECTION("a read-only source's declaration keeps every probe away") {
    test::VectorSource plain(ctx.get_executor(), 1 << 20, 4096);
    plain.add("w", DType::F32, {1 << 18}, stored);
    const PlacementPlan plan = plan_placement(plain.capabilities(), host, PlacementPolicy{.map_weights = true}, owner);
    CHECK(names(landings(plan)) == names({L::read_into}));
    CHECK(place(plain, request, plan, owner).landing == L::read_into);
  }
}
