#include "eredu/synth/gguf_writer.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "eredu/core/error.hpp"

namespace eredu::synth {
namespace {

using io::gguf::Value;
using io::gguf::ValueType;

std::error_code last_os_error() noexcept { return {errno, std::system_category()}; }

template <class T>
Value scalar(ValueType type, T v) {
  Value out;
  out.type = out.element_type = type;
  out.bytes.resize(sizeof(T));
  std::memcpy(out.bytes.data(), &v, sizeof(T));
  return out;
}

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

// resize + memcpy rather than insert: g++ 12 warns falsely (stringop-overflow) on the latter.
void put(std::vector<std::byte>& out, const void* p, std::size_t n) {
  if (n == 0) return;
  const std::size_t at = out.size();
  out.resize(at + n);
  std::memcpy(out.data() + at, p, n);
}
template <class T>
void put_le(std::vector<std::byte>& out, T v) {
  put(out, &v, sizeof v);  // little-endian host (synth requires it)
}
void put_string(std::vector<std::byte>& out, std::string_view s) {
  put_le<std::uint64_t>(out, s.size());
  put(out, s.data(), s.size());
}

constexpr std::uint64_t golden = 0x9E3779B97F4A7C15ull;
constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
std::uint64_t fnv1a64(std::string_view s) noexcept {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001B3ull;
  }
  return h;
}

// A small positive f16 (2^-12 .. 2^-9, random mantissa): scales of weights near 0.02.
void put_scale(std::uint8_t* p, std::uint64_t r) {
  const auto bits = static_cast<std::uint16_t>(((3 + (r & 3)) << 10) | ((r >> 2) & 0x3FF));
  p[0] = static_cast<std::uint8_t>(bits);
  p[1] = static_cast<std::uint8_t>(bits >> 8);
}

// One synthetic block of `t`: random bytes with sane scale fields.
void make_block(DType t, std::uint64_t key, std::uint64_t index, std::uint8_t* b) {
  const DTypeBlock block = dtype_block(t);
  for (std::uint32_t i = 0; i < block.bytes; i += 8) {
    const std::uint64_t w = mix64(key + (index * 64 + i / 8) * golden);
    for (std::uint32_t k = 0; k < 8 && i + k < block.bytes; ++k) b[i + k] = static_cast<std::uint8_t>(w >> (8 * k));
  }
  const std::uint64_t r = mix64(key ^ (index * golden) ^ 0x5CA1E);
  switch (t) {
    case DType::Q4_1:
    case DType::Q5_1:
    case DType::Q8_1:
    case DType::Q4_K:
    case DType::Q5_K:
      put_scale(b, r);
      put_scale(b + 2, r >> 16);
      break;
    case DType::Q2_K:
      put_scale(b + 80, r);
      put_scale(b + 82, r >> 16);
      break;
    case DType::Q3_K:
      put_scale(b + 108, r);
      break;
    case DType::Q6_K:
      put_scale(b + 208, r);
      break;
    case DType::Q8_K: {
      const float d = 0.0002f;
      std::memcpy(b, &d, sizeof d);
      break;
    }
    case DType::IQ1_M:
      // The f16 scale is the top nibbles of the four scale words: keep its exponent small.
      b[55] = static_cast<std::uint8_t>((b[55] & 0x0F) | 0x10);
      b[53] = static_cast<std::uint8_t>((b[53] & 0x0F) | 0x40);
      break;
    case DType::TQ1_0:
      put_scale(b + 52, r);
      break;
    case DType::TQ2_0:
      put_scale(b + 64, r);
      break;
    case DType::MXFP4:
      b[0] = static_cast<std::uint8_t>(118 + (r % 8));
      break;
    default:  // the f16 scale comes first
      put_scale(b, r);
      break;
  }
}

}  // namespace

Value gguf_u8(std::uint8_t v) { return scalar(ValueType::u8, v); }
Value gguf_u16(std::uint16_t v) { return scalar(ValueType::u16, v); }
Value gguf_u32(std::uint32_t v) { return scalar(ValueType::u32, v); }
Value gguf_i32(std::int32_t v) { return scalar(ValueType::i32, v); }
Value gguf_u64(std::uint64_t v) { return scalar(ValueType::u64, v); }
Value gguf_i64(std::int64_t v) { return scalar(ValueType::i64, v); }
Value gguf_f32(float v) { return scalar(ValueType::f32, v); }
Value gguf_f64(double v) { return scalar(ValueType::f64, v); }
Value gguf_bool(bool v) { return scalar(ValueType::boolean, static_cast<std::uint8_t>(v ? 1 : 0)); }

