#include "eredu/core/error.hpp"

#include <fmt/format.h>

#include "eredu/core/printable.hpp"

namespace eredu {
namespace {

class Category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "eredu"; }
  std::string message(int value) const override {
    switch (static_cast<errc>(value)) {
      case errc::header_too_small:
        return "file too small for a safetensors header";
      case errc::header_too_large:
        return "header length exceeds 100,000,000 bytes";
      case errc::invalid_header_length:
        return "header length exceeds the file";
      case errc::invalid_header_utf8:
        return "header is not valid UTF-8";
      case errc::invalid_header_json:
        return "header is not valid JSON";
      case errc::header_not_object:
        return "header is not a JSON object";
      case errc::invalid_tensor_entry:
        return "tensor entry is not an object";
      case errc::missing_field:
        return "tensor entry lacks a required field";
      case errc::duplicate_field:
        return "field given twice";
      case errc::unknown_dtype:
        return "unknown dtype";
      case errc::invalid_shape:
        return "invalid shape";
      case errc::invalid_data_offsets:
        return "invalid data_offsets";
      case errc::invalid_metadata:
        return "__metadata__ is not a string-to-string map";
      case errc::duplicate_tensor:
        return "duplicate tensor name";
      case errc::invalid_offset:
        return "tensor data offsets do not tile the data region";
      case errc::size_overflow:
        return "size computation overflows";
      case errc::misaligned_slice:
        return "bit count is not a whole number of bytes";
      case errc::tensor_size_mismatch:
        return "byte range does not match shape and dtype";
      case errc::incomplete_data:
        return "data does not end at end of file";
      case errc::invalid_index:
        return "invalid sharded-checkpoint index";
      case errc::shard_missing:
        return "shard file missing";
      case errc::tensor_missing_from_shard:
        return "tensor missing from its shard";
      case errc::tensor_in_two_shards:
        return "tensor present in two shards";
      case errc::tensor_not_in_index:
        return "tensor not listed in the index";
      case errc::unknown_format:
        return "unknown checkpoint format";
      case errc::tensor_not_found:
        return "tensor not found";
      case errc::invalid_selection:
        return "invalid selection";
      case errc::exceeds_budget:
        return "request larger than the staging budget";
      case errc::io_error:
        return "I/O error";
      case errc::unexpected_eof:
        return "unexpected end of file";
      case errc::file_changed:
        return "file changed since it was opened";
      case errc::direct_io_unsupported:
        return "O_DIRECT unsupported";
      case errc::uring_unavailable:
        return "io_uring unavailable";
      case errc::cancelled:
        return "cancelled";
      case errc::invalid_argument:
        return "invalid argument";
      case errc::recipe_unknown_key:
        return "recipe names an unknown tensor";
      case errc::recipe_invalid_selection:
        return "recipe selection does not fit its tensor";
      case errc::recipe_rank_mismatch:
        return "recipe rank mismatch";
      case errc::recipe_shape_mismatch:
        return "recipe shape mismatch";
      case errc::recipe_bad_dim:
        return "recipe dimension out of range";
      case errc::recipe_dtype_mismatch:
        return "recipe inputs differ in dtype";
      case errc::recipe_unsupported_cast:
        return "unsupported cast";
      case errc::recipe_sub_byte_layout:
        return "layout recipe on a sub-byte dtype";
      case errc::invalid_parameter_id:
        return "invalid parameter identity";
      case errc::duplicate_binding:
        return "duplicate binding";
      case errc::alias_unknown_owner:
        return "alias of an unknown owner";
      case errc::alias_chain:
        return "alias of an alias";
      case errc::byte_mismatch:
        return "declared bytes differ from the recipe's";
      case errc::missing_binding:
        return "parameter has no materialized value";
      case errc::unexpected_bindings:
        return "materialized values for unknown parameters";
      case errc::bind_shape_mismatch:
        return "weight shape differs from the parameter's";
      case errc::bind_dtype_mismatch:
        return "weight dtype differs from the parameter's";
      case errc::out_of_memory:
        return "out of memory";
      case errc::backend_failure:
        return "backend failure";
      case errc::checksum_mismatch:
        return "checksum mismatch";
      case errc::canary_failed:
        return "canary check failed";
      case errc::swap_in_progress:
        return "a swap is already in progress";
      case errc::outside_root:
        return "checkpoint file outside the allowed root";
      case errc::collective_error:
        return "collective operation failed";
      case errc::rank_failed:
        return "a rank of the group failed";
      case errc::bad_magic:
        return "file does not start with the GGUF magic";
      case errc::unsupported_version:
        return "unsupported GGUF version";
      case errc::invalid_count:
        return "count exceeds what the file holds";
      case errc::truncated_header:
        return "header ends before its last field";
      case errc::invalid_key:
        return "empty key";
      case errc::duplicate_key:
        return "duplicate key";
      case errc::invalid_value_type:
        return "invalid GGUF value type";
      case errc::invalid_alignment:
        return "invalid alignment";
      case errc::invalid_tensor_name:
        return "invalid tensor name";
      case errc::partial_block:
        return "rows are not whole blocks";
      case errc::split_mismatch:
        return "split files disagree";
      case errc::recipe_cuts_block:
        return "layout would cut a quantized block";
      case errc::resource_exhausted:
        return "the system refused a resource (threads, file descriptors)";
      case errc::access_denied:
        return "access denied";
      case errc::remote_not_found:
        return "no such remote object";
      case errc::range_unsupported:
        return "the server ignores byte ranges";
      case errc::tls_error:
        return "TLS failure";
      case errc::remote_error:
        return "remote transfer failed";
      case errc::timed_out:
        return "timed out";
      case errc::version_not_published:
        return "no such published version";
      case errc::version_withdrawn:
        return "the published version was withdrawn";
    }
    return "unknown eredu error";
  }
};

}  // namespace

