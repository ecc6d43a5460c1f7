#pragma once
// Collectives between the ranks of one node through POSIX shared memory.
//
// The node's lowest rank creates one segment per communicator at rendezvous;
// the others open it by the name it publishes in the rendezvous store, and
// as soon as every local rank has mapped it the creator unlinks the name. From
// then on the memory lives only in the mappings, so no exit path, kill -9
// included, can leave it behind in /dev/shm. (The few milliseconds between
// creation and unlink are covered by dtrain-run, which removes its job's
// segment names when the ranks exit: DTRAIN_JOB_ID.)
//
// Segment: a header, one control block per rank, then per rank two slots
// (double buffering) of `parts` x `part_bytes`. Every collective is a series
// of steps numbered by a counter that every rank advances identically (the
// collective contract: same calls, same sizes, same order). Step t uses slot
// t % 2, and a rank overwrites its slot only once every peer has finished
// step t - 2 (`done`), so a rank may run one step ahead of the slowest.
//
// One step of all_reduce with n local ranks over a chunk split into n parts:
//   1. copy my input's parts j != me into my slot        -> post ready_in = t
//   2. sum part `me` over ranks 0..n-1 in rank order (my own part from my
//      buffer, the others' from their slots), in fp32, rounded once; write it
//      to my buffer and into my slot                      -> post ready_out = t
//   3. copy every peer's reduced part from its slot       -> post done = t
// Each rank therefore moves about 4x its buffer through memory (n = 2) and
// every element is summed by exactly one rank, so all ranks get bit-identical
// results. reduce_scatter is steps 1-2 with parts = the output slices;
// all_gather and broadcast are step 3 alone.
//
// Waiting: a rank spins on the peer's counter for a short while, then sleeps
// on a futex in the segment (FUTEX_WAIT on the shared mapping); a poster pays
// the FUTEX_WAKE syscall only when someone sleeps. While waiting it checks
// the deadline, whether the peer's process still exists (kill(pid, 0)) and
// whether the peer left the communicator, so a dead rank fails the others
// within ~50 ms instead of at the timeout.

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <functional>
#include <new>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtrain/backend/host/device_tuning.hpp"
#include "dtrain/comm/communicator.hpp"
#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"
#include "dtrain/core/host_env.hpp"
#include "dtrain/core/macros.hpp"

namespace dtrain::detail {

// A wait in shared memory failed; the communicator turns it into a
// timeout_error or comm_error that names the collective and the ranks.
struct shm_wait_error {
  bool timed_out;     // false: the peer is gone
  std::string cause;  // names the peer and what it did not do
};

DTRAIN_DECL long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t value, const timespec* timeout);

constexpr std::uint64_t shm_magic = 0x6474726e73686d31ull;  // "dtrnshm1"

struct alignas(64) ShmRankCtl {
  alignas(64) std::atomic<std::uint64_t> ready_in{0};
  alignas(64) std::atomic<std::uint64_t> ready_out{0};
  alignas(64) std::atomic<std::uint64_t> done{0};
  // What this rank called at the step of each slot parity: peers compare it
  // with their own call and fail on a mismatch instead of mixing buffers.
  alignas(64) std::atomic<std::uint64_t> signature[2]{};
  std::atomic<std::int32_t> pid{0};
  std::atomic<std::uint32_t> left{0};  // set when the rank destroys its communicator
};

struct alignas(64) ShmHeader {
  std::uint64_t magic;
  std::uint32_t ranks;
  std::uint32_t parts;
  std::uint64_t part_bytes;
  alignas(64) std::atomic<std::uint32_t> epoch{0};  // the futex word: bumped on every post
  alignas(64) std::atomic<std::uint32_t> sleepers{0};
};

DTRAIN_DECL std::string_view shm_wait_name(shm_wait w);

struct ShmOptions {
  std::size_t part_bytes = CommOptions{}.shm_part_bytes;  // one rank's share of a chunk
  shm_wait wait = shm_wait::automatic;
  std::chrono::microseconds spin = HostTuning::shm_spin;  // auto: spin this long, then sleep
};

