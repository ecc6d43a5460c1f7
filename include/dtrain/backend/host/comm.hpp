#pragma once
// HostCommunicator: the collectives of CPU ranks, whichever way they reach
// each other.
//
//   all ranks on one node    shared memory (backend/host/comm_shm.hpp)
//   several nodes, equal     shared memory within each node, Gloo between
//   numbers of ranks         nodes: local rank i of every node forms one Gloo
//                            group ("slice" i), so every link carries 1/L of
//                            the data and all L slices cross in parallel
//   otherwise, or forced     Gloo over TCP between all ranks
//
// The choice is automatic (CommOptions::host, env DTRAIN_HOST_TRANSPORT) and
// transport() says which was made. Ranks are on one node when they share the
// host name, the boot id and the launcher's node index (World::node_tag).
//
// The collectives are asynchronous: each communicator owns one progress
// thread that runs them in the order they were issued; the caller gets a
// HostWork to wait on and keeps computing meanwhile (DDP overlaps the
// gradient all-reduce with backward this way). Issue order and sizes must be
// the same on every rank, as with any collective library.
//
// Hierarchical all_reduce: shared-memory reduce-scatter within the node, a
// Gloo all-reduce of each slice across nodes, shared-memory all-gather. Each
// element is summed once (node sums in local-rank order, then Gloo's ring),
// so every rank gets bit-identical results. Half dtypes are widened to fp32
// first and rounded once at the end, as on the flat paths.

#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include "dtrain/backend/host/comm_gloo.hpp"
#include "dtrain/backend/host/comm_shm.hpp"
#include "dtrain/comm/communicator.hpp"
#include "dtrain/comm/tracker.hpp"
#include "dtrain/comm/world.hpp"
#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/fault.hpp"
#include "dtrain/core/host_env.hpp"
#include "dtrain/core/macros.hpp"

namespace dtrain {

namespace detail {

// "host/boot-id/node-tag": equal on ranks that can share memory.
DTRAIN_DECL std::string node_identity(const World& world);

// Segment names start with this, so dtrain-run can remove what a rank killed
// during set-up left behind: "/dtrain-<DTRAIN_JOB_ID>-" (dtrain-run sets the
// id), else "/dtrain-p<pid>-".
DTRAIN_DECL std::string shm_name_prefix();

// Where the ranks are: nodes in order of their lowest rank, ranks within a
// node in rank order.
struct NodeMap {
  std::vector<std::vector<int>> members;  // members[m][i]: rank of local index i on node m
  int node = 0;                           // this rank's node
  int local = 0;                          // this rank's local index
  bool uniform() const {
    return std::all_of(members.begin(), members.end(), [&](const auto& v) { return v.size() == members[0].size(); });
  }
};

DTRAIN_DECL NodeMap map_nodes(const std::vector<std::string>& ids, int me);

}  // namespace detail

class HostCommunicator {
 public:
  // Collective over all ranks of `world`: every rank must construct it, in the
  // same order relative to its other communicators. `force` overrides the
  // world's CommOptions::host.
  DTRAIN_DECL explicit HostCommunicator(World& world, std::optional<host_transport> force = std::nullopt);
  HostCommunicator(const HostCommunicator&) = delete;
  HostCommunicator& operator=(const HostCommunicator&) = delete;
  DTRAIN_DECL ~HostCommunicator();

  int rank() const { return rank_; }
  int size() const { return size_; }

  // "shm", "shm+gloo" (hierarchical), "gloo", or "none" (a world of one).
  DTRAIN_DECL std::string_view transport() const;
  // One line for logs and dtrain-doctor, e.g. "shm (4 ranks on 1 node, wait auto)".
  const std::string& description() const { return description_; }

  template <Dtype T>
  HostWork all_reduce(std::span<T> buf, reduce_op op) {
    return submit("all_reduce", [this, buf, op](std::uint32_t tag) {
      if (mode_ == mode::shm) return shm_->all_reduce(buf.data(), buf.size(), op);
      if (buf.empty()) return;
      if (mode_ == mode::hierarchical) return hier_all_reduce(buf, op, tag);
      float* data = widen(buf);
      if (gloo_) gloo_->all_reduce(data, buf.size(), tag);
      if (op == reduce_op::avg)
        for (std::size_t i = 0; i < buf.size(); ++i) data[i] /= static_cast<float>(size_);
      narrow(buf);
    });
  }

  template <Dtype T>
  HostWork reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    check_sizes("reduce_scatter", "input", in.size(), "output", out.size());
    return submit("reduce_scatter", [this, in, out, op](std::uint32_t tag) {
      const std::size_t c = out.size();
      if (mode_ == mode::shm) return shm_->reduce_scatter(in.data(), out.data(), c, op);
      if (c == 0) return;
      if (mode_ == mode::hierarchical) return hier_reduce_scatter(in, out, op, tag);
      float* acc = grow(wide_, in.size());
      for (std::size_t i = 0; i < in.size(); ++i) acc[i] = static_cast<float>(in[i]);
      if (gloo_) gloo_->reduce_scatter(acc, c, tag);
      const float* mine = acc + static_cast<std::size_t>(rank_) * c;
      finish_slice(mine, out, op);
    });
  }

