// The definitions comm.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/backend/host/comm.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain {
  namespace detail {

  DTRAIN_DECL std::string node_identity(const World& world) {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    std::string boot;
    std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
    return std::string(host) + "/" + boot + "/" + world.node_tag();
  }

  DTRAIN_DECL std::string shm_name_prefix() {
    const char* job = std::getenv("DTRAIN_JOB_ID");
    if (job && *job) return "/dtrain-" + std::string(job) + "-";
    return "/dtrain-p" + std::to_string(::getpid()) + "-";
  }

  DTRAIN_DECL NodeMap map_nodes(const std::vector<std::string>& ids, int me) {
    NodeMap map;
    std::map<std::string, int> index;
    for (int r = 0; r < static_cast<int>(ids.size()); ++r) {
      auto [it, fresh] = index.try_emplace(ids[static_cast<std::size_t>(r)], static_cast<int>(map.members.size()));
      if (fresh) map.members.emplace_back();
      auto& node = map.members[static_cast<std::size_t>(it->second)];
      if (r == me) {
        map.node = it->second;
        map.local = static_cast<int>(node.size());
      }
      node.push_back(r);
    }
    return map;
  }
  }  // namespace detail
}  // namespace dtrain

namespace dtrain {

DTRAIN_DECL HostCommunicator::HostCommunicator(World& world, std::optional<host_transport> force)
    : rank_(world.rank()), size_(world.size()), timeout_(world.options().timeout) {
  const std::string prefix = world.next_prefix("host");
  tracker_ =
      std::make_unique<detail::CollectiveTracker>(world.store(), prefix, rank_, size_, timeout_, world.rank_namer());
  if (size_ > 1) connect(world, prefix, force.value_or(world.options().host));
  worker_ = std::thread([this] { run(); });
}

DTRAIN_DECL HostCommunicator::~HostCommunicator() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

DTRAIN_DECL auto HostCommunicator::transport() const -> std::string_view {
  switch (mode_) {
    case mode::shm: return "shm";
    case mode::hierarchical: return "shm+gloo";
    case mode::gloo: return "gloo";
    default: return "none";
  }
}

DTRAIN_DECL auto HostCommunicator::barrier() -> HostWork {
  return submit("barrier", [this](std::uint32_t tag) {
    if (shm_) shm_->barrier();
    if (mode_ == mode::hierarchical) {
      cross_->barrier(tag);
      shm_->barrier();
    }
    if (gloo_) gloo_->barrier(tag);
  });
}

DTRAIN_DECL auto HostCommunicator::connect(World& world, const std::string& prefix, host_transport wanted) -> void {
  const auto& opt = world.options();
  const auto ids = world.all_gather("node", detail::node_identity(world));
  nodes_ = detail::map_nodes(ids, rank_);
  const std::size_t node_count = nodes_.members.size();
  const std::size_t per_node = nodes_.members[static_cast<std::size_t>(nodes_.node)].size();
  const std::string shape =
      std::to_string(size_) + " ranks on " + std::to_string(node_count) + (node_count == 1 ? " node" : " nodes");
  mode_ = mode::gloo;
  std::string why_gloo = wanted == host_transport::gloo ? "forced" : "";
  if (wanted != host_transport::gloo) {
    if (node_count == 1) {
      mode_ = mode::shm;
    } else if (!nodes_.uniform()) {
      why_gloo = "nodes hold unequal numbers of ranks";
    } else if (per_node == 1) {
      why_gloo = "one rank per node";
    } else {
      mode_ = mode::hierarchical;
    }
    if (mode_ == mode::gloo && wanted == host_transport::shm)
      throw config_error(
          "DTRAIN_HOST_TRANSPORT=shm, but shared memory cannot serve this job: " + why_gloo + " (" + shape + ")",
          "launch the same number of ranks (more than one) on every node, or use "
          "DTRAIN_HOST_TRANSPORT=auto to fall back to Gloo");
  }
  if (mode_ != mode::gloo) {
    std::string failure = attach_shm(world, prefix, opt);
    // Every rank must take the same path: agree on whether all attached.
    const auto all = world.all_gather("shm-ok", failure);  // "" where a rank attached
    const auto bad = std::find_if(all.begin(), all.end(), [](const std::string& s) { return !s.empty(); });
    if (bad != all.end()) {
      const std::string who = "rank " + world.describe_rank(static_cast<int>(bad - all.begin()));
      shm_.reset();
      if (wanted == host_transport::shm)
        throw comm_error(who + " could not set up shared memory: " + *bad,
                         "fix /dev/shm on that node or use DTRAIN_HOST_TRANSPORT=auto to fall back to Gloo");
      if (rank_ == 0)
        std::fprintf(stderr, "dtrain: shared memory unavailable (%s: %s); host collectives use Gloo over TCP\n",
                     who.c_str(), bad->c_str());
      mode_ = mode::gloo;
      why_gloo = "shared memory unavailable";
    }
  }
  const std::string wait(detail::shm_wait_name(opt.wait));
  if (mode_ == mode::shm) {
    description_ = "shm (" + shape + ", wait " + wait + ")";
  } else if (mode_ == mode::hierarchical) {
    // Local index i of every node: one Gloo group per slice.
    World slice = world.split(nodes_.local, "slice");
    cross_ = std::make_unique<detail::GlooEngine>(slice, slice.next_prefix("gloo"));
    where_.resize(static_cast<std::size_t>(size_));
    for (std::size_t m = 0; m < node_count; ++m)
      for (std::size_t i = 0; i < per_node; ++i)
        where_[static_cast<std::size_t>(nodes_.members[m][i])] = {static_cast<int>(m), static_cast<int>(i)};
    // A slice group orders its members by rank, which need not be node
    // order (e.g. node 0 = ranks {0, 3}, node 1 = {1, 2}).
    slice_ranks_.assign(per_node, {});
    member_.assign(node_count, std::vector<int>(per_node));
    for (std::size_t i = 0; i < per_node; ++i) {
      auto& ranks = slice_ranks_[i];
      for (const auto& node : nodes_.members) ranks.push_back(node[i]);
      std::sort(ranks.begin(), ranks.end());
      for (std::size_t m = 0; m < node_count; ++m)
        member_[m][i] = static_cast<int>(std::find(ranks.begin(), ranks.end(), nodes_.members[m][i]) - ranks.begin());
    }
    for (int r : slice_ranks_[static_cast<std::size_t>(nodes_.local)])
      if (r != rank_) gloo_peers_.push_back(r);
    description_ = "shm+gloo (" + shape + ": shared memory within a node, Gloo between nodes, wait " + wait + ")";
  } else {
    gloo_ = std::make_unique<detail::GlooEngine>(world, prefix);
    for (int r = 0; r < size_; ++r)
      if (r != rank_) gloo_peers_.push_back(r);
    description_ = "gloo (" + shape + (why_gloo.empty() ? "" : ", " + why_gloo) + ")";
  }
}

DTRAIN_DECL auto HostCommunicator::attach_shm(World& world, const std::string& prefix, const CommOptions& opt)
    -> std::string {
  const auto& mine = nodes_.members[static_cast<std::size_t>(nodes_.node)];
  const int local_size = static_cast<int>(mine.size());
  detail::ShmOptions cfg;
  cfg.part_bytes = opt.shm_part_bytes;
  cfg.wait = opt.wait;
  // auto: spin to cover a peer a step behind, barely at all where ranks
  // outnumber the cores (HostTuning).
  using tuning = detail::HostTuning;
  cfg.spin = local_size <= usable_cpu_count() ? tuning::shm_spin : tuning::shm_spin_oversubscribed;
  const std::size_t bytes = detail::shm_segment_bytes(local_size, cfg);
  const std::string key = prefix + "shm/" + std::to_string(nodes_.node);
  auto& store = *world.store();
  std::string failure;
  detail::ShmSegment seg;
  try {
    if (nodes_.local == 0) {
      std::random_device rd;
      char tail[32];
      std::snprintf(tail, sizeof tail, "%08x%08x", rd(), rd());
      const std::string name = detail::shm_name_prefix() + tail;
      try {
        seg = detail::ShmSegment::create(name, bytes);
        detail::ShmEngine::format(seg, local_size, cfg);
        store.set(key + "/name", name);
      } catch (const error& e) {
        store.set(key + "/name", "!" + e.problem());
        throw;
      }
    } else {
      const std::string name = store.get(key + "/name");
      if (!name.empty() && name[0] == '!')
        throw comm_error("this node's first rank could not create the segment: " + name.substr(1));
      seg = detail::ShmSegment::open(name, bytes);
    }
  } catch (const error& e) {
    failure = e.problem();
  }
  if (failure.empty()) {
    auto namer = world.rank_namer();
    shm_ =
        std::make_unique<detail::ShmEngine>(std::move(seg), nodes_.local, local_size, cfg, timeout_,
                                            [namer, mine](int j) { return namer(mine[static_cast<std::size_t>(j)]); });
    if (!shm_->matches(local_size, cfg)) {
      failure = "the segment's layout does not match this rank's (ranks run different dtrain versions)";
      shm_.reset();
    }
  }
  // Attached or not, say so; the creator then removes the name.
  const std::string attached = key + "/attached";
  store.add(attached, 1);
  if (nodes_.local == 0 && shm_) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (store.add(attached, 0) < local_size && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    shm_->unlink();
  }
  return failure;
}

DTRAIN_DECL auto HostCommunicator::member_of_node(int local, int node) const -> int {
  return member_[static_cast<std::size_t>(node)][static_cast<std::size_t>(local)];
}

DTRAIN_DECL auto HostCommunicator::rank_of_member(int local, int k) const -> int {
  return slice_ranks_[static_cast<std::size_t>(local)][static_cast<std::size_t>(k)];
}

DTRAIN_DECL auto HostCommunicator::check_sizes(const char* what, const char* big_name, std::size_t big,
                                               const char* small_name, std::size_t small_n) const -> void {
  if (big != small_n * static_cast<std::size_t>(size_))
    throw config_error(std::string(what) + ": " + big_name + " has " + std::to_string(big) + " elements but " +
                           small_name + " has " + std::to_string(small_n) + " and the world has " +
                           std::to_string(size_) + " ranks",
                       std::string(big_name) + " must hold exactly world size x " + small_name + " elements");
}

DTRAIN_DECL auto HostCommunicator::enqueue(const char* name, std::function<void(std::uint32_t)> fn) -> HostWork {
  auto state = std::make_shared<detail::GlooWorkState>();
  const std::uint64_t seq = tracker_->enter();
  {
    std::lock_guard lock(mu_);
    queue_.push_back({std::move(fn), state, name, seq});
    queued_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  return HostWork(state);
}

DTRAIN_DECL auto HostCommunicator::run() -> void {
  for (;;) {
    Task task;
    detail::spin_until([&] { return queued_.load(std::memory_order_acquire) > 0; });
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop requested and nothing left to run
      task = std::move(queue_.front());
      queue_.pop_front();
      queued_.fetch_sub(1, std::memory_order_relaxed);
    }
    task.state->finish(execute(task));
  }
}

DTRAIN_DECL auto HostCommunicator::execute(const Task& task) -> std::exception_ptr {
  if (broken_) return broken_;
  const char* fix =
      "a rank is stuck, crashed or runs different code, or the network between nodes failed; see the other "
      "ranks' logs. The timeout is CommOptions::timeout (timeout_s= in the examples, env DTRAIN_COMM_TIMEOUT_S)";
  try {
    fault::hit(fault::point::collective);
    task.run(static_cast<std::uint32_t>(task.seq));
    return nullptr;
  } catch (const ::gloo::Exception& e) {
    const std::string cause = e.what();
    // Which ranks lagged is known for a timeout; a connection that failed
    // before it means a peer is gone, and the heartbeat's numbers are stale.
    const bool timed_out = cause.find("imed out") != std::string::npos;
    std::string msg = tracker_->describe(task.name, task.seq, cause, timed_out, gloo_peers_);
    if (timed_out) {
      broken_ = std::make_exception_ptr(timeout_error(msg, fix));
    } else {
      if (dynamic_cast<const ::gloo::IoException*>(&e))
        msg += " (a peer's connection failed: that rank exited or was killed; its own log or launcher names it)";
      broken_ = std::make_exception_ptr(gloo_error(msg, fix));
    }
    return broken_;
  } catch (const detail::shm_wait_error& e) {
    const std::string msg = tracker_->describe(task.name, task.seq, e.cause, e.timed_out);
    if (e.timed_out)
      broken_ = std::make_exception_ptr(timeout_error(msg, fix));
    else
      broken_ = std::make_exception_ptr(comm_error(msg, fix));
    // Peers waiting on this rank fail at once instead of at their timeout.
    shm_.reset();
    return broken_;
  } catch (...) {
    return std::current_exception();
  }
}
}  // namespace dtrain
DTRAIN_IMPL_END
