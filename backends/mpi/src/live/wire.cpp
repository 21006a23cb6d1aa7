#include "live/wire.hpp"

#include <cstring>

#include <fmt/format.h>

#include "eredu/core/error.hpp"

namespace eredu::mpi::detail {

namespace {

/// Appends `v`'s bytes.
template <class T>
void put(std::vector<std::byte>& out, T v) {
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  out.insert(out.end(), p, p + sizeof v);
}

}  // namespace

void WireWriter::u32(std::uint32_t v) { put(out_, v); }

void WireWriter::u64(std::uint64_t v) { put(out_, v); }

void WireWriter::str(const std::string& s) {
  u64(s.size());
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  out_.insert(out_.end(), p, p + s.size());
}

void WireReader::need(std::size_t n) const {
  if (n > bytes_.size() - pos_)
    throw Error(errc::invalid_argument, {},
                fmt::format("malformed live-update message ({}): a record runs past its end at byte {}", what_, pos_));
}

template <class T>
T WireReader::take() {
  need(sizeof(T));
  T v{};
  std::memcpy(&v, bytes_.data() + pos_, sizeof v);
  pos_ += sizeof v;
  return v;
}

std::uint32_t WireReader::u32() { return take<std::uint32_t>(); }

std::uint64_t WireReader::u64() { return take<std::uint64_t>(); }

std::string WireReader::str() {
  const std::uint64_t n = u64();
  need(n);
  std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), n);
  pos_ += n;
  return s;
}

std::vector<std::byte> encode_manifest(const Manifest& m) {
  WireWriter w;
  w.u64(m.publication);
  w.str(m.version);
  w.str(m.base);
  w.u64(m.delta_block);
  w.u64(m.tensors.size());
  for (const ManifestTensor& t : m.tensors) {
    w.str(t.name);
    w.str(std::string(dtype_name(t.dtype)));
    w.u64(t.shape.size());
    for (std::uint64_t d : t.shape) w.u64(d);
    w.u64(t.nbytes);
    w.u64(t.address);
    w.str(t.digest);
    w.u64(t.selection_digests.size());
    for (const auto& [selection, digest] : t.selection_digests) {
      w.str(selection);
      w.str(digest);
    }
    w.u32((t.delta ? 1u : 0u) | (t.sparse ? 2u : 0u) | (t.xor_planes ? 4u : 0u) | (t.staged ? 8u : 0u));
    w.u64(t.elements);
    w.u64(t.encoded_address);
    w.u64(t.encoded_bytes);
    w.u64(t.changed.size());
    for (const auto& [first, count] : t.changed) {
      w.u64(first);
      w.u64(count);
    }
    // Entries per block: 4 bytes each, where a slot index would take 8.
    w.u64(t.block_first.empty() ? 0 : t.block_first.size() - 1);
    for (std::size_t k = 0; k + 1 < t.block_first.size(); ++k)
      w.u32(static_cast<std::uint32_t>(t.block_first[k + 1] - t.block_first[k]));
  }
  return std::move(w.bytes());
}

Manifest decode_manifest(std::span<const std::byte> bytes) {
  WireReader r(bytes, "manifest");
  Manifest m;
  m.publication = r.u64();
  m.version = r.str();
  m.base = r.str();
  m.delta_block = r.u64();
  const std::uint64_t n = r.u64();
  if (n > bytes.size()) throw Error(errc::invalid_argument, {}, "malformed live-update manifest: tensor count");
  for (std::uint64_t i = 0; i < n; ++i) {
    ManifestTensor t;
    t.name = r.str();
    const std::string dtype = r.str();
    const std::optional<DType> d = dtype_from_name(dtype);
    if (!d) throw Error(errc::unknown_dtype, {.tensor = t.name}, fmt::format("manifest names dtype '{}'", dtype));
    t.dtype = *d;
    const std::uint64_t rank = r.u64();
    if (rank > 64) throw Error(errc::invalid_argument, {.tensor = t.name}, "malformed live-update manifest: rank");
    for (std::uint64_t k = 0; k < rank; ++k) t.shape.push_back(r.u64());
    t.nbytes = r.u64();
    t.address = r.u64();
    t.digest = r.str();
    const std::uint64_t k = r.u64();
    if (k > bytes.size()) throw Error(errc::invalid_argument, {.tensor = t.name}, "malformed live-update manifest");
    for (std::uint64_t j = 0; j < k; ++j) {
      std::string selection = r.str();
      t.selection_digests.emplace_back(std::move(selection), r.str());
    }
    const std::uint32_t flags = r.u32();
    t.delta = (flags & 1u) != 0;
    t.sparse = (flags & 2u) != 0;
    t.xor_planes = (flags & 4u) != 0;
    t.staged = (flags & 8u) != 0;
    if (t.staged && t.delta)
      throw Error(errc::invalid_argument, {.tensor = t.name}, "malformed live-update manifest: a staged delta");
    t.elements = r.u64();
    t.encoded_address = r.u64();
    t.encoded_bytes = r.u64();
    const std::uint64_t element = dtype_bits(t.dtype) / 8;
    if (t.sparse && (!t.delta || element == 0 || dtype_bits(t.dtype) % 8 != 0 || t.elements > t.nbytes / element))
      throw Error(errc::invalid_argument, {.tensor = t.name}, "malformed live-update manifest: sparse delta");
    if (t.xor_planes && (!t.delta || t.sparse || element == 0 || dtype_bits(t.dtype) % 8 != 0 || t.encoded_bytes == 0 ||
                         t.encoded_bytes > t.nbytes))
      throw Error(errc::invalid_argument, {.tensor = t.name}, "malformed live-update manifest: XOR delta");
    const std::uint64_t c = r.u64();
    if (c > bytes.size() || (t.delta && m.delta_block == 0) || ((t.sparse || t.xor_planes) && c != 0))
      throw Error(errc::invalid_argument, {.tensor = t.name}, "malformed live-update manifest: delta blocks");
    const std::uint64_t blocks = m.delta_block == 0 ? 0 : (t.nbytes + m.delta_block - 1) / m.delta_block;
    std::uint64_t end = 0;
    for (std::uint64_t j = 0; j < c; ++j) {
      const std::uint64_t first = r.u64();
      const std::uint64_t count = r.u64();
      if (first < end || count == 0 || count > blocks || first > blocks - count)
        throw Error(errc::invalid_argument, {.tensor = t.name}, "malformed live-update manifest: delta blocks");
      end = first + count;
      t.changed.emplace_back(first, count);
    }
    const std::uint64_t counted = r.u64();
    if (counted != (t.sparse ? blocks : 0) || counted > bytes.size() / 4)
      throw Error(errc::invalid_argument, {.tensor = t.name}, "malformed live-update manifest: sparse blocks");
    if (t.sparse) {
      t.block_first.reserve(static_cast<std::size_t>(blocks + 1));
      t.block_first.push_back(0);
      for (std::uint64_t j = 0; j < blocks; ++j) t.block_first.push_back(t.block_first.back() + r.u32());
      if (t.block_first.back() != t.elements)
        throw Error(errc::invalid_argument, {.tensor = t.name}, "malformed live-update manifest: sparse blocks");
    }
    m.tensors.push_back(std::move(t));
  }
  return m;
}

}  // namespace eredu::mpi::detail
