/*
 * cuda_emu.cpp - the CPU emulator behind cuda_runtime.h and cublas_v2.h (read their heads for
 * what it models).  One host thread at a time may launch (a mutex orders launches).
 *
 * Threads of a block are coroutines: each has its own stack from one mapping, and a switch
 * saves the callee-saved registers on the running stack and loads the other's (x86-64: a few
 * instructions below; elsewhere ucontext).  The scheduler resumes every runnable thread once a
 * pass; a thread runs until it waits at a barrier or ends.  After a pass it releases, first, each
 * warp whose live lanes all wait at the same warp barrier (a shuffle or __syncwarp), else the
 * block when every live thread waits at __syncthreads; if neither can move, the kernel is
 * stuck and the program stops saying who waits where.  Under AddressSanitizer every switch is
 * announced to it (__sanitizer_start_switch_fiber / _finish_switch_fiber).
 *
 * Built with MK_CUDA_EMU_NO_CUBLAS=1: no cuBLAS (and no BLAS to link).  Built with
 * MK_CUDA_EMU_FOREIGN_MEMORY=1 (a module beside another copy of the emulator, such as
 * libmanta_nccl.so beside libmanta_cuda.so, each with its own copy): device memory may come
 * from the other copy, so a pointer this copy did not allocate passes as device memory where
 * the copy expects one (only its own allocations are checked for bounds).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <vector>

#if !MK_CUDA_EMU_NO_CUBLAS
#include <cblas.h>
#endif

#include "cublas_v2.h"
#include "cuda_runtime.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace mk_emu
{
uint3 thread_idx, block_idx;
dim3 block_dim, grid_dim;
} // namespace mk_emu

namespace
{

/* ---- errors and device memory ---------------------------------------------------------- */

cudaError_t last_error = cudaSuccess;
std::mutex mu;
std::map<uintptr_t, size_t> allocs; /* start -> bytes */

cudaError_t fail(cudaError_t e)
{
    if (last_error == cudaSuccess) last_error = e;
    return e;
}

__attribute__((format(printf, 1, 2))) [[noreturn]] void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cuda emulator: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

/* is [p, p + n) inside one allocation? */
bool device_range(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    auto it = allocs.upper_bound(a);
    if (it == allocs.begin()) return false;
    --it;
    return a >= it->first && a - it->first <= it->second && n <= it->second - (a - it->first);
}

#if MK_CUDA_EMU_FOREIGN_MEMORY
/* where device memory is expected: inside one of ours, or not ours at all (the other copy's) */
bool device_side(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    auto it = allocs.upper_bound(a);
    if (it == allocs.begin()) return true;
    --it;
    if (a - it->first >= std::max<size_t>(it->second, 1)) return true;
    return device_range(p, n);
}
#else
bool device_side(const void *p, size_t n)
{
    return device_range(p, n);
}
#endif

/* ---- coroutines ------------------------------------------------------------------------ */

enum state { RUN, AT_BLOCK, AT_WARP, DONE };

struct thread {
    void *sp;   /* saved stack pointer while suspended */
    void *fake; /* AddressSanitizer's fake stack while suspended */
    state st;
    int stack;    /* which stack of the pool; -1 until first resumed */
    unsigned seq; /* warp barriers passed */
    int kind, arg, width;
    uint64_t val[2]; /* this lane's shuffle operand, by the parity of seq */
#if !defined(__x86_64__)
    ucontext_t uc;
#endif
};

const size_t STACK = (size_t)256 << 10; /* per thread; only the pages touched are backed */
const int MAX_THREADS = 1024;
char *stacks;
std::vector<thread> th(MAX_THREADS);
int cur = -1, nthreads;
void *main_sp;
#if EMU_ASAN
void *main_fake;
const void *main_bottom;
size_t main_size;
#endif
void (*body)(const void *);
const void *body_arg;
const char *kname;
std::vector<unsigned char> dyn_smem;
size_t dyn_bytes;
std::map<const void *, int> max_dyn; /* cudaFuncSetAttribute */
int order_mode = -1;                 /* 0 fifo, 1 lifo, 2 random, 3 mixed */
std::mt19937_64 rng;

#if defined(__x86_64__)
extern "C" void mk_emu_switch(void **save_sp, void *to_sp);
__asm__(".text\n"
        ".p2align 4\n"
        ".globl mk_emu_switch\n"
        ".type mk_emu_switch,@function\n"
        "mk_emu_switch:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  subq $8, %rsp\n"
        "  stmxcsr (%rsp)\n"
        "  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n"
        "  fldcw 4(%rsp)\n"
        "  addq $8, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size mk_emu_switch, .-mk_emu_switch\n");
#else
ucontext_t main_uc;
#endif

using mk_emu::block_dim;
using mk_emu::block_idx;
using mk_emu::grid_dim;

/* Stacks are handed out when a thread first runs and taken back when it ends, newest first:
 * a kernel without barriers runs every thread on the same, cache-warm stack. */
std::vector<int> free_stacks;

char *stack_of(int t)
{
    return stacks + (size_t)th[t].stack * STACK;
}

/* from thread cur to the scheduler; `dying`: the thread has ended and never resumes */
void to_main(bool dying)
{
    thread &me = th[cur];
#if EMU_ASAN
    __sanitizer_start_switch_fiber(dying ? NULL : &me.fake, main_bottom, main_size);
#endif
#if defined(__x86_64__)
    static void *dead_sp;
    mk_emu_switch(dying ? &dead_sp : &me.sp, main_sp);
#else
    swapcontext(&me.uc, &main_uc);
#endif
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(me.fake, &main_bottom, &main_size);
#endif
}