  template <Dtype T>
  HostWork all_gather(std::span<const T> in, std::span<T> out) {
    check_sizes("all_gather", "output", out.size(), "input", in.size());
    return submit("all_gather", [this, in, out](std::uint32_t tag) {
      if (mode_ == mode::shm) return shm_->all_gather(in.data(), out.data(), in.size());
      if (in.empty()) return;
      if (mode_ == mode::hierarchical) return hier_all_gather(in, out, tag);
      // In place (FSDP writes its shard into its own slot of the gathered
      // buffer): Gloo then takes this rank's part from the output.
      const bool in_place = in.data() == out.data() + static_cast<std::size_t>(rank_) * in.size();
      if (gloo_)
        gloo_->all_gather(in_place ? nullptr : in.data(), out.data(), in.size_bytes(), tag);
      else if (!in_place)
        std::memmove(out.data(), in.data(), in.size_bytes());
    });
  }

  template <Dtype T>
  HostWork broadcast(std::span<T> buf, int root) {
    if (root < 0 || root >= size_)
      throw config_error(
          "broadcast root " + std::to_string(root) + " is not a rank of this world of " + std::to_string(size_),
          "pass a root in [0, world size)");
    return submit("broadcast", [this, buf, root](std::uint32_t tag) {
      if (mode_ == mode::shm) return shm_->broadcast(buf.data(), buf.size(), root);
      if (buf.empty()) return;
      if (mode_ == mode::hierarchical) {
        const auto [node, local] = where_[static_cast<std::size_t>(root)];
        if (local == nodes_.local) cross_->broadcast(buf.data(), buf.size_bytes(), member_of_node(local, node), tag);
        return shm_->broadcast(buf.data(), buf.size(), local);
      }
      if (gloo_) gloo_->broadcast(buf.data(), buf.size_bytes(), root, tag);
    });
  }

  DTRAIN_DECL HostWork barrier();

 private:
  enum class mode { single, shm, hierarchical, gloo };

  struct Task {
    std::function<void(std::uint32_t)> run;
    std::shared_ptr<detail::GlooWorkState> state;
    const char* name;
    std::uint64_t seq;
  };

  // ---- set-up -----------------------------------------------------------

  DTRAIN_DECL void connect(World& world, const std::string& prefix, host_transport wanted);

  // Creates (local index 0) or opens this node's segment; "" on success,
  // else why not. The creator unlinks the name once every local rank mapped it.
  DTRAIN_DECL std::string attach_shm(World& world, const std::string& prefix, const CommOptions& opt);

  // ---- hierarchical algorithms (worker thread) --------------------------

  // Member index, in slice `local`'s Gloo group, of the rank on `node`.
  DTRAIN_DECL int member_of_node(int local, int node) const;
  // The rank that is member k of slice `local`'s group.
  DTRAIN_DECL int rank_of_member(int local, int k) const;

  template <class T>
  void hier_all_reduce(std::span<T> buf, reduce_op op, std::uint32_t tag) {
    const auto L = static_cast<std::size_t>(shm_->size());
    const std::size_t q = (buf.size() + L - 1) / L;
    float* wide = grow(wide_, q * L);
    for (std::size_t i = 0; i < buf.size(); ++i) wide[i] = static_cast<float>(buf[i]);
    std::fill(wide + buf.size(), wide + q * L, 0.f);
    float* part = grow(part_, q);
    shm_->reduce_scatter(wide, part, q, reduce_op::sum);
    cross_->all_reduce(part, q, tag);
    shm_->all_gather(part, wide, q);
    if (op == reduce_op::avg)
      for (std::size_t i = 0; i < buf.size(); ++i) wide[i] /= static_cast<float>(size_);
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = dtype_cast<T>(wide[i]);
  }

