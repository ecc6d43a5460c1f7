// The definitions store.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include <sys/resource.h>

#include <cstdio>

#include "dtrain/comm/store.hpp"
#include "dtrain/core/stop_signal.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  namespace detail {

  DTRAIN_DECL auto Fd::reset() -> void {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  DTRAIN_DECL bool wait_fd(int fd, short events, steady::time_point deadline) {
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now());
      if (left.count() <= 0) return false;
      pollfd p{fd, events, 0};
      const int r = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 1000)));
      if (r > 0) return true;
      if (r < 0 && errno != EINTR) return false;
    }
  }

  DTRAIN_DECL void put_u32(std::string& out, std::uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }

  DTRAIN_DECL std::uint32_t get_u32(const char* p) {
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
    return v;
  }

  DTRAIN_DECL void put_str(std::string& out, std::string_view s) {
    put_u32(out, static_cast<std::uint32_t>(s.size()));
    out.append(s);
  }

  DTRAIN_DECL std::string i64_bytes(std::int64_t v) {
    std::string s(8, '\0');
    std::memcpy(s.data(), &v, 8);
    return s;
  }

  DTRAIN_DECL std::int64_t bytes_i64(std::string_view s) {
    std::int64_t v = 0;
    std::memcpy(&v, s.data(), std::min<std::size_t>(8, s.size()));
    return v;
  }

  DTRAIN_DECL std::size_t parse_request(std::string_view buf, store_cmd& cmd, std::vector<std::string_view>& args,
                                        std::size_t max_arg) {
    if (buf.empty()) return 0;
    cmd = static_cast<store_cmd>(buf[0]);
    const int nargs = cmd == store_cmd::get || cmd == store_cmd::hello || cmd == store_cmd::age ? 1 : 2;
    std::size_t pos = 1;
    args.clear();
    for (int i = 0; i < nargs; ++i) {
      if (buf.size() < pos + 4) return 0;
      const std::uint32_t len = get_u32(buf.data() + pos);
      if (len > max_arg) return request_too_large;
      if (buf.size() - pos - 4 < len) return 0;
      args.emplace_back(buf.data() + pos + 4, len);
      pos += 4 + len;
    }
    return pos;
  }

  DTRAIN_DECL std::string bind_address_of(const std::string& master_addr) {
    if (master_addr.empty()) return "0.0.0.0";
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (const int rc = ::getaddrinfo(master_addr.c_str(), nullptr, &hints, &res); rc != 0 || res == nullptr)
      throw launch_error("rank 0 cannot resolve the master address '" + master_addr + "': " + ::gai_strerror(rc),
                         "set MASTER_ADDR to this machine's name or IPv4 address (or DTRAIN_STORE_BIND to the "
                         "address the rendezvous should listen on)");
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, text, sizeof text);
    ::freeaddrinfo(res);
    return text;
  }
  }  // namespace detail
}  // namespace dtrain

namespace dtrain {

DTRAIN_DECL TcpStoreServer::TcpStoreServer(int port, std::string_view bind_addr, std::string token, StoreLimits limits)
    : token_(std::move(token)), limits_(limits) {
  // Each client costs a descriptor: raise this process's soft limit to its
  // hard one, so that hundreds of ranks (and a flood) meet StoreLimits, not EMFILE.
  if (rlimit nofile{}; ::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &nofile);
  }
  // Non-blocking: the serve thread accepts until none is waiting.
  detail::Fd fd{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)};
  if (fd.get() < 0) throw launch_error("cannot create the rendezvous socket: " + detail::errno_text());
  const int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, std::string(bind_addr).c_str(), &addr.sin_addr) != 1)
    throw launch_error("invalid rendezvous bind address '" + std::string(bind_addr) + "'",
                       "give an IPv4 address of this machine (DTRAIN_STORE_BIND), or 0.0.0.0 for every interface");
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const bool in_use = errno == EADDRINUSE;
    throw launch_error(
        "rank 0 cannot host the rendezvous on port " + std::to_string(port) + ": " + detail::errno_text(),
        in_use ? "another job (or a stale process) holds this port: choose another with "
                 "--master-port / MASTER_PORT, or stop the other process"
        : errno == EADDRNOTAVAIL
            ? "the address " + std::string(bind_addr) +
                  " is not one of this machine's: rank 0 listens on the master address; set MASTER_ADDR to "
                  "this machine's address, or DTRAIN_STORE_BIND=0.0.0.0 to listen on every interface"
            : std::string("check MASTER_PORT and that this process may bind it"));
  }
  if (::listen(fd.get(), 1024) != 0)
    throw launch_error("cannot listen on the rendezvous socket: " + detail::errno_text());
  socklen_t len = sizeof addr;
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  if (::pipe2(wake_, O_CLOEXEC) != 0) throw launch_error("cannot create a pipe: " + detail::errno_text());
  listen_ = std::move(fd);
  thread_ = std::thread([this] { serve(); });
}

