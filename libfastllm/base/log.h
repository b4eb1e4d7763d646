// log.h — the library's diagnostics. Messages go to the callback set with fastllm_log_set();
// without one, to stderr only when FASTLLM_LOG=error|warn|info|debug asks for them. The library
// never writes to stdout.
#pragma once

#include "base/error.h"  // FASTLLM_PRINTF
#include "fastllm.h"

namespace fastllm {

bool log_enabled(fastllm_log_level level);
// printf-style; formats only when someone listens at this level.
FASTLLM_PRINTF(2, 3) void log(fastllm_log_level level, const char *fmt, ...);
void set_log_callback(fastllm_log_callback callback, void *user_data);

}  // namespace fastllm
