// HttpClient: libcurl's multi interface on one Asio loop (see http_client.hpp). Every libcurl call
// and every member of State below is touched on the client's thread only; the public functions
// post to it. Counters are atomics so that stats() may be read from anywhere.
#include "eredu/io/remote/http_client.hpp"

#include <curl/curl.h>
#include <fmt/format.h>

#include <algorithm>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <atomic>
#include <charconv>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <random>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "eredu/core/error.hpp"
#include "eredu/io/remote/remote_url.hpp"

namespace eredu::io {

namespace {

std::atomic<RequestId> next_request_id{1};

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// The URL as messages may show it: never a query (it may hold a presigned signature).
std::string display_of(const std::string& url) {
  try {
    return redacted(parse_remote_url(url));
  } catch (const Error&) {
    return "(a URL that does not parse)";
  }
}

bool iequals_prefix(std::string_view line, std::string_view name) {
  if (line.size() < name.size()) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(line[i])) != name[i]) return false;
  }
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n'))
    s.remove_suffix(1);
  return s;
}

std::optional<std::uint64_t> to_u64(std::string_view s) {
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

// `bytes FIRST-LAST/TOTAL` (TOTAL may be `*`).
struct ContentRange {
  std::uint64_t first = 0;
  std::uint64_t last = 0;
  std::optional<std::uint64_t> total{};
};

std::optional<ContentRange> parse_content_range(std::string_view v) {
  if (!iequals_prefix(v, "bytes ")) return std::nullopt;
  v.remove_prefix(6);
  const auto dash = v.find('-');
  const auto slash = v.find('/');
  if (dash == std::string_view::npos || slash == std::string_view::npos || slash < dash) return std::nullopt;
  const auto first = to_u64(v.substr(0, dash));
  const auto last = to_u64(v.substr(dash + 1, slash - dash - 1));
  if (!first || !last || *last < *first) return std::nullopt;
  ContentRange r{*first, *last, std::nullopt};
  const std::string_view total = v.substr(slash + 1);
  if (total != "*") {
    r.total = to_u64(total);
    if (!r.total) return std::nullopt;
  }
  return r;
}

// Scheme, host and port: where a signer's credentials may go.
std::string origin_of(const std::string& url) {
  try {
    const RemoteUrl u = parse_remote_url(url);
    return fmt::format("{}://{}:{}", u.scheme == RemoteUrl::Scheme::http ? "http" : "https", u.host, u.port);
  } catch (const Error&) {
    return {};
  }
}

bool is_tls_failure(CURLcode c) {
  switch (c) {
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ENGINE_NOTFOUND:
    case CURLE_SSL_ENGINE_SETFAILED:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_CRL_BADFILE:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
      return true;
    default:
      return false;
  }
}

// Transport failures worth another attempt (the connection may come back).
bool is_transient(CURLcode c) {
  switch (c) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_WEIRD_SERVER_REPLY:
      return true;
    default:
      return false;
  }
}

bool is_retried_status(long s) { return s == 429 || s == 500 || s == 502 || s == 503 || s == 504; }

}  // namespace

struct HttpClient::State {
  // One request from get() to its callback, over all its attempts and redirects.
  struct Transfer {
    State* self = nullptr;  // for libcurl's callbacks, which get the transfer only
    RequestId id = 0;
    bool ranged = true;
    RangeGet range{};
    RangeCallback range_done{};
    DocumentGet doc{};
    DocumentCallback doc_done{};
    std::string url{};      // the URL asked now (a redirect's target after one)
    std::string display{};  // the first URL, redacted, for messages
    std::string origin{};   // the first URL's origin: the signer signs for it only
    bool sign = true;       // false after a redirect to another origin
    const RequestSigner* signer = nullptr;
    unsigned redirects = 0;
    unsigned attempts = 0;
    std::uint64_t received = 0;  // ranged: bytes in dest so far
    std::string body{};          // document
    std::string etag{};          // the first ETag seen
    std::optional<std::uint64_t> object_size{};
    unsigned http_version = 0;
    bool last_timed_out = false;
    std::string last_failure{};  // detail of the last retried failure

