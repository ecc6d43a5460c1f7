#pragma once
// A small TCP key-value store for rendezvous: rank 0 hosts a TcpStoreServer on
// MASTER_ADDR:MASTER_PORT; every rank (rank 0 too) talks to it through a
// TcpStore client. Ranks exchange what the backends need (NCCL unique id, Gloo
// pair addresses), check that they agree (model signatures), and publish the
// sequence number of the collective they are in, so a timeout can name the
// ranks that never arrived.
//
// Wire format, both directions: u8 command, then length-prefixed (u32 LE)
// strings. Requests: SET key value -> ok; GET key -> found(u8) value;
// AGE key -> found(u8) value i64 (milliseconds since the key was last set);
// ADD key i64 -> i64; HELLO rank -> ok. Waiting is done by the client (poll
// GET with backoff) so the server never blocks on one client.
//
// Before any request, each connection is authenticated (comm/auth.hpp): the
// server sends "DTRS", a version byte, a mode byte (1: the job has a token)
// and its nonce (32 bytes); the client answers with its nonce and its proof
// (32 + 32 bytes); the server answers 1 and its own proof, or 0 and closes.
// Until then the server reads at most those 64 bytes from the client and
// answers nothing else: a stranger can neither read nor write a key.
// Limits (StoreLimits) bound what any client, authenticated or not, can make
// the server hold: pending handshakes, their time, connections, a request's size.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "dtrain/comm/auth.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/macros.hpp"
#include "dtrain/core/parse.hpp"

namespace dtrain {

namespace detail {

enum class store_cmd : std::uint8_t { set = 1, get = 2, add = 3, hello = 4, age = 5 };

// The server's list of ranks whose every connection has closed, as
// ",r1,r2," under this key (TcpStore::announce, TcpStore::get's setters).
inline constexpr std::string_view departed_key = "__dtrain/departed";

// Owns one file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.release();
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  DTRAIN_DECL void reset();

 private:
  int fd_ = -1;
};

using steady = std::chrono::steady_clock;

// Waits until fd is ready for `events` or the deadline passes.
DTRAIN_DECL bool wait_fd(int fd, short events, steady::time_point deadline);

DTRAIN_DECL void put_u32(std::string& out, std::uint32_t v);
DTRAIN_DECL std::uint32_t get_u32(const char* p);
DTRAIN_DECL void put_str(std::string& out, std::string_view s);
DTRAIN_DECL std::string i64_bytes(std::int64_t v);
DTRAIN_DECL std::int64_t bytes_i64(std::string_view s);

// Parses one complete request from buf starting at 0; returns bytes consumed
// (0 if incomplete) and fills cmd/args.
// A request whose declared argument is longer than `max_arg` returns
// request_too_large.
inline constexpr std::size_t request_too_large = std::numeric_limits<std::size_t>::max();
DTRAIN_DECL std::size_t parse_request(std::string_view buf, store_cmd& cmd, std::vector<std::string_view>& args,
                                      std::size_t max_arg = std::numeric_limits<std::uint32_t>::max());

// The handshake's fixed sizes (see the top of this file).
inline constexpr std::string_view store_magic = "DTRS";
inline constexpr std::uint8_t store_protocol_version = 1;
inline constexpr std::size_t store_hello_bytes = 4 + 1 + 1 + auth_nonce_bytes;
inline constexpr std::size_t store_answer_bytes = auth_nonce_bytes + auth_proof_bytes;
inline constexpr std::size_t store_verdict_bytes = 1 + auth_proof_bytes;
inline constexpr std::string_view store_client_role = "dtrain-store-client";
inline constexpr std::string_view store_server_role = "dtrain-store-server";

inline std::string endpoint(const std::string& host, int port) { return host + ":" + std::to_string(port); }

// The IPv4 address rank 0's rendezvous listens on for a master address:
// the address the name resolves to ("localhost" -> 127.0.0.1), so the store
// is reachable where the ranks were told to look and nowhere else.
DTRAIN_DECL std::string bind_address_of(const std::string& master_addr);

}  // namespace detail

// What one rendezvous server holds at most: hostile or broken clients cost
// it a bounded amount of memory, descriptors and time, and never stall it.
struct StoreLimits {
  // A connection that has not proved the token by then is closed.
  std::chrono::milliseconds handshake_timeout = std::chrono::seconds(10);
  // Connections still in their handshake; past it the oldest is closed.
  std::size_t max_pending = 512;
  // Open connections in all; past it a new one is closed at once.
  std::size_t max_clients = 8192;
  // The largest key or value a request may carry; a client declaring more
  // is closed (the largest dtrain writes is a rank's Gloo address list).
  std::size_t max_request_bytes = std::size_t{64} << 20;
};

// Hosts the key-value map. One poll() thread serves every client.
class TcpStoreServer {
 public:
  // port 0 picks a free port (see port()). `bind_addr`: the IPv4 address to
  // listen on (World binds the master address; "0.0.0.0" every interface).
  // `token`: the job token every client must prove; empty: no check (only
  // for a job run with DTRAIN_INSECURE_NO_TOKEN, and for port probes).
  DTRAIN_DECL explicit TcpStoreServer(int port, std::string_view bind_addr = "0.0.0.0", std::string token = {},
                                      StoreLimits limits = {});
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  DTRAIN_DECL ~TcpStoreServer();

