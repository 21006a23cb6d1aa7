// S3: credentials and region found as the AWS tools find them, request URLs for both addressing
// styles, SigV4 signatures compared with botocore's (AWS's own signer), ListObjectsV2 bodies, and
// signed requests against s3rver behind a front that re-verifies every signature with botocore:
// with the curl program (the signer's headers alone, nothing of eredu's transport) and through
// HttpClient and list_objects.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "eredu/core/error.hpp"
#include "eredu/io/remote/http_client.hpp"
#include "eredu/io/remote/remote_options.hpp"
#include "eredu/io/remote/s3.hpp"
#include "support/error_kind.hpp"
#include "support/server_process.hpp"
#include "support/temp_dir.hpp"

using namespace eredu;
using namespace eredu::io;
using eredu::test::kind_of;
using eredu::test::ServerProcess;
using eredu::test::TempDir;

namespace {

// Every variable find_credentials, find_region and S3Endpoint read: unset for the test's
// duration (a developer's own AWS setup must not leak in), restored after.
class AwsEnvironment {
 public:
  AwsEnvironment() {
    for (const char* name : kNames) {
      if (const char* v = std::getenv(name)) saved_[name] = v;
      ::unsetenv(name);
    }
    // No ~/.aws of the developer's: HOME points at an empty directory unless a test sets it.
    ::setenv("HOME", home_.path().c_str(), 1);
  }
  ~AwsEnvironment() {
    for (const char* name : kNames) {
      if (auto it = saved_.find(name); it != saved_.end()) {
        ::setenv(name, it->second.c_str(), 1);
      } else {
        ::unsetenv(name);
      }
    }
  }
  AwsEnvironment(const AwsEnvironment&) = delete;
  AwsEnvironment& operator=(const AwsEnvironment&) = delete;

  void set(const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); }
  /// The empty HOME directory.
  const std::filesystem::path& home() const { return home_.path(); }

 private:
  static constexpr const char* kNames[] = {"AWS_ACCESS_KEY_ID",
                                           "AWS_SECRET_ACCESS_KEY",
                                           "AWS_SESSION_TOKEN",
                                           "AWS_PROFILE",
                                           "AWS_SHARED_CREDENTIALS_FILE",
                                           "AWS_CONFIG_FILE",
                                           "AWS_REGION",
                                           "AWS_DEFAULT_REGION",
                                           "AWS_ENDPOINT_URL",
                                           "AWS_ENDPOINT_URL_S3",
                                           "HOME"};
  std::map<std::string, std::string> saved_;
  TempDir home_;
};

