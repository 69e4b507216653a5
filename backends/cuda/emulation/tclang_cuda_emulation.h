// tclang_cuda_emulation.h: run CUDA C on the host, compiled as C++17 by g++.
//
// Included before the generated kernel source (g++ -std=c++17 -x c++ -include this file,
// with -DTCLANG_EMULATION=1), it makes ordinary CUDA C compile as C++ and supplies CUDA's
// thread model, built-in variables, barriers, warp operations, atomics, the device math
// library functions the host C library lacks, and __half.
//
// Thread model
//   * tclang_emu::launch(grid, block, kernel_call) runs kernel_call() once per CUDA thread of
//     every block. Blocks are handed out one at a time (an atomic counter, block index x
//     fastest) to min(#cores, #blocks) OS threads: the calling thread plus worker threads,
//     TCLANG_EMULATION_THREADS=<n> overrides #cores. Each OS thread runs its blocks one after
//     another.
//   * The CUDA threads of a block are cooperative fibers (own stack, 64 KiB by default:
//     TCLANG_EMU_STACK_SIZE at compile time, TCLANG_EMULATION_STACK_SIZE=<bytes> at run time;
//     a PROT_NONE guard page under each block's stacks, and with -DTCLANG_EMU_GUARD_EVERY_STACK
//     under each stack, turns an overflow into a crash, not silent corruption; per-stack
//     guards cost two memory mappings per thread, so they are opt-in). A per-block scheduler resumes the runnable fibers in thread order
//     (linear id x + y*bx + z*bx*by: 0, 1, 2, ...); each runs until it reaches a barrier or
//     returns. When every live fiber waits at __syncthreads() (a fiber that returned counts as
//     arrived, as exited threads do on the GPU), all of them continue, again in thread order.
//     So a missing barrier deterministically shows: thread 0 runs to the end of its phase
//     before thread 1 starts, and reads whatever thread 1 has not written yet.
//   * __shared__ is `static thread_local`: shared by the fibers of one block (one OS thread),
//     distinct between blocks that run at the same time (different OS threads). Like CUDA's
//     shared memory it is not cleared between blocks.
//   * __syncwarp(mask) and the warp operations (__shfl*_sync, __ballot_sync, __all_sync,
//     __any_sync) are warp-level barriers: they wait for the live lanes named in `mask` of the
//     calling warp (32 consecutive linear ids) only; other warps go on. Shuffles exchange
//     values through a per-warp buffer, one barrier per operation. A lane whose partner
//     lane does not exist or does not take part gets its own value back.
//   * Divergent barriers: threads that return before a barrier count as arrived. Threads of
//     one block waiting at barriers that cannot all complete (some at __syncthreads(), some
//     at a warp barrier whose lanes never all arrive) are a deadlock on the GPU; here the
//     launch stops with TCLANG_EMU_ERR_DEADLOCK. Threads at *different* __syncthreads() call
//     sites are released together (as bar.sync 0 does on the hardware) unless
//     TCLANG_EMULATION_CHECK_BARRIERS=1, which reports TCLANG_EMU_ERR_DIVERGENT_BARRIER (call
//     sites are return addresses: reliable at -O1; -O2 and up may merge identical calls).
//   * Warp-synchronous code that relies on lockstep execution without __syncwarp (volatile
//     shared memory reductions) is wrong since Volta, and is wrong here too.
//
// Errors
//   launch() returns 0 or an error code (TCLANG_EMU_ERR_*); the message of the last launch
//   made by the calling OS thread is `extern "C" const char* tclang_emu_last_error(void)`
//   ("" after a successful launch), its code `extern "C" int tclang_emu_last_error_code(void)`.
//   Errors: invalid configuration (more than 1024 threads per block, a zero or too large
//   dimension), fiber stack allocation failure, __trap(), deadlock, divergent barrier (opt-in),
//   a launch from device code. After an error no new block starts; blocks already running on
//   other OS threads finish. A kernel that faults (bad pointer, fiber stack overflow) crashes
//   the process, as it would kill the CUDA context.
//
// Numerics: the device functions the C library lacks are computed in double for float (erfinv,
// erfcinv, erfcx, normcdf(inv), cyl_bessel_i0/i1, sinpi/cospi, norm3d..., rsqrt, rcbrt):
// correctly rounded or within an ulp or two; the double versions are within a few ulp.
// Fast intrinsics (__expf, __fdividef, ...) are the exact host functions. __float2half(NaN) and
// __float2bfloat16_rn(NaN) are 0x7fff, as on the GPU.
//
// Not supported: dynamic shared memory (`extern __shared__`), dynamic parallelism, cooperative
// groups, textures/surfaces, inline PTX, bfloat16 arithmetic beyond conversions, __hadd,
// __hmul and __hisnan (__nv_bfloat16 is a storage type here, as tclang uses it), arithmetic
// intrinsics in rounding modes other than round-to-nearest (__fadd_rz, ...).
//
// Context switches are hand-written on x86-64 (callee-saved registers only); other targets,
// or -DTCLANG_EMU_USE_UCONTEXT (for AddressSanitizer, say), use ucontext (makecontext/
// swapcontext): it saves the signal mask with a system call at every switch, so barriers cost
// about 20 times more.

#ifndef TCLANG_CUDA_EMULATION_H
#define TCLANG_CUDA_EMULATION_H

#ifndef TCLANG_EMULATION
#define TCLANG_EMULATION 1
#endif

#include <cctype>
#include <cerrno>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <math.h>    // libstdc++'s wrapper: puts the float overloads (exp(float)...) in ::
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#if !defined(__x86_64__) || defined(TCLANG_EMU_USE_UCONTEXT)
#include <ucontext.h>
#ifndef TCLANG_EMU_USE_UCONTEXT
#define TCLANG_EMU_USE_UCONTEXT 1
#endif
#endif

// ---------------------------------------------------------------------------------------
// Qualifiers
// ---------------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __managed__
#define __constant__
#define __shared__ static thread_local
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __builtin_align__(n) __attribute__((aligned(n)))
#define __device_builtin__
#define __cudart_builtin__
// __restrict__ is a g++ keyword already.

// ---------------------------------------------------------------------------------------
// Vector types and dim3
// ---------------------------------------------------------------------------------------
#define TCLANG_EMU_VEC(T, N, A1, A2, A3, A4)                                                 \
  struct __attribute__((aligned(A1))) N##1 { T x; };                                        \
  struct __attribute__((aligned(A2))) N##2 { T x, y; };                                     \
  struct __attribute__((aligned(A3))) N##3 { T x, y, z; };                                  \
  struct __attribute__((aligned(A4))) N##4 { T x, y, z, w; };                               \
  static inline N##1 make_##N##1(T x) { N##1 r; r.x = x; return r; }                       \
  static inline N##2 make_##N##2(T x, T y) { N##2 r; r.x = x; r.y = y; return r; }          \
  static inline N##3 make_##N##3(T x, T y, T z) {                                           \
    N##3 r; r.x = x; r.y = y; r.z = z; return r; }                                          \
  static inline N##4 make_##N##4(T x, T y, T z, T w) {                                      \
    N##4 r; r.x = x; r.y = y; r.z = z; r.w = w; return r; }
TCLANG_EMU_VEC(signed char, char, 1, 2, 1, 4)
TCLANG_EMU_VEC(unsigned char, uchar, 1, 2, 1, 4)
TCLANG_EMU_VEC(short, short, 2, 4, 2, 8)
TCLANG_EMU_VEC(unsigned short, ushort, 2, 4, 2, 8)
TCLANG_EMU_VEC(int, int, 4, 8, 4, 16)
TCLANG_EMU_VEC(unsigned int, uint, 4, 8, 4, 16)
TCLANG_EMU_VEC(long, long, 8, 16, 8, 16)
TCLANG_EMU_VEC(unsigned long, ulong, 8, 16, 8, 16)
TCLANG_EMU_VEC(long long, longlong, 8, 16, 8, 16)
TCLANG_EMU_VEC(unsigned long long, ulonglong, 8, 16, 8, 16)
TCLANG_EMU_VEC(float, float, 4, 8, 4, 16)
TCLANG_EMU_VEC(double, double, 8, 16, 8, 16)
#undef TCLANG_EMU_VEC

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

static constexpr int warpSize = 32;

#pragma GCC visibility push(hidden)

// ---------------------------------------------------------------------------------------
// The runtime: fibers, scheduler, launcher
// ---------------------------------------------------------------------------------------
enum {
  TCLANG_EMU_OK = 0,
  TCLANG_EMU_ERR_INVALID_CONFIG = 1,   // block/grid dimensions out of CUDA's limits
  TCLANG_EMU_ERR_OUT_OF_MEMORY = 2,    // fiber stacks could not be allocated
  TCLANG_EMU_ERR_TRAP = 3,             // a thread called __trap()
  TCLANG_EMU_ERR_DEADLOCK = 4,         // threads wait at barriers that can never complete
  TCLANG_EMU_ERR_DIVERGENT_BARRIER = 5,// TCLANG_EMULATION_CHECK_BARRIERS: different sites
  TCLANG_EMU_ERR_NESTED_LAUNCH = 6,    // launch() called from device code
  TCLANG_EMU_ERR_ENVIRONMENT = 7,      // a TCLANG_EMULATION_* variable has a bad value
};

#ifndef TCLANG_EMU_STACK_SIZE
#define TCLANG_EMU_STACK_SIZE (64 * 1024)
#endif