    // This attempt.
    CURL* easy = nullptr;
    curl_slist* headers = nullptr;
    std::uint64_t attempt_start = 0;
    long status = 0;
    std::string hdr_etag{};
    std::string hdr_range{};
    std::string hdr_location{};
    std::optional<std::uint64_t> hdr_length{};
    bool body_checked = false;
    std::exception_ptr abort{};  // set by a callback that refused the body: final
    char errbuf[CURL_ERROR_SIZE] = {};

    enum class Where { queued, running, waiting, done } where = Where::queued;
    std::unique_ptr<asio::steady_timer> retry_timer{};

    std::uint64_t offset_now() const { return ranged ? range.offset + received : 0; }
  };

  // A socket of libcurl's, watched (never owned) by an Asio descriptor.
  struct Socket {
    explicit Socket(asio::io_context& ioc) : d(ioc) {}
    asio::posix::stream_descriptor d;
    int what = 0;
    bool reading = false;
    bool writing = false;
    bool gone = false;
  };

  explicit State(const HttpOptions& o) : options(o), timer(ioc), rng(std::random_device{}()) {}

  HttpOptions options;
  asio::io_context ioc;
  asio::executor_work_guard<asio::io_context::executor_type> work{ioc.get_executor()};
  asio::steady_timer timer;
  CURLM* multi = nullptr;
  std::thread thread;
  std::mt19937_64 rng;
  std::unordered_map<curl_socket_t, std::shared_ptr<Socket>> sockets;
  std::unordered_map<RequestId, std::shared_ptr<Transfer>> transfers;
  std::deque<std::shared_ptr<Transfer>> queue;
  unsigned running = 0;
  bool closing = false;

  std::atomic<std::uint64_t> n_requests{0}, n_retries{0}, n_bytes{0}, n_connections{0};

  // --- libcurl's callbacks -------------------------------------------------------------------

  static int on_socket(CURL*, curl_socket_t s, int what, void* userp, void*) {
    auto* self = static_cast<State*>(userp);
    if (what == CURL_POLL_REMOVE) {
      if (auto it = self->sockets.find(s); it != self->sockets.end()) {
        it->second->gone = true;
        it->second->d.release();  // libcurl closes its own descriptor
        self->sockets.erase(it);
      }
      return 0;
    }
    auto& sp = self->sockets[s];
    if (!sp) {
      sp = std::make_shared<Socket>(self->ioc);
      asio::error_code ec;
      sp->d.assign(s, ec);
      if (ec) {
        self->sockets.erase(s);
        return -1;  // libcurl fails the transfers on this socket
      }
    }
    sp->what = what;
    self->arm(sp, s);
    return 0;
  }

  static int on_timer(CURLM*, long ms, void* userp) {
    auto* self = static_cast<State*>(userp);
    self->timer.cancel();
    if (ms >= 0) {
      self->timer.expires_after(std::chrono::milliseconds(ms));
      self->timer.async_wait([self](const asio::error_code& ec) {
        if (!ec) self->action(CURL_SOCKET_TIMEOUT, 0);
      });
    }
    return 0;
  }

  static std::size_t on_header(char* data, std::size_t size, std::size_t n, void* userp) {
    auto* t = static_cast<Transfer*>(userp);
    const std::string_view line(data, size * n);
    if (line.starts_with("HTTP/")) {  // a new answer (after a 100 Continue): forget the last
      const auto sp = line.find(' ');
      t->status = 0;
      if (sp != std::string_view::npos && line.size() >= sp + 4) {
        if (auto v = to_u64(line.substr(sp + 1, 3))) t->status = static_cast<long>(*v);
      }
      t->hdr_etag.clear();
      t->hdr_range.clear();
      t->hdr_location.clear();
      t->hdr_length.reset();
    } else if (iequals_prefix(line, "etag:")) {
      t->hdr_etag = std::string(trim(line.substr(5)));
    } else if (iequals_prefix(line, "content-range:")) {
      t->hdr_range = std::string(trim(line.substr(14)));
    } else if (iequals_prefix(line, "content-length:")) {
      t->hdr_length = to_u64(trim(line.substr(15)));
    }
    return size * n;
  }

