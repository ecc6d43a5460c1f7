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

#include "dtrain/comm/communicator.hpp"
#include "dtrain/core/dtype.hpp"
#include "dtrain/core/error.hpp"

namespace dtrain::detail {

// A wait in shared memory failed; the communicator turns it into a
// timeout_error or comm_error that names the collective and the ranks.
struct shm_wait_error {
  bool timed_out;     // false: the peer is gone
  std::string cause;  // names the peer and what it did not do
};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();  // _mm_pause without <immintrin.h>'s 38,000 lines in every translation unit
#elif defined(__aarch64__)
  asm volatile("yield");
#else
  std::this_thread::yield();
#endif
}

inline long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t value, const timespec* timeout) {
  static_assert(sizeof(std::atomic<std::uint32_t>) == 4);
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, value, timeout, nullptr, 0);
}

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

inline std::string_view shm_wait_name(shm_wait w) {
  return w == shm_wait::spin ? "spin" : w == shm_wait::futex ? "futex" : "auto";
}

struct ShmOptions {
  std::size_t part_bytes = std::size_t{256} << 10;  // one rank's share of a chunk
  shm_wait wait = shm_wait::automatic;
  std::chrono::microseconds spin = std::chrono::microseconds(200);  // auto: spin this long, then sleep
};

// The mapping of one segment. Move-only; unmaps on destruction. The name is
// unlinked by unlink() (the creator calls it once every rank has mapped it)
// or, failing that, on destruction.
class ShmSegment {
 public:
  ShmSegment() = default;
  static ShmSegment create(const std::string& name, std::size_t bytes) {
    ShmSegment s;
    const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
      throw comm_error("cannot create the shared-memory segment /dev/shm" + name + ": " + errno_text(),
                       "check that /dev/shm is mounted and writable, or set DTRAIN_HOST_TRANSPORT=gloo");
    s.name_ = name;
    s.owner_ = true;
    s.map(fd, bytes, true);
    return s;
  }
  static ShmSegment open(const std::string& name, std::size_t bytes) {
    ShmSegment s;
    const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0)
      throw comm_error("cannot open the shared-memory segment /dev/shm" + name + " of this node's first rank: " +
                           errno_text(),
                       "ranks on one node must share /dev/shm (same IPC namespace); "
                       "otherwise set DTRAIN_HOST_TRANSPORT=gloo");
    s.map(fd, bytes, false);
    return s;
  }
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

  void unlink() {
    if (owner_) ::shm_unlink(name_.c_str());
    owner_ = false;
  }
  std::byte* data() const { return base_; }

 private:
  void map(int fd, std::size_t bytes, bool create) {
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    if (create && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const std::string why = errno_text();
      unlink();
      throw comm_error("cannot size the shared-memory segment /dev/shm" + name_ + " to " + std::to_string(bytes) +
                           " bytes: " + why,
                       "/dev/shm is probably full: free space there, or set DTRAIN_HOST_TRANSPORT=gloo");
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const std::string why = errno_text();
      unlink();
      throw comm_error("cannot map the shared-memory segment: " + why, "set DTRAIN_HOST_TRANSPORT=gloo");
    }
    base_ = static_cast<std::byte*>(p);
    bytes_ = bytes;
    if (create) {
      // Touch every page now: a segment that /dev/shm cannot back fails here
      // with an error, not later with SIGBUS inside a collective.
      if (::posix_fallocate(fd, 0, static_cast<off_t>(bytes)) != 0) {
        release();
        throw comm_error("/dev/shm has no room for a " + std::to_string(bytes) + "-byte shared-memory segment",
                         "free space in /dev/shm (df -h /dev/shm), or set DTRAIN_HOST_TRANSPORT=gloo");
      }
    }
  }
  void release() {
    unlink();
    if (base_) ::munmap(base_, bytes_);
    base_ = nullptr;
  }

  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0;
  std::string name_;
  bool owner_ = false;
};

// The header and control blocks, rounded up to a page; the slots follow.
inline std::size_t shm_control_bytes(int ranks) {
  return (sizeof(ShmHeader) + static_cast<std::size_t>(ranks) * sizeof(ShmRankCtl) + 4095) / 4096 * 4096;
}

inline std::size_t shm_segment_bytes(int ranks, const ShmOptions& c) {
  return shm_control_bytes(ranks) + static_cast<std::size_t>(ranks) * 2 * static_cast<std::size_t>(ranks) * c.part_bytes;
}