  // Block (i, k) of the staging buffer holds the slice of the rank that is
  // member k of slice i's group: the node reduce-scatter hands local index i
  // the node's sums of exactly the slices its group then reduce-scatters.
  template <class T>
  void hier_reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op, std::uint32_t tag) {
    const std::size_t c = out.size();
    const int L = shm_->size();
    const auto M = nodes_.members.size();
    float* staged = grow(wide_, in.size());
    for (int i = 0; i < L; ++i)
      for (std::size_t k = 0; k < M; ++k) {
        const T* src = in.data() + static_cast<std::size_t>(rank_of_member(i, static_cast<int>(k))) * c;
        float* dst = staged + (static_cast<std::size_t>(i) * M + k) * c;
        for (std::size_t e = 0; e < c; ++e) dst[e] = static_cast<float>(src[e]);
      }
    float* node_sum = grow(part_, M * c);
    shm_->reduce_scatter(staged, node_sum, M * c, reduce_op::sum);
    cross_->reduce_scatter(node_sum, c, tag);
    finish_slice(node_sum + static_cast<std::size_t>(member_of_node(nodes_.local, nodes_.node)) * c, out, op);
  }

  template <class T>
  void hier_all_gather(std::span<const T> in, std::span<T> out, std::uint32_t tag) {
    const std::size_t c = in.size();
    const int L = shm_->size();
    const auto M = nodes_.members.size();
    T* slice = reinterpret_cast<T*>(grow(bytes_a_, (M * c * sizeof(T) + 7) / 8));
    T* node = reinterpret_cast<T*>(grow(bytes_b_, (static_cast<std::size_t>(L) * M * c * sizeof(T) + 7) / 8));
    cross_->all_gather(in.data(), slice, c * sizeof(T), tag);
    shm_->all_gather(slice, node, M * c);
    for (int i = 0; i < L; ++i)
      for (std::size_t k = 0; k < M; ++k)
        std::memcpy(out.data() + static_cast<std::size_t>(rank_of_member(i, static_cast<int>(k))) * c,
                    node + (static_cast<std::size_t>(i) * M + k) * c, c * sizeof(T));
  }

  // ---- helpers ----------------------------------------------------------

  template <class T>
  void finish_slice(const float* sum, std::span<T> out, reduce_op op) const {
    const float divisor = op == reduce_op::avg ? static_cast<float>(size_) : 1.f;
    for (std::size_t i = 0; i < out.size(); ++i)
      out[i] = dtype_cast<T>(op == reduce_op::avg ? sum[i] / divisor : sum[i]);
  }

  DTRAIN_DECL void check_sizes(const char* what, const char* big_name, std::size_t big, const char* small_name,
                               std::size_t small_n) const;

  // Scratch lives as long as the communicator and only grows: a training
  // step issues the same collectives every time, and fresh allocations of
  // gradient-sized buffers cost page faults on every call.
  template <class E>
  static E* grow(std::vector<E>& v, std::size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
  }
  template <class T>
  float* widen(std::span<T> buf) {
    if constexpr (std::is_same_v<T, float>) {
      return buf.data();
    } else {
      float* wide = grow(wide_, buf.size());
      for (std::size_t i = 0; i < buf.size(); ++i) wide[i] = static_cast<float>(buf[i]);
      return wide;
    }
  }
  template <class T>
  void narrow(std::span<T> buf) {
    if constexpr (!std::is_same_v<T, float>)
      for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = T(wide_[i]);
  }

  // ---- progress thread --------------------------------------------------

  // A world of one has nobody to wait for: the collective runs right here
  // (a local copy or scaling at most), so DDP at world size 1 pays no
  // hand-off to the progress thread.
  template <class F>
  HostWork submit(const char* name, F&& fn) {
    if (size_ == 1) {
      fn(0u);
      return HostWork();
    }
    return enqueue(name, std::function<void(std::uint32_t)>(std::forward<F>(fn)));
  }

  DTRAIN_DECL HostWork enqueue(const char* name, std::function<void(std::uint32_t)> fn);

  DTRAIN_DECL void run();

  DTRAIN_DECL std::exception_ptr execute(const Task& task);

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  mode mode_ = mode::single;
  std::string description_ = "none (a world of one rank)";
  detail::NodeMap nodes_;
  std::vector<std::pair<int, int>> where_;     // rank -> (node, local index); hierarchical only
  std::vector<std::vector<int>> slice_ranks_;  // [local index][member]: rank (hierarchical)
  std::vector<std::vector<int>> member_;       // [node][local index]: member index in its slice
  std::unique_ptr<detail::ShmEngine> shm_;     // this node's ranks (shm, hierarchical)
  std::unique_ptr<detail::GlooEngine> cross_;  // this rank's slice across nodes (hierarchical)
  std::unique_ptr<detail::GlooEngine> gloo_;   // every rank (gloo)
  std::vector<int> gloo_peers_;                // the ranks this one exchanges with over Gloo
  std::unique_ptr<detail::CollectiveTracker> tracker_;
  std::exception_ptr broken_;                     // worker thread only: the first failure poisons the communicator
  std::vector<float> wide_;                       // worker thread only: fp32 staging
  std::vector<float> part_;                       // worker thread only: a rank's slice (hierarchical)
  std::vector<std::uint64_t> bytes_a_, bytes_b_;  // worker thread only: gather staging (hierarchical)
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  std::atomic<std::size_t> queued_{0};
  bool stop_ = false;
  std::thread worker_;
};

static_assert(Communicator<HostCommunicator>);

// Host collectives over Gloo alone, whatever the node layout: the baseline
// the shared-memory transport is measured against, and the path for setups
// where ranks cannot share memory.
class GlooCommunicator : public HostCommunicator {
 public:
  explicit GlooCommunicator(World& world) : HostCommunicator(world, host_transport::gloo) {}
};

static_assert(Communicator<GlooCommunicator>);

}  // namespace dtrain

#if DTRAIN_DEFINE_IMPL
#include "dtrain/backend/host/comm.ipp"
#endif