  static std::size_t on_body(char* data, std::size_t size, std::size_t n, void* userp) {
    auto* t = static_cast<Transfer*>(userp);
    const std::size_t len = size * n;
    if (t->status < 200 || t->status > 299) return len;  // an error's or a redirect's body
    if (!t->body_checked) {
      t->body_checked = true;
      if (!t->self->check_answer(*t)) return 0;
    }
    if (!t->ranged) {
      if (t->body.size() + len > t->doc.max_bytes) {
        t->abort = t->self->error(*t, errc::remote_error,
                                  fmt::format("the document is larger than the limit of {} bytes", t->doc.max_bytes));
        return 0;
      }
      t->body.append(data, len);
    } else {
      const std::size_t room = t->range.dest.size() - static_cast<std::size_t>(t->received);
      if (len > room) {
        t->abort =
            t->self->error(*t, t->status == 200 ? errc::range_unsupported : errc::remote_error,
                           t->status == 200 ? "the server answered the ranged GET with 200 and more bytes than asked"
                                            : "the server sent more bytes than the range asked");
        return 0;
      }
      std::memcpy(t->range.dest.data() + t->received, data, len);
      t->received += len;
    }
    t->self->n_bytes.fetch_add(len, std::memory_order_relaxed);
    return len;
  }

  // --- the loop -------------------------------------------------------------------------------

  void arm(const std::shared_ptr<Socket>& sp, curl_socket_t s) {
    if ((sp->what & CURL_POLL_IN) && !sp->reading) {
      sp->reading = true;
      sp->d.async_wait(asio::posix::stream_descriptor::wait_read, [this, sp, s](const asio::error_code& ec) {
        sp->reading = false;
        if (ec || sp->gone || !(sp->what & CURL_POLL_IN)) return;
        action(s, CURL_CSELECT_IN);
        if (!sp->gone) arm(sp, s);
      });
    }
    if ((sp->what & CURL_POLL_OUT) && !sp->writing) {
      sp->writing = true;
      sp->d.async_wait(asio::posix::stream_descriptor::wait_write, [this, sp, s](const asio::error_code& ec) {
        sp->writing = false;
        if (ec || sp->gone || !(sp->what & CURL_POLL_OUT)) return;
        action(s, CURL_CSELECT_OUT);
        if (!sp->gone) arm(sp, s);
      });
    }
  }

  void action(curl_socket_t s, int events) {
    // A timer's completion may already be queued when shut_down() cleans the multi handle up;
    // libcurl reads the handle before it checks it, so null must not reach it.
    if (!multi) return;
    int still = 0;
    curl_multi_socket_action(multi, s, events, &still);
    reap();
  }

