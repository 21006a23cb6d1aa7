#pragma once
/// \file
/// eredu::Error: a typed error (an errc kind) with a message that names what failed.

#include <cstdint>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>

#include "eredu/core/errc.hpp"

namespace eredu {

/// Where an error happened: every field that is known is named in the message.
///
/// Every field has a default member initializer, so `{.tensor = name}` leaves the others empty
/// without a -Wmissing-field-initializers warning in a user's -Wextra build (g++ warns on
/// omitted designated fields only where the field has no initializer of its own).
struct ErrorContext {
  std::string file{};                     ///< path of the file concerned, if any
  std::string parameter{};                ///< runtime parameter identity concerned, if any
  std::string tensor{};                   ///< tensor name concerned, if any
  std::optional<std::uint64_t> offset{};  ///< absolute byte offset in the file, if any
  std::error_code os_error{};             ///< errno-based cause for I/O errors, if any
};

/// Exception thrown (or carried in std::exception_ptr by async operations) for every
/// eredu failure. code() is the kind; what() reads
/// "<file>: parameter '<id>': tensor '<name>': at offset <n>: <detail> [<kind>] (<os error>)" with the
/// unknown parts left out.
class Error : public std::system_error {
 public:
  /// Builds the message from the context and a detail sentence.
  Error(errc kind, ErrorContext context, const std::string& detail);

  /// The kind of failure.
  errc kind() const noexcept { return static_cast<errc>(code().value()); }
  /// The layer the kind belongs to.
  error_family family() const noexcept { return errc_family(kind()); }
  /// File, tensor and offset the failure concerns.
  const ErrorContext& context() const noexcept { return context_; }
  /// The detail sentence without the context prefix.
  const std::string& detail() const noexcept { return detail_; }
  /// The whole message (std::system_error would append the category text again).
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  ErrorContext context_;
  std::string detail_;
  std::string message_;
};

/// True when `error` holds an eredu::Error of kind errc::cancelled (work stopped because of
/// another failure, or its owner went away): a consequence, not a root cause.
bool is_cancellation(const std::exception_ptr& error) noexcept;

/// A backend-native failure (allocation, shape/dtype refusal at bind, device errors).
class BackendError : public Error {
 public:
  using Error::Error;
};

}  // namespace eredu