void entry(void)
{
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(NULL, &main_bottom, &main_size);
#endif
    body(body_arg);
    th[cur].st = DONE;
    to_main(true);
    abort(); /* not reached: a finished thread is never resumed */
}

/* the first resumption of thread t: a stack, and a frame on it that enters entry() */
void start_thread(int t)
{
    thread &x = th[t];
    x.stack = free_stacks.back();
    free_stacks.pop_back();
    char *base = stack_of(t);
#if EMU_ASAN
    /* the frames a finished thread left suspended keep their redzones: clear the top */
    __asan_unpoison_memory_region(base + STACK - 16384, 16384);
#endif
#if defined(__x86_64__)
    uint64_t *sp = (uint64_t *)(base + STACK);
    *--sp = 0;                       /* entry's return address: alignment as after a call */
    *--sp = (uint64_t)(void *)entry; /* where mk_emu_switch's ret lands */
    for (int i = 0; i < 6; i++) *--sp = 0;
    *--sp = (uint64_t)0x037f << 32 | 0x1f80; /* default x87 control word and MXCSR */
    x.sp = sp;
#else
    getcontext(&x.uc);
    x.uc.uc_stack.ss_sp = base;
    x.uc.uc_stack.ss_size = STACK;
    x.uc.uc_link = NULL;
    makecontext(&x.uc, entry, 0);
#endif
}

void resume(int t)
{
    if (th[t].stack < 0) start_thread(t);
    cur = t;
    unsigned bx = block_dim.x, by = block_dim.y;
    mk_emu::thread_idx = uint3{(unsigned)t % bx, (unsigned)t / bx % by, (unsigned)t / (bx * by)};
#if EMU_ASAN
    __sanitizer_start_switch_fiber(&main_fake, stack_of(t), STACK);
#endif
#if defined(__x86_64__)
    mk_emu_switch(&main_sp, th[t].sp);
#else
    swapcontext(&main_uc, &th[t].uc);
#endif
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(main_fake, NULL, NULL);
#endif
    cur = -1;
}

const char *where(int t)
{
    static char buf[256];
    snprintf(buf, sizeof buf, "%s, block (%u,%u,%u), thread %d", kname, block_idx.x, block_idx.y,
             block_idx.z, t);
    return buf;
}

void stuck(void)
{
    fprintf(stderr, "cuda emulator: %s: no thread can go on:\n", where(0));
    for (int t = 0; t < nthreads; t++)
        if (th[t].st != DONE)
            fprintf(stderr, "  thread %d (warp %d) waits at %s %u\n", t, t / 32,
                    th[t].st == AT_BLOCK ? "__syncthreads" : "warp barrier", th[t].seq);
    abort();
}

/* the blocks' order: as numbered (fifo), backwards (lifo), shuffled (random, mixed) */
void block_order(std::vector<int> &v)
{
    if (order_mode == 1)
        std::reverse(v.begin(), v.end());
    else if (order_mode >= 2)
        std::shuffle(v.begin(), v.end(), rng);
}

/* per warp: live lanes, lanes waiting at a warp barrier, and which barrier (its count) */
std::vector<int> warp_live(MAX_THREADS / 32), warp_wait(MAX_THREADS / 32);
std::vector<unsigned> warp_seq(MAX_THREADS / 32);

/* lane t arrived at a warp barrier (arrived) or ended: releases its warp when every live lane
 * waits at the same warp barrier */
void warp_event(int t, bool arrived, std::deque<int> &ready)
{
    int w = t / 32;
    if (arrived) {
        if (warp_wait[w] && th[t].seq != warp_seq[w])
            die("%s: lanes of warp %d wait at different warp barriers (%u and %u)", where(t), w,
                warp_seq[w], th[t].seq);
        warp_seq[w] = th[t].seq;
        warp_wait[w]++;
    } else {
        warp_live[w]--;
    }
    if (!warp_wait[w] || warp_wait[w] != warp_live[w]) return;
    for (int u = w * 32, hi = std::min(nthreads, u + 32); u < hi; u++)
        if (th[u].st == AT_WARP) th[u].st = RUN, ready.push_back(u);
    warp_wait[w] = 0;
}

/* Runs the block's threads to their ends.  Which runnable thread goes next: the oldest (fifo),
 * the newest (lifo: a released warp runs on at once, ahead of the rest), or any (random); in
 * mode mixed, each block draws one of the three.  A barrier opens as soon as its last thread
 * arrives. */