namespace tclang_emu {
namespace detail {

enum FiberState : unsigned char { READY, AT_BLOCK_BARRIER, AT_WARP_BARRIER, DONE, TRAPPED };

struct Fiber {
  void* sp;               // saved stack pointer (hand-written switch)
  const void* site;       // return address of the __syncthreads() it waits at
  unsigned mask;          // lanes named by the warp barrier it waits at
  unsigned xcount;        // warp exchanges (shuffles, votes) made so far
  unsigned char state;
#ifdef TCLANG_EMU_USE_UCONTEXT
  ucontext_t uc;
#endif
};

struct Slot {             // one lane's value in a warp exchange
  unsigned long long bits;
  unsigned tag;           // the lane's exchange count when it wrote bits
};

enum { kMessageBytes = 512 };

struct Launch {
  void (*fn)(void*);
  void* arg;
  dim3 grid, block;
  unsigned long long nblocks;
  size_t stack_size;
  bool check_sites;
  unsigned long long next;               // next block to hand out (atomic)
  int failed;                            // (atomic) stop handing out blocks
  int workers;                           // (atomic) OS threads that joined
  pthread_mutex_t mutex;
  int code;
  char message[kMessageBytes];
};

inline void fail(Launch* L, int code, const char* message) {
  pthread_mutex_lock(&L->mutex);
  if (L->code == 0) {
    L->code = code;
    std::snprintf(L->message, sizeof L->message, "%s", message);
  }
  __atomic_store_n(&L->failed, 1, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&L->mutex);
}

struct Worker {
  Launch* launch;
  int id;
  unsigned n;                            // threads per block
  Fiber* fibers;
  uint3* tids;
  Slot* xchg;                            // 2 * n: double-buffered by exchange parity
  char* stacks;
  size_t stride;                         // bytes per stack, guard page included
  unsigned current;
  unsigned n_done, n_block, n_warp;
  int acc_count, acc_and, acc_or;        // __syncthreads_count/_and/_or
  int res_count, res_and, res_or;
  bool trapped;
  uint3 block_idx;
  char message[kMessageBytes];
#ifdef TCLANG_EMU_USE_UCONTEXT
  ucontext_t sched_uc;
#else
  void* sched_sp;
#endif
};

inline thread_local Worker* t_worker = nullptr;
inline thread_local uint3 t_thread_idx{0, 0, 0};
inline thread_local uint3 t_block_idx{0, 0, 0};
inline thread_local dim3 t_block_dim{1, 1, 1};
inline thread_local dim3 t_grid_dim{1, 1, 1};
inline thread_local char t_last_error[kMessageBytes];
inline thread_local int t_last_code = 0;

// ---- context switch ----
#ifndef TCLANG_EMU_USE_UCONTEXT
// switch_to(save, to): push the callee-saved registers on the current stack, store the stack
// pointer in *save, load `to`, pop, return there. MXCSR and the x87 control word are not
// switched (ldmxcsr/fldcw cost more than the rest of the switch): the fibers of a worker share
// its floating-point environment, which CUDA code has no way to change.
__attribute__((naked, noinline, noipa)) static void switch_to(void** /*save*/, void* /*to*/) {
  __asm__ volatile(
      "pushq %rbp\n\t"
      "pushq %rbx\n\t"
      "pushq %r12\n\t"
      "pushq %r13\n\t"
      "pushq %r14\n\t"
      "pushq %r15\n\t"
      "movq %rsp, (%rdi)\n\t"
      "movq %rsi, %rsp\n\t"
      "popq %r15\n\t"
      "popq %r14\n\t"
      "popq %r13\n\t"
      "popq %r12\n\t"
      "popq %rbx\n\t"
      "popq %rbp\n\t"
      "ret\n\t");
}
// First code a fresh fiber runs: call the function in %rbx with an aligned stack.
__attribute__((naked, noinline, noipa)) static void fiber_trampoline() {
  __asm__ volatile(
      "callq *%rbx\n\t"
      "ud2\n\t");
}
#endif

inline void to_scheduler(Worker* w, Fiber& f) {
#ifdef TCLANG_EMU_USE_UCONTEXT
  swapcontext(&f.uc, &w->sched_uc);
#else
  switch_to(&f.sp, w->sched_sp);
#endif
}

[[noreturn]] inline void fiber_main() noexcept {
  Worker* w = t_worker;
  w->launch->fn(w->launch->arg);
  w = t_worker;
  Fiber& f = w->fibers[w->current];
  f.state = DONE;
  ++w->n_done;
  to_scheduler(w, f);
  __builtin_trap();  // a finished fiber is never resumed
}

#ifdef TCLANG_EMU_USE_UCONTEXT
inline void fiber_main_uc() { fiber_main(); }
#endif

inline void init_fiber(Worker& w, unsigned i) {
  Fiber& f = w.fibers[i];
  char* base = w.stacks + (size_t)i * w.stride;     // guard page at base
  char* top = base + w.stride;
  f.state = READY;
  f.xcount = 0;
  f.mask = 0;
  f.site = nullptr;
#ifdef TCLANG_EMU_USE_UCONTEXT
  (void)top;
  getcontext(&f.uc);
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  f.uc.uc_stack.ss_sp = base + page;
  f.uc.uc_stack.ss_size = w.stride - page;
  f.uc.uc_link = nullptr;
  makecontext(&f.uc, (void (*)())fiber_main_uc, 0);
#else
  void** t = (void**)((uintptr_t)top & ~(uintptr_t)15);
  t[-1] = (void*)&fiber_trampoline;   // return address
  t[-2] = nullptr;                    // rbp
  t[-3] = (void*)&fiber_main;         // rbx: called by the trampoline
  t[-4] = nullptr;                    // r12
  t[-5] = nullptr;                    // r13
  t[-6] = nullptr;                    // r14
  t[-7] = nullptr;                    // r15
  f.sp = &t[-7];
#endif
}

inline void resume(Worker& w, unsigned i) {
  w.current = i;
  t_thread_idx = w.tids[i];
#ifdef TCLANG_EMU_USE_UCONTEXT
  swapcontext(&w.sched_uc, &w.fibers[i].uc);
#else
  switch_to(&w.sched_sp, w.fibers[i].sp);
#endif
}

// ---- fiber stacks: regions of `count` stacks (guard page at the bottom of each) that
// workers borrow for a launch and give back, so later launches reuse mapped pages ----
struct StackRegion {
  char* base;
  size_t stride, count;
};
// Few regions: every mapping counts against the process's limit (vm.max_map_count), and a
// test process loads hundreds of kernels.
enum { kPoolRegions = 4 };
struct StackPool {
  pthread_mutex_t mutex;
  int size;
  StackRegion free[kPoolRegions];
};
// Never destroyed: regions stay mapped until the process exits.
inline StackPool g_stack_pool = {PTHREAD_MUTEX_INITIALIZER, 0, {}};

inline StackRegion get_stacks(size_t count, size_t stride) {
  StackPool& p = g_stack_pool;
  pthread_mutex_lock(&p.mutex);
  for (int i = 0; i < p.size; ++i) {
    if (p.free[i].stride == stride && p.free[i].count >= count) {
      StackRegion r = p.free[i];
      p.free[i] = p.free[--p.size];
      pthread_mutex_unlock(&p.mutex);
      return r;
    }
  }
  pthread_mutex_unlock(&p.mutex);
  void* m = mmap(nullptr, count * stride, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (m == MAP_FAILED) return StackRegion{nullptr, 0, 0};
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
#ifdef TCLANG_EMU_GUARD_EVERY_STACK
  // a guard page under each stack: an overflow crashes at once, but costs two mappings
  // per CUDA thread
  for (size_t i = 0; i < count; ++i) mprotect((char*)m + i * stride, page, PROT_NONE);
#else
  mprotect(m, page, PROT_NONE);  // one guard page under the whole region
#endif
  return StackRegion{(char*)m, stride, count};
}

inline void put_stacks(StackRegion r) {
  if (!r.base) return;
  StackPool& p = g_stack_pool;
  StackRegion drop{nullptr, 0, 0};
  pthread_mutex_lock(&p.mutex);
  if (p.size == kPoolRegions) { drop = p.free[0]; p.free[0] = p.free[--p.size]; }
  p.free[p.size++] = r;
  pthread_mutex_unlock(&p.mutex);
  if (drop.base) munmap(drop.base, drop.count * drop.stride);
}

// ---- barriers, called from fibers ----
__attribute__((noinline, noipa)) inline void block_barrier(const void* site) {
  Worker* w = t_worker;
  if (!w) return;                                  // host code: nothing to wait for
  Fiber& f = w->fibers[w->current];
  f.state = AT_BLOCK_BARRIER;
  f.site = site;
  ++w->n_block;
  __asm__ volatile("" ::: "memory");
  to_scheduler(w, f);
  __asm__ volatile("" ::: "memory");
}

__attribute__((noinline, noipa)) inline void warp_barrier(unsigned mask) {
  Worker* w = t_worker;
  if (!w) return;
  Fiber& f = w->fibers[w->current];
  f.state = AT_WARP_BARRIER;
  f.mask = mask;
  ++w->n_warp;
  __asm__ volatile("" ::: "memory");
  to_scheduler(w, f);
  __asm__ volatile("" ::: "memory");
}

[[noreturn]] __attribute__((noinline)) inline void trap() {
  Worker* w = t_worker;
  if (!w) {
    std::fprintf(stderr, "__trap() called outside a kernel launch\n");
    std::abort();
  }
  Fiber& f = w->fibers[w->current];
  f.state = TRAPPED;
  w->trapped = true;
  to_scheduler(w, f);
  __builtin_trap();
}

#define TCLANG_EMU_U3(v) (v).x, (v).y, (v).z

// Release what can be released after a pass in which every fiber ran until it blocked.
// Returns 0, or an error code with w.message set.
inline int release(Worker& w) {
  bool released = false;
  if (w.n_warp) {
    for (unsigned base = 0; base < w.n; base += 32) {
      unsigned end = base + 32u < w.n ? base + 32u : w.n, live = 0, waiting = 0, want = 0;
      for (unsigned i = base; i < end; ++i) {
        const Fiber& f = w.fibers[i];
        unsigned bit = 1u << (i - base);
        if (f.state != DONE) live |= bit;
        if (f.state == AT_WARP_BARRIER) { waiting |= bit; want |= f.mask; }
      }
      if (waiting && (want & live & ~waiting) == 0) {
        for (unsigned i = base; i < end; ++i)
          if (w.fibers[i].state == AT_WARP_BARRIER) w.fibers[i].state = READY;
        w.n_warp -= (unsigned)__builtin_popcount(waiting);
        released = true;
      }
    }
    if (released) return 0;
  }
  if (w.n_block + w.n_done == w.n) {
    if (w.launch->check_sites) {
      long first = -1;
      for (unsigned i = 0; i < w.n; ++i) {
        const Fiber& f = w.fibers[i];
        if (f.state != AT_BLOCK_BARRIER) continue;
        if (first < 0) { first = i; continue; }
        if (f.site != w.fibers[first].site) {
          std::snprintf(w.message, sizeof w.message,
                        "divergent barrier: threads of block (%u,%u,%u) reached different "
                        "__syncthreads() calls (thread (%u,%u,%u) at %p, thread (%u,%u,%u) "
                        "at %p)", TCLANG_EMU_U3(w.block_idx), TCLANG_EMU_U3(w.tids[first]),
                        w.fibers[first].site, TCLANG_EMU_U3(w.tids[i]), f.site);
          return TCLANG_EMU_ERR_DIVERGENT_BARRIER;
        }
      }
    }
    for (unsigned i = 0; i < w.n; ++i)
      if (w.fibers[i].state == AT_BLOCK_BARRIER) w.fibers[i].state = READY;
    w.n_block = 0;
    w.res_count = w.acc_count; w.res_and = w.acc_and; w.res_or = w.acc_or;
    w.acc_count = 0; w.acc_and = 1; w.acc_or = 0;
    return 0;
  }
  // Some fibers wait at __syncthreads(), others at warp barriers that cannot complete.
  unsigned at_block = 0, at_warp = 0;
  while (at_block < w.n && w.fibers[at_block].state != AT_BLOCK_BARRIER) ++at_block;
  while (at_warp < w.n && w.fibers[at_warp].state != AT_WARP_BARRIER) ++at_warp;
  uint3 none{0, 0, 0};
  std::snprintf(w.message, sizeof w.message,
                "deadlock in block (%u,%u,%u): %u thread(s) wait at __syncthreads() (first "
                "(%u,%u,%u)) while %u wait at a warp barrier (__syncwarp or a *_sync warp "
                "operation; first (%u,%u,%u)) whose lanes never all arrive: divergent barriers",
                TCLANG_EMU_U3(w.block_idx), w.n_block,
                TCLANG_EMU_U3(at_block < w.n ? w.tids[at_block] : none), w.n_warp,
                TCLANG_EMU_U3(at_warp < w.n ? w.tids[at_warp] : none));
  return TCLANG_EMU_ERR_DEADLOCK;
}

inline int run_block(Worker& w, unsigned long long b) {
  const dim3 g = w.launch->grid;
  uint3 bi;
  bi.x = (unsigned)(b % g.x);
  bi.y = (unsigned)((b / g.x) % g.y);
  bi.z = (unsigned)(b / ((unsigned long long)g.x * g.y));
  w.block_idx = bi;
  t_block_idx = bi;
  for (unsigned i = 0; i < w.n; ++i) init_fiber(w, i);
  for (unsigned i = 0; i < 2 * w.n; ++i) w.xchg[i].tag = ~0u;
  w.n_done = w.n_block = w.n_warp = 0;
  w.acc_count = 0; w.acc_and = 1; w.acc_or = 0;
  w.res_count = 0; w.res_and = 1; w.res_or = 0;
  w.trapped = false;
  for (;;) {
    for (unsigned i = 0; i < w.n; ++i) {
      if (w.fibers[i].state != READY) continue;
      resume(w, i);
      if (w.trapped) {
        std::snprintf(w.message, sizeof w.message,
                      "__trap() called by thread (%u,%u,%u) of block (%u,%u,%u)",
                      TCLANG_EMU_U3(w.tids[w.current]), TCLANG_EMU_U3(bi));
        return TCLANG_EMU_ERR_TRAP;
      }
    }
    if (w.n_done == w.n) return 0;
    int rc = release(w);
    if (rc) return rc;
  }
}

inline void* work(void* launch) {
  Launch* L = static_cast<Launch*>(launch);
  static_assert(std::is_trivially_default_constructible<Worker>::value, "Worker is POD");
  Worker* w = static_cast<Worker*>(std::calloc(1, sizeof(Worker)));
  if (!w) { fail(L, TCLANG_EMU_ERR_OUT_OF_MEMORY, "out of memory for a worker"); return nullptr; }
  w->launch = L;
  w->id = __atomic_fetch_add(&L->workers, 1, __ATOMIC_RELAXED);
  const dim3 bd = L->block;
  w->n = bd.x * bd.y * bd.z;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  w->stride = (L->stack_size + page - 1) / page * page + page;
  StackRegion region = get_stacks(w->n, w->stride);
  w->stacks = region.base;
  w->fibers = static_cast<Fiber*>(std::calloc(w->n, sizeof(Fiber)));
  w->tids = static_cast<uint3*>(std::calloc(w->n, sizeof(uint3)));
  w->xchg = static_cast<Slot*>(std::calloc(2 * (size_t)w->n, sizeof(Slot)));
  if (!w->stacks || !w->fibers || !w->tids || !w->xchg) {
    char m[200];
    std::snprintf(m, sizeof m, "cannot allocate %u fiber stacks of %zu bytes (set "
                  "TCLANG_EMULATION_STACK_SIZE lower?)", w->n, w->stride);
    fail(L, TCLANG_EMU_ERR_OUT_OF_MEMORY, m);
  } else {
    for (unsigned i = 0; i < w->n; ++i) {
      w->tids[i].x = i % bd.x;
      w->tids[i].y = (i / bd.x) % bd.y;
      w->tids[i].z = i / (bd.x * bd.y);
    }
    Worker* saved = t_worker;
    t_worker = w;
    t_block_dim = L->block;
    t_grid_dim = L->grid;
    while (!__atomic_load_n(&L->failed, __ATOMIC_RELAXED)) {
      unsigned long long b = __atomic_fetch_add(&L->next, 1ull, __ATOMIC_RELAXED);
      if (b >= L->nblocks) break;
      int rc = run_block(*w, b);
      if (rc) { fail(L, rc, w->message); break; }
    }
    t_worker = saved;
    t_thread_idx = uint3{0, 0, 0};
    t_block_idx = uint3{0, 0, 0};
  }
  put_stacks(region);
  std::free(w->fibers);
  std::free(w->tids);
  std::free(w->xchg);
  std::free(w);
  return nullptr;
}

// The TCLANG_EMULATION_* variables, read at each launch as tclang/environment.py reads the
// others: unset or empty means the default; a value the variable does not take fails the
// launch with TCLANG_EMU_ERR_ENVIRONMENT and a message naming it (such values were read as
// the default, or as 0: a typo went unnoticed).
inline bool env_count(const char* name, long fallback, bool sizes, long* out, char* message) {
  const char* s = std::getenv(name);
  *out = fallback;
  if (!s || !*s) return true;
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(s, &end, 10);
  long scale = 1;
  if (sizes && (*end == 'k' || *end == 'K')) scale = 1024, ++end;
  else if (sizes && (*end == 'm' || *end == 'M')) scale = 1024 * 1024, ++end;
  if (end == s || *end != '\0' || errno != 0 || v < 1 || v > LONG_MAX / scale) {
    std::snprintf(message, kMessageBytes, "%s must be a whole number of at least 1%s, not "
                  "'%.64s'; unset it for the default", name,
                  sizes ? " (bytes, or KiB and MiB with k and m)" : "", s);
    return false;
  }
  *out = v * scale;
  return true;
}

inline bool env_switch(const char* name, bool* out, char* message) {
  static const char* const on[] = {"1", "true", "yes", "on"};
  static const char* const off[] = {"0", "false", "no", "off"};
  const char* s = std::getenv(name);
  *out = false;
  if (!s || !*s) return true;
  char word[8] = {0};
  size_t n = std::strlen(s);
  for (size_t k = 0; k < n && k + 1 < sizeof word; ++k)
    word[k] = (char)std::tolower((unsigned char)s[k]);
  for (int k = 0; k < 4 && n < sizeof word; ++k) {
    if (std::strcmp(word, on[k]) == 0) return *out = true;
    if (std::strcmp(word, off[k]) == 0) return true;
  }
  std::snprintf(message, kMessageBytes, "%s must be one of 1, true, yes, on (on) or 0, false, "
                "no, off (off), not '%.64s'; unset, it is off", name, s);
  return false;
}

inline unsigned cores() {
#ifdef CPU_COUNT
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int c = CPU_COUNT(&set);
    if (c > 0) return (unsigned)c;
  }
#endif
  long c = sysconf(_SC_NPROCESSORS_ONLN);
  return c > 0 ? (unsigned)c : 1u;
}

inline int finish(int code, const char* message) {
  t_last_code = code;
  std::snprintf(t_last_error, sizeof t_last_error, "%s", message);
  return code;
}

inline int launch_erased(dim3 grid, dim3 block, void (*fn)(void*), void* arg) {
  if (t_worker)
    return finish(TCLANG_EMU_ERR_NESTED_LAUNCH,
                  "a kernel launch from device code (dynamic parallelism) is not supported");
  unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
  const char* bad = nullptr;
  if (block.x == 0 || block.y == 0 || block.z == 0) bad = "a block dimension is 0";
  else if (block.x > 1024 || block.y > 1024 || block.z > 64)
    bad = "block dimensions exceed (1024, 1024, 64)";
  else if (threads > 1024) bad = "more than 1024 threads per block";
  else if (grid.x == 0 || grid.y == 0 || grid.z == 0) bad = "a grid dimension is 0";
  else if (grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
    bad = "grid dimensions exceed (2147483647, 65535, 65535)";
  if (bad) {
    char m[kMessageBytes];
    std::snprintf(m, sizeof m, "invalid launch configuration: %s (grid (%u,%u,%u), block "
                  "(%u,%u,%u): %llu threads per block, at most 1024)", bad,
                  TCLANG_EMU_U3(grid), TCLANG_EMU_U3(block), threads);
    return finish(TCLANG_EMU_ERR_INVALID_CONFIG, m);
  }
  Launch L = Launch();
  pthread_mutex_init(&L.mutex, nullptr);
  L.fn = fn;
  L.arg = arg;
  L.grid = grid;
  L.block = block;
  L.nblocks = (unsigned long long)grid.x * grid.y * grid.z;
  long stack = 0, want = 0;
  bool check = false;
  char m[kMessageBytes];
  if (!env_count("TCLANG_EMULATION_STACK_SIZE", TCLANG_EMU_STACK_SIZE, true, &stack, m) ||
      !env_count("TCLANG_EMULATION_THREADS", 0, false, &want, m) ||
      !env_switch("TCLANG_EMULATION_CHECK_BARRIERS", &check, m)) {
    pthread_mutex_destroy(&L.mutex);
    return finish(TCLANG_EMU_ERR_ENVIRONMENT, m);
  }
  L.stack_size = (size_t)(stack > 16 * 1024 ? stack : 16 * 1024);
  L.check_sites = check;
  unsigned long long workers = want > 0 ? (unsigned long long)want : cores();
  if (workers > L.nblocks) workers = L.nblocks;
  if (workers > 256) workers = 256;
  pthread_t pool[256];
  unsigned started = 0;
  for (unsigned long long k = 1; k < workers; ++k) {
    // fewer OS threads than asked for if creation fails: the others take the blocks
    if (pthread_create(&pool[started], nullptr, work, &L) != 0) break;
    ++started;
  }
  work(&L);
  for (unsigned k = 0; k < started; ++k) pthread_join(pool[k], nullptr);
  pthread_mutex_destroy(&L.mutex);
  return finish(L.code, L.message);
}

}  // namespace detail

// Run kernel_call() once per CUDA thread of every block of `grid`. Returns 0 or a
// TCLANG_EMU_ERR_* code; see tclang_emu_last_error().
template <class F>
inline int launch(dim3 grid, dim3 block, F&& kernel_call) {
  using Fn = typename std::remove_reference<F>::type;
  return detail::launch_erased(
      grid, block, [](void* p) { (*static_cast<Fn*>(p))(); },
      const_cast<void*>(static_cast<const volatile void*>(__builtin_addressof(kernel_call))));
}

// Diagnostics: a distinct index (0, 1, ...) of the OS thread running the calling CUDA
// thread's block within the current launch; -1 outside a launch.
inline int worker_id() { return detail::t_worker ? detail::t_worker->id : -1; }

}  // namespace tclang_emu

// ---------------------------------------------------------------------------------------
// Built-in variables (read-only, per fiber)
// ---------------------------------------------------------------------------------------
#define threadIdx (static_cast<const ::uint3&>(::tclang_emu::detail::t_thread_idx))
#define blockIdx (static_cast<const ::uint3&>(::tclang_emu::detail::t_block_idx))
#define blockDim (static_cast<const ::dim3&>(::tclang_emu::detail::t_block_dim))
#define gridDim (static_cast<const ::dim3&>(::tclang_emu::detail::t_grid_dim))

// ---------------------------------------------------------------------------------------
// Synchronisation
// ---------------------------------------------------------------------------------------
__attribute__((noinline, noipa)) inline void __syncthreads() {
  ::tclang_emu::detail::block_barrier(__builtin_return_address(0));
}

namespace tclang_emu { namespace detail {
inline int sync_reduce(int pred, int which, const void* site) {
  Worker* w = t_worker;
  if (!w) return pred != 0;
  w->acc_count += pred != 0;
  w->acc_and &= pred != 0;
  w->acc_or |= pred != 0;
  block_barrier(site);
  w = t_worker;
  return which == 0 ? w->res_count : which == 1 ? w->res_and : w->res_or;
}
}}  // namespace tclang_emu::detail

__attribute__((noinline, noipa)) inline int __syncthreads_count(int pred) {
  return ::tclang_emu::detail::sync_reduce(pred, 0, __builtin_return_address(0));
}
__attribute__((noinline, noipa)) inline int __syncthreads_and(int pred) {
  return ::tclang_emu::detail::sync_reduce(pred, 1, __builtin_return_address(0));
}
__attribute__((noinline, noipa)) inline int __syncthreads_or(int pred) {
  return ::tclang_emu::detail::sync_reduce(pred, 2, __builtin_return_address(0));
}
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::tclang_emu::detail::warp_barrier(mask); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
[[noreturn]] inline void __trap() { ::tclang_emu::detail::trap(); }
inline void __brkpt() { ::tclang_emu::detail::trap(); }
inline void __nanosleep(unsigned) {}
inline long long clock64() {  // nanoseconds, not cycles
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// ---------------------------------------------------------------------------------------
// Warp operations: each is one warp barrier; values travel through the block's exchange
// buffer (double-buffered by the lane's exchange count, so one barrier suffices).
// ---------------------------------------------------------------------------------------
namespace tclang_emu { namespace detail {
template <class T>
inline T shfl(unsigned mask, T var, int mode, int arg, int width) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                "warp shuffles move scalars of at most 8 bytes");
  Worker* w = t_worker;
  if (!w) return var;
  unsigned me = w->current, lane = me & 31u, base = me & ~31u;
  unsigned k = w->fibers[me].xcount++;
  Slot& mine = w->xchg[2 * (size_t)me + (k & 1)];
  mine.bits = 0;
  std::memcpy(&mine.bits, &var, sizeof(T));
  mine.tag = k;
  warp_barrier(mask);
  w = t_worker;
  if (width <= 0 || width > 32) width = 32;
  unsigned seg = lane & ~(unsigned)(width - 1), in = lane - seg, src;
  switch (mode) {
    case 0: src = seg + ((unsigned)arg & (unsigned)(width - 1)); break;           // idx
    case 1: src = (int)in - arg < 0 ? lane : lane - (unsigned)arg; break;        // up
    case 2: src = in + (unsigned)arg >= (unsigned)width ? lane : lane + (unsigned)arg; break;
    default: {                                                                    // xor
      unsigned s = lane ^ (unsigned)arg;
      src = (s >= seg + (unsigned)width) ? lane : s;
    }
  }
  unsigned idx = base + src;
  if (idx >= w->n) return var;
  const Slot& s = w->xchg[2 * (size_t)idx + (k & 1)];
  if (s.tag != k) return var;                   // that lane did not take part
  T out;
  std::memcpy(&out, &s.bits, sizeof(T));
  return out;
}

// One vote: returns the lanes (of `mask`) whose pred is true, and in *participants the
// lanes of `mask` that took part.
inline unsigned vote(unsigned mask, int pred, unsigned* participants) {
  Worker* w = t_worker;
  if (!w) { *participants = 1u; return pred ? 1u : 0u; }
  unsigned me = w->current, base = me & ~31u;
  unsigned k = w->fibers[me].xcount++;
  Slot& mine = w->xchg[2 * (size_t)me + (k & 1)];
  mine.bits = pred != 0;
  mine.tag = k;
  warp_barrier(mask);
  w = t_worker;
  unsigned yes = 0, part = 0, end = base + 32u < w->n ? base + 32u : w->n;
  for (unsigned i = base; i < end; ++i) {
    const Slot& s = w->xchg[2 * (size_t)i + (k & 1)];
    unsigned bit = 1u << (i - base);
    if (s.tag != k || !(mask & bit)) continue;
    part |= bit;
    if (s.bits) yes |= bit;
  }
  *participants = part;
  return yes;
}

inline unsigned active_lanes() {
  Worker* w = t_worker;
  if (!w) return 1u;
  unsigned base = w->current & ~31u, out = 0, end = base + 32u < w->n ? base + 32u : w->n;
  for (unsigned i = base; i < end; ++i)
    if (w->fibers[i].state != DONE && w->fibers[i].state != TRAPPED) out |= 1u << (i - base);
  return out;
}
}}  // namespace tclang_emu::detail

