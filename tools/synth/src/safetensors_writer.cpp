#include "eredu/synth/safetensors_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <system_error>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/io/formats/json_text.hpp"

namespace eredu::synth {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors is little-endian; the length prefix is written as host bytes");

std::error_code last_os_error() { return {errno, std::system_category()}; }

// The reference parser rejects invalid UTF-8, so a header built from it would be unreadable.
void append_json_string(std::string& out, std::string_view s, const char* what) {
  if (io::json::find_invalid_utf8(s)) {
    throw Error(errc::invalid_argument, {}, fmt::format("{} is not valid UTF-8", what));
  }
  io::json::append_quoted(out, s);
}

void check_same_count(std::size_t tensors, std::size_t data) {
  if (tensors != data) {
    throw Error(errc::invalid_argument, {}, fmt::format("{} tensors but {} data buffers", tensors, data));
  }
}

void write_with_specs(const std::filesystem::path& path, std::span<const TensorSpec> tensors,
                      std::span<const std::span<const std::byte>> data, const io::Metadata& metadata) {
  check_same_count(tensors.size(), data.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (data[i].size() != tensor_nbytes(tensors[i])) {
      throw Error(
          errc::invalid_argument, {.file = path.string(), .tensor = tensors[i].name},
          fmt::format("{} data bytes given for a tensor of {} bytes", data[i].size(), tensor_nbytes(tensors[i])));
    }
  }
  SafetensorsFileWriter writer(path, tensors, metadata);
  for (auto bytes : data) writer.write(bytes);
  writer.finish();
}

}  // namespace

std::uint64_t tensor_nbytes(const TensorSpec& tensor) {
  auto elements = checked_element_count(tensor.shape);
  auto bytes = elements ? checked_byte_size(*elements, tensor.dtype) : std::nullopt;
  if (!bytes) {
    throw Error(
        errc::size_overflow, {.tensor = tensor.name},
        fmt::format("shape {} of {} has no whole byte size", format_shape(tensor.shape), dtype_name(tensor.dtype)));
  }
  return *bytes;
}

std::uint64_t total_nbytes(std::span<const TensorSpec> tensors) {
  std::uint64_t total = 0;
  for (const auto& t : tensors) {
    if (__builtin_add_overflow(total, tensor_nbytes(t), &total)) {
      throw Error(errc::size_overflow, {.tensor = t.name}, "total data size overflows u64");
    }
  }
  return total;
}

std::string safetensors_header(std::span<const TensorSpec> tensors_in_file_order, const io::Metadata& metadata) {
  std::string out;
  out.reserve(64 + tensors_in_file_order.size() * 96);
  out.push_back('{');
  bool first = true;
  if (!metadata.empty()) {
    out += "\"__metadata__\":{";
    bool first_entry = true;
    for (const auto& [key, value] : metadata) {
      if (!first_entry) out.push_back(',');
      first_entry = false;
      append_json_string(out, key, "a metadata key");
      out.push_back(':');
      append_json_string(out, value, "a metadata value");
    }
    out.push_back('}');
    first = false;
  }
  std::uint64_t offset = 0;
  for (const auto& t : tensors_in_file_order) {
    std::uint64_t end = 0;
    if (__builtin_add_overflow(offset, tensor_nbytes(t), &end)) {
      throw Error(errc::size_overflow, {.tensor = t.name}, "data offsets overflow u64");
    }
    if (!first) out.push_back(',');
    first = false;
    append_json_string(out, t.name, "a tensor name");
    fmt::format_to(std::back_inserter(out), ":{{\"dtype\":\"{}\",\"shape\":[", dtype_name(t.dtype));
    for (std::size_t i = 0; i < t.shape.size(); ++i) {
      if (i != 0) out.push_back(',');
      fmt::format_to(std::back_inserter(out), "{}", t.shape[i]);
    }
    fmt::format_to(std::back_inserter(out), "],\"data_offsets\":[{},{}]}}", offset, end);
    offset = end;
  }
  out.push_back('}');
  out.append((8 - out.size() % 8) % 8, ' ');
  return out;
}