void run_block(void)
{
    std::deque<int> ready;
    for (int t = 0; t < nthreads; t++) {
        thread &x = th[t];
        x.st = RUN, x.seq = 0, x.fake = NULL, x.stack = -1;
        ready.push_back(t);
    }
    for (int w = 0; w * 32 < nthreads; w++)
        warp_live[w] = std::min(32, nthreads - w * 32), warp_wait[w] = 0;
    int mode = order_mode == 3 ? (int)(rng() % 3) : order_mode;
    if (mode == 2) std::shuffle(ready.begin(), ready.end(), rng);
    int live = nthreads, at_block = 0;
    while (live > 0) {
        if (ready.empty()) stuck();
        int t;
        if (mode == 0) {
            t = ready.front();
            ready.pop_front();
        } else {
            if (mode == 2) std::swap(ready[rng() % ready.size()], ready.back());
            t = ready.back();
            ready.pop_back();
        }
        resume(t);
        if (th[t].st == DONE) free_stacks.push_back(th[t].stack);
        if (th[t].st == AT_WARP) {
            warp_event(t, true, ready);
            continue;
        }
        if (th[t].st == AT_BLOCK)
            at_block++;
        else if (th[t].st == DONE)
            live--, warp_event(t, false, ready);
        if (live > 0 && at_block == live) {
            for (int u = 0; u < nthreads; u++)
                if (th[u].st == AT_BLOCK) th[u].st = RUN, ready.push_back(u);
            at_block = 0;
        }
    }
}

void init_once(void)
{
    if (stacks) return;
    void *m = mmap(NULL, STACK * MAX_THREADS, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (m == MAP_FAILED) die("cannot map the threads' stacks (%s)", strerror(errno));
    stacks = (char *)m;
    for (int i = MAX_THREADS - 1; i >= 0; i--) free_stacks.push_back(i);
    const char *o = getenv("MANTA_CUDA_EMU_ORDER"), *s = getenv("MANTA_CUDA_EMU_SEED");
    order_mode = !o || !strcmp(o, "mixed") ? 3
                 : !strcmp(o, "fifo")      ? 0
                 : !strcmp(o, "lifo")      ? 1
                 : !strcmp(o, "random")    ? 2
                                           : -1;
    if (order_mode < 0) die("MANTA_CUDA_EMU_ORDER='%s': expected mixed, fifo, lifo or random", o);
    rng.seed(s ? strtoull(s, NULL, 10) : 1);
    fprintf(stderr, "cuda emulator: the CUDA kernels run on the CPU (schedule %s, seed %s)\n",
            order_mode == 0   ? "fifo"
            : order_mode == 1 ? "lifo"
            : order_mode == 2 ? "random"
                              : "mixed",
            s ? s : "1");
}

} /* namespace */

/* ---- inside a kernel ------------------------------------------------------------------- */

namespace mk_emu
{

void sync_block(void)
{
    if (cur < 0) die("__syncthreads outside a kernel");
    th[cur].st = AT_BLOCK;
    to_main(false);
}

uint64_t exchange(uint64_t bits, int kind, int arg, int width)
{
    if (cur < 0) die("a warp operation outside a kernel");
    if (width < 1 || width > 32 || (width & (width - 1)))
        die("%s: shuffle width %d is not a power of two up to 32", where(cur), width);
    int me = cur;
    thread &x = th[me];
    unsigned seq = x.seq, p = seq & 1;
    x.val[p] = bits, x.kind = kind, x.arg = arg, x.width = width;
    x.st = AT_WARP;
    to_main(false);
    x.seq = seq + 1;
    if (kind == SHFL_NONE) return 0;
    int lane = me & 31, seg = lane & ~(width - 1), src;
    switch (kind) {
    case SHFL_XOR:
        src = lane ^ arg;
        if ((src & ~(width - 1)) > seg) src = lane;
        break;
    case SHFL_DOWN:
        src = lane + arg;
        if (src >= seg + width) src = lane;
        break;
    case SHFL_UP:
        src = lane - arg;
        if (src < seg) src = lane;
        break;
    default:
        src = seg + (arg & (width - 1));
        break;
    }
    int from = (me & ~31) + src;
    /* the source lane was released with this one: it has passed seq barriers and not yet
     * resumed, or resumed (seq + 1), perhaps to its end */
    bool ok = from < nthreads &&
              (th[from].st == DONE ? th[from].seq == seq + 1 : th[from].seq - seq <= 1);
    if (!ok)
        die("%s: a shuffle reads lane %d, which did not take part in warp barrier %u", where(me),
            from & 31, seq);
    return th[from].val[p];
}

void *dynamic_smem(void)
{
    if (cur < 0) die("dynamic shared memory outside a kernel");
    return dyn_bytes ? dyn_smem.data() : NULL;
}

cudaError_t set_max_dynamic_smem(const void *kernel, int bytes)
{
    std::lock_guard<std::mutex> g(mu);
    if (bytes < 0 || bytes > 232448) return fail(cudaErrorInvalidValue);
    max_dyn[kernel] = bytes;
    return cudaSuccess;
}

} /* namespace mk_emu */

namespace
{
/* one recorded operation: run(arg), arg owned (free_) */
struct op {
    void (*run)(const void *);
    void *arg;
    void (*free_)(void *);
};
struct launch_rec {
    const char *name;
    const void *kernel;
    dim3 grid, block;
    size_t smem;
    void (*run)(const void *);
    void *closure;
    void (*free_closure)(void *);
};
} /* namespace */
struct op_list {
    std::vector<op> ops;
    ~op_list()
    {
        for (op &o : ops) o.free_(o.arg);
    }
};
/* a graph and its instances share the recorded operations */
struct mk_emu_graph {
    std::shared_ptr<op_list> list;
};
namespace
{
mk_emu_graph *capture; /* the graph being captured, or NULL */
bool capture_broken;   /* a copy or a synchronisation happened during it */
long graph_launches;
void launch_now(const char *name, const void *kernel, dim3 grid, dim3 block, size_t smem,
                void (*run)(const void *), const void *closure);
} /* namespace */

