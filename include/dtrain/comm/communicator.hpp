#pragma once
// The Communicator concept: what every backend (Gloo on host, NCCL on GPU)
// offers and what strategies are written against.
//
// All collectives are asynchronous: they return a Work handle whose wait()
// blocks (host) or orders the caller's stream (GPU) until the result is ready,
// and throws dtrain::comm_error / dtrain::timeout_error if it failed.
// Buffer rules:
//   all_reduce(buf, op)            any length, 0 included; in place.
//   broadcast(buf, root)           any length; in place.
//   reduce_scatter(in, out, op)    in.size() == out.size() * size().
//   all_gather(in, out)            out.size() == in.size() * size(); rank r's
//                                  input lands at out[r * in.size()]; in place
//                                  when in is exactly that slice of out.
// Half dtypes (bf16, fp16) accumulate in fp32 on the host backend.

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "dtrain/core/dtype.hpp"

namespace dtrain {

enum class reduce_op { sum, avg };

constexpr std::string_view reduce_op_name(reduce_op op) { return op == reduce_op::sum ? "sum" : "avg"; }

// How host (CPU) ranks talk. automatic: shared memory between the ranks of
// a node, Gloo between nodes (only Gloo when nodes hold unequal numbers of
// ranks); shm: the same, but an error when shared memory cannot be used;
// gloo: Gloo over TCP everywhere. Env DTRAIN_HOST_TRANSPORT=auto|shm|gloo.
enum class host_transport { automatic, shm, gloo };

// How a rank waits for its peers in shared memory (env DTRAIN_SHM_WAIT):
// spin never sleeps (lowest latency when every rank has a core), futex
// sleeps in the kernel at once (never steals a core), automatic spins
// briefly and then sleeps.
enum class shm_wait { automatic, spin, futex };

// How the ranks of a Cuda trainer exchange gradients and parameters. nccl:
// NCCL, one GPU per rank (the default, and the only choice for speed). host:
// each collective copies its device buffer to the host, runs on the host
// communicator above and copies the result back, synchronously: slow, but it
// lets several ranks share one GPU (rank r uses GPU r % visible GPUs), which
// is how a one-GPU machine checks the sharded strategies on the GPU and how
// the results on a GPU are compared bit for bit with the host's reductions.
// Env DTRAIN_GPU_TRANSPORT=nccl|host.
enum class gpu_transport { nccl, host };

struct CommOptions {
  // A collective that has not completed after this long fails on every rank
  // that reached it, naming the collective, its sequence number and the ranks
  // that never arrived. Generous by default: the first step of a large job can
  // be slow. Overridable with DTRAIN_COMM_TIMEOUT_S in dtrain::init().
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  host_transport host = host_transport::automatic;
  shm_wait wait = shm_wait::automatic;
  // One rank's share of a shared-memory chunk (env DTRAIN_SHM_CHUNK_KIB):
  // large enough to amortise the hand-shakes, small enough to stay in cache.
  std::size_t shm_part_bytes = std::size_t{256} << 10;
  gpu_transport gpu = gpu_transport::nccl;
  // The job's secret (DTRAIN_JOB_TOKEN; dtrain-run makes one per job): the
  // rendezvous and the ranks' Gloo connections admit only peers that prove
  // it (comm/auth.hpp, docs/security.md). A world of more than one rank
  // needs it, unless insecure_no_token.
  std::string job_token{};
  // DTRAIN_INSECURE_NO_TOKEN=1: run with no token, and a warning; any process
  // that reaches the rendezvous port can then join the job.
  bool insecure_no_token = false;
  // DTRAIN_STORE_BIND: the address rank 0's rendezvous listens on; empty:
  // the master address (0.0.0.0 only when asked).
  std::string store_bind{};
};

namespace detail {
// Nanoseconds the calling thread (a rank's training thread) has spent
// blocked waiting for collectives (HostWork::wait adds to it): the time it
// waited for its peers and the network (dtrain::fit's straggler report
// reads it).
inline thread_local std::uint64_t collective_wait_ns = 0;
}  // namespace detail

// The calling thread's time blocked waiting for host collectives, in ns.
inline std::uint64_t collective_wait_ns() { return detail::collective_wait_ns; }

template <class W>
concept CommWork = requires(W& w) {
  w.wait();
};

namespace detail {
template <class C, class T>
concept collectives_for = requires(C& c, std::span<T> buf, std::span<const T> in, int root, reduce_op op) {
  { c.all_reduce(buf, op) } -> CommWork;
  { c.broadcast(buf, root) } -> CommWork;
  { c.reduce_scatter(in, buf, op) } -> CommWork;
  { c.all_gather(in, buf) } -> CommWork;
};
}  // namespace detail

template <class C>
concept Communicator = requires(C& c, const C& cc) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  { c.barrier() } -> CommWork;
}
&&detail::collectives_for<C, float>&& detail::collectives_for<C, bf16>&& detail::collectives_for<C, fp16>;

}  // namespace dtrain