// The mapping of one segment. Move-only; unmaps on destruction. The name is
// unlinked by unlink() (the creator calls it once every rank has mapped it)
// or, failing that, on destruction.
class ShmSegment {
 public:
  ShmSegment() = default;
  DTRAIN_DECL static ShmSegment create(const std::string& name, std::size_t bytes);
  DTRAIN_DECL static ShmSegment open(const std::string& name, std::size_t bytes);
  ShmSegment(ShmSegment&& o) noexcept { *this = std::move(o); }
  ShmSegment& operator=(ShmSegment&& o) noexcept {
    if (this != &o) {
      release();
      base_ = std::exchange(o.base_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      name_ = std::move(o.name_);
      owner_ = std::exchange(o.owner_, false);
    }
    return *this;
  }
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment() { release(); }

  DTRAIN_DECL void unlink();
  std::byte* data() const { return base_; }

 private:
  DTRAIN_DECL void map(int fd, std::size_t bytes, bool create);
  DTRAIN_DECL void release();

  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0;
  std::string name_;
  bool owner_ = false;
};

// The header and control blocks, rounded up to a page; the slots follow.
DTRAIN_DECL std::size_t shm_control_bytes(int ranks);

DTRAIN_DECL std::size_t shm_segment_bytes(int ranks, const ShmOptions& c);

// fp32 accumulation of `sources` arrays of T in the given order, rounded once
// into every non-null destination, in blocks of HostTuning::shm_sum_block.
template <class T>
void sum_into(std::span<const T* const> sources, std::size_t n, float divisor, T* out_a, T* out_b) {
  constexpr std::size_t block = HostTuning::shm_sum_block;
  alignas(64) float acc[block];
  for (std::size_t b0 = 0; b0 < n; b0 += block) {
    const std::size_t m = std::min(block, n - b0);
    const T* s0 = sources[0] + b0;
    for (std::size_t i = 0; i < m; ++i) acc[i] = static_cast<float>(s0[i]);
    for (std::size_t k = 1; k < sources.size(); ++k) {
      const T* s = sources[k] + b0;
      for (std::size_t i = 0; i < m; ++i) acc[i] += static_cast<float>(s[i]);
    }
    if (divisor != 1.f)  // avg: divided, as the Gloo path does, so both round alike
      for (std::size_t i = 0; i < m; ++i) acc[i] /= divisor;
    T* a = out_a + b0;
    if constexpr (std::is_same_v<T, float>)
      std::memcpy(a, acc, m * sizeof(float));
    else
      for (std::size_t i = 0; i < m; ++i) a[i] = T(acc[i]);
    if (out_b) std::memcpy(out_b + b0, a, m * sizeof(T));
  }
}

// The collectives of one node's ranks over one segment. Blocking; one
// thread per rank calls it (the communicator's progress thread), all ranks in
// the same order with the same sizes.
class ShmEngine {
 public:
  // `segment` is mapped; rank `me` of `ranks`; `pids[r]` the process of rank
  // r (this process for ranks that are threads of it); `name(r)` how errors
  // call local rank r.
  DTRAIN_DECL ShmEngine(ShmSegment segment, int me, int ranks, ShmOptions config, std::chrono::milliseconds timeout,
                        std::function<std::string(int)> name);
  // The creator writes the header before publishing the name.
  DTRAIN_DECL static void format(ShmSegment& seg, int ranks, const ShmOptions& c);
  DTRAIN_DECL bool matches(int ranks, const ShmOptions& c) const;
  ShmEngine(const ShmEngine&) = delete;
  ShmEngine& operator=(const ShmEngine&) = delete;
  DTRAIN_DECL ~ShmEngine();

  int rank() const { return me_; }
  int size() const { return n_; }
  void unlink() { seg_.unlink(); }

  // ---- collectives (blocking) -------------------------------------------

