#include "base/log.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace fastllm {
namespace {

std::mutex g_mutex;  // callback and user data change together; messages never interleave
fastllm_log_callback g_callback = nullptr;
void *g_user_data = nullptr;

// Threshold for the stderr fallback, read once: -1 (silent) unless FASTLLM_LOG names a level.
int stderr_threshold() {
    static const int level = [] {
        const char *v = std::getenv("FASTLLM_LOG");
        if (!v) return -1;
        const char *names[] = {"error", "warn", "info", "debug"};
        for (int i = 0; i < 4; i++)
            if (std::strcmp(v, names[i]) == 0) return i;
        return -1;
    }();
    return level;
}

const char *level_name(fastllm_log_level level) {
    switch (level) {
    case FASTLLM_LOG_ERROR: return "error";
    case FASTLLM_LOG_WARN: return "warn";
    case FASTLLM_LOG_INFO: return "info";
    default: return "debug";
    }
}

}  // namespace

bool log_enabled(fastllm_log_level level) {
    std::lock_guard<std::mutex> lock(g_mutex);
    return g_callback != nullptr || (int)level <= stderr_threshold();
}

void log(fastllm_log_level level, const char *fmt, ...) {
    if (!log_enabled(level)) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_callback)
        g_callback(level, buf, g_user_data);
    else if ((int)level <= stderr_threshold())
        std::fprintf(stderr, "fastllm %s: %s\n", level_name(level), buf);
}

void set_log_callback(fastllm_log_callback callback, void *user_data) {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_callback = callback;
    g_user_data = user_data;
}

}  // namespace fastllm