namespace mk_emu
{

bool capturing(void)
{
    return capture != NULL;
}

void record(void (*run)(const void *), const void *closure, void *(*copy)(const void *),
            void (*free_)(void *))
{
    capture->list->ops.push_back(op{run, copy(closure), free_});
}

void launch(const char *name, const void *kernel, dim3 grid, dim3 block, size_t smem,
            void (*run)(const void *), const void *closure, void *(*copy)(const void *),
            void (*free_)(void *))
{
    if (!capture) {
        launch_now(name, kernel, grid, block, smem, run, closure);
        return;
    }
    launch_rec *r = new launch_rec{name, kernel, grid, block, smem, run, copy(closure), free_};
    capture->list->ops.push_back(op{[](const void *p) {
                                        const launch_rec *l = (const launch_rec *)p;
                                        launch_now(l->name, l->kernel, l->grid, l->block, l->smem,
                                                   l->run, l->closure);
                                    },
                                    r,
                                    [](void *p) {
                                        launch_rec *l = (launch_rec *)p;
                                        l->free_closure(l->closure);
                                        delete l;
                                    }});
}

} /* namespace mk_emu */

namespace
{
void launch_now(const char *name, const void *kernel, dim3 grid, dim3 block, size_t smem,
                void (*run)(const void *), const void *closure)
{
    std::lock_guard<std::mutex> g(mu);
    init_once();
    size_t nt = (size_t)block.x * block.y * block.z;
    auto lim = max_dyn.find(kernel);
    size_t smem_max = lim == max_dyn.end() ? 49152 : (size_t)lim->second;
    if (!grid.x || !grid.y || !grid.z || !nt || nt > (size_t)MAX_THREADS || block.z > 64 ||
        grid.y > 65535 || grid.z > 65535 || grid.x > 2147483647u) {
        fprintf(stderr, "cuda emulator: %s: grid (%u,%u,%u) of blocks (%u,%u,%u): invalid\n", name,
                grid.x, grid.y, grid.z, block.x, block.y, block.z);
        fail(cudaErrorInvalidConfiguration);
        return;
    }
    if (smem > smem_max) {
        fprintf(stderr,
                "cuda emulator: %s: %zu bytes of dynamic shared memory, above the %zu allowed\n",
                name, smem, smem_max);
        fail(cudaErrorInvalidValue);
        return;
    }
    kname = name, body = run, body_arg = closure, nthreads = (int)nt;
    block_dim = block, grid_dim = grid;
    dyn_bytes = smem;
    if (dyn_smem.size() < smem + 16) dyn_smem.resize(smem + 16);
    std::vector<size_t> blocks_(0);
    size_t nb = (size_t)grid.x * grid.y * grid.z;
    std::vector<int> ord;
    /* grids beyond 2^31 blocks are not emulated in a shuffled order (none is launched) */
    ord.resize(nb);
    for (size_t b = 0; b < nb; b++) ord[b] = (int)b;
    block_order(ord);
    for (int b : ord) {
        block_idx = uint3{(unsigned)b % grid.x, (unsigned)b / grid.x % grid.y,
                          (unsigned)b / (grid.x * grid.y)};
        if (smem) memset(dyn_smem.data(), 0xff, smem);
        run_block();
    }
    kname = NULL;
}

} /* namespace */

/* ---- the runtime API ------------------------------------------------------------------- */

/* ---- IPC mode (cuda_runtime_api.h): allocations other processes can map ---------------- */

namespace
{
struct ipc_alloc {
    int fd;     /* the memfd (exported allocations) or -1 (a mapping of another process's) */
    size_t len; /* bytes mapped */
};
std::map<uintptr_t, ipc_alloc> ipc_maps; /* start -> mapping, under mu; a subset of allocs */
long ipc_opens;                          /* cudaIpcOpenMemHandle calls that mapped, under mu */

const char IPC_MAGIC[8] = {'M', 'K', 'E', 'M', 'U', 'I', 'P', 'C'};
struct ipc_handle {
    char magic[8];
    int32_t pid, fd;
    uint64_t bytes, ino;
    char device[32]; /* the exporter's device: CUDA_VISIBLE_DEVICES's first name ("" for all) */
};
static_assert(sizeof(ipc_handle) <= sizeof(cudaIpcMemHandle_t), "an IPC handle is 64 bytes");

/* The device this process's allocations are on, as the machine names it: the first name in
 * CUDA_VISIBLE_DEVICES (the node agent's choice), "" when the variable is unset (every device
 * visible: device 0, whose name the emulator does not know). */
void own_device(char *out, size_t cap)
{
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    size_t n = v ? strcspn(v, ",") : 0;
    if (n >= cap) n = cap - 1;
    memcpy(out, v ? v : "", n);
    out[n] = 0;
}

/* Does this process see the device named dev ("": an exporter that saw every device)? A
 * process maps only memory of devices it sees (CUDA_VISIBLE_DEVICES hides the others). */
bool sees_device(const char *dev)
{
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (!v || !dev[0]) return true;
    size_t n = strlen(dev);
    for (const char *q = v; *q;) {
        size_t k = strcspn(q, ",");
        if (k == n && !memcmp(q, dev, n)) return true;
        q += k + (q[k] == ',');
    }
    return false;
}

/* MK_CUDA_EMU_P2P: 1 (the default) every pair of devices has peer access, 0 none has; read once */
bool peer_access(void)
{
    static bool on = [] {
        const char *e = getenv("MK_CUDA_EMU_P2P");
        if (!e || !*e || !strcmp(e, "1")) return true;
        if (strcmp(e, "0")) die("MK_CUDA_EMU_P2P='%s': expected 0 or 1", e);
        return false;
    }();
    return on;
}

/* MK_CUDA_EMU_IPC=1, read once; turning it on raises the open-file limit for the descriptors */
bool ipc_mode(void)
{
    static bool on = [] {
        const char *e = getenv("MK_CUDA_EMU_IPC");
        if (!e || !*e || !strcmp(e, "0")) return false;
        if (strcmp(e, "1")) die("MK_CUDA_EMU_IPC='%s': expected 0 or 1", e);
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
            rl.rlim_cur = rl.rlim_max;
            (void)setrlimit(RLIMIT_NOFILE, &rl);
        }
        return true;
    }();
    return on;
}

