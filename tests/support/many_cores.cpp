// LD_PRELOAD shim for the tests: the process it is loaded into sees 16 cores
// online and usable, whatever the machine has. OpenBLAS sizes the pool it
// starts at load time from these calls, and dtrain sizes its threads from the
// affinity mask, so a test on a 2-core machine can run what a 16-core one
// does (tests/docs: OpenBLAS's pool under an address-space limit). The
// process still runs on the real cores.

#include <dlfcn.h>
#include <sched.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <cstring>

namespace {
constexpr int cores = 16;
}

extern "C" {

long sysconf(int name) noexcept {
  if (name == _SC_NPROCESSORS_ONLN || name == _SC_NPROCESSORS_CONF) return cores;
  using fn = long (*)(int);
  static const fn real = reinterpret_cast<fn>(dlsym(RTLD_NEXT, "sysconf"));
  return real(name);
}

int get_nprocs() noexcept { return cores; }
int get_nprocs_conf() noexcept { return cores; }

int sched_getaffinity(pid_t, size_t size, cpu_set_t* set) noexcept {
  std::memset(set, 0, size);
  for (int cpu = 0; cpu < cores; ++cpu) CPU_SET_S(cpu, size, set);
  return 0;
}

}  // extern "C"
