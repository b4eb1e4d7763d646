// test_cycles.cpp — load/free and create/free cycles (docs/reliability.md; run by
// tests/test_cycles.py, under LeakSanitizer by the sanitizer build): N_LOADS model load / tokenize
// / free cycles (alternately mapped and read), then N_SESSIONS session create / eval / free cycles
// on one model. Prints the resident set after the first tenth of each phase and at its end, so
// that a leak the sanitizer does not see (memory still referenced) shows as growth.
// Usage: test_cycles MODEL.flm N_LOADS N_SESSIONS
#include <cstdio>
#include <cstdlib>
#if defined(_WIN32)
#include <windows.h>
#include <psapi.h>
#else
#include <unistd.h>
#endif

#include "fastllm.h"

static long rss_kib() {
#if defined(_WIN32)
    // The working set is Windows' resident set (K32GetProcessMemoryInfo is kernel32's own since
    // Windows 7, so no psapi.dll is needed).
    PROCESS_MEMORY_COUNTERS c{};
    if (!K32GetProcessMemoryInfo(GetCurrentProcess(), &c, sizeof c)) return -1;
    return (long)(c.WorkingSetSize / 1024);
#else
    long pages = 0, resident = 0;
    FILE *f = std::fopen("/proc/self/statm", "r");
    if (!f) return -1;
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = -1;
    std::fclose(f);
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
#endif
}

int main(int argc, char **argv) {
    if (argc != 4) {
        std::fprintf(stderr, "usage: %s MODEL.flm N_LOADS N_SESSIONS\n", argv[0]);
        return 2;
    }
    const long n_loads = std::atol(argv[2]), n_sessions = std::atol(argv[3]);
    long warm = 0;
    for (long i = 0; i < n_loads; i++) {
        fastllm_model_params p = fastllm_model_default_params();
        p.use_mmap = (int)(i & 1);
        p.n_threads = 1;
        fastllm_model *m = nullptr;
        if (fastllm_model_load(argv[1], &p, &m) != FASTLLM_OK) {
            std::fprintf(stderr, "load %ld: %s\n", i, fastllm_last_error());
            return 1;
        }
        int32_t ids[16];
        size_t n = 0;
        fastllm_tokenize(m, "Once upon a time", 16, 1, ids, 16, &n);
        fastllm_model_free(m);
        if (i + 1 == (n_loads + 9) / 10) warm = rss_kib();
    }
    std::printf("loads %ld: rss_kib after %ld %ld, at the end %ld\n", n_loads, (n_loads + 9) / 10, warm, rss_kib());

    fastllm_model_params p = fastllm_model_default_params();
    p.n_threads = 1;
    fastllm_model *m = nullptr;
    if (fastllm_model_load(argv[1], &p, &m) != FASTLLM_OK) return 1;
    int32_t ids[16];
    size_t n = 0;
    fastllm_tokenize(m, "Once upon a time", 16, 1, ids, 16, &n);
    for (long i = 0; i < n_sessions; i++) {
        fastllm_session_params sp = fastllm_session_default_params();
        sp.n_ctx = 32 + (int32_t)(i % 4) * 16;  // sessions of a few sizes
        fastllm_session *s = nullptr;
        if (fastllm_session_create(m, &sp, &s) != FASTLLM_OK) {
            std::fprintf(stderr, "session %ld: %s\n", i, fastllm_last_error());
            return 1;
        }
        if (i % 10 == 0 && fastllm_session_eval(s, ids, n, FASTLLM_LOGITS_NONE, nullptr) != FASTLLM_OK) return 1;
        fastllm_session_free(s);
        if (i + 1 == (n_sessions + 9) / 10) warm = rss_kib();
    }
    std::printf("sessions %ld: rss_kib after %ld %ld, at the end %ld\n", n_sessions, (n_sessions + 9) / 10, warm,
                rss_kib());
    fastllm_model_free(m);
    return 0;
}
