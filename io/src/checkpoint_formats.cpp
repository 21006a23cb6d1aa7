#include <array>

#include "eredu/io/checkpoint_format.hpp"
#include "eredu/io/safetensors.hpp"

namespace eredu::io {

std::span<const CheckpointFormat* const> checkpoint_formats() {
  // Formats with a magic number go first; safetensors has none, so it stays last as the
  // fallback (a GGUF entry would be inserted before it).
  static const safetensors::SafetensorsFormat safetensors_format;
  static const std::array<const CheckpointFormat*, 1> formats = {&safetensors_format};
  return formats;
}

}  // namespace eredu::io