// --- SafetensorsFileWriter ---

SafetensorsFileWriter::SafetensorsFileWriter(const std::filesystem::path& path,
                                             std::span<const TensorSpec> tensors_in_file_order,
                                             const io::Metadata& metadata)
    : path_(path) {
  std::string header = safetensors_header(tensors_in_file_order, metadata);
  header_size_ = header.size();
  data_size_ = total_nbytes(tensors_in_file_order);
  fd_ = io::UniqueFd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd_.get() < 0) {
    throw Error(errc::io_error, {.file = path_.string(), .os_error = last_os_error()}, "cannot create the file");
  }
  // One write for prefix and header: small files then cost a single syscall.
  std::string head(8, '\0');
  std::uint64_t n = header_size_;
  std::memcpy(head.data(), &n, 8);
  head += header;
  write_all(std::as_bytes(std::span(head)));
}

void SafetensorsFileWriter::write(std::span<const std::byte> bytes) {
  if (fd_.get() < 0) {
    throw Error(errc::invalid_argument, {.file = path_.string()}, "write after finish");
  }
  if (bytes.size() > data_size_ - data_written_) {
    throw Error(errc::invalid_argument, {.file = path_.string()},
                fmt::format("writing {} bytes at data offset {} passes the declared data size {}", bytes.size(),
                            data_written_, data_size_));
  }
  write_all(bytes);
  data_written_ += bytes.size();
}

void SafetensorsFileWriter::finish(bool sync) {
  if (fd_.get() < 0) {
    throw Error(errc::invalid_argument, {.file = path_.string()}, "finish called twice");
  }
  if (data_written_ != data_size_) {
    throw Error(errc::invalid_argument, {.file = path_.string()},
                fmt::format("{} data bytes written, {} declared", data_written_, data_size_));
  }
  if (sync && ::fsync(fd_.get()) != 0) {
    throw Error(errc::io_error, {.file = path_.string(), .os_error = last_os_error()}, "fsync failed");
  }
  // close() can report a deferred write error (NFS, quota); the fd is gone either way.
  if (::close(fd_.release()) != 0) {
    throw Error(errc::io_error, {.file = path_.string(), .os_error = last_os_error()}, "close failed");
  }
}

void SafetensorsFileWriter::write_all(std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    // Linux writes at most 0x7ffff000 bytes per call; ask for no more so the loop is honest.
    std::size_t chunk = std::min<std::size_t>(bytes.size(), 0x7ffff000);
    ssize_t n = ::write(fd_.get(), bytes.data(), chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(errc::io_error,
                  {.file = path_.string(), .offset = 8 + header_size_ + data_written_, .os_error = last_os_error()},
                  "write failed");
    }
    if (n == 0) {
      throw Error(errc::io_error, {.file = path_.string()}, "write wrote nothing");
    }
    bytes = bytes.subspan(static_cast<std::size_t>(n));
  }
}

// --- whole files and sharded checkpoints ---

void write_text_file(const std::filesystem::path& path, std::string_view contents) {
  io::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) {
    throw Error(errc::io_error, {.file = path.string(), .os_error = last_os_error()}, "cannot create the file");
  }
  auto bytes = std::as_bytes(std::span(contents));
  while (!bytes.empty()) {
    ssize_t n = ::write(fd.get(), bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw Error(errc::io_error, {.file = path.string(), .os_error = last_os_error()}, "write failed");
    }
    bytes = bytes.subspan(static_cast<std::size_t>(n));
  }
  if (::close(fd.release()) != 0) {
    throw Error(errc::io_error, {.file = path.string(), .os_error = last_os_error()}, "close failed");
  }
}

void write_safetensors(const std::filesystem::path& path, std::span<const TensorSpec> tensors,
                       std::span<const std::span<const std::byte>> data, const io::Metadata& metadata) {
  write_with_specs(path, tensors, data, metadata);
}

