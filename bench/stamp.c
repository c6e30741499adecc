/* `true` that prints when it started (CLOCK_REALTIME, seconds.nanoseconds). Used by
   bench/submit.py to measure submit-to-process-start without shell start-up noise. */
#include <stdio.h>
#include <time.h>
int main(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    printf("%lld.%09ld\n", (long long)ts.tv_sec, ts.tv_nsec);
    return 0;
}