Value gguf_string(std::string v) {
  Value out;
  out.type = out.element_type = ValueType::string;
  out.strings.push_back(std::move(v));
  return out;
}

Value gguf_string_array(std::vector<std::string> v) {
  Value out;
  out.type = ValueType::array;
  out.element_type = ValueType::string;
  out.count = v.size();
  out.strings = std::move(v);
  return out;
}

Value gguf_i32_array(std::span<const std::int32_t> v) {
  Value out;
  out.type = ValueType::array;
  out.element_type = ValueType::i32;
  out.count = v.size();
  out.bytes.resize(v.size_bytes());
  if (!v.empty()) std::memcpy(out.bytes.data(), v.data(), v.size_bytes());
  return out;
}

std::uint32_t gguf_alignment(std::span<const GgufKeyValue> kv) {
  for (const auto& p : kv) {
    if (p.key != "general.alignment") continue;
    const auto a = p.value.as_u64();
    if (p.value.type != ValueType::u32 || !a || *a == 0 || (*a & (*a - 1)) != 0) {
      throw Error(errc::invalid_argument, {}, "general.alignment must be a UINT32 power of two");
    }
    return static_cast<std::uint32_t>(*a);
  }
  return io::gguf::default_alignment;
}

std::vector<std::byte> gguf_header(std::span<const TensorSpec> tensors, std::span<const GgufKeyValue> kv) {
  const std::uint32_t alignment = gguf_alignment(kv);
  std::vector<std::byte> out;
  put(out, io::gguf::magic.data(), 4);
  put_le<std::uint32_t>(out, 3);
  put_le<std::int64_t>(out, static_cast<std::int64_t>(tensors.size()));
  put_le<std::int64_t>(out, static_cast<std::int64_t>(kv.size()));
  for (const auto& p : kv) {
    put_string(out, p.key);
    put_le<std::uint32_t>(out, static_cast<std::uint32_t>(p.value.type));
    if (p.value.is_array()) {
      put_le<std::uint32_t>(out, static_cast<std::uint32_t>(p.value.element_type));
      put_le<std::uint64_t>(out, p.value.count);
    }
    if (p.value.element_type == ValueType::string) {
      for (const auto& s : p.value.strings) put_string(out, s);
    } else {
      put(out, p.value.bytes.data(), p.value.bytes.size());
    }
  }
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    const auto type = io::gguf::ggml_type_of(t.dtype);
    if (!type) {
      throw Error(errc::invalid_argument, {.tensor = t.name},
                  fmt::format("GGUF has no ggml type for {}", dtype_name(t.dtype)));
    }
    if (auto why = block_shape_error(t.shape, t.dtype); !why.empty())
      throw Error(errc::invalid_argument, {.tensor = t.name}, why);
    if (t.shape.size() > io::gguf::max_dims) {
      throw Error(errc::invalid_argument, {.tensor = t.name},
                  fmt::format("shape {} has more than {} dimensions", format_shape(t.shape), io::gguf::max_dims));
    }
    put_string(out, t.name);
    put_le<std::uint32_t>(out, static_cast<std::uint32_t>(t.shape.size()));
    for (std::size_t j = t.shape.size(); j-- > 0;) put_le<std::int64_t>(out, static_cast<std::int64_t>(t.shape[j]));
    put_le<std::uint32_t>(out, *type);
    put_le<std::uint64_t>(out, offset);
    offset = align_up(offset + tensor_nbytes(t), alignment);
  }
  out.resize(static_cast<std::size_t>(align_up(out.size(), alignment)), std::byte{0});
  return out;
}

GgufFileWriter::GgufFileWriter(const std::filesystem::path& path, std::span<const TensorSpec> tensors,
                               std::span<const GgufKeyValue> kv)
    : path_(path), alignment_(gguf_alignment(kv)) {
  const std::vector<std::byte> head = gguf_header(tensors, kv);
  for (const auto& t : tensors) {
    sizes_.push_back(tensor_nbytes(t));
    data_size_ += sizes_.back();
  }
  fd_ = io::UniqueFd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd_)
    throw Error(errc::io_error, {.file = path_.string(), .os_error = last_os_error()}, "cannot create the file");
  header_size_ = head.size();
  write_all(head);
}

