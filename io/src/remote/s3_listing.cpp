// list_objects, apart from the rest of S3 because it is the one part that needs the HTTP client
// (a program that only signs does not link libcurl's driver).
#include <fmt/format.h>

#include <algorithm>

#include "eredu/core/error.hpp"
#include "eredu/io/remote/http_client.hpp"
#include "eredu/io/remote/s3.hpp"

namespace eredu::io {

std::vector<S3Object> list_objects(HttpClient& client, const S3Endpoint& endpoint, std::string_view prefix) {
  std::vector<S3Object> objects;
  std::string token;
  for (;;) {
    const std::string url = endpoint.list_url(prefix, token);
    const std::string shown = redacted(parse_remote_url(url));
    DocumentResult page = client.get_blocking(DocumentGet{.url = url, .signer = endpoint.signer()});
    auto [found, next] = parse_list_objects(page.body, shown);
    objects.insert(objects.end(), std::make_move_iterator(found.begin()), std::make_move_iterator(found.end()));
    if (next.empty()) break;
    // A server that hands back the token it was given would list forever.
    if (next == token)
      throw Error(errc::remote_error, {.file = shown}, "the S3 listing repeats its continuation token");
    token = std::move(next);
  }
  std::stable_sort(objects.begin(), objects.end(), [](const S3Object& a, const S3Object& b) { return a.key < b.key; });
  return objects;
}

}  // namespace eredu::io
