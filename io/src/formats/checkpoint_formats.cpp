#include <array>

#include "eredu/io/formats/checkpoint_format.hpp"
#include "eredu/io/formats/gguf.hpp"
#include "eredu/io/formats/safetensors.hpp"

namespace eredu::io {

std::span<const CheckpointFormat* const> checkpoint_formats() {
  // Formats with a magic number go first; safetensors has none, so it stays last as the
  // fallback.
  static const gguf::GgufFormat gguf_format;
  static const safetensors::SafetensorsFormat safetensors_format;
  static const std::array<const CheckpointFormat*, 2> formats = {&gguf_format, &safetensors_format};
  return formats;
}

}  // namespace eredu::io