const std::error_category& error_category() noexcept {
  static const Category category;
  return category;
}

const char* errc_name(errc e) noexcept {
  switch (e) {
#define EREDU_ERRC_NAME(x) \
  case errc::x:            \
    return #x;
    EREDU_ERRC_NAME(header_too_small)
    EREDU_ERRC_NAME(header_too_large)
    EREDU_ERRC_NAME(invalid_header_length)
    EREDU_ERRC_NAME(invalid_header_utf8)
    EREDU_ERRC_NAME(invalid_header_json)
    EREDU_ERRC_NAME(header_not_object)
    EREDU_ERRC_NAME(invalid_tensor_entry)
    EREDU_ERRC_NAME(missing_field)
    EREDU_ERRC_NAME(duplicate_field)
    EREDU_ERRC_NAME(unknown_dtype)
    EREDU_ERRC_NAME(invalid_shape)
    EREDU_ERRC_NAME(invalid_data_offsets)
    EREDU_ERRC_NAME(invalid_metadata)
    EREDU_ERRC_NAME(duplicate_tensor)
    EREDU_ERRC_NAME(invalid_offset)
    EREDU_ERRC_NAME(size_overflow)
    EREDU_ERRC_NAME(misaligned_slice)
    EREDU_ERRC_NAME(tensor_size_mismatch)
    EREDU_ERRC_NAME(incomplete_data)
    EREDU_ERRC_NAME(invalid_index)
    EREDU_ERRC_NAME(shard_missing)
    EREDU_ERRC_NAME(tensor_missing_from_shard)
    EREDU_ERRC_NAME(tensor_in_two_shards)
    EREDU_ERRC_NAME(tensor_not_in_index)
    EREDU_ERRC_NAME(unknown_format)
    EREDU_ERRC_NAME(tensor_not_found)
    EREDU_ERRC_NAME(invalid_selection)
    EREDU_ERRC_NAME(exceeds_budget)
    EREDU_ERRC_NAME(io_error)
    EREDU_ERRC_NAME(unexpected_eof)
    EREDU_ERRC_NAME(file_changed)
    EREDU_ERRC_NAME(direct_io_unsupported)
    EREDU_ERRC_NAME(uring_unavailable)
    EREDU_ERRC_NAME(cancelled)
    EREDU_ERRC_NAME(invalid_argument)
    EREDU_ERRC_NAME(recipe_unknown_key)
    EREDU_ERRC_NAME(recipe_invalid_selection)
    EREDU_ERRC_NAME(recipe_rank_mismatch)
    EREDU_ERRC_NAME(recipe_shape_mismatch)
    EREDU_ERRC_NAME(recipe_bad_dim)
    EREDU_ERRC_NAME(recipe_dtype_mismatch)
    EREDU_ERRC_NAME(recipe_unsupported_cast)
    EREDU_ERRC_NAME(recipe_sub_byte_layout)
    EREDU_ERRC_NAME(invalid_parameter_id)
    EREDU_ERRC_NAME(duplicate_binding)
    EREDU_ERRC_NAME(alias_unknown_owner)
    EREDU_ERRC_NAME(alias_chain)
    EREDU_ERRC_NAME(byte_mismatch)
    EREDU_ERRC_NAME(missing_binding)
    EREDU_ERRC_NAME(unexpected_bindings)
    EREDU_ERRC_NAME(bind_shape_mismatch)
    EREDU_ERRC_NAME(bind_dtype_mismatch)
    EREDU_ERRC_NAME(out_of_memory)
    EREDU_ERRC_NAME(backend_failure)
    EREDU_ERRC_NAME(checksum_mismatch)
    EREDU_ERRC_NAME(canary_failed)
    EREDU_ERRC_NAME(swap_in_progress)
    EREDU_ERRC_NAME(outside_root)
    EREDU_ERRC_NAME(collective_error)
    EREDU_ERRC_NAME(rank_failed)
    EREDU_ERRC_NAME(bad_magic)
    EREDU_ERRC_NAME(unsupported_version)
    EREDU_ERRC_NAME(invalid_count)
    EREDU_ERRC_NAME(truncated_header)
    EREDU_ERRC_NAME(invalid_key)
    EREDU_ERRC_NAME(duplicate_key)
    EREDU_ERRC_NAME(invalid_value_type)
    EREDU_ERRC_NAME(invalid_alignment)
    EREDU_ERRC_NAME(invalid_tensor_name)
    EREDU_ERRC_NAME(partial_block)
    EREDU_ERRC_NAME(split_mismatch)
    EREDU_ERRC_NAME(recipe_cuts_block)
    EREDU_ERRC_NAME(resource_exhausted)
    EREDU_ERRC_NAME(access_denied)
    EREDU_ERRC_NAME(remote_not_found)
    EREDU_ERRC_NAME(range_unsupported)
    EREDU_ERRC_NAME(tls_error)
    EREDU_ERRC_NAME(remote_error)
    EREDU_ERRC_NAME(timed_out)
    EREDU_ERRC_NAME(version_not_published)
    EREDU_ERRC_NAME(version_withdrawn)
#undef EREDU_ERRC_NAME
  }
  return "unknown";
}

