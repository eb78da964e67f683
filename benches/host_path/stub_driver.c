/* A CUDA driver that does nothing, for timing cubridge's host path on a machine without a GPU
 * (benches/host_path/run.py): every call succeeds at once, device memory is host memory from
 * posix_memalign, and kernels never run. It reports one device of compute capability 9.0, so a
 * wheel that ships sm_90 kernels loads them without NVRTC. Only what cubridge's add path calls
 * is here; cubridge's loader (cudarc) resolves each symbol when first called.
 *
 *   cc -O2 -shared -fPIC -o DIR/libcuda.so.1 benches/host_path/stub_driver.c
 *   ln -sf libcuda.so.1 DIR/libcuda.so
 *   LD_LIBRARY_PATH=DIR python benches/host_path/run.py
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef void *Handle;

static __thread Handle current;
static char context[64], pool[64], module[64], function[64];

static void *grab(size_t n) {
    void *p = NULL;
    return posix_memalign(&p, 256, n ? n : 1) ? NULL : p;
}

CUresult cuInit(unsigned flags) { return 0; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
CUresult cuDeviceGet(int *d, int ordinal) { *d = ordinal; return 0; }
CUresult cuDeviceGetAttribute(int *v, int attribute, int d) {
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
CUresult cuDevicePrimaryCtxRetain(Handle *c, int d) { *c = context; return 0; }
CUresult cuCtxGetCurrent(Handle *c) { *c = current; return 0; }
CUresult cuCtxSetCurrent(Handle c) { current = c; return 0; }
CUresult cuCtxGetDevice(int *d) { *d = 0; return 0; }
CUresult cuCtxSynchronize(void) { return 0; }
CUresult cuDeviceGetMemPool(Handle *p, int d) { *p = pool; return 0; }
CUresult cuMemPoolSetAttribute(Handle p, int a, void *v) { return 0; }
CUresult cuMemPoolGetAttribute(Handle p, int a, void *v) { *(uint64_t *)v = 0; return 0; }
CUresult cuMemPoolTrimTo(Handle p, size_t keep) { return 0; }
CUresult cuMemAllocFromPoolAsync(uint64_t *d, size_t n, Handle p, Handle s) {
    *d = (uint64_t)grab(n);
    return 0;
}
CUresult cuMemAlloc_v2(uint64_t *d, size_t n) { *d = (uint64_t)grab(n); return 0; }
CUresult cuMemFreeAsync(uint64_t d, Handle s) { free((void *)d); return 0; }
CUresult cuMemFree_v2(uint64_t d) { free((void *)d); return 0; }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { *f = (size_t)70 << 30; *t = (size_t)80 << 30; return 0; }
CUresult cuMemsetD8Async(uint64_t d, unsigned char v, size_t n, Handle s) {
    memset((void *)d, v, n);
    return 0;
}
CUresult cuMemsetD32Async(uint64_t d, unsigned v, size_t n, Handle s) {
    for (size_t i = 0; i < n; i++) ((uint32_t *)d)[i] = v;
    return 0;
}
CUresult cuMemcpyAsync(uint64_t d, uint64_t s, size_t n, Handle st) {
    memcpy((void *)d, (void *)s, n);
    return 0;
}
CUresult cuPointerGetAttribute(void *data, int attribute, uint64_t p) {
    if (attribute == 2) *(unsigned *)data = 2; /* memory type: device */
    else if (attribute == 1) *(Handle *)data = context;
    else *(uint64_t *)data = p;
    return 0;
}
CUresult cuStreamCreate(Handle *s, unsigned flags) { *s = grab(16); return 0; }
CUresult cuStreamDestroy_v2(Handle s) { free(s); return 0; }
CUresult cuStreamSynchronize(Handle s) { return 0; }
CUresult cuStreamIsCapturing(Handle s, int *status) { *status = 0; return 0; }
CUresult cuStreamWaitEvent(Handle s, Handle e, unsigned flags) { return 0; }
CUresult cuThreadExchangeStreamCaptureMode(int *mode) { return 0; }
CUresult cuEventCreate(Handle *e, unsigned flags) { *e = grab(16); return 0; }
CUresult cuEventDestroy_v2(Handle e) { free(e); return 0; }
CUresult cuEventRecord(Handle e, Handle s) { return 0; }
CUresult cuEventQuery(Handle e) { return 0; }
CUresult cuEventSynchronize(Handle e) { return 0; }
CUresult cuModuleLoadData(Handle *m, const void *image) { *m = module; return 0; }
CUresult cuModuleGetFunction(Handle *f, Handle m, const char *name) { *f = function; return 0; }
CUresult cuFuncSetAttribute(Handle f, int a, int v) { return 0; }
CUresult cuLaunchKernel(Handle f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, Handle s, void **params,
                        void **extra) {
    return 0;
}
CUresult cuGetErrorName(int e, const char **s) { *s = "CUDA_ERROR_STUB"; return 0; }
CUresult cuGetErrorString(int e, const char **s) { *s = "stub driver"; return 0; }
