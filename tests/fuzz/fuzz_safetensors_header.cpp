// libFuzzer target: safetensors::parse_file_prefix on arbitrary bytes. Any exception other
// than eredu::Error, any sanitizer report, or a layout that does not tile the data is a bug.
//
//   build/fuzz/tests/fuzz/fuzz_safetensors_header -max_total_time=60 \
//       -dict=tests/fuzz/safetensors.dict tests/fuzz/corpus

#include <cstddef>
#include <cstdint>
#include <span>

#include "eredu/core/error.hpp"
#include "eredu/io/formats/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const auto layout = eredu::io::safetensors::parse_file_prefix(bytes, size, "fuzz");
    // An accepted file's tensors tile [data_offset, size) in order.
    std::uint64_t next = layout.data_offset;
    for (const auto& t : layout.tensors) {
      if (t.offset != next) __builtin_trap();
      next += t.nbytes;
    }
    if (next != size) __builtin_trap();
  } catch (const eredu::Error&) {
    // Rejections are the expected outcome for most inputs.
  }
  return 0;
}
