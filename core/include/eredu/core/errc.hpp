#pragma once
/// \file
/// The error kinds of eredu, as a std::error_code enum (category "eredu").
///
/// Every failure eredu reports carries one of these kinds; the accompanying
/// eredu::Error adds the file, tensor and offset it concerns.

#include <system_error>

namespace eredu {

/// Kinds of failure, grouped by layer. Values are stable: they may be logged.
enum class errc {
  // --- checkpoint format: safetensors header (order of the reference parser's checks) ---
  header_too_small = 1,   ///< file shorter than the 8-byte length prefix
  header_too_large,       ///< header length above 100,000,000 bytes
  invalid_header_length,  ///< 8 + header length overflows or exceeds the file size
  invalid_header_utf8,    ///< header bytes are not valid UTF-8
  invalid_header_json,    ///< header is not strict JSON (syntax, trailing bytes, nesting)
  header_not_object,      ///< header JSON is valid but its top level is not an object
  invalid_tensor_entry,   ///< a tensor's value is not an object
  missing_field,          ///< a tensor lacks dtype, shape or data_offsets
  duplicate_field,        ///< a tensor or the header repeats a field
  unknown_dtype,          ///< dtype is not one of the 22 known names
  invalid_shape,          ///< shape is not an array of non-negative integers < 2^64
  invalid_data_offsets,   ///< data_offsets is not an array of exactly two u64 integers
  invalid_metadata,       ///< __metadata__ is not null or a string-to-string object
  duplicate_tensor,       ///< the same tensor name appears twice
  invalid_offset,         ///< data_offsets leave a gap, overlap, or run backwards
  size_overflow,          ///< elements or bytes overflow 64 bits
  misaligned_slice,       ///< a sub-byte dtype whose bit count is not a whole byte
  tensor_size_mismatch,   ///< end - begin differs from elements x dtype bits / 8
  incomplete_data,        ///< data does not end exactly at end of file
  // --- checkpoint format: sharded index and file discovery ---
  invalid_index,              ///< model.safetensors.index.json is malformed
  shard_missing,              ///< a shard named by the index does not exist
  tensor_missing_from_shard,  ///< the index maps a tensor to a shard that lacks it
  tensor_in_two_shards,       ///< a tensor appears in two shards
  tensor_not_in_index,        ///< a shard holds a tensor the index does not list
  unknown_format,             ///< no checkpoint format recognises the file
  // --- reading ---
  tensor_not_found,       ///< a request names a tensor the catalog lacks
  invalid_selection,      ///< a selection's rank or ranges do not fit the tensor
  exceeds_budget,         ///< a RequireBounded request is larger than the lease pool
  io_error,               ///< the operating system failed a read (errno in the message)
  unexpected_eof,         ///< the file ended before the tensor's bytes (truncated)
  file_changed,           ///< the file's size, mtime or ctime changed since it was opened
  direct_io_unsupported,  ///< --direct on, but the file system refuses O_DIRECT
  uring_unavailable,      ///< io_uring was requested but cannot be set up
  cancelled,              ///< the operation was cancelled or its owner destroyed
  invalid_argument,       ///< an option or argument is out of range
  // --- recipes (RecipeError): rejected by metadata inference, before any read ---
  recipe_unknown_key,        ///< a source names a tensor the checkpoint lacks
  recipe_invalid_selection,  ///< a source's selection does not fit its tensor
  recipe_rank_mismatch,      ///< inputs of different rank, or a permutation of the wrong length
  recipe_shape_mismatch,     ///< concat inputs disagree off the concat dim, reshape changes the size
  recipe_bad_dim,            ///< a dim or range outside the input's shape, or not a permutation
  recipe_dtype_mismatch,     ///< concat inputs of different dtypes
  recipe_unsupported_cast,   ///< a cast between dtypes no backend converts
  recipe_sub_byte_layout,    ///< slice/concat/permute of a dtype narrower than a byte
  // --- binding declarations (the seed's ResidencyDeclarationError) ---
  invalid_parameter_id,  ///< a binding name is not a valid dotted parameter identity
  duplicate_binding,     ///< two bindings target the same parameter
  alias_unknown_owner,   ///< an alias names an owner that is not a binding
  alias_chain,           ///< an alias names another alias
  byte_mismatch,         ///< declared bytes differ from what the recipe produces
  // --- binding a materialized unit (ParameterOrchestrationError) ---
  missing_binding,      ///< a module parameter has no materialized value
  unexpected_bindings,  ///< materialized values name no parameter of the module
  // --- backends ---
  bind_shape_mismatch,  ///< a weight's shape differs from its parameter's
  bind_dtype_mismatch,  ///< a weight's dtype differs from its parameter's
  out_of_memory,        ///< the backend could not allocate tensor storage
  backend_failure,      ///< any other backend operation failed
  // --- later additions (values stay stable; families as noted) ---
  checksum_mismatch,  ///< store: a tensor's bytes differ from their recorded checksum
  canary_failed,      ///< orchestration: a new version failed the caller's canary check
  swap_in_progress,   ///< orchestration: a slot is already swapping to another version
  outside_root,       ///< format: a checkpoint file resolves outside CatalogOptions::confine_to
  collective_error,   ///< collective: a collective failed, timed out, or its group is unusable
  rank_failed,        ///< collective: a rank of the group failed its part of a group decision (a vote)
  // --- later additions: GGUF and quantized blocks (families as noted) ---
  bad_magic,            ///< format: GGUF: the file does not start with the magic bytes "GGUF"
  unsupported_version,  ///< format: GGUF: a version other than 2 or 3 (v1 is refused, as ggml does)
  invalid_count,     ///< format: GGUF: a tensor, key-value or array count that is negative or more than the file holds
  truncated_header,  ///< format: GGUF: a key, value, string or tensor info runs past the end of the file
  invalid_key,       ///< format: GGUF: an empty key
  duplicate_key,     ///< format: GGUF: a key given twice
  invalid_value_type,   ///< format: GGUF: a value type outside 0-12, or an array of arrays
  invalid_alignment,    ///< format: GGUF: general.alignment is not a UINT32 non-zero power of two
  invalid_tensor_name,  ///< format: GGUF: a tensor name of 64 bytes or more, or holding a NUL byte
  partial_block,        ///< format: a quantized tensor whose rows are not a whole number of blocks
  split_mismatch,       ///< format: split GGUF: the files disagree on split.count, split.no or split.tensors.count
  recipe_cuts_block,    ///< recipe: recipe: a selection, slice, concat, permute or reshape that would cut a quantized
                        ///< block
  // --- later additions: the process's limits ---
  resource_exhausted,  ///< backend: the system refused a thread, file descriptor or other per-process resource
  // --- later additions: remote sources (HTTP/S, S3); family store ---
  access_denied,      ///< store: the server refused the credentials or the request (HTTP 401/403, S3 AccessDenied)
  remote_not_found,   ///< store: the server has no such object or bucket (HTTP 404, S3 NoSuchKey/NoSuchBucket)
  range_unsupported,  ///< store: the server answered a ranged GET with the whole object (it ignores Range)
  tls_error,          ///< store: the TLS handshake or the server's certificate failed verification
  remote_error,       ///< store: any other HTTP status, or a transport failure still failing after the retries
  timed_out,          ///< store: a connection or a stalled transfer passed its time limit, after the retries
  // --- later additions: live updates from a publisher; family store ---
  version_not_published,  ///< store: the publisher offers no such version (or none yet)
  version_withdrawn,      ///< store: the publisher withdrew the version before this rank was done with it
};

/// The layer a kind belongs to: which of the seed's error types it realises.
enum class error_family {
  format,         ///< checkpoint format (safetensors header, sharded index, GGUF, split GGUF)
  store,          ///< reading (the seed's StoreError)
  recipe,         ///< recipe validation (RecipeError)
  declaration,    ///< binding declarations (ResidencyDeclarationError)
  orchestration,  ///< materialize/bind orchestration (ParameterOrchestrationError)
  backend,        ///< backend-native failure (ParameterOrchestrationError::Backend)
  collective,     ///< across ranks: collectives and group decisions (CollectiveError)
};

/// Family of a kind.
error_family errc_family(errc e) noexcept;

/// The category of eredu::errc values.
const std::error_category& error_category() noexcept;

/// Makes an error_code of the eredu category.
inline std::error_code make_error_code(errc e) noexcept { return {static_cast<int>(e), error_category()}; }

/// Short stable identifier of a kind ("invalid_offset"); used in JSON output.
const char* errc_name(errc e) noexcept;

}  // namespace eredu

template <>
struct std::is_error_code_enum<eredu::errc> : std::true_type {};
