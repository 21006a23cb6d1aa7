#include "eredu/io/formats/catalog.hpp"

#include <fmt/format.h>

#include "eredu/core/error.hpp"

namespace eredu::io {

std::uint32_t Catalog::add_file(CheckpointFile file) {
  files_.push_back(std::move(file));
  return static_cast<std::uint32_t>(files_.size() - 1);
}

void Catalog::add_tensor(TensorInfo tensor) {
  auto [it, inserted] = index_.try_emplace(tensor.name, tensors_.size());
  if (!inserted) {
    const auto& first = tensors_[it->second];
    throw Error(errc::duplicate_tensor,
                {.file = files_.at(tensor.file).path, .tensor = tensor.name, .offset = tensor.offset},
                fmt::format("tensor name already used in {} at offset {}", files_.at(first.file).path, first.offset));
  }
  total_bytes_ += tensor.nbytes;
  tensors_.push_back(std::move(tensor));
}

const TensorInfo* Catalog::find(std::string_view name) const noexcept {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& Catalog::at(std::string_view name) const {
  if (const auto* t = find(name)) return *t;
  throw Error(errc::tensor_not_found,
              {.file = files_.size() == 1 ? files_.front().path : std::string{}, .tensor = std::string(name)},
              fmt::format("no such tensor among the checkpoint's {} tensors", tensors_.size()));
}

}  // namespace eredu::io