std::vector<std::size_t> split_by_max_bytes(std::span<const TensorSpec> tensors, std::uint64_t max_shard_bytes) {
  std::vector<std::size_t> starts;
  std::uint64_t in_shard = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    std::uint64_t n = tensor_nbytes(tensors[i]);
    // A shard holding only zero-byte tensors takes the next tensor whatever its size.
    if (starts.empty() || (in_shard != 0 && n > max_shard_bytes - std::min(in_shard, max_shard_bytes))) {
      starts.push_back(i);
      in_shard = 0;
    }
    in_shard += n;
  }
  return starts;
}

std::vector<std::size_t> split_evenly(std::span<const TensorSpec> tensors, std::uint32_t count) {
  if (count == 0 || count > tensors.size()) {
    throw Error(errc::invalid_argument, {},
                fmt::format("cannot split {} tensors into {} non-empty shards", tensors.size(), count));
  }
  // prefix[j] = bytes of tensors [0, j).
  std::vector<std::uint64_t> prefix(tensors.size() + 1, 0);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    prefix[i + 1] = prefix[i] + tensor_nbytes(tensors[i]);
  }
  const std::uint64_t total = prefix.back();
  std::vector<std::size_t> starts{0};
  for (std::uint32_t k = 1; k < count; ++k) {
    // Boundary nearest the ideal cut, kept far enough from both ends that every shard
    // before and after it still gets at least one tensor.
    const auto target = static_cast<std::uint64_t>(static_cast<long double>(total) * k / count);
    const std::size_t lo = starts.back() + 1;
    const std::size_t hi = tensors.size() - (count - k);
    auto it = std::lower_bound(prefix.begin() + static_cast<std::ptrdiff_t>(lo),
                               prefix.begin() + static_cast<std::ptrdiff_t>(hi) + 1, target);
    auto j = static_cast<std::size_t>(it - prefix.begin());
    if (j > hi) {
      j = hi;
    } else if (j > lo && target - prefix[j - 1] < prefix[j] - target) {
      --j;
    }
    starts.push_back(j);
  }
  return starts;
}

std::string shard_file_name(std::size_t index, std::size_t count) {
  return fmt::format("model-{:05}-of-{:05}.safetensors", index + 1, count);
}

std::string sharded_index_json(std::span<const TensorSpec> tensors, std::span<const std::size_t> shard_starts) {
  std::string out = fmt::format(
      "{{\n  \"metadata\": {{\n    \"total_size\": {}\n  }},\n"
      "  \"weight_map\": {{",
      total_nbytes(tensors));
  std::size_t shard = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    while (shard + 1 < shard_starts.size() && shard_starts[shard + 1] <= i) ++shard;
    out += i == 0 ? "\n    " : ",\n    ";
    append_json_string(out, tensors[i].name, "a tensor name");
    out += ": \"";
    out += shard_file_name(shard, shard_starts.size());
    out += '"';
  }
  out += "\n  }\n}";
  return out;
}

void write_sharded(const std::filesystem::path& dir, std::span<const TensorSpec> tensors,
                   std::span<const std::span<const std::byte>> data, std::uint64_t max_shard_bytes) {
  check_same_count(tensors.size(), data.size());
  std::vector<std::size_t> starts = split_by_max_bytes(tensors, max_shard_bytes);
  if (starts.empty()) starts.push_back(0);  // no tensors: one empty shard keeps the layout valid
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    throw Error(errc::io_error, {.file = dir.string(), .os_error = ec}, "cannot create the directory");
  }
  const io::Metadata shard_metadata{{"format", "pt"}};
  for (std::size_t s = 0; s < starts.size(); ++s) {
    std::size_t begin = starts[s];
    std::size_t end = s + 1 < starts.size() ? starts[s + 1] : tensors.size();
    write_with_specs(dir / shard_file_name(s, starts.size()), tensors.subspan(begin, end - begin),
                     data.subspan(begin, end - begin), shard_metadata);
  }
  write_text_file(dir / "model.safetensors.index.json", sharded_index_json(tensors, starts));
}

}  // namespace eredu::synth