/* An allocation's mapping: its bytes and at least a page more, which AddressSanitizer is told
 * not to touch (it does not track mappings), so that overruns show as with posix_memalign's. */
size_t map_len(size_t bytes)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (bytes + pg - 1) / pg * pg + pg;
}

void *map_in(int fd, size_t bytes)
{
    void *m = mmap(NULL, map_len(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
#if EMU_ASAN
    if (m != MAP_FAILED) ASAN_POISON_MEMORY_REGION((char *)m + bytes, map_len(bytes) - bytes);
#endif
    return m;
}

void map_out(void *m, size_t len)
{
#if EMU_ASAN
    ASAN_UNPOISON_MEMORY_REGION(m, len); /* the shadow outlives the mapping */
#endif
    munmap(m, len);
}

/* an allocation of `bytes` in a memfd, mapped shared; NULL (errno set) if it cannot be made */
void *ipc_alloc_new(size_t bytes)
{
    size_t len = map_len(bytes);
    int fd = memfd_create("mk_cuda_emu", MFD_CLOEXEC);
    if (fd < 0) return NULL;
    void *m = MAP_FAILED;
    if (ftruncate(fd, (off_t)len) == 0) m = map_in(fd, bytes);
    if (m == MAP_FAILED) {
        int e = errno;
        close(fd);
        errno = e;
        return NULL;
    }
    ipc_maps[(uintptr_t)m] = ipc_alloc{fd, len};
    return m;
}
} /* namespace */

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    std::lock_guard<std::mutex> g(mu);
    if (!p) return fail(cudaErrorInvalidValue);
    void *m = NULL;
    if (ipc_mode()) {
        m = ipc_alloc_new(bytes);
        if (!m) {
            fprintf(stderr, "cuda emulator: cudaMalloc(%zu) in IPC mode: %s\n", bytes,
                    strerror(errno));
            *p = NULL;
            return fail(cudaErrorMemoryAllocation);
        }
    } else if (posix_memalign(&m, 256, bytes ? bytes : 1) != 0) {
        *p = NULL;
        return fail(cudaErrorMemoryAllocation);
    }
    memset(m, 0xa5, bytes); /* cudaMalloc does not clear */
    allocs[(uintptr_t)m] = bytes;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    std::lock_guard<std::mutex> g(mu);
    if (!p) return cudaSuccess;
    auto it = allocs.find((uintptr_t)p);
    if (it == allocs.end()) return fail(cudaErrorInvalidDevicePointer);
    auto im = ipc_maps.find((uintptr_t)p);
    if (im != ipc_maps.end() && im->second.fd < 0)
        return fail(cudaErrorInvalidValue); /* another process's: cudaIpcCloseMemHandle */
    allocs.erase(it);
    if (im != ipc_maps.end()) {
        map_out(p, im->second.len);
        close(im->second.fd);
        ipc_maps.erase(im);
    } else {
        free(p);
    }
    return cudaSuccess;
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *p)
{
    std::lock_guard<std::mutex> g(mu);
    if (!handle) return fail(cudaErrorInvalidValue);
    if (!ipc_mode()) {
        static bool said = false;
        if (!said)
            fprintf(stderr, "cuda emulator: cudaIpcGetMemHandle: device memory is private to the "
                            "process; set MK_CUDA_EMU_IPC=1 to allocate memory other processes "
                            "can map\n");
        said = true;
        return fail(cudaErrorInvalidValue);
    }
    auto im = ipc_maps.find((uintptr_t)p);
    if (im == ipc_maps.end() || im->second.fd < 0) return fail(cudaErrorInvalidValue);
    struct stat st;
    if (fstat(im->second.fd, &st) != 0) return fail(cudaErrorInvalidValue);
    ipc_handle h = {};
    memcpy(h.magic, IPC_MAGIC, sizeof h.magic);
    h.pid = (int32_t)getpid();
    h.fd = im->second.fd;
    h.bytes = allocs[(uintptr_t)p];
    h.ino = (uint64_t)st.st_ino;
    own_device(h.device, sizeof h.device);
    memset(handle, 0, sizeof *handle);
    memcpy(handle, &h, sizeof h);
    return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t handle, unsigned int flags)
{
    std::lock_guard<std::mutex> g(mu);
    if (!p) return fail(cudaErrorInvalidValue);
    *p = NULL;
    ipc_handle h;
    memcpy(&h, &handle, sizeof h);
    if (memcmp(h.magic, IPC_MAGIC, sizeof h.magic) != 0 || h.pid <= 0 || h.fd < 0 ||
        (flags & ~(unsigned)cudaIpcMemLazyEnablePeerAccess))
        return fail(cudaErrorInvalidValue);
    if (h.pid == (int32_t)getpid()) return fail(cudaErrorDeviceUninitialized); /* as CUDA */
    h.device[sizeof h.device - 1] = 0;
    if (!sees_device(h.device)) return fail(cudaErrorInvalidDevice);
    if (!peer_access()) {
        char mine[sizeof h.device];
        own_device(mine, sizeof mine);
        if (strcmp(mine, h.device)) return fail(cudaErrorPeerAccessUnsupported);
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)h.pid, (int)h.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return fail(cudaErrorInvalidValue); /* the exporter is gone, or its fd */
    struct stat st;
    size_t len = map_len(h.bytes);
    void *m = MAP_FAILED;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_ino == h.ino && (size_t)st.st_size >= len)
        m = map_in(fd, (size_t)h.bytes);
    close(fd); /* the mapping keeps the file */
    if (m == MAP_FAILED) return fail(cudaErrorInvalidValue);
    allocs[(uintptr_t)m] = (size_t)h.bytes;
    ipc_maps[(uintptr_t)m] = ipc_alloc{-1, len};
    ipc_opens++;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void *p)
{
    std::lock_guard<std::mutex> g(mu);
    auto im = ipc_maps.find((uintptr_t)p);
    if (im == ipc_maps.end() || im->second.fd >= 0) return fail(cudaErrorInvalidValue);
    map_out(p, im->second.len);
    ipc_maps.erase(im);
    allocs.erase((uintptr_t)p);
    return cudaSuccess;
}