void write_file(const std::filesystem::path& path, std::string_view text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The message of the eredu::Error `f` throws ("" when it does not).
template <typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

// Runs argv (looked up in PATH) with `input` on its stdin; its exit status and stdout.
struct Ran {
  int status = -1;
  std::string out;
};
Ran run(std::vector<std::string> argv, const std::string& input = {}) {
  TempDir dir;
  write_file(dir / "in", input);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, (dir / "in").c_str(), O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, (dir / "out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  Ran ran;
  if (rc != 0) return ran;
  int status = 0;
  ::waitpid(pid, &status, 0);
  ran.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  ran.out = read_file(dir / "out");
  return ran;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::string header_text(const HttpHeaders& headers) {
  std::string out;
  for (const auto& [name, value] : headers) out += name + ": " + value + "\n";
  return out;
}

std::chrono::system_clock::time_point at(int year, int month, int day, int hour, int minute, int second) {
  std::tm tm{};
  tm.tm_year = year - 1900;
  tm.tm_mon = month - 1;
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = minute;
  tm.tm_sec = second;
  return std::chrono::system_clock::from_time_t(::timegm(&tm));
}

}  // namespace

TEST_CASE("find_credentials reads the environment first", "[s3][credentials]") {
  AwsEnvironment env;
  write_file(env.home() / ".aws" / "credentials",
             "[default]\naws_access_key_id = FILEKEY\naws_secret_access_key = filesecret\n");
  env.set("AWS_ACCESS_KEY_ID", "AKIDENV");
  env.set("AWS_SECRET_ACCESS_KEY", "envsecret");
  env.set("AWS_SESSION_TOKEN", "envtoken");
  AwsCredentials c = find_credentials({});
  CHECK(c.access_key_id == "AKIDENV");
  CHECK(c.secret_access_key == "envsecret");
  CHECK(c.session_token == "envtoken");
  CHECK(c.source == "environment");
  CHECK_FALSE(c.anonymous());

  // S3Options::anonymous wins over everything found.
  CHECK(find_credentials({.anonymous = true}).anonymous());

  // Half a pair is an error that says which half, never the value of the other.
  ::unsetenv("AWS_SECRET_ACCESS_KEY");
  const std::string why = message_of([] { find_credentials({}); });
  CHECK(kind_of([] { find_credentials({}); }) == errc::access_denied);
  CHECK(why.find("AWS_SECRET_ACCESS_KEY") != std::string::npos);
  CHECK(why.find("AKIDENV") == std::string::npos);
  ::unsetenv("AWS_ACCESS_KEY_ID");
  env.set("AWS_SECRET_ACCESS_KEY", "envsecret");
  CHECK(kind_of([] { find_credentials({}); }) == errc::access_denied);
  CHECK(message_of([] { find_credentials({}); }).find("envsecret") == std::string::npos);
}

TEST_CASE("find_credentials reads the profile of the shared credentials file", "[s3][credentials]") {
  AwsEnvironment env;
  const std::string text =
      "# a comment\n"
      "; another\n"
      "[default]\n"
      "aws_access_key_id=DEFAULTKEY\n"
      "aws_secret_access_key = default/secret+with=chars#x\n"
      "\n"
      "[prod]\n"
      "  aws_access_key_id   =   PRODKEY   ; inline comment\n"
      "aws_secret_access_key = prodsecret\n"
      "aws_session_token = prodtoken\n"
      "[half]\n"
      "aws_access_key_id = HALF\n"
      "[roleonly]\n"
      "role_arn = arn:aws:iam::1:role/x\n";

  SECTION("in ~/.aws/credentials, profile default") {
    write_file(env.home() / ".aws" / "credentials", text);
    const AwsCredentials c = find_credentials({});
    CHECK(c.access_key_id == "DEFAULTKEY");
    CHECK(c.secret_access_key == "default/secret+with=chars#x");
    CHECK(c.session_token.empty());
    CHECK(c.source == (env.home() / ".aws" / "credentials").string() + " [default]");
  }
  SECTION("in $AWS_SHARED_CREDENTIALS_FILE, profile from $AWS_PROFILE, then from the options") {
    TempDir dir;
    write_file(dir / "creds", text);
    write_file(env.home() / ".aws" / "credentials", "[prod]\naws_access_key_id = NOTTHIS\naws_secret_access_key = x\n");
    env.set("AWS_SHARED_CREDENTIALS_FILE", (dir / "creds").string());
    env.set("AWS_PROFILE", "prod");
    AwsCredentials c = find_credentials({});
    CHECK(c.access_key_id == "PRODKEY");
    CHECK(c.secret_access_key == "prodsecret");
    CHECK(c.session_token == "prodtoken");
    CHECK(c.source == (dir / "creds").string() + " [prod]");
    c = find_credentials({.profile = "default"});
    CHECK(c.access_key_id == "DEFAULTKEY");
    // `~/` in the variable is the home directory, as the AWS CLI reads it.
    write_file(env.home() / "elsewhere" / "creds", text);
    env.set("AWS_SHARED_CREDENTIALS_FILE", "~/elsewhere/creds");
    CHECK(find_credentials({}).source == (env.home() / "elsewhere" / "creds").string() + " [prod]");
  }
  SECTION("a profile named but missing is access_denied naming it and the file") {
    TempDir dir;
    write_file(dir / "creds", text);
    env.set("AWS_SHARED_CREDENTIALS_FILE", (dir / "creds").string());
    const auto missing = [] { find_credentials({.profile = "staging"}); };
    CHECK(kind_of(missing) == errc::access_denied);
    const std::string why = message_of(missing);
    CHECK(why.find("'staging'") != std::string::npos);
    CHECK(why.find((dir / "creds").string()) != std::string::npos);
    env.set("AWS_PROFILE", "staging");
    CHECK(kind_of([] { find_credentials({}); }) == errc::access_denied);
    // A half pair, and a profile without static keys, are refused too, without any secret shown.
    CHECK(kind_of([] { find_credentials({.profile = "half"}); }) == errc::access_denied);
    CHECK(message_of([] { find_credentials({.profile = "half"}); }).find("aws_secret_access_key") != std::string::npos);
    CHECK(kind_of([] { find_credentials({.profile = "roleonly"}); }) == errc::access_denied);
    CHECK(message_of([] { find_credentials({.profile = "prod"}); }).empty());
  }
  SECTION("keys written in the config file's [profile NAME]") {
    write_file(env.home() / ".aws" / "config",
               "[profile cfg]\naws_access_key_id = CFGKEY\naws_secret_access_key = s\n");
    const AwsCredentials c = find_credentials({.profile = "cfg"});
    CHECK(c.access_key_id == "CFGKEY");
    CHECK(c.source == (env.home() / ".aws" / "config").string() + " [cfg]");
  }
  SECTION("nothing anywhere: anonymous") {
    const AwsCredentials c = find_credentials({});
    CHECK(c.anonymous());
    CHECK(c.source == "anonymous");
    // A default profile that is absent from an existing file is not an error either.
    write_file(env.home() / ".aws" / "credentials", "[prod]\naws_access_key_id = P\naws_secret_access_key = s\n");
    CHECK(find_credentials({}).anonymous());
  }
}

TEST_CASE("find_region: options, environment, the profile's config, us-east-1", "[s3][region]") {
  AwsEnvironment env;
  CHECK(find_region({}) == "us-east-1");
  write_file(env.home() / ".aws" / "config",
             "[default]\nregion = eu-north-1\n[profile prod]\nregion = ap-south-1 # comment\n[prod]\nregion = wrong\n");
  CHECK(find_region({}) == "eu-north-1");
  CHECK(find_region({.profile = "prod"}) == "ap-south-1");
  env.set("AWS_PROFILE", "prod");
  CHECK(find_region({}) == "ap-south-1");
  TempDir dir;
  write_file(dir / "config", "[profile prod]\nregion = sa-east-1\n");
  env.set("AWS_CONFIG_FILE", (dir / "config").string());
  CHECK(find_region({}) == "sa-east-1");
  CHECK(find_region({.profile = "nosuch"}) == "us-east-1");
  env.set("AWS_DEFAULT_REGION", "us-west-1");
  CHECK(find_region({}) == "us-west-1");
  env.set("AWS_REGION", "us-west-2");
  CHECK(find_region({}) == "us-west-2");
  CHECK(find_region({.region = "eu-central-1"}) == "eu-central-1");
}

TEST_CASE("S3Endpoint builds object and listing URLs for both addressing styles", "[s3][endpoint]") {
  AwsEnvironment env;
  SECTION("AWS, automatic: virtual-host for a DNS-compatible bucket, path for one with dots") {
    const S3Endpoint e("my-bucket", {.region = "eu-west-1"});
    CHECK(e.object_url("shards/model-00001.safetensors") ==
          "https://my-bucket.s3.eu-west-1.amazonaws.com/shards/model-00001.safetensors");
    CHECK(e.object_url("a b/c+d=e~f/é.bin") ==
          "https://my-bucket.s3.eu-west-1.amazonaws.com/a%20b/c%2Bd%3De~f/%C3%A9.bin");
    CHECK(e.list_url("models/llama 3/") ==
          "https://my-bucket.s3.eu-west-1.amazonaws.com/?list-type=2&prefix=models%2Fllama%203%2F");
    CHECK(e.list_url("m/", "1Hx7+Gg/NS==") ==
          "https://my-bucket.s3.eu-west-1.amazonaws.com/"
          "?continuation-token=1Hx7%2BGg%2FNS%3D%3D&list-type=2&prefix=m%2F");
    CHECK(e.signer() == nullptr);
    CHECK(e.credentials_source() == "anonymous");
    CHECK(e.bucket() == "my-bucket");

    const S3Endpoint dotted("my.bucket", {.region = "eu-west-1"});
    CHECK(dotted.object_url("k") == "https://s3.eu-west-1.amazonaws.com/my.bucket/k");
    CHECK(S3Endpoint("Upper_Case", {}).object_url("k") == "https://s3.us-east-1.amazonaws.com/Upper_Case/k");
    CHECK(S3Endpoint("my-bucket", {.addressing = S3Options::Addressing::path}).list_url("") ==
          "https://s3.us-east-1.amazonaws.com/my-bucket/?list-type=2");
  }
  SECTION("a custom endpoint: path style unless told, from the options or the environment") {
    const S3Endpoint minio("models", {.endpoint = "http://127.0.0.1:9000/"});
    CHECK(minio.object_url("x/y.bin") == "http://127.0.0.1:9000/models/x/y.bin");
    const S3Endpoint vhost(
        "models", {.endpoint = "https://storage.example:8443", .addressing = S3Options::Addressing::virtual_host});
    CHECK(vhost.object_url("x") == "https://models.storage.example:8443/x");
    env.set("AWS_ENDPOINT_URL", "http://general.example");
    CHECK(S3Endpoint("b-1", {}).object_url("k") == "http://general.example/b-1/k");
    env.set("AWS_ENDPOINT_URL_S3", "https://r2.example");
    CHECK(S3Endpoint("b-1", {}).object_url("k") == "https://r2.example/b-1/k");
    CHECK(S3Endpoint("b-1", {.endpoint = "https://gcs.example"}).object_url("k") == "https://gcs.example/b-1/k");
  }
  SECTION("refusals") {
    CHECK(kind_of([] { S3Endpoint("my.bucket", {.addressing = S3Options::Addressing::virtual_host}); }) ==
          errc::invalid_argument);
    CHECK(kind_of([] { S3Endpoint("b", {.endpoint = "ftp://x"}); }) == errc::invalid_argument);
    CHECK(kind_of([] { S3Endpoint("b", {.endpoint = "https://user:pw@x"}); }) == errc::invalid_argument);
    CHECK(message_of([] { S3Endpoint("b", {.endpoint = "https://user:pw@x"}); }).find("pw") == std::string::npos);
    CHECK(kind_of([] { S3Endpoint("", {}); }) == errc::invalid_argument);
  }
  SECTION("credentials make a signer") {
    env.set("AWS_ACCESS_KEY_ID", "AK");
    env.set("AWS_SECRET_ACCESS_KEY", "SK");
    const S3Endpoint e("my-bucket", {});
    REQUIRE(e.signer() != nullptr);
    CHECK(e.credentials_source() == "environment");
    CHECK(S3Endpoint("my-bucket", {.anonymous = true}).signer() == nullptr);
  }
}

TEST_CASE("SigV4Signer signs as botocore does", "[s3][sigv4]") {
  if (!std::filesystem::exists("/usr/bin/python3") ||
      run({"/usr/bin/python3", "-c", "import botocore.auth"}).status != 0) {
    WARN("botocore (python3-botocore) is not installed: SigV4 is not compared with AWS's signer");
    return;
  }
  AwsEnvironment env;
  // Signs each tab-separated line (key, secret, token, region, time, method, URL) with botocore's
  // S3SigV4Auth at that time; prints the headers it adds, one request per line.
  static constexpr const char* kScript = R"(
import sys, datetime, types
import botocore.auth as A
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
T = None
class Fixed(datetime.datetime):  # botocore reads the clock through utcnow() or get_current_datetime()
    @classmethod
    def utcnow(cls):
        return T
A.datetime = types.SimpleNamespace(datetime=Fixed, timezone=datetime.timezone, timedelta=datetime.timedelta)
A.get_current_datetime = lambda *a, **k: T
for line in sys.stdin.read().splitlines():
    key, secret, token, region, when, method, url = line.split("\t")
    T = datetime.datetime.strptime(when, "%Y%m%dT%H%M%SZ")
    r = AWSRequest(method=method, url=url)
    A.S3SigV4Auth(Credentials(key, secret, token or None), "s3", region).add_auth(r)
    out = []
    for n in ("X-Amz-Date", "X-Amz-Content-SHA256", "X-Amz-Security-Token", "Authorization"):
        if n in r.headers:
            out.append(n.lower() + ": " + r.headers[n])
    print("|".join(out))
)";
  struct Case {
    AwsCredentials credentials;
    std::string region;
    std::string method;
    std::string url;
  };
  const AwsCredentials plain{.access_key_id = "AKIDEXAMPLE",
                             .secret_access_key = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"};
  AwsCredentials temporary = plain;
  temporary.session_token = "IQoJb3JpZ2luX2VjEJr//////////wEaCXVzLWVhc3QtMSJHMEUCIQ+token=";
  const S3Endpoint aws("my-bucket", {.region = "eu-west-1"});
  const S3Endpoint minio("models", {.endpoint = "http://127.0.0.1:9000"});
  const S3Endpoint tls_port("models", {.endpoint = "https://minio.example:9443"});
  const S3Endpoint default_port("models", {.endpoint = "https://minio.example:443"});
  const std::vector<Case> cases{
      {plain, "eu-west-1", "GET", aws.object_url("shards/model-00001-of-00002.safetensors")},
      {temporary, "eu-west-1", "GET", aws.object_url("a b/c+d=e~f/ünïcödé €.bin")},
      {plain, "us-east-1", "GET", minio.object_url("nested/deeper/still/x y+z=w~.safetensors")},
      {temporary, "us-east-1", "HEAD", minio.object_url("k")},
      {plain, "us-east-1", "GET", tls_port.object_url("k/é")},
      {plain, "us-east-1", "GET", default_port.object_url("k")},
      {plain, "eu-west-1", "GET", aws.list_url("models/llama 3/")},
      {temporary, "eu-west-1", "GET", aws.list_url("m/", "1Hx7+Gg/NSlkj==")},
      {plain, "us-east-1", "GET", minio.list_url("a+b=c ~/", "tok/+=")},
      {plain, "us-east-1", "GET", "https://s3.amazonaws.com/"},
  };
  const auto when = at(2026, 12, 4, 12, 34, 56);
  std::string input;
  for (const auto& c : cases) {
    input += c.credentials.access_key_id + "\t" + c.credentials.secret_access_key + "\t" + c.credentials.session_token +
             "\t" + c.region + "\t20261204T123456Z\t" + c.method + "\t" + c.url + "\n";
  }
  const Ran ran = run({"/usr/bin/python3", "-c", kScript}, input);
  REQUIRE(ran.status == 0);
  const auto expected = lines_of(ran.out);
  REQUIRE(expected.size() == cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    INFO(cases[i].method << " " << cases[i].url);
    const SigV4Signer signer(cases[i].credentials, cases[i].region);
    std::string mine;
    for (const auto& [name, value] : signer.sign_at(cases[i].method, cases[i].url, when)) {
      if (!mine.empty()) mine += "|";
      mine += name + ": " + value;
    }
    CHECK(mine == expected[i]);
  }
  // The date is the time's, and sign() uses now.
  const HttpHeaders now = SigV4Signer(plain, "us-east-1").sign("GET", minio.object_url("k"));
  REQUIRE(now.size() == 3);
  CHECK(now[0].first == "x-amz-date");
  CHECK(now[0].second.size() == 16);
  // A secret never appears in what is sent.
  CHECK(header_text(now).find(plain.secret_access_key) == std::string::npos);
}

TEST_CASE("parse_list_objects reads ListObjectsV2 bodies strictly", "[s3][listing]") {
  const std::string url = "http://127.0.0.1:9000/b/?…";
  SECTION("a complete page, with entities") {
    const auto [objects, next] = parse_list_objects(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
        "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>b</Name><Prefix>m/</Prefix>"
        "<KeyCount>2</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>"
        "<Contents><Key>m/a&amp;b &lt;c&gt; &quot;d&quot; &apos;e&apos; &#233;&#x20AC;.bin</Key>"
        "<LastModified>2026-12-04T12:00:00.000Z</LastModified><ETag>&quot;9dd4e461268c8034f5c8564e155c67a6&quot;</ETag>"
        "<Size>1</Size><StorageClass>STANDARD</StorageClass></Contents>"
        "<Contents><Key>m/model.safetensors</Key><ETag>\"abc-2\"</ETag><Size>21474836480</Size>"
        "<Owner><ID>x</ID></Owner></Contents></ListBucketResult>\n",
        url);
    REQUIRE(objects.size() == 2);
    CHECK(objects[0].key == "m/a&b <c> \"d\" 'e' \xC3\xA9\xE2\x82\xAC.bin");
    CHECK(objects[0].etag == "\"9dd4e461268c8034f5c8564e155c67a6\"");
    CHECK(objects[0].size == 1);
    CHECK(objects[1].key == "m/model.safetensors");
    CHECK(objects[1].size == 21474836480ULL);
    CHECK(objects[1].etag == "\"abc-2\"");
    CHECK(next.empty());
  }
  SECTION("a truncated page gives its continuation token; an empty one gives nothing") {
    const auto [objects, next] = parse_list_objects(
        "<ListBucketResult><IsTruncated>true</IsTruncated><ContinuationToken>old</ContinuationToken>"
        "<NextContinuationToken>1Hx7+Gg/NS&#61;=</NextContinuationToken>"
        "<Contents><Key>k</Key><Size>0</Size></Contents></ListBucketResult>",
        url);
    CHECK(objects.size() == 1);
    CHECK(objects[0].etag.empty());
    CHECK(next == "1Hx7+Gg/NS==");
    const auto empty = parse_list_objects("<ListBucketResult><KeyCount>0</KeyCount></ListBucketResult>", url);
    CHECK(empty.first.empty());
    CHECK(empty.second.empty());
  }
  SECTION("anything else is remote_error naming the URL") {
    const std::vector<std::string> bad{
        "",
        "<html><body>Bad gateway</body></html>",
        "<?xml version=\"1.0\"?><Error><Code>NoSuchBucket</Code><Message>x</Message></Error>",
        "<ListBucketResultX></ListBucketResultX>",
        "<ListBucketResult><Contents><Key>k</Key><Size>1</Size></Contents>",
        "<ListBucketResult><Contents><Size>1</Size></Contents></ListBucketResult>",
        "<ListBucketResult><Contents><Key>k</Key></Contents></ListBucketResult>",
        "<ListBucketResult><Contents><Key>k</Key><Size>-1</Size></Contents></ListBucketResult>",
        "<ListBucketResult><Contents><Key>k</Key><Size>12a</Size></Contents></ListBucketResult>",
        "<ListBucketResult><Contents><Key>k</Key><Size>99999999999999999999999</Size></Contents></ListBucketResult>",
        "<ListBucketResult><Contents><Key>a&nbsp;b</Key><Size>1</Size></Contents></ListBucketResult>",
        "<ListBucketResult><Contents><Key>a&amp b</Key><Size>1</Size></Contents></ListBucketResult>",
        "<ListBucketResult><Contents><Key>a&#0;</Key><Size>1</Size></Contents></ListBucketResult>",
        "<ListBucketResult><Contents><Key>a&#xD800;</Key><Size>1</Size></Contents></ListBucketResult>",
        "<ListBucketResult><Contents><Key><b>k</b></Key><Size>1</Size></Contents></ListBucketResult>",
        "<ListBucketResult><Contents><Key>k</Key><Size>1</Size></ListBucketResult>",
        "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",
        "<ListBucketResult><IsTruncated>yes</IsTruncated></ListBucketResult>",
    };
    for (const auto& body : bad) {
      INFO(body);
      CHECK(kind_of([&] { parse_list_objects(body, url); }) == errc::remote_error);
      CHECK(message_of([&] { parse_list_objects(body, url); }).find(url) != std::string::npos);
    }
    CHECK(message_of([&] { parse_list_objects(bad[2], url); }).find("NoSuchBucket") != std::string::npos);
  }
}

namespace {

// The test's credentials: s3rver knows only the access key S3RVER (and checks only it); the
// front checks the secret and the session token's signature.
constexpr const char* kSecret = "eredu/test+secret=~";

// The bucket's objects, as the launcher uploads them from a directory.
struct Objects {
  TempDir root;
  std::map<std::string, std::string> content;  // key -> bytes
  Objects() {
    std::mt19937_64 rng(33);
    auto bytes = [&](std::size_t n) {
      std::string s(n, '\0');
      for (auto& c : s) c = static_cast<char>(rng());
      return s;
    };
    content["shards/model-00001-of-00003.safetensors"] = bytes(300'000);
    content["shards/model-00002-of-00003.safetensors"] = bytes(70'000);
    content["shards/model-00003-of-00003.safetensors"] = bytes(1);
    content["shards/model.safetensors.index.json"] = "{\"weight_map\": {}}";
    content["other/x.bin"] = bytes(10);
    content["odd name+=~é.bin"] = bytes(4096);
    for (const auto& [key, data] : content) write_file(root / key, data);
  }
};

Objects& objects() {
  static Objects o;
  return o;
}

// s3rver behind the verifying front, one per test binary (or per variant), started on first use.
ServerProcess& s3_server(bool allow_anonymous) {
  auto start = [](bool anonymous) {
    std::vector<std::string> argv{"/usr/bin/python3", std::string(EREDU_REMOTE_SERVERS_DIR) + "/s3_server.py",
                                  "--root",           objects().root.path().string(),
                                  "--secret",         kSecret,
                                  "--max-keys",       "2"};
    if (anonymous) argv.push_back("--allow-anonymous");
    return std::make_unique<ServerProcess>(argv);
  };
  if (allow_anonymous) {
    static std::unique_ptr<ServerProcess> lenient = start(true);
    return *lenient;
  }
  static std::unique_ptr<ServerProcess> strict = start(false);
  return *strict;
}

// One request with the curl CLI: signed by `signer` (unless null), optionally ranged.
struct Answer {
  int status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  // lower-case names
  /// The header `name` (lower case), "" when absent.
  std::string header(const std::string& name) const {
    const auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
};
std::optional<Answer> curl(const RequestSigner* signer, const std::string& method, const std::string& url,
                           const std::string& range = {}, const std::vector<std::string>& extra = {}) {
  TempDir dir;
  std::vector<std::string> argv{
      "curl", "-s",          "-S", "--path-as-is", "-o", (dir / "body").string(), "-D", (dir / "head").string(),
      "-w",   "%{http_code}"};
  if (method == "HEAD") {
    argv.push_back("-I");
  } else if (method != "GET") {
    argv.insert(argv.end(), {"-X", method});
  }
  if (signer) {
    for (const auto& [name, value] : signer->sign(method, url)) argv.insert(argv.end(), {"-H", name + ": " + value});
  }
  if (!range.empty()) argv.insert(argv.end(), {"-H", "Range: bytes=" + range});
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.push_back(url);
  const Ran ran = run(argv);
  if (ran.status != 0) return std::nullopt;
  Answer a;
  a.status = std::atoi(ran.out.c_str());
  a.body = read_file(dir / "body");
  for (const std::string& line : lines_of(read_file(dir / "head"))) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::string value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ')) value.erase(0, 1);
    while (!value.empty() && (value.back() == '\r' || value.back() == ' ')) value.pop_back();
    a.headers[name] = value;
  }
  return a;
}

// The server for a test, or null after a warning saying why the test is skipped.
ServerProcess* usable_server(bool allow_anonymous) {
  if (run({"curl", "--version"}).status != 0) {
    WARN("no curl program: the S3 server checks are skipped");
    return nullptr;
  }
  ServerProcess& server = s3_server(allow_anonymous);
  if (!server.skip_reason().empty()) {
    WARN("S3 test server not started: " << server.skip_reason());
    return nullptr;
  }
  return &server;
}

}  // namespace

TEST_CASE("s3rver behind the verifying front: signed requests pass, wrong ones do not", "[s3][server]") {
  ServerProcess* started = usable_server(false);
  if (!started) return;
  ServerProcess& server = *started;
  AwsEnvironment env;
  env.set("AWS_ACCESS_KEY_ID", "S3RVER");
  env.set("AWS_SECRET_ACCESS_KEY", kSecret);
  const S3Endpoint endpoint("eredu-test", {.endpoint = server.url()});
  REQUIRE(endpoint.signer() != nullptr);
  const std::string& model = objects().content["shards/model-00001-of-00003.safetensors"];

  SECTION("a signed ranged GET returns the object's exact bytes and its ETag") {
    const auto a =
        curl(endpoint.signer(), "GET", endpoint.object_url("shards/model-00001-of-00003.safetensors"), "1000-266535");
    REQUIRE(a);
    CHECK(a->status == 206);
    CHECK(a->body == model.substr(1000, 265536));
    CHECK(a->header("content-range") == "bytes 1000-266535/300000");
    CHECK(a->header("etag").size() == 34);
    // One byte (s3rver alone would send the whole object for `bytes=0-0`; the front cuts it).
    const auto first =
        curl(endpoint.signer(), "GET", endpoint.object_url("shards/model-00001-of-00003.safetensors"), "0-0");
    REQUIRE(first);
    CHECK(first->status == 206);
    CHECK(first->body == model.substr(0, 1));
    CHECK(first->header("content-range") == "bytes 0-0/300000");
    // A key with a space, `+`, `=`, `~` and a non-ASCII letter.
    const auto odd = curl(endpoint.signer(), "GET", endpoint.object_url("odd name+=~é.bin"));
    REQUIRE(odd);
    CHECK(odd->status == 200);
    CHECK(odd->body == objects().content["odd name+=~é.bin"]);
    // The ETag pins the object: a stale one is refused (412), the right one passes.
    const auto stale = curl(endpoint.signer(), "GET", endpoint.object_url("shards/model-00001-of-00003.safetensors"),
                            "0-9", {"-H", "If-Match: \"0123456789abcdef0123456789abcdef\""});
    REQUIRE(stale);
    CHECK(stale->status == 412);
    const auto same = curl(endpoint.signer(), "GET", endpoint.object_url("shards/model-00001-of-00003.safetensors"),
                           "0-9", {"-H", "If-Match: " + a->header("etag")});
    REQUIRE(same);
    CHECK(same->status == 206);
    CHECK(same->body == model.substr(0, 10));
  }
  SECTION("virtual-host addressing (BUCKET.localhost resolved to the front)") {
    const std::string port = server.url().substr(server.url().rfind(':') + 1);
    const S3Endpoint vhost("eredu-test",
                           {.endpoint = "http://localhost:" + port, .addressing = S3Options::Addressing::virtual_host});
    const std::string url = vhost.object_url("shards/model-00001-of-00003.safetensors");
    CHECK(url.rfind("http://eredu-test.localhost:" + port + "/", 0) == 0);
    const auto a =
        curl(vhost.signer(), "GET", url, "0-99", {"--resolve", "eredu-test.localhost:" + port + ":127.0.0.1"});
    REQUIRE(a);
    CHECK(a->status == 206);
    CHECK(a->body == model.substr(0, 100));
  }
  SECTION("a session token is signed and sent") {
    env.set("AWS_SESSION_TOKEN", "FwoGZXIvYXdzEJr//token+with/chars=");
    const S3Endpoint temporary("eredu-test", {.endpoint = server.url()});
    const auto a = curl(temporary.signer(), "GET", temporary.object_url("other/x.bin"));
    REQUIRE(a);
    CHECK(a->status == 200);
    CHECK(a->body == objects().content["other/x.bin"]);
  }
  SECTION("a wrong secret, a changed URL and an unsigned request are refused") {
    env.set("AWS_SECRET_ACCESS_KEY", "not-the-secret");
    const S3Endpoint wrong("eredu-test", {.endpoint = server.url()});
    const auto a = curl(wrong.signer(), "GET", wrong.object_url("other/x.bin"));
    REQUIRE(a);
    CHECK(a->status == 403);
    CHECK(a->body.find("<Code>SignatureDoesNotMatch</Code>") != std::string::npos);
    // Signed for one key, sent for another.
    const HttpHeaders headers = endpoint.signer()->sign("GET", endpoint.object_url("other/x.bin"));
    std::vector<std::string> extra;
    for (const auto& [name, value] : headers) extra.insert(extra.end(), {"-H", name + ": " + value});
    const auto moved = curl(nullptr, "GET", endpoint.object_url("odd name+=~é.bin"), {}, extra);
    REQUIRE(moved);
    CHECK(moved->status == 403);
    const auto anonymous = curl(nullptr, "GET", endpoint.object_url("other/x.bin"));
    REQUIRE(anonymous);
    CHECK(anonymous->status == 403);
    CHECK(anonymous->body.find("<Code>AccessDenied</Code>") != std::string::npos);
  }
  SECTION("listing a prefix, page by page (two keys a page), gives the keys, sizes and ETags") {
    std::vector<S3Object> listed;
    std::string token;
    int pages = 0;
    do {
      const std::string url = endpoint.list_url("shards/", token);
      const auto a = curl(endpoint.signer(), "GET", url);
      REQUIRE(a);
      REQUIRE(a->status == 200);
      auto [page, next] = parse_list_objects(a->body, url);
      CHECK(page.size() <= 2);
      listed.insert(listed.end(), page.begin(), page.end());
      token = next;
      ++pages;
    } while (!token.empty() && pages < 10);
    CHECK(pages == 2);
    std::vector<std::string> keys;
    for (const auto& o : listed) {
      keys.push_back(o.key);
      CHECK(o.size == objects().content[o.key].size());
      const auto head = curl(endpoint.signer(), "HEAD", endpoint.object_url(o.key));
      REQUIRE(head);
      CHECK(head->status == 200);
      CHECK(o.etag == head->header("etag"));
    }
    CHECK(keys ==
          std::vector<std::string>{"shards/model-00001-of-00003.safetensors", "shards/model-00002-of-00003.safetensors",
                                   "shards/model-00003-of-00003.safetensors", "shards/model.safetensors.index.json"});
  }
}

TEST_CASE("s3rver behind the front with --allow-anonymous serves unsigned requests", "[s3][server]") {
  ServerProcess* started = usable_server(true);
  if (!started) return;
  ServerProcess& server = *started;
  AwsEnvironment env;
  const S3Endpoint endpoint("eredu-test", {.endpoint = server.url()});
  CHECK(endpoint.signer() == nullptr);
  const auto a = curl(endpoint.signer(), "GET", endpoint.object_url("other/x.bin"), "2-5");
  REQUIRE(a);
  CHECK(a->status == 206);
  CHECK(a->body == objects().content["other/x.bin"].substr(2, 4));
  // Signatures are still checked when one is sent.
  env.set("AWS_ACCESS_KEY_ID", "S3RVER");
  env.set("AWS_SECRET_ACCESS_KEY", "wrong");
  const S3Endpoint wrong("eredu-test", {.endpoint = server.url()});
  const auto refused = curl(wrong.signer(), "GET", wrong.object_url("other/x.bin"));
  REQUIRE(refused);
  CHECK(refused->status == 403);
}

TEST_CASE("S3 through HttpClient: signed ranged GETs, refusals and listings against s3rver", "[s3][server][http]") {
  ServerProcess* started = usable_server(false);
  if (!started) return;
  const std::string url = started->url();
  AwsEnvironment env;
  env.set("AWS_ACCESS_KEY_ID", "S3RVER");
  env.set("AWS_SECRET_ACCESS_KEY", kSecret);
  const S3Endpoint endpoint("eredu-test", {.endpoint = url});
  HttpOptions options;
  options.max_retries = 0;
  HttpClient client(options);
  const std::string key = "shards/model-00001-of-00003.safetensors";
  const std::string& model = objects().content[key];

  SECTION("a signed ranged GET returns the object's exact bytes, its size and its ETag") {
    std::vector<std::byte> buffer(265'536);
    const RangeResult r = client.get_blocking(
        RangeGet{.url = endpoint.object_url(key), .offset = 1000, .dest = buffer, .signer = endpoint.signer()});
    CHECK(r.bytes == buffer.size());
    CHECK(r.object_size == model.size());
    CHECK(r.etag.size() == 34);
    CHECK(std::memcmp(buffer.data(), model.data() + 1000, buffer.size()) == 0);
    // Pinned to that ETag it reads again; pinned to another it is file_changed.
    std::vector<std::byte> small(10);
    CHECK(client
              .get_blocking(RangeGet{
                  .url = endpoint.object_url(key), .dest = small, .if_match = r.etag, .signer = endpoint.signer()})
              .bytes == 10);
    CHECK(kind_of([&] {
            client.get_blocking(RangeGet{.url = endpoint.object_url(key),
                                         .dest = small,
                                         .if_match = "\"0123456789abcdef0123456789abcdef\"",
                                         .signer = endpoint.signer()});
          }) == errc::file_changed);
    const std::string odd = "odd name+=~é.bin";
    std::vector<std::byte> whole(objects().content[odd].size());
    client.get_blocking(RangeGet{.url = endpoint.object_url(odd), .dest = whole, .signer = endpoint.signer()});
    CHECK(std::memcmp(whole.data(), objects().content[odd].data(), whole.size()) == 0);
  }
  SECTION("a wrong secret, and no signature at all, are access_denied naming the URL, never the secret") {
    env.set("AWS_SECRET_ACCESS_KEY", "not-the-secret");
    const S3Endpoint wrong("eredu-test", {.endpoint = url});
    std::vector<std::byte> buffer(16);
    const auto get = [&](const RequestSigner* signer) {
      client.get_blocking(RangeGet{.url = wrong.object_url("other/x.bin"), .dest = buffer, .signer = signer});
    };
    CHECK(kind_of([&] { get(wrong.signer()); }) == errc::access_denied);
    const std::string why = message_of([&] { get(wrong.signer()); });
    CHECK(why.find("other/x.bin") != std::string::npos);
    CHECK(why.find("not-the-secret") == std::string::npos);
    CHECK(kind_of([&] { get(nullptr); }) == errc::access_denied);
  }
  SECTION("list_objects follows continuation tokens (two keys a page) and gives keys, sizes and ETags") {
    const std::vector<S3Object> listed = list_objects(client, endpoint, "shards/");
    std::vector<std::string> keys;
    for (const auto& o : listed) {
      keys.push_back(o.key);
      CHECK(o.size == objects().content[o.key].size());
      std::vector<std::byte> one(1);
      const RangeResult r =
          client.get_blocking(RangeGet{.url = endpoint.object_url(o.key), .dest = one, .signer = endpoint.signer()});
      CHECK(o.etag == r.etag);
    }
    CHECK(keys ==
          std::vector<std::string>{"shards/model-00001-of-00003.safetensors", "shards/model-00002-of-00003.safetensors",
                                   "shards/model-00003-of-00003.safetensors", "shards/model.safetensors.index.json"});
    CHECK(list_objects(client, endpoint, "nothing-here/").empty());
  }
}

TEST_CASE("S3 through HttpClient: anonymous requests pass only where the server allows them", "[s3][server][http]") {
  ServerProcess* started = usable_server(true);
  if (!started) return;
  AwsEnvironment env;
  const S3Endpoint endpoint("eredu-test", {.endpoint = started->url()});
  REQUIRE(endpoint.signer() == nullptr);
  HttpClient client(HttpOptions{});
  std::vector<std::byte> buffer(4);
  const RangeResult r =
      client.get_blocking(RangeGet{.url = endpoint.object_url("other/x.bin"), .offset = 2, .dest = buffer});
  CHECK(r.bytes == 4);
  CHECK(std::memcmp(buffer.data(), objects().content["other/x.bin"].data() + 2, 4) == 0);
  CHECK(list_objects(client, endpoint, "other/").size() == 1);
}
