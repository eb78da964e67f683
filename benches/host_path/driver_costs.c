/* What the CUDA driver calls of an `add` cost on the GPU machine, one by one (ns per call, 200000
 * calls after 1000 warm-up calls): the numbers behind the host-path breakdown in RESULTS.md.
 * Device 0's primary context, a non-blocking stream, the device's default memory pool.
 *
 *   cc -O2 -I/usr/local/cuda/include -o driver_costs benches/host_path/driver_costs.c -lcuda
 *   ./driver_costs
 */
#include <cuda.h>
#include <stdio.h>
#include <time.h>

#define CALLS 200000

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

#define TIME(name, body)                                                          \
    do {                                                                          \
        for (int i = 0; i < 1000; i++) { body; }                                  \
        double t0 = now_ns();                                                     \
        for (int i = 0; i < CALLS; i++) { body; }                                 \
        printf("%-52s %7.1f ns\n", name, (now_ns() - t0) / CALLS);                \
    } while (0)

int main(void) {
    CUdevice dev;
    CUcontext ctx, current;
    CUstream side;
    CUmemoryPool pool;
    CUevent event;
    CUdeviceptr ptr;
    CUstreamCaptureMode mode;
    CUstreamCaptureStatus status;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS) {
        fprintf(stderr, "no CUDA device\n");
        return 1;
    }
    cuDevicePrimaryCtxRetain(&ctx, dev);
    cuCtxSetCurrent(ctx);
    cuStreamCreate(&side, CU_STREAM_NON_BLOCKING);
    cuDeviceGetDefaultMemPool(&pool, dev);
    cuEventCreate(&event, CU_EVENT_DISABLE_TIMING);
    TIME("cuCtxGetCurrent", cuCtxGetCurrent(&current));
    TIME("cuThreadExchangeStreamCaptureMode, there and back", {
        mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        cuThreadExchangeStreamCaptureMode(&mode);
        cuThreadExchangeStreamCaptureMode(&mode);
    });
    TIME("cuStreamIsCapturing (side stream)", cuStreamIsCapturing(side, &status));
    TIME("cuEventRecord (side stream)", cuEventRecord(event, side));
    TIME("cuEventQuery", cuEventQuery(event));
    TIME("cuStreamWaitEvent (legacy stream waits for side)",
         cuStreamWaitEvent(CU_STREAM_LEGACY, event, 0));
    TIME("cuMemAllocFromPoolAsync + cuMemFreeAsync, 4 KiB", {
        cuMemAllocFromPoolAsync(&ptr, 4096, pool, CU_STREAM_LEGACY);
        cuMemFreeAsync(ptr, CU_STREAM_LEGACY);
    });
    TIME("cuEventCreate + cuEventDestroy", {
        CUevent e;
        cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
        cuEventDestroy(e);
    });
    cuCtxSynchronize();
    return 0;
}