template <class T> inline T __shfl_sync(unsigned mask, T var, int src, int width = 32) {
  return ::tclang_emu::detail::shfl(mask, var, 0, src, width);
}
template <class T> inline T __shfl_up_sync(unsigned mask, T var, unsigned d, int width = 32) {
  return ::tclang_emu::detail::shfl(mask, var, 1, (int)d, width);
}
template <class T> inline T __shfl_down_sync(unsigned mask, T var, unsigned d, int width = 32) {
  return ::tclang_emu::detail::shfl(mask, var, 2, (int)d, width);
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T var, int m, int width = 32) {
  return ::tclang_emu::detail::shfl(mask, var, 3, m, width);
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  unsigned part;
  return ::tclang_emu::detail::vote(mask, pred, &part);
}
inline int __all_sync(unsigned mask, int pred) {
  unsigned part, yes = ::tclang_emu::detail::vote(mask, pred, &part);
  return yes == part;
}
inline int __any_sync(unsigned mask, int pred) {
  unsigned part;
  return ::tclang_emu::detail::vote(mask, pred, &part) != 0;
}
inline unsigned __activemask() { return ::tclang_emu::detail::active_lanes(); }
inline unsigned __lanemask_lt() {
  unsigned l = ::tclang_emu::detail::t_worker ? ::tclang_emu::detail::t_worker->current & 31u : 0;
  return (1u << l) - 1u;
}