  // In place; `avg` divides by n after the sum.
  template <class T>
  void all_reduce(T* buf, std::size_t count, reduce_op op) {
    begin(sig(1, dtype_traits<T>::id, count, 0));
    const std::size_t per_part = part_elems<T>();
    const float divisor = op == reduce_op::avg ? static_cast<float>(n_) : 1.f;
    for (std::size_t base = 0; base < count || base == 0; base += per_part * static_cast<std::size_t>(n_)) {
      const std::size_t len = std::min(count - base, per_part * static_cast<std::size_t>(n_));
      const std::size_t q = split(len);
      auto part = [&](int j) {
        const std::size_t lo = std::min(len, q * static_cast<std::size_t>(j));
        return std::pair{base + lo, std::min(len, lo + q) - lo};
      };
      reduce_step<T>([&](int j) { return buf + part(j).first; }, [&](int j) { return part(j).second; },
                     buf + part(me_).first, [&](int j) { return buf + part(j).first; }, divisor);
      if (count == 0) break;
    }
  }

  // in: n slices of `count`; out: this rank's slice, summed.
  template <class T>
  void reduce_scatter(const T* in, T* out, std::size_t count, reduce_op op) {
    begin(sig(2, dtype_traits<T>::id, count, 0));
    const std::size_t per_part = part_elems<T>();
    const float divisor = op == reduce_op::avg ? static_cast<float>(n_) : 1.f;
    for (std::size_t off = 0; off < count || off == 0; off += per_part) {
      const std::size_t len = std::min(count - off, per_part);
      reduce_step<T>([&](int j) { return in + static_cast<std::size_t>(j) * count + off; }, [&](int) { return len; },
                     out + off, nullptr, divisor);
      if (count == 0) break;
    }
  }

  // out: n slices of `count`; in: this rank's (may be its slice of out).
  template <class T>
  void all_gather(const T* in, T* out, std::size_t count) {
    begin(sig(3, dtype_traits<T>::id, count, 0));
    const std::size_t per_step = part_elems<T>() * static_cast<std::size_t>(n_);
    T* mine = out + static_cast<std::size_t>(me_) * count;
    if (in != mine && count) std::memmove(mine, in, count * sizeof(T));
    for (std::size_t off = 0; off < count || off == 0; off += per_step) {
      const std::size_t len = std::min(count - off, per_step);
      copy_step<T>(mine + off, len, -1, [&](int j) { return out + static_cast<std::size_t>(j) * count + off; });
      if (count == 0) break;
    }
  }

  template <class T>
  void broadcast(T* buf, std::size_t count, int root) {
    begin(sig(4, dtype_traits<T>::id, count, static_cast<std::uint64_t>(root)));
    const std::size_t per_step = part_elems<T>() * static_cast<std::size_t>(n_);
    for (std::size_t off = 0; off < count || off == 0; off += per_step) {
      const std::size_t len = std::min(count - off, per_step);
      copy_step<T>(buf + off, len, root, [&](int) { return buf + off; });
      if (count == 0) break;
    }
  }

  DTRAIN_DECL void barrier();

 private:
  DTRAIN_DECL static std::uint64_t sig(std::uint64_t op, element_type dt, std::size_t count, std::uint64_t root);
  DTRAIN_DECL static std::string describe_sig(std::uint64_t s);

  template <class T>
  std::size_t part_elems() const {
    return cfg_.part_bytes / sizeof(T);
  }
  // Part length for a chunk of `len` elements: balanced, a multiple of 16
  // elements so parts start on cache lines.
  DTRAIN_DECL std::size_t split(std::size_t len) const;

  DTRAIN_DECL void begin(std::uint64_t signature);
  // Starts step t: waits until its slot (and its signature entry) is free,
  // i.e. every peer finished step t - 2.
  DTRAIN_DECL std::uint64_t next_step();
  template <class T>
  T* slot(int r, std::uint64_t t, int part) const {
    return reinterpret_cast<T*>(slots_ + (static_cast<std::size_t>(r) * 2 + (t & 1)) * slot_bytes_ +
                                static_cast<std::size_t>(part) * cfg_.part_bytes);
  }

