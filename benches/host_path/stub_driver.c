/* A CUDA driver that does nothing, for timing cubridge's host path on a machine without a GPU
 * (benches/host_path/run.py): every call succeeds at once, device memory is host memory from
 * posix_memalign, and kernels never run. It reports one device of compute capability 9.0, so a
 * wheel that ships sm_90 kernels loads them without NVRTC. Only what cubridge's add path calls
 * is here; cubridge's loader (cudarc) resolves each symbol when first called.
 *
 *   cc -O2 -shared -fPIC -o DIR/libcuda.so.1 benches/host_path/stub_driver.c
 *   ln -sf libcuda.so.1 DIR/libcuda.so
 *   LD_LIBRARY_PATH=DIR python benches/host_path/run.py
 *
 * Every entry point counts its calls (stub_reset, stub_count): run.py --driver-calls prints them
 * per add.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef void *Handle;

static __thread Handle current;

/* Calls per entry point, named by its __func__ (one address per function); the releaser's and
 * the free queue's threads call in too, hence the atomics. */
#define SLOTS 64
static struct { const char *name; unsigned long calls; } counts[SLOTS];
#define HIT hit(__func__)
static void hit(const char *name) {
    for (int i = 0; i < SLOTS; i++) {
        const char *seen = NULL;
        if (__atomic_compare_exchange_n(&counts[i].name, &seen, name, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST) || seen == name) {
            __atomic_fetch_add(&counts[i].calls, 1, __ATOMIC_RELAXED);
            return;
        }
    }
}
void stub_reset(void) {
    for (int i = 0; i < SLOTS; i++) __atomic_store_n(&counts[i].calls, 0, __ATOMIC_RELAXED);
}
/* The name of entry point i (NULL past the last one seen) and its calls since stub_reset. */
const char *stub_count(int i, unsigned long *calls) {
    if (i < 0 || i >= SLOTS) return NULL;
    *calls = __atomic_load_n(&counts[i].calls, __ATOMIC_RELAXED);
    return __atomic_load_n(&counts[i].name, __ATOMIC_SEQ_CST);
}
static char context[64], pool[64], module[64], function[64];

static void *grab(size_t n) {
    void *p = NULL;
    return posix_memalign(&p, 256, n ? n : 1) ? NULL : p;
}

CUresult cuInit(unsigned flags) { HIT; return 0; }
/* NVRTC 13 asks the driver for its private tables; without one it works alone. */
CUresult cuGetExportTable(const void **table, const void *id) { HIT; *table = NULL; return 801; }
CUresult cuDriverGetVersion(int *v) { HIT; *v = 13000; return 0; }
CUresult cuDeviceGetCount(int *n) { HIT; *n = 1; return 0; }
CUresult cuDeviceGet(int *d, int ordinal) { HIT; *d = ordinal; return 0; }
CUresult cuDeviceGetAttribute(int *v, int attribute, int d) {
    HIT;
    switch (attribute) {
    case 75: *v = 9; break;            /* compute capability major */
    case 76: *v = 0; break;            /* minor */
    case 16: *v = 132; break;          /* multiprocessors */
    case 1: case 2: *v = 1024; break;  /* threads per block, block x */
    case 5: *v = 2147483647; break;    /* grid x */
    case 6: case 7: *v = 65535; break; /* grid y, z */
    case 8: *v = 49152; break;         /* shared memory per block */
    case 97: *v = 232448; break;       /* opt-in shared memory per block */
    default: *v = 1;
    }
    return 0;
}
CUresult cuDevicePrimaryCtxRetain(Handle *c, int d) { HIT; *c = context; return 0; }
CUresult cuCtxGetCurrent(Handle *c) { HIT; *c = current; return 0; }
CUresult cuCtxSetCurrent(Handle c) { HIT; current = c; return 0; }
CUresult cuCtxGetDevice(int *d) { HIT; *d = 0; return 0; }
CUresult cuCtxSynchronize(void) { HIT; return 0; }
CUresult cuDeviceGetMemPool(Handle *p, int d) { HIT; *p = pool; return 0; }
CUresult cuMemPoolSetAttribute(Handle p, int a, void *v) { HIT; return 0; }
CUresult cuMemPoolGetAttribute(Handle p, int a, void *v) { HIT; *(uint64_t *)v = 0; return 0; }
CUresult cuMemPoolTrimTo(Handle p, size_t keep) { HIT; return 0; }
CUresult cuMemAllocFromPoolAsync(uint64_t *d, size_t n, Handle p, Handle s) {
    HIT;
    *d = (uint64_t)grab(n);
    return 0;
}
CUresult cuMemAlloc_v2(uint64_t *d, size_t n) { HIT; *d = (uint64_t)grab(n); return 0; }
CUresult cuMemFreeAsync(uint64_t d, Handle s) { HIT; free((void *)d); return 0; }
CUresult cuMemFree_v2(uint64_t d) { HIT; free((void *)d); return 0; }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { HIT; *f = (size_t)70 << 30; *t = (size_t)80 << 30; return 0; }
CUresult cuMemsetD8Async(uint64_t d, unsigned char v, size_t n, Handle s) {
    HIT;
    memset((void *)d, v, n);
    return 0;
}
CUresult cuMemsetD32Async(uint64_t d, unsigned v, size_t n, Handle s) {
    HIT;
    for (size_t i = 0; i < n; i++) ((uint32_t *)d)[i] = v;
    return 0;
}
CUresult cuMemcpyAsync(uint64_t d, uint64_t s, size_t n, Handle st) {
    HIT;
    memcpy((void *)d, (void *)s, n);
    return 0;
}
CUresult cuPointerGetAttribute(void *data, int attribute, uint64_t p) {
    HIT;
    if (attribute == 2) *(unsigned *)data = 2; /* memory type: device */
    else if (attribute == 1) *(Handle *)data = context;
    else *(uint64_t *)data = p;
    return 0;
}
CUresult cuStreamCreate(Handle *s, unsigned flags) { HIT; *s = grab(16); return 0; }
CUresult cuStreamDestroy_v2(Handle s) { HIT; free(s); return 0; }
CUresult cuStreamSynchronize(Handle s) { HIT; return 0; }
CUresult cuStreamIsCapturing(Handle s, int *status) { HIT; *status = 0; return 0; }
CUresult cuStreamWaitEvent(Handle s, Handle e, unsigned flags) { HIT; return 0; }
CUresult cuThreadExchangeStreamCaptureMode(int *mode) { HIT; return 0; }
CUresult cuEventCreate(Handle *e, unsigned flags) { HIT; *e = grab(16); return 0; }
CUresult cuEventDestroy_v2(Handle e) { HIT; free(e); return 0; }
CUresult cuEventRecord(Handle e, Handle s) { HIT; return 0; }
CUresult cuEventQuery(Handle e) { HIT; return 0; }
CUresult cuEventSynchronize(Handle e) { HIT; return 0; }
CUresult cuModuleLoadData(Handle *m, const void *image) { HIT; *m = module; return 0; }
CUresult cuModuleGetFunction(Handle *f, Handle m, const char *name) { HIT; *f = function; return 0; }
CUresult cuFuncSetAttribute(Handle f, int a, int v) { HIT; return 0; }
CUresult cuLaunchKernel(Handle f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, Handle s, void **params,
                        void **extra) {
    HIT;
    return 0;
}
CUresult cuGetErrorName(int e, const char **s) { HIT; *s = "CUDA_ERROR_STUB"; return 0; }
CUresult cuGetErrorString(int e, const char **s) { HIT; *s = "stub driver"; return 0; }
