// The definitions comm_gloo.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/backend/host/comm_gloo.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  namespace detail {

  DTRAIN_DECL auto GlooWorkState::finish(std::exception_ptr e) -> void {
    {
      std::lock_guard lock(mu);
      error = std::move(e);
      done.store(true, std::memory_order_release);
    }
    cv.notify_all();
  }

  DTRAIN_DECL auto GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) -> void {
    store_->set(prefix_ + key, std::string_view(data.data(), data.size()));
  }

  DTRAIN_DECL auto GlooStoreAdapter::get(const std::string& key) -> std::vector<char> {
    const std::string v = store_->get(prefix_ + key);
    return {v.begin(), v.end()};
  }

  DTRAIN_DECL auto GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                                          const std::chrono::milliseconds& timeout) -> void {
    for (const auto& k : keys) store_->get(prefix_ + k, timeout);
  }

  }  // namespace detail
}  // namespace dtrain

namespace dtrain {

DTRAIN_DECL auto HostWork::wait() const -> void {
  if (!state_) return;
  const auto finished = [&] { return state_->done.load(std::memory_order_acquire); };
  if (finished()) {
    if (state_->error) std::rethrow_exception(state_->error);
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  if (!detail::spin_until(finished)) {
    std::unique_lock lock(state_->mu);
    state_->cv.wait(lock, finished);
  }
  detail::collective_wait_ns += static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
  if (state_->error) std::rethrow_exception(state_->error);
}
}  // namespace dtrain

namespace dtrain {

namespace detail {

DTRAIN_DECL GlooEngine::GlooEngine(World& world, const std::string& prefix)
    : rank_(world.rank()), size_(world.size()), timeout_(world.options().timeout) {
  if (size_ > 1) connect(world, prefix);
}

DTRAIN_DECL auto GlooEngine::all_reduce(float* data, std::size_t n, std::uint32_t tag) -> void {
  if (size_ == 1 || n == 0) return;
  ::gloo::AllreduceOptions opts(context_);
  opts.setOutput(data, n);
  opts.setReduceFunction([](void* c, const void* a, const void* b, std::size_t k) {
    auto* out = static_cast<float*>(c);
    const auto* x = static_cast<const float*>(a);
    const auto* y = static_cast<const float*>(b);
    for (std::size_t i = 0; i < k; ++i) out[i] = x[i] + y[i];
  });
  opts.setTag(tag);
  opts.setTimeout(timeout_);
  ::gloo::allreduce(opts);
}

DTRAIN_DECL auto GlooEngine::reduce_scatter(float* acc, std::size_t c, std::uint32_t tag) -> void {
  if (size_ == 1 || c == 0) return;
  const int w = size_;
  const std::size_t bytes = c * sizeof(float);
  if (incoming_.size() < c) incoming_.resize(c);
  float* incoming = incoming_.data();
  auto send_buf = context_->createUnboundBuffer(acc, bytes * static_cast<std::size_t>(w));
  auto recv_buf = context_->createUnboundBuffer(incoming, bytes);
  const std::uint64_t slot = ::gloo::Slot::build(ring_slot_prefix, tag);
  const int right = (rank_ + 1) % w;
  const int left = (rank_ - 1 + w) % w;
  for (int s = 0; s < w - 1; ++s) {
    const auto send_idx = static_cast<std::size_t>((rank_ - s - 1 + 2 * w) % w);
    const auto recv_idx = static_cast<std::size_t>((rank_ - s - 2 + 2 * w) % w);
    send_buf->send(right, slot, send_idx * bytes, bytes);
    recv_buf->recv(left, slot, 0, bytes);
    recv_buf->waitRecv(timeout_);
    add_into(acc + recv_idx * c, incoming, c);
    send_buf->waitSend(timeout_);
  }
}

DTRAIN_DECL auto GlooEngine::all_gather(const void* in, void* out, std::size_t bytes, std::uint32_t tag) -> void {
  auto* o = static_cast<std::uint8_t*>(out);
  if (bytes == 0) return;
  if (size_ == 1) {
    if (in) std::memmove(o, in, bytes);
    return;
  }
  ::gloo::AllgatherOptions opts(context_);
  if (in) opts.setInput(static_cast<std::uint8_t*>(const_cast<void*>(in)), bytes);
  opts.setOutput(o, bytes * static_cast<std::size_t>(size_));
  opts.setTag(tag);
  opts.setTimeout(timeout_);
  ::gloo::allgather(opts);
}

DTRAIN_DECL auto GlooEngine::broadcast(void* data, std::size_t bytes, int root, std::uint32_t tag) -> void {
  if (bytes == 0 || size_ == 1) return;
  ::gloo::BroadcastOptions opts(context_);
  opts.setOutput(static_cast<std::uint8_t*>(data), bytes);
  opts.setRoot(root);
  opts.setTag(tag);
  opts.setTimeout(timeout_);
  ::gloo::broadcast(opts);
}

DTRAIN_DECL auto GlooEngine::barrier(std::uint32_t tag) -> void {
  if (size_ == 1) return;
  ::gloo::BarrierOptions opts(context_);
  opts.setTag(tag);
  opts.setTimeout(timeout_);
  ::gloo::barrier(opts);
}

DTRAIN_DECL auto GlooEngine::connect(World& world, const std::string& prefix) -> void {
  // Gloo writes to its sockets without MSG_NOSIGNAL: a peer that dies while
  // this rank sends would kill it with SIGPIPE instead of failing the
  // collective with a message naming the lost connection. Ignored unless
  // the program set its own handler (PyTorch's processes ignore it too).
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
  // Gloo listens on the interface this rank reaches the master through,
  // unless GLOO_SOCKET_IFNAME names one (as in PyTorch).
  ::gloo::transport::tcp::attr attr;
  if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME"); iface && *iface)
    attr.iface = iface;
  else
    attr.hostname = world.store()->local_address();
  auto device = ::gloo::transport::tcp::CreateDevice(attr);
  auto ctx = std::make_shared<::gloo::rendezvous::Context>(rank_, size_);
  ctx->setTimeout(timeout_);
  GlooStoreAdapter store(world.store(), prefix + "mesh/");
  try {
    ctx->connectFullMesh(store, device);
  } catch (const timeout_error& e) {
    throw timeout_error(
        "rank " + std::to_string(world.global_rank()) + " could not connect its Gloo communicator: " + e.problem(),
        "some rank never created its communicator (crashed earlier, or runs a "
        "different program); check every rank's log");
  } catch (const ::gloo::Exception& e) {
    throw gloo_error(
        std::string("Gloo could not connect rank ") + std::to_string(world.global_rank()) + ": " + e.what(),
        "check that ranks can reach each other over TCP (firewall, GLOO_SOCKET_IFNAME)");
  }
  context_ = std::move(ctx);
  authenticate(world);
}

DTRAIN_DECL auto GlooEngine::authenticate(const World& world) -> void {
  const std::string& token = world.options().job_token;
  if (token.empty()) return;  // DTRAIN_INSECURE_NO_TOKEN (World warned)
  constexpr std::size_t k = auth_nonce_bytes;
  const auto n = static_cast<std::size_t>(size_);
  const auto me = static_cast<std::size_t>(rank_);
  // A stranger on a connection may never answer: fail well before the
  // collective timeout.
  const auto limit = std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(120));
  std::string mine = random_bytes(k);
  std::string theirs(n * k, '\0');
  std::string proofs_out(n * k, '\0');
  std::string proofs_in(n * k, '\0');
  const auto role = [](std::size_t from, std::size_t to) {
    return "dtrain-gloo " + std::to_string(from) + ">" + std::to_string(to);
  };
  // Sends part `at(p)` of `out` to every peer p and receives theirs into `in`.
  const auto exchange = [&](std::string& out, bool same_for_all, std::string& in, std::uint64_t slot) {
    auto send = context_->createUnboundBuffer(out.data(), out.size());
    auto recv = context_->createUnboundBuffer(in.data(), in.size());
    for (std::size_t p = 0; p < n; ++p) {
      if (p == me) continue;
      send->send(static_cast<int>(p), slot, same_for_all ? 0 : p * k, k);
      recv->recv(static_cast<int>(p), slot, p * k, k);
    }
    for (std::size_t i = 0; i + 1 < n; ++i) recv->waitRecv(limit);
    for (std::size_t i = 0; i + 1 < n; ++i) send->waitSend(limit);
  };
  try {
    exchange(mine, true, theirs, ::gloo::Slot::build(auth_slot_prefix, 0));
    for (std::size_t p = 0; p < n; ++p)
      if (p != me) proofs_out.replace(p * k, k, auth_proof(token, role(me, p), theirs.substr(p * k, k), mine));
    exchange(proofs_out, false, proofs_in, ::gloo::Slot::build(auth_slot_prefix, 1));
  } catch (const ::gloo::Exception& e) {
    throw comm_error("rank " + std::to_string(world.global_rank()) +
                         " could not complete the job-token handshake over its Gloo connections: " + e.what(),
                     "a peer did not answer it: a stranger may have taken a rank's place on a connection, or a "
                     "rank died; check every rank's log and who can reach this job's ports (docs/security.md)");
  }
  for (std::size_t p = 0; p < n; ++p) {
    if (p == me) continue;
    if (!same_bytes(std::string_view(proofs_in).substr(p * k, k),
                    auth_proof(token, role(p, me), mine, theirs.substr(p * k, k))))
      throw comm_error("rank " + std::to_string(world.global_rank()) + "'s Gloo connection to rank " +
                           std::to_string(world.global_rank(static_cast<int>(p))) +
                           " did not prove the job token: another process answered in that rank's place",
                       "something on the network connected to this job's Gloo port before the rank did; keep the "
                       "job's network closed to strangers (docs/security.md) and restart it");
  }
}
}  // namespace detail
}  // namespace dtrain
DTRAIN_IMPL_END