/* tests/kernels/test_cuda.c: how many handles this process opened so far, and how many of its
 * mappings of other processes' memory are open now */
extern "C" void mk_emu_ipc_counts(long *opened, long *mapped)
{
    std::lock_guard<std::mutex> g(mu);
    long n = 0;
    for (const auto &kv : ipc_maps) n += kv.second.fd < 0;
    *opened = ipc_opens, *mapped = n;
}

/* a synchronous call during a capture: the capture is broken (cudaStreamEndCapture says so) */
static bool in_capture(void)
{
    if (!capture) return false;
    capture_broken = true;
    fail(cudaErrorStreamCaptureUnsupported);
    return true;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    std::lock_guard<std::mutex> g(mu);
    if (in_capture()) return cudaErrorStreamCaptureUnsupported;
    bool dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind == cudaMemcpyDefault) dd = device_range(dst, bytes), sd = device_range(src, bytes);
    if ((dd && !device_side(dst, bytes)) || (sd && !device_side(src, bytes)) ||
        (!dd && device_range(dst, 1)) || (!sd && device_range(src, 1)))
        return fail(cudaErrorInvalidValue);
    if (bytes) memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t bytes)
{
    std::lock_guard<std::mutex> g(mu);
    if (in_capture()) return cudaErrorStreamCaptureUnsupported;
    if (!device_side(p, bytes)) return fail(cudaErrorInvalidValue);
    memset(p, value, bytes);
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
    std::lock_guard<std::mutex> g(mu);
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    std::lock_guard<std::mutex> g(mu);
    return last_error;
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return "no error";
    case cudaErrorInvalidValue:
        return "invalid argument";
    case cudaErrorMemoryAllocation:
        return "out of memory";
    case cudaErrorInvalidConfiguration:
        return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer:
        return "invalid device pointer";
    case cudaErrorNoDevice:
        return "no CUDA-capable device is detected";
    case cudaErrorDeviceUninitialized:
        return "invalid device context";
    case cudaErrorPeerAccessUnsupported:
        return "peer access is not supported between these two devices";
    case cudaErrorStreamCaptureUnsupported:
        return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
        return "operation failed due to a previous error during capture";
    case cudaErrorInvalidDevice:
        return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
        return "invalid resource handle";
    case cudaErrorNotReady:
        return "device not ready";
    }
    return "unknown error";
}

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return "cudaSuccess";
    case cudaErrorInvalidValue:
        return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
        return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
        return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer:
        return "cudaErrorInvalidDevicePointer";
    case cudaErrorNoDevice:
        return "cudaErrorNoDevice";
    case cudaErrorDeviceUninitialized:
        return "cudaErrorDeviceUninitialized";
    case cudaErrorPeerAccessUnsupported:
        return "cudaErrorPeerAccessUnsupported";
    case cudaErrorInvalidDevice:
        return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
        return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
        return "cudaErrorNotReady";
    case cudaErrorStreamCaptureUnsupported:
        return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated:
        return "cudaErrorStreamCaptureInvalidated";
    }
    return "cudaErrorUnknown";
}

/* MK_CUDA_EMU_DEVICES devices (default 1), read once */
static int device_count(void)
{
    static int n = [] {
        const char *e = getenv("MK_CUDA_EMU_DEVICES");
        if (!e || !*e) return 1;
        char *end;
        long v = strtol(e, &end, 10);
        if (*end || v < 0 || v > 64) die("MK_CUDA_EMU_DEVICES='%s': expected 0 to 64", e);
        return (int)v;
    }();
    return n;
}

static thread_local int current_device;