// ---------------------------------------------------------------------------------------
// Atomics (sequentially consistent host atomics; correct across OS threads)
// ---------------------------------------------------------------------------------------
namespace tclang_emu { namespace detail {
template <class T, class Op> inline T atomic_update(T* addr, Op op) {
  T old;
  __atomic_load(addr, &old, __ATOMIC_RELAXED);
  for (;;) {
    T desired = op(old);
    if (__atomic_compare_exchange(addr, &old, &desired, false, __ATOMIC_SEQ_CST,
                                  __ATOMIC_RELAXED))
      return old;
  }
}
}}  // namespace tclang_emu::detail

#define TCLANG_EMU_SEQ __ATOMIC_SEQ_CST
inline int atomicAdd(int* a, int v) { return __atomic_fetch_add(a, v, TCLANG_EMU_SEQ); }
inline unsigned atomicAdd(unsigned* a, unsigned v) { return __atomic_fetch_add(a, v, TCLANG_EMU_SEQ); }
inline unsigned long long atomicAdd(unsigned long long* a, unsigned long long v) {
  return __atomic_fetch_add(a, v, TCLANG_EMU_SEQ);
}
inline float atomicAdd(float* a, float v) {
  return ::tclang_emu::detail::atomic_update(a, [v](float o) { return o + v; });
}
inline double atomicAdd(double* a, double v) {
  return ::tclang_emu::detail::atomic_update(a, [v](double o) { return o + v; });
}
inline int atomicSub(int* a, int v) { return __atomic_fetch_sub(a, v, TCLANG_EMU_SEQ); }
inline unsigned atomicSub(unsigned* a, unsigned v) { return __atomic_fetch_sub(a, v, TCLANG_EMU_SEQ); }
inline int atomicExch(int* a, int v) { return __atomic_exchange_n(a, v, TCLANG_EMU_SEQ); }
inline unsigned atomicExch(unsigned* a, unsigned v) { return __atomic_exchange_n(a, v, TCLANG_EMU_SEQ); }
inline unsigned long long atomicExch(unsigned long long* a, unsigned long long v) {
  return __atomic_exchange_n(a, v, TCLANG_EMU_SEQ);
}
inline float atomicExch(float* a, float v) {
  float old;
  __atomic_exchange(a, &v, &old, TCLANG_EMU_SEQ);
  return old;
}
#define TCLANG_EMU_MINMAX(T)                                                                 \
  inline T atomicMin(T* a, T v) {                                                            \
    return ::tclang_emu::detail::atomic_update(a, [v](T o) { return v < o ? v : o; });       \
  }                                                                                          \
  inline T atomicMax(T* a, T v) {                                                            \
    return ::tclang_emu::detail::atomic_update(a, [v](T o) { return v > o ? v : o; });       \
  }