  void reap() {
    int left = 0;
    while (CURLMsg* m = curl_multi_info_read(multi, &left)) {
      if (m->msg != CURLMSG_DONE) continue;
      Transfer* raw = nullptr;
      curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, &raw);
      const CURLcode code = m->data.result;
      auto it = raw ? transfers.find(raw->id) : transfers.end();
      if (it == transfers.end()) continue;
      attempt_done(it->second, code);
    }
    pump();
  }

  // Starts queued transfers while fewer than max_transfers run.
  void pump() {
    while (!closing && running < options.max_transfers && !queue.empty()) {
      auto t = std::move(queue.front());
      queue.pop_front();
      start_attempt(t);
    }
  }

  void enqueue(std::shared_ptr<Transfer> t) {
    if (closing) {
      complete(*t, error(*t, errc::cancelled, "the HTTP client is shutting down"));
      return;
    }
    if (t->ranged && t->range.dest.empty()) {
      complete(*t, nullptr);
      return;
    }
    transfers[t->id] = t;
    t->where = Transfer::Where::queued;
    queue.push_back(std::move(t));
    pump();
  }

  void start_attempt(const std::shared_ptr<Transfer>& t, bool is_redirect = false) {
    if (!is_redirect) {
      ++t->attempts;
      n_requests.fetch_add(1, std::memory_order_relaxed);
      if (t->attempts > 1) n_retries.fetch_add(1, std::memory_order_relaxed);
    }
    t->status = 0;
    t->hdr_etag.clear();
    t->hdr_range.clear();
    t->hdr_length.reset();
    t->body_checked = false;
    t->abort = nullptr;
    t->errbuf[0] = '\0';
    t->attempt_start = t->offset_now();
    if (!t->ranged) t->body.clear();

    CURL* e = curl_easy_init();
    if (!e) {
      complete(*t, error(*t, errc::resource_exhausted, "libcurl could not make a transfer handle"));
      return;
    }
    t->easy = e;
    curl_easy_setopt(e, CURLOPT_URL, t->url.c_str());
    curl_easy_setopt(e, CURLOPT_PRIVATE, t.get());
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);  // followed here, to keep the signer to its origin
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(e, CURLOPT_PROTOCOLS, static_cast<long>(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, t->errbuf);
    // Larger receive buffer than libcurl's 16 KiB: fewer recv calls and body callbacks per GB
    // (bench/remote_load.py, docs/performance.md).
    curl_easy_setopt(e, CURLOPT_BUFFERSIZE, static_cast<long>(std::size_t{512} << 10));
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &State::on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, t.get());
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, &State::on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, t.get());
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options.connect_timeout.count()));
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, static_cast<long>(options.low_speed_bytes));
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, static_cast<long>(options.low_speed_window.count()));
    curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 2L);
    if (!options.ca_file.empty()) curl_easy_setopt(e, CURLOPT_CAINFO, options.ca_file.c_str());
    curl_easy_setopt(
        e, CURLOPT_HTTP_VERSION,
        options.http2 ? static_cast<long>(CURL_HTTP_VERSION_2TLS) : static_cast<long>(CURL_HTTP_VERSION_1_1));
    // Over TLS, wait for a connection being set up to tell whether it multiplexes (HTTP/2) rather
    // than open another; plain HTTP is HTTP/1.1 here, where waiting would serialize transfers.
    if (options.http2 && iequals_prefix(t->url, "https://")) curl_easy_setopt(e, CURLOPT_PIPEWAIT, 1L);

    curl_slist* h = nullptr;
    if (t->ranged) {
      const std::uint64_t last = t->range.offset + t->range.dest.size() - 1;
      h = curl_slist_append(h, fmt::format("Range: bytes={}-{}", t->attempt_start, last).c_str());
      // A resumed attempt must read the same version of the object as the first one did.
      std::string match = t->range.if_match;
      if (match.empty() && !t->etag.empty() && !t->etag.starts_with("W/")) match = t->etag;
      if (!match.empty()) h = curl_slist_append(h, fmt::format("If-Match: {}", match).c_str());
    }
    if (t->signer && t->sign) {
      try {
        for (const auto& [name, value] : t->signer->sign("GET", t->url)) {
          h = curl_slist_append(h, fmt::format("{}: {}", name, value).c_str());
        }
      } catch (...) {
        curl_slist_free_all(h);
        curl_easy_cleanup(e);
        t->easy = nullptr;
        complete(*t, std::current_exception());
        return;
      }
    }
    t->headers = h;
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    t->where = Transfer::Where::running;
    ++running;
    if (curl_multi_add_handle(multi, e) != CURLM_OK) {
      --running;
      release_easy(*t);
      complete(*t, error(*t, errc::resource_exhausted, "libcurl refused the transfer"));
    }
  }

  void release_easy(Transfer& t) {
    if (t.easy) {
      curl_easy_cleanup(t.easy);
      t.easy = nullptr;
    }
    curl_slist_free_all(t.headers);
    t.headers = nullptr;
  }

  // Stops the attempt in flight (removing it from the multi handle closes its connection).
  void detach(Transfer& t) {
    if (t.where == Transfer::Where::running && t.easy) {
      curl_multi_remove_handle(multi, t.easy);
      --running;
    }
    release_easy(t);
    if (t.retry_timer) t.retry_timer->cancel();
    if (t.where == Transfer::Where::queued) {
      auto it = std::find_if(queue.begin(), queue.end(), [&](const auto& q) { return q.get() == &t; });
      if (it != queue.end()) queue.erase(it);
    }
  }

  // The first body bytes of a 2xx: is it the range asked, of the same object?
  bool check_answer(Transfer& t) {
    if (!t.hdr_etag.empty()) {
      const std::string& pinned = t.ranged && !t.range.if_match.empty() ? t.range.if_match : t.etag;
      if (!pinned.empty() && pinned != t.hdr_etag) {
        t.abort = error(t, errc::file_changed, fmt::format("the object's ETag is now {}, not {}", t.hdr_etag, pinned));
        return false;
      }
      if (t.etag.empty()) t.etag = t.hdr_etag;
    }
    if (!t.ranged) return true;
    if (t.status == 206) {
      const auto r = parse_content_range(t.hdr_range);
      if (!r) {
        t.abort = error(t, errc::remote_error,
                        fmt::format("a 206 answer without a usable Content-Range ('{}')", t.hdr_range));
        return false;
      }
      if (r->first != t.attempt_start) {
        t.abort = error(t, errc::remote_error,
                        fmt::format("the server sent bytes from {}, not from the {} asked", r->first, t.attempt_start));
        return false;
      }
      if (r->total) t.object_size = r->total;
      return true;
    }
    if (t.status == 200) {
      // The whole object is fine where the whole object was asked for.
      const bool whole = t.attempt_start == 0 && t.hdr_length && *t.hdr_length <= t.range.dest.size();
      if (!whole) {
        t.abort = error(t, errc::range_unsupported,
                        "the server answered a ranged GET with 200 and the whole object (it ignores Range)");
        return false;
      }
      t.object_size = t.hdr_length;
      return true;
    }
    t.abort = error(t, errc::remote_error, fmt::format("unexpected HTTP {} to a ranged GET", t.status));
    return false;
  }

  void attempt_done(const std::shared_ptr<Transfer>& tp, CURLcode code) {
    Transfer& t = *tp;
    curl_multi_remove_handle(multi, t.easy);
    --running;
    long connects = 0;
    curl_easy_getinfo(t.easy, CURLINFO_NUM_CONNECTS, &connects);
    n_connections.fetch_add(static_cast<std::uint64_t>(std::max(0L, connects)), std::memory_order_relaxed);
    long version = 0;
    curl_easy_getinfo(t.easy, CURLINFO_HTTP_VERSION, &version);
    t.http_version = version == CURL_HTTP_VERSION_2_0 ? 2 : version == CURL_HTTP_VERSION_3 ? 3 : version ? 1 : 0;
    char* redirect = nullptr;
    curl_easy_getinfo(t.easy, CURLINFO_REDIRECT_URL, &redirect);
    t.hdr_location = redirect ? redirect : "";
    release_easy(t);

    if (t.abort) return complete(t, t.abort);
    if (code != CURLE_OK) {
      const std::string text = t.errbuf[0] ? std::string(t.errbuf) : std::string(curl_easy_strerror(code));
      if (is_tls_failure(code)) return complete(t, error(t, errc::tls_error, fmt::format("TLS failed: {}", text)));
      if (code == CURLE_OPERATION_TIMEDOUT) return retry(tp, true, fmt::format("timed out: {}", text));
      if (is_transient(code)) return retry(tp, false, text);
      return complete(t, error(t, errc::remote_error, text));
    }
    const long s = t.status;
    if (s >= 300 && s < 400 && !t.hdr_location.empty()) {
      if (++t.redirects > 10) return complete(t, error(t, errc::remote_error, "more than 10 redirects"));
      const std::string& target = t.hdr_location;
      if (!(iequals_prefix(target, "http://") || iequals_prefix(target, "https://"))) {
        return complete(t, error(t, errc::remote_error, "a redirect to a URL that is not http(s)"));
      }
      t.url = target;
      t.sign = t.sign && origin_of(target) == t.origin;
      t.where = Transfer::Where::queued;
      return start_attempt(tp, true);
    }
    if (s == 401 || s == 403) return complete(t, error(t, errc::access_denied, fmt::format("HTTP {}", s)));
    if (s == 404) return complete(t, error(t, errc::remote_not_found, fmt::format("HTTP {}", s)));
    if (s == 412) {
      return complete(t, error(t, errc::file_changed, "HTTP 412: the object no longer has the ETag asked (If-Match)"));
    }
    if (is_retried_status(s)) return retry(tp, false, fmt::format("HTTP {}", s));
    if (s < 200 || s > 299) return complete(t, error(t, errc::remote_error, fmt::format("HTTP {}", s)));
    if (!t.body_checked && !check_answer(t)) return complete(t, t.abort);  // an empty body
    if (t.ranged && t.received < t.range.dest.size()) {
      const std::uint64_t end = t.range.offset + t.received;
      if (t.object_size && end >= *t.object_size) {
        if (t.range.allow_short) return complete(t, nullptr);
        return complete(t, error(t, errc::remote_error,
                                 fmt::format("the object is {} bytes: the range asked ends past it", *t.object_size)));
      }
      return retry(tp, false, fmt::format("short body: {} of {} bytes", t.received, t.range.dest.size()));
    }
    complete(t, nullptr);
  }

  void retry(const std::shared_ptr<Transfer>& tp, bool timed_out, std::string why) {
    Transfer& t = *tp;
    t.last_timed_out = timed_out;
    t.last_failure = std::move(why);
    if (t.attempts > options.max_retries) {
      return complete(t, error(t, timed_out ? errc::timed_out : errc::remote_error,
                               fmt::format("{} (after {} attempts)", t.last_failure, t.attempts)));
    }
    // Full jitter: uniform in [0, min(max, initial * 2^(retries so far))].
    const auto shift = std::min(t.attempts - 1, 30u);
    const auto cap = std::min<std::int64_t>(options.backoff_max.count(), options.backoff_initial.count() << shift);
    const auto delay = std::uniform_int_distribution<std::int64_t>(0, std::max<std::int64_t>(cap, 0))(rng);
    if (!t.retry_timer) t.retry_timer = std::make_unique<asio::steady_timer>(ioc);
    t.retry_timer->expires_after(std::chrono::milliseconds(delay));
    t.where = Transfer::Where::waiting;
    t.retry_timer->async_wait([this, tp](const asio::error_code& ec) {
      if (ec || tp->where != Transfer::Where::waiting) return;
      tp->where = Transfer::Where::queued;
      queue.push_front(tp);  // ahead of requests not started yet
      pump();
    });
  }

  std::exception_ptr error(const Transfer& t, errc kind, const std::string& detail) const {
    return std::make_exception_ptr(
        Error(kind, {.file = t.display, .offset = t.ranged ? std::optional(t.offset_now()) : std::nullopt},
              fmt::format("GET: {}", detail)));
  }

  // Runs the callback once and forgets the transfer.
  void complete(Transfer& t, std::exception_ptr e) {
    std::shared_ptr<Transfer> keep;  // the transfer lives until its callback returned
    if (auto it = transfers.find(t.id); it != transfers.end()) keep = it->second;
    detach(t);
    t.where = Transfer::Where::done;
    transfers.erase(t.id);
    try {
      if (t.ranged) {
        RangeResult r;
        if (!e) {
          r.bytes = t.received;
          r.etag = t.etag;
          r.object_size = t.object_size.value_or(0);
          r.attempts = t.attempts;
          r.http_version = t.http_version;
        }
        if (t.range_done) std::exchange(t.range_done, {})(e, std::move(r));
      } else {
        DocumentResult r;
        if (!e) {
          r.body = std::move(t.body);
          r.etag = t.etag;
        }
        if (t.doc_done) std::exchange(t.doc_done, {})(e, std::move(r));
      }
    } catch (...) {
      // A callback must not throw; the loop carries on for the other transfers.
    }
  }

  void cancel(RequestId id) {
    auto it = transfers.find(id);
    if (it == transfers.end()) return;
    auto t = it->second;
    complete(*t, error(*t, errc::cancelled, "cancelled"));
    pump();
  }

  void shut_down() {
    closing = true;
    std::vector<std::shared_ptr<Transfer>> all;
    for (auto& [id, t] : transfers) all.push_back(t);
    for (auto& t : all) complete(*t, error(*t, errc::cancelled, "the HTTP client was destroyed"));
    queue.clear();
    curl_multi_cleanup(multi);  // closes the cached connections (their sockets are removed first)
    multi = nullptr;
    for (auto& [s, sp] : sockets) {
      sp->gone = true;
      sp->d.release();
    }
    sockets.clear();
    timer.cancel();
    work.reset();
  }
};