DTRAIN_DECL TcpStoreServer::~TcpStoreServer() {
  // Rank 0 may finish first while other ranks still read keys it wrote (a
  // last agreement, a final barrier): stay until every client has hung up,
  // for at most `linger`, so that their last request does not meet a closed
  // store ("lost the rendezvous master"). When rank 0 is failing (its
  // World is destroyed by an exception), the others only need the store to
  // diagnose the same failure; ranks behind a cut link would hold their
  // connections open forever, so the wait is short.
  const auto until = detail::steady::now() + (std::uncaught_exceptions() > 0 ? failing_linger : linger);
  while (connected_.load() > 0 && detail::steady::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  stop_ = true;
  const char b = 0;
  [[maybe_unused]] auto r = ::write(wake_[1], &b, 1);
  if (thread_.joinable()) thread_.join();
  ::close(wake_[0]);
  ::close(wake_[1]);
}

DTRAIN_DECL auto TcpStoreServer::departed(const Client& c) -> void {
  if (c.rank < 0 || --live_[c.rank] > 0) return;
  std::string& list = map_[std::string(detail::departed_key)];
  if (list.empty()) list = ",";
  list += std::to_string(c.rank);
  list += ',';
}

DTRAIN_DECL auto TcpStoreServer::refuse(const Client& c, std::string_view why) -> void {
  ++refused_;
  if (refused_ <= 20 || refused_ % 1000 == 0)
    std::fprintf(stderr, "dtrain: the rendezvous on port %d refused a client from %s: %.*s%s\n", port_, c.peer.c_str(),
                 static_cast<int>(why.size()), why.data(),
                 refused_ == 20 ? " (further refusals: one line per thousand)" : "");
}

DTRAIN_DECL auto TcpStoreServer::accept_clients(std::vector<Client>& clients) -> void {
  for (;;) {
    sockaddr_in from{};
    socklen_t len = sizeof from;
    const int fd = ::accept4(listen_.get(), reinterpret_cast<sockaddr*>(&from), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (errno == EMFILE || errno == ENFILE) {
        // Out of descriptors: the oldest handshake makes room (a flood of
        // silent connections must not lock the ranks out), else wait.
        const auto oldest =
            std::find_if(clients.begin(), clients.end(), [](const Client& c) { return !c.authenticated; });
        if (oldest == clients.end()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          return;
        }
        refuse(*oldest, "out of file descriptors; the oldest unauthenticated connection was closed");
        clients.erase(oldest);
        continue;
      }
      return;  // EAGAIN: no more waiting
    }
    Client c;
    c.fd = detail::Fd{fd};
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &from.sin_addr, text, sizeof text);
    c.peer = detail::endpoint(text, ntohs(from.sin_port));
    c.since = detail::steady::now();
    if (clients.size() >= limits_.max_clients) {
      refuse(c, "the store already serves " + std::to_string(clients.size()) + " connections (its limit)");
      continue;
    }
    const auto pending = static_cast<std::size_t>(
        std::count_if(clients.begin(), clients.end(), [](const Client& k) { return !k.authenticated; }));
    if (pending >= limits_.max_pending) {
      const auto oldest =
          std::find_if(clients.begin(), clients.end(), [](const Client& k) { return !k.authenticated; });
      refuse(*oldest, "too many connections in their handshake; the oldest was closed");
      clients.erase(oldest);
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c.nonce = detail::random_bytes(detail::auth_nonce_bytes);
    std::string hello(detail::store_magic);
    hello.push_back(static_cast<char>(detail::store_protocol_version));
    hello.push_back(token_.empty() ? 0 : 1);
    hello += c.nonce;
    // A fresh socket's buffer takes these 38 bytes at once.
    if (::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(hello.size())) continue;
    clients.push_back(std::move(c));
  }
}

DTRAIN_DECL auto TcpStoreServer::check_answer(Client& c) -> bool {
  const std::string_view answer(c.in);
  const auto client_nonce = answer.substr(0, detail::auth_nonce_bytes);
  const auto proof = answer.substr(detail::auth_nonce_bytes, detail::auth_proof_bytes);
  std::string verdict(detail::store_verdict_bytes, '\0');
  if (!token_.empty()) {
    if (!detail::same_bytes(proof, detail::auth_proof(token_, detail::store_client_role, c.nonce, client_nonce))) {
      refuse(c, "it did not prove the job token (a wrong token, none, or not a dtrain rank)");
      verdict[0] = 0;
      [[maybe_unused]] auto w = ::send(c.fd.get(), verdict.data(), verdict.size(), MSG_NOSIGNAL);
      return false;
    }
    const auto mine = detail::auth_proof(token_, detail::store_server_role, c.nonce, client_nonce);
    verdict.replace(1, mine.size(), mine);
  }
  verdict[0] = 1;
  c.authenticated = true;
  c.in.clear();
  return ::send(c.fd.get(), verdict.data(), verdict.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(verdict.size());
}

DTRAIN_DECL auto TcpStoreServer::serve() -> void {
  std::vector<Client> clients;
  std::vector<pollfd> fds;
  while (!stop_) {
    fds.assign({{listen_.get(), POLLIN, 0}, {wake_[0], POLLIN, 0}});
    for (auto& c : clients) fds.push_back({c.fd.get(), POLLIN, 0});
    // Handshakes time out: wake up to close the ones past their deadline.
    const bool pending = std::any_of(clients.begin(), clients.end(), [](const Client& c) { return !c.authenticated; });
    if (::poll(fds.data(), fds.size(), pending ? 250 : -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    std::vector<bool> dead(clients.size(), false);
    const auto now = detail::steady::now();
    for (std::size_t i = 0; i < clients.size(); ++i) {
      if (fds[i + 2].revents & (POLLIN | POLLHUP | POLLERR)) dead[i] = !read_and_answer(clients[i]);
      if (!dead[i] && !clients[i].authenticated && now - clients[i].since > limits_.handshake_timeout) {
        refuse(clients[i],
               "it did not complete the handshake within " + std::to_string(limits_.handshake_timeout.count()) + " ms");
        dead[i] = true;
      }
    }
    for (std::size_t i = clients.size(); i-- > 0;)
      if (dead[i]) {
        departed(clients[i]);
        clients.erase(clients.begin() + static_cast<std::ptrdiff_t>(i));
      }
    if (fds[0].revents & POLLIN) accept_clients(clients);
    connected_.store(static_cast<std::size_t>(
        std::count_if(clients.begin(), clients.end(), [](const Client& c) { return c.authenticated; })));
  }
}

DTRAIN_DECL auto TcpStoreServer::read_and_answer(Client& c) -> bool {
  char buf[65536];
  // Before the handshake, only the client's answer is read: a stranger
  // cannot make the server hold more than these 64 bytes.
  const std::size_t want = c.authenticated ? sizeof buf : detail::store_answer_bytes - c.in.size();
  const ssize_t n = ::recv(c.fd.get(), buf, want, 0);
  if (n <= 0) {
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (!c.authenticated) refuse(c, "it closed the connection before proving the job token");
    return false;
  }
  c.in.append(buf, static_cast<std::size_t>(n));
  if (!c.authenticated) return c.in.size() < detail::store_answer_bytes || check_answer(c);
  detail::store_cmd cmd{};
  std::vector<std::string_view> args;
  std::size_t used = 0;
  std::string reply;
  for (;;) {
    const std::size_t k =
        detail::parse_request(std::string_view(c.in).substr(used), cmd, args, limits_.max_request_bytes);
    if (k == 0) break;
    if (k == detail::request_too_large) {
      refuse(c, "a request declared more than the store's limit of " + std::to_string(limits_.max_request_bytes) +
                    " bytes");
      return false;
    }
    used += k;
    switch (cmd) {
      case detail::store_cmd::set:
        map_[std::string(args[0])] = std::string(args[1]);
        set_at_[std::string(args[0])] = detail::steady::now();
        reply.push_back(1);
        break;
      case detail::store_cmd::get:
      case detail::store_cmd::age: {
        const auto it = map_.find(args[0]);
        reply.push_back(it != map_.end() ? 1 : 0);
        detail::put_str(reply, it != map_.end() ? std::string_view(it->second) : std::string_view{});
        if (cmd == detail::store_cmd::age) {
          const auto at = set_at_.find(args[0]);
          const auto age =
              at == set_at_.end()
                  ? std::chrono::milliseconds(0)
                  : std::chrono::duration_cast<std::chrono::milliseconds>(detail::steady::now() - at->second);
          reply += detail::i64_bytes(age.count());
        }
        break;
      }
      case detail::store_cmd::hello: {
        const auto rank = detail::parse_integer(args[0]);
        if (!rank || *rank < 0 || *rank > std::numeric_limits<int>::max() || c.rank >= 0)
          return false;  // malformed, or announced twice: drop it
        c.rank = static_cast<int>(*rank);
        ++live_[c.rank];
        reply.push_back(1);
        break;
      }
      case detail::store_cmd::add: {
        auto& v = map_[std::string(args[0])];
        // Wraps around as two's complement (found by fuzzing: a signed
        // overflow here was undefined behaviour); dtrain's counters never get there.
        const auto sum = static_cast<std::uint64_t>(v.empty() ? 0 : detail::bytes_i64(v)) +
                         static_cast<std::uint64_t>(detail::bytes_i64(args[1]));
        const auto now = static_cast<std::int64_t>(sum);
        v = detail::i64_bytes(now);
        detail::put_str(reply, v);
        break;
      }
      default: refuse(c, "it sent an unknown request"); return false;
    }
  }
  c.in.erase(0, used);
  // Replies go out whole: the socket is non-blocking, so a client that
  // stops reading gets its own deadline rather than stalling the others.
  const auto deadline = detail::steady::now() + limits_.handshake_timeout;
  std::size_t sent = 0;
  while (sent < reply.size()) {
    const ssize_t w = ::send(c.fd.get(), reply.data() + sent, reply.size() - sent, MSG_NOSIGNAL);
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (detail::wait_fd(c.fd.get(), POLLOUT, deadline)) continue;
      refuse(c, "it did not read its answers");
      return false;
    }
    if (w <= 0) return false;
    sent += static_cast<std::size_t>(w);
  }
  return true;
}

DTRAIN_DECL TcpStore::TcpStore(std::string host, int port, std::chrono::milliseconds timeout, std::string token)
    : host_(std::move(host)), port_(port), timeout_(timeout), token_(std::move(token)) {
  connect();
}

DTRAIN_DECL auto TcpStore::set(std::string_view key, std::string_view value) -> void {
  std::string req(1, static_cast<char>(detail::store_cmd::set));
  detail::put_str(req, key);
  detail::put_str(req, value);
  std::lock_guard lock(mu_);
  send_all(req, key);
  recv_exact(1, key);
}

DTRAIN_DECL auto TcpStore::try_get(std::string_view key) -> std::optional<std::string> {
  auto [found, value, age] = lookup(detail::store_cmd::get, key);
  if (!found) return std::nullopt;
  return std::move(value);
}

DTRAIN_DECL auto TcpStore::try_get_aged(std::string_view key) -> std::optional<Aged> {
  auto [found, value, age] = lookup(detail::store_cmd::age, key);
  if (!found) return std::nullopt;
  return Aged{std::move(value), age};
}

DTRAIN_DECL auto TcpStore::announce(int rank) -> void {
  std::string req(1, static_cast<char>(detail::store_cmd::hello));
  detail::put_str(req, std::to_string(rank));
  std::lock_guard lock(mu_);
  send_all(req, "announce");
  recv_exact(1, "announce");
}

DTRAIN_DECL auto TcpStore::get(std::string_view key, std::optional<std::chrono::milliseconds> timeout,
                               std::span<const int> setters) -> std::string {
  const auto deadline = detail::steady::now() + timeout.value_or(timeout_);
  auto backoff = std::chrono::microseconds(200);
  for (;;) {
    if (auto v = try_get(key)) return *std::move(v);
    if (!setters.empty()) {
      if (const auto gone = departed_among(setters); !gone.empty()) {
        // The server handled each rank's last request before its hang-up:
        // the key is either there now or will never be.
        if (auto v = try_get(key)) return *std::move(v);
        throw comm_error("rank " + gone + " left the job before setting rendezvous key '" + std::string(key) +
                             "' (its connection to the rendezvous closed: it exited or was killed)",
                         "see that rank's log for why it ended; the job cannot go on without it (restart the "
                         "job, e.g. dtrain-run --max-restarts with resume=latest)");
      }
    }
    if (detail::steady::now() >= deadline)
      throw timeout_error("rendezvous key '" + std::string(key) + "' was not set within " +
                              std::to_string(timeout.value_or(timeout_).count()) + " ms",
                          "a rank did not reach this point: check that every rank runs the same "
                          "program and that none of them failed (see its log)");
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::microseconds(20000));
  }
}

DTRAIN_DECL auto TcpStore::departed_among(std::span<const int> ranks) -> std::string {
  const auto list = try_get(detail::departed_key);
  if (!list) return {};
  std::string out;
  for (int r : ranks) {
    std::string needle = std::to_string(r);
    needle.insert(needle.begin(), ',');
    needle += ',';
    if (list->find(needle) == std::string::npos) continue;
    if (!out.empty()) out += ", ";
    out += std::to_string(r);
  }
  return out;
}

DTRAIN_DECL auto TcpStore::add(std::string_view key, std::int64_t delta) -> std::int64_t {
  std::string req(1, static_cast<char>(detail::store_cmd::add));
  detail::put_str(req, key);
  detail::put_str(req, detail::i64_bytes(delta));
  std::lock_guard lock(mu_);
  send_all(req, key);
  return detail::bytes_i64(recv_exact(detail::get_u32(recv_exact(4, key).data()), key));
}

DTRAIN_DECL auto TcpStore::connect() -> void {
  const auto deadline = detail::steady::now() + timeout_;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  std::string last_error = "no attempt made";
  auto backoff = std::chrono::milliseconds(10);
  do {
    addrinfo* res = nullptr;
    const int rc = ::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &res);
    if (rc != 0) {
      last_error = std::string("cannot resolve host: ") + ::gai_strerror(rc);
    } else {
      for (addrinfo* a = res; a; a = a->ai_next) {
        detail::Fd fd{::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol)};
        if (fd.get() < 0) continue;
        int r = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
        if (r != 0 && errno == EINPROGRESS) {
          if (detail::wait_fd(fd.get(), POLLOUT, std::min(deadline, detail::steady::now() + std::chrono::seconds(2)))) {
            int err = 0;
            socklen_t len = sizeof err;
            ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
            errno = err;
            r = err == 0 ? 0 : -1;
          } else {
            errno = ETIMEDOUT;
          }
        }
        if (r == 0) {
          const std::string lost_why = handshake(fd.get(), deadline);
          if (!lost_why.empty()) {
            last_error = lost_why;
            continue;
          }
          ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
          const int one = 1;
          ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          sockaddr_in local{};
          socklen_t len = sizeof local;
          ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len);
          char text[INET_ADDRSTRLEN] = {};
          ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text);
          local_address_ = text;
          fd_ = std::move(fd);
          ::freeaddrinfo(res);
          return;
        }
        last_error = detail::errno_text();
      }
      ::freeaddrinfo(res);
    }
    // Told to stop (a watched signal: dtrain-run stopping the ranks because
    // one failed, or a scheduler's notice) with no master to reach: there
    // is nothing to wait for, and nothing to save yet.
    if (const int sig = detail::preemption_signal; sig != 0)
      throw launch_error("stopped by " + signal_name(sig) + " while trying to reach the rendezvous master at " +
                             detail::endpoint(host_, port_) + " (" + last_error + ")",
                         "if a rank failed first, its log says why; else start rank 0 (MASTER_ADDR/MASTER_PORT)");
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  } while (detail::steady::now() < deadline);
  throw launch_error("cannot reach the rendezvous master at " + detail::endpoint(host_, port_) + " within " +
                         std::to_string(timeout_.count()) + " ms (" + last_error + ")",
                     "check MASTER_ADDR/MASTER_PORT (or --master-addr/--master-port), that rank 0 "
                     "is running, and that no firewall blocks the port");
}

