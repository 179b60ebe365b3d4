// The engine's worker threads.
//
// A parallel section of a kernel used to be launched from Python: a task per range
// submitted to a thread pool, each a ctypes call.  Waking a pool thread, handing it the
// GIL and collecting its future cost 50-120 us a section on this machine's 2 vCPUs,
// against 2-5 ms MobileNetV2 depthwise calls.  Here the caller hands the whole list of
// tasks (each an engine entry point and its arguments) to cg_run_tasks in one call,
// with the GIL released; the workers are native threads that need no GIL, spin for a
// while after a section (the next one of the same call usually follows within
// microseconds) and then sleep on a condition variable; a caller about to start a
// section may wake them ahead of it (cg_pool_wake).
//
// Tasks are taken in order from one atomic counter by whichever thread is free; every
// task writes results of its own, so which thread runs it changes nothing (the
// callers keep the fixed cuts and orders that make results deterministic).  One
// section runs at a time: a caller that finds the workers busy (another Python thread
// in a parallel section) runs its tasks alone.  A forked child starts without workers.

#include <pthread.h>
#if defined(__linux__)
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "simd.h"

CG_ISA_OF(pool)

extern "C" {

// One call of an engine entry point: fn(arg[0], ..., arg[nargs - 1]) and, for a
// section with scratch, the running thread's scratch pointer as one more argument.
// Pointer arguments travel as int64 (as ctypes passes them): every entry point takes
// only pointers and 64-bit integers, which the x86-64 and AArch64 calling conventions
// pass alike.
struct CgTask {
    void* fn;
    int64_t nargs;
    int64_t arg[4];
};

// Run tasks [0, n) on the calling thread and up to threads - 1 workers; with scratch,
// the thread numbered t (the caller is 0) passes scratch + t * scratch_bytes.
void cg_run_tasks(const CgTask* tasks, int64_t n, int64_t threads, char* scratch,
                  int64_t scratch_bytes);

// Ask up to threads - 1 sleeping workers to wake and spin (for at most WAKE_SPIN) for a
// section the caller is about to start: after a pause of the process a sleeping worker
// took 50-110 us to join a section (a futex wake of an idle vCPU), the first section of
// a call ran that long on the caller alone.  A bound call wakes them before its own
// Python (0.2-0.4 ms after a pause) runs.  Nothing when no worker has started.
void cg_pool_wake(int64_t threads);

// Workers started so far (tests).
int64_t cg_pool_workers(void);
// Worker i's thread id (Linux TID, 0 until it has started running) and the caller's
// CPU the workers were last kept off (-1: none) (tests).
int64_t cg_pool_worker_tid(int64_t i);
int64_t cg_pool_kept_off_cpu(void);

// A task for the tests: counts[i] += 1 after about `spin` pause instructions, and the
// scratch pointer it was given in where[i].
void cg_pool_probe(int64_t* counts, int64_t i, int64_t spin, int64_t* where, char* scratch);

// The last section's figures: [0] ns from its start until the first worker took part
// (-1: none did), [1] tasks the workers ran, [2] tasks in all.
void cg_pool_last(int64_t* out);

// Worker 0's record of cg_pool_wake (tests: its run time depends on the scheduler, this
// does not): [0] wake requests that woke it, [1] ns from the last of them until it went
// back to sleep (-1: not yet) -- at least WAKE_SPIN, whether it spun that long or, given
// a CPU only later, found its time up.
void cg_pool_wake_record(int64_t* out);

}  // extern "C"

namespace {

constexpr int64_t MAX_WORKERS = 63;
// how long a worker spins for the next section before it sleeps
constexpr auto SPIN = std::chrono::microseconds(300);
// how long a worker woken by cg_pool_wake spins for the section
constexpr auto WAKE_SPIN = std::chrono::microseconds(1000);

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

void call(const CgTask& t, char* scratch, bool with_scratch) {
    int64_t a[5] = {0, 0, 0, 0, 0};
    int k = 0;
    for (; k < t.nargs && k < 4; k++) a[k] = t.arg[k];
    if (with_scratch) a[k++] = (int64_t)scratch;
    typedef void (*F1)(int64_t);
    typedef void (*F2)(int64_t, int64_t);
    typedef void (*F3)(int64_t, int64_t, int64_t);
    typedef void (*F4)(int64_t, int64_t, int64_t, int64_t);
    typedef void (*F5)(int64_t, int64_t, int64_t, int64_t, int64_t);
    switch (k) {
        case 0: ((void (*)())t.fn)(); break;
        case 1: ((F1)t.fn)(a[0]); break;
        case 2: ((F2)t.fn)(a[0], a[1]); break;
        case 3: ((F3)t.fn)(a[0], a[1], a[2]); break;
        case 4: ((F4)t.fn)(a[0], a[1], a[2], a[3]); break;
        default: ((F5)t.fn)(a[0], a[1], a[2], a[3], a[4]); break;
    }
}

struct Pool {
    std::mutex section;                  // one section at a time
    std::mutex m;                        // with cv: sleeping workers
    std::condition_variable cv;
    // sections started (times 256) plus the number of workers the last one asks for:
    // one word, so that a worker reads a section and its party size together
    std::atomic<uint64_t> state{0};
    std::atomic<int64_t> next{0};        // the next task to take
    std::atomic<int64_t> pending{0};     // workers of this section not done yet
    const CgTask* tasks = nullptr;
    int64_t n = 0, scratch_bytes = 0;
    char* scratch = nullptr;
    int64_t started = 0;
    pthread_t handles[MAX_WORKERS];
    std::atomic<int64_t> tids[MAX_WORKERS] = {};
    int last_cpu = -1;                   // the caller's CPU the workers keep off,
    int64_t kept_off = 0;                // for this many of them
    std::chrono::steady_clock::time_point t0;
    std::atomic<int64_t> first_ns{-1}, by_workers{0};
    // cg_pool_wake's calls so far, the workers the last one asked for and until when
    // (all under m)
    uint64_t wakes = 0;
    int64_t wake_helpers = 0;
    std::chrono::steady_clock::time_point wake_until{};
    // worker 0's record (cg_pool_wake_record; under m)
    uint64_t woken_for = 0;
    int64_t woken = 0, slept_after_ns = -1;

