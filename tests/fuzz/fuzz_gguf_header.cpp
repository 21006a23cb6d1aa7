// libFuzzer target: gguf::parse_header on arbitrary bytes. Any exception other than
// eredu::Error, any sanitizer report, or an accepted layout whose tensors are out of order,
// overlap, leave the file, or disagree with their dtype and shape is a bug.
//
//   build/fuzz/tests/fuzz/fuzz_gguf_header -max_total_time=60 -dict=tests/fuzz/gguf.dict \
//       tests/fuzz/gguf_corpus

#include <cstddef>
#include <cstdint>
#include <span>

#include "eredu/core/error.hpp"
#include "eredu/io/formats/gguf.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const auto h = eredu::io::gguf::parse_header(bytes, size, "fuzz");
    std::uint64_t next = h.data_offset;
    for (const auto& t : h.tensors) {
      if (t.offset < next || t.offset % h.alignment != 0 || t.offset + t.nbytes > size) __builtin_trap();
      const auto elements = eredu::checked_element_count(t.shape);
      if (!elements || eredu::checked_byte_size(*elements, t.dtype) != t.nbytes) __builtin_trap();
      if (!eredu::block_shape_error(t.shape, t.dtype).empty()) __builtin_trap();
      next = t.offset + t.nbytes;
    }
    for (const auto& kv : h.kv) (void)kv.value.to_metadata_text();
  } catch (const eredu::Error&) {
    // Rejections are the expected outcome for most inputs.
  }
  return 0;
}