error_family errc_family(errc e) noexcept {
  if (e == errc::checksum_mismatch) return error_family::store;
  if (e == errc::collective_error || e == errc::rank_failed) return error_family::collective;
  if (e == errc::canary_failed || e == errc::swap_in_progress) return error_family::orchestration;
  if (e == errc::outside_root) return error_family::format;
  if (e == errc::recipe_cuts_block) return error_family::recipe;
  if (e >= errc::access_denied && e <= errc::version_withdrawn) return error_family::store;
  if (e >= errc::bad_magic && e <= errc::split_mismatch) return error_family::format;
  if (e <= errc::unknown_format) return error_family::format;
  if (e <= errc::invalid_argument) return error_family::store;
  if (e <= errc::recipe_sub_byte_layout) return error_family::recipe;
  if (e <= errc::byte_mismatch) return error_family::declaration;
  if (e <= errc::unexpected_bindings) return error_family::orchestration;
  return error_family::backend;
}

bool is_cancellation(const std::exception_ptr& error) noexcept {
  if (!error) return false;
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return e.kind() == errc::cancelled;
  } catch (...) {
    return false;
  }
}

namespace {
std::string compose(const ErrorContext& c, errc kind, const std::string& detail) {
  std::string out;
  if (!c.file.empty()) fmt::format_to(std::back_inserter(out), "{}: ", c.file);
  if (!c.parameter.empty()) fmt::format_to(std::back_inserter(out), "parameter '{}': ", c.parameter);
  if (!c.tensor.empty()) fmt::format_to(std::back_inserter(out), "tensor '{}': ", c.tensor);
  if (c.offset) fmt::format_to(std::back_inserter(out), "at offset {}: ", *c.offset);
  fmt::format_to(std::back_inserter(out), "{} [{}]", detail, errc_name(kind));
  if (c.os_error) fmt::format_to(std::back_inserter(out), " ({})", c.os_error.message());
  return out;
}
}  // namespace

Error::Error(errc kind, ErrorContext context, const std::string& detail)
    : std::system_error(make_error_code(kind)),
      context_(std::move(context)),
      detail_(detail),
      // Names come from files: what() must print as one safe line (see printable.hpp).
      message_(printable(compose(context_, kind, detail_))) {}

}  // namespace eredu