HttpClient::HttpClient(const HttpOptions& options) {
  if (options.max_transfers < 1 || options.max_transfers > 1024) {
    throw Error(errc::invalid_argument, {}, "HttpOptions::max_transfers must be 1..1024");
  }
  if (options.connect_timeout.count() < 1 || options.low_speed_window.count() < 1 ||
      options.backoff_initial.count() < 0 || options.backoff_max < options.backoff_initial) {
    throw Error(errc::invalid_argument, {}, "HttpOptions: a timeout or backoff is out of range");
  }
  global_init();
  state_ = std::make_unique<State>(options);
  State& s = *state_;
  s.multi = curl_multi_init();
  if (!s.multi) throw Error(errc::resource_exhausted, {}, "libcurl could not make a multi handle");
  curl_multi_setopt(s.multi, CURLMOPT_SOCKETFUNCTION, &State::on_socket);
  curl_multi_setopt(s.multi, CURLMOPT_SOCKETDATA, &s);
  curl_multi_setopt(s.multi, CURLMOPT_TIMERFUNCTION, &State::on_timer);
  curl_multi_setopt(s.multi, CURLMOPT_TIMERDATA, &s);
  curl_multi_setopt(s.multi, CURLMOPT_PIPELINING, CURLPIPE_MULTIPLEX);
  curl_multi_setopt(s.multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, static_cast<long>(options.max_transfers));
  curl_multi_setopt(s.multi, CURLMOPT_MAXCONNECTS, static_cast<long>(options.max_transfers));
  try {
    s.thread = std::thread([&s] {
      for (;;) {
        try {
          s.ioc.run();
          return;
        } catch (...) {
          // A handler threw (it should not): keep serving the other transfers.
        }
      }
    });
  } catch (const std::system_error& e) {
    curl_multi_cleanup(s.multi);
    throw Error(errc::resource_exhausted, {}, fmt::format("cannot start the HTTP client's thread: {}", e.what()));
  }
}