cudaError_t cudaGetDeviceCount(int *n)
{
    if (!n) return fail(cudaErrorInvalidValue);
    *n = device_count();
    return device_count() ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device)
{
    if (device_count() == 0) return fail(cudaErrorNoDevice);
    if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    if (!device) return fail(cudaErrorInvalidValue);
    if (device_count() == 0) return fail(cudaErrorNoDevice);
    *device = current_device;
    return cudaSuccess;
}

/* ---- host memory, streams -------------------------------------------------------------- */

static std::set<void *> host_allocs; /* cudaMallocHost, under mu */

cudaError_t cudaMallocHost(void **p, size_t bytes)
{
    std::lock_guard<std::mutex> g(mu);
    if (!p) return fail(cudaErrorInvalidValue);
    void *m = NULL;
    if (posix_memalign(&m, 4096, bytes ? bytes : 1) != 0) {
        *p = NULL;
        return fail(cudaErrorMemoryAllocation);
    }
    host_allocs.insert(m);
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
    std::lock_guard<std::mutex> g(mu);
    if (!p) return cudaSuccess;
    if (!host_allocs.erase(p)) return fail(cudaErrorInvalidValue);
    free(p);
    return cudaSuccess;
}

/* work pending on a stream: operations another emulator queued (stream_hold) and not yet
 * finished (stream_release) */
struct CUstream_st {
    std::mutex m;
    std::condition_variable cv;
    long pending = 0;
};

namespace
{
std::mutex streams_mu;
std::set<CUstream_st *> streams; /* made by cudaStreamCreate*, not destroyed */
CUstream_st builtin_stream;      /* 0, cudaStreamLegacy, cudaStreamPerThread */

CUstream_st *stream_of(cudaStream_t s)
{
    if (s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread) return &builtin_stream;
    std::lock_guard<std::mutex> g(streams_mu);
    return streams.count(s) ? s : NULL;
}

void stream_idle(CUstream_st *st)
{
    std::unique_lock<std::mutex> g(st->m);
    st->cv.wait(g, [st] { return st->pending == 0; });
}
} // namespace

namespace mk_emu
{
bool stream_hold(cudaStream_t s)
{
    CUstream_st *st = stream_of(s);
    if (!st) return false;
    std::lock_guard<std::mutex> g(st->m);
    st->pending++;
    return true;
}

void stream_release(cudaStream_t s)
{
    CUstream_st *st = stream_of(s);
    if (!st) die("stream_release: %p is not a stream", (void *)s);
    std::lock_guard<std::mutex> g(st->m);
    if (st->pending <= 0) die("stream_release: nothing pending on stream %p", (void *)s);
    if (--st->pending == 0) st->cv.notify_all();
}
} // namespace mk_emu

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    if (!s || (flags & ~1u)) return fail(cudaErrorInvalidValue);
    CUstream_st *st = new CUstream_st;
    std::lock_guard<std::mutex> g(streams_mu);
    streams.insert(st);
    *s = st;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}

/* as CUDA: the stream goes once its pending work is done (here: waits for it) */
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    CUstream_st *st = stream_of(s);
    if (!st || st == &builtin_stream) return fail(cudaErrorInvalidResourceHandle);
    stream_idle(st);
    {
        std::lock_guard<std::mutex> g(streams_mu);
        streams.erase(st);
    }
    delete st;
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s)
{
    CUstream_st *st = stream_of(s);
    if (!st) return fail(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::mutex> g(st->m);
    return st->pending ? cudaErrorNotReady : cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s)
{
    CUstream_st *st = stream_of(s);
    if (!st) return fail(cudaErrorInvalidResourceHandle);
    stream_idle(st); /* after the work queued before it */
    return cudaMemcpy(dst, src, bytes, kind);
}

/* waits for the shared default stream only, not for streams made by cudaStreamCreate* */
cudaError_t cudaDeviceSynchronize(void)
{
    {
        std::lock_guard<std::mutex> g(mu);
        if (in_capture()) return cudaErrorStreamCaptureUnsupported;
    }
    stream_idle(&builtin_stream);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    {
        std::lock_guard<std::mutex> g(mu);
        if (in_capture()) return cudaErrorStreamCaptureUnsupported;
    }
    CUstream_st *st = stream_of(s);
    if (!st) return fail(cudaErrorInvalidResourceHandle);
    stream_idle(st);
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode)
{
    std::lock_guard<std::mutex> g(mu);
    if (s != cudaStreamPerThread || capture) return fail(cudaErrorInvalidValue); /* not legacy */
    capture = new mk_emu_graph{std::make_shared<op_list>()};
    capture_broken = false;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
    std::lock_guard<std::mutex> g(mu);
    if (!capture || s != cudaStreamPerThread) return fail(cudaErrorInvalidValue);
    mk_emu_graph *c = capture;
    capture = NULL;
    if (capture_broken) {
        delete c;
        *graph = NULL;
        return fail(cudaErrorStreamCaptureInvalidated);
    }
    *graph = c;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags)
{
    if (!graph || !exec) return cudaErrorInvalidValue;
    *exec = new mk_emu_graph{graph->list};
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s)
{
    if (!exec || capture) return cudaErrorInvalidValue;
    for (const op &o : exec->list->ops) o.run(o.arg);
    graph_launches++;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    delete graph;
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    delete exec;
    return cudaSuccess;
}

/* graphs launched so far (tests/kernels/test_cuda.c checks that decoding replays them) */
extern "C" long mk_emu_graph_launches(void)
{
    return graph_launches;
}

/* ---- cuBLAS ---------------------------------------------------------------------------- */
#if !MK_CUDA_EMU_NO_CUBLAS

struct cublasContext {
    int unused;
};

cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    *handle = new cublasContext{0};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t s)
{
    return handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *workspace, size_t bytes)
{
    return handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle)
{
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS:
        return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

float mk_emu::round_bits(float x, int drop)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return x;
    u += ((1u << (drop - 1)) - 1) + (u >> drop & 1);
    u &= ~((1u << drop) - 1);
    memcpy(&x, &u, 4);
    return x;
}