// fp32 accumulation of `sources` arrays of T in the given order, rounded once
// into every non-null destination. Blocked so the accumulator stays in L1
// and each pass is a plain loop the compiler vectorises.
template <class T>
void sum_into(std::span<const T* const> sources, std::size_t n, float divisor, T* out_a, T* out_b) {
  constexpr std::size_t block = 2048;
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
  ShmEngine(ShmSegment segment, int me, int ranks, ShmOptions config, std::chrono::milliseconds timeout,
            std::function<std::string(int)> name)
      : seg_(std::move(segment)), me_(me), n_(ranks), cfg_(config), timeout_(timeout), name_(std::move(name)) {
    auto* base = seg_.data();
    header_ = reinterpret_cast<ShmHeader*>(base);
    ctl_ = reinterpret_cast<ShmRankCtl*>(base + sizeof(ShmHeader));
    slots_ = base + shm_control_bytes(n_);
    slot_bytes_ = static_cast<std::size_t>(n_) * cfg_.part_bytes;
    ctl_[me_].pid.store(static_cast<std::int32_t>(::getpid()));
    self_pid_ = ::getpid();
  }
  // The creator writes the header before publishing the name.
  static void format(ShmSegment& seg, int ranks, const ShmOptions& c) {
    auto* h = new (seg.data()) ShmHeader{};
    h->magic = shm_magic;
    h->ranks = static_cast<std::uint32_t>(ranks);
    h->parts = static_cast<std::uint32_t>(ranks);
    h->part_bytes = c.part_bytes;
    auto* ctl = reinterpret_cast<ShmRankCtl*>(seg.data() + sizeof(ShmHeader));
    for (int r = 0; r < ranks; ++r) new (&ctl[r]) ShmRankCtl{};
  }
  bool matches(int ranks, const ShmOptions& c) const {
    return header_->magic == shm_magic && header_->ranks == static_cast<std::uint32_t>(ranks) &&
           header_->part_bytes == c.part_bytes;
  }
  ShmEngine(const ShmEngine&) = delete;
  ShmEngine& operator=(const ShmEngine&) = delete;
  ~ShmEngine() {
    ctl_[me_].left.store(1);
    notify();
  }

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
      reduce_step<T>(
          [&](int j) { return buf + part(j).first; }, [&](int j) { return part(j).second; }, buf + part(me_).first,
          [&](int j) { return buf + part(j).first; }, divisor);
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
      reduce_step<T>([&](int j) { return in + static_cast<std::size_t>(j) * count + off; },
                     [&](int) { return len; }, out + off, nullptr, divisor);
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

  void barrier() {
    begin(sig(5, element_type::f32, 0, 0));
    const std::uint64_t t = next_step();
    ctl_[me_].ready_out.store(t, std::memory_order_release);
    notify();
    wait_all(&ShmRankCtl::ready_out, t, -1, "reach the barrier", true);
    post(&ShmRankCtl::done, t);
  }

 private:
  static std::uint64_t sig(std::uint64_t op, element_type dt, std::size_t count, std::uint64_t root) {
    return (op << 56) ^ (static_cast<std::uint64_t>(dt) << 48) ^ (root << 40) ^ static_cast<std::uint64_t>(count);
  }
  static std::string describe_sig(std::uint64_t s) {
    static constexpr const char* ops[] = {"?", "all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier"};
    const auto op = s >> 56;
    const auto dt = static_cast<element_type>((s >> 48) & 0xff);
    const std::string_view dt_name = dt == element_type::f32    ? dtype_traits<float>::name
                                     : dt == element_type::bf16 ? dtype_traits<bf16>::name
                                     : dt == element_type::f16  ? dtype_traits<fp16>::name
                                                                : "?";
    std::string out = op < 6 ? ops[op] : "?";
    if (op == 5) return out;
    out += " of " + std::to_string(s & ((std::uint64_t{1} << 40) - 1)) + " " + std::string(dt_name);
    if (op == 4) out += " from root " + std::to_string((s >> 40) & 0xff);
    return out;
  }

  template <class T>
  std::size_t part_elems() const {
    return cfg_.part_bytes / sizeof(T);
  }
  // Part length for a chunk of `len` elements: balanced, a multiple of 16
  // elements so parts start on cache lines.
  std::size_t split(std::size_t len) const {
    const std::size_t q = (len + static_cast<std::size_t>(n_) - 1) / static_cast<std::size_t>(n_);
    return (q + 15) / 16 * 16;
  }

  void begin(std::uint64_t signature) {
    signature_ = signature;
    deadline_ = std::chrono::steady_clock::now() + timeout_;
  }
  // Starts step t: waits until its slot (and its signature entry) is free,
  // i.e. every peer finished step t - 2.
  std::uint64_t next_step() {
    const std::uint64_t t = ++step_;
    if (t > 2) wait_all(&ShmRankCtl::done, t - 2, -1, "finish reading this rank's previous data", false);
    ctl_[me_].signature[t & 1].store(signature_, std::memory_order_relaxed);
    return t;
  }
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

  void post(std::atomic<std::uint64_t> ShmRankCtl::*field, std::uint64_t t) {
    (ctl_[me_].*field).store(t, std::memory_order_release);
    notify();
  }
  void notify() {
    header_->epoch.fetch_add(1, std::memory_order_seq_cst);
    if (header_->sleepers.load(std::memory_order_seq_cst) != 0) futex(&header_->epoch, FUTEX_WAKE, INT_MAX, nullptr);
  }

  // Waits until `field` >= t on every peer (only == only, when >= 0).
  // `check`: compare the peer's call with ours (only on data waits: at
  // next_step a fast peer may already have moved on to the next call).
  void wait_all(std::atomic<std::uint64_t> ShmRankCtl::*field, std::uint64_t t, int only, const char* what,
                bool check) {
    for (int j = 0; j < n_; ++j) {
      if (j == me_ || (only >= 0 && j != only)) continue;
      wait_one(ctl_[j], field, t, j, what);
      if (!check) continue;
      const std::uint64_t theirs = ctl_[j].signature[t & 1].load(std::memory_order_relaxed);
      if (theirs != signature_)
        throw shm_wait_error{false, "rank " + name_(j) + " called " + describe_sig(theirs) +
                                        " where this rank called " + describe_sig(signature_) +
                                        " (ranks must issue the same collectives, with the same sizes, in "
                                        "the same order)"};
    }
  }

  void wait_one(ShmRankCtl& peer, std::atomic<std::uint64_t> ShmRankCtl::*field, std::uint64_t t, int j,
                const char* what) {
    auto ready = [&] { return (peer.*field).load(std::memory_order_acquire) >= t; };
    if (ready()) return;
    using clock = std::chrono::steady_clock;
    const bool may_sleep = cfg_.wait != shm_wait::spin;
    const auto spin_until = cfg_.wait == shm_wait::futex ? clock::now() : clock::now() + cfg_.spin;
    auto next_check = clock::now() + std::chrono::milliseconds(50);
    for (std::uint32_t spins = 1;; ++spins) {
      if (ready()) return;
      if ((spins & 63) == 0) {
        const auto now = clock::now();
        if (now >= next_check) {
          check_peer(peer, j, what);
          next_check = now + std::chrono::milliseconds(50);
        }
        if (may_sleep && now >= spin_until) break;
        if (!may_sleep && (spins & 4095) == 0) std::this_thread::yield();
      }
      cpu_relax();
    }
    header_->sleepers.fetch_add(1, std::memory_order_seq_cst);
    struct Leave {
      std::atomic<std::uint32_t>& s;
      ~Leave() { s.fetch_sub(1, std::memory_order_seq_cst); }
    } leave{header_->sleepers};
    for (;;) {
      const std::uint32_t e = header_->epoch.load(std::memory_order_seq_cst);
      if (ready()) return;
      const timespec slice{0, 50'000'000};  // wake up to check the peer and the deadline
      futex(&header_->epoch, FUTEX_WAIT, e, &slice);
      if (ready()) return;
      const auto now = clock::now();
      if (now >= next_check) {
        check_peer(peer, j, what);
        next_check = now + std::chrono::milliseconds(50);
      }
    }
  }

  void check_peer(ShmRankCtl& peer, int j, const char* what) {
    if (peer.left.load()) throw shm_wait_error{false, "rank " + name_(j) + " left the communicator (it failed "
                                                      "or was destroyed) before it could " + what};
    const pid_t pid = peer.pid.load();
    if (pid > 0 && pid != self_pid_ && ::kill(pid, 0) != 0 && errno == ESRCH)
      throw shm_wait_error{false, "rank " + name_(j) + " (pid " + std::to_string(pid) +
                                      ") exited or was killed before it could " + what};
    if (std::chrono::steady_clock::now() >= deadline_)
      throw shm_wait_error{true, "timed out after " + std::to_string(timeout_.count()) +
                                     " ms waiting in shared memory for rank " + name_(j) + " to " + what};
  }

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