HttpClient::~HttpClient() {
  State* s = state_.get();
  asio::post(s->ioc, [s] { s->shut_down(); });
  s->thread.join();
}

RequestId HttpClient::new_request_id() noexcept { return next_request_id.fetch_add(1, std::memory_order_relaxed); }

void HttpClient::get(RangeGet request, RangeCallback done, RequestId id) {
  auto t = std::make_shared<State::Transfer>();
  t->self = state_.get();
  t->id = id ? id : new_request_id();
  t->ranged = true;
  t->url = request.url;
  t->display = display_of(request.url);
  t->origin = origin_of(request.url);
  t->signer = request.signer;
  t->range = std::move(request);
  t->range_done = std::move(done);
  State* s = state_.get();
  asio::post(s->ioc, [s, t = std::move(t)]() mutable { s->enqueue(std::move(t)); });
}

void HttpClient::get(DocumentGet request, DocumentCallback done, RequestId id) {
  auto t = std::make_shared<State::Transfer>();
  t->self = state_.get();
  t->id = id ? id : new_request_id();
  t->ranged = false;
  t->url = request.url;
  t->display = display_of(request.url);
  t->origin = origin_of(request.url);
  t->signer = request.signer;
  t->doc = std::move(request);
  t->doc_done = std::move(done);
  State* s = state_.get();
  asio::post(s->ioc, [s, t = std::move(t)]() mutable { s->enqueue(std::move(t)); });
}

void HttpClient::cancel(RequestId id) {
  State* s = state_.get();
  asio::post(s->ioc, [s, id] { s->cancel(id); });
}

RangeResult HttpClient::get_blocking(RangeGet request) {
  std::promise<RangeResult> p;
  auto f = p.get_future();
  get(std::move(request), [&p](std::exception_ptr e, RangeResult r) {
    if (e) {
      p.set_exception(e);
    } else {
      p.set_value(std::move(r));
    }
  });
  return f.get();
}

DocumentResult HttpClient::get_blocking(DocumentGet request) {
  std::promise<DocumentResult> p;
  auto f = p.get_future();
  get(std::move(request), [&p](std::exception_ptr e, DocumentResult r) {
    if (e) {
      p.set_exception(e);
    } else {
      p.set_value(std::move(r));
    }
  });
  return f.get();
}

HttpStats HttpClient::stats() const {
  const State& s = *state_;
  return {s.n_requests.load(std::memory_order_relaxed), s.n_retries.load(std::memory_order_relaxed),
          s.n_bytes.load(std::memory_order_relaxed), s.n_connections.load(std::memory_order_relaxed)};
}

const HttpOptions& HttpClient::options() const noexcept { return state_->options; }

}  // namespace eredu::io