DTRAIN_DECL auto TcpStore::handshake(int fd, detail::steady::time_point deadline) -> std::string {
  const std::string where = "the rendezvous at " + detail::endpoint(host_, port_);
  // Reads exactly n bytes; "" and a reason when the connection ended first.
  const auto read_n = [&](std::size_t n, std::string& out) -> std::string {
    out.assign(n, '\0');
    std::size_t got = 0;
    while (got < n) {
      if (!detail::wait_fd(fd, POLLIN, deadline)) return "no handshake from " + where;
      const ssize_t r = ::recv(fd, out.data() + got, n - got, 0);
      if (r == 0) return where + " closed the connection during the handshake";
      if (r < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
        return detail::errno_text();
      }
      got += static_cast<std::size_t>(r);
    }
    return {};
  };
  std::string hello;
  if (auto why = read_n(detail::store_hello_bytes, hello); !why.empty()) return why;
  if (std::string_view(hello).substr(0, 4) != detail::store_magic ||
      static_cast<std::uint8_t>(hello[4]) != detail::store_protocol_version)
    throw launch_error(where + " does not speak dtrain's rendezvous protocol (version " +
                           std::to_string(detail::store_protocol_version) + ")",
                       "another program holds MASTER_PORT, or rank 0 runs another dtrain version: choose another "
                       "port, and run the same build on every rank");
  const bool server_has_token = hello[5] != 0;
  if (server_has_token && token_.empty())
    throw launch_error(where + " requires the job's token, and this process has none",
                       "launch the ranks with dtrain-run (it passes the token to each), or give every rank the "
                       "job's DTRAIN_JOB_TOKEN");
  if (!server_has_token && !token_.empty())
    throw launch_error(where + " runs without a job token, and this rank has one",
                       "every rank of a job needs the same DTRAIN_JOB_TOKEN (or all DTRAIN_INSECURE_NO_TOKEN=1); "
                       "a store without a token may also be a stranger's posing as rank 0");
  const std::string server_nonce = hello.substr(6);
  const std::string my_nonce = detail::random_bytes(detail::auth_nonce_bytes);
  std::string answer = my_nonce;
  answer += token_.empty() ? std::string(detail::auth_proof_bytes, '\0')
                           : detail::auth_proof(token_, detail::store_client_role, server_nonce, my_nonce);
  std::size_t sent = 0;
  while (sent < answer.size()) {
    if (!detail::wait_fd(fd, POLLOUT, deadline)) return "the handshake with " + where + " timed out";
    const ssize_t w = ::send(fd, answer.data() + sent, answer.size() - sent, MSG_NOSIGNAL);
    if (w < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (w <= 0) return detail::errno_text();
    sent += static_cast<std::size_t>(w);
  }
  std::string verdict;
  if (auto why = read_n(detail::store_verdict_bytes, verdict); !why.empty()) return why;
  if (verdict[0] != 1)
    throw launch_error(where + " refused this rank: its job token is not the job's",
                       "give every rank the same DTRAIN_JOB_TOKEN (dtrain-run passes its own to the ranks it "
                       "starts; nodes launched separately need the same one exported)");
  if (server_has_token &&
      !detail::same_bytes(std::string_view(verdict).substr(1),
                          detail::auth_proof(token_, detail::store_server_role, server_nonce, my_nonce)))
    throw launch_error(where + " did not prove the job token: it is not this job's rendezvous",
                       "check MASTER_ADDR/MASTER_PORT: another process answers there");
  return {};
}

DTRAIN_DECL auto TcpStore::lookup(detail::store_cmd cmd, std::string_view key)
    -> std::tuple<bool, std::string, std::chrono::milliseconds> {
  std::string req(1, static_cast<char>(cmd));
  detail::put_str(req, key);
  std::lock_guard lock(mu_);
  send_all(req, key);
  const bool found = recv_exact(1, key)[0] != 0;
  std::string value = recv_exact(detail::get_u32(recv_exact(4, key).data()), key);
  std::chrono::milliseconds age{0};
  if (cmd == detail::store_cmd::age) age = std::chrono::milliseconds(detail::bytes_i64(recv_exact(8, key)));
  return {found, std::move(value), age};
}

DTRAIN_DECL auto TcpStore::send_all(std::string_view data, std::string_view key) -> void {
  // After a failed exchange the stream may hold half a request or a late
  // answer: nothing read from it could be trusted again.
  if (!broken_.empty()) lost(key, broken_);
  const auto deadline = detail::steady::now() + timeout_;
  std::size_t sent = 0;
  while (sent < data.size()) {
    if (!detail::wait_fd(fd_.get(), POLLOUT, deadline)) lost(key, "send timed out");
    const ssize_t w = ::send(fd_.get(), data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (w <= 0) lost(key, detail::errno_text());
    sent += static_cast<std::size_t>(w);
  }
}

DTRAIN_DECL auto TcpStore::recv_exact(std::size_t n, std::string_view key) -> std::string {
  const auto deadline = detail::steady::now() + timeout_;
  std::string out(n, '\0');
  std::size_t got = 0;
  while (got < n) {
    if (!detail::wait_fd(fd_.get(), POLLIN, deadline)) lost(key, "no answer");
    const ssize_t r = ::recv(fd_.get(), out.data() + got, n - got, 0);
    if (r == 0) lost(key, "connection closed");
    if (r < 0) {
      if (errno == EINTR) continue;
      lost(key, detail::errno_text());
    }
    got += static_cast<std::size_t>(r);
  }
  return out;
}

DTRAIN_DECL auto TcpStore::lost(std::string_view key, const std::string& why) -> void {
  if (broken_.empty()) broken_ = why;
  throw comm_error("lost the rendezvous master at " + detail::endpoint(host_, port_) + " while accessing '" +
                       std::string(key) + "': " + why,
                   "rank 0 hosts the rendezvous: it has probably exited or crashed; see its log");
}
}  // namespace dtrain
DTRAIN_IMPL_END