  // Steps 1-2 (and 3 when `gather` is given) of the header's protocol for one
  // chunk; src(j) / len(j): this rank's input for part j; `out` receives part
  // `me` summed; gather(j) receives the peers' summed parts.
  template <class T, class Src, class Len, class Gather>
  void reduce_step(Src&& src, Len&& len, T* out, Gather&& gather, float divisor) {
    const std::uint64_t t = next_step();
    for (int j = 0; j < n_; ++j)
      if (j != me_ && len(j)) std::memcpy(slot<T>(me_, t, j), src(j), len(j) * sizeof(T));
    post(&ShmRankCtl::ready_in, t);
    wait_all(&ShmRankCtl::ready_in, t, -1, "copy its input in", true);
    const std::size_t m = len(me_);
    constexpr bool gathers = !std::is_same_v<std::decay_t<Gather>, std::nullptr_t>;
    if (m) {
      const T* sources[64];
      std::vector<const T*> many;
      const T** s = sources;
      if (n_ > 64) {
        many.resize(static_cast<std::size_t>(n_));
        s = many.data();
      }
      for (int k = 0; k < n_; ++k) s[k] = k == me_ ? src(me_) : slot<T>(k, t, me_);
      T* published = gathers ? slot<T>(me_, t, me_) : nullptr;
      sum_into<T>(std::span<const T* const>(s, static_cast<std::size_t>(n_)), m, divisor, out, published);
    }
    if constexpr (gathers) {
      post(&ShmRankCtl::ready_out, t);
      wait_all(&ShmRankCtl::ready_out, t, -1, "publish its reduced part", true);
      for (int j = 0; j < n_; ++j)
        if (j != me_ && len(j)) std::memcpy(gather(j), slot<T>(j, t, j), len(j) * sizeof(T));
    }
    post(&ShmRankCtl::done, t);
  }

  // Step 3 alone: every rank (or only `root`) publishes `len` elements of
  // `mine`; dst(j) receives rank j's (the root's) elements.
  template <class T, class Dst>
  void copy_step(const T* mine, std::size_t len, int root, Dst&& dst) {
    const std::uint64_t t = next_step();
    const bool publishes = root < 0 || root == me_;
    if (publishes && len) std::memcpy(slot<T>(me_, t, 0), mine, len * sizeof(T));
    post(&ShmRankCtl::ready_out, t);
    wait_all(&ShmRankCtl::ready_out, t, root, root < 0 ? "publish its part" : "publish the broadcast data", true);
    if (len)
      for (int j = 0; j < n_; ++j) {
        if (j == me_ || (root >= 0 && j != root)) continue;
        std::memcpy(dst(j), slot<T>(j, t, 0), len * sizeof(T));
      }
    post(&ShmRankCtl::done, t);
  }

  DTRAIN_DECL void post(std::atomic<std::uint64_t> ShmRankCtl::*field, std::uint64_t t);
  DTRAIN_DECL void notify();

  // Waits until `field` >= t on every peer (only == only, when >= 0).
  // `check`: compare the peer's call with ours (only on data waits: at
  // next_step a fast peer may already have moved on to the next call).
  DTRAIN_DECL void wait_all(std::atomic<std::uint64_t> ShmRankCtl::*field, std::uint64_t t, int only, const char* what,
                            bool check);

  DTRAIN_DECL void wait_one(ShmRankCtl& peer, std::atomic<std::uint64_t> ShmRankCtl::*field, std::uint64_t t, int j,
                            const char* what);

  DTRAIN_DECL void check_peer(ShmRankCtl& peer, int j, const char* what);

  ShmSegment seg_;
  int me_;
  int n_;
  ShmOptions cfg_;
  std::chrono::milliseconds timeout_;
  std::function<std::string(int)> name_;
  ShmHeader* header_ = nullptr;
  ShmRankCtl* ctl_ = nullptr;
  std::byte* slots_ = nullptr;
  std::size_t slot_bytes_ = 0;
  pid_t self_pid_ = 0;
  std::uint64_t step_ = 0;
  std::uint64_t signature_ = 0;
  std::chrono::steady_clock::time_point deadline_{};
};

}  // namespace dtrain::detail

#if DTRAIN_DEFINE_IMPL
#include "dtrain/backend/host/comm_shm.ipp"
#endif