    int64_t take(int64_t tid) {
        char* s = scratch ? scratch + tid * scratch_bytes : nullptr;
        int64_t k = 0;
        for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n; k++)
            call(tasks[i], s, scratch != nullptr);
        return k;
    }

    // (seen: the last section started before this worker; it takes part from the next)
    void worker(int64_t index, uint64_t seen) {
#if defined(__linux__)
        tids[index].store((int64_t)syscall(SYS_gettid));
#endif
        bool spin = false;     // only after taking part (the others sleep at once)
        for (;;) {
            uint64_t s;
            auto spin_until = std::chrono::steady_clock::now() + (spin ? SPIN : std::chrono::microseconds(0));
            int k = 0;
            while (((s = state.load(std::memory_order_acquire)) >> 8) == seen) {
                relax();
                if (++k % 64 == 0 && std::chrono::steady_clock::now() > spin_until) {
                    std::unique_lock<std::mutex> lk(m);
                    // asked to spin by cg_pool_wake: until its time is up
                    if (index < wake_helpers && wake_until > std::chrono::steady_clock::now()) {
                        spin_until = wake_until;
                        continue;
                    }
                    if (index == 0 && woken_for == wakes && wakes > 0 && slept_after_ns < 0)
                        slept_after_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now() - (wake_until - WAKE_SPIN)).count();
                    const uint64_t w0 = wakes;
                    cv.wait(lk, [&] {
                        return (state.load(std::memory_order_acquire) >> 8) != seen ||
                               wakes != w0;
                    });
                    if (index == 0 && wakes != w0) {
                        woken_for = wakes;
                        woken++;
                        slept_after_ns = -1;
                    }
                }
            }
            seen = s >> 8;
            spin = index < (int64_t)(s & 255);
            if (spin) {
                int64_t none = -1;
                first_ns.compare_exchange_strong(
                    none, std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::steady_clock::now() - t0).count());
                by_workers.fetch_add(take(index + 1), std::memory_order_relaxed);
                pending.fetch_sub(1, std::memory_order_acq_rel);
            }
        }
    }

    void wake(int64_t threads) {
        const int64_t helpers = std::min<int64_t>(threads - 1, MAX_WORKERS);
        // (a section running: its workers are awake; else kept off the caller's CPU
        // first, as a section would, so that their spinning never takes turns with it)
        std::unique_lock<std::mutex> busy(section, std::try_to_lock);
        if (helpers <= 0 || !busy.owns_lock()) return;
        keep_off_caller(helpers);
        {
            std::lock_guard<std::mutex> lk(m);
            wake_helpers = helpers;
            wake_until = std::chrono::steady_clock::now() + WAKE_SPIN;
            wakes++;
        }
        cv.notify_all();
    }

    // The workers may run on the CPUs the caller may, but not on the one it runs on now
    // (set again when the caller has moved).  Woken after a pause, a worker was often
    // placed on the caller's own vCPU and the two took turns in 5 ms slices while the
    // other vCPU idled, for most of a call (traced on ResNet-50 res4's weight gradient:
    // 12-13 ms against 7).  Engine debug bit 262144 leaves the placement to the system.
    void keep_off_caller(int64_t helpers) {
#if !defined(__linux__)
        (void)helpers;      // (CPU masks: Linux only)
#else
        const bool off = !(cg_engine_dbg & 262144);
        const int cpu = off ? sched_getcpu() : -1;
        const int64_t n = std::min<int64_t>(helpers, started);
        if (off ? cpu < 0 || (cpu == last_cpu && n <= kept_off) : kept_off == 0) return;
        cpu_set_t allowed;
        if (pthread_getaffinity_np(pthread_self(), sizeof allowed, &allowed) != 0) return;
        if (!off) {         // (A/B: back to the caller's CPUs)
            for (int64_t i = 0; i < kept_off; i++)
                pthread_setaffinity_np(handles[i], sizeof allowed, &allowed);
            last_cpu = -1, kept_off = 0;
            return;
        }
        if (cpu < CPU_SETSIZE) CPU_CLR(cpu, &allowed);
        if (CPU_COUNT(&allowed) == 0) return;
        for (int64_t i = 0; i < n; i++)
            pthread_setaffinity_np(handles[i], sizeof allowed, &allowed);
        last_cpu = cpu, kept_off = n;
#endif
    }

    // Start workers up to `workers`; the number running (fewer if the system refuses
    // a thread: the section then runs on those it has).
    int64_t grow(int64_t workers) {
        while (started < workers) {
            const int64_t index = started;
            const uint64_t seen = state.load(std::memory_order_relaxed) >> 8;
            try {
                std::thread th([this, index, seen] { worker(index, seen); });
                handles[index] = th.native_handle();
                th.detach();
            } catch (...) {
                break;
            }
            started++;
        }
        return std::min(workers, started);
    }

    void run(const CgTask* t, int64_t count, int64_t threads, char* s, int64_t sb) {
        std::unique_lock<std::mutex> busy(section, std::try_to_lock);
        int64_t helpers = std::min<int64_t>({threads - 1, count - 1, MAX_WORKERS});
        if (busy.owns_lock() && helpers > 0) helpers = grow(helpers);
        if (!busy.owns_lock() || helpers <= 0) {
            char* own = s;           // (scratch of thread 0: this caller's own)
            for (int64_t i = 0; i < count; i++) call(t[i], own, s != nullptr);
            return;
        }
        keep_off_caller(helpers);
        tasks = t, n = count, scratch = s, scratch_bytes = sb;
        t0 = std::chrono::steady_clock::now();
        first_ns.store(-1, std::memory_order_relaxed);
        by_workers.store(0, std::memory_order_relaxed);
        next.store(0, std::memory_order_relaxed);
        pending.store(helpers, std::memory_order_relaxed);
        {
            std::lock_guard<std::mutex> lk(m);
            const uint64_t g = (state.load(std::memory_order_relaxed) >> 8) + 1;
            state.store(g << 8 | (uint64_t)helpers, std::memory_order_release);
        }
        cv.notify_all();
        take(0);
        for (int k = 0; pending.load(std::memory_order_acquire) > 0; k++) {
            relax();
            if (k > 4096) std::this_thread::yield();
        }
    }
};