  int port() const { return port_; }

 private:
  struct Client {
    detail::Fd fd;
    std::string in;
    int rank = -1;               // announced by TcpStore::announce; -1 for anonymous clients
    bool authenticated = false;  // proved the token (or the job has none)
    std::string nonce;           // the server's challenge to this client
    std::string peer;            // address:port, for the log
    detail::steady::time_point since{};
  };

  // A client passed or failed the handshake (its 64 bytes are in c.in).
  DTRAIN_DECL bool check_answer(Client& c);

  // Logs a refused or dropped client, naming its address (the first few of
  // each kind, then every thousandth: a flood does not flood the log).
  DTRAIN_DECL void refuse(const Client& c, std::string_view why);

  DTRAIN_DECL void accept_clients(std::vector<Client>& clients);

  // A client hung up: when it was the last connection of its rank, that
  // rank has left the job, and waits for keys it was to set can fail now.
  DTRAIN_DECL void departed(const Client& c);

  DTRAIN_DECL void serve();

  DTRAIN_DECL bool read_and_answer(Client& c);

  detail::Fd listen_;
  int wake_[2] = {-1, -1};
  int port_ = 0;
  std::string token_;
  StoreLimits limits_;
  std::size_t refused_ = 0;
  static constexpr auto linger = std::chrono::seconds(30);
  static constexpr auto failing_linger = std::chrono::seconds(3);
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> connected_{0};
  std::map<std::string, std::string, std::less<>> map_;                    // only the serve thread touches it
  std::map<std::string, detail::steady::time_point, std::less<>> set_at_;  // when SET last wrote each key
  std::map<int, int> live_;                                                // rank -> open connections (serve thread)
  std::thread thread_;
};

// A client of TcpStoreServer. Thread-safe; every call is bounded by a timeout.
class TcpStore {
 public:
  // `token`: the job's token, proved to the server on connecting; empty
  // only when the server has none (DTRAIN_INSECURE_NO_TOKEN).
  DTRAIN_DECL TcpStore(std::string host, int port, std::chrono::milliseconds timeout, std::string token = {});

  std::chrono::milliseconds timeout() const { return timeout_; }
  const std::string& host() const { return host_; }
  int port() const { return port_; }
  // The job token this client proves (for another connection of the same rank).
  const std::string& token() const { return token_; }
  // The local IP address of this rank's connection to the master: the
  // interface other ranks can reach us on (used for Gloo's transport).
  const std::string& local_address() const { return local_address_; }

  DTRAIN_DECL void set(std::string_view key, std::string_view value);

  DTRAIN_DECL std::optional<std::string> try_get(std::string_view key);

  // A key's value and how long ago (by the server's clock) it was last set.
  struct Aged {
    std::string value;
    std::chrono::milliseconds age;
  };
  DTRAIN_DECL std::optional<Aged> try_get_aged(std::string_view key);

  // Says which rank this connection belongs to (World does, once). When
  // every announced connection of a rank has closed, the server lists the
  // rank as departed, and get() calls waiting for keys it was to set fail
  // at once instead of at the timeout.
  DTRAIN_DECL void announce(int rank);

  // Blocks until key exists; throws timeout_error after `timeout` (the
  // store's by default). `setters`: the ranks (as announced) the key waits
  // on; if one of them has left the job and the key is still missing,
  // throws comm_error naming it.
  DTRAIN_DECL std::string get(std::string_view key, std::optional<std::chrono::milliseconds> timeout = {},
                              std::span<const int> setters = {});

  // Which of `ranks` the server lists as departed ("" if none, else "r" or "r1, r2").
  DTRAIN_DECL std::string departed_among(std::span<const int> ranks);

  DTRAIN_DECL std::int64_t add(std::string_view key, std::int64_t delta);

 private:
  DTRAIN_DECL void connect();

  // The handshake on a fresh connection. Returns "" when authenticated, else
  // why the connection was lost (the caller retries); throws when the
  // server refused this client or speaks something else.
  DTRAIN_DECL std::string handshake(int fd, detail::steady::time_point deadline);

  // GET or AGE: whether the key exists, its value, and for AGE its age.
  DTRAIN_DECL std::tuple<bool, std::string, std::chrono::milliseconds> lookup(detail::store_cmd cmd,
                                                                              std::string_view key);

  DTRAIN_DECL void send_all(std::string_view data, std::string_view key);

  DTRAIN_DECL std::string recv_exact(std::size_t n, std::string_view key);

  [[noreturn]] DTRAIN_DECL void lost(std::string_view key, const std::string& why);

  std::string host_;
  int port_;
  std::chrono::milliseconds timeout_;
  std::string token_;
  std::string local_address_;
  detail::Fd fd_;
  std::string broken_;  // why the connection failed; under mu_
  std::mutex mu_;
};

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/comm/store.ipp"
#endif