void GgufFileWriter::write_all(std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    const ssize_t r = ::write(fd_.get(), bytes.data(), bytes.size());
    if (r < 0) {
      if (errno == EINTR) continue;
      throw Error(errc::io_error, {.file = path_.string(), .os_error = last_os_error()}, "write failed");
    }
    bytes = bytes.subspan(static_cast<std::size_t>(r));
  }
}

void GgufFileWriter::pad_to(std::uint64_t boundary) {
  static constexpr std::array<std::byte, 64> zeros{};
  while (position_ < boundary) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(boundary - position_, zeros.size()));
    write_all(std::span(zeros).first(n));
    position_ += n;
  }
}

void GgufFileWriter::write(std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    while (tensor_ < sizes_.size() && in_tensor_ == sizes_[tensor_]) {
      pad_to(align_up(position_, alignment_));
      ++tensor_;
      in_tensor_ = 0;
    }
    if (tensor_ == sizes_.size()) {
      throw Error(errc::invalid_argument, {.file = path_.string()},
                  fmt::format("{} more bytes than the {} tensor bytes the header declares", bytes.size(), data_size_));
    }
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(bytes.size(), sizes_[tensor_] - in_tensor_));
    write_all(bytes.first(n));
    bytes = bytes.subspan(n);
    in_tensor_ += n;
    position_ += n;
  }
}

void GgufFileWriter::finish(bool sync) {
  while (tensor_ < sizes_.size() && in_tensor_ == sizes_[tensor_]) {
    pad_to(align_up(position_, alignment_));
    ++tensor_;
    in_tensor_ = 0;
  }
  if (tensor_ != sizes_.size()) {
    throw Error(errc::invalid_argument, {.file = path_.string()},
                fmt::format("finished after tensor {} of {}: the data is incomplete", tensor_, sizes_.size()));
  }
  if (sync && ::fsync(fd_.get()) != 0) {
    throw Error(errc::io_error, {.file = path_.string(), .os_error = last_os_error()}, "fsync failed");
  }
  if (::close(fd_.release()) != 0) {
    throw Error(errc::io_error, {.file = path_.string(), .os_error = last_os_error()}, "close failed");
  }
}

void write_gguf(const std::filesystem::path& path, std::span<const TensorSpec> tensors,
                std::span<const std::span<const std::byte>> data, std::span<const GgufKeyValue> kv) {
  if (data.size() != tensors.size()) {
    throw Error(errc::invalid_argument, {.file = path.string()},
                fmt::format("{} data spans for {} tensors", data.size(), tensors.size()));
  }
  GgufFileWriter writer(path, tensors, kv);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (data[i].size() != tensor_nbytes(tensors[i])) {
      throw Error(errc::invalid_argument, {.file = path.string(), .tensor = tensors[i].name},
                  fmt::format("{} bytes given for a tensor of {} bytes", data[i].size(), tensor_nbytes(tensors[i])));
    }
    writer.write(data[i]);
  }
  writer.finish();
}

void fill_quantized_bytes(std::uint64_t seed, const TensorSpec& tensor, std::uint64_t byte_offset,
                          std::span<std::byte> out) {
  if (!dtype_is_quantized(tensor.dtype)) {
    throw Error(errc::invalid_argument, {.tensor = tensor.name},
                fmt::format("{} is not a quantized dtype", dtype_name(tensor.dtype)));
  }
  const std::uint64_t total = tensor_nbytes(tensor);
  if (byte_offset > total || out.size() > total - byte_offset) {
    throw Error(errc::invalid_argument, {.tensor = tensor.name},
                fmt::format("bytes [{}, +{}) pass the tensor's {} bytes", byte_offset, out.size(), total));
  }
  const DTypeBlock block = dtype_block(tensor.dtype);
  const std::uint64_t key = mix64(seed ^ fnv1a64(tensor.name));
  std::array<std::uint8_t, max_dtype_block_bytes> b{};
  std::size_t done = 0;
  while (done < out.size()) {
    const std::uint64_t at = byte_offset + done;
    const std::uint64_t index = at / block.bytes, within = at % block.bytes;
    make_block(tensor.dtype, key, index, b.data());
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(block.bytes - within, out.size() - done));
    std::memcpy(out.data() + done, b.data() + within, n);
    done += n;
  }
}

}  // namespace eredu::synth