namespace
{

/* cuBLAS's argument checks; A is op(A) [m,k] stored column-major with lda, and so on */
bool gemm_args(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, int lda, int ldb,
               int ldc)
{
    if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T))
        return false;
    if (m < 0 || n < 0 || k < 0) return false;
    if (lda < std::max(1, ta == CUBLAS_OP_N ? m : k)) return false;
    if (ldb < std::max(1, tb == CUBLAS_OP_N ? k : n)) return false;
    return ldc >= std::max(1, m);
}

/* a stored operand (ld x cols, column-major) as floats, rounded as the compute type reads it */
std::vector<float> operand(const void *p, cudaDataType t, int ld, int cols, cublasComputeType_t c)
{
    size_t n = (size_t)ld * (size_t)std::max(cols, 0);
    std::vector<float> out(n);
    if (t == CUDA_R_16BF) {
        const uint16_t *b = (const uint16_t *)p;
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)b[i] << 16;
            memcpy(&out[i], &u, 4);
        }
        return out;
    }
    memcpy(out.data(), p, n * sizeof(float));
    if (c == CUBLAS_COMPUTE_32F_FAST_16BF)
        for (float &x : out) x = mk_emu::round_bits(x, 16);
    else if (c == CUBLAS_COMPUTE_32F_FAST_TF32)
        for (float &x : out) x = mk_emu::round_bits(x, 13);
    return out;
}

} /* namespace */

namespace
{
/* a product's arguments, kept by value while a capture records it (alpha and beta are read
 * when the call is made, as cuBLAS reads host scalars) */
struct gemm_call {
    cublasOperation_t ta, tb;
    int m, n, k, lda, ldb, ldc;
    float alpha, beta;
    const void *A, *B;
    cudaDataType type;
    float *C;
    cublasComputeType_t compute;
};

void gemm_run(const void *p)
{
    const gemm_call *g = (const gemm_call *)p;
    if (g->m == 0 || g->n == 0) return;
    CBLAS_TRANSPOSE ta = g->ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
    CBLAS_TRANSPOSE tb = g->tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
    if (g->type == CUDA_R_32F && g->compute == CUBLAS_COMPUTE_32F) {
        cblas_sgemm(CblasColMajor, ta, tb, g->m, g->n, g->k, g->alpha, (const float *)g->A, g->lda,
                    (const float *)g->B, g->ldb, g->beta, g->C, g->ldc);
        return;
    }
    std::vector<float> a =
        operand(g->A, g->type, g->lda, g->ta == CUBLAS_OP_N ? g->k : g->m, g->compute);
    std::vector<float> b =
        operand(g->B, g->type, g->ldb, g->tb == CUBLAS_OP_N ? g->n : g->k, g->compute);
    cblas_sgemm(CblasColMajor, ta, tb, g->m, g->n, g->k, g->alpha, a.data(), g->lda, b.data(),
                g->ldb, g->beta, g->C, g->ldc);
}

cublasStatus_t gemm_call_or_record(const gemm_call &c)
{
    if (mk_emu::capturing())
        mk_emu::record(
            gemm_run, &c,
            [](const void *p) -> void * { return new gemm_call(*(const gemm_call *)p); },
            [](void *p) { delete (gemm_call *)p; });
    else
        gemm_run(&c);
    return CUBLAS_STATUS_SUCCESS;
}
} /* namespace */

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const float *A, int lda,
                           const float *B, int ldb, const float *beta, float *C, int ldc)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!gemm_args(ta, tb, m, n, k, lda, ldb, ldc)) return CUBLAS_STATUS_INVALID_VALUE;
    return gemm_call_or_record(gemm_call{ta, tb, m, n, k, lda, ldb, ldc, *alpha, *beta, A, B,
                                         CUDA_R_32F, C, CUBLAS_COMPUTE_32F});
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb,
                            int m, int n, int k, const void *alpha, const void *A,
                            cudaDataType Atype, int lda, const void *B, cudaDataType Btype, int ldb,
                            const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!gemm_args(ta, tb, m, n, k, lda, ldb, ldc)) return CUBLAS_STATUS_INVALID_VALUE;
    if ((Atype != CUDA_R_32F && Atype != CUDA_R_16BF) || Btype != Atype || Ctype != CUDA_R_32F ||
        (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_16BF &&
         compute != CUBLAS_COMPUTE_32F_FAST_TF32) ||
        algo != CUBLAS_GEMM_DEFAULT)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return gemm_call_or_record(gemm_call{ta, tb, m, n, k, lda, ldb, ldc, *(const float *)alpha,
                                         *(const float *)beta, A, B, Atype, (float *)C, compute});
}
#endif /* !MK_CUDA_EMU_NO_CUBLAS */
