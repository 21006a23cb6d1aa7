#pragma once
/// \file
/// S3: credentials found as AWS's tools find them, SigV4 signing, `s3://` to request URLs,
/// and listing a prefix (ListObjectsV2).

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "eredu/io/remote/remote_options.hpp"
#include "eredu/io/remote/remote_url.hpp"
#include "eredu/io/remote/request_signer.hpp"

namespace eredu::io {

class HttpClient;

/// AWS credentials; empty access_key_id: anonymous (requests go unsigned).
struct AwsCredentials {
  std::string access_key_id{};      ///< AWS_ACCESS_KEY_ID / aws_access_key_id
  std::string secret_access_key{};  ///< AWS_SECRET_ACCESS_KEY / aws_secret_access_key; never printed
  std::string session_token{};      ///< AWS_SESSION_TOKEN / aws_session_token (temporary credentials)
  std::string source{};             ///< where they were found ("environment", "~/.aws/credentials [prod]")
  /// True when none were found (or S3Options::anonymous): requests go unsigned.
  bool anonymous() const noexcept { return access_key_id.empty(); }
};

/// Finds credentials as the AWS CLI does, first match wins: S3Options::anonymous; the
/// environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN); the profile
/// (S3Options::profile, else $AWS_PROFILE, else `default`) of $AWS_SHARED_CREDENTIALS_FILE or
/// ~/.aws/credentials; else anonymous. A profile named explicitly that does not exist, or a
/// half-given pair, is Error(access_denied) saying which.
AwsCredentials find_credentials(const S3Options& options);

/// The region requests are signed for (S3Options::region's rules).
std::string find_region(const S3Options& options);

/// Signs S3 requests with AWS Signature Version 4 (header-based: Authorization, x-amz-date,
/// x-amz-content-sha256 of the empty body, x-amz-security-token for temporary credentials).
/// Signs host and the x-amz-* headers it adds.
class SigV4Signer final : public RequestSigner {
 public:
  /// Signs for `region` and `service` ("s3").
  SigV4Signer(AwsCredentials credentials, std::string region, std::string service = "s3");
  HttpHeaders sign(std::string_view method, std::string_view url) const override;
  /// sign() at a given time (tests compare with botocore for a fixed time).
  HttpHeaders sign_at(std::string_view method, std::string_view url, std::chrono::system_clock::time_point when) const;

 private:
  AwsCredentials credentials_;
  std::string region_;
  std::string service_;
};

/// Where requests for one bucket go, and how they are signed.
class S3Endpoint {
 public:
  /// Resolves region, endpoint, addressing and credentials for `bucket` (S3Options' rules).
  S3Endpoint(std::string bucket, const S3Options& options);
  /// The https (or the endpoint's http) URL of `key`: each path segment percent-encoded as SigV4
  /// wants (unreserved characters kept, `/` kept between segments).
  std::string object_url(std::string_view key) const;
  /// The URL of ListObjectsV2 for `prefix`, continuing after `continuation` when not empty.
  std::string list_url(std::string_view prefix, std::string_view continuation = {}) const;
  /// The signer for its requests; null when anonymous.
  const RequestSigner* signer() const noexcept;
  /// The bucket.
  const std::string& bucket() const noexcept { return bucket_; }
  /// Where the credentials came from ("anonymous" when none), for logs.
  std::string_view credentials_source() const noexcept;

 private:
  std::string bucket_;
  std::string base_;  // scheme://host[:port][/bucket] before the key
  std::optional<SigV4Signer> signer_;
  std::string source_;
};

/// One object of a listing.
struct S3Object {
  std::string key{};       ///< full key
  std::uint64_t size = 0;  ///< bytes
  std::string etag{};      ///< ETag (quotes kept)
};

/// Every object under `prefix` (ListObjectsV2, following continuation tokens), in key order.
/// Errors as HttpClient's; a body that is not a ListBucketResult is remote_error.
std::vector<S3Object> list_objects(HttpClient& client, const S3Endpoint& endpoint, std::string_view prefix);

/// Parses one ListObjectsV2 response body: its objects and its NextContinuationToken (empty when
/// the listing is complete). Throws Error(remote_error) naming `url` for a body that is not one.
std::pair<std::vector<S3Object>, std::string> parse_list_objects(std::string_view xml, std::string_view url);

}  // namespace eredu::io
