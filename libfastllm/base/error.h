// error.h — the one exception type of the core. The C API (c_api.cpp) turns it into a
// fastllm_status plus the thread's last-error message; nothing else crosses the C boundary.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "fastllm.h"

// printf-style checking of format strings; MinGW builds use MinGW's own (C99) printf, hence gnu_printf.
#if defined(__MINGW32__)
#define FASTLLM_PRINTF(fmt, args) __attribute__((format(gnu_printf, fmt, args)))
#else
#define FASTLLM_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#endif

namespace fastllm {

class Error : public std::runtime_error {
public:
    Error(fastllm_status status, const std::string &message) : std::runtime_error(message), status_(status) {}
    fastllm_status status() const { return status_; }

private:
    fastllm_status status_;
};

// printf-style message; throws Error.
[[noreturn]] FASTLLM_PRINTF(2, 3) inline void fail(fastllm_status status, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    throw Error(status, buf);
}

}  // namespace fastllm
