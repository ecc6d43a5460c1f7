// The definitions comm_shm.hpp declares with DTRAIN_DECL: included at the
// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are
// compiled into every user translation unit (header-only) or once, into
// dtrain::runtime (separate compilation).
#pragma once

#include "dtrain/backend/host/comm_shm.hpp"

DTRAIN_IMPL_BEGIN  // header-only: -O1 (core/macros.hpp)

    namespace dtrain::detail {
  DTRAIN_DECL long futex(std::atomic<std::uint32_t> * word, int op, std::uint32_t value, const timespec* timeout) {
    static_assert(sizeof(std::atomic<std::uint32_t>) == 4);
    return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, value, timeout, nullptr, 0);
  }

  DTRAIN_DECL std::string_view shm_wait_name(shm_wait w) {
    return w == shm_wait::spin ? "spin" : w == shm_wait::futex ? "futex" : "auto";
  }

  DTRAIN_DECL auto ShmSegment::create(const std::string& name, std::size_t bytes)->ShmSegment {
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

  DTRAIN_DECL auto ShmSegment::open(const std::string& name, std::size_t bytes)->ShmSegment {
    ShmSegment s;
    const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0)
      throw comm_error(
          "cannot open the shared-memory segment /dev/shm" + name + " of this node's first rank: " + errno_text(),
          "ranks on one node must share /dev/shm (same IPC namespace); "
          "otherwise set DTRAIN_HOST_TRANSPORT=gloo");
    s.map(fd, bytes, false);
    return s;
  }

  DTRAIN_DECL auto ShmSegment::unlink()->void {
    if (owner_) ::shm_unlink(name_.c_str());
    owner_ = false;
  }

  DTRAIN_DECL auto ShmSegment::map(int fd, std::size_t bytes, bool create)->void {
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    if (create && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const std::string why = errno_text();
      unlink();
      throw comm_error(
          "cannot size the shared-memory segment /dev/shm" + name_ + " to " + std::to_string(bytes) + " bytes: " + why,
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

  DTRAIN_DECL auto ShmSegment::release()->void {
    unlink();
    if (base_) ::munmap(base_, bytes_);
    base_ = nullptr;
  }

  DTRAIN_DECL std::size_t shm_control_bytes(int ranks) {
    return (sizeof(ShmHeader) + static_cast<std::size_t>(ranks) * sizeof(ShmRankCtl) + 4095) / 4096 * 4096;
  }

  DTRAIN_DECL std::size_t shm_segment_bytes(int ranks, const ShmOptions& c) {
    return shm_control_bytes(ranks) +
           static_cast<std::size_t>(ranks) * 2 * static_cast<std::size_t>(ranks) * c.part_bytes;
  }

  DTRAIN_DECL ShmEngine::ShmEngine(ShmSegment segment, int me, int ranks, ShmOptions config,
                                   std::chrono::milliseconds timeout, std::function<std::string(int)> name)
      : seg_(std::move(segment)), me_(me), n_(ranks), cfg_(config), timeout_(timeout), name_(std::move(name)) {
    auto* base = seg_.data();
    header_ = reinterpret_cast<ShmHeader*>(base);
    ctl_ = reinterpret_cast<ShmRankCtl*>(base + sizeof(ShmHeader));
    slots_ = base + shm_control_bytes(n_);
    slot_bytes_ = static_cast<std::size_t>(n_) * cfg_.part_bytes;
    ctl_[me_].pid.store(static_cast<std::int32_t>(::getpid()));
    self_pid_ = ::getpid();
  }

  DTRAIN_DECL auto ShmEngine::format(ShmSegment & seg, int ranks, const ShmOptions& c)->void {
    auto* h = new (seg.data()) ShmHeader{};
    h->magic = shm_magic;
    h->ranks = static_cast<std::uint32_t>(ranks);
    h->parts = static_cast<std::uint32_t>(ranks);
    h->part_bytes = c.part_bytes;
    auto* ctl = reinterpret_cast<ShmRankCtl*>(seg.data() + sizeof(ShmHeader));
    for (int r = 0; r < ranks; ++r) new (&ctl[r]) ShmRankCtl{};
  }

  DTRAIN_DECL auto ShmEngine::matches(int ranks, const ShmOptions& c) const->bool {
    return header_->magic == shm_magic && header_->ranks == static_cast<std::uint32_t>(ranks) &&
           header_->part_bytes == c.part_bytes;
  }

  DTRAIN_DECL ShmEngine::~ShmEngine() {
    ctl_[me_].left.store(1);
    notify();
  }

  DTRAIN_DECL auto ShmEngine::barrier()->void {
    begin(sig(5, element_type::f32, 0, 0));
    const std::uint64_t t = next_step();
    ctl_[me_].ready_out.store(t, std::memory_order_release);
    notify();
    wait_all(&ShmRankCtl::ready_out, t, -1, "reach the barrier", true);
    post(&ShmRankCtl::done, t);
  }

  DTRAIN_DECL auto ShmEngine::sig(std::uint64_t op, element_type dt, std::size_t count, std::uint64_t root)
      ->std::uint64_t {
    return (op << 56) ^ (static_cast<std::uint64_t>(dt) << 48) ^ (root << 40) ^ static_cast<std::uint64_t>(count);
  }

  DTRAIN_DECL auto ShmEngine::describe_sig(std::uint64_t s)->std::string {
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

  DTRAIN_DECL auto ShmEngine::split(std::size_t len) const->std::size_t {
    const std::size_t q = (len + static_cast<std::size_t>(n_) - 1) / static_cast<std::size_t>(n_);
    constexpr std::size_t align = HostTuning::shm_part_align;
    return (q + align - 1) / align * align;
  }

  DTRAIN_DECL auto ShmEngine::begin(std::uint64_t signature)->void {
    signature_ = signature;
    deadline_ = std::chrono::steady_clock::now() + timeout_;
  }

  DTRAIN_DECL auto ShmEngine::next_step()->std::uint64_t {
    const std::uint64_t t = ++step_;
    if (t > 2) wait_all(&ShmRankCtl::done, t - 2, -1, "finish reading this rank's previous data", false);
    ctl_[me_].signature[t & 1].store(signature_, std::memory_order_relaxed);
    return t;
  }

  DTRAIN_DECL auto ShmEngine::post(std::atomic<std::uint64_t> ShmRankCtl::*field, std::uint64_t t)->void {
    (ctl_[me_].*field).store(t, std::memory_order_release);
    notify();
  }

  DTRAIN_DECL auto ShmEngine::notify()->void {
    header_->epoch.fetch_add(1, std::memory_order_seq_cst);
    if (header_->sleepers.load(std::memory_order_seq_cst) != 0) futex(&header_->epoch, FUTEX_WAKE, INT_MAX, nullptr);
  }

  DTRAIN_DECL auto ShmEngine::wait_all(std::atomic<std::uint64_t> ShmRankCtl::*field, std::uint64_t t, int only,
                                       const char* what, bool check)
      ->void {
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

  DTRAIN_DECL auto ShmEngine::wait_one(ShmRankCtl & peer, std::atomic<std::uint64_t> ShmRankCtl::*field,
                                       std::uint64_t t, int j, const char* what)
      ->void {
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

  DTRAIN_DECL auto ShmEngine::check_peer(ShmRankCtl & peer, int j, const char* what)->void {
    if (peer.left.load())
      throw shm_wait_error{false, "rank " + name_(j) +
                                      " left the communicator (it failed "
                                      "or was destroyed) before it could " +
                                      what};
    const pid_t pid = peer.pid.load();
    if (pid > 0 && pid != self_pid_ && ::kill(pid, 0) != 0 && errno == ESRCH)
      throw shm_wait_error{false, "rank " + name_(j) + " (pid " + std::to_string(pid) +
                                      ") exited or was killed before it could " + what};
    if (std::chrono::steady_clock::now() >= deadline_)
      throw shm_wait_error{true, "timed out after " + std::to_string(timeout_.count()) +
                                     " ms waiting in shared memory for rank " + name_(j) + " to " + what};
  }
}  // namespace dtrain::detail
DTRAIN_IMPL_END