std::atomic<Pool*> pool_{nullptr};
std::mutex pool_made;

void forget_pool() { pool_.store(nullptr); }   // in a forked child: the workers are gone

Pool* the_pool() {
    Pool* p = pool_.load(std::memory_order_acquire);
    if (p != nullptr) return p;
    std::lock_guard<std::mutex> lk(pool_made);
    static bool registered = false;
    if (!registered) pthread_atfork(nullptr, nullptr, forget_pool), registered = true;
    p = pool_.load(std::memory_order_acquire);
    if (p == nullptr) {
        p = new Pool();   // never destroyed: its detached workers use it to the end
        pool_.store(p, std::memory_order_release);
    }
    return p;
}

}  // namespace

void cg_run_tasks(const CgTask* tasks, int64_t n, int64_t threads, char* scratch,
                  int64_t scratch_bytes) {
    if (n <= 0) return;
    the_pool()->run(tasks, n, threads, scratch, scratch_bytes);
}

void cg_pool_wake(int64_t threads) {
    Pool* p = pool_.load(std::memory_order_acquire);
    if (p != nullptr && !(cg_engine_dbg & 268435456)) p->wake(threads);   // (A/B: off)
}

void cg_pool_last(int64_t* out) {
    Pool* p = pool_.load();
    out[0] = p ? p->first_ns.load() : -1;
    out[1] = p ? p->by_workers.load() : 0;
    out[2] = p ? p->n : 0;
}

void cg_pool_wake_record(int64_t* out) {
    Pool* p = pool_.load();
    if (p == nullptr) {
        out[0] = 0, out[1] = -1;
        return;
    }
    std::lock_guard<std::mutex> lk(p->m);
    out[0] = p->woken, out[1] = p->slept_after_ns;
}

int64_t cg_pool_worker_tid(int64_t i) {
    Pool* p = pool_.load();
    return p && i >= 0 && i < p->started ? p->tids[i].load() : 0;
}

int64_t cg_pool_kept_off_cpu(void) {
    Pool* p = pool_.load();
    return p ? p->last_cpu : -1;
}

int64_t cg_pool_workers(void) {
    Pool* p = pool_.load();
    return p ? p->started : 0;
}

void cg_pool_probe(int64_t* counts, int64_t i, int64_t spin, int64_t* where, char* scratch) {
    for (int64_t k = 0; k < spin; k++) relax();
    counts[i] += 1;
    where[i] = (int64_t)scratch;
}