TCLANG_EMU_MINMAX(int)
TCLANG_EMU_MINMAX(unsigned)
TCLANG_EMU_MINMAX(long long)
TCLANG_EMU_MINMAX(unsigned long long)
#undef TCLANG_EMU_MINMAX
inline unsigned atomicInc(unsigned* a, unsigned v) {
  return ::tclang_emu::detail::atomic_update(a, [v](unsigned o) { return o >= v ? 0u : o + 1; });
}
inline unsigned atomicDec(unsigned* a, unsigned v) {
  return ::tclang_emu::detail::atomic_update(
      a, [v](unsigned o) { return (o == 0 || o > v) ? v : o - 1; });
}
#define TCLANG_EMU_CAS(T)                                                                    \
  inline T atomicCAS(T* a, T compare, T val) {                                               \
    __atomic_compare_exchange_n(a, &compare, val, false, TCLANG_EMU_SEQ, TCLANG_EMU_SEQ);    \
    return compare;                                                                          \
  }
TCLANG_EMU_CAS(int)
TCLANG_EMU_CAS(unsigned)
TCLANG_EMU_CAS(unsigned long long)
TCLANG_EMU_CAS(unsigned short)
#undef TCLANG_EMU_CAS
#define TCLANG_EMU_BITS(T)                                                                   \
  inline T atomicAnd(T* a, T v) { return __atomic_fetch_and(a, v, TCLANG_EMU_SEQ); }         \
  inline T atomicOr(T* a, T v) { return __atomic_fetch_or(a, v, TCLANG_EMU_SEQ); }           \
  inline T atomicXor(T* a, T v) { return __atomic_fetch_xor(a, v, TCLANG_EMU_SEQ); }
TCLANG_EMU_BITS(int)
TCLANG_EMU_BITS(unsigned)
TCLANG_EMU_BITS(unsigned long long)
#undef TCLANG_EMU_BITS
// Scoped variants: every scope is the whole process here.
#define TCLANG_EMU_SCOPED(name)                                                              \
  template <class... A> inline auto name##_block(A... a) -> decltype(name(a...)) {           \
    return name(a...);                                                                       \
  }                                                                                          \
  template <class... A> inline auto name##_system(A... a) -> decltype(name(a...)) {          \
    return name(a...);                                                                       \
  }
TCLANG_EMU_SCOPED(atomicAdd) TCLANG_EMU_SCOPED(atomicSub) TCLANG_EMU_SCOPED(atomicExch)
TCLANG_EMU_SCOPED(atomicMin) TCLANG_EMU_SCOPED(atomicMax) TCLANG_EMU_SCOPED(atomicInc)
TCLANG_EMU_SCOPED(atomicDec) TCLANG_EMU_SCOPED(atomicCAS) TCLANG_EMU_SCOPED(atomicAnd)
TCLANG_EMU_SCOPED(atomicOr) TCLANG_EMU_SCOPED(atomicXor)
#undef TCLANG_EMU_SCOPED

// ---------------------------------------------------------------------------------------
// Loads and stores with cache hints
// ---------------------------------------------------------------------------------------
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldcg(const T* p) { return *p; }
template <class T> inline T __ldca(const T* p) { return *p; }
template <class T> inline T __ldcs(const T* p) { return *p; }
template <class T> inline T __ldlu(const T* p) { return *p; }
template <class T> inline T __ldcv(const T* p) { return *p; }
template <class T> inline void __stcg(T* p, T v) { *p = v; }
template <class T> inline void __stcs(T* p, T v) { *p = v; }
template <class T> inline void __stwb(T* p, T v) { *p = v; }
template <class T> inline void __stwt(T* p, T v) { *p = v; }

// ---------------------------------------------------------------------------------------
// Integer intrinsics
// ---------------------------------------------------------------------------------------
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
  return __builtin_bswap32(x);
}
inline unsigned long long __brevll(unsigned long long x) {
  return ((unsigned long long)__brev((unsigned)x) << 32) | __brev((unsigned)(x >> 32));
}
inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) {
  return (unsigned)(((unsigned long long)a * b) >> 32);
}
inline long long __mul64hi(long long a, long long b) { return (long long)((__extension__(__int128)a * b) >> 64); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)((__extension__(unsigned __int128)a * b) >> 64);
}
inline int __mul24(int a, int b) { return (int)((a << 8 >> 8) * (b << 8 >> 8)); }
inline unsigned __umul24(unsigned a, unsigned b) { return (a & 0xffffffu) * (b & 0xffffffu); }
inline int __hadd(int a, int b) { return (int)(((long long)a + b) >> 1); }
inline int __rhadd(int a, int b) { return (int)(((long long)a + b + 1) >> 1); }
inline unsigned __uhadd(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a + b) >> 1); }
inline unsigned __urhadd(unsigned a, unsigned b) {
  return (unsigned)(((unsigned long long)a + b + 1) >> 1);
}
inline unsigned __sad(int a, int b, unsigned c) { return c + (unsigned)(a > b ? a - b : b - a); }
inline unsigned __usad(unsigned a, unsigned b, unsigned c) { return c + (a > b ? a - b : b - a); }
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned s) {
  s &= 31u; unsigned long long v = ((unsigned long long)hi << 32) | lo;
  return (unsigned)((v << s) >> 32);
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) {
  s &= 31u; unsigned long long v = ((unsigned long long)hi << 32) | lo;
  return (unsigned)(v >> s);
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  unsigned long long v = ((unsigned long long)y << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (((s >> (4 * i)) & 7u) * 8)) & 0xffu) << (8 * i);
  return r;
}

// CUDA's min/max overloads (crt/math_functions.hpp): integers, float (fminf), double (fmin).
#define TCLANG_EMU_MM(R, A, B)                                                               \
  inline R min(A a, B b) { return (R)a < (R)b ? (R)a : (R)b; }                               \
  inline R max(A a, B b) { return (R)a > (R)b ? (R)a : (R)b; }
TCLANG_EMU_MM(int, int, int)
TCLANG_EMU_MM(unsigned int, unsigned int, unsigned int)
TCLANG_EMU_MM(unsigned int, int, unsigned int)
TCLANG_EMU_MM(unsigned int, unsigned int, int)
TCLANG_EMU_MM(long, long, long)
TCLANG_EMU_MM(unsigned long, unsigned long, unsigned long)
TCLANG_EMU_MM(unsigned long, long, unsigned long)
TCLANG_EMU_MM(unsigned long, unsigned long, long)
TCLANG_EMU_MM(long long, long long, long long)
TCLANG_EMU_MM(unsigned long long, unsigned long long, unsigned long long)
TCLANG_EMU_MM(unsigned long long, long long, unsigned long long)
TCLANG_EMU_MM(unsigned long long, unsigned long long, long long)
#undef TCLANG_EMU_MM
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
inline double min(float a, double b) { return fmin((double)a, b); }
inline double max(float a, double b) { return fmax((double)a, b); }
inline double min(double a, float b) { return fmin(a, (double)b); }
inline double max(double a, float b) { return fmax(a, (double)b); }
inline unsigned umin(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned umax(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long llmin(long long a, long long b) { return a < b ? a : b; }
inline long long llmax(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long ullmin(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long ullmax(unsigned long long a, unsigned long long b) { return a > b ? a : b; }

// ---------------------------------------------------------------------------------------
// Device math functions the host library lacks (computed in double for float; a few ulp)
// ---------------------------------------------------------------------------------------
namespace tclang_emu { namespace math {
constexpr double kPi = 3.141592653589793238462643383279502884;
constexpr double kPiLo = 1.2246467991473532e-16;           // pi - kPi
constexpr double kTwoOverSqrtPi = 1.128379167095512573896158903121545172;
constexpr double kSqrtPi = 1.772453850905516027298167483341145183;
constexpr double kSqrt2 = 1.414213562373095048801688724209698079;
constexpr double kSqrt1_2 = 0.707106781186547524400844362104849039;

// sin(pi x) and cos(pi x): exact reduction of x modulo 2 to y in [-1/4, 1/4] and a quadrant.
inline void sincospi(double x, double* s, double* c) {
  if (!std::isfinite(x)) { *s = *c = x - x; return; }
  double r = std::fmod(x, 2.0);                 // exact, |r| < 2, sign of x
  double n = std::nearbyint(r * 2.0);           // r*2 exact
  double y = r - n * 0.5;                       // exact, |y| <= 1/4
  int q = ((int)n % 4 + 4) % 4;
  double hi = kPi * y, lo = std::fma(kPi, y, -hi) + kPiLo * y;
  double sy = std::sin(hi), cy = std::cos(hi);
  double sv = sy + lo * cy, cv = cy - lo * sy;  // sin/cos(hi + lo), lo ~ 1e-16 hi
  switch (q) {
    case 0: *s = sv; *c = cv; break;
    case 1: *s = cv; *c = -sv; break;
    case 2: *s = -sv; *c = -cv; break;
    default: *s = -cv; *c = sv; break;
  }
  if (y == 0.0) {
    if ((q & 1) == 0) { *s = std::copysign(0.0, x); *c = q == 0 ? 1.0 : -1.0; }
    else { *c = 0.0; *s = q == 1 ? 1.0 : -1.0; }
  }
}
inline double sinpi(double x) { double s, c; sincospi(x, &s, &c); return s; }
inline double cospi(double x) { double s, c; sincospi(x, &s, &c); return c; }

// e^(x*x) with x*x split exactly (hi + lo), so large x keep full precision.
inline double exp_x2(double x) {
  double hi = x * x, lo = std::fma(x, x, -hi);
  double e = std::exp(hi);
  return std::fma(e, lo, e);
}

inline double erfcx(double x) {
  if (std::isnan(x)) return x;
  if (x < -26.7) return HUGE_VAL;
  if (x < 26.0) return exp_x2(x) * std::erfc(x);
  // continued fraction erfc(x) = e^-x^2/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...))))
  double f = x;
  for (int k = 40; k >= 1; --k) f = x + (0.5 * k) / f;
  return 1.0 / (kSqrtPi * f);
}

// Giles' approximation of erfinv(t) / t from w = -log((1 - t)(1 + t)).
inline double giles(double w) {
  double p;
  if (w < 5.0) {
    w -= 2.5;
    p = 2.81022636e-08;
    p = 3.43273939e-07 + p * w; p = -3.5233877e-06 + p * w; p = -4.39150654e-06 + p * w;
    p = 0.00021858087 + p * w;  p = -0.00125372503 + p * w; p = -0.00417768164 + p * w;
    p = 0.246640727 + p * w;    p = 1.50140941 + p * w;
  } else {
    w = std::sqrt(w) - 3.0;
    p = -0.000200214257;
    p = 0.000100950558 + p * w; p = 0.00134934322 + p * w;  p = -0.00367342844 + p * w;
    p = 0.00573950773 + p * w;  p = -0.0076224613 + p * w;  p = 0.00943887047 + p * w;
    p = 1.00167406 + p * w;     p = 2.83297682 + p * w;
  }
  return p;
}

// erfinv for |y| <= 1/2: Giles' estimate, then Halley steps on erf.
inline double erfinv_small(double y) {
  if (y == 0.0) return y;
  double x = giles(-std::log1p(-y * y)) * y;
  for (int i = 0; i < 3; ++i) {
    double u = (std::erf(x) - y) / (kTwoOverSqrtPi * std::exp(-x * x));
    x -= u / (1.0 + x * u);
  }
  return x;
}

// erfcinv for y in (0, 1]: for y < 1/2 Newton steps on log(erfc(x)) = log(y), written with
// erfcx so that nothing underflows down to the smallest subnormal y.
inline double erfcinv_upper(double y) {
  if (y >= 0.5) return erfinv_small(1.0 - y);      // 1 - y exact
  double x;
  if (y > 1e-12) {
    x = giles(-std::log(y * (2.0 - y))) * (1.0 - y);
  } else {
    double t = std::sqrt(-std::log(y));
    x = t - std::log(t * kSqrtPi) / (2.0 * t);
  }
  double ly = std::log(y);
  for (int i = 0; i < 12; ++i) {
    double hi = x * x, lo = std::fma(x, x, -hi);
    double ex = erfcx(x);
    double g = ((std::log(ex) - ly) - hi) - lo;     // log(erfc(x)) - log(y)
    double dx = g * ex / kTwoOverSqrtPi;
    x += dx;
    if (std::fabs(dx) <= 1e-17 * x) break;
  }
  return x;
}

inline double erfinv(double y) {
  if (std::isnan(y)) return y;
  double ay = std::fabs(y);
  if (ay > 1.0) return NAN;
  if (ay == 1.0) return std::copysign(HUGE_VAL, y);
  if (ay <= 0.5) return erfinv_small(y);
  return std::copysign(erfcinv_upper(1.0 - ay), y);   // 1 - ay exact
}

inline double erfcinv(double y) {
  if (std::isnan(y)) return y;
  if (y < 0.0 || y > 2.0) return NAN;
  if (y == 0.0) return HUGE_VAL;
  if (y == 2.0) return -HUGE_VAL;
  if (y > 1.0) return -erfcinv_upper(2.0 - y);        // 2 - y exact
  return erfcinv_upper(y);
}

inline double normcdf(double x) { return 0.5 * std::erfc(-x * kSqrt1_2); }
inline double normcdfinv(double p) { return -kSqrt2 * erfcinv(2.0 * p); }

// Modified Bessel functions of the first kind, orders 0 and 1: power series below 30,
// Hankel's asymptotic expansion above.
inline double bessel_i(double x, int order) {
  if (std::isnan(x)) return x;
  double ax = std::fabs(x), value;
  if (ax < 30.0) {
    double half = 0.5 * ax, q = half * half;
    double term = order == 0 ? 1.0 : half, sum = term;
    for (int k = 1; k < 500; ++k) {
      term *= q / ((double)k * (k + order));
      sum += term;
      if (term < 1e-17 * sum) break;
    }
    value = sum;
  } else if (std::isinf(ax)) {
    value = HUGE_VAL;
  } else {
    double mu = 4.0 * order * order, term = 1.0, sum = 1.0;
    for (int k = 1; k < 30; ++k) {
      term *= -(mu - (2.0 * k - 1) * (2.0 * k - 1)) / (k * 8.0 * ax);
      sum += term;
      if (std::fabs(term) < 1e-17) break;
    }
    double e = std::exp(0.5 * ax);                  // e * e: no early overflow
    value = e * (e / std::sqrt(2.0 * kPi * ax) * sum);
  }
  return (order == 1 && x < 0) ? -value : value;
}

// sqrt of a sum of squares, scaled by a power of two (exact) against overflow/underflow.
inline double norm_n(int n, const double* v) {
  double m = 0.0;
  bool nan = false;
  for (int i = 0; i < n; ++i) {
    double a = std::fabs(v[i]);
    if (std::isinf(a)) return HUGE_VAL;
    if (std::isnan(a)) nan = true;
    else if (a > m) m = a;
  }
  if (nan) return NAN;
  if (m == 0.0) return 0.0;
  int e = std::ilogb(m);
  double sum = 0.0;
  for (int i = 0; i < n; ++i) {
    double t = std::scalbn(v[i], -e);
    sum = std::fma(t, t, sum);
  }
  return std::scalbn(std::sqrt(sum), e);
}
// Float inputs: squares and their sum are exact enough in double, no scaling needed.
inline float norm_nf(int n, const float* v) {
  double sum = 0.0;
  bool nan = false;
  for (int i = 0; i < n; ++i) {
    if (std::isinf(v[i])) return HUGE_VALF;
    if (std::isnan(v[i])) nan = true;
    sum += (double)v[i] * (double)v[i];
  }
  return nan ? NAN : (float)std::sqrt(sum);
}
inline float rnorm_nf(int n, const float* v) {
  double sum = 0.0;
  bool nan = false;
  for (int i = 0; i < n; ++i) {
    if (std::isinf(v[i])) return 0.0f;
    if (std::isnan(v[i])) nan = true;
    sum += (double)v[i] * (double)v[i];
  }
  return nan ? NAN : (float)(1.0 / std::sqrt(sum));
}
}}  // namespace tclang_emu::math

// sinpi/cospi (glibc >= 2.41, C23) and rsqrt (C23) may also come from <math.h>. These
// templates lose overload resolution to a non-template library declaration of the same
// signature, so they fill in only where the C library has none.
template <int = 0> inline double sinpi(double x) { return ::tclang_emu::math::sinpi(x); }
template <int = 0> inline double cospi(double x) { return ::tclang_emu::math::cospi(x); }
template <int = 0> inline float sinpif(float x) { return (float)::tclang_emu::math::sinpi(x); }
template <int = 0> inline float cospif(float x) { return (float)::tclang_emu::math::cospi(x); }
template <int = 0> inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
template <int = 0> inline float rsqrtf(float x) { return (float)(1.0 / std::sqrt((double)x)); }
template <int = 0> inline double exp10(double x) { return std::pow(10.0, x); }
template <int = 0> inline float exp10f(float x) { return (float)std::pow(10.0, (double)x); }

inline void sincospi(double x, double* s, double* c) { ::tclang_emu::math::sincospi(x, s, c); }
inline void sincospif(float x, float* s, float* c) {
  double sd, cd;
  ::tclang_emu::math::sincospi(x, &sd, &cd);
  *s = (float)sd;
  *c = (float)cd;
}
inline double rcbrt(double x) { return 1.0 / std::cbrt(x); }
inline float rcbrtf(float x) { return (float)(1.0 / std::cbrt((double)x)); }
inline double erfinv(double x) { return ::tclang_emu::math::erfinv(x); }
inline float erfinvf(float x) { return (float)::tclang_emu::math::erfinv(x); }
inline double erfcinv(double x) { return ::tclang_emu::math::erfcinv(x); }
inline float erfcinvf(float x) { return (float)::tclang_emu::math::erfcinv(x); }
inline double erfcx(double x) { return ::tclang_emu::math::erfcx(x); }
inline float erfcxf(float x) { return (float)::tclang_emu::math::erfcx(x); }
inline double normcdf(double x) { return ::tclang_emu::math::normcdf(x); }
inline float normcdff(float x) { return (float)::tclang_emu::math::normcdf(x); }
inline double normcdfinv(double x) { return ::tclang_emu::math::normcdfinv(x); }
inline float normcdfinvf(float x) { return (float)::tclang_emu::math::normcdfinv(x); }
inline double cyl_bessel_i0(double x) { return ::tclang_emu::math::bessel_i(x, 0); }
inline float cyl_bessel_i0f(float x) { return (float)::tclang_emu::math::bessel_i(x, 0); }
inline double cyl_bessel_i1(double x) { return ::tclang_emu::math::bessel_i(x, 1); }
inline float cyl_bessel_i1f(float x) { return (float)::tclang_emu::math::bessel_i(x, 1); }
inline double norm3d(double a, double b, double c) {
  double v[3] = {a, b, c};
  return ::tclang_emu::math::norm_n(3, v);
}
inline double norm4d(double a, double b, double c, double d) {
  double v[4] = {a, b, c, d};
  return ::tclang_emu::math::norm_n(4, v);
}
inline double rnorm3d(double a, double b, double c) { return 1.0 / norm3d(a, b, c); }
inline double rnorm4d(double a, double b, double c, double d) { return 1.0 / norm4d(a, b, c, d); }
inline double norm(int dim, const double* p) { return ::tclang_emu::math::norm_n(dim, p); }
inline double rnorm(int dim, const double* p) { return 1.0 / ::tclang_emu::math::norm_n(dim, p); }
inline float norm3df(float a, float b, float c) {
  float v[3] = {a, b, c};
  return ::tclang_emu::math::norm_nf(3, v);
}
inline float norm4df(float a, float b, float c, float d) {
  float v[4] = {a, b, c, d};
  return ::tclang_emu::math::norm_nf(4, v);
}
inline float rnorm3df(float a, float b, float c) {
  float v[3] = {a, b, c};
  return ::tclang_emu::math::rnorm_nf(3, v);
}
inline float rnorm4df(float a, float b, float c, float d) {
  float v[4] = {a, b, c, d};
  return ::tclang_emu::math::rnorm_nf(4, v);
}
inline float normf(int dim, const float* p) { return ::tclang_emu::math::norm_nf(dim, p); }
inline float rnormf(int dim, const float* p) { return ::tclang_emu::math::rnorm_nf(dim, p); }
inline double rhypot(double x, double y) { return 1.0 / std::hypot(x, y); }
inline float rhypotf(float x, float y) { return (float)(1.0 / std::hypot((double)x, (double)y)); }
inline double fdivide(double x, double y) { return x / y; }
inline float fdividef(float x, float y) { return x / y; }

// CUDA's float overloads of the double names above (math_functions.hpp).
inline float rsqrt(float x) { return rsqrtf(x); }
inline float rcbrt(float x) { return rcbrtf(x); }
inline float sinpi(float x) { return sinpif(x); }
inline float cospi(float x) { return cospif(x); }
inline float erfinv(float x) { return erfinvf(x); }
inline float erfcinv(float x) { return erfcinvf(x); }
inline float erfcx(float x) { return erfcxf(x); }
inline float normcdf(float x) { return normcdff(x); }
inline float normcdfinv(float x) { return normcdfinvf(x); }
inline float cyl_bessel_i0(float x) { return cyl_bessel_i0f(x); }
inline float cyl_bessel_i1(float x) { return cyl_bessel_i1f(x); }
inline float exp10(float x) { return exp10f(x); }

// ---- fast-math and correctly rounded intrinsics (exact host versions) ----
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return exp10f(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline void __sincosf(float x, float* s, float* c) { *s = sinf(x); *c = cosf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }  // NaN->0
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline float __frsqrt_rn(float a) { return rsqrtf(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
inline double __drcp_rn(double a) { return 1.0 / a; }
inline double __dsqrt_rn(double a) { return sqrt(a); }

// ---- conversions: saturating like PTX cvt; float -> 32-bit integer maps NaN to 0, the
// 64-bit and double-source conversions map NaN to the 0x80...0 pattern ----
namespace tclang_emu { namespace detail {
template <class I, class F> inline I sat(F r, I nan_value) {   // r already rounded
  if (r != r) return nan_value;
  if (r <= (F)std::numeric_limits<I>::min()) return std::numeric_limits<I>::min();
  if (r >= (F)std::numeric_limits<I>::max()) return std::numeric_limits<I>::max();
  return (I)r;
}
}}  // namespace tclang_emu::detail
#define TCLANG_EMU_CVT(NAME, F, I, NANV)                                                     \
  inline I NAME##_rn(F x) { return ::tclang_emu::detail::sat<I, F>(std::nearbyint(x), NANV); } \
  inline I NAME##_rz(F x) { return ::tclang_emu::detail::sat<I, F>(std::trunc(x), NANV); }   \
  inline I NAME##_rd(F x) { return ::tclang_emu::detail::sat<I, F>(std::floor(x), NANV); }   \
  inline I NAME##_ru(F x) { return ::tclang_emu::detail::sat<I, F>(std::ceil(x), NANV); }
TCLANG_EMU_CVT(__float2int, float, int, 0)
TCLANG_EMU_CVT(__float2uint, float, unsigned int, 0u)
TCLANG_EMU_CVT(__float2ll, float, long long, LLONG_MIN)
TCLANG_EMU_CVT(__float2ull, float, unsigned long long, 0x8000000000000000ull)
TCLANG_EMU_CVT(__double2int, double, int, INT_MIN)
TCLANG_EMU_CVT(__double2uint, double, unsigned int, 0x80000000u)
TCLANG_EMU_CVT(__double2ll, double, long long, LLONG_MIN)
TCLANG_EMU_CVT(__double2ull, double, unsigned long long, 0x8000000000000000ull)
#undef TCLANG_EMU_CVT
inline float __int2float_rn(int x) { return (float)x; }
inline float __uint2float_rn(unsigned x) { return (float)x; }
inline float __ll2float_rn(long long x) { return (float)x; }
inline float __ull2float_rn(unsigned long long x) { return (float)x; }
inline double __int2double_rn(int x) { return (double)x; }
inline double __ll2double_rn(long long x) { return (double)x; }
inline float __double2float_rn(double x) { return (float)x; }
inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline int __float_as_int(float x) { int i; std::memcpy(&i, &x, 4); return i; }
inline float __uint_as_float(unsigned x) { float f; std::memcpy(&f, &x, 4); return f; }
inline unsigned __float_as_uint(float x) { unsigned i; std::memcpy(&i, &x, 4); return i; }
inline double __longlong_as_double(long long x) { double d; std::memcpy(&d, &x, 8); return d; }
inline long long __double_as_longlong(double x) { long long i; std::memcpy(&i, &x, 8); return i; }
inline int __double2hiint(double x) { return (int)(__double_as_longlong(x) >> 32); }
inline int __double2loint(double x) { return (int)__double_as_longlong(x); }
inline double __hiloint2double(int hi, int lo) {
  return __longlong_as_double((long long)(((unsigned long long)(unsigned)hi << 32) | (unsigned)lo));
}

// math constants (math_constants.h)
#define CUDART_INF_F __int_as_float(0x7f800000)
#define CUDART_NAN_F __int_as_float(0x7fffffff)
#define CUDART_MIN_DENORM_F __int_as_float(0x00000001)
#define CUDART_MAX_NORMAL_F __int_as_float(0x7f7fffff)
#define CUDART_NEG_ZERO_F __int_as_float(0x80000000)
#define CUDART_ZERO_F 0.0f
#define CUDART_ONE_F 1.0f
#define CUDART_PI_F 3.141592654f
#define CUDART_SQRT_2PI_F 2.506628275f
#define CUDART_INF __longlong_as_double(0x7ff0000000000000LL)
#define CUDART_NAN __longlong_as_double(0xfff8000000000000LL)
#define CUDART_PI 3.1415926535897931e+0
#define CUDART_SQRT_2PI 2.5066282746310002e+0

// ---------------------------------------------------------------------------------------
// Half precision: storage type with round-to-nearest-even conversions (bit manipulation)
// ---------------------------------------------------------------------------------------
namespace tclang_emu { namespace detail {
inline unsigned short float_to_half_bits(float f) {
  unsigned x;
  std::memcpy(&x, &f, 4);
  unsigned sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return (unsigned short)(ax > 0x7f800000u ? 0x7fffu : sign | 0x7c00u);
  if (ax >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);     // >= 65520: inf
  if (ax >= 0x38800000u) {                                           // normal half
    unsigned r = ax - 0x38000000u;                                   // rebias 127 -> 15
    unsigned h = r >> 13, rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return (unsigned short)(sign | h);
  }
  if (ax <= 0x33000000u) return (unsigned short)sign;                // <= 2^-25: zero
  unsigned e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
  unsigned shift = 126u - e;                                         // 14 .. 24
  unsigned h = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (h & 1u))) ++h;
  return (unsigned short)(sign | h);
}

inline unsigned short double_to_half_bits(double d) {
  unsigned long long x;
  std::memcpy(&x, &d, 8);
  unsigned sign = (unsigned)(x >> 48) & 0x8000u;
  unsigned long long ax = x & 0x7fffffffffffffffull;
  if (ax >= 0x7ff0000000000000ull)
    return (unsigned short)(ax > 0x7ff0000000000000ull ? 0x7fffu : sign | 0x7c00u);
  if (ax >= 0x40effe0000000000ull) return (unsigned short)(sign | 0x7c00u);   // >= 65520
  if (ax >= 0x3f10000000000000ull) {                                        // >= 2^-14
    unsigned long long r = ax - 0x3f00000000000000ull;                      // 1023 -> 15
    unsigned long long h = r >> 42, rem = r & ((1ull << 42) - 1), half = 1ull << 41;
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return (unsigned short)(sign | (unsigned)h);
  }
  if (ax <= 0x3e60000000000000ull) return (unsigned short)sign;             // <= 2^-25
  unsigned e = (unsigned)(ax >> 52);
  unsigned long long m = (ax & 0xfffffffffffffull) | 0x10000000000000ull;
  unsigned shift = 1051u - e;                                               // 43 .. 53
  unsigned long long h = m >> shift, rem = m & ((1ull << shift) - 1), half = 1ull << (shift - 1);
  if (rem > half || (rem == half && (h & 1u))) ++h;
  return (unsigned short)(sign | (unsigned)h);
}

inline float half_bits_to_float(unsigned short h) {
  unsigned sign = (unsigned)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
  if (e == 0x1f) {
    x = sign | 0x7f800000u | (m << 13);
  } else if (e == 0) {
    float v = (float)m * 5.9604644775390625e-08f;   // m * 2^-24, exact
    std::memcpy(&x, &v, 4);
    x |= sign;
  } else {
    x = sign | ((e + 112u) << 23) | (m << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
}}  // namespace tclang_emu::detail

// Public types carry default visibility: extern "C" entries taking them must stay exported.
struct __attribute__((visibility("default"))) __half_raw { unsigned short x; };

struct __attribute__((visibility("default"))) __half {
  unsigned short __x;
  __half() = default;
  constexpr __half(const __half_raw& r) : __x(r.x) {}
  __half(float f) : __x(::tclang_emu::detail::float_to_half_bits(f)) {}
  __half(double d) : __x(::tclang_emu::detail::double_to_half_bits(d)) {}
  __half(short v) : __half((float)v) {}
  __half(unsigned short v) : __half((float)v) {}
  __half(int v) : __half((float)v) {}
  __half(unsigned int v) : __half((float)v) {}
  __half(long v) : __half((double)v) {}
  __half(unsigned long v) : __half((double)v) {}
  __half(long long v) : __half((double)v) {}
  __half(unsigned long long v) : __half((double)v) {}
  operator float() const { return ::tclang_emu::detail::half_bits_to_float(__x); }
  operator __half_raw() const { return __half_raw{__x}; }
  __half& operator=(const __half_raw& r) { __x = r.x; return *this; }
  __half& operator=(float f) { __x = ::tclang_emu::detail::float_to_half_bits(f); return *this; }
  __half& operator=(double d) { __x = ::tclang_emu::detail::double_to_half_bits(d); return *this; }
};
static_assert(sizeof(__half) == 2 && std::is_trivially_copyable<__half>::value, "__half layout");
typedef __half half;

inline __half __ushort_as_half(unsigned short x) { return __half(__half_raw{x}); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __short_as_half(short x) { return __ushort_as_half((unsigned short)x); }
inline short __half_as_short(__half h) { return (short)h.__x; }
inline __half __float2half(float f) { return __ushort_as_half(::tclang_emu::detail::float_to_half_bits(f)); }
inline __half __float2half_rn(float f) { return __float2half(f); }
inline __half __double2half(double d) {
  return __ushort_as_half(::tclang_emu::detail::double_to_half_bits(d));
}
inline float __half2float(__half h) { return ::tclang_emu::detail::half_bits_to_float(h.__x); }
inline __half __int2half_rn(int i) { return __float2half((float)i); }
inline int __half2int_rz(__half h) { return __float2int_rz(__half2float(h)); }
inline int __half2int_rn(__half h) { return __float2int_rn(__half2float(h)); }

inline __half __hadd(__half a, __half b) { return __float2half(__half2float(a) + __half2float(b)); }
inline __half __hsub(__half a, __half b) { return __float2half(__half2float(a) - __half2float(b)); }
inline __half __hmul(__half a, __half b) { return __float2half(__half2float(a) * __half2float(b)); }
inline __half __hdiv(__half a, __half b) { return __float2half(__half2float(a) / __half2float(b)); }
inline __half __hfma(__half a, __half b, __half c) {
  return __double2half(fma((double)__half2float(a), (double)__half2float(b), (double)__half2float(c)));
}
inline __half __hneg(__half a) { return __ushort_as_half((unsigned short)(a.__x ^ 0x8000u)); }
inline __half __habs(__half a) { return __ushort_as_half((unsigned short)(a.__x & 0x7fffu)); }
inline __half __hmax(__half a, __half b) { return __float2half(fmaxf(__half2float(a), __half2float(b))); }
inline __half __hmin(__half a, __half b) { return __float2half(fminf(__half2float(a), __half2float(b))); }
inline bool __heq(__half a, __half b) { return __half2float(a) == __half2float(b); }
inline bool __hne(__half a, __half b) {
  float x = __half2float(a), y = __half2float(b);
  return x < y || x > y;                      // ordered not-equal, as CUDA's __hne
}
inline bool __hlt(__half a, __half b) { return __half2float(a) < __half2float(b); }
inline bool __hle(__half a, __half b) { return __half2float(a) <= __half2float(b); }
inline bool __hgt(__half a, __half b) { return __half2float(a) > __half2float(b); }
inline bool __hge(__half a, __half b) { return __half2float(a) >= __half2float(b); }
inline bool __hisnan(__half a) { return (a.__x & 0x7fffu) > 0x7c00u; }
inline int __hisinf(__half a) { return (a.__x & 0x7fffu) == 0x7c00u ? (a.__x & 0x8000u ? -1 : 1) : 0; }
inline __half hsqrt(__half a) { return __float2half(sqrtf(__half2float(a))); }
inline __half hrsqrt(__half a) { return __float2half(rsqrtf(__half2float(a))); }
inline __half hrcp(__half a) { return __float2half(1.0f / __half2float(a)); }
inline __half hexp(__half a) { return __float2half(expf(__half2float(a))); }
inline __half hlog(__half a) { return __float2half(logf(__half2float(a))); }
inline __half hfloor(__half a) { return __float2half(floorf(__half2float(a))); }
inline __half hceil(__half a) { return __float2half(ceilf(__half2float(a))); }
inline __half htrunc(__half a) { return __float2half(truncf(__half2float(a))); }
inline __half operator+(const __half& a, const __half& b) { return __hadd(a, b); }
inline __half operator-(const __half& a, const __half& b) { return __hsub(a, b); }
inline __half operator*(const __half& a, const __half& b) { return __hmul(a, b); }
inline __half operator/(const __half& a, const __half& b) { return __hdiv(a, b); }
inline __half operator-(const __half& a) { return __hneg(a); }
inline __half operator+(const __half& a) { return a; }
inline __half& operator+=(__half& a, const __half& b) { return a = __hadd(a, b); }
inline __half& operator-=(__half& a, const __half& b) { return a = __hsub(a, b); }
inline __half& operator*=(__half& a, const __half& b) { return a = __hmul(a, b); }
inline __half& operator/=(__half& a, const __half& b) { return a = __hdiv(a, b); }
inline bool operator==(const __half& a, const __half& b) { return __heq(a, b); }
inline bool operator!=(const __half& a, const __half& b) { return !__heq(a, b); }
inline bool operator<(const __half& a, const __half& b) { return __hlt(a, b); }
inline bool operator<=(const __half& a, const __half& b) { return __hle(a, b); }
inline bool operator>(const __half& a, const __half& b) { return __hgt(a, b); }
inline bool operator>=(const __half& a, const __half& b) { return __hge(a, b); }

// ---------------------------------------------------------------------------------------
// bfloat16 (<cuda_bf16.h>): the upper 16 bits of a float; round-to-nearest-even conversions
// ---------------------------------------------------------------------------------------
namespace tclang_emu { namespace detail {
inline unsigned short float_to_bf16_bits(float f) {
  unsigned x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)0x7fffu;  // NaN, as the GPU
  return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
inline float bf16_bits_to_float(unsigned short h) {
  unsigned x = (unsigned)h << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
}}  // namespace tclang_emu::detail

struct __attribute__((visibility("default"))) __nv_bfloat16_raw { unsigned short x; };

struct __attribute__((visibility("default"))) __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  constexpr __nv_bfloat16(const __nv_bfloat16_raw& r) : __x(r.x) {}
  __nv_bfloat16(float f) : __x(::tclang_emu::detail::float_to_bf16_bits(f)) {}
  __nv_bfloat16(double d) : __nv_bfloat16((float)d) {}   // through float (the GPU rounds once)
  __nv_bfloat16(int v) : __nv_bfloat16((float)v) {}
  operator float() const { return ::tclang_emu::detail::bf16_bits_to_float(__x); }
  operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{__x}; }
  __nv_bfloat16& operator=(const __nv_bfloat16_raw& r) { __x = r.x; return *this; }
  __nv_bfloat16& operator=(float f) { __x = ::tclang_emu::detail::float_to_bf16_bits(f); return *this; }
};
static_assert(sizeof(__nv_bfloat16) == 2 && std::is_trivially_copyable<__nv_bfloat16>::value,
              "__nv_bfloat16 layout");
typedef __nv_bfloat16 nv_bfloat16;

inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short x) { return __nv_bfloat16(__nv_bfloat16_raw{x}); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat16 __float2bfloat16(float f) {
  return __ushort_as_bfloat16(::tclang_emu::detail::float_to_bf16_bits(f));
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return ::tclang_emu::detail::bf16_bits_to_float(h.__x); }
inline __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b) {
  return __float2bfloat16(__bfloat162float(a) + __bfloat162float(b));
}
inline __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) {
  return __float2bfloat16(__bfloat162float(a) * __bfloat162float(b));
}
inline bool __hisnan(__nv_bfloat16 a) { return (a.__x & 0x7fffu) > 0x7f80u; }

struct __attribute__((visibility("default"))) __align__(4) __half2 {
  __half x, y;
};
typedef __half2 half2;
inline __half2 __halves2half2(__half a, __half b) { __half2 r; r.x = a; r.y = b; return r; }
inline __half2 __half2half2(__half a) { return __halves2half2(a, a); }
inline __half2 __floats2half2_rn(float a, float b) {
  return __halves2half2(__float2half(a), __float2half(b));
}
inline __half2 __float2half2_rn(float a) { return __floats2half2_rn(a, a); }
inline float2 __half22float2(__half2 h) { return make_float2(__half2float(h.x), __half2float(h.y)); }
inline float __low2float(__half2 h) { return __half2float(h.x); }
inline float __high2float(__half2 h) { return __half2float(h.y); }
inline __half __low2half(__half2 h) { return h.x; }
inline __half __high2half(__half2 h) { return h.y; }

inline __half atomicAdd(__half* a, __half v) {
  return ::tclang_emu::detail::atomic_update(a, [v](__half o) { return __hadd(o, v); });
}

// ---------------------------------------------------------------------------------------
// Tensor-core fragments (nvcuda::wmma), emulated with a defined layout: every lane of a warp
// holds the whole tile, row-major, so loads, stores and products are the tile's own
// arithmetic (float32 sums of exact half or bfloat16 products, k in order). The generated code never
// reads a fragment's elements, only loads, multiplies and stores whole ones, so the
// layout a GPU uses (each lane a part) is not observable. Every lane stores the same
// values; the code reads a stored tile after __syncwarp, as on the GPU.
// ---------------------------------------------------------------------------------------
namespace nvcuda { namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static constexpr int rows = std::is_same<Use, matrix_b>::value ? K : M;
  static constexpr int cols = std::is_same<Use, matrix_a>::value ? K : N;
  static constexpr int num_elements = rows * cols;
  T x[rows * cols];
};
template <class Use, int M, int N, int K, class T, class Layout, class V>
inline void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, const V& v) {
  for (int e = 0; e < f.num_elements; ++e) f.x[e] = T(v);
}
template <class Use, int M, int N, int K, class T>
inline void load_matrix_sync(fragment<Use, M, N, K, T, row_major>& f, const T* p, unsigned ldm) {
  for (int r = 0; r < f.rows; ++r)
    for (int c = 0; c < f.cols; ++c) f.x[r * f.cols + c] = p[(size_t)r * ldm + c];
  __syncwarp();
}
template <class Use, int M, int N, int K, class T>
inline void load_matrix_sync(fragment<Use, M, N, K, T, col_major>& f, const T* p, unsigned ldm) {
  for (int r = 0; r < f.rows; ++r)
    for (int c = 0; c < f.cols; ++c) f.x[r * f.cols + c] = p[(size_t)c * ldm + r];
  __syncwarp();
}
template <int M, int N, int K, class T>
inline void store_matrix_sync(T* p, const fragment<accumulator, M, N, K, T, void>& f,
                              unsigned ldm, layout_t layout) {
  __syncwarp();
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) {
      const size_t at = layout == mem_row_major ? (size_t)r * ldm + c : (size_t)c * ldm + r;
      p[at] = f.x[r * N + c];
    }
}
template <int M, int N, int K, class TA, class LA, class LB, class TC>
inline void mma_sync(fragment<accumulator, M, N, K, TC, void>& d,
                     const fragment<matrix_a, M, N, K, TA, LA>& a,
                     const fragment<matrix_b, M, N, K, TA, LB>& b,
                     const fragment<accumulator, M, N, K, TC, void>& c) {
  TC out[M * N];
  for (int r = 0; r < M; ++r)
    for (int q = 0; q < N; ++q) {
      TC sum = c.x[r * N + q];
      for (int k = 0; k < K; ++k)
        sum += (TC)(float)a.x[r * K + k] * (TC)(float)b.x[k * N + q];
      out[r * N + q] = sum;
    }
  for (int e = 0; e < M * N; ++e) d.x[e] = out[e];
}
}}  // namespace nvcuda::wmma

#pragma GCC visibility pop

// ---------------------------------------------------------------------------------------
// C interface for the host side (Python's ctypes)
// ---------------------------------------------------------------------------------------
// The message of the calling OS thread's last launch ("" when it succeeded).
extern "C" __attribute__((visibility("default"), used)) inline const char*
tclang_emu_last_error(void) {
  return ::tclang_emu::detail::t_last_error;
}
// Its code: 0 or TCLANG_EMU_ERR_*.
extern "C" __attribute__((visibility("default"), used)) inline int
tclang_emu_last_error_code(void) {
  return ::tclang_emu::detail::t_last_code;
}

#endif  // TCLANG_CUDA_EMULATION_H
